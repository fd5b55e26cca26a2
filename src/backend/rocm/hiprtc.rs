//! hiprtc, loaded at run time by devtensor itself (hip-sys does not bind it).
//!
//! ROCm 6 and later ship hiprtc as `libhiprtc.so.N`; HIP 5.x (Debian bookworm's
//! `libamdhip64-5`) exports the same `hiprtc*` symbols from `libamdhip64.so.5`.
//! devtensor opens whichever is present: `DEVTENSOR_HIPRTC` (a file or a
//! directory) first, then `libhiprtc.so.7`, `.so.6`, `libhiprtc.so`, then
//! `libamdhip64.so.7`, `.so.6`, `.so.5`, `libamdhip64.so` on the loader path.
//!
//! hiprtc compiles through comgr, which knows a fixed list of GPU processors;
//! HIP 5.2's hiprtc aborts the process (instead of failing) when asked for one
//! it does not know (gfx942). So before compiling, [`compile`] asks comgr for
//! that list ([`supports`]) and refuses an unknown processor with an ordinary
//! [`Error::KernelCompile`].

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use crate::backend::rtc::{OutputCopy, OutputSize, Rtc, Symbols};
use crate::device::Backend;
use crate::error::{Error, Result};

/// The sonames tried, in order, after `DEVTENSOR_HIPRTC`.
pub const SONAMES: &[&str] = &[
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libhiprtc.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// What [`compile`] reports, in its log, for a processor comgr does not know
/// (also recognised by `kernels::check` as "this compiler rejects the arch").
pub const UNSUPPORTED_TARGET: &str = "unsupported target";

/// hiprtc's names for the functions every run-time compiler has.
static SYMBOLS: Symbols = Symbols {
    version: "hiprtcVersion",
    error_string: "hiprtcGetErrorString",
    create: "hiprtcCreateProgram",
    compile: "hiprtcCompileProgram",
    destroy: "hiprtcDestroyProgram",
    log_size: "hiprtcGetProgramLogSize",
    log: "hiprtcGetProgramLog",
};

struct Api {
    rtc: Rtc,
    code_size: OutputSize,
    code: OutputCopy,
    /// Where the library was found (the resolved file when the loader says).
    path: String,
}

/// The libraries to try, in order: `DEVTENSOR_HIPRTC` (a file, or a directory
/// searched for every soname), then [`SONAMES`] on the loader path, those of
/// the linked HIP runtime's major version (`runtime_major`) first, so that a
/// machine with ROCm 6 and 7 side by side compiles with the hiprtc whose code
/// objects the runtime in this process loads.
pub fn candidates(env: Option<&Path>, runtime_major: Option<u32>) -> Vec<PathBuf> {
    let suffix = runtime_major.map(|m| format!(".so.{m}"));
    let mut names: Vec<&str> = SONAMES.to_vec();
    // Stable: matching sonames move to the front, each group keeps its order.
    names.sort_by_key(|n| suffix.as_deref().is_none_or(|s| !n.ends_with(s)));
    let mut out = Vec::new();
    if let Some(p) = env {
        if p.is_dir() {
            out.extend(names.iter().map(|name| p.join(name)));
        } else {
            out.push(p.to_owned());
        }
    }
    out.extend(names.iter().map(PathBuf::from));
    out
}

/// The major version of the HIP runtime this process links (HIP_VERSION is
/// major · 10⁷ + minor · 10⁵ + patch); `None` when it does not say.
fn runtime_major() -> Option<u32> {
    let mut v = 0;
    // SAFETY: a valid out-pointer; the call touches no device.
    let ok = unsafe { super::ffi::hipRuntimeGetVersion(&mut v) } == super::ffi::SUCCESS;
    (ok && v > 0).then_some(v as u32 / 10_000_000)
}

/// The file the loader mapped for the library that defines `sym`.
#[cfg(target_os = "linux")]
fn loaded_from(sym: *const c_void) -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `sym` is an address inside a loaded library; `info` is a valid
    // out-pointer, read only when dladdr reports success.
    if unsafe { libc::dladdr(sym, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let p = PathBuf::from(name);
    Some(p.canonicalize().unwrap_or(p))
}

#[cfg(not(target_os = "linux"))]
fn loaded_from(_sym: *const c_void) -> Option<PathBuf> {
    None
}

fn load() -> std::result::Result<Api, String> {
    let env = std::env::var_os("DEVTENSOR_HIPRTC").map(PathBuf::from);
    let mut tried = Vec::new();
    for path in candidates(env.as_deref(), runtime_major()) {
        // SAFETY: loading hiprtc / the HIP runtime runs their initialisers, which
        // only set up internal state (no device is touched until a HIP call).
        let lib = match unsafe { Library::new(&path) } {
            Ok(lib) => lib,
            Err(_) => {
                tried.push(path.display().to_string());
                continue;
            }
        };
        // SAFETY: hiprtc's library (or HIP 5.x's runtime, which contains it);
        // its functions have the signatures of hiprtc.h (unchanged from HIP 4.2
        // to ROCm 7).
        let api = unsafe { Rtc::load(lib, Backend::Rocm, &SYMBOLS) }.and_then(|rtc| {
            // SAFETY: as above.
            let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int =
                unsafe { rtc.symbol("hiprtcVersion")? };
            let resolved = loaded_from(version as *const c_void).unwrap_or_else(|| path.clone());
            // SAFETY: as above.
            unsafe {
                Ok(Api {
                    code_size: rtc.symbol("hiprtcGetCodeSize")?,
                    code: rtc.symbol("hiprtcGetCode")?,
                    path: resolved.display().to_string(),
                    rtc,
                })
            }
        });
        match api {
            Ok(api) => return Ok(api),
            // A libamdhip64 without hiprtc (ROCm 6+ moved it out): go on.
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "hiprtc not found (tried {}): install ROCm's hiprtc (or HIP 5.x libamdhip64, which contains it), \
         then put its lib directory on LD_LIBRARY_PATH or set DEVTENSOR_HIPRTC",
        tried.join(", ")
    ))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: Backend::Rocm,
            reason: reason.clone(),
        })
}

/// hiprtc's version and where it was loaded from. (HIP 5.x reports 9.0 here
/// whatever its release; the path names the real one.)
pub fn version() -> Result<((i32, i32), String)> {
    let api = api()?;
    Ok((api.rtc.version()?, api.path.clone()))
}

/// The processors comgr (hiprtc's compiler) can target, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comgr {
    /// `(major, minor)` from `amd_comgr_get_version`.
    pub version: (usize, usize),
    /// Processor names (`gfx90a`, ...), from comgr's ISA names
    /// (`amdgcn-amd-amdhsa--gfx90a[:features]`), deduplicated, in comgr's order.
    pub processors: Vec<String>,
}

/// The processor of a target id: `gfx90a:sramecc+:xnack-` → `gfx90a`.
pub fn processor(target: &str) -> &str {
    target.split(':').next().unwrap_or(target)
}

/// The processor named by one comgr ISA name, if it is an amdhsa GPU.
fn isa_processor(isa: &str) -> Option<&str> {
    isa.strip_prefix("amdgcn-amd-amdhsa--").map(processor)
}

fn load_comgr() -> Option<Comgr> {
    let mut names: Vec<PathBuf> = Vec::new();
    // Next to hiprtc first (a ROCm install not on the loader path), then the loader path.
    if let Some(dir) = api().ok().and_then(|a| Path::new(&a.path).parent().map(Path::to_owned)) {
        for n in ["libamd_comgr.so.3", "libamd_comgr.so.2"] {
            names.push(dir.join(n));
        }
    }
    for n in ["libamd_comgr.so.3", "libamd_comgr.so.2", "libamd_comgr.so"] {
        names.push(PathBuf::from(n));
    }
    let lib = names.iter().find_map(|p| {
        // SAFETY: comgr's initialisers only register LLVM targets.
        unsafe { Library::new(p) }.ok()
    })?;
    type GetVersion = unsafe extern "C" fn(*mut usize, *mut usize);
    type GetCount = unsafe extern "C" fn(*mut usize) -> c_int;
    type GetName = unsafe extern "C" fn(usize, *mut *const c_char) -> c_int;
    // SAFETY: signatures as declared in amd_comgr.h (stable since comgr 1.8).
    let get_version = unsafe { lib.get::<GetVersion>(b"amd_comgr_get_version\0") }.ok()?;
    // SAFETY: as above.
    let get_count = unsafe { lib.get::<GetCount>(b"amd_comgr_get_isa_count\0") }.ok()?;
    // SAFETY: as above.
    let get_name = unsafe { lib.get::<GetName>(b"amd_comgr_get_isa_name\0") }.ok()?;
    let (mut major, mut minor, mut count) = (0usize, 0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe { get_version(&mut major, &mut minor) };
    // SAFETY: valid out-pointer.
    if unsafe { get_count(&mut count) } != 0 {
        return None;
    }
    let mut processors: Vec<String> = Vec::new();
    for i in 0..count {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `i` < count; `name` is a valid out-pointer.
        if unsafe { get_name(i, &mut name) } != 0 || name.is_null() {
            return None;
        }
        // SAFETY: comgr returns a static NUL-terminated string.
        let isa = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        match isa_processor(&isa) {
            Some(p) if !processors.iter().any(|q| q == p) => processors.push(p.to_owned()),
            _ => {}
        }
    }
    // The library stays loaded: hiprtc uses the same one.
    std::mem::forget(lib);
    Some(Comgr {
        version: (major, minor),
        processors,
    })
}

/// comgr's processor list, when comgr can be loaded (`None` otherwise).
pub fn comgr() -> Option<&'static Comgr> {
    static COMGR: OnceLock<Option<Comgr>> = OnceLock::new();
    COMGR.get_or_init(load_comgr).as_ref()
}

/// Whether hiprtc can compile for `target` (a target id such as
/// `gfx90a:sramecc+:xnack-`): `None` when comgr cannot be asked.
pub fn supports(target: &str) -> Option<bool> {
    let p = processor(target);
    comgr().map(|c| c.processors.iter().any(|q| q == p))
}

/// A description of hiprtc for reports and cache keys:
/// `hiprtc 9.0 (/usr/lib/.../libamdhip64.so.5.2.21153), comgr 2.4`.
pub fn identity() -> Result<String> {
    let ((major, minor), path) = version()?;
    Ok(match comgr() {
        Some(c) => format!("hiprtc {major}.{minor} ({path}), comgr {}.{}", c.version.0, c.version.1),
        None => format!("hiprtc {major}.{minor} ({path})"),
    })
}

/// Compiles `source` with `options` into a code object (an AMDGPU ELF); a failed
/// compile returns the log. An `--offload-arch=` comgr does not know is refused
/// before hiprtc sees it (see the module docs).
pub fn compile(name: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
    let api = api()?;
    let arch = options
        .iter()
        .find_map(|o| o.strip_prefix("--offload-arch="))
        .unwrap_or_default()
        .to_owned();
    if !arch.is_empty() && supports(&arch) == Some(false) {
        let c = comgr().map(|c| (c.version, c.processors.join(" "))).unwrap_or_default();
        return Err(Error::KernelCompile {
            kernel: name.to_owned(),
            arch: arch.clone(),
            log: format!(
                "{UNSUPPORTED_TARGET} {}: hiprtc ({}) uses comgr {}.{}, which knows {}",
                processor(&arch),
                api.path,
                c.0.0,
                c.0.1,
                c.1
            ),
        });
    }
    // One compile at a time: HIP 5.x's hiprtc keeps global compiler state.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    api.rtc.compile(name, source, options, &arch, |prog| {
        api.rtc.read(prog, api.code_size, api.code, "hiprtcGetCode")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_kernel_fails_with_the_compiler_log_and_a_good_one_compiles() {
        if let Err(e) = version() {
            println!("SKIP a_broken_kernel_fails_with_the_compiler_log: no hiprtc ({e})");
            return;
        }
        let opts = ["--offload-arch=gfx90a".to_owned()];
        let source = "extern \"C\" __global__ void k() { undeclared(); }";
        match compile("broken.cu", source, &opts).unwrap_err() {
            Error::KernelCompile { kernel, arch, log } => {
                assert_eq!((kernel.as_str(), arch.as_str()), ("broken.cu", "gfx90a"));
                assert!(log.contains("undeclared"), "the log names the error: {log}");
            }
            other => panic!("expected KernelCompile, got {other:?}"),
        }
        let code = compile("ok.cu", "extern \"C\" __global__ void k(int* p) { *p = 1; }", &opts).unwrap();
        assert_eq!(&code[..4], b"\x7fELF", "a code object");
    }

    #[test]
    fn candidates_env_file_dir_and_sonames() {
        let plain = candidates(None, None);
        assert_eq!(plain, SONAMES.iter().map(PathBuf::from).collect::<Vec<_>>());
        assert_eq!(plain[0], PathBuf::from("libhiprtc.so.7"));
        assert!(
            plain.iter().position(|p| p.ends_with("libhiprtc.so"))
                < plain.iter().position(|p| p.ends_with("libamdhip64.so.5"))
        );

        let file = Path::new("/nonexistent/libhiprtc.so.6.4");
        let with_file = candidates(Some(file), None);
        assert_eq!(with_file[0], file);
        assert_eq!(with_file.len(), SONAMES.len() + 1);

        let dir = std::env::temp_dir();
        let with_dir = candidates(Some(&dir), None);
        assert_eq!(with_dir.len(), 2 * SONAMES.len());
        assert_eq!(with_dir[0], dir.join("libhiprtc.so.7"));
        assert_eq!(with_dir[SONAMES.len()], PathBuf::from("libhiprtc.so.7"));
    }

    #[test]
    fn candidates_put_the_linked_runtime_major_first() {
        let names = |v: Vec<PathBuf>| v.into_iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
        assert_eq!(
            names(candidates(None, Some(6))),
            [
                "libhiprtc.so.6",
                "libamdhip64.so.6",
                "libhiprtc.so.7",
                "libhiprtc.so",
                "libamdhip64.so.7",
                "libamdhip64.so.5",
                "libamdhip64.so"
            ]
        );
        // HIP 5: hiprtc lives in libamdhip64.so.5 itself.
        assert_eq!(names(candidates(None, Some(5)))[0], "libamdhip64.so.5");
        assert_eq!(candidates(None, Some(9)), candidates(None, None));
        let file = Path::new("/x/libhiprtc.so");
        assert_eq!(candidates(Some(file), Some(6))[0], file);
    }

    #[test]
    fn processor_of_target_ids() {
        assert_eq!(processor("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(processor("gfx942"), "gfx942");
        assert_eq!(isa_processor("amdgcn-amd-amdhsa--gfx90a:xnack+"), Some("gfx90a"));
        assert_eq!(isa_processor("amdgcn-amd-amdhsa--gfx1100"), Some("gfx1100"));
        assert_eq!(isa_processor("amdgcn-amd-amdpal--gfx1100"), None);
    }

    #[test]
    fn version_and_comgr_when_present() {
        match version() {
            Err(e) => println!("SKIP version_and_comgr_when_present: {e}"),
            Ok(((major, _), path)) => {
                assert!(major > 0, "hiprtc version {major}");
                assert!(!path.is_empty());
                if let Some(c) = comgr() {
                    assert!(c.processors.iter().all(|p| p.starts_with("gfx")), "{c:?}");
                    assert_eq!(supports("gfx90a:sramecc+:xnack-"), supports("gfx90a"));
                    assert_eq!(supports("gfx1"), Some(false));
                }
                assert!(identity().unwrap().starts_with("hiprtc "));
            }
        }
    }
}
