//! Host memory that an object exports through the buffer protocol (`bytes`,
//! `bytearray`, `array.array`, a `memoryview`), for array interfaces whose
//! `data` is such an object, or absent (the object's own buffer), as
//! Pillow's images give theirs.
//!
//! The limited API of Python 3.10, the abi3 wheel's floor, leaves
//! `PyObject_GetBuffer` and `PyBuffer_Release` out; every CPython 3 exports
//! both, and 3.11 added them to the stable ABI with this same `Py_buffer`
//! (CPython's `Include/pybuffer.h`, unchanged since 3.3). Linux and macOS
//! resolve the symbols from the interpreter at load time; a Windows build for
//! 3.10 could not (its `python3.dll` exports the limited API only).
//!
//! The memoryview asks for a read-only-capable buffer (`PyBUF_FULL_RO`), so
//! an exporter that hands out writable memory only when asked for it is
//! imported read-only: the safe side.

use std::ffi::{c_char, c_int, c_void};

use pyo3::ffi::{Py_ssize_t, PyObject};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;

/// CPython's `Py_buffer`.
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: Py_ssize_t,
    itemsize: Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut Py_ssize_t,
    strides: *mut Py_ssize_t,
    suboffsets: *mut Py_ssize_t,
    internal: *mut c_void,
}

unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
}

/// `PyBUF_SIMPLE`: C-contiguous bytes, writable or not (the exporter says).
const PYBUF_SIMPLE: c_int = 0;

/// Bytes an object exports, and the memoryview that holds the export: the
/// memory stays put while it lives (a `bytearray` cannot be resized then).
pub(crate) struct HostBuffer {
    pub(crate) holder: Py<PyMemoryView>,
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    pub(crate) read_only: bool,
}

/// The bytes `exporter` exports: `TypeError` where it has no buffer
/// protocol, `BufferError` where its buffer is not C-contiguous.
pub(crate) fn host_buffer(exporter: &Bound<'_, PyAny>) -> PyResult<HostBuffer> {
    let py = exporter.py();
    let holder = PyMemoryView::from(exporter)?;
    let mut view = PyBuffer {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 0,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    };
    // SAFETY: the GIL is held, `holder` is a live memoryview and `view` a
    // `Py_buffer` to fill; on success it is released once, below. Its bytes
    // stay valid after that release: they are the export `holder` keeps.
    let (ptr, len, read_only) = unsafe {
        if PyObject_GetBuffer(holder.as_ptr(), &mut view, PYBUF_SIMPLE) != 0 {
            return Err(PyErr::fetch(py));
        }
        let info = (view.buf as usize, view.len.max(0) as usize, view.readonly != 0);
        PyBuffer_Release(&mut view);
        info
    };
    Ok(HostBuffer {
        holder: holder.unbind(),
        ptr,
        len,
        read_only,
    })
}
