//! A per-thread cache of small freed host blocks, so that a loop creating and
//! dropping small CPU tensors does not pay `malloc` and `free` each time
//! (NumPy keeps such a cache for its small data blocks too).
//!
//! A few blocks per thread, matched by exact layout, most recent first; what
//! does not fit is freed at once. A thread's blocks are freed when it exits.
//! The counters of [`super::cpu`] see a cached block as freed: only the
//! process's resident memory shows the cache, at most [`MAX_BYTES`] a thread.
//!
//! A block handed out or kept here is also counted here, in the thread's
//! own [`Counts`], which only that thread writes: no locked instruction,
//! where the process-wide counts took two an allocation and one a free
//! (their bytes stay process-wide, for the peak). In Python,
//! `devtensor.empty((4, 4))` 157–161 → 146–154 ns (NumPy's 173–179).

use std::alloc::Layout;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Largest block kept: 256 KiB and the callers' padding (a 256 × 256 f32
/// tensor). Python, Zen 5 VM, best of five loops of 200,000, 64 KiB → this:
/// `devtensor.empty((256, 256))` 176–181 → 138–139 ns, `(65536,)` 168–169
/// → 126–131 ns (NumPy's 121–125, which calls `malloc` there too); `(1024,)`
/// 134–135 → 132.
pub(super) const MAX_BLOCK: usize = (256 << 10) + 256;
/// Blocks kept per thread.
const MAX_BLOCKS: usize = 8;
/// Bytes kept per thread.
const MAX_BYTES: usize = 1 << 20;

struct Cache {
    /// `(layout size, block)`: every block has the alignment [`ALIGN`].
    blocks: [(usize, *mut u8); MAX_BLOCKS],
    len: usize,
    bytes: usize,
    /// The thread's counts, registered in [`THREADS`] on first use.
    counts: Option<Arc<Counts>>,
}

/// Blocks a thread handed out and took back through its cache. Only the
/// thread writes them (a load and a store, no read-modify-write); anyone
/// reads them ([`counts`]).
#[derive(Default)]
struct Counts {
    taken: AtomicUsize,
    kept: AtomicUsize,
}

impl Counts {
    fn bump(c: &AtomicUsize) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// The counts of live threads, and the sums of those that exited.
struct Threads {
    live: Vec<Arc<Counts>>,
    taken: usize,
    kept: usize,
}

static THREADS: Mutex<Threads> = Mutex::new(Threads {
    live: Vec::new(),
    taken: 0,
    kept: 0,
});

fn threads() -> std::sync::MutexGuard<'static, Threads> {
    THREADS.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cache {
    /// The thread's counts, registered the first time.
    fn counts(&mut self) -> &Counts {
        self.counts.get_or_insert_with(|| {
            let c = Arc::new(Counts::default());
            threads().live.push(c.clone());
            c
        })
    }
}

/// Blocks handed out and taken back through every thread's cache, for the
/// allocator's counters: `(taken, kept)`.
pub(super) fn counts() -> (usize, usize) {
    let t = threads();
    t.live.iter().fold((t.taken, t.kept), |(a, b), c| {
        (a + c.taken.load(Ordering::Relaxed), b + c.kept.load(Ordering::Relaxed))
    })
}

/// Blocks this thread took from its cache.
#[cfg(test)]
pub(super) fn taken_here() -> usize {
    CACHE.with(|c| c.borrow_mut().counts().taken.load(Ordering::Relaxed))
}

/// The one alignment of cached layouts (the callers' padded layouts).
const ALIGN: usize = 16;

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(c) = self.counts.take() {
            // Under the lock: `counts` sees them once, live or summed.
            let mut t = threads();
            t.taken += c.taken.load(Ordering::Relaxed);
            t.kept += c.kept.load(Ordering::Relaxed);
            t.live.retain(|x| !Arc::ptr_eq(x, &c));
        }
        for &(size, ptr) in &self.blocks[..self.len] {
            if let Ok(layout) = Layout::from_size_align(size, ALIGN) {
                // SAFETY: `keep` took this block, allocated with this layout, and
                // nothing else refers to it while it is cached.
                unsafe { std::alloc::dealloc(ptr, layout) };
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache { blocks: [(0, std::ptr::null_mut()); MAX_BLOCKS], len: 0, bytes: 0, counts: None })
    };
}

/// A cached block for `layout`, if this thread holds one; counted as taken.
pub(super) fn take(layout: Layout) -> Option<*mut u8> {
    if layout.size() > MAX_BLOCK || layout.align() != ALIGN {
        return None;
    }
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let len = c.len;
            let i = c.blocks[..len].iter().rposition(|&(s, _)| s == layout.size())?;
            let (size, ptr) = c.blocks[i];
            c.blocks.copy_within(i + 1..len, i);
            c.len -= 1;
            c.bytes -= size;
            Counts::bump(&c.counts().taken);
            Some(ptr)
        })
        .ok()
        .flatten()
}

/// Keeps `ptr` (a block allocated with `layout`) for reuse on this thread,
/// counted as kept; false when it was not kept, and the caller must free it.
pub(super) fn keep(ptr: *mut u8, layout: Layout) -> bool {
    if layout.size() > MAX_BLOCK || layout.align() != ALIGN {
        return false;
    }
    CACHE
        .try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return false;
            };
            if c.len == MAX_BLOCKS || c.bytes + layout.size() > MAX_BYTES {
                return false;
            }
            let len = c.len;
            c.blocks[len] = (layout.size(), ptr);
            c.len += 1;
            c.bytes += layout.size();
            Counts::bump(&c.counts().kept);
            true
        })
        .unwrap_or(false) // the thread is exiting: its cache is gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, ALIGN).unwrap()
    }

    #[test]
    // The counters `CpuAlloc::stats` reads move with the cache's blocks.
    #[serial_test::serial(cpu_alloc_counters)]
    fn a_block_comes_back_for_the_same_layout_only() {
        std::thread::spawn(|| {
            let l = layout(4096 + 240);
            // SAFETY: a non-zero size.
            let p = unsafe { std::alloc::alloc(l) };
            assert!(keep(p, l));
            assert_eq!(take(layout(8192 + 240)), None);
            assert_eq!(take(l), Some(p));
            assert_eq!(take(l), None, "a block is handed out once");
            // SAFETY: `p` came back from the cache and was allocated with `l`.
            unsafe { std::alloc::dealloc(p, l) };
        })
        .join()
        .unwrap();
    }

    #[test]
    // The counters `CpuAlloc::stats` reads move with the cache's blocks.
    #[serial_test::serial(cpu_alloc_counters)]
    fn the_cache_is_bounded() {
        std::thread::spawn(|| {
            let big = layout(MAX_BLOCK + 16);
            assert!(!keep(std::ptr::null_mut(), big), "blocks above MAX_BLOCK are not kept");
            let l = layout(MAX_BLOCK);
            let kept = (0..MAX_BLOCKS + 2)
                .filter(|_| {
                    // SAFETY: a non-zero size.
                    let p = unsafe { std::alloc::alloc(l) };
                    let k = keep(p, l);
                    if !k {
                        // SAFETY: not kept: still ours, allocated with `l`.
                        unsafe { std::alloc::dealloc(p, l) };
                    }
                    k
                })
                .count();
            assert_eq!(kept, MAX_BYTES / MAX_BLOCK, "bounded by bytes before blocks");
        })
        .join()
        .unwrap();
    }
}
