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

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use smallvec::SmallVec;

use super::{AllocStats, Allocation, NDAlloc};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{EventHandle, StreamHandle};

const MIN_BLOCK: usize = 512;
const MIB: usize = 1 << 20;
const NONE: u32 = u32::MAX;
/// Size classes: 4 per power of two from 2^9 up to 2^64.
const NCLASS: usize = (64 - 9) * 4;
/// Token of zero-size allocations (nothing to free).
const EMPTY_TOKEN: usize = usize::MAX;

/// Pool settings; `DEVTENSOR_ALLOC_CONF` overrides them
/// (`max_split_size_mb:256,limit_mb:8192,disable:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Blocks at least this large are never split (limits fragmentation by
    /// huge blocks); `usize::MAX` by default.
    pub max_split_size: usize,
    /// Most bytes the pool may hold from the device (a per-process limit).
    pub limit: usize,
    /// Largest request served from small segments.
    pub small_max: usize,
    /// Size of a small segment.
    pub small_segment: usize,
    /// Largest request served from shared large segments.
    pub large_max: usize,
    /// Size of a shared large segment.
    pub large_segment: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_split_size: usize::MAX,
            limit: usize::MAX,
            small_max: MIB,
            small_segment: 2 * MIB,
            large_max: 10 * MIB,
            large_segment: 20 * MIB,
        }
    }
}

impl PoolConfig {
    /// The defaults with `DEVTENSOR_ALLOC_CONF` applied; `Ok(None)` when the
    /// variable says `disable:1` (use the raw allocator).
    pub fn from_env() -> Result<Option<PoolConfig>> {
        match std::env::var("DEVTENSOR_ALLOC_CONF") {
            Ok(s) => PoolConfig::parse(&s),
            Err(_) => Ok(Some(PoolConfig::default())),
        }
    }

    /// Parses `key:value` pairs separated by commas.
    pub fn parse(conf: &str) -> Result<Option<PoolConfig>> {
        let mut c = PoolConfig::default();
        for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .ok_or(Error::InvalidLayout("DEVTENSOR_ALLOC_CONF entries are key:value"))?;
            let n: usize = value
                .trim()
                .parse()
                .map_err(|_| Error::InvalidLayout("DEVTENSOR_ALLOC_CONF values are integers"))?;
            let mb = n.checked_mul(MIB).ok_or(Error::Overflow {
                what: "DEVTENSOR_ALLOC_CONF",
            })?;
            match key.trim() {
                "max_split_size_mb" => c.max_split_size = mb,
                "limit_mb" => c.limit = mb,
                "disable" if n != 0 => return Ok(None),
                "disable" => {}
                // Not a pool setting: read by `staging_bytes`.
                "staging_mb" => {}
                _ => return Err(Error::InvalidLayout("unknown DEVTENSOR_ALLOC_CONF key")),
            }
        }
        Ok(Some(c))
    }
}

/// Default bound of the pinned host memory host↔device copies stage through.
pub const DEFAULT_STAGING_BYTES: usize = 16 * MIB;

/// The most pinned host memory host↔device copies of pageable or strided host
/// views stage through (a ring of two slots of half that size each):
/// `staging_mb:N` in `DEVTENSOR_ALLOC_CONF`, [`DEFAULT_STAGING_BYTES`] without it.
/// Read once per process.
pub fn staging_bytes() -> Result<usize> {
    static BYTES: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let conf = || std::env::var("DEVTENSOR_ALLOC_CONF").ok();
    match BYTES.get_or_init(|| conf().map_or(Ok(DEFAULT_STAGING_BYTES), |s| parse_staging(&s)).ok()) {
        Some(b) => Ok(*b),
        // A bad value: its error again (the variable is read once; the error is not `Clone`).
        None => parse_staging(&conf().unwrap_or_default())
            .and(Err(Error::InvalidLayout("DEVTENSOR_ALLOC_CONF staging_mb is invalid"))),
    }
}

/// The `staging_mb` entry of a `DEVTENSOR_ALLOC_CONF` value, in bytes (at least 1 MiB).
pub fn parse_staging(conf: &str) -> Result<usize> {
    let mut bytes = DEFAULT_STAGING_BYTES;
    for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((key, value)) = item.split_once(':')
            && key.trim() == "staging_mb"
        {
            let n: usize = value
                .trim()
                .parse()
                .map_err(|_| Error::InvalidLayout("DEVTENSOR_ALLOC_CONF values are integers"))?;
            if n == 0 {
                return Err(Error::InvalidLayout("DEVTENSOR_ALLOC_CONF staging_mb is at least 1"));
            }
            bytes = n.checked_mul(MIB).ok_or(Error::Overflow {
                what: "DEVTENSOR_ALLOC_CONF",
            })?;
        }
    }
    Ok(bytes)
}

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

/// Rounds a request to its size class (multiple of 512 B; 4 sub-bins per power of two).
pub fn round_size(n: usize) -> usize {
    if n <= MIN_BLOCK {
        return MIN_BLOCK;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let step = (p / 4).max(MIN_BLOCK);
    n.div_ceil(step).saturating_mul(step)
}

/// The class whose smallest size is the largest one ≤ `size` (size ≥ 512).
fn class_floor(size: usize) -> usize {
    let l = (usize::BITS - 1 - size.leading_zeros()) as usize;
    let sub = (size - (1 << l)) / ((1usize << l) / 4).max(1);
    (l - 9) * 4 + sub.min(3)
}

/// Events a block's reuser must wait for (shared by the pieces of a split block).
type Events = SmallVec<[Arc<EventHandle>; 1]>;

/// One block: a piece of a segment.
#[derive(Debug)]
struct Block {
    addr: usize,
    size: usize,
    /// Raw allocation of the segment, on its head block only.
    segment: Option<Allocation>,
    prev: u32,
    next: u32,
    free_prev: u32,
    free_next: u32,
    free: bool,
    large: bool,
    /// Events other streams' last uses recorded; a reuser waits on them.
    events: Events,
}

#[derive(Debug)]
struct FreeLists {
    heads: Vec<u32>,
    bitmap: [u64; NCLASS.div_ceil(64)],
}

impl FreeLists {
    fn new() -> Self {
        FreeLists {
            heads: vec![NONE; NCLASS],
            bitmap: [0; NCLASS.div_ceil(64)],
        }
    }

    /// First non-empty class ≥ `c`.
    fn find(&self, c: usize) -> Option<usize> {
        let mut word = c / 64;
        let mut bits = self.bitmap.get(word)? & (!0u64 << (c % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.bitmap.get(word)?;
        }
    }
}

/// The blocks of one stream, with its counters (kept under the pool's lock,
/// so the fast path does no atomic read-modify-write).
#[derive(Debug)]
struct Pool {
    stream: Option<StreamHandle>,
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    lists: [FreeLists; 2],
    allocated: usize,
    peak_allocated: usize,
    active_blocks: usize,
    alloc_count: usize,
}

impl Pool {
    fn new(stream: Option<StreamHandle>) -> Self {
        Pool {
            stream,
            blocks: Vec::new(),
            vacant: Vec::new(),
            lists: [FreeLists::new(), FreeLists::new()],
            allocated: 0,
            peak_allocated: 0,
            active_blocks: 0,
            alloc_count: 0,
        }
    }

    fn add(&mut self, b: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn link_free(&mut self, id: u32) {
        let (size, large) = (self.blocks[id as usize].size, self.blocks[id as usize].large);
        let c = class_floor(size);
        let lists = &mut self.lists[large as usize];
        let head = lists.heads[c];
        lists.heads[c] = id;
        lists.bitmap[c / 64] |= 1 << (c % 64);
        let b = &mut self.blocks[id as usize];
        b.free = true;
        b.free_prev = NONE;
        b.free_next = head;
        if head != NONE {
            self.blocks[head as usize].free_prev = id;
        }
    }

    fn unlink_free(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let (c, large, fp, fnx) = (class_floor(b.size), b.large, b.free_prev, b.free_next);
        if fp != NONE {
            self.blocks[fp as usize].free_next = fnx;
        } else {
            let lists = &mut self.lists[large as usize];
            lists.heads[c] = fnx;
            if fnx == NONE {
                lists.bitmap[c / 64] &= !(1 << (c % 64));
            }
        }
        if fnx != NONE {
            self.blocks[fnx as usize].free_prev = fp;
        }
        self.blocks[id as usize].free = false;
    }

    /// A free block of at least `size` bytes, split when worthwhile.
    fn take(&mut self, size: usize, large: bool, cfg: &PoolConfig) -> Option<u32> {
        let c = self.lists[large as usize].find(class_floor(size))?;
        let id = self.lists[large as usize].heads[c];
        self.unlink_free(id);
        let b = &self.blocks[id as usize];
        let rest = b.size - size;
        let splittable = if large {
            rest > cfg.small_max && b.size < cfg.max_split_size
        } else {
            rest >= MIN_BLOCK
        };
        if splittable {
            let (addr, next, events) = (b.addr, b.next, b.events.clone());
            let tail = self.add(Block {
                addr: addr + size,
                size: rest,
                segment: None,
                prev: id,
                next,
                free_prev: NONE,
                free_next: NONE,
                free: false,
                large,
                events,
            });
            if next != NONE {
                self.blocks[next as usize].prev = tail;
            }
            let b = &mut self.blocks[id as usize];
            b.size = size;
            b.next = tail;
            self.link_free(tail);
        }
        Some(id)
    }

    /// Frees a block and merges it with free neighbours; returns its final id.
    fn give_back(&mut self, id: u32) -> u32 {
        let mut id = id;
        let next = self.blocks[id as usize].next;
        if next != NONE && self.blocks[next as usize].free {
            self.unlink_free(next);
            self.absorb(id, next);
        }
        let prev = self.blocks[id as usize].prev;
        if prev != NONE && self.blocks[prev as usize].free {
            self.unlink_free(prev);
            self.absorb(prev, id);
            id = prev;
        }
        self.link_free(id);
        id
    }

    /// Merges block `b` (right after `a` in its segment) into `a`.
    fn absorb(&mut self, a: u32, b: u32) {
        let taken = std::mem::replace(&mut self.blocks[b as usize].events, SmallVec::new());
        let (size, next) = (self.blocks[b as usize].size, self.blocks[b as usize].next);
        let blk = &mut self.blocks[a as usize];
        blk.size += size;
        blk.next = next;
        for e in taken {
            if !blk.events.iter().any(|x| Arc::ptr_eq(x, &e)) {
                blk.events.push(e);
            }
        }
        if next != NONE {
            self.blocks[next as usize].prev = a;
        }
        self.vacant.push(b);
    }

    /// Ids of whole segments that are entirely free.
    fn free_segments(&self) -> Vec<u32> {
        (0..self.blocks.len() as u32)
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.free && b.segment.is_some() && b.next == NONE
            })
            .collect()
    }

    /// Removes a whole free segment from the pool, returning its raw allocation
    /// and the events pending on it.
    fn detach_segment(&mut self, id: u32) -> Option<(Allocation, Events, bool)> {
        self.unlink_free(id);
        let b = &mut self.blocks[id as usize];
        let seg = b.segment.take()?;
        let events = std::mem::take(&mut b.events);
        let large = b.large;
        self.vacant.push(id);
        Some((seg, events, large))
    }

    /// Inserts a whole free segment.
    fn attach_segment(&mut self, seg: Allocation, large: bool, events: Events) -> u32 {
        let id = self.add(Block {
            addr: seg.ptr.as_ptr() as usize,
            size: seg.size,
            segment: Some(seg),
            prev: NONE,
            next: NONE,
            free_prev: NONE,
            free_next: NONE,
            free: false,
            large,
            events,
        });
        self.link_free(id);
        id
    }

    fn largest_free(&self) -> usize {
        self.blocks.iter().filter(|b| b.free).map(|b| b.size).max().unwrap_or(0)
    }
}

/// Counters of the slow path (segments, OOM); the per-block ones live in each pool.
#[derive(Default)]
struct Counters {
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
    pools: RwLock<Vec<Arc<Mutex<Pool>>>>,
    default_pool: Arc<Mutex<Pool>>,
    by_stream: RwLock<HashMap<StreamHandle, usize>>,
    counters: Counters,
}

impl<A: NDAlloc> std::fmt::Debug for CachingAlloc<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAlloc")
            .field("raw", &self.raw)
            .field("stats", &self.memory_stats())
            .finish()
    }
}

fn lock(p: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl<A: NDAlloc> CachingAlloc<A> {
    /// A pool over `raw` with `cfg`.
    pub fn new(raw: A, cfg: PoolConfig) -> Self {
        let default_pool = Arc::new(Mutex::new(Pool::new(None)));
        CachingAlloc {
            raw,
            cfg,
            pools: RwLock::new(vec![default_pool.clone()]),
            default_pool,
            by_stream: RwLock::new(HashMap::new()),
            counters: Counters::default(),
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

    fn pool_index(&self, stream: Option<StreamHandle>) -> usize {
        let Some(s) = stream else { return 0 };
        if let Some(&i) = self.by_stream.read().unwrap_or_else(|e| e.into_inner()).get(&s) {
            return i;
        }
        let mut by = self.by_stream.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = by.get(&s) {
            return i;
        }
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.push(Arc::new(Mutex::new(Pool::new(Some(s)))));
        by.insert(s, pools.len() - 1);
        pools.len() - 1
    }

    fn pool(&self, index: usize) -> Arc<Mutex<Pool>> {
        if index == 0 {
            return self.default_pool.clone();
        }
        self.pools.read().unwrap_or_else(|e| e.into_inner())[index].clone()
    }

    fn all_pools(&self) -> Vec<Arc<Mutex<Pool>>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
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
            for id in p.free_segments() {
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

    fn release_events(&self, events: Events) {
        for e in events {
            if let Ok(h) = Arc::try_unwrap(e) {
                self.raw.release_event(h);
            }
        }
    }

    /// Makes `stream` wait for the events on block `id`, then drops them.
    fn settle(&self, pool: &mut Pool, id: u32) -> Result<()> {
        let events = std::mem::take(&mut pool.blocks[id as usize].events);
        for e in &events {
            self.raw.wait_event(pool.stream, **e)?;
        }
        self.release_events(events);
        Ok(())
    }

    fn segment_size(&self, size: usize) -> (usize, bool) {
        let c = &self.cfg;
        if size <= c.small_max {
            (c.small_segment, false)
        } else if size <= c.large_max {
            (c.large_segment, true)
        } else {
            (size.div_ceil(2 * MIB).saturating_mul(2 * MIB), true)
        }
    }

    fn raw_segment(&self, seg: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
        let reserved = self.counters.reserved.load(Ordering::Relaxed);
        if reserved.saturating_add(seg) > self.cfg.limit {
            return Err(self.oom(seg));
        }
        let a = self.raw.allocate(seg, 256, stream)?;
        self.counters.segment_allocs.fetch_add(1, Ordering::Relaxed);
        self.counters.segments.fetch_add(1, Ordering::Relaxed);
        let r = self.counters.reserved.fetch_add(seg, Ordering::Relaxed) + seg;
        self.counters.peak_reserved.fetch_max(r, Ordering::Relaxed);
        Ok(a)
    }

    fn oom(&self, requested: usize) -> Error {
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

    /// The slow path: a new segment, else other streams' free segments, else
    /// release every cached segment and retry, else out of memory.
    fn grow(&self, pool_index: usize, size: usize, large: bool, requested: usize) -> Result<u32> {
        let (seg_size, seg_large) = self.segment_size(size);
        let pool = self.pool(pool_index);
        let stream = lock(&pool).stream;
        match self.raw_segment(seg_size, stream) {
            Ok(seg) => return Ok(self.insert_and_take(&pool, seg, seg_large, size, large, SmallVec::new())),
            Err(Error::OutOfMemory { .. }) => {}
            Err(e) => return Err(e),
        }
        // Whole free segments other streams cache, big enough: move one here,
        // ordered after the other stream's work by an event.
        for (i, other) in self.all_pools().iter().enumerate() {
            if i == pool_index {
                continue;
            }
            let mut o = lock(other);
            let found = o.free_segments().into_iter().find(|&id| {
                let b = &o.blocks[id as usize];
                b.size >= size && b.large == large
            });
            if let Some(id) = found
                && let Some((seg, mut events, seg_large)) = o.detach_segment(id)
            {
                if let Some(s) = o.stream
                    && let Some(ev) = self.raw.record_event(s)?
                {
                    events.push(Arc::new(ev));
                }
                drop(o);
                return Ok(self.insert_and_take(&pool, seg, seg_large, size, large, events));
            }
        }
        // Release everything cached and retry the device.
        self.empty_cache();
        match self.raw_segment(seg_size, stream) {
            Ok(seg) => Ok(self.insert_and_take(&pool, seg, seg_large, size, large, SmallVec::new())),
            Err(Error::OutOfMemory { .. }) => Err(self.oom(requested)),
            Err(e) => Err(e),
        }
    }

    fn insert_and_take(
        &self,
        pool: &Mutex<Pool>,
        seg: Allocation,
        seg_large: bool,
        size: usize,
        large: bool,
        events: Events,
    ) -> u32 {
        let mut p = lock(pool);
        let id = p.attach_segment(seg, seg_large, events);
        debug_assert_eq!(seg_large, large);
        p.take(size, large, &self.cfg).unwrap_or(id)
    }
}

fn token(pool: usize, id: u32) -> usize {
    (pool << 32) | id as usize
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
            return Err(Error::InvalidLayout(
                "pooled allocations are aligned to 256 bytes at most",
            ));
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
            return Err(self.oom(size));
        }
        let rounded = round_size(size);
        let large = rounded > self.cfg.small_max;
        let index = self.pool_index(stream);
        let pool = if index == 0 { None } else { Some(self.pool(index)) };
        let pool_ref = pool.as_deref().unwrap_or(&self.default_pool);
        let mut p = lock(pool_ref);
        let id = match p.take(rounded, large, &self.cfg) {
            Some(id) => id,
            None => {
                drop(p);
                let id = self.grow(index, rounded, large, size).inspect_err(|e| {
                    if matches!(e, Error::OutOfMemory { .. }) {
                        self.counters.oom_count.fetch_add(1, Ordering::Relaxed);
                    }
                })?;
                p = lock(pool_ref);
                id
            }
        };
        if !p.blocks[id as usize].events.is_empty()
            && let Err(e) = self.settle(&mut p, id)
        {
            p.give_back(id);
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
            token: token(index, id),
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
        let (index, id) = (a.token >> 32, (a.token & 0xffff_ffff) as u32);
        let mut events: Events = SmallVec::new();
        let mut synced = false;
        for &s in used_on {
            match self.raw.record_event(s) {
                Ok(Some(ev)) => events.push(Arc::new(ev)),
                Ok(None) => {}
                // The stream cannot be recorded on: its owner destroyed it (a
                // DLPack consumer's stream, say; the driver answers
                // CUDA_ERROR_INVALID_HANDLE) while its work may still be queued.
                // Wait for all the device's work instead, once; a device that
                // cannot even synchronise has failed, and the block goes back as it is.
                Err(_) if !synced => {
                    synced = true;
                    let _ = self.raw.synchronize_device();
                }
                Err(_) => {}
            }
        }
        let other = if index == 0 { None } else { Some(self.pool(index)) };
        let mut p = lock(other.as_deref().unwrap_or(&self.default_pool));
        let Some(b) = p.blocks.get_mut(id as usize) else { return };
        let size = b.size;
        b.events.extend(events);
        p.give_back(id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_to_four_sub_bins_per_power_of_two() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(4097), 5120);
        assert_eq!(round_size(5 * MIB + 1), 6 * MIB);
        for n in [1usize, 700, 3000, 123_456, 10_000_000, 1 << 33] {
            let r = round_size(n);
            assert!(r >= n && r % 512 == 0, "{n}");
            assert!(r - n <= (n / 4).max(511), "waste bounded for {n}");
            assert_eq!(class_floor(r), class_floor(r), "class of {r}");
        }
    }

    #[test]
    fn class_floor_is_monotonic_and_exact_on_rounded_sizes() {
        let mut last = 0;
        for k in 1..4096usize {
            let s = k * 512;
            let c = class_floor(s);
            assert!(c >= last);
            last = c;
            // A request rounded to class c finds blocks of class ≥ c only if big enough.
            let r = round_size(s);
            assert!(class_floor(r) >= class_floor(s));
        }
    }

    #[test]
    fn config_parses_and_rejects() {
        let c = PoolConfig::parse("max_split_size_mb:64, limit_mb:1024")
            .unwrap()
            .unwrap();
        assert_eq!((c.max_split_size, c.limit), (64 * MIB, 1024 * MIB));
        assert!(PoolConfig::parse("disable:1").unwrap().is_none());
        assert!(PoolConfig::parse("bogus:1").is_err());
        assert!(PoolConfig::parse("limit_mb:x").is_err());
        // The staging bound shares the variable without being a pool setting.
        assert_eq!(PoolConfig::parse("staging_mb:4").unwrap(), Some(PoolConfig::default()));
        assert_eq!(parse_staging("limit_mb:64, staging_mb:4").unwrap(), 4 * MIB);
        assert_eq!(parse_staging("").unwrap(), DEFAULT_STAGING_BYTES);
        assert!(parse_staging("staging_mb:0").is_err());
        assert!(parse_staging("staging_mb:x").is_err());
    }
}
