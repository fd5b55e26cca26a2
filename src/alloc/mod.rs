//! Allocators: the [`NDAlloc`] contract and its implementations.

mod cpu;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use cpu::{CpuAlloc, CPU_ALIGNMENT};

use crate::device::{Backend, Device};
use crate::error::{Error, Result};
use crate::stream::StreamHandle;

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
        self.peak_bytes.fetch_max(live, Ordering::Relaxed);
    }

    /// Records the release of an allocation of `size` bytes.
    pub fn on_free(&self, size: usize) {
        self.live_allocations.fetch_sub(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(size, Ordering::Relaxed);
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
/// aligned pointer that is never dereferenced.
pub unsafe trait NDAlloc: Send + Sync + fmt::Debug {
    /// The memory kind this allocator serves.
    fn device(&self) -> Device;

    /// Allocates `size` bytes aligned to `align` (a power of two), ordered on
    /// `stream` where the device has streams (`None`: the device's default).
    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<NonNull<u8>>;

    /// Returns memory to the allocator.
    ///
    /// # Safety
    ///
    /// `ptr` must come from `allocate` on this allocator with the same `size`
    /// and `align`, must not have been freed, and must not be used afterwards.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: Option<StreamHandle>);

    /// Live-allocation counters.
    fn stats(&self) -> AllocStats;
}

/// The allocator devtensor uses for `device` unless told otherwise.
pub fn default_allocator(device: Device) -> Result<Arc<dyn NDAlloc>> {
    match device {
        Device::Cpu => Ok(CpuAlloc::shared()),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) | Device::CudaHost | Device::CudaManaged(_) => crate::backend::cuda::alloc::shared(device),
        other => Err(Error::BackendUnavailable {
            backend: other.backend(),
            reason: unavailable_reason(other.backend()),
        }),
    }
}

fn unavailable_reason(backend: Backend) -> String {
    match backend {
        Backend::Cpu => unreachable!("the CPU is always available"),
        Backend::Cuda => crate::backend::cuda_status().unavailable_reason(),
        Backend::Rocm => crate::backend::rocm_status().unavailable_reason(),
    }
}
