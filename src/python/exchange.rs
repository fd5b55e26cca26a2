//! `__dlpack_c_exchange_api__`: our static DLPackExchangeAPI v1.3 table
//! (producer side) and discovery of a producer type's table (consumer side).
//!
//! No panic and no Python exception crosses these C functions except the ones
//! the header asks for (a set Python error with a -1 return).

use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyType};

use crate::dlpack::ExportOptions;
use crate::dlpack::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackExchangeAPI,
    DLPackExchangeAPIHeader, DLPackSetError, DLPackVersion, DLTensor,
};
use crate::python::tensor::PyTensor;
use crate::tensor::Tensor;

/// Capsule name of the table.
pub(crate) const CAPSULE_NAME: &std::ffi::CStr = c"dlpack_exchange_api";

struct StaticApi(DLPackExchangeAPI);
// SAFETY: the table is immutable and holds only function pointers and a null
// `prev_api`, which are safe to share between threads.
unsafe impl Sync for StaticApi {}

static API: StaticApi = StaticApi(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor: DLPACK_MINOR_VERSION,
        },
        prev_api: ptr::null_mut(),
    },
    managed_tensor_allocator: Some(allocator),
    managed_tensor_from_py_object_no_sync: Some(from_py_object),
    managed_tensor_to_py_object_no_sync: Some(to_py_object),
    dltensor_from_py_object_no_sync: Some(dltensor_from_py_object),
    current_work_stream: Some(current_work_stream),
});

/// The `"dlpack_exchange_api"` capsule for the `Tensor` type (no destructor:
/// the table is static).
pub(crate) fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let ptr = NonNull::from(&API.0).cast::<c_void>();
    // SAFETY: `API` lives for the whole process and is never written.
    unsafe { PyCapsule::new_with_pointer(py, ptr, CAPSULE_NAME) }
}

fn set_error(set: DLPackSetError, ctx: *mut c_void, kind: &str, msg: &str) {
    if let Some(set) = set {
        let kind = CString::new(kind).unwrap_or_default();
        let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's SetError takes its own context and two C strings
        // valid for the duration of the call.
        unsafe { set(ctx, kind.as_ptr(), msg.as_ptr()) }
    }
}

/// `DLPackManagedTensorAllocator`: a tensor like `prototype` (dtype, shape, device).
unsafe extern "C" fn allocator(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set: DLPackSetError,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| -> crate::Result<*mut DLManagedTensorVersioned> {
        if prototype.is_null() || out.is_null() {
            return Err(crate::Error::InvalidLayout("null prototype or out pointer"));
        }
        // SAFETY: non-null; the caller passes a readable prototype.
        let p = unsafe { *prototype };
        let dtype = crate::DType::from_dlpack(p.dtype)?;
        let device = crate::Device::from_dlpack(p.device)?;
        let ndim = usize::try_from(p.ndim).map_err(|_| crate::DLPackError::BadNdim(p.ndim))?;
        if ndim > 0 && p.shape.is_null() {
            return Err(crate::DLPackError::NullShape.into());
        }
        let mut shape = crate::layout::Shape::new();
        for d in 0..ndim {
            // SAFETY: `shape` holds `ndim` entries by the header's contract.
            let size = unsafe { *p.shape.add(d) };
            shape.push(usize::try_from(size).map_err(|_| crate::DLPackError::NegativeSize { dim: d, size })?);
        }
        let t = Tensor::empty(&shape, dtype, device)?;
        Ok(t.to_dlpack_versioned(ExportOptions::default()))
    }));
    match result {
        Ok(Ok(m)) => {
            // SAFETY: `out` checked non-null above.
            unsafe { *out = m };
            0
        }
        Ok(Err(e)) => {
            let kind = match e {
                crate::Error::OutOfMemory { .. } => "MemoryError",
                crate::Error::BackendUnavailable { .. } => "RuntimeError",
                _ => "ValueError",
            };
            set_error(set, error_ctx, kind, &e.to_string());
            -1
        }
        Err(_) => {
            set_error(set, error_ctx, "RuntimeError", "devtensor allocator panicked");
            -1
        }
    }
}

/// Runs `f` with the GIL (the caller holds it, per the header) and turns a Rust
/// error or panic into a set Python exception and -1.
fn with_py(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> c_int {
    // SAFETY: every `*_py_object_*` function of the exchange API is called with
    // the GIL held (DLPack header).
    let py = unsafe { Python::assume_attached() };
    match catch_unwind(AssertUnwindSafe(|| f(py))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            e.restore(py);
            -1
        }
        Err(_) => {
            pyo3::exceptions::PyRuntimeError::new_err("devtensor exchange API panicked").restore(py);
            -1
        }
    }
}

fn our_tensor<'py>(py: Python<'py>, obj: *mut c_void) -> PyResult<Bound<'py, PyTensor>> {
    if obj.is_null() {
        return Err(PyTypeError::new_err("null Python object"));
    }
    // SAFETY: the caller passes a live PyObject* it holds a reference to.
    let any = unsafe { Bound::from_borrowed_ptr(py, obj.cast::<pyffi::PyObject>()) };
    any.cast_into::<PyTensor>()
        .map_err(|_| PyTypeError::new_err("not a devtensor.Tensor"))
}

/// `DLPackManagedTensorFromPyObjectNoSync`: an owning export of our tensor.
unsafe extern "C" fn from_py_object(obj: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int {
    with_py(|py| {
        let t = our_tensor(py, obj)?;
        if out.is_null() {
            return Err(PyTypeError::new_err("null out pointer"));
        }
        let m = t.get().inner().to_dlpack_versioned(ExportOptions::default());
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = m };
        Ok(())
    })
}

/// `DLPackManagedTensorToPyObjectNoSync`: steals `tensor`, returns a new reference.
unsafe extern "C" fn to_py_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> c_int {
    with_py(|py| {
        // SAFETY: the caller hands over ownership of a valid managed tensor.
        let t = unsafe { crate::dlpack::from_dlpack_versioned(tensor) }.map_err(crate::python::errors::to_py)?;
        let obj = Bound::new(py, PyTensor::from(t))?;
        if out.is_null() {
            return Err(PyTypeError::new_err("null out pointer"));
        }
        // SAFETY: `out` is non-null and writable; the new reference goes to the caller.
        unsafe { *out = obj.into_ptr().cast::<c_void>() };
        Ok(())
    })
}

/// `DLPackDLTensorFromPyObjectNoSync`: a borrowed description, valid while `obj` lives.
unsafe extern "C" fn dltensor_from_py_object(obj: *mut c_void, out: *mut DLTensor) -> c_int {
    with_py(|py| {
        let t = our_tensor(py, obj)?;
        if out.is_null() {
            return Err(PyTypeError::new_err("null out pointer"));
        }
        let inner = t.get().inner();
        // SAFETY: `out` is writable. The shape and stride arrays live inside the
        // (immutable, frozen) Tensor object, which the caller keeps alive;
        // usize/isize and i64 share size and representation on 64-bit targets.
        unsafe {
            *out = DLTensor {
                data: inner.data_ptr().cast::<c_void>(),
                device: inner.device().to_dlpack(),
                ndim: inner.ndim() as i32,
                dtype: inner.dtype().to_dlpack(),
                shape: inner.shape().as_ptr().cast::<i64>().cast_mut(),
                strides: inner.strides().as_ptr().cast::<i64>().cast_mut(),
                byte_offset: 0,
            }
        };
        Ok(())
    })
}

/// `DLPackCurrentWorkStream`: devtensor works on the device's default stream
/// (NULL = the legacy default stream on CUDA; NULL for the CPU).
unsafe extern "C" fn current_work_stream(_device_type: DLDeviceType, _device_id: i32, out: *mut *mut c_void) -> c_int {
    if out.is_null() {
        return -1;
    }
    // SAFETY: `out` is non-null and writable by the caller's contract.
    unsafe { *out = ptr::null_mut() };
    0
}

/// The exchange API of `x`'s type, when it has a usable v1 table. The answer
/// is cached per type (a miss costs an AttributeError otherwise); the cache
/// holds a reference to each type so an address is never reused under it.
pub(crate) fn lookup(x: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    // Tables stored as addresses: the raw pointers inside are not Sync.
    type Cache = HashMap<usize, (Py<PyType>, Option<usize>)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let ty = x.get_type();
    let key = ty.as_ptr() as usize;
    let cache = CACHE.get_or_init(Default::default);
    let hit = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .map(|(_, api)| *api);
    let addr = match hit {
        Some(addr) => addr,
        None => {
            let addr = read_table(&ty).map(|api| api as *const DLPackExchangeAPI as usize);
            cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (ty.unbind(), addr));
            addr
        }
    };
    // SAFETY: the address came from `read_table`: a live, immutable table of a
    // type the cache keeps alive.
    addr.map(|a| unsafe { &*(a as *const DLPackExchangeAPI) })
}

fn read_table(ty: &Bound<'_, PyType>) -> Option<&'static DLPackExchangeAPI> {
    let attr = ty.getattr(pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__")).ok()?;
    let cap = attr.cast::<PyCapsule>().ok()?;
    // SAFETY: a capsule with this name points at a DLPackExchangeAPI that lives
    // as long as the producer's type (kept alive by the cache), per the header.
    unsafe {
        if pyffi::PyCapsule_IsValid(cap.as_ptr(), CAPSULE_NAME.as_ptr()) != 1 {
            return None;
        }
        let api = pyffi::PyCapsule_GetPointer(cap.as_ptr(), CAPSULE_NAME.as_ptr()).cast::<DLPackExchangeAPI>();
        let api = api.as_ref()?;
        (api.header.version.major == 1 && api.managed_tensor_from_py_object_no_sync.is_some()).then_some(api)
    }
}
