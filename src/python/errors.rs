//! `devtensor::Error` → the Python exception the DLPack and array-API specs name.

use pyo3::exceptions::{PyBufferError, PyIndexError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::Error;

/// `devtensor.AxisError`: a dimension out of range, both a ValueError and an
/// IndexError, as NumPy's `AxisError` (torch raises IndexError): whichever a
/// caller catches, it is caught. Built once, as NumPy builds its own.
pub(crate) fn axis_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static AXIS_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    AXIS_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(py, [py.get_type::<PyValueError>(), py.get_type::<PyIndexError>()])?;
            let namespace = PyDict::new(py);
            namespace.set_item("__module__", "devtensor")?;
            namespace.set_item(
                "__doc__",
                "A dimension out of range: both a ValueError and an IndexError, as NumPy's AxisError.",
            )?;
            let ty = py.get_type::<PyType>().call1(("AxisError", bases, namespace))?;
            Ok::<_, PyErr>(ty.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// Maps an error to its Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        // A framework's allocator named its error: raise that kind, its message.
        Error::ForeignAlloc { kind, message } => match kind.as_str() {
            "MemoryError" => PyMemoryError::new_err(message),
            "BufferError" => PyBufferError::new_err(message),
            "TypeError" => PyTypeError::new_err(message),
            "ValueError" => PyValueError::new_err(message),
            "IndexError" => PyIndexError::new_err(message),
            _ => PyRuntimeError::new_err(format!("{kind}: {message}")),
        },
        Error::OutOfMemory { .. } => PyMemoryError::new_err(msg),
        Error::DLPack(_) | Error::UnsupportedDType { .. } | Error::ReadOnly => PyBufferError::new_err(msg),
        Error::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        Error::DimOutOfRange { .. } => Python::attach(|py| match axis_error(py) {
            Ok(ty) => PyErr::from_type(ty.clone(), msg),
            Err(e) => e,
        }),
        Error::UnknownDTypeName(_) | Error::DTypeMismatch { .. } => PyTypeError::new_err(msg),
        Error::BackendUnavailable { .. }
        | Error::Driver { .. }
        | Error::KernelCompile { .. }
        | Error::MissingKernel(_)
        | Error::Internal(_)
        | Error::ForkedChild { .. } => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}
