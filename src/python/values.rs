//! A tensor's values as Python objects: `tolist()` and the NumPy array of
//! `numpy()` / `__array__`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyComplex, PyDict, PyList};

use crate::device::Device;
use crate::dtype::DType;
use crate::python::array_interface;
use crate::python::errors::to_py;
use crate::scalar::{Scalar, from_bytes};
use crate::tensor::Tensor;

/// `Tensor.tolist()`.
pub(crate) fn tolist(py: Python<'_>, t: &Tensor) -> PyResult<Py<PyAny>> {
    // C-contiguous host-readable memory in place (managed memory once its GPU
    // work is done); other layouts and device memory through a copy into CPU
    // memory, which waits once for managed memory's GPU work (a contiguous
    // copy on its own device would make a managed temporary and wait again).
    let host = if t.device() == Device::Cpu {
        t.contiguous()
    } else if t.is_contiguous() && array_interface::host_ready(py, t, "tolist").is_ok() {
        Ok(t.clone())
    } else {
        py.detach(|| t.to(Device::Cpu))
    }
    .map_err(to_py)?;
    let elem = host.dtype().size();
    let bytes: &[u8] = if host.nbytes() == 0 {
        &[]
    } else {
        // SAFETY: `host` is a C-contiguous view of host memory holding
        // `nbytes` bytes from `data_ptr`, alive for this function.
        unsafe { std::slice::from_raw_parts(host.data_ptr(), host.nbytes()) }
    };
    let mut items = bytes.chunks_exact(elem.max(1));
    nest(py, host.dtype(), host.shape(), &mut items)
}

fn nest<'a>(
    py: Python<'_>,
    dtype: DType,
    shape: &[usize],
    items: &mut impl Iterator<Item = &'a [u8]>,
) -> PyResult<Py<PyAny>> {
    let Some((&n, rest)) = shape.split_first() else {
        let b = items.next().ok_or_else(|| PyValueError::new_err("too few elements"))?;
        return scalar(py, from_bytes(dtype, b).map_err(to_py)?);
    };
    let list = PyList::empty(py);
    for _ in 0..n {
        list.append(nest(py, dtype, rest, items)?)?;
    }
    Ok(list.into_any().unbind())
}

fn scalar(py: Python<'_>, s: Scalar) -> PyResult<Py<PyAny>> {
    Ok(match s {
        Scalar::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any().unbind(),
        Scalar::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Scalar::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
        Scalar::Complex(re, im) => PyComplex::from_doubles(py, re, im).into_any().unbind(),
    })
}

/// A host tensor as NumPy sees it through `__array_interface__` (which keeps
/// the tensor alive as the array's base), its type string made once.
#[pyclass(module = "devtensor._devtensor", frozen)]
struct HostView {
    t: Tensor,
    typestr: String,
}

#[pymethods]
impl HostView {
    #[getter(__array_interface__)]
    fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface::array_interface(py, &self.t, &self.typestr)
    }
}

/// The NumPy array of a host tensor, zero-copy (NumPy 2 `__array__`
/// semantics for `dtype` and `copy`). bfloat16 and float8 become ml_dtypes
/// arrays; complex32 has no NumPy type (TypeError, as in torch).
pub(crate) fn to_numpy<'py>(
    py: Python<'py>,
    t: &Tensor,
    dtype: Option<&Bound<'py, PyAny>>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    if !t.device().is_host_accessible() {
        return Err(PyTypeError::new_err(format!(
            "can't convert {} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.",
            t.device()
        )));
    }
    if t.dtype() == DType::C32 {
        return Err(PyTypeError::new_err("NumPy has no complex32 type"));
    }
    let np = py.import(pyo3::intern!(py, "numpy"))?;
    let typestr = array_interface::typestr(t.dtype());
    let raw = typestr.is_none();
    let view = HostView {
        t: t.clone(),
        typestr: typestr.unwrap_or_else(|| array_interface::raw_typestr(t.dtype())),
    };
    let mut arr = np.call_method1(pyo3::intern!(py, "asarray"), (Bound::new(py, view)?,))?;
    if raw {
        let ml = py
            .import("ml_dtypes")
            .map_err(|_| PyTypeError::new_err(format!("a {} NumPy array needs the ml_dtypes package", t.dtype())))?;
        arr = arr.call_method1(pyo3::intern!(py, "view"), (ml.getattr(t.dtype().name())?,))?;
    }
    let mut copied = false;
    if let Some(d) = dtype.filter(|d| !d.is_none()) {
        let want = np.getattr(pyo3::intern!(py, "dtype"))?.call1((d,))?;
        if !arr.getattr(pyo3::intern!(py, "dtype"))?.eq(&want)? {
            if copy == Some(false) {
                return Err(PyValueError::new_err(format!(
                    "Unable to avoid copy while creating an array as requested: {} to {}",
                    t.dtype(),
                    want.str()?
                )));
            }
            arr = arr.call_method1(pyo3::intern!(py, "astype"), (want,))?;
            copied = true;
        }
    }
    if copy == Some(true) && !copied {
        arr = arr.call_method0(pyo3::intern!(py, "copy"))?;
    }
    Ok(arr)
}
