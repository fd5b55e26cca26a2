//! Shared by the nvrtc_* and cubin_* tests: finding and calling the real NVRTC directly
//! (not through the shim), for fixtures and cross-checks.
#![allow(dead_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

/// The real NVRTC libraries available here, newest first: `DEVTENSOR_EMU_NVRTC`,
/// `DEVTENSOR_NVRTC` (file or directory), then pip's wheels in ci/test.sh's venv
/// (`$DEVTENSOR_CACHE/venv`, default `~/.cache/devtensor-ci/venv`).
pub fn real_nvrtc_libs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut push = |p: PathBuf| {
        if p.is_file() && !out.contains(&p) {
            out.push(p);
        }
    };
    for var in ["DEVTENSOR_EMU_NVRTC", "DEVTENSOR_NVRTC"] {
        if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
            if p.is_dir() {
                for n in ["libnvrtc.so.13", "libnvrtc.so.12"] {
                    push(p.join(n));
                }
            } else {
                push(p);
            }
        }
    }
    let cache = std::env::var_os("DEVTENSOR_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/devtensor-ci")));
    if let Some(lib) = cache.map(|c| c.join("venv/lib")) {
        if let Ok(rd) = std::fs::read_dir(&lib) {
            let mut pys: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            pys.sort();
            for py in pys {
                push(py.join("site-packages/nvidia/cu13/lib/libnvrtc.so.13"));
                push(py.join("site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
            }
        }
    }
    // Never hand back the shim itself (ci/emu.sh installs it as libnvrtc.so.13).
    out.retain(|p| !is_shim(p));
    out
}

fn is_shim(p: &Path) -> bool {
    std::fs::canonicalize(p)
        .map(|c| {
            c.file_name()
                .is_some_and(|n| n.to_string_lossy().contains("devtensor_emu"))
        })
        .unwrap_or(false)
}

/// The real NVRTC of the given major version, if present.
pub fn real_nvrtc(major: i32) -> Option<RealNvrtc> {
    real_nvrtc_libs()
        .into_iter()
        .filter_map(|p| RealNvrtc::open(&p))
        .find(|r| r.version().0 == major)
}

/// Prints the SKIP line the project's tests use when a prerequisite is missing.
pub fn skip(test: &str, why: &str) {
    println!("SKIP {test}: {why}");
}

type Prog = *mut c_void;

/// The real NVRTC, called directly through dlopen/dlsym.
pub struct RealNvrtc {
    pub path: PathBuf,
    handle: *mut c_void,
}

// SAFETY: the handle is only used for dlsym, which is thread-safe.
unsafe impl Send for RealNvrtc {}
// SAFETY: as above.
unsafe impl Sync for RealNvrtc {}

impl RealNvrtc {
    pub fn open(path: &Path) -> Option<RealNvrtc> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: a valid C string.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        (!handle.is_null()).then(|| RealNvrtc {
            path: path.to_owned(),
            handle,
        })
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        let n = CString::new(name).unwrap();
        // SAFETY: live handle, valid C string.
        let p = unsafe { libc::dlsym(self.handle, n.as_ptr()) };
        assert!(!p.is_null(), "{} has no {name}", self.path.display());
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: T is the function-pointer type of `name` (nvrtc.h), same size as a pointer.
        unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
    }

    pub fn version(&self) -> (i32, i32) {
        let f: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int = self.sym("nvrtcVersion");
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { f(&mut a, &mut b) }, 0);
        (a, b)
    }

    /// Compiles; returns (cubin, ptx) or the log.
    pub fn compile(&self, src: &str, opts: &[&str]) -> Result<(Vec<u8>, String), String> {
        type Create = unsafe extern "C" fn(
            *mut Prog,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Size = unsafe extern "C" fn(Prog, *mut usize) -> c_int;
        type Get = unsafe extern "C" fn(Prog, *mut c_char) -> c_int;
        let create: Create = self.sym("nvrtcCreateProgram");
        let compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int = self.sym("nvrtcCompileProgram");
        let destroy: unsafe extern "C" fn(*mut Prog) -> c_int = self.sym("nvrtcDestroyProgram");
        let read = |p: Prog, size: &str, get: &str| -> Vec<u8> {
            let (size, get): (Size, Get) = (self.sym(size), self.sym(get));
            let mut n = 0;
            // SAFETY: live program, valid out-pointer.
            assert_eq!(unsafe { size(p, &mut n) }, 0);
            let mut buf = vec![0u8; n.max(1)];
            // SAFETY: `buf` holds n bytes.
            assert_eq!(unsafe { get(p, buf.as_mut_ptr().cast()) }, 0);
            buf.truncate(n);
            buf
        };
        let src_c = CString::new(src).unwrap();
        let opts_c: Vec<CString> = opts.iter().map(|o| CString::new(*o).unwrap()).collect();
        let ptrs: Vec<*const c_char> = opts_c.iter().map(|o| o.as_ptr()).collect();
        let mut p: Prog = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        let rc = unsafe {
            create(
                &mut p,
                src_c.as_ptr(),
                c"fixture.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: live program; `ptrs` holds valid C strings.
        let rc = unsafe { compile(p, ptrs.len() as c_int, ptrs.as_ptr()) };
        let out = if rc != 0 {
            let log = read(p, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog");
            Err(String::from_utf8_lossy(&log).trim_end_matches('\0').to_owned())
        } else {
            let cubin = read(p, "nvrtcGetCUBINSize", "nvrtcGetCUBIN");
            let ptx = read(p, "nvrtcGetPTXSize", "nvrtcGetPTX");
            Ok((cubin, String::from_utf8_lossy(&ptx).trim_end_matches('\0').to_owned()))
        };
        // SAFETY: live program, destroyed once.
        unsafe { destroy(&mut p) };
        out
    }
}

/// The project's kernel source and options (src/backend/cuda/kernels.rs).
pub fn strided_copy_source() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/strided_copy.cu");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn project_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
}

/// Error string of a C API for messages.
pub fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return "(null)".into();
    }
    // SAFETY: non-null NUL-terminated string from the library.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
