//! `devtensor::Error` → the Python exception the DLPack and array-API specs name.

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};

use crate::error::Error;

/// Maps an error to its Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::OutOfMemory { .. } => PyMemoryError::new_err(msg),
        Error::DLPack(_) | Error::UnsupportedDType { .. } | Error::ReadOnly => PyBufferError::new_err(msg),
        Error::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        Error::UnknownDTypeName(_) | Error::DTypeMismatch { .. } => PyTypeError::new_err(msg),
        Error::BackendUnavailable { .. }
        | Error::Driver { .. }
        | Error::KernelCompile { .. }
        | Error::ForkedChild { .. } => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}
