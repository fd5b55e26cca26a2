//! Devices and HIP error mapping.
//!
//! Every ROCm entry point first calls [`device`], which returns
//! `Error::BackendUnavailable` unless the probe found the ordinal, so no HIP
//! call is made for a device that is not there.

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;

use super::ffi::{self, Status};
use crate::backend::rocm_status;
use crate::device::{Backend, Device};
use crate::error::{Error, Result};

/// One AMD GPU.
#[derive(Debug)]
pub struct Gpu {
    /// Ordinal (the HIP device id).
    pub(crate) ordinal: u32,
    /// Full target id, e.g. `gfx90a:sramecc+:xnack-`.
    pub(crate) arch: String,
}

impl Gpu {
    /// Its ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Its architecture: `sm_XY` (CUDA) or the full gfx target id (ROCm), as
    /// run-time compilers take it.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Makes this GPU current on the calling thread (`hipSetDevice`) until the
    /// guard drops, which puts the caller's device back: torch on ROCm reads its
    /// current device from `hipGetDevice`, so ours must not leak into it.
    pub fn bind(&self) -> Result<Current> {
        crate::fork::check(Backend::Rocm)?;
        let mut prev: c_int = 0;
        // SAFETY: `prev` is a valid out-pointer.
        check("hipGetDevice", unsafe { ffi::hipGetDevice(&mut prev) })?;
        if prev == self.ordinal as c_int {
            return Ok(Current {
                prev: None,
                _thread: std::marker::PhantomData,
            });
        }
        // SAFETY: the ordinal was reported by the probe.
        check("hipSetDevice", unsafe { ffi::hipSetDevice(self.ordinal as c_int) })?;
        Ok(Current {
            prev: Some(prev),
            _thread: std::marker::PhantomData,
        })
    }
}

/// A GPU made current by [`Gpu::bind`]; dropping it restores the device the
/// thread had before. Not `Send`: the current device belongs to a thread.
#[must_use = "the GPU is current only while this guard lives"]
#[derive(Debug)]
pub struct Current {
    prev: Option<c_int>,
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            // SAFETY: `prev` is the device id HIP reported current on this thread.
            unsafe { ffi::hipSetDevice(prev) };
        }
    }
}

/// The device current on the calling thread (`hipGetDevice`); `None` when
/// HIP has no usable device.
pub fn current_device() -> Result<Option<u32>> {
    if !rocm_status().is_available() {
        return Ok(None);
    }
    crate::fork::check(Backend::Rocm)?;
    let mut d: c_int = 0;
    // SAFETY: a valid out-pointer.
    check("hipGetDevice", unsafe { ffi::hipGetDevice(&mut d) })?;
    Ok(u32::try_from(d).ok())
}

/// `hipErrorNoDevice`-style name of a status (or its number).
pub fn error_name(rc: Status) -> String {
    // SAFETY: hipGetErrorName returns a static NUL-terminated string or null.
    let p = unsafe { ffi::hipGetErrorName(rc) };
    if p.is_null() {
        format!("HIP error {rc}")
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Maps a HIP status to `Ok` or `Error::Driver`.
pub fn check(call: &'static str, rc: Status) -> Result<()> {
    if rc == ffi::SUCCESS {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns a static NUL-terminated string or null.
    let text = unsafe { ffi::hipGetErrorString(rc) };
    let message = if text.is_null() {
        error_name(rc)
    } else {
        // SAFETY: see above.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{}: {text}", error_name(rc))
    };
    Err(Error::Driver {
        backend: Backend::Rocm,
        call,
        code: i64::from(rc),
        message,
    })
}

/// As [`check`], but `hipErrorOutOfMemory` becomes `Error::OutOfMemory`.
pub fn check_alloc(call: &'static str, rc: Status, device: Device, requested: usize) -> Result<()> {
    if rc == ffi::ERROR_OUT_OF_MEMORY {
        return Err(Error::OutOfMemory {
            device,
            requested,
            reserved: 0,
            allocated: 0,
            largest_free: 0,
        });
    }
    check(call, rc)
}

/// The GPU with this ordinal.
pub fn device(ordinal: u32) -> Result<&'static Gpu> {
    crate::fork::check(Backend::Rocm)?;
    static GPUS: OnceLock<Vec<Gpu>> = OnceLock::new();
    let status = rocm_status();
    if !status.is_available() {
        return Err(Error::BackendUnavailable {
            backend: Backend::Rocm,
            reason: status.unavailable_reason(),
        });
    }
    let gpus = GPUS.get_or_init(|| {
        status
            .devices
            .iter()
            .map(|d| Gpu {
                ordinal: d.ordinal,
                arch: d.arch.clone(),
            })
            .collect()
    });
    gpus.iter()
        .find(|g| g.ordinal == ordinal)
        .ok_or_else(|| Error::BackendUnavailable {
            backend: Backend::Rocm,
            reason: format!("no ROCm device {ordinal} (this machine has {})", gpus.len()),
        })
}
