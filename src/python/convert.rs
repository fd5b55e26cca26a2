//! Python arguments → Rust values: shapes, dtypes, devices, scalars.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use crate::layout::Shape;
use crate::python::errors::to_py;
use crate::scalar::Scalar;

/// An int or a sequence of non-negative ints.
pub(crate) struct ShapeArg(pub Shape);

impl<'py> FromPyObject<'_, 'py> for ShapeArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        // Exact ints, tuples and lists first: a failed `extract` builds an
        // exception, which costs more than the whole allocation.
        let not_a_shape = || PyTypeError::new_err("shape must be an int or a sequence of ints");
        let dims: Vec<i64> = if let Ok(n) = ob.cast::<PyInt>() {
            vec![n.extract::<i64>()?]
        } else if let Ok(t) = ob.cast::<PyTuple>() {
            t.iter().map(|x| x.extract::<i64>()).collect::<PyResult<_>>()?
        } else if let Ok(l) = ob.cast::<PyList>() {
            l.iter().map(|x| x.extract::<i64>()).collect::<PyResult<_>>()?
        } else if ob.is_instance_of::<PyString>() {
            return Err(not_a_shape());
        } else if let Ok(n) = ob.extract::<i64>() {
            vec![n] // any `__index__` object (NumPy integers)
        } else {
            ob.try_iter()
                .map_err(|_| not_a_shape())?
                .map(|x| x?.extract::<i64>())
                .collect::<PyResult<_>>()?
        };
        let shape = dims
            .into_iter()
            .map(|d| usize::try_from(d).map_err(|_| PyValueError::new_err(format!("negative dimension {d} in shape"))))
            .collect::<PyResult<Shape>>()?;
        Ok(ShapeArg(shape))
    }
}

/// A dtype name (`"float32"`), a numpy dtype or scalar type, or a torch dtype.
pub(crate) struct DTypeArg(pub DType);

impl<'py> FromPyObject<'_, 'py> for DTypeArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = ob.cast::<PyString>() {
            return DType::from_name(&s.to_cow()?).map(DTypeArg).map_err(to_py);
        }
        if let Some(d) = DTYPE_OBJECTS.get(ob) {
            return Ok(DTypeArg(d));
        }
        let name: String = if let Ok(t) = ob.cast::<PyType>() {
            t.name()?.extract()? // numpy scalar types such as numpy.float32
        } else if let Ok(n) = ob.getattr("name").and_then(|n| n.extract::<String>()) {
            n // numpy.dtype
        } else {
            ob.str()?.extract()? // torch.float32 → "torch.float32"
        };
        let dtype = DType::from_name(&name).map_err(to_py)?;
        DTYPE_OBJECTS.insert(ob, dtype);
        Ok(DTypeArg(dtype))
    }
}

/// dtype objects already parsed (`torch.float32`, `numpy.dtype("int8")`,
/// `numpy.float16`), by identity: parsing one costs a failed attribute lookup
/// and a `str()`, about 0.8 µs, as much as the allocation it describes. Each
/// entry holds a reference, so its object stays alive and its address cannot
/// be reused by another; at most [`DTYPE_OBJECTS_MAX`] are kept.
static DTYPE_OBJECTS: DTypeObjects = DTypeObjects(std::sync::Mutex::new(Vec::new()));

const DTYPE_OBJECTS_MAX: usize = 64;

struct DTypeObjects(std::sync::Mutex<Vec<(Py<PyAny>, DType)>>);

impl DTypeObjects {
    fn get(&self, ob: Borrowed<'_, '_, PyAny>) -> Option<DType> {
        let cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.iter().find(|(o, _)| o.as_ptr() == ob.as_ptr()).map(|&(_, d)| d)
    }

    fn insert(&self, ob: Borrowed<'_, '_, PyAny>, dtype: DType) {
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() < DTYPE_OBJECTS_MAX && !cache.iter().any(|(o, _)| o.as_ptr() == ob.as_ptr()) {
            cache.push((ob.to_owned().unbind(), dtype));
        }
    }
}

/// `"cpu"`, `"cuda:1"`, ..., a `(device_type, device_id)` pair, or anything whose
/// `str()` is one of those (a `torch.device`).
#[derive(Default)]
pub(crate) struct DeviceArg(pub Device);

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
            return Ok(DeviceArg(device));
        }
        if let Ok(s) = ob.cast::<PyString>() {
            return s.to_cow()?.parse::<Device>().map(DeviceArg).map_err(to_py);
        }
        let s: String = ob.str()?.extract()?; // a torch.device, ...
        s.parse::<Device>().map(DeviceArg).map_err(to_py)
    }
}

/// The dtype torch's `full` infers from a Python scalar.
pub(crate) fn infer_dtype(value: &Bound<'_, PyAny>) -> PyResult<DType> {
    if value.is_instance_of::<PyBool>() {
        Ok(DType::Bool)
    } else if value.is_instance_of::<PyInt>() {
        Ok(DType::I64)
    } else if value.is_instance_of::<PyFloat>() {
        Ok(DType::F32)
    } else if value.is_instance_of::<PyComplex>() {
        Ok(DType::C64)
    } else {
        Err(PyTypeError::new_err("fill_value must be a bool, int, float or complex"))
    }
}

/// A Python scalar (bool, int or any `__index__` object, float, complex, or
/// anything with `__float__`, such as NumPy scalars).
pub(crate) fn scalar(value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    if value.is_instance_of::<PyBool>() {
        return Ok(Scalar::Bool(value.is_truthy()?));
    }
    if let Ok(c) = value.cast::<PyComplex>() {
        return Ok(Scalar::Complex(c.real(), c.imag()));
    }
    if value.is_instance_of::<PyInt>() || value.hasattr("__index__")? {
        return value
            .extract::<i128>()
            .map(Scalar::Int)
            .map_err(|_| PyOverflowError::new_err("integer fill value out of range"));
    }
    if value.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("fill value must be a number, not a str"));
    }
    value
        .extract::<f64>()
        .map(Scalar::Float)
        .map_err(|_| PyTypeError::new_err(format!("fill value must be a number, not {}", value.get_type())))
}

/// The raw bytes of `value` as one element of `dtype` (native byte order).
pub(crate) fn scalar_bytes(value: &Bound<'_, PyAny>, dtype: DType) -> PyResult<Vec<u8>> {
    let s = scalar(value)?;
    s.to_bytes(dtype).map_err(|e| match (e, s) {
        (
            Error::InvalidScalar {
                reason: "out of range", ..
            },
            _,
        ) => PyOverflowError::new_err(format!("value does not fit {dtype}")),
        (e, _) => to_py(e),
    })
}
