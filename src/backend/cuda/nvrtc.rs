//! NVRTC, loaded at run time by devtensor itself.
//!
//! cudarc binds one NVRTC soname per CUDA version feature; devtensor must work
//! with NVRTC 12 or 13 (pip's `nvidia-cuda-nvrtc-cu12` or `nvidia-cuda-nvrtc`),
//! so it opens whichever is present: `DEVTENSOR_NVRTC` (a file or a directory)
//! first, then `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` on the loader path.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use crate::device::Backend;
use crate::error::{Error, Result};

type Program = *mut c_void;
type Status = c_int;

struct Api {
    _lib: Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    /// Where the library was found.
    path: String,
}

/// NVRTC sonames in the order to try for a driver of CUDA version `driver`
/// (0: unknown). A cubin from NVRTC 13 needs a CUDA 13 driver (r580+): under an
/// older driver NVRTC 12 comes first, so the kernels it compiles can load.
fn sonames(driver: i32) -> [&'static str; 3] {
    if driver > 0 && driver < 13000 {
        ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]
    } else {
        ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    }
}

fn candidates(driver: i32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("DEVTENSOR_NVRTC").map(PathBuf::from) {
        if p.is_dir() {
            for name in sonames(driver) {
                out.push(p.join(name));
            }
        } else {
            out.push(p);
        }
    }
    for name in sonames(driver) {
        out.push(PathBuf::from(name));
    }
    for name in ["nvrtc64_130_0.dll", "nvrtc64_120_0.dll"] {
        out.push(PathBuf::from(name));
    }
    out
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for path in candidates(super::probe::driver_version()) {
        // SAFETY: loading NVRTC runs its (side-effect free) initialisers only.
        let Ok(lib) = (unsafe { Library::new(&path) }) else {
            tried.push(path.display().to_string());
            continue;
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature of the field it is stored
                // in, as declared in nvrtc.h (stable since CUDA 11.1).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", path.display()))?
            };
        }
        let api = Api {
            version: sym!("nvrtcVersion"),
            get_error_string: sym!("nvrtcGetErrorString"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            destroy: sym!("nvrtcDestroyProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            path: path.display().to_string(),
            _lib: lib,
        };
        return Ok(api);
    }
    Err(format!(
        "libnvrtc not found (tried {}): install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, \
         then put its lib directory on LD_LIBRARY_PATH or set DEVTENSOR_NVRTC",
        tried.join(", ")
    ))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: Backend::Cuda,
            reason: reason.clone(),
        })
}

/// NVRTC's version and where it was loaded from.
pub fn version() -> Result<((i32, i32), String)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    check(api, unsafe { (api.version)(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok(((major, minor), api.path.clone()))
}

fn check(api: &Api, status: Status, call: &'static str) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static C string for any status.
    let msg = unsafe { std::ffi::CStr::from_ptr((api.get_error_string)(status)) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Driver {
        backend: Backend::Cuda,
        call,
        code: status.into(),
        message: msg,
    })
}

/// What a compile produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text (target `compute_XY`).
    Ptx,
    /// A cubin for one SM (target `sm_XY`): what devtensor loads, since PTX newer
    /// than the driver does not load.
    Cubin,
}

/// Compiles `source` with `options`; a failed compile returns the log.
pub fn compile(name: &str, source: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let api = api()?;
    let src = CString::new(source).map_err(|_| Error::InvalidArgument {
        op: "NVRTC",
        reason: "the kernel source contains a NUL byte".into(),
    })?;
    let cname = CString::new(name).map_err(|_| Error::InvalidArgument {
        op: "NVRTC",
        reason: "the kernel name contains a NUL byte".into(),
    })?;
    let opts: Vec<CString> = options.iter().filter_map(|o| CString::new(o.as_str()).ok()).collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: valid C strings; zero headers.
    let rc = unsafe {
        (api.create)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(api, rc, "nvrtcCreateProgram")?;
    let result = (|| {
        // SAFETY: `prog` is a live program; `opt_ptrs` holds `len` valid C strings.
        let status = unsafe { (api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if status != 0 {
            let arch = options
                .iter()
                .find(|o| o.starts_with("--gpu-architecture="))
                .cloned()
                .unwrap_or_default();
            return Err(Error::KernelCompile {
                kernel: name.to_owned(),
                arch: arch.trim_start_matches("--gpu-architecture=").to_owned(),
                log: read(api, prog, api.log_size, api.log, "nvrtcGetProgramLog")
                    .map(|l| String::from_utf8_lossy(&l).trim_end_matches('\0').to_owned())
                    .unwrap_or_default(),
            });
        }
        match output {
            Output::Ptx => read(api, prog, api.ptx_size, api.ptx, "nvrtcGetPTX"),
            Output::Cubin => read(api, prog, api.cubin_size, api.cubin, "nvrtcGetCUBIN"),
        }
    })();
    // SAFETY: `prog` is live and destroyed once.
    unsafe { (api.destroy)(&mut prog) };
    result
}

fn read(
    api: &Api,
    prog: Program,
    size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    get: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    call: &'static str,
) -> Result<Vec<u8>> {
    let mut n = 0usize;
    // SAFETY: `prog` is live; `n` is a valid out-pointer.
    check(api, unsafe { size(prog, &mut n) }, call)?;
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds the `n` bytes NVRTC reported.
    check(api, unsafe { get(prog, buf.as_mut_ptr().cast()) }, call)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_driver_gets_nvrtc_12_first() {
        assert_eq!(sonames(12080)[0], "libnvrtc.so.12");
        assert_eq!(sonames(13000)[0], "libnvrtc.so.13");
        assert_eq!(sonames(0)[0], "libnvrtc.so.13", "no driver: the newest compiler");
        let names: Vec<String> = candidates(12040)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // The loader-path names, after whatever DEVTENSOR_NVRTC adds in front.
        let (p12, p13) = (
            names.iter().rposition(|n| n == "libnvrtc.so.12").unwrap(),
            names.iter().rposition(|n| n == "libnvrtc.so.13").unwrap(),
        );
        assert!(p12 < p13, "{names:?}");
    }
}
