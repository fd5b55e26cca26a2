//! The caching pool's figures and cache release, per device.

use super::status::{DevtensorStatus, Failure, guard};
use super::streams::device_of;
use crate::dlpack::ffi::DLDevice;

/// A device's pool figures, as `torch.cuda.memory_stats` reports them. For
/// memory kinds without a pool (`kDLCPU`, `kDLCUDAManaged`) each live
/// allocation counts as a block and a segment, its bytes as allocated and
/// reserved; on `kDLCPU`, `reserved` (and `peak_reserved`) also counts the
/// freed blocks of 8 MiB and more kept mapped for reuse (in no segment),
/// which `devtensor_empty_cache` returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevtensorMemoryStats {
    /// Bytes in blocks handed out (rounded to the pool's size classes).
    pub allocated: u64,
    /// Bytes the pool holds from the device (all segments, cached ones too).
    pub reserved: u64,
    /// Highest `allocated`.
    pub peak_allocated: u64,
    /// Highest `reserved`.
    pub peak_reserved: u64,
    /// Blocks handed out and not yet freed.
    pub active_blocks: u64,
    /// Segments held from the device.
    pub segments: u64,
    /// Allocations served.
    pub alloc_count: u64,
    /// Allocations that needed a new segment from the device.
    pub segment_allocs: u64,
    /// Out-of-memory failures returned.
    pub oom_count: u64,
}

/// Writes the pool figures of `device` to `*out`.
///
/// # Safety
///
/// `out` must be NULL (an error) or valid for writing a `DevtensorMemoryStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_memory_stats(device: DLDevice, out: *mut DevtensorMemoryStats) -> DevtensorStatus {
    guard("devtensor_memory_stats", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let s = crate::backend::memory_stats(device_of(device)?)?;
        let stats = DevtensorMemoryStats {
            allocated: s.allocated as u64,
            reserved: s.reserved as u64,
            peak_allocated: s.peak_allocated as u64,
            peak_reserved: s.peak_reserved as u64,
            active_blocks: s.active_blocks as u64,
            segments: s.segments as u64,
            alloc_count: s.alloc_count as u64,
            segment_allocs: s.segment_allocs as u64,
            oom_count: s.oom_count as u64,
        };
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Returns the free memory cached by `device`'s pool to the device (as
/// `torch.cuda.empty_cache`); writes the bytes released to `*released` when
/// it is not NULL (on `kDLCPU`, the freed large blocks kept mapped for reuse;
/// 0 for `kDLCUDAManaged`, which keeps none). Memory still in use, or freed
/// on a stream whose work is pending, stays.
///
/// # Safety
///
/// `released` must be NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_empty_cache(device: DLDevice, released: *mut u64) -> DevtensorStatus {
    guard("devtensor_empty_cache", || {
        let n = crate::backend::empty_cache(device_of(device)?)?;
        if !released.is_null() {
            // SAFETY: non-null and writable (the caller's contract).
            unsafe { released.write(n as u64) };
        }
        Ok(())
    })
}

/// The number of tensors this library has handed out (through this C ABI,
/// or the Rust API of the same copy of devtensor) whose deleter has not run
/// yet: a leak check for tests. The Python package is a library of its own,
/// with its own count and its own pools (as are the figures above).
#[unsafe(no_mangle)]
pub extern "C" fn devtensor_live_tensors() -> u64 {
    crate::dlpack::live_exports() as u64
}
