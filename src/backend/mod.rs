//! Device backends and their availability.
//!
//! Each backend is probed once, without panicking, and the answer cached:
//! a missing driver or device becomes a [`BackendStatus`] with the reason and
//! the fix, and every entry point of that backend returns
//! [`Error::BackendUnavailable`](crate::Error::BackendUnavailable).

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod gpu_copy;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod kernels;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod launch;
#[cfg(feature = "rocm")]
pub mod rocm;

use std::sync::OnceLock;

use crate::device::Backend;

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

/// The CPU: always there.
pub fn cpu_status() -> BackendStatus {
    let threads = rayon::current_num_threads();
    BackendStatus {
        backend: Backend::Cpu,
        versions: vec![("rayon threads", threads.to_string())],
        devices: vec![DeviceInfo {
            ordinal: 0,
            name: format!(
                "host ({} logical cores)",
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
            arch: std::env::consts::ARCH.to_owned(),
            total_memory: 0,
        }],
        unavailable: None,
    }
}

/// The ordinal of `backend`'s GPU current on the calling thread, what a device
/// named without an index (`"cuda"`, `"rocm"`) means. CUDA: the device of the
/// current context, else a GPU devtensor already uses (the lowest), else 0;
/// ROCm: `hipGetDevice`. Never makes a context: asking retains nothing.
pub fn current_ordinal(backend: Backend) -> crate::Result<u32> {
    match backend {
        Backend::Cpu => Ok(0),
        #[cfg(feature = "cuda")]
        Backend::Cuda => cuda::context::current_or_used(),
        #[cfg(feature = "rocm")]
        Backend::Rocm => Ok(rocm::context::current_device()?.unwrap_or(0)),
        #[allow(unreachable_patterns)]
        _ => Ok(0),
    }
}

/// The CUDA probe's answer (cached after the first call).
pub fn cuda_status() -> &'static BackendStatus {
    static STATUS: OnceLock<BackendStatus> = OnceLock::new();
    // A usable backend's driver is initialized in this process from here on (fork safety).
    STATUS.get_or_init(|| crate::fork::initialized(probe_cuda()))
}

fn probe_cuda() -> BackendStatus {
    #[cfg(feature = "cuda")]
    {
        cuda::probe()
    }
    #[cfg(not(feature = "cuda"))]
    {
        BackendStatus {
            backend: Backend::Cuda,
            versions: Vec::new(),
            devices: Vec::new(),
            unavailable: Some(
                "built without the `cuda` feature: rebuild with `--features cuda` (on by default)".to_owned(),
            ),
        }
    }
}

/// The ROCm probe's answer (cached after the first call).
pub fn rocm_status() -> &'static BackendStatus {
    static STATUS: OnceLock<BackendStatus> = OnceLock::new();
    // A usable backend's driver is initialized in this process from here on (fork safety).
    STATUS.get_or_init(|| crate::fork::initialized(probe_rocm()))
}

fn probe_rocm() -> BackendStatus {
    #[cfg(feature = "rocm")]
    {
        rocm::probe()
    }
    #[cfg(not(feature = "rocm"))]
    {
        BackendStatus {
            backend: Backend::Rocm,
            versions: Vec::new(),
            devices: Vec::new(),
            unavailable: Some(
                "built without the `rocm` feature: install HIP (libamdhip64) and rebuild with `--features rocm`"
                    .to_owned(),
            ),
        }
    }
}
