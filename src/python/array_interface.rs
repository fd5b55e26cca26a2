//! NumPy's array interface and the CUDA Array Interface (both version 3):
//! the dicts devtensor tensors expose, and the import of objects that have
//! only one of them (Numba device arrays, PyCUDA, older libraries) as
//! foreign-owned tensors that keep the object alive.
//!
//! CUDA Array Interface v3 (numba-cuda's `cuda_array_interface.html`): `data`
//! is `(ptr, readonly)` with 0 for zero-size arrays; `strides` are in bytes,
//! None for C-contiguous; `stream` is None (no synchronisation needed), 1 (legacy
//! default), 2 (per-thread default) or a `cudaStream_t`, never 0; the consumer
//! must order its work after that stream's; a `mask` is not supported here.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::{PyAttributeError, PyBufferError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::device::Device;
use crate::dlpack::ffi::{
    DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion,
    DLTensor,
};
use crate::dtype::DType;
use crate::python::buffer;
use crate::python::errors::to_py;
use crate::tensor::Tensor;

const ORDER: char = if cfg!(target_endian = "little") { '<' } else { '>' };

/// NumPy's type string of `dtype`; `None` where NumPy has no such type
/// (bfloat16, float8, complex32).
pub(crate) fn typestr(dtype: DType) -> Option<String> {
    let kind = match dtype {
        DType::Bool => 'b',
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 'i',
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 'u',
        DType::F16 | DType::F32 | DType::F64 => 'f',
        DType::C64 | DType::C128 => 'c',
        _ => return None,
    };
    Some(with_order(kind, dtype.size()))
}

fn with_order(kind: char, size: usize) -> String {
    let order = if size == 1 { '|' } else { ORDER };
    format!("{order}{kind}{size}")
}

/// The devtensor dtype `obj.dtype.name` names when `raw` is a type string
/// of its size NumPy has no kind for: raw bytes (`"<V2"`) or a float of a
/// size NumPy lacks (`"<f1"`), as ml_dtypes arrays describe bfloat16 and
/// float8, which NumPy's DLPack export refuses. BufferError for such bytes
/// in the other byte order (a byte-swapped bfloat16 array, `">V2"`), as
/// [`parse_typestr`] refuses other types.
fn named_raw_dtype(obj: &Bound<'_, PyAny>, raw: &str) -> PyResult<Option<DType>> {
    let Some(size) = raw.get(2..).and_then(|s| s.parse::<usize>().ok()) else {
        return Ok(None);
    };
    if !matches!(raw.get(1..2), Some("V" | "f")) {
        return Ok(None);
    }
    let py = obj.py();
    let Ok(name) = obj
        .getattr(pyo3::intern!(py, "dtype"))
        .and_then(|d| d.getattr(pyo3::intern!(py, "name")))
        .and_then(|n| n.extract::<String>())
    else {
        return Ok(None);
    };
    let Some(dtype) = DType::from_name(&name)
        .ok()
        .filter(|d| d.size() == size && typestr(*d).is_none())
    else {
        return Ok(None);
    };
    native_order(raw, size)?;
    Ok(Some(dtype))
}

/// BufferError unless type string `s` of `size`-byte elements is in this
/// machine's byte order (or has none).
fn native_order(s: &str, size: usize) -> PyResult<()> {
    if size > 1 && !matches!(s.chars().next(), Some('|' | '=') | Some(ORDER)) {
        return Err(PyBufferError::new_err(format!(
            "typestr {s:?} is not in this machine's byte order"
        )));
    }
    Ok(())
}

/// The dtype a type string names (native or no byte order).
fn parse_typestr(s: &str) -> PyResult<DType> {
    let bad = || PyBufferError::new_err(format!("unsupported typestr {s:?}"));
    let mut chars = s.chars();
    chars.next().ok_or_else(bad)?; // the byte order, checked last
    let kind = chars.next().ok_or_else(bad)?;
    let size: usize = chars.as_str().parse().map_err(|_| bad())?;
    let dtype = match (kind, size) {
        ('b', 1) => DType::Bool,
        ('i', 1) => DType::I8,
        ('i', 2) => DType::I16,
        ('i', 4) => DType::I32,
        ('i', 8) => DType::I64,
        ('u', 1) => DType::U8,
        ('u', 2) => DType::U16,
        ('u', 4) => DType::U32,
        ('u', 8) => DType::U64,
        ('f', 2) => DType::F16,
        ('f', 4) => DType::F32,
        ('f', 8) => DType::F64,
        ('c', 8) => DType::C64,
        ('c', 16) => DType::C128,
        _ => return Err(bad()),
    };
    native_order(s, size)?;
    Ok(dtype)
}

/// The interface dict of `t` with `typestr`: shape, typestr, descr, data,
/// strides (bytes; None when C-contiguous), version 3.
fn interface<'py>(py: Python<'py>, t: &Tensor, typestr: &str, zero_size_null: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, t.shape())?)?;
    d.set_item("typestr", typestr)?;
    d.set_item("descr", PyList::new(py, [("", typestr)])?)?;
    let ptr = if zero_size_null && t.numel() == 0 {
        0
    } else {
        t.data_ptr() as usize
    };
    d.set_item("data", (ptr, t.is_read_only()))?;
    if t.is_contiguous() {
        d.set_item("strides", py.None())?;
    } else {
        let elem = t.dtype().size() as isize;
        let bytes: Vec<isize> = t.strides().iter().map(|&s| s * elem).collect();
        d.set_item("strides", PyTuple::new(py, bytes)?)?;
    }
    d.set_item("version", 3)?;
    Ok(d)
}

/// The type string of `dtype`'s raw bytes (`"<V2"`, as ml_dtypes arrays
/// describe bfloat16), for the dtypes [`typestr`] has none for.
pub(crate) fn raw_typestr(dtype: DType) -> String {
    with_order('V', dtype.size())
}

/// The array interface (host memory only) of `t` with type string `typestr`:
/// [`typestr`]'s, or [`raw_typestr`]'s for dtypes NumPy lacks.
pub(crate) fn array_interface<'py>(py: Python<'py>, t: &Tensor, typestr: &str) -> PyResult<Bound<'py, PyDict>> {
    host_ready(py, t, "__array_interface__")?;
    interface(py, t, typestr, false)
}

/// Checks that the host may read `t` in place now: pageable, pinned or
/// managed memory (waiting for the GPU work on the last, the GIL released).
pub(crate) fn host_ready(py: Python<'_>, t: &Tensor, what: &str) -> PyResult<()> {
    match t.device() {
        Device::Cpu | Device::CudaHost | Device::RocmHost => Ok(()),
        Device::CudaManaged(_) => py.detach(|| t.wait_for_host_access()).map_err(to_py),
        d => Err(PyAttributeError::new_err(format!(
            "{what} is for host memory; this tensor is on {d}: use .cpu() to copy it to the host first"
        ))),
    }
}

/// `Tensor.__cuda_array_interface__` (CUDA device and managed memory).
/// `stream` is the thread's current stream of the GPU, where devtensor's
/// copies and fills ran (1: the legacy default stream).
pub(crate) fn cuda_array_interface<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyDict>> {
    let (Device::Cuda(i) | Device::CudaManaged(i)) = t.device() else {
        return Err(PyAttributeError::new_err(format!(
            "__cuda_array_interface__ is for CUDA device memory; this tensor is on {}",
            t.device()
        )));
    };
    // AttributeError, as `__array_interface__`'s for these dtypes: `hasattr`
    // (how Numba and CuPy probe for the interface) is False, not an error.
    let ts = typestr(t.dtype()).ok_or_else(|| {
        PyAttributeError::new_err(format!(
            "__cuda_array_interface__ has no type string for {}: use DLPack (__dlpack__) instead",
            t.dtype()
        ))
    })?;
    let d = interface(py, t, &ts, true)?;
    let stream = crate::stream::current_stream(Device::Cuda(i)).map_or(1, |s| s.as_raw());
    d.set_item("stream", stream)?;
    Ok(d)
}

/// What the deleter of an imported interface frees: the Python object that
/// owns the memory (kept alive until then) and the shape and stride arrays.
#[repr(C)]
struct Imported {
    managed: DLManagedTensorVersioned, // first: the DLPack pointer is this struct's
    owner: Option<Py<PyAny>>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn delete_imported(m: *mut DLManagedTensorVersioned) {
    // No unwinding into the caller; a Py dropped without the GIL is released
    // by PyO3 the next time a thread holds it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `m` is the first field of a boxed `Imported` made by
        // `import`, and the DLPack contract calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Imported>()) });
    }));
}

/// Which interface is imported.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `__cuda_array_interface__`: device-accessible memory, maybe a stream.
    Cuda,
    /// `__array_interface__`: host memory.
    Host,
}

/// A tensor viewing the memory `obj`'s interface dict `d` describes, which
/// keeps `obj` and `d` alive. BufferError for what a tensor cannot describe (a mask,
/// byte strides that are not whole elements, a foreign byte order).
pub(crate) fn import(obj: &Bound<'_, PyAny>, d: &Bound<'_, PyAny>, kind: Kind) -> PyResult<Tensor> {
    let py = obj.py();
    let d = d
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("the array interface must be a dict"))?;
    let get = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> { Ok(d.get_item(k)?.filter(|v| !v.is_none())) };
    let need = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        get(k)?.ok_or_else(|| PyValueError::new_err(format!("the array interface has no {k:?} entry")))
    };
    let version: i64 = need("version")?.extract()?;
    if get("mask")?.is_some() {
        return Err(PyBufferError::new_err(
            "masked arrays cannot be imported: the interface has a 'mask' (fill or drop the masked elements first)",
        ));
    }
    let shape: Vec<i64> = need("shape")?.extract()?;
    if let Some(s) = shape.iter().find(|&&s| s < 0) {
        return Err(PyValueError::new_err(format!("negative dimension {s} in shape")));
    }
    let typestr = need("typestr")?.extract::<String>()?;
    let dtype = match parse_typestr(&typestr) {
        Ok(dtype) => dtype,
        // Raw bytes ("<V2") of a dtype NumPy has no kind for, named by the
        // object's dtype: ml_dtypes' bfloat16 and float8 arrays.
        Err(e) => named_raw_dtype(obj, &typestr)?.ok_or(e)?,
    };
    // The CUDA Array Interface requires `data`.
    let data = if kind == Kind::Cuda {
        Some(need("data")?)
    } else {
        get("data")?
    };
    let (ptr, read_only, exported) = match data {
        Some(data) if data.is_instance_of::<PyTuple>() || kind == Kind::Cuda => {
            // The flag as NumPy reads it: any truthy object (producers pass 0 / 1 too).
            let (ptr, read_only) = data
                .extract::<(usize, Bound<'_, PyAny>)>()
                .map_err(|_| PyTypeError::new_err("'data' must be a (pointer, read_only) tuple"))?;
            (ptr, read_only.is_truthy()?, None)
        }
        // NumPy's array interface (its documentation): `data` may be an
        // object with the buffer protocol, and where it is absent (or None)
        // the object's own buffer holds the array, from `offset` bytes on.
        // (NumPy's own code reads an absent `data` as a scalar.)
        data => {
            let given = data.is_some();
            let exporter = data.unwrap_or_else(|| obj.clone());
            let b = buffer::host_buffer(&exporter).map_err(|e| match e.is_instance_of::<PyTypeError>(py) {
                true if given => PyTypeError::new_err(format!(
                    "'data' must be a (pointer, read_only) tuple or an object with the buffer protocol: {e}"
                )),
                true => PyValueError::new_err(format!(
                    "the array interface has no \"data\" entry, and the object has no buffer protocol: {e}"
                )),
                false => e,
            })?;
            let offset: usize = match get("offset")? {
                Some(o) => {
                    let v: i64 = o.extract().map_err(|e: PyErr| {
                        if e.is_instance_of::<PyOverflowError>(py) {
                            PyValueError::new_err("'offset' is too large")
                        } else {
                            PyTypeError::new_err(format!(
                                "'offset' must be an int, not {}",
                                o.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
                            ))
                        }
                    })?;
                    usize::try_from(v)
                        .map_err(|_| PyValueError::new_err(format!("'offset' {v} lies before the buffer")))?
                }
                None => 0,
            };
            let ptr = b
                .ptr
                .checked_add(offset)
                .ok_or_else(|| PyValueError::new_err("'offset' is too large"))?;
            (ptr, b.read_only, Some((b, offset)))
        }
    };
    let elem = dtype.size() as i64;
    let strides: Vec<i64> = match get("strides")? {
        None => crate::layout::contiguous_strides(&shape.iter().map(|&s| s as usize).collect::<Vec<_>>())
            .map_err(to_py)?
            .iter()
            .map(|&s| s as i64)
            .collect(),
        Some(s) => {
            let bytes: Vec<i64> = s.extract()?;
            if bytes.len() != shape.len() {
                return Err(PyValueError::new_err("'strides' and 'shape' differ in length"));
            }
            if let Some(b) = bytes.iter().find(|&&b| b % elem != 0) {
                return Err(PyBufferError::new_err(format!(
                    "byte stride {b} is not a multiple of the item size {elem}: a tensor's strides are in elements"
                )));
            }
            bytes.iter().map(|b| b / elem).collect()
        }
    };
    let Some(numel) = shape.iter().try_fold(1i64, |n, &d| n.checked_mul(d)) else {
        return Err(PyBufferError::new_err(format!(
            "shape {shape:?} has more elements than 64 bits count"
        )));
    };
    if let Some((b, offset)) = &exported {
        fits_in_buffer(&shape, &strides, elem, *offset, b.len)?;
    }
    let device = match kind {
        Kind::Host => Device::Cpu,
        Kind::Cuda => cuda_device(py, ptr, numel)?,
    };
    if kind == Kind::Cuda && version >= 3 {
        wait_for_producer(py, device, get("stream")?)?;
    }
    let mut boxed = Box::new(Imported {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR_VERSION,
                minor: DLPACK_MINOR_VERSION,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_imported),
            flags: if read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 },
            dl_tensor: DLTensor {
                data: ptr as *mut c_void,
                device: device.to_dlpack(),
                ndim: shape.len() as i32,
                dtype: dtype.to_dlpack(),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        // The dict too: NumPy's scalars describe a temporary array that only
        // the dict holds (its "__ref" entry), which the protocol keeps alive so.
        // And the memoryview that holds a buffer's export.
        owner: Some(
            match exported {
                Some((b, _)) => PyTuple::new(py, [obj.as_any(), d.as_any(), b.holder.bind(py).as_any()])?,
                None => PyTuple::new(py, [obj.as_any(), d.as_any()])?,
            }
            .into_any()
            .unbind(),
        ),
        shape,
        strides,
    });
    boxed.managed.dl_tensor.shape = boxed.shape.as_mut_ptr();
    boxed.managed.dl_tensor.strides = boxed.strides.as_mut_ptr();
    let m = Box::into_raw(boxed).cast::<DLManagedTensorVersioned>();
    // SAFETY: `m` is a complete versioned tensor whose shape and strides live
    // in the same box; the object that owns the data stays alive until the
    // deleter (which frees the box) runs, exactly once, from the import.
    unsafe { crate::dlpack::from_dlpack_versioned(m) }.map_err(to_py)
}

/// `ValueError` unless every element of `shape` / `strides` (in elements of
/// `elem` bytes) from `offset` bytes into a buffer of `len` bytes lies in it.
/// NumPy does not check this: its array then reads past the buffer.
fn fits_in_buffer(shape: &[i64], strides: &[i64], elem: i64, offset: usize, len: usize) -> PyResult<()> {
    let too_large = || PyValueError::new_err("the array interface's extent is too large");
    let shape: Vec<usize> = shape
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| too_large()))
        .collect::<PyResult<_>>()?;
    let strides: Vec<isize> = strides
        .iter()
        .map(|&s| isize::try_from(s).map_err(|_| too_large()))
        .collect::<PyResult<_>>()?;
    let range = crate::layout::byte_range(&shape, &strides, elem as usize).map_err(|_| too_large())?;
    // An empty array reads no byte, wherever `offset` points.
    if range.is_none() || crate::layout::range_fits(offset, range, len) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "the array interface's buffer holds {len} bytes, too few for shape {shape:?} with strides {strides:?} \
         (elements) from offset {offset}"
    )))
}

/// The device `ptr` belongs to (the current GPU for an empty array's 0).
fn cuda_device(py: Python<'_>, ptr: usize, numel: i64) -> PyResult<Device> {
    if ptr == 0 && numel == 0 {
        return crate::DeviceSpec::Current(Device::Cuda(0)).resolve().map_err(to_py);
    }
    py.detach(|| crate::backend::for_backend(crate::device::Backend::Cuda).pointer_device(ptr as u64))
        .map_err(|e| PyBufferError::new_err(format!("not CUDA memory devtensor can use: {e}")))
}

/// CAI v3: the producer's pending work on `stream` happens before ours (an
/// event on its stream, our current stream waits; the host does not block).
fn wait_for_producer(py: Python<'_>, device: Device, stream: Option<Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(stream) = stream else { return Ok(()) };
    let s: i64 = stream
        .extract()
        .map_err(|_| PyTypeError::new_err("the interface's 'stream' must be an int or None"))?;
    if s <= 0 {
        return Err(PyValueError::new_err(format!(
            "invalid 'stream' {s} in __cuda_array_interface__: 0 is disallowed (use None, 1 or 2)"
        )));
    }
    let backend = crate::backend::for_device(device);
    let ordinal = match device {
        Device::Cuda(i) | Device::CudaManaged(i) => i,
        // Pinned host memory: the host reads it; it waits for the producer's stream.
        Device::CudaHost => py.detach(|| backend.current_ordinal()).map_err(to_py)?,
        _ => return Ok(()),
    };
    // SAFETY: a value > 2 is the producer's live stream of this GPU (the
    // interface's contract); 1 and 2 are the default streams.
    let Some(theirs) = (unsafe { backend.stream_from_dlpack(ordinal, Some(s)) }).map_err(to_py)? else {
        return Ok(());
    };
    py.detach(|| {
        if device == Device::CudaHost {
            backend.synchronize_stream(ordinal, theirs)
        } else {
            backend.order_after_producer(device, theirs)
        }
    })
    .map_err(to_py)
}
