//! The happens-before race detector over streams, events and host
//! synchronisation (vector clocks), independent of timing.
//!
//! Ordering rules, from the Driver API reference and the CUDA Programming
//! Guide ("Streams", "Implicit Synchronization", stream-sync-behavior):
//! - operations of one stream are ordered (FIFO);
//! - an operation is ordered after everything the host thread that enqueued
//!   it had done before (including what that thread synchronised with);
//! - `cuStreamWaitEvent` orders the waiting stream's later work after the
//!   event's record (captured at the call);
//! - the legacy default stream waits for prior work of every blocking stream
//!   of its context, and blocking streams wait for prior legacy work;
//! - `cuStreamSynchronize`/`cuEventSynchronize`/`cuCtxSynchronize` and the
//!   synchronous copies order the host after the work they wait for;
//! - a destroyed stream's queued work goes on (group__CUDA__STREAM,
//!   cuStreamDestroy_v2: "the resources associated with hStream will be
//!   released automatically once the device has completed all work in
//!   hStream"): cuCtxSynchronize and the other device-wide synchronisations
//!   still wait for it and order the host after it, and the legacy stream
//!   after that of a destroyed blocking stream (context::UserStreams);
//! - device-side accesses (kernels, async copies, memsets) to pinned and
//!   managed memory are checked like device memory: both are in the
//!   allocation table with a shadow each.
//!
//! Host threads each have their own clock component; calls into the driver
//! are serialised (a thread entering the driver happens-after the last call
//! that left it), which stands for the host-side synchronisation the emulator
//! cannot see (a mutex around a caching allocator, say).
//!
//! Each operation gets its clock at enqueue time. Its memory accesses (copy
//! ranges, a kernel's footprint, an async free as a write of the block) are
//! checked when it completes against the shadow state of the bytes (per
//! allocation: an interval map of the last write and the reads since); two
//! accesses, one a write, neither ordered before the other, are a race.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::lock;

/// A vector clock: sorted (component, time) pairs; missing components are 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VClock(Vec<(u32, u64)>);

impl VClock {
    pub fn get(&self, c: u32) -> u64 {
        self.0.binary_search_by_key(&c, |e| e.0).map_or(0, |i| self.0[i].1)
    }

    /// Advances component `c`; returns its new time.
    pub fn tick(&mut self, c: u32) -> u64 {
        match self.0.binary_search_by_key(&c, |e| e.0) {
            Ok(i) => {
                self.0[i].1 += 1;
                self.0[i].1
            }
            Err(i) => {
                self.0.insert(i, (c, 1));
                1
            }
        }
    }

    /// Pointwise maximum.
    pub fn join(&mut self, other: &VClock) {
        if other.0.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len().max(other.0.len()));
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() || j < other.0.len() {
            match (self.0.get(i), other.0.get(j)) {
                (Some(a), Some(b)) if a.0 == b.0 => {
                    out.push((a.0, a.1.max(b.1)));
                    i += 1;
                    j += 1;
                }
                (Some(a), Some(b)) if a.0 < b.0 => {
                    out.push(*a);
                    i += 1;
                }
                (Some(_), Some(b)) | (None, Some(b)) => {
                    out.push(*b);
                    j += 1;
                }
                (Some(a), None) => {
                    out.push(*a);
                    i += 1;
                }
                (None, None) => break,
            }
        }
        self.0 = out;
    }
}

static NEXT_COMPONENT: AtomicU32 = AtomicU32::new(1);

/// A fresh clock component (one per stream and per host thread).
pub fn new_component() -> u32 {
    NEXT_COMPONENT.fetch_add(1, Ordering::Relaxed)
}

/// What an access was part of, for reports.
#[derive(Debug, Clone)]
pub struct Site {
    /// The API function (`cuMemcpyAsync`, `cuLaunchKernel`, ...).
    pub api: &'static str,
    /// The stream it ran on, described (`stream 0x…` / `host thread …`).
    pub stream: String,
    /// Sequence number of the operation in its stream (0 for host accesses).
    pub seq: u64,
    /// The kernel's name for launches.
    pub kernel: Option<String>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.api)?;
        if let Some(k) = &self.kernel {
            write!(f, " of kernel `{k}`")?;
        }
        write!(f, " on {}", self.stream)?;
        if self.seq > 0 {
            write!(f, " (operation #{})", self.seq)?;
        }
        Ok(())
    }
}

/// An operation's identity for the detector: its clock (which includes its
/// own epoch `clock[comp] = time`) and where it came from.
#[derive(Debug, Clone)]
pub struct Epoch {
    pub comp: u32,
    pub time: u64,
    pub clock: Arc<VClock>,
    pub site: Arc<Site>,
}

impl Epoch {
    /// Whether `self` happens-before `other` (or is the same operation).
    pub fn before(&self, other: &Epoch) -> bool {
        other.clock.get(self.comp) >= self.time
    }

    fn same(&self, other: &Epoch) -> bool {
        self.comp == other.comp && self.time == other.time
    }

    fn ordered(&self, other: &Epoch) -> bool {
        self.before(other) || other.before(self)
    }
}

/// One byte range an operation reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub lo: u64,
    pub hi: u64,
    pub write: bool,
}

#[derive(Debug, Clone, Default)]
struct Seg {
    hi: u64,
    write: Option<Epoch>,
    reads: Vec<Epoch>,
}

impl Seg {
    fn same_as(&self, o: &Seg) -> bool {
        let w = match (&self.write, &o.write) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same(b),
            _ => false,
        };
        w && self.reads.len() == o.reads.len() && self.reads.iter().zip(&o.reads).all(|(a, b)| a.same(b))
    }
}

/// The shadow state of one allocation: disjoint segments keyed by start.
#[derive(Debug, Default)]
pub struct Shadow {
    segs: BTreeMap<u64, Seg>,
}

/// A race found by [`Shadow::apply`].
#[derive(Debug, Clone)]
pub struct Race {
    pub lo: u64,
    pub hi: u64,
    pub this_write: bool,
    pub other_write: bool,
    pub other: Arc<Site>,
}

impl Shadow {
    /// Splits the segment containing `at` so that a segment starts at `at`.
    fn split(&mut self, at: u64) {
        let Some((&lo, seg)) = self.segs.range(..at).next_back() else {
            return;
        };
        if seg.hi > at {
            let mut right = seg.clone();
            let hi = seg.hi;
            right.hi = hi;
            if let Some(s) = self.segs.get_mut(&lo) {
                s.hi = at;
            }
            self.segs.insert(at, right);
        }
    }

    /// Checks and records `a` by `e`; returns the first race found.
    pub fn apply(&mut self, a: Access, e: &Epoch) -> Option<Race> {
        if a.lo >= a.hi {
            return None;
        }
        self.split(a.lo);
        self.split(a.hi);
        // Fill gaps with empty segments.
        let mut cursor = a.lo;
        let starts: Vec<(u64, u64)> = self.segs.range(a.lo..a.hi).map(|(&lo, s)| (lo, s.hi)).collect();
        let mut gaps = Vec::new();
        for (lo, hi) in starts {
            if lo > cursor {
                gaps.push((cursor, lo));
            }
            cursor = hi;
        }
        if cursor < a.hi {
            gaps.push((cursor, a.hi));
        }
        for (lo, hi) in gaps {
            self.segs.insert(lo, Seg { hi, ..Seg::default() });
        }
        let mut race = None;
        for (&lo, seg) in self.segs.range_mut(a.lo..a.hi) {
            let found = if a.write {
                seg.write
                    .iter()
                    .map(|w| (w, true))
                    .chain(seg.reads.iter().map(|r| (r, false)))
                    .find(|(o, _)| !o.same(e) && !o.ordered(e))
            } else {
                seg.write
                    .iter()
                    .map(|w| (w, true))
                    .find(|(o, _)| !o.same(e) && !o.ordered(e))
            };
            if race.is_none()
                && let Some((o, w)) = found
            {
                race = Some(Race {
                    lo,
                    hi: seg.hi,
                    this_write: a.write,
                    other_write: w,
                    other: o.site.clone(),
                });
            }
            if a.write {
                // Keep a later write recorded out of order (it happens after us).
                let keep_existing = seg.write.as_ref().is_some_and(|w| e.before(w) && !w.same(e));
                if !keep_existing {
                    seg.write = Some(e.clone());
                }
                seg.reads.retain(|r| !r.before(e));
            } else {
                seg.reads.retain(|r| !r.before(e) || r.same(e));
                if !seg.reads.iter().any(|r| r.same(e)) {
                    seg.reads.push(e.clone());
                }
            }
        }
        self.coalesce(a.lo, a.hi);
        race
    }

    /// Merges equal neighbouring segments around [lo, hi).
    fn coalesce(&mut self, lo: u64, hi: u64) {
        let start = self.segs.range(..lo).next_back().map_or(lo, |(&k, _)| k);
        let keys: Vec<u64> = self.segs.range(start..=hi).map(|(&k, _)| k).collect();
        let mut prev: Option<u64> = None;
        for k in keys {
            if let Some(p) = prev {
                let merge = {
                    let (a, b) = (&self.segs[&p], &self.segs[&k]);
                    a.hi == k && a.same_as(b)
                };
                if merge {
                    let hi = self.segs[&k].hi;
                    self.segs.remove(&k);
                    if let Some(s) = self.segs.get_mut(&p) {
                        s.hi = hi;
                    }
                    continue;
                }
            }
            prev = Some(k);
        }
    }
}

/// The host-side clock of the calling thread and the serialisation of driver calls.
struct Host {
    comp: u32,
    clock: VClock,
}

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
}

/// The clock the last driver call left behind (driver calls are serialised).
static RELEASED: Mutex<VClock> = Mutex::new(VClock(Vec::new()));

fn with_host<R>(f: impl FnOnce(&mut Host) -> R) -> R {
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let h = h.get_or_insert_with(|| {
            let comp = new_component();
            let mut clock = VClock::default();
            clock.tick(comp);
            Host { comp, clock }
        });
        f(h)
    })
}

/// Entering a driver call: the thread happens-after the last call that left.
pub(crate) fn api_enter() {
    let released = lock(&RELEASED).clone();
    with_host(|h| h.clock.join(&released));
}

/// Leaving a driver call.
pub(crate) fn api_exit() {
    let c = with_host(|h| h.clock.clone());
    lock(&RELEASED).join(&c);
}

/// The calling host thread's clock (what an operation it enqueues follows).
pub fn host_clock() -> VClock {
    with_host(|h| h.clock.clone())
}

/// The host thread now happens-after `c` (it synchronised with it).
pub fn host_join(c: &VClock) {
    with_host(|h| h.clock.join(c));
}

/// A new epoch for a host-side access (a synchronous call touching memory).
pub fn host_epoch(api: &'static str) -> Epoch {
    with_host(|h| {
        let time = h.clock.tick(h.comp);
        Epoch {
            comp: h.comp,
            time,
            clock: Arc::new(h.clock.clone()),
            site: Arc::new(Site {
                api,
                stream: format!("the host (thread {:?})", std::thread::current().id()),
                seq: 0,
                kernel: None,
            }),
        }
    })
}

/// Above this many ranges an operation's accesses are coarsened.
const MAX_RANGES: usize = 4096;

/// Replaces the ranges of each allocation by their hull (per read/write): a
/// kernel's footprint can hold a range per element of a strided access.
/// Coarser ranges can only add reports for operations interleaving within
/// one allocation without ordering, which real hardware would not order either.
fn coarsen(accesses: &[Access]) -> Vec<Access> {
    let mut hulls: std::collections::BTreeMap<(u64, bool), Access> = std::collections::BTreeMap::new();
    for a in accesses {
        let key = super::memory::find(a.lo).map_or(a.lo, |al| al.base);
        hulls
            .entry((key, a.write))
            .and_modify(|h| {
                h.lo = h.lo.min(a.lo);
                h.hi = h.hi.max(a.hi);
            })
            .or_insert(*a);
    }
    hulls.into_values().collect()
}

/// Checks and records `accesses` made by the operation `e`; returns a report
/// of the first race. Accesses outside tracked allocations (pageable host
/// memory) are not checked.
pub fn record(accesses: &[Access], e: &Epoch) -> Option<String> {
    if !crate::config::get().racecheck {
        return None;
    }
    let coarse;
    let accesses = if accesses.len() > MAX_RANGES {
        coarse = coarsen(accesses);
        &coarse[..]
    } else {
        accesses
    };
    let mut first = None;
    for a in accesses {
        for alloc in super::memory::overlapping(a.lo, a.hi) {
            let lo = a.lo.max(alloc.base);
            let hi = a.hi.min(alloc.base + alloc.size.max(1));
            let r = lock(&alloc.shadow).apply(Access { lo, hi, write: a.write }, e);
            if first.is_none()
                && let Some(r) = r
            {
                let what = |w: bool| if w { "write" } else { "read" };
                first = Some(format!(
                    "data race on {} bytes [{:#x}, {:#x}) (offset {} of {}): {} by {} is not ordered with the {} by {} \
                     (no stream order, event wait or synchronisation between them)",
                    r.hi - r.lo,
                    r.lo,
                    r.hi,
                    r.lo - alloc.base,
                    alloc.describe(),
                    what(r.this_write),
                    e.site,
                    what(r.other_write),
                    r.other,
                ));
            }
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(comp: u32, time: u64, clock: &[(u32, u64)]) -> Epoch {
        Epoch {
            comp,
            time,
            clock: Arc::new(VClock(clock.to_vec())),
            site: Arc::new(Site {
                api: "test",
                stream: format!("c{comp}"),
                seq: time,
                kernel: None,
            }),
        }
    }

    #[test]
    fn clocks() {
        let mut a = VClock::default();
        a.tick(3);
        let mut b = VClock::default();
        b.tick(1);
        b.tick(1);
        a.join(&b);
        assert_eq!(a.get(1), 2);
        assert_eq!(a.get(3), 1);
        assert_eq!(a.get(2), 0);
    }

    #[test]
    fn shadow_orders_and_races() {
        let mut s = Shadow::default();
        let w1 = ep(1, 1, &[(1, 1)]);
        assert!(
            s.apply(
                Access {
                    lo: 0,
                    hi: 100,
                    write: true
                },
                &w1
            )
            .is_none()
        );
        // Stream 2 waited for stream 1's op: ordered.
        let r2 = ep(2, 1, &[(1, 1), (2, 1)]);
        assert!(
            s.apply(
                Access {
                    lo: 10,
                    hi: 20,
                    write: false
                },
                &r2
            )
            .is_none()
        );
        // Stream 3 did not: race with the write.
        let r3 = ep(3, 1, &[(3, 1)]);
        let race = s
            .apply(
                Access {
                    lo: 50,
                    hi: 60,
                    write: false,
                },
                &r3,
            )
            .unwrap();
        assert!(race.other_write);
        // A write on stream 1 after its first op, unordered with r2's read: race.
        let w4 = ep(1, 2, &[(1, 2)]);
        assert!(
            s.apply(
                Access {
                    lo: 15,
                    hi: 16,
                    write: true
                },
                &w4
            )
            .is_some()
        );
    }
}
