//! Allocators: the [`NDAlloc`] contract and its implementations.

mod caching;
mod cpu;
mod huge_pages;
mod mapped_blocks;
mod small_blocks;

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use caching::{CachingAlloc, DEFAULT_STAGING_BYTES, MemoryStats, PoolConfig, parse_staging, staging_bytes};
pub use cpu::{CPU_ALIGNMENT, CpuAlloc};

use crate::device::Device;
use crate::error::Result;
use crate::stream::{EventHandle, StreamHandle};

/// Live-allocation counters of one allocator, as tests and `devtensor info` read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocStats {
    /// Allocations not yet freed.
    pub live_allocations: usize,
    /// Bytes in allocations not yet freed.
    pub live_bytes: usize,
    /// Highest `live_bytes` seen.
    pub peak_bytes: usize,
    /// Allocations made since start.
    pub total_allocations: usize,
}

/// One allocation handed out by an [`NDAlloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Start of the memory.
    pub ptr: NonNull<u8>,
    /// Bytes requested.
    pub size: usize,
    /// Alignment requested.
    pub align: usize,
    /// Allocator-private identity of the block (a pool's block index), so a
    /// free needs no global lookup; 0 where unused.
    pub token: usize,
}

// SAFETY: an Allocation only describes memory (address, size, identity); the
// NDAlloc that made it is Send + Sync and may free it from any thread.
unsafe impl Send for Allocation {}
// SAFETY: as above; shared references expose only plain values.
unsafe impl Sync for Allocation {}

/// Lock-free live-allocation counters an allocator embeds.
#[derive(Debug, Default)]
pub struct Counters {
    live_allocations: AtomicUsize,
    live_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    total_allocations: AtomicUsize,
}

impl Counters {
    /// Zeroed counters (usable in a `static`).
    pub const fn new() -> Counters {
        Counters {
            live_allocations: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
            total_allocations: AtomicUsize::new(0),
        }
    }

    /// Records an allocation of `size` bytes.
    pub fn on_alloc(&self, size: usize) {
        self.live_allocations.fetch_add(1, Ordering::Relaxed);
        self.total_allocations.fetch_add(1, Ordering::Relaxed);
        let live = self.live_bytes.fetch_add(size, Ordering::Relaxed) + size;
        // Most allocations set no new peak: a load instead of a locked
        // read-modify-write (small tensors pay for every one).
        if live > self.peak_bytes.load(Ordering::Relaxed) {
            self.peak_bytes.fetch_max(live, Ordering::Relaxed);
        }
    }

    /// Records the release of an allocation of `size` bytes.
    pub fn on_free(&self, size: usize) {
        self.live_allocations.fetch_sub(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(size, Ordering::Relaxed);
    }

    /// [`on_alloc`](Self::on_alloc) for the bytes only: the allocation is
    /// counted elsewhere (see [`with_counts`](Self::with_counts)).
    pub(crate) fn on_alloc_bytes(&self, size: usize) {
        let live = self.live_bytes.fetch_add(size, Ordering::Relaxed) + size;
        if live > self.peak_bytes.load(Ordering::Relaxed) {
            self.peak_bytes.fetch_max(live, Ordering::Relaxed);
        }
    }

    /// [`on_free`](Self::on_free) for the bytes only.
    pub(crate) fn on_free_bytes(&self, size: usize) {
        self.live_bytes.fetch_sub(size, Ordering::Relaxed);
    }

    /// A snapshot, with `allocated` more allocations made and `freed` more
    /// released than these counters saw.
    pub(crate) fn with_counts(&self, allocated: usize, freed: usize) -> AllocStats {
        let mut s = self.stats();
        // Wrapping: a block counted here may be freed in another thread's counts.
        s.live_allocations = s.live_allocations.wrapping_add(allocated).wrapping_sub(freed);
        s.total_allocations = s.total_allocations.wrapping_add(allocated);
        s
    }

    /// Bytes live now.
    pub(crate) fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// A snapshot.
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            live_allocations: self.live_allocations.load(Ordering::Relaxed),
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            total_allocations: self.total_allocations.load(Ordering::Relaxed),
        }
    }
}

/// A device allocator: hands out raw bytes of one memory kind.
///
/// # Safety
///
/// An implementation promises that a pointer returned by [`NDAlloc::allocate`]
/// is aligned to at least the requested alignment, valid for `size` bytes on
/// [`NDAlloc::device`] and not handed out again until it is passed back to
/// [`NDAlloc::deallocate`]. For `size == 0` it may return any non-null
/// aligned pointer that is never dereferenced. [`NDAlloc::zero_filled`] says
/// `true` only of fresh allocations whose every byte reads as zero.
pub unsafe trait NDAlloc: Send + Sync + fmt::Debug {
    /// The memory kind this allocator serves.
    fn device(&self) -> Device;

    /// Allocates `size` bytes aligned to `align` (a power of two), ordered on
    /// `stream` where the device has streams (`None`: the device's default).
    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<Allocation>;

    /// As [`NDAlloc::allocate`], for memory about to be zero-filled: where the
    /// allocator can hand out memory that reads as zeros unwritten
    /// ([`NDAlloc::zero_filled`], a fresh mapping), it prefers that to memory
    /// it kept for reuse.
    fn allocate_for_zeros(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
        self.allocate(size, align, stream)
    }

    /// Returns memory to the allocator, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `a` must come from `allocate` on this allocator, must not have been
    /// freed, and its memory must not be used afterwards.
    unsafe fn deallocate(&self, a: Allocation, stream: Option<StreamHandle>);

    /// Returns memory that was also used on `used_on` streams besides the one
    /// it was allocated on (`record_stream`): a stream-aware pool must not hand
    /// it to another stream before that work is done. The default frees at once
    /// (right for allocators whose free synchronises, and for the CPU).
    ///
    /// # Safety
    ///
    /// As [`NDAlloc::deallocate`].
    unsafe fn deallocate_after(&self, a: Allocation, stream: Option<StreamHandle>, used_on: &[StreamHandle]) {
        let _ = used_on;
        // SAFETY: forwarded from the caller.
        unsafe { self.deallocate(a, stream) }
    }

    /// Whether `a`, just returned by [`NDAlloc::allocate`] and not yet
    /// written, already reads as zeros (a fresh anonymous mapping): zero-filled
    /// tensors then skip their fill, as `calloc` lets NumPy's `zeros` do.
    fn zero_filled(&self, a: &Allocation) -> bool {
        let _ = a;
        false
    }

    /// Live-allocation counters.
    fn stats(&self) -> AllocStats;

    /// Records an event at the current end of `stream`'s work (`None` for
    /// devices without streams). Used by pools to order the reuse of memory.
    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>> {
        let _ = stream;
        Ok(None)
    }

    /// Makes `stream` (`None`: the default stream) wait on the device for
    /// `event`; the host does not block.
    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> Result<()> {
        let _ = (stream, event);
        Ok(())
    }

    /// Releases an event from [`NDAlloc::record_event`].
    fn release_event(&self, event: EventHandle) {
        let _ = event;
    }

    /// True when the work `event` (from [`NDAlloc::record_event`]) captured is
    /// done; never blocks.
    fn event_done(&self, event: EventHandle) -> Result<bool> {
        let _ = event;
        Ok(true)
    }

    /// Blocks the host until all work queued on the device (every stream,
    /// destroyed ones included) is done: the fallback when a stream recorded
    /// on memory can no longer be recorded on.
    fn synchronize_device(&self) -> Result<()> {
        Ok(())
    }
}
