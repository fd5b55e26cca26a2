//! Deleters of imported (foreign) tensors that wait for device work.
//!
//! A copy, fill or consumer export of an imported GPU tensor queues work on a
//! stream and returns; the tensor may be dropped at once. Calling the
//! producer's deleter then would hand the memory back (torch's caching
//! allocator reuses it on its own stream) while the work still reads or
//! writes it. Instead, the storage records the streams it was used on, and its
//! drop records an event on each of them: when every event has completed the
//! deleter runs at once, otherwise it waits in a list that later calls poll
//! with `cuEventQuery` / `hipEventQuery` (every allocation, every foreign
//! drop) and [`drain_deleters`] empties. The host never blocks on the hot
//! path; every deleter still runs exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::alloc::NDAlloc;
use crate::device::Device;
use crate::stream::{EventHandle, StreamHandle};

/// What keeps foreign memory alive: dropping it calls the producer's deleter
/// (a DLPack import's owner, boxed so this module needs no DLPack types).
pub type ForeignOwner = Box<dyn Send>;

/// A deleter waiting for the events recorded at its storage's drop.
struct Pending {
    alloc: Arc<dyn NDAlloc>,
    events: SmallVec<[EventHandle; 2]>,
    owner: ForeignOwner,
}

impl Pending {
    /// True when every event has completed (or can no longer be asked: a
    /// failed device has no work left to wait for).
    fn done(&self) -> bool {
        self.events.iter().all(|&e| self.alloc.event_done(e).unwrap_or(true))
    }

    /// Releases the events and returns the owner, whose drop calls the deleter.
    fn finish(self) -> ForeignOwner {
        for e in self.events {
            self.alloc.release_event(e);
        }
        self.owner
    }
}

static COUNT: AtomicUsize = AtomicUsize::new(0);
static LIST: Mutex<Vec<Pending>> = Mutex::new(Vec::new());
/// Deleters taken off the list whose calls have not finished yet (they run
/// outside the list's lock, on whichever thread took them).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// True while this thread runs deleters (one may drain: it must not wait for itself).
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Calls the deleters of `owners`, which were counted in [`IN_FLIGHT`] when
/// they were taken off the list.
fn run(owners: Vec<ForeignOwner>) {
    let n = owners.len();
    let was = RUNNING.replace(true);
    drop(owners);
    RUNNING.set(was);
    IN_FLIGHT.fetch_sub(n, Ordering::AcqRel);
}

fn list() -> std::sync::MutexGuard<'static, Vec<Pending>> {
    LIST.lock().unwrap_or_else(|p| p.into_inner())
}

/// Calls `owner`'s deleter once the device work queued on `used_on` streams
/// (of `device`) is done: at once when there is none or it is already done,
/// otherwise from a later [`poll`] or [`drain_deleters`].
pub(crate) fn release_after(device: Device, used_on: &[StreamHandle], owner: ForeignOwner) {
    poll();
    if used_on.is_empty() {
        drop(owner);
        return;
    }
    // The device's allocator records and queries events on its streams. None
    // (a forked child, a backend gone): no work of ours can be left to wait for.
    let Ok(alloc) = crate::backend::default_allocator(device) else {
        drop(owner);
        return;
    };
    let mut events = SmallVec::new();
    let mut synced = false;
    for &s in used_on {
        match alloc.record_event(s) {
            Ok(Some(e)) => events.push(e),
            Ok(None) => {}
            // A stream that cannot be recorded on (destroyed by its owner, a
            // DLPack consumer): wait for all the device's work instead, once.
            Err(_) if !synced => {
                synced = true;
                let _ = alloc.synchronize_device();
            }
            Err(_) => {}
        }
    }
    let pending = Pending { alloc, events, owner };
    if pending.done() {
        drop(pending.finish());
        return;
    }
    let mut l = list();
    l.push(pending);
    COUNT.store(l.len(), Ordering::Release);
}

/// Whether deleters wait for device work ([`poll`] has something to do).
pub(crate) fn waiting() -> bool {
    COUNT.load(Ordering::Acquire) != 0
}

/// Runs the deleters whose device work has completed; never blocks on the
/// device. A single atomic load when none wait.
pub(crate) fn poll() {
    if !waiting() {
        return;
    }
    let ready: Vec<ForeignOwner> = {
        let mut l = list();
        let mut ready = Vec::new();
        let mut i = 0;
        while i < l.len() {
            if l[i].done() {
                ready.push(l.swap_remove(i).finish());
            } else {
                i += 1;
            }
        }
        COUNT.store(l.len(), Ordering::Release);
        IN_FLIGHT.fetch_add(ready.len(), Ordering::AcqRel);
        ready
    };
    // Outside the lock: a deleter may drop devtensor storages (and poll again).
    run(ready);
}

/// Deleters of imported tensors still waiting for device work (see the
/// module docs); for tests and leak checks.
pub fn pending_deleters() -> usize {
    COUNT.load(Ordering::Acquire)
}

/// Waits for the device work every waiting deleter depends on (a device
/// synchronize where an event is not yet complete), then runs those
/// deleters, and waits for those other threads took off the list and are
/// still running; returns how many this call ran. For shutdown, tests and
/// leak checks: the normal path runs them without blocking, from later calls.
pub fn drain_deleters() -> usize {
    let all: Vec<Pending> = {
        let mut l = list();
        COUNT.store(0, Ordering::Release);
        IN_FLIGHT.fetch_add(l.len(), Ordering::AcqRel);
        std::mem::take(&mut *l)
    };
    let n = all.len();
    let owners: Vec<ForeignOwner> = all
        .into_iter()
        .map(|p| {
            if !p.done() {
                let _ = p.alloc.synchronize_device();
            }
            p.finish()
        })
        .collect();
    run(owners);
    // A deleter another thread's `poll` took runs there: wait until it has
    // (unless this thread is itself inside a deleter, which would wait for itself).
    if !RUNNING.get() {
        while IN_FLIGHT.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
    }
    n
}
