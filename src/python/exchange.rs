//! `__dlpack_c_exchange_api__`: our static DLPackExchangeAPI v1.3 table
//! (producer side) and discovery of a producer type's table (consumer side).
//!
//! No panic and no Python exception crosses these C functions except the ones
//! the header asks for (a set Python error with a -1 return).

use std::ffi::{CString, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};
use std::sync::Mutex;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyType, PyWeakrefMethods, PyWeakrefReference};

use crate::dlpack::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackExchangeAPI,
    DLPackExchangeAPIHeader, DLPackSetError, DLPackVersion, DLTensor,
};
use crate::dlpack::{ExportOptions, ManagedTensor};
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
    let result = catch_unwind(AssertUnwindSafe(
        || -> crate::Result<ManagedTensor<DLManagedTensorVersioned>> {
            if prototype.is_null() || out.is_null() {
                return Err(crate::Error::InvalidArgument {
                    op: "managed_tensor_allocator",
                    reason: "null prototype or out pointer".into(),
                });
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
        },
    ));
    match result {
        Ok(Ok(m)) => {
            // SAFETY: `out` checked non-null above.
            unsafe { *out = m.into_raw() };
            0
        }
        Ok(Err(e)) => {
            let kind = match e {
                crate::Error::OutOfMemory { .. } => "MemoryError",
                crate::Error::BackendUnavailable { .. } | crate::Error::ForkedChild { .. } => "RuntimeError",
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
    // Attached through PyO3 (as fastcall.rs's calls, and for its reason: a
    // raised error's message would otherwise wait in PyO3's pool).
    // SAFETY: every `*_py_object_*` function of the exchange API is called with
    // the GIL held (DLPack header).
    unsafe {
        Python::attach_unchecked(|py| match catch_unwind(AssertUnwindSafe(|| f(py))) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                e.restore(py);
                -1
            }
            Err(_) => {
                pyo3::exceptions::PyRuntimeError::new_err("devtensor exchange API panicked").restore(py);
                -1
            }
        })
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
        unsafe { *out = m.into_raw() };
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

/// `DLPackCurrentWorkStream`: the calling thread's current stream of the GPU
/// (`devtensor.stream(s)`), else its default stream (NULL: the legacy default
/// stream on CUDA, the null stream on ROCm; NULL for the CPU).
unsafe extern "C" fn current_work_stream(device_type: DLDeviceType, device_id: i32, out: *mut *mut c_void) -> c_int {
    if out.is_null() {
        return -1;
    }
    let device = crate::Device::from_dlpack(crate::dlpack::ffi::DLDevice { device_type, device_id });
    let stream = device.ok().and_then(crate::stream::current_stream);
    // SAFETY: `out` is non-null and writable by the caller's contract.
    unsafe { *out = stream.map_or(ptr::null_mut(), |s| s.as_raw() as *mut c_void) };
    0
}

/// Most producer types whose answer [`lookup`] remembers. A program sees a few
/// producer types; one that makes a class per call (an adapter pattern) churns
/// through entries instead of growing the cache.
const LOOKUP_CACHE_MAX: usize = 64;

/// One remembered answer: a weak reference to the type (the cache never keeps
/// a type, or whatever its methods capture, alive) and its table's address.
struct Entry {
    /// The type's address when cached: a quick filter, confirmed through `ty`.
    key: usize,
    ty: Py<PyWeakrefReference>,
    addr: Option<usize>,
}

/// The exchange API of `x`'s type, when it has a usable v1 table. The answer
/// is cached per type (a miss costs an AttributeError otherwise). Entries hold
/// the type weakly and are matched by identity through the weak reference, so
/// a dead type's address reused by a new type is never mistaken for it; at
/// most [`LOOKUP_CACHE_MAX`] entries are kept, dead ones dropped first.
pub(crate) fn lookup(x: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    // Tables stored as addresses: the raw pointers inside are not Sync.
    static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    let py = x.py();
    let ty = x.get_type();
    let key = ty.as_ptr() as usize;
    let is_ty = |e: &Entry| e.key == key && e.ty.bind(py).upgrade().is_some_and(|t| t.is(&ty));
    let hit = {
        let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.iter().find(|e| is_ty(e)).map(|e| e.addr)
    };
    let addr = match hit {
        Some(addr) => addr,
        None => {
            let addr = read_table(&ty)
                .filter(|_| table_serves_dlpack(&ty))
                .map(|api| api as *const DLPackExchangeAPI as usize);
            if let Ok(weak) = PyWeakrefReference::new(&ty) {
                let evicted = {
                    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
                    // Dead types first, then the oldest entry.
                    let mut evicted: Vec<Entry> = Vec::new();
                    if cache.len() >= LOOKUP_CACHE_MAX {
                        let (live, dead): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut *cache)
                            .into_iter()
                            .partition(|e| e.ty.bind(py).upgrade().is_some());
                        *cache = live;
                        evicted = dead;
                        if cache.len() >= LOOKUP_CACHE_MAX {
                            evicted.push(cache.remove(0));
                        }
                    }
                    // A dead type that had this address.
                    if let Some(i) = cache.iter().position(|e| e.key == key) {
                        evicted.push(cache.remove(i));
                    }
                    cache.push(Entry {
                        key,
                        ty: weak.unbind(),
                        addr,
                    });
                    evicted
                };
                drop(evicted); // decrefs outside the lock
            }
            addr
        }
    };
    // SAFETY: the address came from `read_table` for `x`'s type; the table is
    // immutable and static (the DLPack header: it lives as long as the process).
    addr.map(|a| unsafe { &*(a as *const DLPackExchangeAPI) })
}

/// Whether `ty`'s `__dlpack__` comes from the class that holds its exchange
/// table: a subclass that overrides `__dlpack__` (to refuse an export, or to
/// export something else) is asked through it, as NumPy asks, not around it
/// through the table it inherits. Read once per type (the lookup caches it).
fn table_serves_dlpack(ty: &Bound<'_, PyType>) -> bool {
    let py = ty.py();
    let holder = |name: &Bound<'_, pyo3::types::PyString>| -> Option<usize> {
        ty.mro().iter().position(|c| {
            c.getattr(pyo3::intern!(py, "__dict__"))
                .and_then(|d| d.contains(name))
                .unwrap_or(false)
        })
    };
    let table = holder(pyo3::intern!(py, "__dlpack_c_exchange_api__"));
    table.is_some() && table == holder(pyo3::intern!(py, "__dlpack__"))
}

pub(crate) fn read_table(ty: &Bound<'_, PyType>) -> Option<&'static DLPackExchangeAPI> {
    let attr = ty.getattr(pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__")).ok()?;
    let cap = attr.cast::<PyCapsule>().ok()?;
    // SAFETY: a capsule with this name points at a DLPackExchangeAPI that lives
    // as long as the producer's type, per the header.
    unsafe {
        if pyffi::PyCapsule_IsValid(cap.as_ptr(), CAPSULE_NAME.as_ptr()) != 1 {
            return None;
        }
        let api = pyffi::PyCapsule_GetPointer(cap.as_ptr(), CAPSULE_NAME.as_ptr()).cast::<DLPackExchangeAPI>();
        let api = api.as_ref()?;
        (api.header.version.major == 1 && api.managed_tensor_from_py_object_no_sync.is_some()).then_some(api)
    }
}
