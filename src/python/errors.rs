//! `devtensor::Error` → the Python exception the DLPack and array-API specs name.

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};

use crate::error::Error;

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
