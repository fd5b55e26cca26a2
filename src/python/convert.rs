//! Python arguments → Rust values: shapes, dtypes, devices, scalars.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::device::{Device, DeviceSpec};
use crate::dtype::DType;
use crate::error::Error;
use crate::layout::{self, Shape};
use crate::python::errors::to_py;
use crate::scalar::{COMPLEX_INTO_REAL, Scalar};

/// An int or a sequence of non-negative ints.
pub(crate) struct ShapeArg(pub Shape);

impl<'py> FromPyObject<'_, 'py> for ShapeArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        // Exact ints, tuples and lists first, straight into the inline shape (no
        // heap): a failed `extract` builds an exception, which costs more than
        // the whole allocation.
        let shape: Shape = if let Ok(n) = ob.cast::<PyInt>() {
            std::iter::once(dim(n.as_any())).collect::<PyResult<_>>()?
        } else if let Ok(t) = ob.cast::<PyTuple>() {
            check_ndim(t.len())?;
            let mut shape = Shape::new();
            for x in t.iter_borrowed() {
                shape.push(dim(&x)?);
            }
            shape
        } else if let Ok(l) = ob.cast::<PyList>() {
            check_ndim(l.len())?;
            l.iter().map(|x| dim(&x)).collect::<PyResult<_>>()?
        } else if ob.is_instance_of::<PyString>() {
            return Err(not_a_shape());
        } else {
            match ob.extract::<i64>() {
                // Any `__index__` object (NumPy integers).
                Ok(_) => std::iter::once(dim(&ob)).collect::<PyResult<_>>()?,
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(ob.py()) => {
                    return Err(too_large(&ob, e)); // a NumPy uint64 past i64
                }
                Err(_) => sequence_shape(&ob)?,
            }
        };
        Ok(ShapeArg(shape))
    }
}

fn not_a_shape() -> PyErr {
    PyTypeError::new_err("shape must be an int or a sequence of ints")
}

/// The dimension limit's error before any dimension is read: a shape is
/// never read (nor its dims stored) past [`MAX_NDIM`](crate::layout::MAX_NDIM).
fn check_ndim(ndim: usize) -> PyResult<()> {
    layout::check_ndim(ndim).map_err(to_py)
}

/// A shape from any other sequence (a `range`, a NumPy array of ints, ...),
/// as NumPy reads one: its length first, then that many items. Iterators,
/// generators, sets and mappings are refused, as NumPy refuses them: one
/// without end (`itertools.repeat(1)`) grew the shape until the process ran
/// out of memory, and a set's order is not the caller's.
fn sequence_shape(ob: &Bound<'_, PyAny>) -> PyResult<Shape> {
    dim_items(ob)?.iter().map(dim).collect()
}

/// The items of a sequence of dims (a shape, `permute`'s or `reshape`'s one
/// argument), its length checked against the dimension limit before any is
/// read: `permute(range(2**70))` is refused, not read until memory runs out.
/// TypeError for what is not a sequence of known length.
pub(crate) fn dim_items<'py>(ob: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    // SAFETY: `ob` is a live object and the thread is attached.
    if unsafe { ffi::PySequence_Check(ob.as_ptr()) } == 0 {
        return Err(not_a_shape());
    }
    let ndim = ob.len()?;
    check_ndim(ndim)?;
    (0..ndim).map(|i| ob.get_item(i)).collect()
}

/// One dimension of a shape: a non-negative integer.
fn dim(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    refuse_bool(x)?;
    let d = x.extract::<i64>().map_err(|e| too_large(x, e))?;
    usize::try_from(d).map_err(|_| PyValueError::new_err(format!("negative dimension {d} in shape")))
}

/// ValueError for an int past 64 bits (NumPy's "too large" for a shape, or
/// "negative" for one below), the error of `extract` for anything else.
fn too_large(x: &Bound<'_, PyAny>, e: PyErr) -> PyErr {
    if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(x.py()) {
        if x.lt(0).unwrap_or(false) {
            return PyValueError::new_err(format!("negative dimension {x} in shape"));
        }
        PyValueError::new_err(format!("dimension {x} is too large"))
    } else {
        e
    }
}

/// TypeError for a bool where a size or a dimension index goes (an int to
/// Python, but `zeros(True)` is a mistake NumPy and torch refuse).
pub(crate) fn refuse_bool(x: &Bound<'_, PyAny>) -> PyResult<()> {
    if x.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err("a size or dimension must be an int, not a bool"));
    }
    Ok(())
}

/// A dtype name (`"float32"`), a numpy dtype or scalar type, Python's
/// `float`, `int`, `complex` or `bool`, or a torch dtype.
pub(crate) struct DTypeArg(pub DType);

impl<'py> FromPyObject<'_, 'py> for DTypeArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        // Parsed before: a dtype string, `torch.float32`, `numpy.dtype("int8")`.
        if let Some(d) = DTYPE_OBJECTS.get(ob) {
            return Ok(DTypeArg(d));
        }
        let (dtype, lasting) = parse_dtype(&ob)?;
        if lasting {
            DTYPE_OBJECTS.insert(ob, dtype);
        }
        Ok(DTypeArg(dtype))
    }
}

/// What a dtype argument names, as NumPy's `dtype(ob)` and torch read it,
/// and whether `ob` may enter the identity cache: only kinds whose meaning
/// cannot change (exact strings, static types, the dtypes and scalar types
/// NumPy registers, torch dtypes). All but strings live for good anyway; a
/// string built at run time is kept alive by its entry, as the device cache
/// keeps its strings (at most [`IDENTITY_CACHE_MAX`] entries in all). Anything
/// else (an object whose `.name` or `str()` may change) is parsed on every call.
fn parse_dtype(ob: &Bound<'_, PyAny>) -> PyResult<(DType, bool)> {
    let py = ob.py();
    let from_name = |name: &str| DType::from_name(name).map_err(to_py);
    if let Ok(s) = ob.cast::<PyString>() {
        return Ok((from_name(&s.to_cow()?)?, ob.is_exact_instance_of::<PyString>()));
    }
    if let Ok(t) = ob.cast::<PyType>() {
        return type_dtype(t);
    }
    if let Some([np_dtype, _]) = numpy_types(py)?
        && ob.is_instance(np_dtype.bind(py))?
    {
        return numpy_dtype(ob);
    }
    let ty = ob.get_type();
    if ty.name().is_ok_and(|n| n == "dtype") && ty.module().is_ok_and(|m| m == "torch") {
        return Ok((from_name(&ob.str()?.to_cow()?)?, true)); // "torch.float32"
    }
    let name = match ob.getattr("name").and_then(|n| n.extract::<String>()) {
        Ok(name) => name,
        Err(_) => ob.str()?.extract::<String>()?,
    };
    Ok((from_name(&name)?, false))
}

/// The dtype a type stands for: Python's scalar types as NumPy and torch take
/// them (`float` is float64, `int` int64), NumPy's scalar types as
/// `numpy.dtype` sizes them (`longlong`, `intc`, `double`, ...), others
/// (ml_dtypes, JAX) by their name.
fn type_dtype(t: &Bound<'_, PyType>) -> PyResult<(DType, bool)> {
    let py = t.py();
    for (builtin, dtype) in [
        (py.get_type::<PyBool>(), DType::Bool),
        (py.get_type::<PyInt>(), DType::I64),
        (py.get_type::<PyFloat>(), DType::F64),
        (py.get_type::<PyComplex>(), DType::C128),
    ] {
        if t.is(&builtin) {
            return Ok((dtype, true));
        }
    }
    if let Some([np_dtype, np_generic]) = numpy_types(py)?
        && t.is_subclass(np_generic.bind(py))?
    {
        // `numpy.longlong.__name__` is "longlong": its dtype says int64.
        let d = np_dtype.bind(py).call1((t,))?;
        // NumPy holds the scalar type of each dtype it registers (ml_dtypes'
        // too) for good; not a subclass of one.
        let registered = d.getattr(pyo3::intern!(py, "type"))?.is(t);
        return Ok((numpy_dtype(&d)?.0, registered));
    }
    let dtype = DType::from_name(&t.name()?.to_cow()?).map_err(to_py)?;
    // SAFETY: `t` is a live type object and the thread is attached.
    let flags = unsafe { ffi::PyType_GetFlags(t.as_type_ptr()) };
    // A static type (a builtin's, a C extension's) can neither be renamed nor
    // freed; a class made at run time (JAX's scalar types) can.
    Ok((dtype, flags & ffi::Py_TPFLAGS_IMMUTABLETYPE != 0))
}

/// A `numpy.dtype`'s dtype, by its name; byte-swapped ones (`">f4"`, whose
/// name is "float32") are refused: a tensor's elements are in native order.
fn numpy_dtype(d: &Bound<'_, PyAny>) -> PyResult<(DType, bool)> {
    let py = d.py();
    let name = d.getattr(pyo3::intern!(py, "name"))?;
    let dtype = DType::from_name(&name.cast::<PyString>()?.to_cow()?).map_err(to_py)?;
    let swapped = if cfg!(target_endian = "little") { ">" } else { "<" };
    if d.getattr(pyo3::intern!(py, "byteorder"))?.eq(swapped)? {
        return Err(PyTypeError::new_err(format!(
            "unsupported dtype {}: not in native byte order",
            d.repr()?
        )));
    }
    // NumPy's own dtypes (`isbuiltin` 1) and registered ones (2, ml_dtypes')
    // are one object each for good; others (with metadata, ...) are made per call.
    let registered = d.getattr(pyo3::intern!(py, "isbuiltin"))?.extract::<i64>()? != 0;
    Ok((dtype, registered))
}

/// NumPy's `dtype` and `generic` types once something has imported NumPy
/// (an object can only be a NumPy dtype or scalar type then), without
/// importing it. Kept for good, as NumPy keeps them.
fn numpy_types(py: Python<'_>) -> PyResult<Option<&[Py<PyAny>; 2]>> {
    static TYPES: PyOnceLock<[Py<PyAny>; 2]> = PyOnceLock::new();
    if let Some(types) = TYPES.get(py) {
        return Ok(Some(types));
    }
    // SAFETY: a live string, on an attached thread; the result is a new
    // reference, or null: not imported (no error set) or an error.
    let np = unsafe { ffi::PyImport_GetModule(pyo3::intern!(py, "numpy").as_ptr()) };
    // SAFETY: as above.
    let Some(np) = (unsafe { Bound::from_owned_ptr_or_opt(py, np) }) else {
        return PyErr::take(py).map_or(Ok(None), Err);
    };
    // Not yet there while NumPy itself is being imported.
    let (Ok(dtype), Ok(generic)) = (np.getattr("dtype"), np.getattr("generic")) else {
        return Ok(None);
    };
    Ok(Some(TYPES.get_or_init(py, || [dtype.unbind(), generic.unbind()])))
}

/// Arguments already parsed, by identity: parsing a dtype or device costs a
/// UTF-8 copy of a string (abi3), or a failed attribute lookup and a `str()`
/// (about 0.8 µs), as much as the allocation it describes. Each entry holds a
/// reference, so its object stays alive and its address cannot be reused by
/// another; at most [`IDENTITY_CACHE_MAX`] are kept. Only immutable kinds of
/// object are entered (exact strings, the dtype objects [`parse_dtype`]
/// names, `torch.device`): another's `.name` or `str()` may change. Lookups take
/// no lock: entries are filled once, in order, and published by `len` (a
/// mutex around the list cost 20 ns of the 220 of `empty(n, dtype=...)`).
struct IdentityCache<T> {
    /// Object addresses and values; the first `len` are set.
    slots: [OnceLock<(usize, T)>; IDENTITY_CACHE_MAX],
    len: AtomicUsize,
    /// The references that keep the entered objects alive; inserts hold it.
    owners: Mutex<Vec<Py<PyAny>>>,
}

const IDENTITY_CACHE_MAX: usize = 64;

static DTYPE_OBJECTS: IdentityCache<DType> = IdentityCache::new();
static DEVICE_OBJECTS: IdentityCache<DeviceSpec> = IdentityCache::new();

impl<T: Copy> IdentityCache<T> {
    const fn new() -> Self {
        IdentityCache {
            slots: [const { OnceLock::new() }; IDENTITY_CACHE_MAX],
            len: AtomicUsize::new(0),
            owners: Mutex::new(Vec::new()),
        }
    }

    fn get(&self, ob: Borrowed<'_, '_, PyAny>) -> Option<T> {
        let at = ob.as_ptr() as usize;
        let len = self.len.load(Ordering::Acquire);
        self.slots[..len]
            .iter()
            .filter_map(OnceLock::get)
            .find(|(p, _)| *p == at)
            .map(|&(_, v)| v)
    }

    fn insert(&self, ob: Borrowed<'_, '_, PyAny>, value: T) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        let len = self.len.load(Ordering::Acquire);
        if len < IDENTITY_CACHE_MAX && self.get(ob).is_none() {
            // The reference first: the address stays this object's while the
            // entry can be found.
            owners.push(ob.to_owned().unbind());
            let _ = self.slots[len].set((ob.as_ptr() as usize, value));
            self.len.store(len + 1, Ordering::Release);
        }
    }
}

/// `"cpu"`, `"cuda:1"`, ..., a `(device_type, device_id)` pair, or anything whose
/// `str()` is one of those (a `torch.device`). `"cuda"` / `"rocm"` (no index)
/// stay unresolved until [`DeviceArg::resolve`], which asks for the calling
/// thread's current device, as torch and CuPy do.
#[derive(Default, Clone, Copy)]
pub(crate) struct DeviceArg(pub DeviceSpec);

impl DeviceArg {
    /// The device; `"cuda"` is the GPU current on the calling thread. Call it
    /// without the GIL (it may probe the driver): `py.detach` keeps the thread.
    pub(crate) fn resolve(self) -> crate::Result<Device> {
        self.0.resolve()
    }

    /// True for pageable host memory, the only device whose work never waits
    /// for a GPU, a driver or a compiler.
    pub(crate) fn is_cpu(self) -> bool {
        self.0 == DeviceSpec::Exact(Device::Cpu)
    }

    /// [`DeviceArg::resolve`], without the GIL unless the device is exact.
    pub(crate) fn resolve_py(self, py: Python<'_>) -> PyResult<Device> {
        match self.0 {
            DeviceSpec::Exact(d) => Ok(d),
            spec => py.detach(|| spec.resolve()).map_err(to_py),
        }
    }
}

impl<'py> FromPyObject<'_, 'py> for DeviceArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = ob.cast::<PyTuple>() {
            let (device_type, device_id): (i32, i32) = t.extract()?;
            let dl = crate::dlpack::ffi::DLDevice { device_type, device_id };
            let device = Device::from_dlpack(dl).map_err(|e| PyValueError::new_err(e.to_string()))?;
            if device.to_dlpack() != dl {
                return Err(PyValueError::new_err(format!(
                    "device ({device_type}, {device_id}): host memory kinds have device id 0"
                )));
            }
            return Ok(DeviceArg(DeviceSpec::Exact(device)));
        }
        if let Some(spec) = DEVICE_OBJECTS.get(ob) {
            return Ok(DeviceArg(spec));
        }
        let spec = if let Ok(s) = ob.cast::<PyString>() {
            s.to_cow()?.parse::<DeviceSpec>()
        } else {
            ob.str()?.extract::<String>()?.parse::<DeviceSpec>() // a torch.device, ...
        }
        .map_err(to_py)?;
        // Strings and torch.device objects are immutable; other objects' `str()` may change.
        let ty = ob.get_type();
        if ob.is_exact_instance_of::<PyString>()
            || ty.name().is_ok_and(|n| n == "device") && ty.module().is_ok_and(|m| m == "torch")
        {
            DEVICE_OBJECTS.insert(ob, spec);
        }
        Ok(DeviceArg(spec))
    }
}

/// The dtype torch's `full` infers from a fill value (a Python scalar, a NumPy
/// scalar or a 0-d array or tensor, by the kind of number it holds).
pub(crate) fn infer_dtype(value: &Bound<'_, PyAny>) -> PyResult<DType> {
    Ok(match scalar(value)? {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) => DType::I64,
        Scalar::Float(_) => DType::F32,
        Scalar::Complex(..) => DType::C64,
    })
}

/// A fill value: a Python bool, int (or any `__index__` object), float or
/// complex; a NumPy scalar (`np.complex64` and `np.clongdouble` keep their
/// imaginary part: they are not `complex` subclasses); or a 0-d NumPy array or
/// torch tensor, taken as the scalar it holds (as torch's `fill_` does).
pub(crate) fn scalar(value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    // Exact Python scalars first: the common case costs no attribute lookup.
    if let Some(s) = python_scalar(value)? {
        return Ok(s);
    }
    if value.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("expected a number, not a str"));
    }
    let py = value.py();
    // NumPy scalars, 0-d arrays, 0-d torch tensors: `.item()` gives the Python
    // scalar (NumPy's long double kinds give themselves back: handled below).
    if let Ok(ndim) = value.getattr(pyo3::intern!(py, "ndim")) {
        let ndim: usize = ndim.extract().unwrap_or(usize::MAX);
        if ndim != 0 {
            return Err(PyValueError::new_err(format!(
                "expected a number or a tensor holding one (0 dimensions), not {ndim} dimensions"
            )));
        }
        if let Ok(item) = value.call_method0(pyo3::intern!(py, "item"))
            && let Some(s) = python_scalar(&item)?
        {
            return Ok(s);
        }
        // The kind of number from the NumPy dtype: complex, float, integer or bool.
        if let Ok(kind) = value
            .getattr(pyo3::intern!(py, "dtype"))
            .and_then(|d| d.getattr(pyo3::intern!(py, "kind")))
            .and_then(|k| k.extract::<String>())
        {
            match kind.as_str() {
                "c" => return complex(value),
                "f" => return float(value),
                _ => {}
            }
        }
    }
    // Anything else that says what number it is.
    if value.hasattr(pyo3::intern!(py, "__index__"))? {
        // Only the range is ours to word: an error of `__index__` itself
        // (KeyboardInterrupt included) reaches the caller as it was raised.
        // Through `operator.index` first: PyO3's 128-bit extraction under
        // the limited API shifts the object itself (`>>`), which an object
        // with only `__index__` refuses.
        // SAFETY: `value` is a live object; PyNumber_Index returns a new
        // reference or NULL with an exception set, which `from_owned_ptr_or_err` takes.
        let index = unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyNumber_Index(value.as_ptr())) }?;
        return index.extract::<i128>().map(Scalar::Int).map_err(|e| {
            if e.is_instance_of::<PyOverflowError>(py) {
                PyOverflowError::new_err("integer value out of range")
            } else {
                e
            }
        });
    }
    if value.hasattr(pyo3::intern!(py, "__float__"))? {
        return float(value);
    }
    if value.hasattr(pyo3::intern!(py, "__complex__"))? {
        return complex(value);
    }
    Err(PyTypeError::new_err(format!(
        "expected a number, not {}",
        value.get_type()
    )))
}

/// Python's bool, int, float and complex (and their subclasses); `None` for others.
fn python_scalar(value: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    if value.is_instance_of::<PyBool>() {
        return Ok(Some(Scalar::Bool(value.is_truthy()?)));
    }
    if value.is_instance_of::<PyInt>() {
        return value
            .extract::<i128>()
            .map(|i| Some(Scalar::Int(i)))
            .map_err(|_| PyOverflowError::new_err("integer value out of range"));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(Some(Scalar::Float(f.value())));
    }
    if let Ok(c) = value.cast::<PyComplex>() {
        return Ok(Some(Scalar::Complex(c.real(), c.imag())));
    }
    Ok(None)
}

/// `complex(value)`, through `__complex__`.
fn complex(value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    let c = value.py().get_type::<PyComplex>().call1((value,))?;
    let c = c.cast::<PyComplex>()?;
    Ok(Scalar::Complex(c.real(), c.imag()))
}

/// `float(value)`, through `__float__`.
fn float(value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    value
        .extract::<f64>()
        .map(Scalar::Float)
        .map_err(|_| PyTypeError::new_err(format!("expected a number, not {}", value.get_type())))
}

/// The raw bytes of `value` as one element of `dtype` (native byte order).
pub(crate) fn scalar_bytes(value: &Bound<'_, PyAny>, dtype: DType) -> PyResult<Vec<u8>> {
    scalar(value)?.to_bytes(dtype).map_err(|e| match e {
        Error::InvalidScalar {
            reason: "out of range", ..
        } => PyOverflowError::new_err(format!("value does not fit {dtype}")),
        Error::InvalidScalar {
            reason: COMPLEX_INTO_REAL,
            ..
        } => PyTypeError::new_err(format!("cannot store a complex value in {dtype}: {COMPLEX_INTO_REAL}")),
        e => to_py(e),
    })
}
