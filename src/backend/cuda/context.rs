//! Per-device primary contexts and driver error mapping.
//!
//! Every CUDA entry point first calls [`device`], which returns
//! `Error::BackendUnavailable` unless the probe found a driver and the ordinal
//! exists, so cudarc is never asked to load a missing library (it would panic).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{DriverError, result};

use crate::backend::cuda_status;
use crate::device::{Backend, Device};
use crate::error::{Error, Result};

/// One GPU: its driver handle and retained primary context.
#[derive(Debug)]
pub struct Gpu {
    /// Ordinal.
    pub(crate) ordinal: u32,
    /// `CUdevice`.
    pub(crate) dev: sys::CUdevice,
    /// The retained primary context.
    pub(crate) ctx: sys::CUcontext,
    /// `sm_XY` of the device.
    pub(crate) arch: String,
    /// The largest pitch `cuMemcpy2D` accepts (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
    pub(crate) max_pitch: usize,
}

// SAFETY: CUdevice is an integer and CUcontext a driver handle that the CUDA
// driver allows to be made current on any thread.
unsafe impl Send for Gpu {}
// SAFETY: as above; `Gpu` is immutable after creation.
unsafe impl Sync for Gpu {}

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

    /// Makes this GPU's context current on the calling thread until the guard
    /// drops, which puts the caller's context back: torch and CuPy read their
    /// "current device" from the current context, so ours must not leak into it.
    pub fn bind(&self) -> Result<Current> {
        // SAFETY: `ctx` is a primary context retained for the life of the process.
        unsafe { bind_context(self.ctx) }
    }
}

/// Makes `ctx` current on the calling thread until the guard drops (as [`Gpu::bind`]).
///
/// # Safety
///
/// `ctx` is a live context for as long as the guard lives.
pub unsafe fn bind_context(ctx: sys::CUcontext) -> Result<Current> {
    let prev = current_context()?.unwrap_or(std::ptr::null_mut());
    if prev == ctx {
        return Ok(Current { prev: None });
    }
    // SAFETY: the caller's contract.
    driver("cuCtxSetCurrent", unsafe { result::ctx::set_current(ctx) })?;
    Ok(Current { prev: Some(prev) })
}

/// Makes GPU `ordinal`'s primary context current on the calling thread and
/// leaves it there (`torch.cuda.set_device`); returns the context that was
/// current before (null for none), for [`restore_context`].
pub fn make_current(ordinal: u32) -> Result<usize> {
    let gpu = device(ordinal)?;
    let prev = current_context()?.map_or(0, |c| c as usize);
    // SAFETY: `gpu.ctx` is a primary context retained for the life of the process.
    driver("cuCtxSetCurrent", unsafe { result::ctx::set_current(gpu.ctx) })?;
    Ok(prev)
}

/// Makes `ctx` (a value from [`make_current`]; 0: none) current again.
///
/// # Safety
///
/// `ctx` is 0 or a context that is still alive.
pub unsafe fn restore_context(ctx: usize) -> Result<()> {
    crate::fork::check(Backend::Cuda)?;
    // SAFETY: the caller's contract; null unbinds.
    driver("cuCtxSetCurrent", unsafe {
        result::ctx::set_current(ctx as sys::CUcontext)
    })
}

/// The context current on the calling thread, if any (a foreign one included).
pub fn current_context() -> Result<Option<sys::CUcontext>> {
    crate::fork::check(Backend::Cuda)?;
    driver("cuCtxGetCurrent", result::ctx::get_current())
}

/// The GPUs whose primary context devtensor has retained, by ordinal.
pub fn used_gpus() -> Vec<&'static Gpu> {
    let mut v: Vec<&'static Gpu> = lock_gpus().values().copied().collect();
    v.sort_by_key(|g| g.ordinal);
    v
}

/// What a device named without an index means, and the GPU whose context
/// allocates portable pinned memory when none is current: the device of the
/// calling thread's current context, else the first GPU devtensor used in
/// this process, else 0. Retains nothing. The first, not the lowest: a
/// process that works on GPU 1 keeps meaning GPU 1 by "cuda" after merely
/// asking about GPU 0 (`memory_stats("cuda:0")` retains its context).
pub fn current_or_used() -> Result<u32> {
    if let Some(i) = current_device()? {
        return Ok(i);
    }
    Ok(FIRST_USED.get().copied().unwrap_or(0))
}

/// The ordinal of the first GPU whose primary context devtensor retained.
static FIRST_USED: OnceLock<u32> = OnceLock::new();

fn lock_gpus() -> std::sync::MutexGuard<'static, HashMap<u32, &'static Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<u32, &'static Gpu>>> = OnceLock::new();
    GPUS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A GPU made current by [`Gpu::bind`]; dropping it restores the context the
/// thread had before (none included). Not `Send`: a current context belongs
/// to a thread.
#[must_use = "the GPU is current only while this guard lives"]
#[derive(Debug)]
pub struct Current {
    prev: Option<sys::CUcontext>,
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            // SAFETY: `prev` was current on this thread when the guard was made
            // (or null, which unbinds); guards drop in reverse order of creation
            // on the thread that made them, so it is the caller's context.
            unsafe { sys::cuCtxSetCurrent(prev) };
        }
    }
}

/// The ordinal of the GPU whose context is current on the calling thread;
/// `None` when no context is current (or no driver is present).
pub fn current_device() -> Result<Option<u32>> {
    if !cuda_status().is_available() {
        return Ok(None); // cudarc would panic on a missing libcuda
    }
    if current_context()?.is_none() {
        return Ok(None);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current; `dev` is a valid out-pointer.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    Ok(u32::try_from(dev).ok())
}

/// Maps a `CUresult` to `Ok` or `Error::Driver`.
pub fn check(call: &'static str, rc: CUresult) -> Result<()> {
    if rc == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let message = match DriverError(rc).error_string() {
        Ok(text) => text.to_string_lossy().into_owned(),
        Err(_) => format!("{rc:?}"),
    };
    Err(Error::Driver {
        backend: Backend::Cuda,
        call,
        code: rc as i64,
        message,
    })
}

/// A call through `cudarc::driver::result` as `Ok` or `Error::Driver` naming
/// `call` (cudarc's wrappers return the bare `CUresult`).
pub fn driver<T>(call: &'static str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| match check(call, e.0) {
        Err(err) => err,
        // A DriverError never holds CUDA_SUCCESS; say so rather than panic.
        Ok(()) => Error::Internal("cudarc reported success as an error"),
    })
}

/// As [`check`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes `Error::OutOfMemory`.
pub fn check_alloc(call: &'static str, rc: CUresult, device: Device, requested: usize) -> Result<()> {
    if rc == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
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

/// The GPU with this ordinal, its context retained on first use.
pub fn device(ordinal: u32) -> Result<&'static Gpu> {
    crate::fork::check(Backend::Cuda)?;
    let status = cuda_status();
    if !status.is_available() {
        return Err(Error::BackendUnavailable {
            backend: Backend::Cuda,
            reason: status.unavailable_reason(),
        });
    }
    let Some(info) = status.devices.iter().find(|d| d.ordinal == ordinal) else {
        return Err(Error::BackendUnavailable {
            backend: Backend::Cuda,
            reason: format!("no CUDA device {ordinal} (this machine has {})", status.devices.len()),
        });
    };
    let mut gpus = lock_gpus();
    if let Some(g) = gpus.get(&ordinal) {
        return Ok(g);
    }
    // The probe initialised the driver and saw this ordinal.
    let dev = driver("cuDeviceGet", result::device::get(ordinal as i32))?;
    // SAFETY: `dev` came from cuDeviceGet; the context is retained forever
    // (primary contexts are process-wide and shared with other libraries).
    let ctx = driver("cuDevicePrimaryCtxRetain", unsafe { result::primary_ctx::retain(dev) })?;
    // SAFETY: `dev` came from cuDeviceGet.
    let max_pitch = driver("cuDeviceGetAttribute", unsafe {
        result::device::get_attribute(dev, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)
    })?;
    let gpu: &'static Gpu = Box::leak(Box::new(Gpu {
        ordinal,
        dev,
        ctx,
        arch: info.arch.clone(),
        max_pitch: usize::try_from(max_pitch).unwrap_or(0),
    }));
    gpus.insert(ordinal, gpu);
    FIRST_USED.get_or_init(|| ordinal);
    Ok(gpu)
}

/// What kind of CUDA memory `ptr` points into, as devtensor names it
/// (`cuPointerGetAttribute`): device memory of GPU i, managed memory of GPU i,
/// or pinned host memory. An address the driver does not know is an error.
pub fn pointer_device(ptr: u64) -> Result<Device> {
    use sys::CUpointer_attribute as A;
    let ordinal = current_or_used()?;
    let _current = device(ordinal)?.bind()?;
    let attr = |a: A| -> Result<u32> {
        let mut v: u32 = 0;
        // SAFETY: each attribute asked for is an (unsigned) int, written to `v`.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute((&raw mut v).cast(), a, ptr)
        })?;
        Ok(v)
    };
    let memory_type = attr(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
    let managed = attr(A::CU_POINTER_ATTRIBUTE_IS_MANAGED)? != 0;
    let gpu = attr(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
    Ok(if managed {
        Device::CudaManaged(gpu)
    } else if memory_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        Device::CudaHost
    } else {
        Device::Cuda(gpu)
    })
}
