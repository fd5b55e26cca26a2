//! Allocators: the [`NDAlloc`] contract and its implementations.

mod cpu;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

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
