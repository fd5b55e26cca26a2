//! The API for Rust extension modules (kernel libraries) that take tensors
//! from Python: [`TensorArg`] in, [`TensorOut`] back, outputs allocated on the
//! caller's stream, optionally by the caller's own allocator ([`Framework`]).
//!
//! An extension links its own copy of devtensor, so its tensors reach Python
//! through a DLPack exchange API: the `devtensor.Tensor` type's (the
//! `devtensor` Python package must be installed) or the caller framework's.

use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyModule, PyTuple, PyType};

use crate::backend::default_allocator;
use crate::device::Device;
use crate::dlpack::EnvAlloc;
use crate::dlpack::ExportOptions;
use crate::dlpack::ffi::DLPackExchangeAPI;
use crate::dtype::DType;
use crate::python::errors::to_py;
use crate::python::{consumer, exchange};
use crate::stream::StreamHandle;
use crate::tensor::{Storage, Tensor};

/// `devtensor::Error` → the Python exception the DLPack / array-API specs
/// name (`MemoryError`, `BufferError`, `TypeError`, `ValueError`,
/// `RuntimeError`); a framework allocator's error keeps its own kind.
pub fn to_py_err(e: crate::Error) -> PyErr {
    to_py(e)
}

/// A framework that speaks DLPack's C exchange API (its tensor type has
/// `__dlpack_c_exchange_api__`): torch ≥ 2.10, devtensor, tvm-ffi users, ...
/// It can allocate ([`Framework::env_alloc`]), say its current stream, and
/// wrap a devtensor [`Tensor`] as its own tensor type without a copy.
///
/// ```no_run
/// use devtensor::python::Framework;
/// use devtensor::{DType, Device};
/// use pyo3::prelude::*;
///
/// fn torch_empty(py: Python<'_>) -> PyResult<()> {
///     let torch = Framework::of(py.import("torch")?.as_any())?;
///     let t = torch.empty(&[2, 3], DType::F32, Device::Cpu)?; // torch.empty((2, 3))
///     let back = torch.wrap(py, &t)?; // a torch.Tensor over the same memory
///     let ptr: usize = back.call_method0("data_ptr")?.extract()?;
///     assert_eq!(ptr, t.data_ptr() as usize);
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct Framework {
    ty: Py<PyType>,
    api: &'static DLPackExchangeAPI,
}

impl Framework {
    /// The framework of `obj`: a tensor type (`torch.Tensor`), an instance of
    /// one, or a module with a `Tensor` type (`torch`). `TypeError` when it has
    /// no usable exchange API.
    pub fn of(obj: &Bound<'_, PyAny>) -> PyResult<Framework> {
        let ty = if let Ok(t) = obj.cast::<PyType>() {
            t.clone()
        } else if let Ok(m) = obj.cast::<PyModule>() {
            m.getattr("Tensor")
                .and_then(|t| Ok(t.cast_into::<PyType>()?))
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "module {} has no Tensor type with a DLPack C exchange API",
                        m.name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?
        } else {
            obj.get_type()
        };
        let api = exchange::read_table(&ty).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{ty} has no DLPack C exchange API (__dlpack_c_exchange_api__, DLPack >= 1.3)"
            ))
        })?;
        Ok(Framework { ty: ty.unbind(), api })
    }

    /// `devtensor.Tensor` of the installed `devtensor` Python package.
    pub fn devtensor(py: Python<'_>) -> PyResult<Framework> {
        static TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        let ty = TENSOR.get_or_try_init(py, || -> PyResult<Py<PyType>> {
            Ok(py
                .import("devtensor")?
                .getattr("Tensor")?
                .cast_into::<PyType>()?
                .unbind())
        })?;
        Framework::of(ty.bind(py).as_any())
    }

    /// The framework's tensor type.
    pub fn tensor_type<'py>(&self, py: Python<'py>) -> &Bound<'py, PyType> {
        self.ty.bind(py)
    }

    /// Its DLPack exchange API table.
    pub fn api(&self) -> &'static DLPackExchangeAPI {
        self.api
    }

    /// Another handle to the same framework.
    pub fn clone_ref(&self, py: Python<'_>) -> Framework {
        Framework {
            ty: self.ty.clone_ref(py),
            api: self.api,
        }
    }

    /// Its allocator for `device` (torch: `torch.empty`, its caching
    /// allocator on its current stream).
    pub fn env_alloc(&self, device: Device) -> PyResult<EnvAlloc> {
        // SAFETY: the table is the type's `__dlpack_c_exchange_api__`, which
        // the DLPack header makes its producer's promise to keep the contract
        // (torch, and any framework that publishes one).
        unsafe { EnvAlloc::new(self.api, device) }.map_err(to_py)
    }

    /// A C-contiguous tensor allocated by the framework (see [`EnvAlloc::empty`]).
    pub fn empty(&self, shape: &[usize], dtype: DType, device: Device) -> PyResult<Tensor> {
        self.env_alloc(device)?.empty(shape, dtype).map_err(to_py)
    }

    /// Its current work stream for `device`; `None` for host memory.
    pub fn current_stream(&self, device: Device) -> PyResult<Option<StreamHandle>> {
        crate::dlpack::env_alloc::current_work_stream(self.api, device).map_err(to_py)
    }

    /// `t` as the framework's tensor (no copy, no stream sync: see
    /// [`TensorOut`] for the ordering), through its
    /// `managed_tensor_to_py_object_no_sync`.
    pub fn wrap<'py>(&self, py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        let to_py_object = self
            .api
            .managed_tensor_to_py_object_no_sync
            .ok_or_else(|| PyTypeError::new_err("the exchange API has no managed_tensor_to_py_object_no_sync"))?;
        let m = t.to_dlpack_versioned(ExportOptions::default());
        let mut out = std::ptr::null_mut();
        // SAFETY: the GIL is held; the function takes ownership of `m` on every
        // path (it "steals" it) and returns a new reference or sets an error.
        let rc = unsafe { to_py_object(m.into_raw(), &mut out) };
        if rc != 0 || out.is_null() {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyRuntimeError::new_err(format!("managed_tensor_to_py_object_no_sync failed with {rc}"))
            }));
        }
        // SAFETY: a new, non-null reference handed to us.
        Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
    }
}

/// The allocator `devtensor.env_alloc(...)` set for this thread / context,
/// if any (`None`: devtensor's own).
pub fn default_framework(py: Python<'_>) -> PyResult<Option<Framework>> {
    let Some(var) = env_var(py) else {
        return Ok(None);
    };
    let current = var.bind(py).call_method0(pyo3::intern!(py, "get"))?;
    if current.is_none() {
        return Ok(None);
    }
    Framework::of(&current).map(Some)
}

/// `devtensor._devtensor._env_alloc_var`, the ContextVar that every copy of
/// devtensor (the package and each extension module) reads; `None` when the
/// `devtensor` package cannot be imported.
fn env_var(py: Python<'_>) -> Option<&Py<PyAny>> {
    // Only a success is kept: an import that failed is tried again next time.
    static VAR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    VAR.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("devtensor._devtensor")?.getattr(ENV_VAR_NAME)?.unbind())
    })
    .ok()
}

/// The ContextVar of this context's open `env_alloc` scopes: the innermost's
/// entry `(scope, the selection before it, the entry of the scope around it)`,
/// or `None`. A chain rather than one tuple of every entry, so that entering
/// and leaving the innermost scope cost the same at any depth (copying the
/// tuple made 16,000 nested scopes take 4.4 s).
fn scopes_var(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    static VAR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    VAR.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("devtensor._devtensor")?.getattr(SCOPES_VAR_NAME)?.unbind())
    })
}

const ENV_VAR_NAME: &str = "_env_alloc_var";
const SCOPES_VAR_NAME: &str = "_env_alloc_scopes";

/// An uninitialised C-contiguous tensor from devtensor's allocator for
/// `device`, ordered on `stream` (`None` or the default stream: the device's
/// default): the pool reuses the memory on that stream after it is freed.
pub fn empty_on(shape: &[usize], dtype: DType, device: Device, stream: Option<StreamHandle>) -> crate::Result<Tensor> {
    let stream = stream.filter(|&s| !is_default_stream(device, s));
    crate::layout::check_ndim(shape.len())?;
    let bytes = crate::layout::nbytes(shape, dtype.size())?;
    let storage = std::sync::Arc::new(Storage::new(default_allocator(device)?, bytes, stream)?);
    Ok(Tensor::from_parts(
        storage,
        dtype,
        shape.into(),
        crate::layout::contiguous_strides(shape)?,
        0,
        false,
    ))
}

fn default_stream(device: Device) -> Option<StreamHandle> {
    match device {
        Device::Cuda(_) | Device::CudaManaged(_) => Some(StreamHandle::CUDA_LEGACY),
        Device::Rocm(_) => Some(StreamHandle::ROCM_DEFAULT),
        _ => None,
    }
}

fn is_default_stream(device: Device, s: StreamHandle) -> bool {
    match device {
        // 0 is the NULL stream, the legacy one in the driver API.
        Device::Cuda(_) | Device::CudaManaged(_) => s.as_raw() <= 1,
        Device::Rocm(_) => s.as_raw() == 0,
        _ => true,
    }
}

/// Runs this copy of devtensor's waiting deleters (imported GPU tensors whose
/// device work was pending when they dropped) at interpreter exit, as the
/// `devtensor` package does for its own; registered once.
fn drain_at_exit(py: Python<'_>) -> PyResult<()> {
    #[pyfunction]
    fn _drain_deleters(py: Python<'_>) -> usize {
        py.detach(crate::dlpack::drain_deleters)
    }
    static REGISTERED: PyOnceLock<()> = PyOnceLock::new();
    REGISTERED
        .get_or_try_init(py, || -> PyResult<()> {
            let f = wrap_pyfunction!(_drain_deleters, py)?;
            py.import("atexit")?.call_method1("register", (f,))?;
            Ok(())
        })
        .map(|_| ())
}

/// A tensor argument from any DLPack producer: torch, CuPy, JAX, NumPy,
/// devtensor, a raw capsule.
///
/// Extraction takes the producer type's C exchange API when it has one (no
/// Python call, no stream sync: the kernel runs on the producer's current
/// work stream, [`TensorArg::stream`]); otherwise `__dlpack__` with the
/// device's default stream, which the producer orders its work before, and
/// the kernel runs there. `BufferError` for what DLPack cannot describe.
///
/// ```no_run
/// use devtensor::python::{TensorArg, TensorOut};
/// use devtensor::DType;
/// use pyo3::prelude::*;
///
/// /// `scale(x, a)`: `a * x` for float32 CPU tensors of any producer.
/// #[pyfunction]
/// #[pyo3(signature = (x, a, *, to_caller = false))]
/// fn scale(py: Python<'_>, x: TensorArg, a: f32, to_caller: bool) -> PyResult<TensorOut> {
///     let input = x.tensor().contiguous().map_err(devtensor::python::to_py_err)?;
///     let out = x.empty(py, input.shape(), DType::F32)?; // on x's device and stream
///     let v: Vec<f32> = input.to_vec().map_err(devtensor::python::to_py_err)?;
///     let scaled = devtensor::Tensor::from_slice(&v.iter().map(|e| a * e).collect::<Vec<_>>(), input.shape())
///         .map_err(devtensor::python::to_py_err)?;
///     out.copy_from(&scaled).map_err(devtensor::python::to_py_err)?;
///     Ok(if to_caller { x.output_to_caller(out) } else { x.output(out) })
/// }
/// ```
#[derive(Debug)]
pub struct TensorArg {
    tensor: Tensor,
    stream: Option<StreamHandle>,
    framework: Option<Framework>,
}

impl<'py> FromPyObject<'_, 'py> for TensorArg {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let x: &Bound<'py, PyAny> = &ob;
        let py = x.py();
        if let Some(api) = exchange::lookup(x)
            && let Some(get) = api.managed_tensor_from_py_object_no_sync
        {
            let mut out = std::ptr::null_mut();
            // SAFETY: the GIL is held and `x` is alive; the function fills `out`
            // with an owned tensor or sets a Python error and returns non-zero.
            let rc = unsafe { get(x.as_ptr().cast(), &mut out) };
            if rc == 0 {
                // SAFETY: an owned managed tensor from the producer.
                let t = unsafe { crate::dlpack::from_dlpack_versioned(out) }.map_err(to_py)?;
                consumer::refuse_lazy_views(x, &t)?;
                let stream = crate::dlpack::env_alloc::current_work_stream(api, t.device()).map_err(to_py)?;
                return Ok(TensorArg {
                    tensor: t,
                    stream,
                    framework: Some(Framework {
                        ty: x.get_type().unbind(),
                        api,
                    }),
                });
            }
            // BufferError: try the Python protocol (tvm-ffi's rule).
            if let Some(e) = PyErr::take(py)
                && !e.is_instance_of::<PyBufferError>(py)
            {
                return Err(e);
            }
        }
        let t = consumer::from_dlpack(x, None, None)?;
        let stream = default_stream(t.device());
        if let Some(s) = stream {
            // The producer may free its memory as soon as the tensor drops: its
            // deleter waits for the work the kernel queues on this stream
            // (this copy of devtensor's deferred deleters, drained at exit).
            drain_at_exit(py)?;
            t.storage().record_stream(s);
        }
        Ok(TensorArg {
            tensor: t,
            stream,
            framework: None,
        })
    }
}

impl TensorArg {
    /// The tensor (a zero-copy view of the producer's memory).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The tensor, giving up the argument.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }

    /// The stream to run kernels on for this tensor: the producer's current
    /// work stream (exchange API), or the device's default stream (`1` on
    /// CUDA, `0` on ROCm) for producers without one; `None` for host memory.
    pub fn stream(&self) -> Option<StreamHandle> {
        self.stream
    }

    /// The producer's framework, when it has a C exchange API.
    pub fn framework(&self) -> Option<&Framework> {
        self.framework.as_ref()
    }

    /// An output on this tensor's device, ordered on [`TensorArg::stream`]:
    /// from the allocator `devtensor.env_alloc(...)` selected for this thread
    /// (Python `with devtensor.env_alloc(torch): ...`), else from devtensor's
    /// own.
    pub fn empty(&self, py: Python<'_>, shape: &[usize], dtype: DType) -> PyResult<Tensor> {
        match default_framework(py)? {
            Some(fw) => self.empty_in(&fw, shape, dtype),
            None => self.empty_devtensor(shape, dtype),
        }
    }

    /// An output from `fw`'s allocator on this tensor's device. The framework
    /// hands out memory ordered on its current stream: when that is not
    /// [`TensorArg::stream`], ours waits for it first, and the memory goes back
    /// to the framework only after the work queued on ours (its deleter waits).
    pub fn empty_in(&self, fw: &Framework, shape: &[usize], dtype: DType) -> PyResult<Tensor> {
        let device = self.tensor.device();
        let t = fw.empty(shape, dtype, device)?;
        if let (Some(ours), Some(theirs)) = (self.stream, fw.current_stream(device)?)
            && ours != theirs
        {
            order_streams(device, theirs, ours).map_err(to_py)?;
            Python::attach(drain_at_exit)?;
            t.storage().record_stream(ours);
        }
        Ok(t)
    }

    /// An output from the caller's own allocator (torch's caching allocator
    /// when torch passed this tensor), or devtensor's when the producer has
    /// no exchange API (NumPy, JAX, CuPy).
    pub fn empty_from_caller(&self, shape: &[usize], dtype: DType) -> PyResult<Tensor> {
        match &self.framework {
            Some(fw) => self.empty_in(fw, shape, dtype),
            None => self.empty_devtensor(shape, dtype),
        }
    }

    /// An output from devtensor's allocator, ordered on [`TensorArg::stream`].
    pub fn empty_devtensor(&self, shape: &[usize], dtype: DType) -> PyResult<Tensor> {
        empty_on(shape, dtype, self.tensor.device(), self.stream).map_err(to_py)
    }

    /// Hands `t` back as a `devtensor.Tensor`, ordered after the work queued
    /// on this argument's stream.
    pub fn output(&self, t: Tensor) -> TensorOut {
        TensorOut::new(t).after(self.stream)
    }

    /// Hands `t` back as the caller's own tensor type (a `torch.Tensor` for a
    /// torch caller; no copy, on its current stream), or as a
    /// `devtensor.Tensor` when the producer has no exchange API.
    pub fn output_to_caller(&self, t: Tensor) -> TensorOut {
        let out = self.output(t);
        match &self.framework {
            Some(fw) => out.to_framework(Framework {
                ty: Python::attach(|py| fw.ty.clone_ref(py)),
                api: fw.api,
            }),
            None => out,
        }
    }
}

/// A tensor on its way back to Python (`IntoPyObject`): a `devtensor.Tensor`
/// by default, or another framework's tensor ([`TensorOut::to_framework`]).
///
/// When the tensor's device work was queued on a stream
/// ([`TensorOut::after`]) other than the receiving framework's current one,
/// that stream waits for it on the device (an event; the host never blocks),
/// and the stream is recorded on the memory so devtensor's pool does not
/// reuse it before the receiver's work is done.
#[derive(Debug)]
pub struct TensorOut {
    tensor: Tensor,
    stream: Option<StreamHandle>,
    to: Option<Framework>,
}

impl From<Tensor> for TensorOut {
    fn from(t: Tensor) -> TensorOut {
        TensorOut::new(t)
    }
}

impl TensorOut {
    /// `t` as a `devtensor.Tensor`, its work on the device's default stream.
    pub fn new(tensor: Tensor) -> TensorOut {
        TensorOut {
            tensor,
            stream: None,
            to: None,
        }
    }

    /// The stream the tensor's pending work was queued on (`None`: the
    /// device's default stream).
    pub fn after(mut self, stream: Option<StreamHandle>) -> TensorOut {
        self.stream = stream;
        self
    }

    /// Return it as `framework`'s tensor type instead.
    pub fn to_framework(mut self, framework: Framework) -> TensorOut {
        self.to = Some(framework);
        self
    }

    /// The tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl<'py> IntoPyObject<'py> for TensorOut {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let fw = match self.to {
            Some(fw) => fw,
            None => Framework::devtensor(py)?,
        };
        let device = self.tensor.device();
        if let Some(theirs) = fw.current_stream(device)? {
            let ours = self.stream.or(default_stream(device)).unwrap_or(theirs);
            if ours != theirs {
                py.detach(|| order_streams(device, ours, theirs)).map_err(to_py)?;
                self.tensor.storage().record_stream(theirs);
            }
        }
        fw.wrap(py, &self.tensor)
    }
}

/// Work queued on `producer` so far happens before work later queued on
/// `consumer`, both streams of `device`'s GPU (the DLPack handoff: an event
/// recorded on one, waited on by the other; the host never blocks). Nothing
/// for host memory or the same stream. For two arguments that came on
/// different streams: order the second's stream before the first's.
pub fn order_streams(device: Device, producer: StreamHandle, consumer: StreamHandle) -> crate::Result<()> {
    match device.ordinal() {
        Some(ordinal) => crate::backend::for_device(device).order_streams(ordinal, producer, consumer),
        None => Ok(()),
    }
}

// ----- Python: `devtensor.env_alloc(framework)` ---------------------------------------

/// `with devtensor.env_alloc(torch): ...`: outputs of kernel libraries built
/// on devtensor (`TensorArg::empty`) come from that framework's allocator in
/// this thread / async context. `None` selects devtensor's own again.
#[pyclass(name = "EnvAlloc", module = "devtensor._devtensor", frozen)]
pub(crate) struct PyEnvAlloc {
    framework: Option<Py<PyType>>,
}

#[pymethods]
impl PyEnvAlloc {
    /// The framework's tensor type, or None for devtensor's own allocator.
    #[getter]
    fn framework(&self, py: Python<'_>) -> Option<Py<PyType>> {
        self.framework.as_ref().map(|t| t.clone_ref(py))
    }

    /// Selects the framework in this thread / async context. The selection it
    /// replaces is kept in the context too (not in the object), so one
    /// object may be entered by several threads or tasks at once (a
    /// module-level `env_alloc(torch)`), each exit undoing its own context's.
    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyType>>> {
        let py = slf.py();
        let var = env_var(py).ok_or_else(|| PyRuntimeError::new_err("devtensor._devtensor is not importable"))?;
        let this = slf.get();
        let value = match &this.framework {
            Some(t) => t.bind(py).clone().into_any(),
            None => py.None().into_bound(py),
        };
        let var = var.bind(py);
        let before = var.call_method0(pyo3::intern!(py, "get"))?;
        var.call_method1(pyo3::intern!(py, "set"), (value,))?;
        let scopes = scopes_var(py)?.bind(py);
        let open = scopes.call_method0(pyo3::intern!(py, "get"))?;
        let entry = PyTuple::new(py, [slf.as_any(), &before, &open])?;
        scopes.call_method1(pyo3::intern!(py, "set"), (entry,))?;
        Ok(this.framework(py))
    }

    /// Undoes the selection this context made last with this object.
    #[pyo3(signature = (*_exc))]
    fn __exit__(slf: &Bound<'_, Self>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let py = slf.py();
        let Some(var) = env_var(py) else {
            return Ok(false);
        };
        let scopes = scopes_var(py)?.bind(py);
        // The entries opened after ours, innermost first.
        let mut above: Vec<Bound<'_, PyTuple>> = Vec::new();
        let mut entry = scopes.call_method0(pyo3::intern!(py, "get"))?;
        let ours = loop {
            if entry.is_none() {
                return Ok(false); // an exit without an enter here: nothing to undo
            }
            let e = entry.cast_into::<PyTuple>()?;
            if e.get_item(0)?.is(slf) {
                break e;
            }
            entry = e.get_item(2)?;
            above.push(e);
        };
        // Each entry keeps the selection from before it. The innermost's
        // exit restores that; an inner one's (an ExitStack unwound out of
        // order) hands it to the entry opened after it, whose exit will
        // restore it, and the selection stays the innermost scope's. The
        // entries are shared with copied contexts, so those above ours are
        // made anew.
        let before = ours.get_item(1)?;
        let mut open = ours.get_item(2)?;
        match above.split_last() {
            None => {
                var.bind(py).call_method1(pyo3::intern!(py, "set"), (before,))?;
            }
            Some((next, rest)) => {
                open = PyTuple::new(py, [next.get_item(0)?, before, open])?.into_any();
                for e in rest.iter().rev() {
                    open = PyTuple::new(py, [e.get_item(0)?, e.get_item(1)?, open])?.into_any();
                }
            }
        }
        scopes.call_method1(pyo3::intern!(py, "set"), (open,))?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match &self.framework {
            Some(t) => format!("devtensor.env_alloc({})", t.bind(py)),
            None => "devtensor.env_alloc(None)".to_owned(),
        }
    }
}

/// `env_alloc(framework)`: a context manager selecting `framework`'s
/// allocator (a tensor type, an instance, or a module such as `torch`) for
/// kernel-library outputs; `TypeError` when it has no DLPack C exchange API.
#[pyfunction]
pub(crate) fn env_alloc(framework: Option<&Bound<'_, PyAny>>) -> PyResult<PyEnvAlloc> {
    let framework = match framework.filter(|f| !f.is_none()) {
        Some(f) => Some(Framework::of(f)?.ty),
        None => None,
    };
    Ok(PyEnvAlloc { framework })
}

/// `current_env_alloc()`: the tensor type whose allocator `env_alloc`
/// selected here, or None.
#[pyfunction]
pub(crate) fn current_env_alloc(py: Python<'_>) -> PyResult<Option<Py<PyType>>> {
    Ok(default_framework(py)?.map(|f| f.ty))
}

/// Adds the ContextVar and the functions above to the `_devtensor` module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let var = py.import("contextvars")?.getattr("ContextVar")?.call(
        ("devtensor_env_alloc",),
        Some(&[("default", py.None())].into_py_dict(py)?),
    )?;
    m.add(ENV_VAR_NAME, var)?;
    let scopes = py.import("contextvars")?.getattr("ContextVar")?.call(
        ("devtensor_env_alloc_scopes",),
        Some(&[("default", py.None())].into_py_dict(py)?),
    )?;
    m.add(SCOPES_VAR_NAME, scopes)?;
    m.add_class::<PyEnvAlloc>()?;
    m.add_function(wrap_pyfunction!(env_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(current_env_alloc, m)?)?;
    Ok(())
}
