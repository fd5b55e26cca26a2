//! `Tensor.__dlpack__` as a plain `METH_VARARGS | METH_KEYWORDS` C function.
//!
//! Every DLPack consumer calls `__dlpack__` with keywords (torch passes
//! `max_version=(1, 0)`). PyO3 matches each keyword by its UTF-8 text, which
//! made `torch.from_dlpack(devtensor)` slower than `torch.from_dlpack(numpy)`
//! (the abi3-py39 build paid 0.15–0.2 µs a call for it). Here keyword names
//! are matched by identity with interned strings (CPython interns the names at
//! call sites), as NumPy's C method does, and the call comes as a vector
//! (`METH_FASTCALL`), with no tuple or dict built for it.

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::{PySystemError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyTuple};

use super::tensor::PyTensor;

/// The keywords `__dlpack__` takes, in the order [`PyTensor::dlpack`] takes them.
const KEYWORDS: [&str; 4] = ["stream", "max_version", "dl_device", "copy"];

const DOC: &CStr = c"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)
--

Exports the tensor as a DLPack capsule: \"dltensor\" when max_version is None or
below (1, 0), \"dltensor_versioned\" otherwise. stream: the consumer's stream
(CUDA: None/1 legacy default, 2 per-thread default, -1 no sync; ROCm: None/0
default); dl_device=(1, 0) asks for a host copy of a device tensor; copy=True
always copies, copy=False never does.";

/// A method table entry. CPython only reads it, from any thread.
struct MethodDef(ffi::PyMethodDef);
// SAFETY: the definition is immutable and its pointers are to 'static data.
unsafe impl Sync for MethodDef {}

/// `PyCFunctionFastWithKeywords` (the `METH_FASTCALL | METH_KEYWORDS` form).
type FastWithKeywords = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *const *mut ffi::PyObject,
    ffi::Py_ssize_t,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

/// Arguments as a vector and a tuple of keyword names.
static DEF: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"__dlpack__".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        // SAFETY: the union only stores the pointer; CPython calls it with the
        // signature `ml_flags` names (METH_FASTCALL | METH_KEYWORDS), which is
        // `dunder_dlpack_fastcall`'s. Function pointers all have one size.
        PyCFunctionWithKeywords: unsafe {
            std::mem::transmute::<FastWithKeywords, ffi::PyCFunctionWithKeywords>(dunder_dlpack_fastcall)
        },
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: DOC.as_ptr(),
});

/// Installs `__dlpack__` on the `Tensor` type (once, at module import).
pub(crate) fn install(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<()> {
    let py = ty.py();
    let def = &DEF;
    // SAFETY: `ty` is a live type object; the definition lives for the whole
    // process and is only read. On success we own the new descriptor reference.
    let descr = unsafe {
        let raw = ffi::PyDescr_NewMethod(ty.as_type_ptr(), (&raw const def.0).cast_mut());
        Bound::from_owned_ptr_or_err(py, raw)?
    };
    ty.setattr(pyo3::intern!(py, "__dlpack__"), descr)
}

/// Runs a parse-and-export, turning an error or a panic into a Python
/// exception: nothing unwinds into CPython.
fn trampoline<'py>(py: Python<'py>, f: impl FnOnce() -> PyResult<Bound<'py, PyAny>>) -> *mut ffi::PyObject {
    let err = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(capsule)) => return capsule.into_ptr(),
        Ok(Err(e)) => e,
        Err(_) => PySystemError::new_err("devtensor: panic in Tensor.__dlpack__ (a bug; please report it)"),
    };
    err.restore(py);
    std::ptr::null_mut()
}

unsafe extern "C" fn dunder_dlpack_fastcall(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods on an attached thread (the GIL held).
    let py = unsafe { Python::assume_attached() };
    trampoline(py, || {
        no_positional(nargs as usize)?;
        let mut values: Values<'_> = Default::default();
        // SAFETY: CPython passes a tuple of keyword names or null, borrowed.
        if let Some(names) = unsafe { Bound::from_borrowed_ptr_or_opt(py, kwnames) } {
            for (i, name) in names.cast::<PyTuple>()?.iter().enumerate() {
                // SAFETY: the vector holds `nargs` positional values, then one
                // value per keyword name, all live and borrowed for the call.
                let value = unsafe { Bound::from_borrowed_ptr(py, *args.add(nargs as usize + i)) };
                values[slot(&name)?] = Some(value);
            }
        }
        // SAFETY: CPython passes a live `self`, borrowed for the call.
        export(unsafe { Bound::from_borrowed_ptr(py, slf) }, values)
    })
}

/// The keyword values, in [`KEYWORDS`] order.
type Values<'py> = [Option<Bound<'py, PyAny>>; 4];

fn no_positional(n: usize) -> PyResult<()> {
    if n == 0 {
        return Ok(());
    }
    Err(PyTypeError::new_err(
        "__dlpack__() takes no positional arguments (use stream=, max_version=, dl_device=, copy=)",
    ))
}

/// Which of [`KEYWORDS`] `name` is: by identity with the interned name first
/// (call-site names are interned), by value otherwise.
fn slot(name: &Bound<'_, PyAny>) -> PyResult<usize> {
    static INTERNED: PyOnceLock<[Py<PyString>; 4]> = PyOnceLock::new();
    let py = name.py();
    let interned = INTERNED.get_or_init(py, || KEYWORDS.map(|k| PyString::intern(py, k).unbind()));
    if let Some(i) = interned.iter().position(|k| k.as_ptr() == name.as_ptr()) {
        return Ok(i);
    }
    let text = name.cast::<PyString>().ok().and_then(|s| s.to_cow().ok());
    text.as_deref()
        .and_then(|t| KEYWORDS.iter().position(|k| *k == t))
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "__dlpack__() got an unexpected keyword argument '{}'",
                text.as_deref().unwrap_or("?")
            ))
        })
}

fn export<'py>(slf: Bound<'py, PyAny>, values: Values<'py>) -> PyResult<Bound<'py, PyAny>> {
    let tensor = slf
        .cast::<PyTensor>()
        .map_err(|_| PyTypeError::new_err("__dlpack__ needs a devtensor.Tensor as self"))?;
    let [stream, max_version, dl_device, copy] = &values;
    tensor
        .get()
        .dlpack(
            slf.py(),
            stream.as_ref(),
            max_version.as_ref(),
            dl_device.as_ref(),
            copy.as_ref(),
        )
        .map(Bound::into_any)
}
