//! The run-time compilers, NVRTC and hiprtc, written once: the two share one C
//! API under two prefixes (`nvrtcCreateProgram` / `hiprtcCreateProgram`, ...),
//! so loading their common functions, checking a status, compiling and reading
//! a program's log or output are the same code. Each backend adds what is its
//! own: where the library is found, and which output it reads (PTX or a cubin;
//! a code object).

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use libloading::Library;

use crate::device::Backend;
use crate::error::{Error, Result};

/// A compiler program handle (`nvrtcProgram` / `hiprtcProgram`).
pub(crate) type Program = *mut c_void;
/// A compiler status (`nvrtcResult` / `hiprtcResult`); 0 is success.
pub(crate) type Status = c_int;
/// `…GetXSize(program, &size)`: the size of one of a program's outputs.
pub(crate) type OutputSize = unsafe extern "C" fn(Program, *mut usize) -> Status;
/// `…GetX(program, buffer)`: copies that output.
pub(crate) type OutputCopy = unsafe extern "C" fn(Program, *mut c_char) -> Status;

type Create = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> Status;

/// The names of the shared functions in one compiler's library.
pub(crate) struct Symbols {
    pub(crate) version: &'static str,
    pub(crate) error_string: &'static str,
    pub(crate) create: &'static str,
    pub(crate) compile: &'static str,
    pub(crate) destroy: &'static str,
    pub(crate) log_size: &'static str,
    pub(crate) log: &'static str,
}

/// One loaded compiler.
pub(crate) struct Rtc {
    lib: Library,
    backend: Backend,
    names: &'static Symbols,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: Create,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    log_size: OutputSize,
    log: OutputCopy,
}

impl Rtc {
    /// Resolves the shared functions in `lib`; `Err` names the one missing.
    ///
    /// # Safety
    ///
    /// `lib` is the compiler `names` belongs to, whose functions have the C
    /// signatures of `nvrtc.h` / `hiprtc.h` (stable since CUDA 11.1 and HIP 4.2).
    pub(crate) unsafe fn load(
        lib: Library,
        backend: Backend,
        names: &'static Symbols,
    ) -> std::result::Result<Rtc, String> {
        // SAFETY: (every `symbol` call) the caller's contract: the field's type is
        // the function's C signature.
        unsafe {
            Ok(Rtc {
                version: symbol(&lib, names.version)?,
                error_string: symbol(&lib, names.error_string)?,
                create: symbol(&lib, names.create)?,
                compile: symbol(&lib, names.compile)?,
                destroy: symbol(&lib, names.destroy)?,
                log_size: symbol(&lib, names.log_size)?,
                log: symbol(&lib, names.log)?,
                lib,
                backend,
                names,
            })
        }
    }

    /// Another function of the same library (an output's size or copy).
    ///
    /// # Safety
    ///
    /// `T` is the function's C signature.
    pub(crate) unsafe fn symbol<T: Copy>(&self, name: &str) -> std::result::Result<T, String> {
        // SAFETY: forwarded from the caller.
        unsafe { symbol(&self.lib, name) }
    }

    /// The compiler's version.
    pub(crate) fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        self.check(unsafe { (self.version)(&mut major, &mut minor) }, self.names.version)?;
        Ok((major, minor))
    }

    /// The compiler's text for `status` (an older library may have none).
    pub(crate) fn error_string(&self, status: Status) -> String {
        // SAFETY: takes any integer; returns a static C string or null.
        let p = unsafe { (self.error_string)(status) };
        if p.is_null() {
            return format!("{} error {status}", self.names.version.trim_end_matches("Version"));
        }
        // SAFETY: non-null: a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `Ok` for status 0, else the driver error of `call`.
    pub(crate) fn check(&self, status: Status, call: &'static str) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        Err(Error::Driver {
            backend: self.backend,
            call,
            code: status.into(),
            message: self.error_string(status),
        })
    }

    /// Compiles `source` (file name `name`) with `options` for `arch`; on
    /// success `output` reads what the program produced. A failed compile is
    /// [`Error::KernelCompile`] with the compiler's log.
    pub(crate) fn compile(
        &self,
        name: &str,
        source: &str,
        options: &[String],
        arch: &str,
        output: impl FnOnce(Program) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let nul = |what: &str| Error::InvalidArgument {
            op: self.names.compile,
            reason: format!("the kernel {what} contains a NUL byte"),
        };
        let src = CString::new(source).map_err(|_| nul("source"))?;
        let cname = CString::new(name).map_err(|_| nul("name"))?;
        let opts: Vec<CString> = options.iter().filter_map(|o| CString::new(o.as_str()).ok()).collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings; zero headers.
        let rc = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check(rc, self.names.create)?;
        let result = (|| {
            // SAFETY: `prog` is a live program; `opt_ptrs` holds `len` valid C strings.
            let status = unsafe { (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            if status != 0 {
                let log = self
                    .read(prog, self.log_size, self.log, self.names.log)
                    .map(|l| String::from_utf8_lossy(&l).trim_end_matches('\0').to_owned())
                    .unwrap_or_default();
                return Err(Error::KernelCompile {
                    kernel: name.to_owned(),
                    arch: arch.to_owned(),
                    log: if log.trim().is_empty() {
                        self.error_string(status)
                    } else {
                        log
                    },
                });
            }
            output(prog)
        })();
        // SAFETY: `prog` is live and destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    /// One output of a compiled program: its size, then its bytes.
    pub(crate) fn read(
        &self,
        prog: Program,
        size: OutputSize,
        copy: OutputCopy,
        call: &'static str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; `n` is a valid out-pointer.
        self.check(unsafe { size(prog, &mut n) }, call)?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes the compiler reported.
        self.check(unsafe { copy(prog, buf.as_mut_ptr().cast()) }, call)?;
        Ok(buf)
    }
}

/// The function `name` of `lib`, as a `T`.
///
/// # Safety
///
/// `T` is the function's C signature; the value is used only while `lib` is loaded.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> std::result::Result<T, String> {
    // SAFETY: forwarded from the caller.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("no {name}: {e}"))
}
