//! [`CachingAlloc`]: a stream-aware caching pool over any [`NDAlloc`].
//!
//! Design (after PyTorch's CUDACachingAllocator, with TLSF-style bins):
//! - sizes round up to 512 B, then to 4 sub-bins per power of two, so waste
//!   is bounded by 25 %;
//! - requests up to 1 MiB come from 2 MiB "small" segments, up to 10 MiB from
//!   20 MiB "large" segments, bigger ones get a segment of their own (rounded
//!   to 2 MiB); blocks split on allocation and merge with free neighbours on
//!   free; blocks of `max_split_size` or more are never split;
//! - one pool per stream, so the fast path takes one uncontended lock; a free
//!   block is found in O(1) through a bitmap of non-empty size classes;
//! - the block's identity travels in [`Allocation::token`], so a free needs
//!   no global lookup;
//! - memory used on other streams (`record_stream`) carries events recorded
//!   at free time; whoever reuses it makes its own stream wait on them (a
//!   device-side wait, never a host poll);
//! - out of memory: take whole free segments cached by other streams, then
//!   release every cached segment and retry, then `Error::OutOfMemory` with
//!   the pool's figures.

//!
//! The parts: `config` (settings), `size_classes` (rounding), `block_pool`
//! (blocks, free lists, split and merge), `stream_order` (per-stream pools
//! and events); this file holds the pool itself and its slow path.

mod block_pool;
mod config;
mod size_classes;
mod stream_order;

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use smallvec::SmallVec;

use self::block_pool::BlockPool;
use self::config::MIB;
pub use self::config::{DEFAULT_STAGING_BYTES, PoolConfig, parse_cpu_cache, parse_staging, staging_bytes};
use self::size_classes::round_size;
use self::stream_order::Events;
use super::{AllocStats, Allocation, NDAlloc};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{EventHandle, StreamHandle};

/// Token of zero-size allocations (nothing to free).
const EMPTY_TOKEN: usize = usize::MAX;

/// Pool figures, as `torch.cuda.memory_stats` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes in blocks handed out (rounded sizes).
    pub allocated: usize,
    /// Bytes held from the device (all segments).
    pub reserved: usize,
    /// Highest `allocated`.
    pub peak_allocated: usize,
    /// Highest `reserved`.
    pub peak_reserved: usize,
    /// Blocks handed out and not yet freed.
    pub active_blocks: usize,
    /// Segments held from the device.
    pub segments: usize,
    /// Allocation calls.
    pub alloc_count: usize,
    /// Calls that needed a new segment from the device.
    pub segment_allocs: usize,
    /// Out-of-memory errors returned.
    pub oom_count: usize,
}

/// Counters of the slow path (segments, OOM); the per-block ones live in each pool.
#[derive(Default)]
struct SegmentCounters {
    reserved: AtomicUsize,
    peak_reserved: AtomicUsize,
    segments: AtomicUsize,
    segment_allocs: AtomicUsize,
    oom_count: AtomicUsize,
}

/// A stream-aware caching pool over the raw allocator `A`; itself an [`NDAlloc`].
pub struct CachingAlloc<A: NDAlloc> {
    raw: A,
    cfg: PoolConfig,
    /// Pool 0 serves the default stream (`None`) without touching `by_stream`.
    pools: RwLock<Vec<Arc<Mutex<BlockPool>>>>,
    default_pool: Arc<Mutex<BlockPool>>,
    by_stream: RwLock<HashMap<StreamHandle, usize>>,
    counters: SegmentCounters,
}

impl<A: NDAlloc> std::fmt::Debug for CachingAlloc<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAlloc")
            .field("raw", &self.raw)
            .field("stats", &self.memory_stats())
            .finish()
    }
}

fn lock(p: &Mutex<BlockPool>) -> std::sync::MutexGuard<'_, BlockPool> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl<A: NDAlloc> CachingAlloc<A> {
    /// A pool over `raw` with `cfg`.
    pub fn new(raw: A, cfg: PoolConfig) -> Self {
        let default_pool = Arc::new(Mutex::new(BlockPool::new(None)));
        CachingAlloc {
            raw,
            cfg,
            pools: RwLock::new(vec![default_pool.clone()]),
            default_pool,
            by_stream: RwLock::new(HashMap::new()),
            counters: SegmentCounters::default(),
        }
    }

    /// The raw allocator underneath.
    pub fn raw(&self) -> &A {
        &self.raw
    }

    /// The pool's configuration.
    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    /// Current figures. With several streams, `peak_allocated` is the sum of
    /// each stream pool's peak (an upper bound of the true peak).
    pub fn memory_stats(&self) -> MemoryStats {
        let c = &self.counters;
        let l = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        let mut s = MemoryStats {
            reserved: l(&c.reserved),
            peak_reserved: l(&c.peak_reserved),
            segments: l(&c.segments),
            segment_allocs: l(&c.segment_allocs),
            oom_count: l(&c.oom_count),
            ..MemoryStats::default()
        };
        for pool in self.all_pools() {
            let p = lock(&pool);
            s.allocated += p.allocated;
            s.peak_allocated += p.peak_allocated;
            s.active_blocks += p.active_blocks;
            s.alloc_count += p.alloc_count;
        }
        s
    }

    /// Resets the peaks to the current values.
    pub fn reset_peak_stats(&self) {
        let c = &self.counters;
        c.peak_reserved
            .store(c.reserved.load(Ordering::Relaxed), Ordering::Relaxed);
        for pool in self.all_pools() {
            let mut p = lock(&pool);
            p.peak_allocated = p.allocated;
        }
    }

    /// Returns every cached, entirely free segment to the device; returns the
    /// bytes released.
    pub fn empty_cache(&self) -> usize {
        let mut released = 0;
        for pool in self.all_pools() {
            let mut p = lock(&pool);
            for id in p.whole_free_segments() {
                if let Some((seg, events, _)) = p.detach_segment(id) {
                    released += seg.size;
                    self.release_segment(seg, events, p.stream);
                }
            }
        }
        released
    }

    fn release_segment(&self, seg: Allocation, events: Events, stream: Option<StreamHandle>) {
        self.release_events(events);
        self.counters.reserved.fetch_sub(seg.size, Ordering::Relaxed);
        self.counters.segments.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `seg` is a raw allocation of this pool's allocator, now owned
        // by no block; the raw free orders itself after the stream's work
        // (CUDA's cuMemFree synchronises).
        unsafe { self.raw.deallocate(seg, stream) };
    }

    /// The segment a request of `size` bytes is carved from, and whether it is
    /// a large one (PyTorch's `get_allocation_size`).
    fn segment_size_for(&self, size: usize) -> (usize, bool) {
        let c = &self.cfg;
        // Never smaller than the request: the config's fields are public, and
        // a small segment below `small_max` would hand out a short block.
        if size <= c.small_max {
            (c.small_segment.max(size), false)
        } else if size <= c.large_max {
            (c.large_segment.max(size), true)
        } else {
            (size.div_ceil(2 * MIB).saturating_mul(2 * MIB), true)
        }
    }

    /// A new segment of `seg` bytes from the raw allocator, within the limit.
    fn alloc_segment(&self, seg: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
        let reserved = self.counters.reserved.load(Ordering::Relaxed);
        if reserved.saturating_add(seg) > self.cfg.limit {
            return Err(self.out_of_memory(seg));
        }
        let a = self.raw.allocate(seg, 256, stream)?;
        self.counters.segment_allocs.fetch_add(1, Ordering::Relaxed);
        self.counters.segments.fetch_add(1, Ordering::Relaxed);
        let r = self.counters.reserved.fetch_add(seg, Ordering::Relaxed) + seg;
        self.counters.peak_reserved.fetch_max(r, Ordering::Relaxed);
        Ok(a)
    }

    fn out_of_memory(&self, requested: usize) -> Error {
        let largest_free = self
            .all_pools()
            .iter()
            .map(|p| lock(p).largest_free())
            .max()
            .unwrap_or(0);
        Error::OutOfMemory {
            device: self.raw.device(),
            requested,
            reserved: self.counters.reserved.load(Ordering::Relaxed),
            allocated: self.all_pools().iter().map(|p| lock(p).allocated).sum(),
            largest_free,
        }
    }

    /// The slow path: a new segment, else a whole free segment another stream
    /// caches, else release every cached segment and retry, else out of memory.
    fn alloc_segment_or_reclaim(&self, pool_index: usize, size: usize, large: bool, requested: usize) -> Result<u32> {
        let (seg_size, seg_large) = self.segment_size_for(size);
        let pool = self.pool(pool_index);
        let stream = lock(&pool).stream;
        match self.alloc_segment(seg_size, stream) {
            Ok(seg) => {
                return Ok(self.insert_segment_and_get_block(&pool, seg, seg_large, size, large, SmallVec::new()));
            }
            Err(Error::OutOfMemory { .. }) => {}
            Err(e) => return Err(e),
        }
        if let Some((seg, events, seg_large)) = self.take_segment_from_other_stream(pool_index, size, large)? {
            return Ok(self.insert_segment_and_get_block(&pool, seg, seg_large, size, large, events));
        }
        // Release everything cached and retry the device.
        self.empty_cache();
        match self.alloc_segment(seg_size, stream) {
            Ok(seg) => Ok(self.insert_segment_and_get_block(&pool, seg, seg_large, size, large, SmallVec::new())),
            Err(Error::OutOfMemory { .. }) => Err(self.out_of_memory(requested)),
            Err(e) => Err(e),
        }
    }

    /// Adds a new free segment to `pool` and takes the block for `size` bytes from it.
    fn insert_segment_and_get_block(
        &self,
        pool: &Mutex<BlockPool>,
        seg: Allocation,
        seg_large: bool,
        size: usize,
        large: bool,
        events: Events,
    ) -> u32 {
        let mut p = lock(pool);
        let id = p.attach_segment(seg, seg_large, events);
        debug_assert_eq!(seg_large, large);
        p.get_free_block(size, large, &self.cfg).unwrap_or(id)
    }
}

/// The [`Allocation::token`] of block `id` of pool `pool`.
fn block_token(pool: usize, id: u32) -> usize {
    (pool << 32) | id as usize
}

/// The pool index and block id a [`block_token`] holds.
fn split_token(token: usize) -> (usize, u32) {
    (token >> 32, (token & 0xffff_ffff) as u32)
}

// SAFETY: every block lies inside a segment from `raw` (which honours the
// NDAlloc contract), at a multiple of 512 bytes from a 256-byte aligned base,
// and is handed out to one owner at a time (free blocks sit in the lists,
// used blocks only in the caller's Allocation) until `deallocate`.
unsafe impl<A: NDAlloc> NDAlloc for CachingAlloc<A> {
    fn device(&self) -> Device {
        self.raw.device()
    }

    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
        if align > 256 {
            return Err(Error::InvalidArgument {
                op: "pooled allocation",
                reason: "alignments above 256 bytes are not supported".into(),
            });
        }
        if size == 0 {
            let ptr = NonNull::new(256 as *mut u8).ok_or(Error::Overflow { what: "alignment" })?;
            return Ok(Allocation {
                ptr,
                size,
                align,
                token: EMPTY_TOKEN,
            });
        }
        if size > isize::MAX as usize / 2 {
            return Err(self.out_of_memory(size));
        }
        let rounded = round_size(size);
        let large = rounded > self.cfg.small_max;
        let index = self.pool_index(stream);
        let pool = if index == 0 { None } else { Some(self.pool(index)) };
        let pool_ref = pool.as_deref().unwrap_or(&self.default_pool);
        let mut p = lock(pool_ref);
        let id = match p.get_free_block(rounded, large, &self.cfg) {
            Some(id) => id,
            None => {
                drop(p);
                let id = self
                    .alloc_segment_or_reclaim(index, rounded, large, size)
                    .inspect_err(|e| {
                        if matches!(e, Error::OutOfMemory { .. }) {
                            self.counters.oom_count.fetch_add(1, Ordering::Relaxed);
                        }
                    })?;
                p = lock(pool_ref);
                id
            }
        };
        if !p.blocks[id as usize].events.is_empty()
            && let Err(e) = self.wait_on_block_events(&mut p, id)
        {
            p.free_block(id);
            return Err(e);
        }
        let addr = p.blocks[id as usize].addr;
        let real = p.blocks[id as usize].size;
        p.alloc_count += 1;
        p.active_blocks += 1;
        p.allocated += real;
        p.peak_allocated = p.peak_allocated.max(p.allocated);
        drop(p);
        let ptr = NonNull::new(addr as *mut u8).ok_or(Error::Overflow { what: "block address" })?;
        Ok(Allocation {
            ptr,
            size,
            align,
            token: block_token(index, id),
        })
    }

    unsafe fn deallocate(&self, a: Allocation, stream: Option<StreamHandle>) {
        // SAFETY: forwarded.
        unsafe { self.deallocate_after(a, stream, &[]) }
    }

    unsafe fn deallocate_after(&self, a: Allocation, _stream: Option<StreamHandle>, used_on: &[StreamHandle]) {
        if a.token == EMPTY_TOKEN {
            return;
        }
        let (index, id) = split_token(a.token);
        let events = self.record_stream_uses(used_on);
        let other = if index == 0 { None } else { Some(self.pool(index)) };
        let mut p = lock(other.as_deref().unwrap_or(&self.default_pool));
        let Some(b) = p.blocks.get_mut(id as usize) else { return };
        let size = b.size;
        b.events.extend(events);
        p.free_block(id);
        p.allocated -= size;
        p.active_blocks -= 1;
    }

    fn stats(&self) -> AllocStats {
        let s = self.memory_stats();
        AllocStats {
            live_allocations: s.active_blocks,
            live_bytes: s.allocated,
            peak_bytes: s.peak_allocated,
            total_allocations: s.alloc_count,
        }
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>> {
        self.raw.record_event(stream)
    }

    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> Result<()> {
        self.raw.wait_event(stream, event)
    }

    fn release_event(&self, event: EventHandle) {
        self.raw.release_event(event)
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        self.raw.event_done(event)
    }

    fn synchronize_device(&self) -> Result<()> {
        self.raw.synchronize_device()
    }
}

impl<A: NDAlloc> Drop for CachingAlloc<A> {
    fn drop(&mut self) {
        self.empty_cache();
    }
}
