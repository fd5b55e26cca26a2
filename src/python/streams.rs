//! CUDA streams and events from Python, named and behaving as `torch.cuda`'s:
//! `Stream`, `ExternalStream`, `Event`, `current_stream`, `default_stream`,
//! `set_stream`, the `stream(s)` context manager, `synchronize`,
//! `is_available`, `device_count`, `current_device`, `set_device`.
//!
//! The current stream is per thread and per GPU (`crate::stream::current_stream`):
//! devtensor's copies, fills and allocations on that GPU run on it. The
//! default stream is the legacy one, whose handle devtensor spells 1 (as DLPack
//! and the CUDA Array Interface do; `0`, torch's spelling, is taken as the same
//! stream). The CPU has no streams, as in torch: asking for one raises ValueError.

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::backend::cuda::context;
use crate::backend::cuda::stream::{CudaEvent, CudaStream, handoff, synchronize_device};
use crate::device::{Backend, Device};
use crate::python::convert::DeviceArg;
use crate::python::errors::to_py;
use crate::stream::{StreamHandle, current_stream as current_handle, set_current_stream};

/// The ordinal of a CUDA GPU named by `device`: None (the thread's current
/// GPU), an int, `"cuda"`, `"cuda:N"`, a `torch.device`, or a `Stream`
/// (its GPU). RuntimeError without a usable GPU; ValueError for other devices.
pub(crate) fn cuda_ordinal(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let ordinal = match device.filter(|d| !d.is_none()) {
        None => py
            .detach(|| crate::backend::current_ordinal(Backend::Cuda))
            .map_err(to_py)?,
        Some(d) if d.is_instance_of::<PyInt>() => {
            let i: i64 = d.extract()?;
            u32::try_from(i).map_err(|_| PyValueError::new_err(format!("invalid CUDA device index {i}")))?
        }
        Some(d) if d.cast::<PyStream>().is_ok() => return Ok(d.cast::<PyStream>()?.get().inner.ordinal()),
        Some(d) => match d.extract::<DeviceArg>()?.resolve_py(py)? {
            Device::Cuda(i) | Device::CudaManaged(i) => i,
            other => {
                return Err(PyValueError::new_err(format!(
                    "expected a CUDA device, got {other}: devtensor streams and events are CUDA's (the CPU has none, as in torch)"
                )));
            }
        },
    };
    // Unavailable backend or no such GPU: the typed error (RuntimeError / ValueError).
    py.detach(|| context::device(ordinal).map(|_| ())).map_err(to_py)?;
    Ok(ordinal)
}

/// DLPack's and the CUDA Array Interface's spelling of a stream handle: the
/// legacy default stream is 1 (a null `CUstream` means it too in the driver API).
fn normalise(handle: usize) -> usize {
    if handle == 0 { 1 } else { handle }
}

/// A CUDA stream: one devtensor created (destroyed when the object goes, after
/// its work is done) or one wrapped by handle (never destroyed here).
#[pyclass(name = "Stream", module = "devtensor._devtensor", frozen, eq, hash)]
pub struct PyStream {
    inner: CudaStream,
}

impl PartialEq for PyStream {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl std::hash::Hash for PyStream {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl PyStream {
    fn key(&self) -> (u32, usize) {
        (self.inner.ordinal(), self.raw_handle())
    }

    fn raw_handle(&self) -> usize {
        self.inner.raw() as usize
    }

    pub(crate) fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }

    pub(crate) fn stream_handle(&self) -> StreamHandle {
        self.inner.handle()
    }

    /// A wrapper of a handle devtensor does not own.
    fn wrap(ordinal: u32, handle: usize) -> PyStream {
        // SAFETY: the handle is a live stream of GPU `ordinal` (the caller's
        // promise, as for torch's ExternalStream), or 1 / 2.
        let inner = unsafe { CudaStream::borrowed(ordinal, normalise(handle)) };
        PyStream { inner }
    }

    /// The thread's current stream of GPU `ordinal`.
    fn current(ordinal: u32) -> PyStream {
        let h = current_handle(Device::Cuda(ordinal)).map_or(1, |s| s.as_raw());
        PyStream::wrap(ordinal, h)
    }
}

#[pymethods]
impl PyStream {
    /// `Stream(device=None, *, handle=None)`: a new non-blocking stream on
    /// `device` (default: the current GPU; reused after drop, never destroyed),
    /// or, with `handle`, a wrapper of an existing `CUstream` (e.g.
    /// `torch.cuda.current_stream().cuda_stream`), which devtensor never destroys.
    #[new]
    #[pyo3(signature = (device = None, *, handle = None))]
    fn new(py: Python<'_>, device: Option<&Bound<'_, PyAny>>, handle: Option<usize>) -> PyResult<PyStream> {
        let ordinal = cuda_ordinal(py, device)?;
        match handle {
            Some(h) => Ok(PyStream::wrap(ordinal, h)),
            None => {
                let inner = py.detach(|| CudaStream::new(ordinal)).map_err(to_py)?;
                Ok(PyStream { inner })
            }
        }
    }

    /// The `CUstream` handle as an int (1: the legacy default stream, 2: the
    /// per-thread default stream).
    #[getter]
    fn cuda_stream(&self) -> usize {
        self.raw_handle()
    }

    /// The same as `cuda_stream`.
    #[getter(handle)]
    fn get_handle(&self) -> usize {
        self.raw_handle()
    }

    /// `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        Device::Cuda(self.inner.ordinal()).to_string()
    }

    /// The CUDA stream protocol (`cuda.core`): `(0, handle)`.
    fn __cuda_stream__(&self) -> (u32, usize) {
        (0, self.raw_handle())
    }

    /// Blocks until all work queued on the stream is done (the GIL released).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.synchronize()).map_err(to_py)
    }

    /// True when all work queued on the stream is done; never blocks.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.inner.query()).map_err(to_py)
    }

    /// Work queued on this stream from now on waits for the work queued on
    /// `stream` so far (an event; the host does not block).
    fn wait_stream(&self, py: Python<'_>, stream: &Bound<'_, PyStream>) -> PyResult<()> {
        let other = &stream.get().inner;
        py.detach(|| handoff(other, &self.inner)).map_err(to_py)
    }

    /// Work queued on this stream from now on waits for `event`'s recorded
    /// work (nothing when the event was never recorded, as in torch).
    fn wait_event(&self, py: Python<'_>, event: &Bound<'_, PyEvent>) -> PyResult<()> {
        event.get().wait_on(py, &self.inner)
    }

    /// Records `event` (a new `Event()` when None) on this stream; returns it.
    #[pyo3(signature = (event = None))]
    fn record_event<'py>(slf: &Bound<'py, Self>, event: Option<Bound<'py, PyEvent>>) -> PyResult<Bound<'py, PyEvent>> {
        let py = slf.py();
        let event = match event {
            Some(e) => e,
            None => Bound::new(py, PyEvent::create(false))?,
        };
        event.get().record_on(py, &slf.get().inner)?;
        Ok(event)
    }

    fn __repr__(&self) -> String {
        format!(
            "<devtensor.Stream device={} cuda_stream={:#x}>",
            Device::Cuda(self.inner.ordinal()),
            self.raw_handle()
        )
    }
}

/// `ExternalStream(stream_ptr, device=None)`: wraps an existing `CUstream`
/// (torch's `torch.cuda.ExternalStream`); never destroyed by devtensor.
#[pyfunction(name = "ExternalStream")]
#[pyo3(signature = (stream_ptr, device = None))]
fn external_stream(py: Python<'_>, stream_ptr: usize, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    let ordinal = cuda_ordinal(py, device)?;
    Ok(PyStream::wrap(ordinal, stream_ptr))
}

/// A CUDA event, created on the GPU of the first stream it is recorded on
/// (as torch's).
#[pyclass(name = "Event", module = "devtensor._devtensor", frozen)]
pub struct PyEvent {
    timing: bool,
    event: Mutex<Option<CudaEvent>>,
}

impl PyEvent {
    fn create(timing: bool) -> PyEvent {
        PyEvent {
            timing,
            event: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CudaEvent>> {
        self.event.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_on(&self, py: Python<'_>, stream: &CudaStream) -> PyResult<()> {
        py.detach(|| {
            let mut ev = self.lock();
            if let Some(e) = ev.as_ref()
                && e.ordinal() != stream.ordinal()
            {
                return Err(PyValueError::new_err(format!(
                    "event on cuda:{} cannot be recorded on a stream of cuda:{}",
                    e.ordinal(),
                    stream.ordinal()
                )));
            }
            if ev.is_none() {
                *ev = Some(CudaEvent::new(stream.ordinal(), self.timing).map_err(to_py)?);
            }
            ev.as_ref().map_or(Ok(()), |e| e.record(stream).map_err(to_py))
        })
    }

    fn wait_on(&self, py: Python<'_>, stream: &CudaStream) -> PyResult<()> {
        py.detach(|| match self.lock().as_ref() {
            Some(e) => stream.wait(e),
            None => Ok(()),
        })
        .map_err(to_py)
    }
}

#[pymethods]
impl PyEvent {
    /// `Event(enable_timing=False)`.
    #[new]
    #[pyo3(signature = (enable_timing = false))]
    fn new(enable_timing: bool) -> PyEvent {
        PyEvent::create(enable_timing)
    }

    /// Records the current end of `stream`'s work (default: the current stream
    /// of the current GPU).
    #[pyo3(signature = (stream = None))]
    fn record(&self, py: Python<'_>, stream: Option<&Bound<'_, PyStream>>) -> PyResult<()> {
        match stream {
            Some(s) => self.record_on(py, &s.get().inner),
            None => {
                let ordinal = cuda_ordinal(py, None)?;
                self.record_on(py, &PyStream::current(ordinal).inner)
            }
        }
    }

    /// Makes `stream` (default: the current stream) wait for the recorded work.
    #[pyo3(signature = (stream = None))]
    fn wait(&self, py: Python<'_>, stream: Option<&Bound<'_, PyStream>>) -> PyResult<()> {
        match stream {
            Some(s) => self.wait_on(py, &s.get().inner),
            None => {
                let ordinal = cuda_ordinal(py, None)?;
                self.wait_on(py, &PyStream::current(ordinal).inner)
            }
        }
    }

    /// True when the recorded work is done (or nothing was recorded); never blocks.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.lock().as_ref().map_or(Ok(true), CudaEvent::is_complete))
            .map_err(to_py)
    }

    /// Blocks until the recorded work is done (the GIL released).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().as_ref().map_or(Ok(()), CudaEvent::synchronize))
            .map_err(to_py)
    }

    /// Milliseconds from this event to `end`, once both recorded works are done
    /// (waits for them, the GIL released). Both need `enable_timing=True`.
    fn elapsed_time(&self, py: Python<'_>, end: &Bound<'_, PyEvent>) -> PyResult<f64> {
        let end = end.get();
        if !self.timing || !end.timing {
            return Err(PyRuntimeError::new_err(
                "Both events must be created with argument 'enable_timing=True'.",
            ));
        }
        if std::ptr::eq(self, end) {
            return Ok(0.0);
        }
        py.detach(|| {
            let (a, b) = (self.lock(), end.lock());
            let (Some(a), Some(b)) = (a.as_ref(), b.as_ref()) else {
                return Err(PyRuntimeError::new_err(
                    "Both events must be recorded before calculating elapsed time.",
                ));
            };
            a.synchronize().map_err(to_py)?;
            b.synchronize().map_err(to_py)?;
            a.elapsed_ms(b).map(f64::from).map_err(to_py)
        })
    }

    /// The `CUevent` handle as an int (0 before the first record).
    #[getter]
    fn cuda_event(&self) -> usize {
        self.lock().as_ref().map_or(0, |e| e.raw() as usize)
    }

    fn __repr__(&self) -> String {
        match self.lock().as_ref() {
            Some(e) => format!("<devtensor.Event cuda_event={:#x}>", e.raw() as usize),
            None => "<devtensor.Event uninitialized>".to_owned(),
        }
    }
}

/// `current_stream(device=None)`: the thread's current stream of the GPU.
#[pyfunction]
#[pyo3(signature = (device = None))]
fn current_stream(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    Ok(PyStream::current(cuda_ordinal(py, device)?))
}

/// `default_stream(device=None)`: the GPU's legacy default stream (handle 1).
#[pyfunction]
#[pyo3(signature = (device = None))]
fn default_stream(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    Ok(PyStream::wrap(cuda_ordinal(py, device)?, 1))
}

/// Makes `stream` current on its GPU for this thread (`None`: nothing). The
/// stream object must outlive its time as current.
fn make_current(stream: &PyStream) -> Option<StreamHandle> {
    let h = stream.raw_handle();
    let new = (h != 1).then(|| stream.stream_handle());
    set_current_stream(Device::Cuda(stream.ordinal()), new)
}

/// `set_stream(stream)`: makes `stream`'s GPU the current device and `stream`
/// the current stream of that GPU, for this thread (as `torch.cuda.set_stream`
/// does, and `with stream(s):` until its block ends). `None` does nothing.
#[pyfunction]
fn set_stream(py: Python<'_>, stream: Option<&Bound<'_, PyStream>>) -> PyResult<()> {
    if let Some(s) = stream {
        // The device first: a stream of a GPU that cannot be made current is not set.
        let ordinal = s.get().ordinal();
        py.detach(|| context::make_current(ordinal)).map_err(to_py)?;
        keep_alive(s);
        make_current(s.get());
    }
    Ok(())
}

/// Streams made current by `set_stream` stay alive (their handles are used
/// by later copies); torch keeps its pool's streams for the process too.
fn keep_alive(s: &Bound<'_, PyStream>) {
    static KEPT: Mutex<Vec<Py<PyStream>>> = Mutex::new(Vec::new());
    if s.get().inner.is_owned() {
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.iter().any(|k| k.get().key() == s.get().key()) {
            kept.push(s.clone().unbind());
        }
    }
}

/// `with devtensor.stream(s):` makes `s` the thread's current stream of its
/// GPU, and that GPU the current device, until the block ends (both restored
/// then; nests). `stream(None)` does nothing.
#[pyclass(name = "StreamContext", module = "devtensor._devtensor", frozen)]
pub struct StreamContext {
    stream: Option<Py<PyStream>>,
    /// What each `__enter__` replaced: the previous current stream and context.
    saved: Mutex<Vec<(Option<StreamHandle>, usize)>>,
}

#[pymethods]
impl StreamContext {
    #[new]
    fn new(stream: Option<Py<PyStream>>) -> StreamContext {
        StreamContext {
            stream,
            saved: Mutex::new(Vec::new()),
        }
    }

    /// The stream (None for `stream(None)`).
    #[getter]
    fn stream(&self, py: Python<'_>) -> Option<Py<PyStream>> {
        self.stream.as_ref().map(|s| s.clone_ref(py))
    }

    fn __enter__(&self, py: Python<'_>) -> PyResult<Option<Py<PyStream>>> {
        let Some(s) = &self.stream else { return Ok(None) };
        let stream = s.get();
        let ctx = py.detach(|| context::make_current(stream.ordinal())).map_err(to_py)?;
        let prev = make_current(stream);
        self.saved.lock().unwrap_or_else(|p| p.into_inner()).push((prev, ctx));
        Ok(Some(s.clone_ref(py)))
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        let Some(s) = &self.stream else { return Ok(false) };
        let saved = self.saved.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let Some((prev, ctx)) = saved else {
            return Err(PyRuntimeError::new_err("stream context exited without being entered"));
        };
        set_current_stream(Device::Cuda(s.get().ordinal()), prev);
        // SAFETY: `ctx` was current on this thread at `__enter__` (a primary
        // context devtensor or another library keeps retained, or none).
        py.detach(|| unsafe { context::restore_context(ctx) }).map_err(to_py)?;
        Ok(false)
    }
}

/// `stream(stream)`: the context manager (`with devtensor.stream(s): ...`).
#[pyfunction]
fn stream(stream: Option<Py<PyStream>>) -> StreamContext {
    StreamContext::new(stream)
}

/// `synchronize(device=None)`: waits for all work on the GPU (the GIL released).
#[pyfunction]
#[pyo3(signature = (device = None))]
fn synchronize(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let ordinal = cuda_ordinal(py, device)?;
    py.detach(|| synchronize_device(ordinal)).map_err(to_py)
}

/// `is_available()`: True when devtensor can use at least one CUDA GPU.
#[pyfunction]
fn is_available(py: Python<'_>) -> bool {
    py.detach(|| {
        let s = crate::backend::cuda_status();
        s.is_available() && !s.devices.is_empty()
    })
}

/// `device_count()`: the CUDA GPUs devtensor can use (0 without a driver).
#[pyfunction]
fn device_count(py: Python<'_>) -> usize {
    py.detach(|| {
        let s = crate::backend::cuda_status();
        if s.is_available() { s.devices.len() } else { 0 }
    })
}

/// `current_device()`: the index of the thread's current CUDA GPU.
#[pyfunction]
fn current_device(py: Python<'_>) -> PyResult<u32> {
    cuda_ordinal(py, None)
}

/// `set_device(device)`: makes the GPU current on this thread (its primary
/// context, which torch and CuPy share). A negative index does nothing.
#[pyfunction]
fn set_device(py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<()> {
    if device.is_instance_of::<PyInt>() && device.extract::<i64>()? < 0 {
        return Ok(());
    }
    if device.is_none() {
        return Err(PyTypeError::new_err("set_device needs a device"));
    }
    let ordinal = cuda_ordinal(py, Some(device))?;
    py.detach(|| context::make_current(ordinal)).map_err(to_py)?;
    Ok(())
}

/// Adds the classes and functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStream>()?;
    m.add_class::<PyEvent>()?;
    m.add_class::<StreamContext>()?;
    m.add_function(wrap_pyfunction!(external_stream, m)?)?;
    m.add_function(wrap_pyfunction!(current_stream, m)?)?;
    m.add_function(wrap_pyfunction!(default_stream, m)?)?;
    m.add_function(wrap_pyfunction!(set_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(is_available, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(current_device, m)?)?;
    m.add_function(wrap_pyfunction!(set_device, m)?)?;
    Ok(())
}
