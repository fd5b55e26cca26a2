//! `devtensor.from_dlpack`: the consumer side of the protocol.

use pyo3::exceptions::{PyBufferError, PyNotImplementedError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyCapsule, PyDict, PyTuple, PyType};

use crate::backend::BoundDevice;
use crate::device::Device;
use crate::dlpack::ExportOptions;
use crate::dlpack::ffi as dl;
use crate::dtype::DType;
use crate::python::errors::to_py;
use crate::python::{capsule, exchange};
use crate::stream::StreamHandle;
use crate::tensor::Tensor;

/// Imports any DLPack producer (or a raw capsule), zero-copy where possible.
/// With `device`, the result is on that device: the producer's export there
/// when it can (`dl_device`), else a copy devtensor makes (`copy=False`:
/// BufferError), as the array API's `from_dlpack` asks and torch's does.
pub(crate) fn from_dlpack(x: &Bound<'_, PyAny>, device: Option<Device>, copy: Option<bool>) -> PyResult<Tensor> {
    let py = x.py();
    if x.is_instance_of::<PyCapsule>() {
        return finish(py, capsule::consume(x)?, device, copy, false);
    }
    if let Ok(t) = x.cast::<crate::python::PyTensor>() {
        let inner = t.get().inner().clone();
        // To the host: what `__dlpack__(dl_device=(kDLCPU, 0))` gives NumPy, a
        // copy of device memory (pinned and managed memory read in place;
        // copy=False's BufferError when a copy is needed). No stream: the host reads it.
        if device == Some(Device::Cpu) && inner.device() != Device::Cpu {
            let dl_device = (dl::kDLCPU, 0).into_pyobject(py)?;
            let py_copy = copy.map(|c| PyBool::new(py, c).to_owned().into_any());
            let version = max_version(py)?.as_any();
            let cap = t
                .get()
                .dlpack(py, None, Some(version), Some(dl_device.as_any()), py_copy.as_ref())?;
            return finish(py, capsule::consume(&cap)?, device, copy, true);
        }
        return finish(py, inner, device, copy, false);
    }
    // 1. The producer type's C exchange API (torch ≥ 2.10 has one): no Python call.
    //    Only for host memory: the no-sync entry point leaves stream ordering to us.
    //    Not for a torch tensor that requires grad: torch's `__dlpack__` refuses
    //    it (BufferError), its exchange API does not, and a write through our
    //    view would go unseen by autograd.
    if device.is_none()
        && copy.is_none()
        && let Some(api) = exchange::lookup(x)
        && let Some(get) = api.managed_tensor_from_py_object_no_sync
        && !requires_grad(x)?
    {
        let mut out = std::ptr::null_mut();
        // SAFETY: the GIL is held and `x` is alive; the function fills `out` with
        // an owned tensor on success or sets a Python error and returns non-zero.
        let rc = unsafe { get(x.as_ptr().cast(), &mut out) };
        if rc == 0 {
            // SAFETY: `out` is an owned managed tensor from the producer.
            let t = unsafe { crate::dlpack::from_dlpack_versioned(out) }.map_err(to_py)?;
            refuse_lazy_views(x, &t)?;
            // A device tensor whose producer work cannot be ordered before ours
            // goes through `__dlpack__`'s `stream` instead (`t` drops, deleter runs).
            if t.device().is_host_accessible() || order_after_producer(py, api, &t) {
                return Ok(t);
            }
        } else {
            // Whatever the error (torch raises RuntimeError for a sparse or meta
            // tensor), the Python protocol below gives the producer's answer as
            // `__dlpack__` words it: the array API's BufferError where it cannot export.
            drop(PyErr::take(py));
        }
    }
    // 2. `__dlpack__(max_version=(1, 3), dl_device=..., copy=...)`; 3. on TypeError,
    //    the legacy call (`stream` only).
    // Only AttributeError means "not there" (as for `hasattr`): any other error
    // of a producer's property is its own and reaches the caller.
    let Some(dlpack) = x.getattr_opt(pyo3::intern!(py, "__dlpack__"))? else {
        // 4. No DLPack: the CUDA Array Interface (Numba, PyCUDA), then NumPy's.
        use crate::python::array_interface::{Kind, import};
        if let Some(cai) = x.getattr_opt(pyo3::intern!(py, "__cuda_array_interface__"))? {
            return finish(py, import(x, &cai, Kind::Cuda)?, device, copy, false);
        }
        if let Some(ai) = x.getattr_opt(pyo3::intern!(py, "__array_interface__"))? {
            return finish(py, import(x, &ai, Kind::Host)?, device, copy, false);
        }
        return Err(PyTypeError::new_err(format!(
            "{} supports neither DLPack nor the (CUDA) array interface",
            x.get_type()
        )));
    };
    let kwargs = PyDict::new(py);
    // Interned keys and a cached (1, 3): no string or tuple built per call.
    kwargs.set_item(pyo3::intern!(py, "max_version"), max_version(py)?)?;
    // A stream only for GPU producers: ours is the default stream (CUDA's legacy
    // stream 1, ROCm's 0). The producer's device is current while it exports, as
    // torch requires, and the caller's device is back when we return.
    let mut producer_device = ProducerDevice::default();
    // Optional for old producers; an error of its own reaches the caller, as torch's.
    let dl_device = match x.getattr_opt(pyo3::intern!(py, "__dlpack_device__"))? {
        Some(f) => Some(f.call0()?),
        None => None,
    };
    if let Some((ty, id)) = dl_device.and_then(|d| d.extract::<(i32, i32)>().ok()) {
        match ty {
            // The thread's current stream (`devtensor.stream(s)`), else legacy (1).
            dl::kDLCUDA | dl::kDLCUDAManaged => {
                let ours = u32::try_from(id)
                    .ok()
                    .and_then(|i| crate::stream::current_stream(Device::Cuda(i)));
                kwargs.set_item(pyo3::intern!(py, "stream"), ours.map_or(1, |s| s.as_raw()))?
            }
            dl::kDLROCM => kwargs.set_item(pyo3::intern!(py, "stream"), 0)?,
            _ => {}
        }
        producer_device.bind(ty, id);
    }
    if let Some(d) = device {
        let dl = d.to_dlpack();
        kwargs.set_item(pyo3::intern!(py, "dl_device"), (dl.device_type, dl.device_id))?;
    }
    if let Some(c) = copy {
        kwargs.set_item(pyo3::intern!(py, "copy"), c)?;
    }
    // Whether the producer was given (and so honoured, or raised) `copy`.
    let mut producer_copied = true;
    let exported = (|| match dlpack.call((), Some(&kwargs)) {
        Ok(cap) => Ok(cap),
        // A producer older than DLPack 1.0 (no `max_version`, `dl_device` or
        // `copy`): its legacy export, with `stream` kept (ordering does not
        // depend on the protocol's version); `finish` then moves or copies as
        // `device` and `copy` ask (a legacy export never copies, so copy=False holds).
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            let legacy = PyDict::new(py);
            if let Some(stream) = kwargs.get_item(pyo3::intern!(py, "stream"))? {
                legacy.set_item(pyo3::intern!(py, "stream"), stream)?;
            }
            producer_copied = false;
            dlpack.call((), Some(&legacy))
        }
        // A producer that cannot export on `device` (NumPy for a GPU): the
        // export where its data is; `finish` copies it to `device` (our copy
        // the only one, so `copy=True` is not passed) or refuses `copy=False`.
        Err(e)
            if device.is_some()
                && (e.is_instance_of::<PyBufferError>(py) || e.is_instance_of::<PyNotImplementedError>(py)) =>
        {
            kwargs.del_item(pyo3::intern!(py, "dl_device"))?;
            if copy == Some(true) {
                kwargs.del_item(pyo3::intern!(py, "copy"))?;
                producer_copied = false;
            }
            dlpack.call((), Some(&kwargs))
        }
        Err(e) => Err(e),
    })();
    let cap = match exported {
        Ok(cap) => cap,
        // NumPy refuses to export dtypes it has no kind for (ml_dtypes'
        // bfloat16 and float8: BufferError); its array interface still
        // describes them, as raw bytes the array's dtype names.
        Err(e) if e.is_instance_of::<PyBufferError>(py) => {
            use crate::python::array_interface::{Kind, import};
            let Some(ai) = x.getattr_opt(pyo3::intern!(py, "__array_interface__"))? else {
                return Err(e);
            };
            let t = import(x, &ai, Kind::Host).map_err(|_| e)?;
            return finish(py, t, device, copy, false);
        }
        Err(e) => return Err(e),
    };
    let t = capsule::consume(&cap)?;
    refuse_lazy_views(x, &t)?;
    finish(py, t, device, copy, producer_copied)
}

/// The `max_version` we ask for, `(1, 3)`: built once.
fn max_version(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static MAX_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let v = MAX_VERSION.get_or_try_init(py, || PyTuple::new(py, [1, 3]).map(Bound::unbind))?;
    Ok(v.bind(py))
}

/// BufferError when `x` is a torch tensor (of any subclass) whose data must be conjugated or
/// negated on read (`is_conj()` / `is_neg()`): DLPack cannot describe that, and
/// torch exports such views anyway (its C exchange API ignores both bits, its
/// `__dlpack__` the negative one), so the bytes would be silently wrong. Only
/// complex tensors can be conjugate views; any numeric one can be a negative
/// view (`torch._neg_view` of an int32 tensor reads -1 for 1), so only bools
/// skip the check. `t` drops (its deleter runs).
pub(crate) fn refuse_lazy_views(x: &Bound<'_, PyAny>, t: &Tensor) -> PyResult<()> {
    if lazy_view_bit(x, t)? {
        return Err(PyBufferError::new_err(
            "a lazy conjugate or negative view cannot be shared through DLPack: \
             call resolve_conj() / resolve_neg() first",
        ));
    }
    Ok(())
}

fn lazy_view_bit(x: &Bound<'_, PyAny>, t: &Tensor) -> PyResult<bool> {
    let complex = t.dtype().is_complex();
    // Subclasses too: torch's exchange API and `__dlpack__` serve them through the MRO.
    if t.dtype() == DType::Bool || !is_torch_tensor(x) {
        return Ok(false);
    }
    let py = x.py();
    // A complex view may carry either bit (`torch._neg_view` of one the negative).
    Ok((complex && x.call_method0(pyo3::intern!(py, "is_conj"))?.is_truthy()?)
        || x.call_method0(pyo3::intern!(py, "is_neg"))?.is_truthy()?)
}

/// Whether `x` is a torch tensor that requires grad (cheap for everyone else).
fn requires_grad(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !is_torch_tensor(x) {
        return Ok(false);
    }
    x.getattr(pyo3::intern!(x.py(), "requires_grad"))?.is_truthy()
}

/// Whether `type(x)` is `torch.Tensor` or a subclass of it (`nn.Parameter`, a
/// user's subclass from any module). Cheap for everyone else, as this runs on
/// every import: a `sys.modules` lookup while torch is not imported (no torch
/// tensor can exist then; we never import it ourselves), then an MRO walk
/// without a Python call (no `__instancecheck__`, unlike `isinstance`).
fn is_torch_tensor(x: &Bound<'_, PyAny>) -> bool {
    static TORCH_TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = x.py();
    let tensor = match TORCH_TENSOR.get(py) {
        Some(ty) => ty.bind(py),
        None => {
            // SAFETY: the GIL is held; the interpreter's `sys.modules` lives as
            // long as it does (a borrowed reference; NULL only if it is gone).
            let modules = unsafe { pyo3::ffi::PyImport_GetModuleDict() };
            if modules.is_null() {
                return false;
            }
            // SAFETY: `modules` is a live, non-null object (checked above).
            let modules = unsafe { Borrowed::from_ptr(py, modules) };
            // Not imported, or still importing (no `Tensor` yet): nothing cached.
            let Some(ty) = modules
                .cast::<PyDict>()
                .ok()
                .and_then(|m| m.get_item(pyo3::intern!(py, "torch")).ok().flatten())
                .and_then(|torch| torch.getattr(pyo3::intern!(py, "Tensor")).ok())
                .and_then(|ty| ty.cast_into::<PyType>().ok())
            else {
                return false;
            };
            TORCH_TENSOR.get_or_init(py, || ty.unbind()).bind(py)
        }
    };
    // SAFETY: both are live type objects while the GIL is held.
    unsafe { pyo3::ffi::PyType_IsSubtype(x.get_type_ptr(), tensor.as_type_ptr()) != 0 }
}

/// For a device tensor from the exchange API ("no sync"): makes our stream wait
/// for the producer's current work stream. False when that is not possible.
fn order_after_producer(py: Python<'_>, api: &dl::DLPackExchangeAPI, t: &Tensor) -> bool {
    let device = t.device();
    let (Some(current), Some(_)) = (api.current_work_stream, device.ordinal()) else {
        return false;
    };
    let backend = crate::backend::for_device(device);
    let dl = device.to_dlpack();
    let mut raw = std::ptr::null_mut();
    // SAFETY: the producer's function writes its current stream for the device.
    if unsafe { current(dl.device_type, dl.device_id, &mut raw) } != 0 {
        drop(PyErr::take(py)); // the producer may have set one; we fall back
        return false;
    }
    // SAFETY: the producer's current stream is live on this device; NULL (0)
    // is the default stream, which `order_after_producer` maps to the backend's.
    let theirs = unsafe { StreamHandle::from_raw(raw as usize) };
    backend.order_after_producer(device, theirs).is_ok()
}

/// A producer's GPU made current (when its backend is usable) until dropped:
/// a producer such as torch refuses to export a tensor of another device than
/// the current one.
#[derive(Default)]
struct ProducerDevice {
    _bound: Option<BoundDevice>,
}

impl ProducerDevice {
    /// Makes the GPU of DLPack device `(device_type, id)` current.
    fn bind(&mut self, device_type: i32, id: i32) {
        let device = Device::from_dlpack(dl::DLDevice {
            device_type,
            device_id: id,
        });
        if let Ok(d) = device
            && let Some(ordinal) = d.ordinal()
        {
            self._bound = crate::backend::for_device(d).bind(ordinal).ok();
        }
    }
}

/// Applies `device` and `copy` to an imported tensor the producer could not
/// adjust (`producer_copied`: it was given `copy` and honoured it). Another
/// device than `device`: a copy there (`copy=None` or `True`, the array API's
/// "copy otherwise"), or BufferError for `copy=False` and for a pair of
/// devices devtensor cannot copy between.
fn finish(
    py: Python<'_>,
    t: Tensor,
    device: Option<Device>,
    copy: Option<bool>,
    producer_copied: bool,
) -> PyResult<Tensor> {
    if let Some(d) = device
        && d != t.device()
    {
        // Pinned or managed memory asked for on the CPU: the host reads it in
        // place, as `__dlpack__(dl_device=(kDLCPU, 0))` of our tensors gives it
        // (a capsule of one came here as cuda_host / cuda_managed).
        if d == Device::Cpu && t.device().is_host_accessible() && copy != Some(true) {
            let host = t.to_dlpack_versioned(ExportOptions {
                as_host: true,
                ..ExportOptions::default()
            });
            // SAFETY: an owned export of a live tensor, consumed once.
            return unsafe { crate::dlpack::from_dlpack_versioned(host.into_raw()) }.map_err(to_py);
        }
        if copy == Some(false) {
            return Err(PyBufferError::new_err(format!(
                "moving {} to {d} needs a copy, but copy=False",
                t.device()
            )));
        }
        return py.detach(|| t.to(d)).map_err(|e| match e {
            crate::Error::UnsupportedDevice { .. } => {
                PyBufferError::new_err(format!("from_dlpack cannot copy {} to {d}: {e}", t.device()))
            }
            e => to_py(e),
        });
    }
    if copy == Some(true) && !producer_copied {
        py.detach(|| t.contiguous_copy()).map_err(to_py)
    } else {
        Ok(t)
    }
}
