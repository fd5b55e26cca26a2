//! `Tensor.__dlpack__` as a plain `METH_FASTCALL | METH_KEYWORDS` C function.
//!
//! Every DLPack consumer calls `__dlpack__` with keywords (torch passes
//! `max_version=(1, 0)`). PyO3 matches each keyword by its UTF-8 text, which
//! made `torch.from_dlpack(devtensor)` slower than `torch.from_dlpack(numpy)`
//! (the abi3-py39 build paid 0.15–0.2 µs a call for it); see `fastcall`.

use std::ffi::CStr;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::fastcall::{Args, MethodDef, Signature};
use super::tensor::PyTensor;

/// The keywords `__dlpack__` takes, in the order [`PyTensor::dlpack`] takes them.
static SIGNATURE: Signature<4> = Signature::new("__dlpack__", ["stream", "max_version", "dl_device", "copy"], 0, 0);

const DOC: &CStr = c"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)
--

Exports the tensor as a DLPack capsule: \"dltensor\" when max_version is None or
below (1, 0), \"dltensor_versioned\" otherwise. stream: the consumer's stream
(CUDA: None/1 legacy default, 2 per-thread default, -1 no sync; ROCm: None/0
default); dl_device=(1, 0) asks for a host copy of a device tensor; copy=True
always copies, copy=False never does.";

static DEF: MethodDef = MethodDef::fast(c"__dlpack__", dunder_dlpack_fastcall, DOC);

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

unsafe extern "C" fn dunder_dlpack_fastcall(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython's arguments to a METH_FASTCALL | METH_KEYWORDS method,
    // on an attached thread; `self` is live and borrowed for the call.
    unsafe {
        SIGNATURE.call(args, nargs, kwnames, |py, values| {
            export(Bound::from_borrowed_ptr(py, slf), values)
        })
    }
}

fn export<'py>(slf: Bound<'py, PyAny>, values: Args<'_, 'py, 4>) -> PyResult<Bound<'py, PyAny>> {
    let tensor = slf
        .cast::<PyTensor>()
        .map_err(|_| PyTypeError::new_err("__dlpack__ needs a devtensor.Tensor as self"))?;
    let [stream, max_version, dl_device, copy] = &values;
    tensor
        .get()
        .dlpack(
            slf.py(),
            stream.as_deref(),
            max_version.as_deref(),
            dl_device.as_deref(),
            copy.as_deref(),
        )
        .map(Bound::into_any)
}
