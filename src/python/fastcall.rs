//! Python functions and methods as plain `METH_FASTCALL | METH_KEYWORDS` C
//! functions whose keywords are matched by identity with interned names.
//!
//! PyO3 matches each keyword by its UTF-8 text. That cost
//! `torch.from_dlpack(devtensor)` 0.15–0.2 µs a call (torch passes
//! `max_version=` to `__dlpack__`), and `devtensor.empty((1024,),
//! dtype=np.float64)` 30 ns over the same call with the dtype by position
//! (224 against 194 ns; NumPy's, with the keyword, 194). CPython interns the
//! keyword names at call sites, so NumPy's C functions compare pointers
//! first; so do these. The call comes as a vector: no tuple or dict is built.

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::{PySystemError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

/// A method table entry. CPython only reads it, from any thread.
pub(crate) struct MethodDef(pub(crate) ffi::PyMethodDef);
// SAFETY: the definition is immutable and its pointers are to 'static data.
unsafe impl Sync for MethodDef {}

/// `PyCFunctionFastWithKeywords` (the `METH_FASTCALL | METH_KEYWORDS` form).
pub(crate) type FastWithKeywords = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *const *mut ffi::PyObject,
    ffi::Py_ssize_t,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

impl MethodDef {
    /// `name`, called as a vector of arguments and a tuple of keyword names.
    /// `doc` starts with the text signature (`name(a, b=None)\n--\n\n`).
    pub(crate) const fn fast(name: &'static CStr, f: FastWithKeywords, doc: &'static CStr) -> MethodDef {
        MethodDef(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                // SAFETY: the union only stores the pointer; CPython calls it
                // with the signature `ml_flags` names (METH_FASTCALL |
                // METH_KEYWORDS), which is `f`'s. Function pointers all have
                // one size.
                PyCFunctionWithKeywords: unsafe {
                    std::mem::transmute::<FastWithKeywords, ffi::PyCFunctionWithKeywords>(f)
                },
            },
            ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
            ml_doc: doc.as_ptr(),
        })
    }

    /// Adds the definition to module `m` as a function.
    pub(crate) fn add_to(&'static self, m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        let module_name = m.name()?;
        // SAFETY: the definition lives for the whole process and is only read;
        // `m` and its name are live; on success we own the new reference.
        let f = unsafe {
            let raw = ffi::PyCFunction_NewEx((&raw const self.0).cast_mut(), m.as_ptr(), module_name.as_ptr());
            Bound::from_owned_ptr_or_err(py, raw)?
        };
        // SAFETY: `ml_name` is a 'static C string (`fast`).
        let name = unsafe { CStr::from_ptr(self.0.ml_name) };
        m.add(name.to_string_lossy().as_ref(), f)
    }
}

/// The parameters of a function: their names, how many may come by position
/// (the first ones), how many must come (the first ones).
pub(crate) struct Signature<const N: usize> {
    name: &'static str,
    params: [&'static str; N],
    positional: usize,
    required: usize,
    interned: PyOnceLock<[Py<PyString>; N]>,
}

/// The parsed arguments, in parameter order, borrowed for the call.
pub(crate) type Args<'a, 'py, const N: usize> = [Option<Borrowed<'a, 'py, PyAny>>; N];

impl<const N: usize> Signature<N> {
    pub(crate) const fn new(
        name: &'static str,
        params: [&'static str; N],
        positional: usize,
        required: usize,
    ) -> Signature<N> {
        Signature {
            name,
            params,
            positional,
            required,
            interned: PyOnceLock::new(),
        }
    }

    /// Runs `body` on the arguments of a fast call, turning an error or a
    /// panic into a Python exception: nothing unwinds into CPython.
    ///
    /// # Safety
    ///
    /// The arguments are those CPython passes to a `METH_FASTCALL |
    /// METH_KEYWORDS` function: `args` holds `nargs` positional values, then
    /// one per name in the `kwnames` tuple (or null), all live and borrowed
    /// for the call; the thread is attached to the interpreter.
    #[inline(always)]
    pub(crate) unsafe fn call(
        &self,
        args: *const *mut ffi::PyObject,
        nargs: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
        body: impl for<'a, 'py> FnOnce(Python<'py>, Args<'a, 'py, N>) -> PyResult<Bound<'py, PyAny>>,
    ) -> *mut ffi::PyObject {
        let call = |py: Python<'_>| {
            let run = || {
                // SAFETY: forwarded.
                let values = unsafe { self.parse(py, args, nargs, kwnames) }?;
                body(py, values)
            };
            let err = match catch_unwind(AssertUnwindSafe(run)) {
                Ok(Ok(result)) => return result.into_ptr(),
                Ok(Err(e)) => e,
                Err(_) => {
                    PySystemError::new_err(format!("devtensor: panic in {}() (a bug; please report it)", self.name))
                }
            };
            err.restore(py);
            std::ptr::null_mut()
        };
        // Attached through PyO3, not merely assumed (`Python::assume_attached`):
        // a `Py` dropped on a thread PyO3 does not count as attached waits in
        // its pool for the next attach, and so did every raised error's
        // message (200,000 failed calls held 19 MiB). On a thread that holds
        // the GIL this only counts the attachment (PyGILState_Ensure nests).
        // SAFETY: CPython calls C functions on an attached thread of an
        // initialized interpreter.
        unsafe { Python::attach_unchecked(call) }
    }

    /// The arguments by parameter, with CPython's errors for too many
    /// positional ones, unknown or repeated keywords and missing ones.
    ///
    /// # Safety
    ///
    /// As [`call`](Self::call).
    #[inline(always)]
    unsafe fn parse<'a, 'py>(
        &self,
        py: Python<'py>,
        args: *const *mut ffi::PyObject,
        nargs: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
    ) -> PyResult<Args<'a, 'py, N>> {
        let nargs = usize::try_from(nargs).unwrap_or(0);
        if nargs > self.positional {
            return Err(self.too_many_positional(nargs));
        }
        // Borrowed, not owned: no reference counting (a function call each
        // in the stable ABI).
        let mut values: Args<'a, 'py, N> = [None; N];
        for (i, v) in values.iter_mut().enumerate().take(nargs) {
            // SAFETY: `args` holds `nargs` live values, borrowed for the call.
            *v = Some(unsafe { Borrowed::from_ptr(py, *args.add(i)) });
        }
        if !kwnames.is_null() {
            // SAFETY: a non-null `kwnames` is a tuple of strings, borrowed.
            let count = unsafe { ffi::PyTuple_Size(kwnames) };
            for k in 0..count {
                // SAFETY: `k` is within the tuple; the item is borrowed.
                let i = self.slot(py, unsafe { ffi::PyTuple_GetItem(kwnames, k) })?;
                if values[i].is_some() {
                    return Err(PyTypeError::new_err(format!(
                        "{}() got multiple values for argument '{}'",
                        self.name, self.params[i]
                    )));
                }
                // SAFETY: after the positional values, one per keyword name.
                values[i] = Some(unsafe { Borrowed::from_ptr(py, *args.add(nargs + k as usize)) });
            }
        }
        if let Some(i) = values[..self.required].iter().position(Option::is_none) {
            return Err(PyTypeError::new_err(format!(
                "{}() missing 1 required positional argument: '{}'",
                self.name, self.params[i]
            )));
        }
        Ok(values)
    }

    fn too_many_positional(&self, given: usize) -> PyErr {
        if self.positional == 0 {
            let keywords: Vec<String> = self.params.iter().map(|p| format!("{p}=")).collect();
            return PyTypeError::new_err(format!(
                "{}() takes no positional arguments (use {})",
                self.name,
                keywords.join(", ")
            ));
        }
        // CPython's words.
        let (name, most) = (self.name, self.positional);
        PyTypeError::new_err(match self.required {
            n if n == most => format!("{name}() takes {most} positional arguments but {given} were given"),
            n => format!("{name}() takes from {n} to {most} positional arguments but {given} were given"),
        })
    }

    /// Which parameter `name` is: by identity with the interned name first
    /// (call-site names are interned), by value otherwise.
    fn slot(&self, py: Python<'_>, name: *mut ffi::PyObject) -> PyResult<usize> {
        let interned = self
            .interned
            .get_or_init(py, || self.params.map(|k| PyString::intern(py, k).unbind()));
        if let Some(i) = interned.iter().position(|k| k.as_ptr() == name) {
            return Ok(i);
        }
        // SAFETY: a live keyword name, borrowed for the call (null: an error set).
        let name = unsafe { Borrowed::from_ptr_or_err(py, name) }?;
        let text = name
            .cast::<PyString>()
            .ok()
            .and_then(|s| s.to_cow().ok().map(|t| t.into_owned()));
        text.as_deref()
            .and_then(|t| self.params.iter().position(|k| *k == t))
            .ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "{}() got an unexpected keyword argument '{}'",
                    self.name,
                    text.as_deref().unwrap_or("?")
                ))
            })
    }
}

/// A required argument's value (present: [`Signature`] checked it).
#[inline(always)]
pub(crate) fn required<'a, 'py>(value: &'a Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<&'a Bound<'py, PyAny>> {
    value
        .as_deref()
        .ok_or_else(|| PySystemError::new_err("devtensor: a required argument went missing"))
}

/// Extracts a parameter's value (its error as the conversion raised it).
#[inline(always)]
pub(crate) fn extract<'a, 'py, T>(value: &'a Bound<'py, PyAny>) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
{
    value.extract::<T>().map_err(Into::into)
}

/// [`extract`] for a parameter whose default is `None`: absent or `None` is `None`.
#[inline(always)]
pub(crate) fn extract_optional<'a, 'py, T>(value: &'a Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<Option<T>>
where
    T: FromPyObject<'a, 'py>,
{
    match value {
        Some(v) if !v.is_none() => extract(v).map(Some),
        _ => Ok(None),
    }
}

/// Defines `unsafe extern "C" fn $shim`, a module-level fast C function that
/// parses its arguments with `$signature` and runs `$body` on them.
macro_rules! fast_function {
    ($shim:ident, $signature:expr, |$py:ident, $values:pat_param| $body:expr) => {
        unsafe extern "C" fn $shim(
            _module: *mut pyo3::ffi::PyObject,
            args: *const *mut pyo3::ffi::PyObject,
            nargs: pyo3::ffi::Py_ssize_t,
            kwnames: *mut pyo3::ffi::PyObject,
        ) -> *mut pyo3::ffi::PyObject {
            // SAFETY: CPython's arguments to a METH_FASTCALL | METH_KEYWORDS
            // function, on an attached thread.
            unsafe { $signature.call(args, nargs, kwnames, |$py, $values| $body) }
        }
    };
}
pub(crate) use fast_function;
