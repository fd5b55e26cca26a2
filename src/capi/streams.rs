//! The current stream per device and thread (as TVM-FFI's
//! `TVMFFIEnvGetStream` / `TVMFFIEnvSetStream`), and the ordering of devtensor's
//! own work (which runs on the device's default stream) with a caller's stream.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use super::status::{DevtensorStatus, Failure, guard};
use crate::device::{Backend, Device};
use crate::dlpack::ffi::DLDevice;
use crate::stream::StreamHandle;

thread_local! {
    /// Streams set on this thread, by (device_type, device_id); absent: NULL.
    static CURRENT: RefCell<HashMap<(i32, i32), usize>> = RefCell::new(HashMap::new());
}

/// Reads a DLPack device.
pub(crate) fn device_of(d: DLDevice) -> Result<Device, Failure> {
    Ok(Device::from_dlpack(d)?)
}

/// `Err` unless a stream may be given for `device`: host memory of no backend
/// (`kDLCPU`) has no streams, so only NULL is accepted there.
fn check_stream_for(device: Device, stream: *mut c_void) -> Result<(), Failure> {
    if device.backend() == Backend::Cpu && !stream.is_null() {
        return Err(Failure::invalid(format!(
            "{device} has no streams: pass NULL, got {stream:p}"
        )));
    }
    Ok(())
}

/// This thread's current stream for `device` (NULL unless set).
pub(crate) fn current(device: DLDevice) -> *mut c_void {
    CURRENT
        .try_with(|c| {
            c.borrow()
                .get(&(device.device_type, device.device_id))
                .copied()
                .unwrap_or(0)
        })
        .unwrap_or(0) as *mut c_void
}

/// The stream the caching pool files an allocation of `device` under: `None`
/// for the default stream (NULL; CUDA's legacy stream, 1, too).
pub(crate) fn pool_stream(device: Device, stream: *mut c_void) -> Result<Option<StreamHandle>, Failure> {
    check_stream_for(device, stream)?;
    let raw = stream as usize;
    let default = match device.backend() {
        Backend::Cuda => raw == 0 || raw == StreamHandle::CUDA_LEGACY.as_raw(),
        _ => raw == 0,
    };
    // SAFETY: a live stream of `device` (the contract of every entry point
    // taking a stream).
    Ok((!default).then(|| unsafe { StreamHandle::from_raw(raw) }))
}

/// Runs `work`, which queues on `device`'s default stream (devtensor's copies
/// and fills), ordered after the work already queued on `stream` and before
/// the work queued on it later: an event each way, the host does not block
/// (unless `host_side`: the work runs on the host, which then waits for
/// `stream` first). `stream` NULL is the default stream.
pub(crate) fn ordered_on(
    device: Device,
    stream: *mut c_void,
    host_side: bool,
    work: impl FnOnce() -> crate::Result<()>,
) -> Result<(), Failure> {
    check_stream_for(device, stream)?;
    let backend = crate::backend::for_device(device);
    let Some(ours) = backend.default_stream() else {
        return Ok(work()?); // host memory: no streams to order
    };
    // Pinned memory (a foreign kDLCUDAHost tensor) where the backend's driver
    // library is missing: no GPU work of this process can be queued, so a
    // host copy has nothing to wait for, as where the backend is not built
    // in (above) and as NumPy reads such memory. A driver that is there but
    // failing (no device, a missing symbol) may still run another library's
    // work on the default stream: that copy waits, or fails. Another stream
    // always needs the driver.
    if host_side && stream.is_null() && device.ordinal().is_none() && backend.driver_missing() {
        return Ok(work()?);
    }
    let ordinal = match device.ordinal() {
        Some(i) => i,
        None => backend.current_ordinal()?, // pinned memory: the thread's GPU
    };
    let theirs = if stream.is_null() {
        ours
    } else {
        // SAFETY: the caller's stream is a live stream of this GPU (the
        // contract of every entry point taking a stream).
        unsafe { StreamHandle::from_raw(stream as usize) }
    };
    backend.order_streams(ordinal, theirs, ours)?;
    if host_side {
        backend.synchronize_stream(ordinal, ours)?;
    }
    work()?;
    Ok(backend.order_streams(ordinal, ours, theirs)?)
}

/// Writes the calling thread's current stream for `device` to `*out`: the
/// `CUstream` / `hipStream_t` last set with `devtensor_set_stream` on this
/// thread, or NULL (the default stream; always NULL for `kDLCPU`). Like
/// `TVMFFIEnvGetStream`; the allocator entry point allocates on this stream.
///
/// # Safety
///
/// `out` must be NULL (an error) or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_get_stream(device: DLDevice, out: *mut *mut c_void) -> DevtensorStatus {
    guard("devtensor_get_stream", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        device_of(device)?;
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { out.write(current(device)) };
        Ok(())
    })
}

/// Makes `stream` the calling thread's current stream for `device` (NULL:
/// the default stream) and, when `previous` is not NULL, writes the one it
/// replaces there. Like `TVMFFIEnvSetStream`. devtensor never creates,
/// synchronizes or destroys a stream set here.
///
/// # Safety
///
/// `stream` must be NULL or a stream of `device`'s GPU that stays live while
/// it is current and while work devtensor queued on it may run; `previous`
/// must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_set_stream(
    device: DLDevice,
    stream: *mut c_void,
    previous: *mut *mut c_void,
) -> DevtensorStatus {
    guard("devtensor_set_stream", || {
        let d = device_of(device)?;
        check_stream_for(d, stream)?;
        let old = CURRENT
            .try_with(|c| {
                let mut c = c.borrow_mut();
                let key = (device.device_type, device.device_id);
                let old = if stream.is_null() {
                    c.remove(&key)
                } else {
                    c.insert(key, stream as usize)
                };
                old.unwrap_or(0)
            })
            .map_err(|_| Failure::invalid("the calling thread is exiting"))?;
        if !previous.is_null() {
            // SAFETY: non-null and writable (the caller's contract).
            unsafe { previous.write(old as *mut c_void) };
        }
        Ok(())
    })
}
