//! Tensors through the C ABI: allocation (`empty`, `zeros`, the DLPack
//! allocator), copies between any two described tensors, `contiguous`.
//!
//! Results are owning `DLManagedTensorVersioned*` made by the DLPack export:
//! the caller frees each by calling its deleter once. Inputs are borrowed
//! descriptors (a foreign producer's included), validated as an import is.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::status::{DevtensorStatus, Failure, guard, last_error_ptr};
use super::streams::{current, device_of, ordered_on, pool_stream};
use crate::backend::default_allocator;
use crate::device::{Backend, Device};
use crate::dlpack::ExportOptions;
use crate::dlpack::ffi::{
    DLDataType, DLDevice, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};
use crate::dtype::DType;
use crate::layout::{self, MAX_NDIM, Shape};
use crate::tensor::{Storage, Tensor};

/// Reads `ndim` sizes from `shape` (NULL allowed for ndim 0).
///
/// # Safety
///
/// `shape` is NULL or points to `ndim` readable `int64_t`s.
unsafe fn read_shape(shape: *const i64, ndim: i32) -> Result<Shape, Failure> {
    let n = usize::try_from(ndim)
        .ok()
        .filter(|&n| n <= MAX_NDIM)
        .ok_or_else(|| Failure::invalid(format!("ndim {ndim} out of range 0..={MAX_NDIM}")))?;
    if n > 0 && shape.is_null() {
        return Err(Failure::null("shape"));
    }
    let mut out = Shape::with_capacity(n);
    for d in 0..n {
        // SAFETY: non-null and `ndim` long (the caller's contract).
        let size = unsafe { *shape.add(d) };
        out.push(
            usize::try_from(size).map_err(|_| Failure::invalid(format!("negative size {size} in dimension {d}")))?,
        );
    }
    Ok(out)
}

/// A fresh C-contiguous tensor from `device`'s default allocator (the caching
/// pool for CUDA/ROCm device and pinned memory), filed under `stream`.
fn allocate(shape: &[usize], dtype: DType, device: Device, stream: *mut c_void) -> Result<Tensor, Failure> {
    let handle = pool_stream(device, stream)?;
    layout::check_ndim(shape.len())?;
    let bytes = layout::nbytes(shape, dtype.size())?;
    let storage = Storage::new(default_allocator(device)?, bytes, handle)?;
    let strides = layout::contiguous_strides(shape)?;
    Ok(Tensor::from_parts(
        Arc::new(storage),
        dtype,
        shape.into(),
        strides,
        0,
        false,
    ))
}

/// Zero-fills `t` (fresh, contiguous) ordered on `stream`.
fn zero(t: &Tensor, stream: *mut c_void) -> Result<(), Failure> {
    let zero = vec![0u8; t.dtype().size()];
    if t.device() == Device::Cpu {
        return Ok(t.fill_bytes(&zero)?);
    }
    // Pinned and managed memory are filled by the host: it waits for `stream` first.
    ordered_on(t.device(), stream, t.device().is_host_accessible(), || {
        t.fill_bytes(&zero)
    })
}

/// Writes a fresh export of `t` to `out`.
///
/// # Safety
///
/// `out` is non-null and writable.
unsafe fn hand_out(t: &Tensor, out: *mut *mut DLManagedTensorVersioned) {
    let m = t.to_dlpack_versioned(ExportOptions::default());
    // SAFETY: the caller's contract.
    unsafe { out.write(m.into_raw()) };
}

/// The shared body of `devtensor_empty` and `devtensor_zeros`.
///
/// # Safety
///
/// As [`devtensor_empty`].
#[allow(clippy::too_many_arguments)] // the C arguments, plus the entry's name and the fill
unsafe fn create(
    name: &str,
    shape: *const i64,
    ndim: i32,
    dtype: DLDataType,
    device: DLDevice,
    stream: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
    zeros: bool,
) -> DevtensorStatus {
    guard(name, || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: forwarded from the caller.
        let shape = unsafe { read_shape(shape, ndim) }?;
        let dtype = DType::from_dlpack(dtype)?;
        let device = device_of(device)?;
        let t = allocate(&shape, dtype, device, stream)?;
        if zeros {
            zero(&t, stream)?;
        }
        // SAFETY: `out` checked non-null; writable by the caller's contract.
        unsafe { hand_out(&t, out) };
        Ok(())
    })
}

/// Allocates an uninitialised C-contiguous tensor of `ndim` sizes `shape`,
/// element type `dtype`, on `device`, and writes an owning
/// `DLManagedTensorVersioned*` to `*out` (free it by calling its `deleter`
/// once). Device and pinned memory come from devtensor's caching pool, filed
/// under `stream`: the memory may be reused by later work on `stream` as
/// soon as the deleter runs, as with PyTorch's allocator. `stream` is a
/// `CUstream` / `hipStream_t` of the device (NULL: the default stream; see
/// `devtensor_get_stream` for the current one); it must be NULL for `kDLCPU`.
/// On failure `*out` is left untouched.
///
/// # Safety
///
/// `shape` must point to `ndim` readable values (it may be NULL when `ndim`
/// is 0); `out` must be valid for writing a pointer; `stream` must be NULL or
/// a live stream of the device that outlives the tensor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_empty(
    shape: *const i64,
    ndim: i32,
    dtype: DLDataType,
    device: DLDevice,
    stream: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> DevtensorStatus {
    // SAFETY: forwarded from the caller.
    unsafe { create("devtensor_empty", shape, ndim, dtype, device, stream, out, false) }
}

/// As `devtensor_empty`, filled with zero bytes. The fill is queued on
/// `stream` (ordered after the work already queued there); for memory the
/// host can read (`kDLCPU`, `kDLCUDAHost`, `kDLCUDAManaged`, `kDLROCMHost`)
/// it is complete when the call returns.
///
/// # Safety
///
/// As `devtensor_empty`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_zeros(
    shape: *const i64,
    ndim: i32,
    dtype: DLDataType,
    device: DLDevice,
    stream: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> DevtensorStatus {
    // SAFETY: forwarded from the caller.
    unsafe { create("devtensor_zeros", shape, ndim, dtype, device, stream, out, true) }
}

/// A `DLPackManagedTensorAllocator` (dlpack.h): allocates an uninitialised
/// C-contiguous tensor with the dtype, shape and device of `prototype` (its
/// other fields are ignored) on the calling thread's current stream for that
/// device (`devtensor_set_stream`), and writes it to `*out`. Returns 0; on
/// failure calls `SetError(error_ctx, kind, message)` exactly once (when it
/// is not NULL; `kind` is a Python exception name such as `"MemoryError"`),
/// sets `devtensor_last_error`, and returns -1.
///
/// # Safety
///
/// `prototype` must be NULL or a readable `DLTensor` whose `shape` holds
/// `ndim` values; `out` must be NULL or writable; `set_error` NULL or a
/// function that may be called with `error_ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_managed_tensor_allocator(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char)>,
) -> c_int {
    let status = guard("devtensor_managed_tensor_allocator", || {
        if prototype.is_null() {
            return Err(Failure::null("prototype"));
        }
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: non-null and readable (the caller's contract).
        let p = unsafe { prototype.read() };
        // SAFETY: `shape` holds `ndim` values (the caller's contract).
        let shape = unsafe { read_shape(p.shape, p.ndim) }?;
        let dtype = DType::from_dlpack(p.dtype)?;
        let device = device_of(p.device)?;
        let t = allocate(&shape, dtype, device, current(p.device))?;
        // SAFETY: `out` checked non-null; writable by the caller's contract.
        unsafe { hand_out(&t, out) };
        Ok(())
    });
    if status == DevtensorStatus::Ok {
        return 0;
    }
    if let Some(set) = set_error {
        // SAFETY: the caller's function, with its own context and two C
        // strings alive for the call (the message is this thread's last error).
        unsafe { set(error_ctx, status.error_kind().as_ptr(), last_error_ptr()) };
    }
    -1
}

unsafe extern "C" fn free_wrapper(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: `m` came from `Box::into_raw` in `borrow` and is freed once
        // (the import calls its deleter exactly once).
        drop(unsafe { Box::from_raw(m) });
    }
}

/// A tensor over the memory `dl` describes, validated as an import is; the
/// memory stays the caller's (nothing frees it).
///
/// # Safety
///
/// `dl` describes memory that stays valid while the result (and the device
/// work queued on it) lives; its shape/strides arrays are readable.
unsafe fn borrow(dl: &DLTensor, read_only: bool) -> Result<Tensor, Failure> {
    let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor: DLPACK_MINOR_VERSION,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(free_wrapper),
        flags: if read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 },
        dl_tensor: *dl,
    }));
    // SAFETY: a fresh wrapper whose deleter frees only itself, once; the
    // descriptor is as the caller promised.
    Ok(unsafe { crate::dlpack::from_dlpack_versioned(m) }?)
}

/// The device devtensor's work for a copy between these runs on: the GPU side
/// (dst's when both are on GPUs), else managed memory's GPU, else pinned
/// memory's backend, else the CPU. Managed memory before pinned, whichever
/// side it is on: its GPU is the one whose work the copy must follow.
fn work_device(dst: Device, src: Device) -> Device {
    let sides = [dst, src];
    let gpu = |d: &Device| d.backend() != Backend::Cpu && !d.is_host_accessible();
    let managed = |d: &Device| d.backend() != Backend::Cpu && d.ordinal().is_some();
    let pinned = |d: &Device| d.backend() != Backend::Cpu;
    [gpu, managed, pinned]
        .into_iter()
        .find_map(|kind| sides.into_iter().find(kind))
        .unwrap_or(Device::Cpu)
}

/// `dst ← src` ordered on `stream`.
fn copy(dst: &Tensor, src: &Tensor, stream: *mut c_void) -> Result<(), Failure> {
    let device = work_device(dst.device(), src.device());
    let host_side = dst.device().is_host_accessible() && src.device().is_host_accessible();
    ordered_on(device, stream, host_side, || dst.copy_from(src))
}

/// Copies the elements of `src` into `dst` (any strides, either side;
/// overlapping memory included, but not a `dst` whose own elements overlap,
/// such as a stride 0 over more than one element: INVALID_ARGUMENT, as its
/// elements would take different values): same shape and dtype, any two devices
/// devtensor handles (CPU, CUDA device/pinned/managed, ROCm). Both are
/// borrowed descriptors, foreign ones included, validated first. The copy is
/// queued on `stream` (a stream of the GPU involved, `dst`'s when both are on
/// GPUs; NULL: the default stream; must be NULL for a CPU-to-CPU copy): it
/// runs after the work already queued there and before the work queued
/// later. A copy that involves host-readable memory is complete on return.
/// Pinned memory (kDLCUDAHost, kDLROCMHost) with a NULL stream is host
/// memory even where its GPU's driver is missing.
///
/// # Safety
///
/// `dst` and `src` must be NULL (an error) or readable `DLTensor`s describing
/// memory that stays valid until the copy is done; `stream` NULL or a live
/// stream of the device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_copy(
    dst: *const DLTensor,
    src: *const DLTensor,
    stream: *mut c_void,
) -> DevtensorStatus {
    guard("devtensor_copy", || {
        if dst.is_null() {
            return Err(Failure::null("dst"));
        }
        if src.is_null() {
            return Err(Failure::null("src"));
        }
        // SAFETY: non-null, readable descriptors (the caller's contract).
        let (d, s) = unsafe { (borrow(&*dst, false)?, borrow(&*src, true)?) };
        copy(&d, &s, stream)
    })
}

/// Reads a borrowed managed tensor's descriptor and read-only flag.
///
/// # Safety
///
/// `m` is non-null, its `version` readable, and the whole 1.x struct when
/// its major version is 1.
unsafe fn managed(m: *const DLManagedTensorVersioned, what: &str) -> Result<(DLTensor, bool), Failure> {
    // SAFETY: the caller's contract.
    let version = unsafe { (*m).version };
    if version.major != DLPACK_MAJOR_VERSION {
        return Err(Failure {
            status: DevtensorStatus::InvalidTensor,
            message: format!("{what}: unsupported DLPack major version {}", version.major),
        });
    }
    // SAFETY: major version 1: the 1.x layout (`flags` read only now: another
    // major's struct may be shorter).
    let (flags, dl) = unsafe { ((*m).flags, (*m).dl_tensor) };
    Ok((dl, flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0))
}

/// As `devtensor_copy`, for two managed tensors (borrowed, not consumed:
/// neither deleter is called): their major version must be 1, and a `dst`
/// flagged `DLPACK_FLAG_BITMASK_READ_ONLY` is refused
/// (`DEVTENSOR_STATUS_READ_ONLY`).
///
/// # Safety
///
/// As `devtensor_copy`, for the structs and the tensors they describe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_copy_managed(
    dst: *const DLManagedTensorVersioned,
    src: *const DLManagedTensorVersioned,
    stream: *mut c_void,
) -> DevtensorStatus {
    guard("devtensor_copy_managed", || {
        if dst.is_null() {
            return Err(Failure::null("dst"));
        }
        if src.is_null() {
            return Err(Failure::null("src"));
        }
        // SAFETY: non-null, readable structs (the caller's contract).
        let ((ddl, d_ro), (sdl, _)) = unsafe { (managed(dst, "dst")?, managed(src, "src")?) };
        // SAFETY: the descriptors are as the caller promised.
        let (d, s) = unsafe { (borrow(&ddl, d_ro)?, borrow(&sdl, true)?) };
        copy(&d, &s, stream)
    })
}

/// A C-contiguous copy of `src` (a borrowed descriptor, foreign included) on
/// the same device, allocated on `stream` as `devtensor_empty` does and
/// filled by a copy queued on it; written to `*out` as an owning
/// `DLManagedTensorVersioned*` (free it by calling its deleter once). Always
/// copies, even when `src` is contiguous.
///
/// # Safety
///
/// As `devtensor_copy` for `src` and `stream`; `out` must be NULL (an error)
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devtensor_contiguous(
    src: *const DLTensor,
    stream: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> DevtensorStatus {
    guard("devtensor_contiguous", || {
        if src.is_null() {
            return Err(Failure::null("src"));
        }
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: a non-null, readable descriptor (the caller's contract).
        let s = unsafe { borrow(&*src, true) }?;
        let t = allocate(s.shape(), s.dtype(), s.device(), stream)?;
        copy(&t, &s, stream)?;
        // SAFETY: `out` checked non-null; writable by the caller's contract.
        unsafe { hand_out(&t, out) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_follow_the_gpu_then_managed_memory_then_pinned_memory() {
        use Device::{Cpu, Cuda, CudaHost, CudaManaged, Rocm, RocmHost};
        for (dst, src, want) in [
            (Cpu, Cpu, Cpu),
            (CudaHost, Cpu, CudaHost),
            (Cpu, RocmHost, RocmHost),
            (CudaHost, CudaManaged(1), CudaManaged(1)),
            (CudaManaged(1), CudaHost, CudaManaged(1)),
            (CudaManaged(0), Cuda(1), Cuda(1)),
            (Cuda(0), Cuda(1), Cuda(0)),
            (Rocm(0), CudaHost, Rocm(0)),
        ] {
            assert_eq!(work_device(dst, src), want, "{dst:?} <- {src:?}");
        }
    }
}
