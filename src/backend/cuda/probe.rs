//! Finds the CUDA driver, NVRTC and devices without ever panicking.
//!
//! cudarc panics when a library or symbol is missing, so the probe checks that
//! the library loads before the first call and runs inside `catch_unwind` as a
//! second line of defence.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{result, sys};

use crate::backend::{BackendStatus, DeviceInfo};
use crate::device::Backend;

pub(super) const NO_DRIVER: &str =
    "libcuda.so not found: install the NVIDIA driver (or add its directory to LD_LIBRARY_PATH)";

/// `cuDriverGetVersion` as the probe read it (1000 × major + 10 × minor).
static DRIVER_VERSION: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();

/// The driver's CUDA version (e.g. 12080 for 12.8); 0 before a successful probe.
pub fn driver_version() -> i32 {
    DRIVER_VERSION.get().copied().unwrap_or(0)
}

/// Probes the driver, NVRTC and every device.
pub(crate) fn probe() -> BackendStatus {
    let mut status = BackendStatus {
        backend: Backend::Cuda,
        versions: Vec::new(),
        devices: Vec::new(),
        unavailable: None,
    };
    // The driver first: which NVRTC to load depends on its version.
    match catch_unwind(AssertUnwindSafe(|| probe_driver(&mut status))) {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => status.unavailable = Some(reason),
        Err(_) => status.unavailable = Some("the CUDA driver library is incomplete (a symbol is missing)".to_owned()),
    }
    let nvrtc = match super::nvrtc::version() {
        Ok(((major, minor), path)) => format!("{major}.{minor} ({path})"),
        Err(e) => format!("not found: {e}"),
    };
    status.versions.insert(0, ("nvrtc", nvrtc));
    status
}

fn probe_driver(status: &mut BackendStatus) -> Result<(), String> {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(NO_DRIVER.to_owned());
    }
    let mut version: c_int = 0;
    // SAFETY: the library is present; `version` is a valid out-pointer.
    let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
    if rc == sys::CUresult::CUDA_SUCCESS {
        let _ = DRIVER_VERSION.set(version);
        status
            .versions
            .push(("driver", format!("{}.{}", version / 1000, (version % 1000) / 10)));
    }
    result::init().map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => "the NVIDIA driver is installed but reports no CUDA device".to_owned(),
        _ => format!("cuInit failed: {}", describe(e)),
    })?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
    if count <= 0 {
        return Err("the NVIDIA driver reports no CUDA device".to_owned());
    }
    for ordinal in 0..count {
        let dev = result::device::get(ordinal).map_err(describe)?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown".to_owned());
        let attr = |a| {
            // SAFETY: `dev` was returned by `cuDeviceGet` for a valid ordinal.
            unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0)
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        // SAFETY: as above.
        let total_memory = unsafe { result::device::total_mem(dev) }.unwrap_or(0);
        status.devices.push(DeviceInfo {
            ordinal: ordinal as u32,
            name,
            arch: format!("sm_{major}{minor}"),
            total_memory,
        });
    }
    Ok(())
}

fn describe(e: result::DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name} ({:?})", e.0)
}
