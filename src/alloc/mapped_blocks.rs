//! A process-wide cache of freed large host blocks (the mappings of
//! [`huge_pages`]), so that a loop allocating large CPU
//! tensors does not page-fault every one of them in again.
//!
//! A fresh mapping reads as zeros, and the kernel zeroes each page on its
//! first touch: an allocating 64 MiB copy spends about half its time in those
//! faults, which NumPy and torch pay too (glibc maps every block above its
//! 32 MiB threshold fresh, and returns it to the system on `free`). Kept
//! mappings are taken back by the next request they fit, best fit first,
//! wasting at most an eighth. Python, two cores, f32 matrices, a loop of
//! NumPy, torch and devtensor calls each allocating its result, median ms of
//! two processes each, before → after (NumPy's `copy`, torch's `clone` or
//! `.t().contiguous()` beside):
//! - `clone()`: 8 MiB 1.20–1.27 → 0.95–1.16 (0.99–1.35, 0.87–0.98), 64 MiB
//!   10.6–14.4 → 4.8–4.9 (13.0–15.1, 29–36), 256 MiB 38.5–47.5 → 19.0–22.0
//!   (57–65, 124–125);
//! - transposed `contiguous()`: 8 MiB 1.84–2.30 → 1.41–1.66 (torch 4.3–5.5),
//!   16 MiB 15.4–16.2 → 2.9–3.6 (7.5–21.6; glibc's heap had been reusing
//!   neither side's blocks), 64 MiB 15.7 → 8.2–10.8 (66–81), 256 MiB 66–68 →
//!   32–34 (269–327).
//!
//! Bounded two ways, as jemalloc's decay bounds its dirty pages: at most
//! [`limit`] bytes (`cpu_cache_mb` of `DEVTENSOR_ALLOC_CONF`, 0 turns the
//! cache off), and a block idle for [`MAX_IDLE`] is unmapped by a thread of
//! the cache's own, asleep while it holds nothing ([`wake_reaper`]), or by the
//! next large allocation or free. `empty_cache("cpu")` unmaps them all at once. The
//! allocator's counters see a cached block as freed; `memory_stats` reports
//! it under `reserved`.
//!
//! The lock is never waited on without bound: a thread that finds it taken
//! through [`LOCK_WAIT`] (or a forked child whose parent held it) maps or
//! unmaps directly instead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use super::huge_pages;
use crate::error::{Error, Result};

/// A block idle this long is unmapped.
const MAX_IDLE: Duration = Duration::from_secs(2);

/// Default bound of the cache, before [`physical_memory`]'s eighth caps it.
const DEFAULT_LIMIT: usize = 1 << 30;

/// A cached mapping.
struct Block {
    ptr: usize,
    len: usize,
    freed: Instant,
}

/// The blocks kept, oldest first.
struct Cache {
    blocks: Vec<Block>,
    bytes: usize,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    blocks: Vec::new(),
    bytes: 0,
});

/// Bytes cached, for `memory_stats` (read without the lock).
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// How long a busy cache lock is tried again, yielding between tries, before
/// [`with_cache`] gives up. The lock is held for a few microseconds, but a
/// holder preempted on a loaded machine (the reaper, woken when the oldest
/// block expires) holds it for a time slice (milliseconds), and a single try
/// then unmapped the block being freed: the likely cause of a Python test's
/// one failure (a freed 16 MiB block not kept) beside a CI run on two cores.
/// Bounded, so that a forked child whose parent held the lock still goes on;
/// it pays this wait on each large allocation and free, next to the
/// milliseconds of first touch that a mapping of 8 MiB or more costs anyway.
const LOCK_WAIT: Duration = Duration::from_millis(5);

/// Runs `f` on the cache unless another thread holds it through
/// [`LOCK_WAIT`] (`None` then).
fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> Option<R> {
    let mut since: Option<Instant> = None;
    let mut c = loop {
        match CACHE.try_lock() {
            Ok(c) => break c,
            // Nothing panics while holding it; the data is whole either way.
            Err(TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(TryLockError::WouldBlock) if since.get_or_insert_with(Instant::now).elapsed() < LOCK_WAIT => {
                std::thread::yield_now();
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    };
    let r = f(&mut c);
    CACHED_BYTES.store(c.bytes, Ordering::Relaxed);
    Some(r)
}

/// Most bytes kept: `cpu_cache_mb` of `DEVTENSOR_ALLOC_CONF`, else
/// [`DEFAULT_LIMIT`] but at most an eighth of the machine's memory. Read
/// once; a value that is not a whole number of MiB is an error for every
/// allocation of a block of its own ([`check_config`]), and keeps nothing.
fn limit() -> Option<usize> {
    static LIMIT: OnceLock<Option<usize>> = OnceLock::new();
    *LIMIT.get_or_init(|| match super::caching::parse_cpu_cache(&conf()) {
        Ok(Some(limit)) => Some(limit),
        Ok(None) => Some(DEFAULT_LIMIT.min(physical_memory() / 8)),
        Err(_) => None,
    })
}

fn conf() -> String {
    std::env::var("DEVTENSOR_ALLOC_CONF").unwrap_or_default()
}

/// The error of a malformed `cpu_cache_mb`, if it is.
pub(super) fn check_config() -> Result<()> {
    match limit() {
        Some(_) => Ok(()),
        None => super::caching::parse_cpu_cache(&conf()).and(Err(Error::Config {
            var: "DEVTENSOR_ALLOC_CONF",
            reason: "cpu_cache_mb is invalid".into(),
        })),
    }
}

/// The machine's memory in bytes (`usize::MAX` where unknown).
fn physical_memory() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads system figures.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        if pages > 0 && page > 0 {
            return (pages as usize).saturating_mul(page as usize);
        }
    }
    usize::MAX
}

impl Cache {
    /// Takes out the blocks idle past [`MAX_IDLE`] at `now`.
    fn expire(&mut self, now: Instant) -> Vec<Block> {
        let idle = self
            .blocks
            .iter()
            .take_while(|b| now.duration_since(b.freed) >= MAX_IDLE)
            .count();
        self.remove(0..idle)
    }

    /// Takes out the blocks in `range` (of the oldest-first list).
    fn remove(&mut self, range: std::ops::Range<usize>) -> Vec<Block> {
        let gone: Vec<Block> = self.blocks.drain(range).collect();
        self.bytes -= gone.iter().map(|b| b.len).sum::<usize>();
        gone
    }

    /// The smallest block of `len` bytes up to an eighth more, taken out, and
    /// the blocks expired at `now`.
    fn take(&mut self, len: usize, now: Instant) -> (Option<Block>, Vec<Block>) {
        let expired = self.expire(now);
        let most = len.saturating_add(len / 8);
        let best = (self.blocks.iter().enumerate())
            .filter(|(_, b)| (len..=most).contains(&b.len))
            .min_by_key(|(_, b)| b.len)
            .map(|(i, _)| i);
        (best.and_then(|i| self.remove(i..i + 1).pop()), expired)
    }

    /// Adds `block` (at most `limit` bytes), and returns the blocks taken out
    /// to stay within `limit`: the expired ones, then the oldest.
    fn keep(&mut self, block: Block, limit: usize) -> Vec<Block> {
        let mut gone = self.expire(block.freed);
        let over = self.blocks.iter().scan(self.bytes + block.len, |bytes, b| {
            let over = *bytes > limit;
            *bytes -= b.len;
            Some(over)
        });
        let oldest = over.take_while(|&o| o).count();
        gone.extend(self.remove(0..oldest));
        self.bytes += block.len;
        self.blocks.push(block);
        gone
    }
}

/// Unmaps blocks taken out of the cache; the bytes released.
fn unmap_all(blocks: Vec<Block>) -> usize {
    let mut released = 0;
    for b in blocks {
        // SAFETY: each block is a mapping from `huge_pages::map`, kept by `keep`
        // and owned by nothing else, now out of the cache: unmapped once, here.
        unsafe { huge_pages::unmap(b.ptr as *mut u8, b.len) };
        released += b.len;
    }
    released
}

/// A cached mapping of at least `len` bytes and at most an eighth more (the
/// smallest such): its address and length.
pub(super) fn take(len: usize) -> Option<(*mut u8, usize)> {
    let (found, expired) = with_cache(|c| c.take(len, Instant::now()))?;
    unmap_all(expired);
    found.map(|b| (b.ptr as *mut u8, b.len))
}

/// Keeps the mapping `ptr .. ptr + len` for reuse; false when it was not kept
/// (larger than the limit, or the cache busy), and the caller unmaps it. Makes
/// room by unmapping the oldest blocks.
pub(super) fn keep(ptr: *mut u8, len: usize) -> bool {
    let Some(limit) = limit().filter(|&limit| len <= limit) else {
        return false;
    };
    let block = Block {
        ptr: ptr as usize,
        len,
        freed: Instant::now(),
    };
    let Some(gone) = with_cache(|c| c.keep(block, limit)) else {
        return false;
    };
    unmap_all(gone);
    wake_reaper();
    true
}

/// Wakes the thread that unmaps blocks once idle for [`MAX_IDLE`], started
/// here by the first block kept in each process (a forked child has none of
/// its parent's threads, and starts its own). Without it (the system refused
/// a thread), idle blocks still leave with the next large allocation or free.
fn wake_reaper() {
    static REAPER: Mutex<Option<(u32, std::thread::Thread)>> = Mutex::new(None);
    let Ok(mut reaper) = REAPER.try_lock() else {
        return; // another thread is waking it (or a forked child's lock is stuck)
    };
    let pid = std::process::id();
    if reaper.as_ref().is_none_or(|(p, _)| *p != pid) {
        let spawned = std::thread::Builder::new()
            .name("devtensor-cpu-cache".into())
            .spawn(reap);
        *reaper = spawned.ok().map(|h| (pid, h.thread().clone()));
    }
    if let Some((_, thread)) = reaper.as_ref() {
        thread.unpark();
    }
}

/// The reaper's loop: unmaps the idle blocks, then sleeps until the oldest
/// left would be, or while there is none, until [`wake_reaper`].
fn reap() {
    loop {
        let next = with_cache(|c| {
            let idle = c.expire(Instant::now());
            (idle, c.blocks.first().map(|b| b.freed + MAX_IDLE))
        });
        match next {
            Some((idle, oldest)) => {
                unmap_all(idle);
                match oldest {
                    Some(at) => std::thread::sleep(at.saturating_duration_since(Instant::now())),
                    None => std::thread::park(),
                }
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Unmaps every cached block; the bytes released.
pub(super) fn release_all() -> usize {
    // A lock never released (a forked child's whose parent held it) gives up
    // after `with_cache`'s wait.
    with_cache(|c| {
        c.bytes = 0;
        std::mem::take(&mut c.blocks)
    })
    .map_or(0, unmap_all)
}

/// Bytes cached now.
pub(super) fn cached_bytes() -> usize {
    CACHED_BYTES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    //! The cache's rules on a cache of its own, with addresses that are never
    //! mapped (nothing here unmaps them): the process-wide one is shared with
    //! every test allocating large tensors.
    use super::*;

    const MIB: usize = 1 << 20;

    fn cache() -> Cache {
        Cache {
            blocks: Vec::new(),
            bytes: 0,
        }
    }

    fn block(ptr: usize, len: usize, freed: Instant) -> Block {
        Block { ptr, len, freed }
    }

    fn lens(blocks: &[Block]) -> Vec<usize> {
        blocks.iter().map(|b| b.len).collect()
    }

    #[test]
    fn a_block_serves_requests_it_fits_within_an_eighth_best_fit_first() {
        let now = Instant::now();
        let mut c = cache();
        for (ptr, len) in [(1, 36 * MIB), (2, 32 * MIB), (3, 64 * MIB)] {
            assert!(c.keep(block(ptr, len, now), usize::MAX).is_empty());
        }
        assert_eq!(c.bytes, 132 * MIB);
        // 28 MiB: 32 and 36 are more than an eighth larger; 33: 36 fits, 64 not.
        let (found, _) = c.take(28 * MIB, now);
        assert!(found.is_none());
        let (found, _) = c.take(33 * MIB, now);
        assert_eq!(found.map(|b| b.ptr), Some(1));
        // The best fit of 32 MiB is the exact block; a block is handed out once.
        assert_eq!(c.take(32 * MIB, now).0.map(|b| b.ptr), Some(2));
        assert!(c.take(32 * MIB, now).0.is_none());
        assert_eq!((lens(&c.blocks), c.bytes), (vec![64 * MIB], 64 * MIB));
    }

    #[test]
    fn the_oldest_blocks_make_room_within_the_limit() {
        let now = Instant::now();
        let mut c = cache();
        for (ptr, len) in [(1, 8 * MIB), (2, 16 * MIB), (3, 8 * MIB)] {
            assert!(c.keep(block(ptr, len, now), 32 * MIB).is_empty());
        }
        // 32 MiB held: 12 more evict the two oldest (8 + 16), not only the first.
        let gone = c.keep(block(4, 12 * MIB, now), 32 * MIB);
        assert_eq!(lens(&gone), vec![8 * MIB, 16 * MIB]);
        assert_eq!((lens(&c.blocks), c.bytes), (vec![8 * MIB, 12 * MIB], 20 * MIB));
        // A block of the whole limit evicts everything else.
        let gone = c.keep(block(5, 32 * MIB, now), 32 * MIB);
        assert_eq!(lens(&gone), vec![8 * MIB, 12 * MIB]);
        assert_eq!(c.bytes, 32 * MIB);
    }

    #[test]
    fn idle_blocks_leave_with_the_next_take_or_keep() {
        let t0 = Instant::now();
        let mut c = cache();
        c.keep(block(1, 8 * MIB, t0), usize::MAX);
        c.keep(block(2, 8 * MIB, t0 + MAX_IDLE / 2), usize::MAX);
        // Nothing idle long enough yet.
        let (found, expired) = c.take(64 * MIB, t0 + MAX_IDLE / 2);
        assert!(found.is_none() && expired.is_empty());
        // The first has been idle for MAX_IDLE: it goes, the second stays.
        let (found, expired) = c.take(64 * MIB, t0 + MAX_IDLE);
        assert!(found.is_none());
        assert_eq!(expired.iter().map(|b| b.ptr).collect::<Vec<_>>(), vec![1]);
        let gone = c.keep(block(3, 8 * MIB, t0 + MAX_IDLE * 2), usize::MAX);
        assert_eq!(gone.iter().map(|b| b.ptr).collect::<Vec<_>>(), vec![2]);
        assert_eq!((lens(&c.blocks), c.bytes), (vec![8 * MIB], 8 * MIB));
    }
}
