//! The Python `Tensor` class.

use pyo3::exceptions::{PyAttributeError, PyBufferError, PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyCapsule, PyEllipsis, PySlice, PyTuple};

use crate::Error;
use crate::device::Device;
use crate::dlpack::ExportOptions;
use crate::dlpack::ffi::{DLPACK_MINOR_VERSION, kDLCPU};
use crate::python::convert::{DeviceArg, scalar_bytes};
use crate::python::errors::to_py;
use crate::python::{array_interface, capsule, consumer, detach_unless_small_cpu, exchange, values};
use crate::stream::StreamHandle;
use crate::tensor::Tensor;

/// An n-dimensional view of CPU or GPU memory that speaks DLPack.
// `weakref`: NumPy arrays and torch tensors take weak references (caches keyed by them).
#[pyclass(name = "Tensor", module = "devtensor._devtensor", frozen, weakref)]
pub struct PyTensor {
    inner: Tensor,
}

impl From<Tensor> for PyTensor {
    fn from(inner: Tensor) -> Self {
        PyTensor { inner }
    }
}

impl PyTensor {
    pub(crate) fn inner(&self) -> &Tensor {
        &self.inner
    }

    /// The one element as a Python scalar, for `bool()`, `int()`, `float()`
    /// and `complex()`; `err` naming the count otherwise, `what` first.
    fn one_value(&self, py: Python<'_>, what: &str, err: fn(String) -> PyErr) -> PyResult<Py<PyAny>> {
        let n = self.inner.numel();
        if n != 1 {
            return Err(err(format!(
                "{what} {n} elements is ambiguous: only one-element tensors convert to Python scalars"
            )));
        }
        values::tolist(py, &self.inner.view(&[]).map_err(to_py)?)
    }
}

/// `iter(tensor)`: `tensor[0]`, `tensor[1]`, … (views).
#[pyclass(module = "devtensor._devtensor", frozen)]
pub(crate) struct TensorIter {
    t: Tensor,
    next: std::sync::atomic::AtomicUsize,
}

impl TensorIter {
    /// The views along the first dimension of `view(t)`; TypeError (`what`
    /// a 0-d tensor) where `t` has no dimension.
    fn over(t: &Tensor, what: &str, view: impl FnOnce(Tensor) -> PyResult<Tensor>) -> PyResult<Self> {
        if t.ndim() == 0 {
            return Err(PyTypeError::new_err(format!("{what} a 0-d tensor")));
        }
        Ok(Self {
            t: view(t.clone())?,
            next: std::sync::atomic::AtomicUsize::new(0),
        })
    }
}

#[pymethods]
impl TensorIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self) -> PyResult<Option<PyTensor>> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if i >= self.t.shape()[0] {
            return Ok(None);
        }
        wrap(self.t.select(0, i as isize)).map(Some)
    }
}

/// What `value in t` compares `t`'s elements (of `dtype`) with, as NumPy
/// (NEP 50) and torch compare Python scalars: a Python bool, int, float or
/// complex (exactly those types) of `dtype`'s kind or a lower one is rounded
/// to `dtype`, a finite value past a float dtype's range to ±inf (None where
/// nothing can equal it: an int past an integer dtype's range, a non-zero
/// imaginary part against real elements); anything else (NumPy scalars,
/// `np.float64` included, 0-d arrays, higher kinds) is its exact value,
/// compared in the wider kind: with it, whether the integer or bool
/// elements are to be widened to doubles first (a float or complex key).
fn contained_key<'py>(value: &Bound<'py, PyAny>, dtype: crate::DType) -> PyResult<Option<(Bound<'py, PyAny>, bool)>> {
    use crate::NumberKind;
    use crate::scalar::Scalar;
    use pyo3::types::{PyComplex, PyFloat, PyInt};
    let py = value.py();
    let weak = value.is_exact_instance_of::<PyInt>()
        || value.is_exact_instance_of::<PyBool>()
        || value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyComplex>();
    let kind = dtype.kind();
    let mut s = match crate::python::convert::scalar(value) {
        Ok(s) => s,
        // An int past 128 bits: past every integer dtype's range, a float
        // (or an infinity) to the others.
        Err(e) if weak && e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => {
            if kind < NumberKind::Float {
                return Ok(None);
            }
            let inf = if value.lt(0)? { f64::NEG_INFINITY } else { f64::INFINITY };
            Scalar::Float(value.extract::<f64>().unwrap_or(inf))
        }
        Err(e) => return Err(e),
    };
    if weak
        && !dtype.is_complex()
        && let Scalar::Complex(re, im) = s
    {
        if im != 0.0 {
            return Ok(None); // no real element equals it
        }
        s = Scalar::Float(re); // `(0.1 + 0j) in` a float32 tensor holding 0.1
    }
    if weak && s.kind() <= kind {
        // Past a float dtype's range: ±inf, as NumPy and torch convert it.
        let Ok(bytes) = s.to_bytes_saturating(dtype) else {
            return Ok(None);
        };
        let one = Tensor::full_bytes(&[], dtype, Device::Cpu, &bytes).map_err(to_py)?;
        return Ok(Some((values::tolist(py, &one)?.into_bound(py), false)));
    }
    let widen = kind < NumberKind::Float && s.kind() >= NumberKind::Float;
    let key = match s {
        Scalar::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
        Scalar::Int(i) => i.into_pyobject(py)?.into_any(),
        Scalar::Float(f) => f.into_pyobject(py)?.into_any(),
        Scalar::Complex(re, im) => PyComplex::from_doubles(py, re, im).into_any(),
    };
    Ok(Some((key, widen)))
}

/// A tuple of two ints that fit `T` (`max_version`, `dl_device`); None for
/// anything else, bools included (`(True, 0)` is no version or device).
fn int_pair<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(v: &Bound<'py, PyAny>) -> Option<(T, T)> {
    let t = v.cast::<PyTuple>().ok()?;
    if t.len() != 2 {
        return None;
    }
    let item = |i| {
        let x = t.get_item(i).ok()?;
        if x.is_instance_of::<PyBool>() || !x.is_instance_of::<pyo3::types::PyInt>() {
            return None;
        }
        x.extract::<T>().ok()
    };
    Some((item(0)?, item(1)?))
}

/// A slice's `start`, `stop` or `step`: None, or an int (or `__index__`
/// object) clamped to `isize`, as CPython clamps slice bounds (`t[:2**70]`
/// is all of `t`, as for lists, NumPy and torch).
fn slice_part(v: &Bound<'_, PyAny>) -> PyResult<Option<isize>> {
    if v.is_none() {
        return Ok(None);
    }
    // SAFETY: a live object on an attached thread. A NULL `exc` clamps an
    // int past `isize` instead of raising, as CPython's own slice indices.
    let i = unsafe { pyo3::ffi::PyNumber_AsSsize_t(v.as_ptr(), std::ptr::null_mut()) };
    match (i == -1).then(|| PyErr::take(v.py())).flatten() {
        None => Ok(Some(i)),
        Some(e) if e.is_instance_of::<PyTypeError>(v.py()) => Err(PyTypeError::new_err(
            "slice indices must be integers or None or have an __index__ method",
        )),
        Some(e) => Err(e), // an `__index__` of its own that raised
    }
}

fn wrap(r: crate::Result<Tensor>) -> PyResult<PyTensor> {
    r.map(PyTensor::from).map_err(to_py)
}

/// `*dims` given either as varargs or as one sequence.
fn dims_arg(args: &Bound<'_, PyTuple>) -> PyResult<Vec<isize>> {
    let one = |a: Bound<'_, PyAny>| {
        crate::python::convert::refuse_bool(&a)?;
        a.extract::<isize>()
    };
    if args.len() == 1
        && let Ok(first) = args.get_item(0)
        && first.extract::<isize>().is_err()
    {
        // One sequence of dims.
        return crate::python::convert::dim_items(&first)?
            .into_iter()
            .map(one)
            .collect();
    }
    crate::layout::check_ndim(args.len()).map_err(to_py)?;
    args.iter().map(one).collect() // ints or `__index__` objects
}

/// How the DLPack `stream` argument applies to this tensor's device.
fn check_stream(device: Device, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    // An int past 64 bits is no stream of any device (ValueError, never the
    // TypeError consumers read as "an old producer"); an `__index__` that
    // raised reaches the caller as raised.
    let s: i64 = stream.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(stream.py()) {
            PyValueError::new_err(format!("stream {stream} is no stream handle: it does not fit 64 bits"))
        } else if e.is_instance_of::<PyTypeError>(stream.py()) {
            PyTypeError::new_err("stream must be an int or None")
        } else {
            e
        }
    })?;
    match device {
        Device::Cpu | Device::CudaHost | Device::RocmHost => Err(PyBufferError::new_err(format!(
            "stream must be None for a {device} tensor, got {s}"
        ))),
        Device::Cuda(_) | Device::CudaManaged(_) if s == 0 => Err(PyValueError::new_err(
            "stream 0 is ambiguous on CUDA: use 1 (legacy default) or 2 (per-thread default)",
        )),
        Device::Rocm(_) if s == 1 || s == 2 => Err(PyValueError::new_err(format!(
            "stream {s} is not valid on ROCm (use None or 0 for the default)"
        ))),
        _ => Ok(Some(s)),
    }
}

/// Orders our pending device work before the consumer's: the DLPack rule
/// (event on our stream, the consumer's stream waits; the host never blocks),
/// or, when the host will read managed memory in place, a host sync of every
/// stream that used the memory (our default stream and those recorded on the
/// storage: a consumer's writes on its own stream included).
fn order_for_consumer(py: Python<'_>, t: &Tensor, stream: Option<i64>, host_reads: bool) -> PyResult<()> {
    let device = t.device();
    let Some(ordinal) = device.ordinal() else {
        return Ok(()); // host memory: our work on it is done when a call returns
    };
    let backend = crate::backend::for_device(device);
    if host_reads {
        let streams = t.storage().streams();
        return py
            .detach(|| backend.synchronize_streams(ordinal, &streams))
            .map_err(to_py);
    }
    // SAFETY: a stream value that is not a default stream is the consumer's
    // live stream on this device, which the DLPack protocol obliges it to pass.
    py.detach(|| unsafe { backend.order_before_consumer(device, stream) })
        .map_err(to_py)
}

#[pymethods]
impl PyTensor {
    /// Sizes.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// Strides, in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }

    /// The dtype's name (`"float32"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// The device as a string (`"cpu"`, `"cuda:0"`, ...).
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.inner.dtype().size()
    }

    /// Address of element `[0, 0, ...]`.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }

    #[getter]
    fn read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    fn is_contiguous(&self) -> bool {
        self.inner.is_contiguous()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .shape()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    /// The views along the first dimension; TypeError for a 0-d tensor, as
    /// NumPy and torch raise (without `__iter__`, Python's fallback through
    /// `__getitem__` gave an empty iteration).
    fn __iter__(&self) -> PyResult<TensorIter> {
        TensorIter::over(&self.inner, "iteration over", Ok)
    }

    /// `reversed(t)`: the views along the first dimension, last first (of a
    /// flipped view: nothing is copied), as NumPy's rows; TypeError for a 0-d
    /// tensor. Without it Python refused (`__getitem__` is a mapping's here).
    fn __reversed__(&self) -> PyResult<TensorIter> {
        TensorIter::over(&self.inner, "reversed() of", |t| t.flip(&[0]).map_err(to_py))
    }

    /// The truth of the one element (copied to the host for a device
    /// tensor); ValueError for any other count, as NumPy (without it, Python
    /// took `len()`: `bool(zeros(1))` was True).
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        let v = self.one_value(py, "The truth value of a tensor with", PyValueError::new_err)?;
        v.bind(py).is_truthy()
    }

    /// `int()` of the one element (floats truncated, as Python's `int`).
    fn __int__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.one_value(py, "int() of a tensor with", PyTypeError::new_err)?;
        Ok(py.get_type::<pyo3::types::PyInt>().call1((v,))?.unbind())
    }

    /// The one element as a Python bool, int, float or complex (ValueError for
    /// another count, as NumPy's `item()`); what `fill_`/`full` take from a 0-d tensor.
    fn item(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.one_value(py, "item() of a tensor with", PyValueError::new_err)
    }

    /// `float()` of the one element (TypeError for a complex one, as Python's `float`).
    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        let v = self.one_value(py, "float() of a tensor with", PyTypeError::new_err)?;
        py.get_type::<pyo3::types::PyFloat>().call1((v,))?.extract()
    }

    /// The integer of a 0-d integer tensor, so that it can index a list or
    /// size a shape (NumPy's 0-d arrays and torch's one-element tensors do);
    /// TypeError for any other tensor.
    fn __index__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let code = self.inner.dtype().to_dlpack().code;
        if self.inner.ndim() != 0 || !matches!(code, crate::dlpack::ffi::kDLInt | crate::dlpack::ffi::kDLUInt) {
            return Err(PyTypeError::new_err(
                "only 0-d integer tensors can be converted to an index",
            ));
        }
        self.one_value(py, "__index__ of a tensor with", PyTypeError::new_err)
    }

    /// Pickling (`pickle`, `copy.deepcopy`, multiprocessing queues): the
    /// elements' bytes in C order, shape, dtype and device; unpickled on the
    /// same device (a device tensor through the host), writable, contiguous,
    /// as NumPy's and torch's pickles come back.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let t = self.inner.clone();
        let data = py.detach(|| t.to_bytes()).map_err(to_py)?;
        let rebuild = py
            .import(pyo3::intern!(py, "devtensor._devtensor"))?
            .getattr(pyo3::intern!(py, "_rebuild"))?;
        let args = (
            pyo3::types::PyBytes::new(py, &data),
            PyTuple::new(py, t.shape())?,
            t.dtype().name(),
            t.device().to_string(),
        );
        Ok((rebuild, args.into_pyobject(py)?))
    }

    /// `value in tensor`: whether any element equals `value`, a number (a
    /// Python or NumPy scalar, or a 0-d array holding one: NumPy's and torch's `(tensor == value).any()`; without it,
    /// Python compared the element views by identity: `0.0 in zeros(3)` was
    /// False). A Python number of the tensor's kind or a lower one is first
    /// rounded to the dtype, as both libraries compare (`0.1 in` a float32
    /// tensor holding 0.1 is True); others compare exactly. Device tensors
    /// are read on the host.
    fn __contains__(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        // NumPy and torch would compare a tensor key elementwise; `in` here
        // tests one value (the conversion below words other non-numbers).
        if value.is_instance_of::<PyTensor>() {
            return Err(PyTypeError::new_err("`in` takes a number, not a tensor"));
        }
        let Some((key, widen)) = contained_key(value, self.inner.dtype())? else {
            return Ok(false); // an int past the dtype's range equals no element
        };
        let flat = self.inner.contiguous().and_then(|t| t.reshape(&[-1])).map_err(to_py)?;
        let values = values::tolist(py, &flat)?;
        for v in values.bind(py).try_iter()? {
            let v = v?;
            // Integers to a float key's double, as NumPy and torch compare
            // them (2^53 + 1 equals 2.0^53 there; Python's own `==` is exact).
            let v = if widen {
                v.extract::<f64>()?.into_pyobject(py)?.into_any()
            } else {
                v
            };
            if v.eq(&key)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `complex()` of the one element.
    fn __complex__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.one_value(py, "complex() of a tensor with", PyTypeError::new_err)?;
        Ok(py.get_type::<pyo3::types::PyComplex>().call1((v,))?.unbind())
    }

    /// The values as torch prints them (`tensor([...], device='cuda:0', dtype=float16)`).
    /// Where the values cannot be read (a forked child's GPU memory, say), the
    /// shape, dtype and device, and why.
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let py = slf.py();
        let values = py.import(pyo3::intern!(py, "devtensor._format")).and_then(|m| {
            m.call_method1(pyo3::intern!(py, "tensor_repr"), (slf,))?
                .extract::<String>()
        });
        // Values that cannot be read (a device gone, a lost context) leave
        // the rest to show; a KeyboardInterrupt, SystemExit or MemoryError
        // is the caller's to see.
        let fatal = |e: &PyErr| {
            !e.is_instance_of::<pyo3::exceptions::PyException>(py)
                || e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
        };
        if let Err(e) = &values
            && fatal(e)
        {
            return values;
        }
        Ok(values.unwrap_or_else(|e| {
            let t = &slf.get().inner;
            let shape: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
            let trailing = if shape.len() == 1 { "," } else { "" };
            format!(
                "devtensor.Tensor(shape=({}{trailing}), dtype={}, device={}) <values unavailable: {e}>",
                shape.join(", "),
                t.dtype(),
                t.device()
            )
        }))
    }

    /// The elements as nested Python lists of bool, int, float (bfloat16 and
    /// float8 included) or complex; a 0-d tensor gives the scalar. Device
    /// tensors are copied to the host first.
    fn tolist(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        values::tolist(py, &self.inner)
    }

    /// This tensor in pageable host memory: itself for a CPU tensor, else a copy.
    fn cpu<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let t = slf.get().inner.clone();
        if t.device() == Device::Cpu {
            return Ok(slf.into_any());
        }
        let moved = slf.py().detach(|| t.to(Device::Cpu)).map_err(to_py)?;
        Ok(Bound::new(slf.py(), PyTensor::from(moved))?.into_any())
    }

    /// A NumPy array sharing this host tensor's memory (bfloat16 and float8
    /// as ml_dtypes types). TypeError for a device tensor, as in torch, unless
    /// `force=True`, which copies it to the host.
    #[pyo3(signature = (*, force = false))]
    fn numpy<'py>(&self, py: Python<'py>, force: bool) -> PyResult<Bound<'py, PyAny>> {
        let t = if force && !self.inner.device().is_host_accessible() {
            py.detach(|| self.inner.to(Device::Cpu)).map_err(to_py)?
        } else {
            self.inner.clone()
        };
        values::to_numpy(py, &t, None, Some(false))
    }

    /// NumPy 2's `__array__(dtype=None, copy=None)`: no copy unless `copy=True`
    /// or a `dtype` conversion needs one (ValueError for that with `copy=False`).
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        values::to_numpy(py, &self.inner, dtype, copy)
    }

    /// NumPy's array interface (v3) for host memory of NumPy's own dtypes
    /// (AttributeError otherwise). NumPy reads it before `__array__`, and it
    /// can only call bfloat16, float8 or complex32 raw bytes (`"<V2"`):
    /// without it `np.asarray` takes `__array__`, which gives ml_dtypes'
    /// types (and complex32's TypeError), as `numpy()` does.
    #[getter(__array_interface__)]
    fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let Some(ts) = array_interface::typestr(self.inner.dtype()) else {
            return Err(PyAttributeError::new_err(format!(
                "NumPy's array interface has no {} type: np.asarray(t) and t.numpy() use __array__ (ml_dtypes)",
                self.inner.dtype()
            )));
        };
        array_interface::array_interface(py, &self.inner, &ts)
    }

    /// JAX's conversion hook, which `jnp.asarray(t)` and `jnp.array(t)` call
    /// (JAX's other functions refuse it: convert first): the tensor as a `jax.Array`
    /// through DLPack, sharing its memory where JAX keeps the buffer (a copy
    /// first of layouts XLA's import refuses: anything but a transpose of a
    /// dense one, which JAX cannot tell from a shared buffer, so
    /// `jnp.asarray(t, copy=False)` copies those too). Without it JAX asks
    /// NumPy for the dtype of `.dtype`, a string, which NumPy 2.4 refuses
    /// with a ValueError JAX does not catch.
    fn __jax_array__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let t = &slf.get().inner;
        let src = if crate::layout::is_dense_permutation(t.shape(), t.strides()) {
            slf.clone().into_any()
        } else {
            Bound::new(py, PyTensor::clone(slf.get(), py)?)?.into_any()
        };
        py.import(pyo3::intern!(py, "jax.dlpack"))?
            .call_method1(pyo3::intern!(py, "from_dlpack"), (src,))
    }

    /// The CUDA Array Interface (v3) for CUDA device and managed memory of
    /// NumPy's dtypes (AttributeError otherwise, so `hasattr` is False):
    /// `stream` is the stream devtensor's work on the data was queued on (the
    /// current stream; 1 for the legacy default).
    #[getter(__cuda_array_interface__)]
    fn cuda_array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        array_interface::cuda_array_interface(py, &self.inner)
    }

    /// Marks the memory as used by work queued on `stream` (torch's
    /// `record_stream`): it is not reused for other work before that is done.
    #[cfg(feature = "cuda")]
    fn record_stream(&self, stream: &Bound<'_, crate::python::streams::PyStream>) -> PyResult<()> {
        let s = stream.get();
        match self.inner.device() {
            Device::Cuda(i) | Device::CudaManaged(i) if i == s.ordinal() => {
                self.inner.storage().record_stream(s.stream_handle());
                Ok(())
            }
            d => Err(PyValueError::new_err(format!(
                "record_stream: a stream of cuda:{} cannot record a tensor on {d}",
                s.ordinal()
            ))),
        }
    }

    /// Basic indexing: ints, slices (any step), `...` and `None`; returns a view.
    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let items: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(t) => t.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        // Each key read once: an `__index__` runs once, and its own error
        // (KeyboardInterrupt included) reaches the caller as raised.
        let keys = items.iter().map(index_key).collect::<PyResult<Vec<_>>>()?;
        let consuming = keys.iter().filter(|k| matches!(k, Key::Slice(_) | Key::Int(_))).count();
        let ellipses = keys.iter().filter(|k| matches!(k, Key::Ellipsis)).count();
        if ellipses > 1 {
            return Err(PyIndexError::new_err(
                "an index can only have a single ellipsis ('...')",
            ));
        }
        let ndim = self.inner.ndim();
        if consuming > ndim {
            return Err(PyIndexError::new_err(format!(
                "too many indices: tensor is {ndim}-dimensional, but {consuming} were indexed"
            )));
        }
        let mut t = self.inner.clone();
        // `dim` counts the view's dimensions so far, `axis` this tensor's (an
        // IndexError names the latter, as NumPy's and torch's do).
        let (mut dim, mut axis): (isize, usize) = (0, 0);
        for k in keys {
            match k {
                Key::New => {
                    t = t.unsqueeze(dim).map_err(to_py)?;
                    dim += 1;
                }
                Key::Ellipsis => {
                    dim += (ndim - consuming) as isize;
                    axis += ndim - consuming;
                }
                Key::Slice(s) => {
                    let part = |name: &str| slice_part(&s.getattr(name)?);
                    let step = part("step")?.unwrap_or(1);
                    if step == 0 {
                        return Err(PyValueError::new_err("slice step cannot be zero"));
                    }
                    // A step of -isize::MAX at the least, as CPython clamps it.
                    let step = step.max(-isize::MAX);
                    t = t.slice(dim, part("start")?, part("stop")?, step).map_err(to_py)?;
                    dim += 1;
                    axis += 1;
                }
                Key::Int(i) => {
                    t = t
                        .select(dim, i)
                        .map_err(|e| match e {
                            Error::IndexOutOfRange { index, size, .. } => {
                                Error::IndexOutOfRange { index, dim: axis, size }
                            }
                            e => e,
                        })
                        .map_err(to_py)?;
                    axis += 1;
                }
            }
        }
        Ok(PyTensor::from(t))
    }

    /// Reorders dimensions (a view).
    #[pyo3(signature = (*dims))]
    fn permute(&self, dims: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        wrap(self.inner.permute(&dims_arg(dims)?))
    }

    /// Swaps two dimensions (a view).
    fn transpose(&self, dim0: isize, dim1: isize) -> PyResult<PyTensor> {
        wrap(self.inner.transpose(dim0, dim1))
    }

    /// A view with the new shape when strides allow, else a copy (one -1 inferred).
    #[pyo3(signature = (*shape))]
    fn reshape(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        wrap(self.inner.reshape(&dims_arg(shape)?))
    }

    /// `self` if C-contiguous, else a C-contiguous copy.
    fn contiguous(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let t = &self.inner;
        wrap(detach_unless_small_cpu(py, &[t.device()], t.nbytes(), || {
            t.contiguous()
        }))
    }

    /// A new C-contiguous copy.
    fn clone(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let t = &self.inner;
        wrap(detach_unless_small_cpu(py, &[t.device()], t.nbytes(), || {
            t.contiguous_copy()
        }))
    }

    /// Copies `src` (a Tensor or any DLPack producer, broadcast to this
    /// shape) into `self`; returns `self`.
    fn copy_<'py>(slf: Bound<'py, Self>, src: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let src = consumer::from_dlpack(src, None, None)?;
        let dst = slf.get().inner.clone();
        // Broadcast as NumPy's copyto and torch's copy_: a source of fewer
        // dims, or of length 1 where the destination's are longer, repeats.
        let src = if src.shape() == dst.shape() {
            src
        } else {
            let shape: Vec<isize> = dst.shape().iter().map(|&d| d as isize).collect();
            src.expand(&shape).map_err(|_| {
                PyValueError::new_err(format!(
                    "copy_: a source of shape {:?} does not broadcast to {:?}",
                    src.shape(),
                    dst.shape()
                ))
            })?
        };
        let devices = [dst.device(), src.device()];
        detach_unless_small_cpu(slf.py(), &devices, dst.nbytes(), || dst.copy_from(&src)).map_err(to_py)?;
        Ok(slf)
    }

    /// Writes `value` to every element; returns `self`.
    fn fill_<'py>(slf: Bound<'py, Self>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let t = slf.get().inner.clone();
        let bytes = scalar_bytes(value, t.dtype())?;
        detach_unless_small_cpu(slf.py(), &[t.device()], t.nbytes(), || t.fill_bytes(&bytes)).map_err(to_py)?;
        Ok(slf)
    }

    /// This tensor on `device` (itself when already there, else a copy).
    fn to<'py>(slf: Bound<'py, Self>, device: DeviceArg) -> PyResult<Bound<'py, PyAny>> {
        let t = slf.get().inner.clone();
        let device = device.resolve_py(slf.py())?; // "cuda": the thread's current GPU
        if t.device() == device {
            return Ok(slf.into_any());
        }
        let moved = slf.py().detach(|| t.to(device)).map_err(to_py)?;
        Ok(Bound::new(slf.py(), PyTensor::from(moved))?.into_any())
    }

    /// `(device_type, device_id)` as DLPack spells them.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.inner.device().to_dlpack();
        (d.device_type, d.device_id)
    }

    /// The static DLPackExchangeAPI v1.3 table, as a `"dlpack_exchange_api"` capsule.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
        exchange::capsule(py)
    }
}

impl PyTensor {
    /// `__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)`:
    /// a `"dltensor"` capsule when `max_version` is None or below 1, a
    /// `"dltensor_versioned"` one otherwise. Python reaches it through
    /// [`super::dlpack_method`], which parses the keywords itself.
    pub(crate) fn dlpack<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let device = self.inner.device();
        let stream = check_stream(device, stream)?;
        let version: Option<(u32, u32)> = match max_version.filter(|v| !v.is_none()) {
            None => None,
            Some(v) => Some(int_pair(v).ok_or_else(|| {
                PyBufferError::new_err("max_version must be a (major, minor) tuple of non-negative ints")
            })?),
        };
        // The array API's `copy: Optional[bool]` (NumPy's bool too, which
        // consumers pass on as their callers gave it): a string ("yes",
        // "never") or a number is a caller's mistake, not a request to copy.
        let copy: Option<bool> = match copy.filter(|c| !c.is_none()) {
            None => None,
            Some(c) => Some(c.extract::<bool>().map_err(|_| {
                PyValueError::new_err(format!(
                    "copy must be True, False or None, not {}",
                    c.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
                ))
            })?),
        };
        // Where the consumer wants the data: our device, or the host.
        let (mut as_host_view, mut to_host) = (false, false);
        if let Some(target) = dl_device.filter(|d| !d.is_none()) {
            let (ty, id): (i32, i32) = int_pair(target)
                .ok_or_else(|| PyBufferError::new_err("dl_device must be a (device_type, device_id) tuple of ints"))?;
            let own = device.to_dlpack();
            if (ty, id) == (own.device_type, own.device_id) {
            } else if (ty, id) == (kDLCPU, 0) && device.is_host_accessible() {
                as_host_view = true; // pinned or managed memory: the host reads it in place
            } else if (ty, id) == (kDLCPU, 0) {
                if copy == Some(false) {
                    return Err(PyBufferError::new_err(format!(
                        "exporting a {device} tensor to the CPU needs a copy, but copy=False"
                    )));
                }
                to_host = true;
            } else {
                return Err(PyBufferError::new_err(format!(
                    "cannot export a {device} tensor to device ({ty}, {id})"
                )));
            }
        }
        let copied = if to_host {
            Some(py.detach(|| self.inner.to(Device::Cpu)).map_err(to_py)?)
        } else if copy == Some(true) {
            let t = &self.inner;
            Some(detach_unless_small_cpu(py, &[t.device()], t.nbytes(), || t.contiguous_copy()).map_err(to_py)?)
        } else {
            None
        };
        let is_copied = copied.is_some();
        let tensor = copied.as_ref().unwrap_or(&self.inner);
        // The host reads managed memory in place when asked for (kDLCPU, 0),
        // and when a host consumer (NumPy) imports it as kDLCUDAManaged: such
        // consumers pass no stream.
        let host_reads = as_host_view || (matches!(tensor.device(), Device::CudaManaged(_)) && stream.is_none());
        order_for_consumer(py, tensor, stream, host_reads)?;
        // The consumer's own stream (values > 2 are handles; the default
        // streams are ordered with the pool's reuse already) is recorded on the
        // storage: its queued work keeps the memory from reuse after the deleter.
        let consumer_stream = stream.filter(|&s| s > 2 && tensor.device() != Device::Cpu).map(|s| {
            // SAFETY: a value > 2 is the consumer's live stream of this
            // device, which the DLPack protocol obliges it to pass.
            unsafe { StreamHandle::from_raw(s as usize) }
        });
        let opts = ExportOptions {
            minor_version: DLPACK_MINOR_VERSION,
            is_copied,
            as_host: as_host_view,
            stream: consumer_stream,
        };
        match version {
            Some((major, minor)) if major >= 1 => {
                let minor = if major == 1 {
                    minor.min(DLPACK_MINOR_VERSION)
                } else {
                    DLPACK_MINOR_VERSION
                };
                let m = tensor.to_dlpack_versioned(ExportOptions {
                    minor_version: minor,
                    ..opts
                });
                capsule::versioned(py, m)
            }
            _ => {
                let m = tensor.to_dlpack_legacy_with(opts).map_err(|_| {
                    PyBufferError::new_err("a read-only tensor cannot be exported as a legacy DLPack capsule: pass max_version=(1, 0) or later")
                })?;
                capsule::legacy(py, m)
            }
        }
    }
}

/// One item of an index, as `__getitem__` applies it.
enum Key<'py> {
    /// `None`: a new dim of length 1.
    New,
    Ellipsis,
    Slice(Bound<'py, PySlice>),
    /// An int or an `__index__` object.
    Int(isize),
}

fn index_key<'py>(k: &Bound<'py, PyAny>) -> PyResult<Key<'py>> {
    let py = k.py();
    if k.is_none() {
        return Ok(Key::New);
    }
    if k.is_instance_of::<PyEllipsis>() {
        return Ok(Key::Ellipsis);
    }
    if let Ok(s) = k.cast::<PySlice>() {
        return Ok(Key::Slice(s.clone()));
    }
    let invalid = || PyIndexError::new_err("only integers, slices (`:`), ellipsis (`...`) and None are valid indices");
    if k.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid());
    }
    match k.extract::<isize>() {
        Ok(i) => Ok(Key::Int(i)),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => Err(invalid()),
        // NumPy's words: an int past isize is out of every dim's range.
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => Err(PyIndexError::new_err(format!(
            "cannot fit {k} into an index-sized integer"
        ))),
        Err(e) => Err(e),
    }
}
