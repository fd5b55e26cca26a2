//! Device backends and their availability.
//!
//! Every backend implements [`DeviceBackend`]; [`for_device`] is the one
//! place that maps a device to its backend, and the only place (with the
//! module declarations here) that asks which backends were built in.
//!
//! Each backend is probed once, without panicking, and the answer cached:
//! a missing driver or device becomes a [`BackendStatus`] with the reason and
//! the fix, and every entry point of that backend returns
//! [`Error::BackendUnavailable`](crate::Error::BackendUnavailable).

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod deferred;
mod device_backend;
pub(crate) mod gpu_runtime;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod kernels;
pub(crate) mod launch;
mod per_device;
#[cfg(feature = "rocm")]
pub mod rocm;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod rtc;
mod unavailable;

use std::sync::{Arc, OnceLock};

pub use device_backend::{BoundDevice, DeviceBackend};
pub(crate) use per_device::PerDevice;

use crate::alloc::{MemoryStats, NDAlloc};
use crate::device::{Backend, Device};
use crate::error::Result;

/// The backend that serves `device`'s memory kind; for a backend not built
/// in, one whose every entry point says why it is unavailable.
pub fn for_device(device: Device) -> &'static dyn DeviceBackend {
    for_backend(device.backend())
}

/// The backend of that kind (see [`for_device`]).
pub fn for_backend(backend: Backend) -> &'static dyn DeviceBackend {
    match backend {
        Backend::Cpu => &cpu::CpuBackend,
        #[cfg(feature = "cuda")]
        Backend::Cuda => &cuda::device_backend::CudaBackend,
        #[cfg(feature = "rocm")]
        Backend::Rocm => &rocm::device_backend::RocmBackend,
        #[allow(unreachable_patterns)] // with every backend built in, none is left
        other => unavailable::not_built(other),
    }
}

/// The allocator devtensor uses for `device` unless told otherwise. A forked
/// child gets an error instead of its parent's GPU pool (or driver).
pub fn default_allocator(device: Device) -> Result<Arc<dyn NDAlloc>> {
    crate::fork::check(device.backend())?;
    for_device(device).allocator(device)
}

/// Pool figures for `device` (like `torch.cuda.memory_stats`). Memory kinds
/// without a pool report their live allocations as both allocated and reserved.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    if let Some(stats) = for_device(device).pool_stats(device)? {
        return Ok(stats);
    }
    Ok(unpooled_stats(default_allocator(device)?.stats()))
}

/// An allocator without a pool's figures as `memory_stats` reports them:
/// every live allocation its own segment.
pub(crate) fn unpooled_stats(s: crate::alloc::AllocStats) -> MemoryStats {
    MemoryStats {
        allocated: s.live_bytes,
        reserved: s.live_bytes,
        peak_allocated: s.peak_bytes,
        peak_reserved: s.peak_bytes,
        active_blocks: s.live_allocations,
        segments: s.live_allocations,
        alloc_count: s.total_allocations,
        segment_allocs: s.total_allocations,
        oom_count: 0,
    }
}

/// Returns the cached free memory of `device`'s pool to the device; the bytes
/// released (0 for memory kinds without a pool).
pub fn empty_cache(device: Device) -> Result<usize> {
    for_device(device).empty_cache(device)
}

/// One device as a backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal.
    pub ordinal: u32,
    /// Marketing name.
    pub name: String,
    /// Architecture (`sm_90`, `gfx942`, ...).
    pub arch: String,
    /// Total memory in bytes.
    pub total_memory: usize,
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// The backend probed.
    pub backend: Backend,
    /// Library versions found (`"driver" => "13.0"`, `"nvrtc" => "12.8"`, ...).
    pub versions: Vec<(&'static str, String)>,
    /// Devices found; empty when unavailable.
    pub devices: Vec<DeviceInfo>,
    /// Why the backend cannot be used, and what fixes it; `None` when usable.
    pub unavailable: Option<String>,
}

impl BackendStatus {
    /// True when at least one device can be used.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// The reason text for [`Error::BackendUnavailable`](crate::Error::BackendUnavailable).
    pub fn unavailable_reason(&self) -> String {
        self.unavailable.clone().unwrap_or_else(|| "no such device".to_owned())
    }
}

pub use cpu::cpu_status;

/// The ordinal of `backend`'s GPU current on the calling thread, what a device
/// named without an index (`"cuda"`, `"rocm"`) means. CUDA: the device of the
/// current context, else the first GPU devtensor used, else 0;
/// ROCm: `hipGetDevice`. Never makes a context: asking retains nothing.
pub fn current_ordinal(backend: Backend) -> Result<u32> {
    for_backend(backend).current_ordinal()
}

/// The CUDA probe's answer (cached after the first call).
pub fn cuda_status() -> &'static BackendStatus {
    static STATUS: OnceLock<BackendStatus> = OnceLock::new();
    // A usable backend's driver is initialized in this process from here on (fork safety).
    STATUS.get_or_init(|| crate::fork::initialized(probe_cuda()))
}

fn probe_cuda() -> BackendStatus {
    #[cfg(feature = "cuda")]
    return cuda::probe();
    #[cfg(not(feature = "cuda"))]
    unavailable::not_built_status(Backend::Cuda)
}

/// The ROCm probe's answer (cached after the first call).
pub fn rocm_status() -> &'static BackendStatus {
    static STATUS: OnceLock<BackendStatus> = OnceLock::new();
    // A usable backend's driver is initialized in this process from here on (fork safety).
    STATUS.get_or_init(|| crate::fork::initialized(probe_rocm()))
}

fn probe_rocm() -> BackendStatus {
    #[cfg(feature = "rocm")]
    return rocm::probe();
    #[cfg(not(feature = "rocm"))]
    unavailable::not_built_status(Backend::Rocm)
}
