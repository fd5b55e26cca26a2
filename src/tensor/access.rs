//! The aliasing contract of safe code. Tensors that share a storage (clones,
//! views) may live on several threads, and `copy_from(&self)`, `fill` and
//! `to_vec` take `&self`; the copy engine, though, requires that nothing else
//! writes its destination or its source while a call runs. So every safe call
//! that touches a storage's bytes holds that storage's lock for the call:
//! shared to read, exclusive to write. Uncontended (the common case) it costs
//! two atomic operations.
//!
//! Locks are taken in address order, so two calls on the same pair of
//! storages in opposite directions cannot deadlock; a storage the calling
//! thread already holds (a copy that stages through a temporary and copies
//! again) is not locked twice. Memory handed out raw — DLPack exports, NumPy
//! views of host memory, `data_ptr` — is outside this contract, as it is for
//! any framework: its users order their own accesses.

use std::cell::Cell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::Storage;

/// The per-storage lock.
#[derive(Debug, Default)]
pub(super) struct AccessLock(RwLock<()>);

/// Storages (by address; 0 for a free slot) a thread holds locked: two a
/// call, a call nested in another (a copy staged through a temporary) two
/// more, so never all of them. A plain array, which needs no destructor:
/// such a thread-local is never destroyed, so calls from the destructors of
/// other thread-locals or from C `atexit` handlers still find it (one with
/// a destructor panicked there, "cannot access a Thread Local Storage value
/// during or after destruction", and every lock became an internal error).
type Held = Cell<[usize; HELD_SLOTS]>;

/// Slots of [`Held`].
const HELD_SLOTS: usize = 8;

thread_local! {
    /// The calling thread's [`Held`].
    // `const`: no lazy-initialisation check on each visit.
    static HELD: Held = const { Cell::new([0; HELD_SLOTS]) };
}

enum Guard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Access to up to two storages for one call; released on drop.
#[must_use = "the storages are locked only while this guard lives"]
pub(super) struct Access<'a> {
    /// In locking order; `None` where nothing was locked (no storage, or one
    /// this thread already held).
    guards: [Option<Guard<'a>>; 2],
    /// Addresses this guard added to `HELD` (0: none).
    held: [usize; 2],
    /// This thread's `HELD`, found once: a thread-local's address costs a
    /// call in a shared library. Also keeps the guard on its thread.
    list: *const Held,
}

fn address(s: &Storage) -> usize {
    std::ptr::from_ref(s) as usize
}

/// Locks `write` for writing and `read` (when given, and another storage) for
/// reading, for as long as the returned guard lives. Small copies pay for
/// this on every call, so it stays free of allocations and sorting.
pub(super) fn lock<'a>(write: Option<&'a Storage>, read: Option<&'a Storage>) -> Access<'a> {
    let read = read.filter(|r| write.is_none_or(|w| !std::ptr::eq(w, *r)));
    let mut wanted = [write.map(|w| (w, true)), read.map(|r| (r, false))];
    if let [Some((w, _)), Some((r, _))] = &wanted
        && address(r) < address(w)
    {
        wanted.swap(0, 1);
    }
    let mut access = Access {
        guards: [None, None],
        held: [0; 2],
        list: std::ptr::null(),
    };
    HELD.with(|list| {
        access.list = list;
        let mut held = list.get();
        for (k, (s, exclusive)) in wanted.into_iter().flatten().enumerate() {
            let a = address(s);
            if held.contains(&a) {
                continue; // this thread's own outer call holds it
            }
            // A poisoned lock only means a panic elsewhere mid-call; the bytes
            // are plain data, still valid to overwrite or read.
            let lock = &s.access_lock().0;
            access.guards[k] = Some(if exclusive {
                Guard::Write(lock.write().unwrap_or_else(PoisonError::into_inner))
            } else {
                Guard::Read(lock.read().unwrap_or_else(PoisonError::into_inner))
            });
            // Untracked if every slot is taken (nesting deeper than any call
            // makes): only a re-lock of this storage further in would need it.
            if let Some(slot) = held.iter_mut().find(|slot| **slot == 0) {
                *slot = a;
                access.held[k] = a;
            }
        }
        list.set(held);
    });
    access
}

/// True while the calling thread holds any storage locked.
pub(super) fn holds_any() -> bool {
    HELD.with(|h| h.get().iter().any(|&a| a != 0))
}

impl Drop for Access<'_> {
    fn drop(&mut self) {
        if self.held != [0; 2] {
            // SAFETY: `list` is this thread's `HELD`, set by `lock` (which
            // added the addresses). The guard is not `Send` (a raw pointer),
            // so it is dropped on that thread, by the call that made it, and
            // `HELD`, which has no destructor, lives as long as the thread.
            let list = unsafe { &*self.list };
            let mut held = list.get();
            for slot in &mut held {
                if *slot != 0 && self.held.contains(slot) {
                    *slot = 0;
                }
            }
            list.set(held);
        }
        self.guards = [None, None];
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{DType, Device, Tensor};

    // Both tests allocate CPU storage (the second a temporary for its
    // overlapping copy): they hold the lock of the tests that count it.
    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn clones_on_many_threads_copy_into_each_other_without_racing_or_deadlocking() {
        let a = Tensor::zeros(&[1 << 16], DType::U32, Device::Cpu).unwrap();
        let b = Tensor::full(&[1 << 16], 7u32, Device::Cpu).unwrap();
        let (a, b) = (Arc::new(a), Arc::new(b));
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (a, b) = (a.clone(), b.clone());
                scope.spawn(move || {
                    for _ in 0..50 {
                        // Opposite directions on alternate threads: address order
                        // keeps them from deadlocking.
                        if t % 2 == 0 { a.copy_from(&b) } else { b.copy_from(&a) }.unwrap();
                        a.fill(7u32).unwrap();
                    }
                });
            }
        });
        assert!(a.to_vec::<u32>().unwrap().iter().all(|&x| x == 7));
        assert!(b.to_vec::<u32>().unwrap().iter().all(|&x| x == 7));
    }

    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn a_copy_within_one_storage_and_a_nested_copy_lock_once() {
        let t = Tensor::from_slice(&[1u8, 2, 3, 4], &[4]).unwrap();
        let flipped = t.flip(&[0]).unwrap();
        // Same storage on both sides: one exclusive lock, no self-deadlock.
        t.copy_from(&flipped).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), vec![4, 3, 2, 1]);
        let guard = super::lock(Some(t.storage()), None);
        // A nested call on the same thread (as a staged copy makes) goes through.
        t.fill(9u8).unwrap();
        drop(guard);
        assert_eq!(t.to_vec::<u8>().unwrap(), vec![9; 4]);
    }

    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn calls_from_thread_local_destructors_still_lock() {
        use std::cell::RefCell;
        use std::sync::mpsc::{Sender, channel};

        // A copy made by another thread-local's destructor (as a C `atexit`
        // handler makes one after the main thread's locals are destroyed).
        struct CopyOnExit(Option<Sender<std::thread::Result<crate::Result<Vec<u32>>>>>);
        impl Drop for CopyOnExit {
            fn drop(&mut self) {
                let copied = std::panic::catch_unwind(|| {
                    let a = Tensor::zeros(&[4], DType::U32, Device::Cpu)?;
                    a.copy_from(&Tensor::full(&[4], 3u32, Device::Cpu)?)?;
                    a.to_vec::<u32>()
                });
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(copied);
                }
            }
        }
        thread_local! {
            static EXIT: RefCell<CopyOnExit> = const { RefCell::new(CopyOnExit(None)) };
        }
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            EXIT.with(|e| e.borrow_mut().0 = Some(tx));
            // A lock after it: a lock list with a destructor, registered
            // later, would be destroyed first.
            Tensor::zeros(&[4], DType::U32, Device::Cpu)
                .unwrap()
                .fill(1u32)
                .unwrap();
        })
        .join()
        .unwrap();
        let copied = rx.recv().unwrap().expect("the copy panicked");
        assert_eq!(copied.unwrap(), vec![3; 4]);
    }
}
