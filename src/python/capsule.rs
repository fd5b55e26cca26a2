//! DLPack PyCapsules: making them (with a destructor that frees unconsumed
//! ones) and consuming them (rename to `used_*`, then own the tensor).

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::dlpack::ManagedTensor;
use crate::dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use crate::python::errors::to_py;
use crate::tensor::Tensor;

pub(crate) const LEGACY: &CStr = c"dltensor";
pub(crate) const VERSIONED: &CStr = c"dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// Frees a versioned capsule nobody consumed; a `used_*` capsule is left alone.
unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on a live capsule. IsValid sets
    // no exception; when it holds, the pointer is the export we made, still owned
    // by the capsule (a consumer renames it first), so its deleter runs once here.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
            if let Some(del) = (*m).deleter {
                del(m);
            }
        }
    }
}

/// As [`destroy_versioned`], for the legacy capsule.
unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_versioned`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(del) = (*m).deleter {
                del(m);
            }
        }
    }
}

/// Wraps an owned versioned export in a `"dltensor_versioned"` capsule.
pub(crate) fn versioned<'py>(
    py: Python<'py>,
    m: ManagedTensor<DLManagedTensorVersioned>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let ptr = NonNull::new(m.as_ptr().cast::<c_void>()).ok_or_else(|| PyValueError::new_err("null DLPack export"))?;
    // SAFETY: `m` is a live export; the destructor frees it unless a consumer
    // renamed the capsule. On failure the capsule does not exist and `m`'s drop
    // frees the export.
    let capsule = unsafe { PyCapsule::new_with_pointer_and_destructor(py, ptr, VERSIONED, Some(destroy_versioned)) }?;
    let _owned_by_the_capsule = m.into_raw();
    Ok(capsule)
}

/// Wraps an owned legacy export in a `"dltensor"` capsule.
pub(crate) fn legacy<'py>(py: Python<'py>, m: ManagedTensor<DLManagedTensor>) -> PyResult<Bound<'py, PyCapsule>> {
    let ptr = NonNull::new(m.as_ptr().cast::<c_void>()).ok_or_else(|| PyValueError::new_err("null DLPack export"))?;
    // SAFETY: as in `versioned`.
    let capsule = unsafe { PyCapsule::new_with_pointer_and_destructor(py, ptr, LEGACY, Some(destroy_legacy)) }?;
    let _owned_by_the_capsule = m.into_raw();
    Ok(capsule)
}

/// Consumes a DLPack capsule: validates the name, takes the pointer, renames
/// it to `used_*`, then imports (the deleter runs exactly once from here on).
pub(crate) fn consume(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let cap = obj
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("expected a DLPack PyCapsule"))?;
    let raw = cap.as_ptr();
    // SAFETY: `raw` is a live capsule (we hold a reference) and the GIL is held.
    unsafe {
        if ffi::PyCapsule_IsValid(raw, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(raw, VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
            if ffi::PyCapsule_SetName(raw, USED_VERSIONED.as_ptr()) != 0 {
                return Err(PyErr::fetch(obj.py()));
            }
            return crate::dlpack::from_dlpack_versioned(m).map_err(to_py);
        }
        if ffi::PyCapsule_IsValid(raw, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(raw, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if ffi::PyCapsule_SetName(raw, USED_LEGACY.as_ptr()) != 0 {
                return Err(PyErr::fetch(obj.py()));
            }
            return crate::dlpack::from_dlpack_legacy(m).map_err(to_py);
        }
        if ffi::PyCapsule_IsValid(raw, USED_VERSIONED.as_ptr()) == 1
            || ffi::PyCapsule_IsValid(raw, USED_LEGACY.as_ptr()) == 1
        {
            return Err(PyValueError::new_err("this DLPack capsule was already consumed"));
        }
    }
    Err(PyTypeError::new_err(
        "expected a PyCapsule named \"dltensor\" or \"dltensor_versioned\"",
    ))
}
