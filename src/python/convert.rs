//! Python arguments → Rust values: shapes, dtypes, devices, scalars.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyString, PyTuple};

use crate::device::Device;
use crate::dtype::DType;
use crate::layout::Shape;
use crate::python::errors::to_py;

/// An int or a sequence of non-negative ints.
pub(crate) struct ShapeArg(pub Shape);

impl<'py> FromPyObject<'_, 'py> for ShapeArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let dims: Vec<i64> = if ob.is_instance_of::<PyInt>() {
            vec![ob.extract()?]
        } else if ob.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err("shape must be an int or a sequence of ints"));
        } else {
            ob.try_iter()
                .map_err(|_| PyTypeError::new_err("shape must be an int or a sequence of ints"))?
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
        let name: String = if let Ok(s) = ob.extract::<String>() {
            s
        } else if let Ok(n) = ob.getattr("name").and_then(|n| n.extract::<String>()) {
            n // numpy.dtype
        } else if let Ok(n) = ob.getattr("__name__").and_then(|n| n.extract::<String>()) {
            n // numpy scalar types such as numpy.float32
        } else {
            ob.str()?.extract()? // torch.float32 → "torch.float32"
        };
        DType::from_name(&name).map(DTypeArg).map_err(to_py)
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
            return Device::from_dlpack(dl)
                .map(DeviceArg)
                .map_err(|e| PyValueError::new_err(e.to_string()));
        }
        let s: String = match ob.extract::<String>() {
            Ok(s) => s,
            Err(_) => ob.str()?.extract()?,
        };
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

fn int_bytes<T: TryFrom<i128> + Copy>(v: i128, dtype: DType, to_le: impl Fn(T) -> Vec<u8>) -> PyResult<Vec<u8>> {
    T::try_from(v)
        .map(to_le)
        .map_err(|_| PyOverflowError::new_err(format!("value {v} does not fit {dtype}")))
}

/// The raw bytes of `value` as one element of `dtype` (native byte order).
pub(crate) fn scalar_bytes(value: &Bound<'_, PyAny>, dtype: DType) -> PyResult<Vec<u8>> {
    let as_f64 = || -> PyResult<f64> { value.extract::<f64>() };
    let as_int = || -> PyResult<i128> {
        if value.is_instance_of::<PyFloat>() || value.is_instance_of::<PyComplex>() {
            let f = value.extract::<f64>()?;
            if f.fract() != 0.0 || !f.is_finite() {
                return Err(PyValueError::new_err(format!("cannot fill an integer tensor with {f}")));
            }
            return Ok(f as i128);
        }
        value.extract::<i128>()
    };
    Ok(match dtype {
        DType::Bool => vec![u8::from(value.is_truthy()?)],
        DType::I8 => int_bytes::<i8>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::I16 => int_bytes::<i16>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::I32 => int_bytes::<i32>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::I64 => int_bytes::<i64>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::U8 => int_bytes::<u8>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::U16 => int_bytes::<u16>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::U32 => int_bytes::<u32>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::U64 => int_bytes::<u64>(as_int()?, dtype, |x| x.to_ne_bytes().to_vec())?,
        DType::F16 => half::f16::from_f64(as_f64()?).to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(as_f64()?).to_ne_bytes().to_vec(),
        DType::F32 => (as_f64()? as f32).to_ne_bytes().to_vec(),
        DType::F64 => as_f64()?.to_ne_bytes().to_vec(),
        DType::C32 | DType::C64 | DType::C128 => {
            let (re, im) = match value.cast::<PyComplex>() {
                Ok(c) => (c.real(), c.imag()),
                Err(_) => (as_f64()?, 0.0),
            };
            match dtype {
                DType::C32 => [
                    half::f16::from_f64(re).to_ne_bytes(),
                    half::f16::from_f64(im).to_ne_bytes(),
                ]
                .concat(),
                DType::C64 => [(re as f32).to_ne_bytes(), (im as f32).to_ne_bytes()].concat(),
                _ => [re.to_ne_bytes(), im.to_ne_bytes()].concat(),
            }
        }
        // float8 formats: exact zero is all-zero bits in every format that has a zero.
        other if other != DType::F8E8M0Fnu && as_f64()? == 0.0 => vec![0u8],
        other => {
            return Err(PyValueError::new_err(format!(
                "filling {other} with a Python scalar is not supported yet (only 0 for float8 types)"
            )));
        }
    })
}
