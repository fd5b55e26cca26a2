//! The NVRTC shim: `nvrtc*` functions exported from the emulator's cdylib, forwarded to the real
//! NVRTC (from pip), which also record, for every cubin handed out, the PTX it was compiled from.
//!
//! Why: the cubin NVRTC emits for `sm_XY` carries SASS only (no PTX section), and the emulated
//! driver interprets PTX. The project keeps calling NVRTC exactly as on a real GPU (it opens
//! `DEVTENSOR_NVRTC`, which `ci/emu.sh` points at this library installed as `libnvrtc.so.13`);
//! when it asks for the cubin, the shim stores the program's PTX under the cubin's hash
//! ([`cubin_hash`]) in memory and on disk, and `cuModuleLoadData` finds it with
//! [`ptx_for_cubin`] — also for a cubin the project read back from its own disk cache in a later
//! process.
//!
//! The PTX: `nvrtcGetPTX` on the very program compiled for `sm_XY`. For NVRTC 12.9 and 13.x this
//! is byte-for-byte the PTX of the same program compiled for `compute_XY` (checked for
//! strided_copy.cu at sm_80/90/120 with both; `tests/nvrtc_shim.rs` checks it again); when it is
//! unavailable, or when `DEVTENSOR_EMU_PTX_RECOMPILE=1`, the shim compiles the recorded source,
//! headers, name expressions and options again with the architecture replaced by `compute_XY`.
//!
//! The real library: `DEVTENSOR_EMU_NVRTC` (a file, or a directory holding `libnvrtc.so.13`,
//! `.12` or `libnvrtc.so`), else `libnvrtc.so.13` then `libnvrtc.so.12` on the loader path. Since
//! this library may itself be installed as `libnvrtc.so.13`, a candidate that resolves to this
//! very object is refused (compared with `dladdr`), with a message saying so.
//!
//! API semantics follow the NVRTC User Guide (<https://docs.nvidia.com/cuda/nvrtc/>, "NVRTC API"
//! section: nvrtcCreateProgram, nvrtcCompileProgram, nvrtcGetCUBIN, …); return codes are
//! `nvrtcResult` values from that page. Compile errors and logs pass through unchanged.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// `nvrtcResult`.
pub type NvrtcResult = c_int;
/// `nvrtcProgram`: here a pointer to the shim's own [`Program`].
pub type NvrtcProgram = *mut c_void;

pub const NVRTC_SUCCESS: NvrtcResult = 0;
pub const NVRTC_ERROR_OUT_OF_MEMORY: NvrtcResult = 1;
pub const NVRTC_ERROR_PROGRAM_CREATION_FAILURE: NvrtcResult = 2;
pub const NVRTC_ERROR_INVALID_INPUT: NvrtcResult = 3;
pub const NVRTC_ERROR_INVALID_PROGRAM: NvrtcResult = 4;
pub const NVRTC_ERROR_INVALID_OPTION: NvrtcResult = 5;
pub const NVRTC_ERROR_COMPILATION: NvrtcResult = 6;
pub const NVRTC_ERROR_INTERNAL_ERROR: NvrtcResult = 11;

type Prog = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Prog,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type SizeFn = unsafe extern "C" fn(Prog, *mut usize) -> NvrtcResult;
type GetFn = unsafe extern "C" fn(Prog, *mut c_char) -> NvrtcResult;

/// The real NVRTC's entry points.
struct Real {
    path: String,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create: CreateFn,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Prog) -> NvrtcResult,
    log_size: SizeFn,
    log: GetFn,
    ptx_size: SizeFn,
    ptx: GetFn,
    cubin_size: SizeFn,
    cubin: GetFn,
    num_archs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
    archs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
    add_name: Option<unsafe extern "C" fn(Prog, *const c_char) -> NvrtcResult>,
    lowered_name: Option<unsafe extern "C" fn(Prog, *const c_char, *mut *const c_char) -> NvrtcResult>,
}

/// The base address of the object holding `addr`, per `dladdr`.
fn object_base(addr: *const c_void) -> Option<usize> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    (ok != 0 && !info.dli_fbase.is_null()).then_some(info.dli_fbase as usize)
}

fn object_path(addr: *const c_void) -> Option<String> {
    // SAFETY: as in `object_base`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as in `object_base`.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// A function pointer from a `dlsym` result.
///
/// # Safety
///
/// `p` must be non-null and point to a function whose signature is `F`, a function-pointer type.
unsafe fn fn_from_ptr<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller guarantees `F` is the pointee's signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// The real-NVRTC candidates, in order.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = crate::config::get().nvrtc.clone() {
        if p.is_dir() {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                out.push(p.join(name));
            }
        } else {
            out.push(p);
        }
        return out;
    }
    out.push(PathBuf::from("libnvrtc.so.13"));
    out.push(PathBuf::from("libnvrtc.so.12"));
    out
}

fn load() -> Result<Real, String> {
    let own = object_base(nvrtcVersion as *const c_void);
    let mut tried = Vec::new();
    for path in candidates() {
        let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: a valid C string; RTLD_LOCAL keeps the real NVRTC's symbols from interposing
        // this library's.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            tried.push(format!("{}: {}", path.display(), dlerror_string()));
            continue;
        }
        let sym = |name: &str| -> *mut c_void {
            let n = CString::new(name).unwrap_or_default();
            // SAFETY: `h` is a live handle and `n` a valid C string.
            unsafe { libc::dlsym(h, n.as_ptr()) }
        };
        let version = sym("nvrtcVersion");
        if !version.is_null() && object_base(version).is_some() && object_base(version) == own {
            tried.push(format!(
                "{}: resolves to this shim itself ({}); set DEVTENSOR_EMU_NVRTC to the real libnvrtc",
                path.display(),
                object_path(version).unwrap_or_default()
            ));
            // SAFETY: `h` came from dlopen above; this drops only the reference it added.
            unsafe { libc::dlclose(h) };
            continue;
        }
        macro_rules! need {
            ($name:literal) => {{
                let p = sym($name);
                if p.is_null() {
                    tried.push(format!("{}: no symbol {}", path.display(), $name));
                    // SAFETY: `h` came from dlopen above.
                    unsafe { libc::dlclose(h) };
                    continue;
                }
                // SAFETY: the symbol is the nvrtc.h function of the same name, whose C
                // signature is the type of the field this value is stored in.
                unsafe { fn_from_ptr(p) }
            }};
        }
        macro_rules! opt {
            ($name:literal) => {{
                let p = sym($name);
                // SAFETY: as in `need!`.
                (!p.is_null()).then(|| unsafe { fn_from_ptr(p) })
            }};
        }
        let real = Real {
            path: if version.is_null() {
                path.display().to_string()
            } else {
                object_path(version).unwrap_or_else(|| path.display().to_string())
            },
            version: need!("nvrtcVersion"),
            get_error_string: need!("nvrtcGetErrorString"),
            create: need!("nvrtcCreateProgram"),
            compile: need!("nvrtcCompileProgram"),
            destroy: need!("nvrtcDestroyProgram"),
            log_size: need!("nvrtcGetProgramLogSize"),
            log: need!("nvrtcGetProgramLog"),
            ptx_size: need!("nvrtcGetPTXSize"),
            ptx: need!("nvrtcGetPTX"),
            cubin_size: need!("nvrtcGetCUBINSize"),
            cubin: need!("nvrtcGetCUBIN"),
            num_archs: opt!("nvrtcGetNumSupportedArchs"),
            archs: opt!("nvrtcGetSupportedArchs"),
            add_name: opt!("nvrtcAddNameExpression"),
            lowered_name: opt!("nvrtcGetLoweredName"),
        };
        return Ok(real);
    }
    Err(format!(
        "devtensor-emu NVRTC shim: no real libnvrtc (tried {}); set DEVTENSOR_EMU_NVRTC to pip's \
         nvidia/cu13/lib or nvidia/cuda_nvrtc/lib",
        tried.join("; ")
    ))
}

fn real() -> Result<&'static Real, NvrtcResult> {
    static REAL: OnceLock<Result<Real, String>> = OnceLock::new();
    static WARNED: std::sync::Once = std::sync::Once::new();
    match REAL.get_or_init(load) {
        Ok(r) => Ok(r),
        Err(e) => {
            WARNED.call_once(|| eprintln!("{e}"));
            Err(NVRTC_ERROR_INTERNAL_ERROR)
        }
    }
}

/// Where the real NVRTC was loaded from, or why it could not be.
pub fn real_nvrtc_path() -> Result<String, String> {
    match real() {
        Ok(r) => Ok(r.path.clone()),
        Err(_) => Err(load().err().unwrap_or_default()),
    }
}

/// What the shim keeps per program (the handle `nvrtcCreateProgram` returns points to it).
pub struct Program {
    real: Prog,
    source: CString,
    name: Option<CString>,
    headers: Vec<(Option<CString>, Option<CString>)>,
    options: Vec<CString>,
    name_exprs: Vec<CString>,
    /// The hash of the cubin whose PTX was recorded (so it is done once).
    recorded: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Live program handles (an unknown handle answers NVRTC_ERROR_INVALID_PROGRAM).
fn live() -> &'static Mutex<HashSet<usize>> {
    static LIVE: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// The program behind `prog`, if it is a live handle.
///
/// Programs are not thread-safe in NVRTC either ("The NVRTC API calls on a given
/// nvrtcProgram must be serialised", NVRTC User Guide, thread safety): the caller serialises
/// calls on one handle, so handing out `&mut` here is as sound as NVRTC's own contract.
fn program<'a>(prog: NvrtcProgram) -> Result<&'a mut Program, NvrtcResult> {
    if prog.is_null() || !lock(live()).contains(&(prog as usize)) {
        return Err(NVRTC_ERROR_INVALID_PROGRAM);
    }
    // SAFETY: `prog` is a live pointer from Box::into_raw in nvrtcCreateProgram (checked
    // against the registry above) and calls on one program are serialised by the caller.
    Ok(unsafe { &mut *prog.cast::<Program>() })
}

/// Runs an exported function's body: a panic becomes NVRTC_ERROR_INTERNAL_ERROR.
fn guard(f: impl FnOnce() -> Result<NvrtcResult, NvrtcResult>) -> NvrtcResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) | Ok(Err(r)) => r,
        Err(_) => {
            eprintln!("devtensor-emu NVRTC shim: internal panic");
            NVRTC_ERROR_INTERNAL_ERROR
        }
    }
}

/// A C string argument copied, or None for null.
///
/// # Safety
///
/// `p` must be null or a NUL-terminated string.
unsafe fn copy_cstr(p: *const c_char) -> Option<CString> {
    // SAFETY: the caller guarantees `p` is null or NUL-terminated.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The PTX record: cubin hash -> PTX, in memory and on disk.

/// FNV-1a 64 of the cubin image, as 16 lowercase hex digits. The image is the ELF's own extent
/// ([`crate::cubin::image_len`]) when the header gives one within `cubin`, so a buffer with
/// trailing bytes and the exact image hash alike; otherwise all of `cubin`.
pub fn cubin_hash(cubin: &[u8]) -> String {
    let len = if cubin.len() >= 64 {
        // SAFETY: `cubin` has at least 64 readable bytes.
        match unsafe { crate::cubin::image_len(cubin.as_ptr()) } {
            Some(n) if n <= cubin.len() => n,
            _ => cubin.len(),
        }
    } else {
        cubin.len()
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in &cubin[..len] {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn memory() -> &'static Mutex<HashMap<String, String>> {
    static MEM: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    MEM.get_or_init(Default::default)
}

/// The directory PTX records are written to: `DEVTENSOR_EMU_PTX_CACHE`, default
/// `$XDG_CACHE_HOME/devtensor-emu` or `~/.cache/devtensor-emu` (emu/README.md, config.rs).
pub fn ptx_cache_dir() -> Option<PathBuf> {
    crate::config::get().ptx_cache.clone()
}

fn record_path(dir: &Path, hash: &str) -> PathBuf {
    dir.join(format!("{hash}.ptx"))
}

/// Records `ptx` as the PTX of the cubin with hash `hash` (memory, then disk, written
/// atomically: a temporary file renamed into place).
pub fn record_ptx(hash: &str, ptx: &str) {
    lock(memory()).insert(hash.to_owned(), ptx.to_owned());
    let Some(dir) = ptx_cache_dir() else { return };
    let path = record_path(&dir, hash);
    if std::fs::read_to_string(&path).is_ok_and(|old| old == ptx) {
        return;
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{hash}.ptx.tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, ptx))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        eprintln!("devtensor-emu NVRTC shim: could not write {}: {e}", path.display());
    }
}

/// The PTX recorded for this cubin (memory first, then the disk cache).
pub fn ptx_for_cubin(cubin: &[u8]) -> Option<String> {
    ptx_for_hash(&cubin_hash(cubin))
}

/// The PTX recorded under a [`cubin_hash`].
pub fn ptx_for_hash(hash: &str) -> Option<String> {
    if let Some(p) = lock(memory()).get(hash) {
        return Some(p.clone());
    }
    let ptx = std::fs::read_to_string(record_path(&ptx_cache_dir()?, hash)).ok()?;
    lock(memory()).insert(hash.to_owned(), ptx.clone());
    Some(ptx)
}

// ---------------------------------------------------------------------------------------------
// Options: the target architecture.

/// The value of the last `--gpu-architecture` / `-arch` option, with the index of the option
/// string(s) holding it. NVRTC accepts `--gpu-architecture=X`, `-arch=X`, and the option
/// followed by `X` as the next string (not `-arch X` in one string); the last one wins.
fn arch_option(options: &[CString]) -> Option<(usize, bool, String)> {
    let mut found = None;
    let mut i = 0;
    while i < options.len() {
        let o = options[i].to_string_lossy();
        for flag in ["--gpu-architecture", "-arch"] {
            if let Some(v) = o.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                found = Some((i, false, v.to_owned()));
            } else if o == flag {
                if let Some(next) = options.get(i + 1) {
                    found = Some((i, true, next.to_string_lossy().into_owned()));
                    i += 1;
                }
            }
        }
        i += 1;
    }
    found
}

/// `sm_90` → `compute_90` (and `sm_90a` → `compute_90a`); None for a virtual target.
fn virtual_arch(arch: &str) -> Option<String> {
    arch.strip_prefix("sm_").map(|xy| format!("compute_{xy}"))
}

fn options_for_ptx(options: &[CString]) -> Option<Vec<CString>> {
    let (i, separate, arch) = arch_option(options)?;
    let compute = CString::new(virtual_arch(&arch)?).ok()?;
    let mut out = options.to_vec();
    if separate {
        out[i + 1] = compute;
    } else {
        let flag = options[i].to_string_lossy();
        let flag = flag.split('=').next().unwrap_or("--gpu-architecture");
        out[i] = CString::new(format!("{flag}={}", compute.to_string_lossy())).ok()?;
    }
    Some(out)
}

fn read_out(prog: Prog, size: SizeFn, get: GetFn) -> Result<Vec<u8>, NvrtcResult> {
    let mut n = 0usize;
    // SAFETY: `prog` is a live real program; `n` is a valid out-pointer.
    let rc = unsafe { size(prog, &mut n) };
    if rc != NVRTC_SUCCESS {
        return Err(rc);
    }
    let mut buf = vec![0u8; n.max(1)];
    // SAFETY: `buf` holds the `n` bytes NVRTC reported (at least 1).
    let rc = unsafe { get(prog, buf.as_mut_ptr().cast()) };
    if rc != NVRTC_SUCCESS {
        return Err(rc);
    }
    buf.truncate(n);
    Ok(buf)
}

fn ptx_text(bytes: Vec<u8>) -> Option<String> {
    let s = String::from_utf8(bytes).ok()?;
    let s = s.trim_end_matches('\0');
    (!s.is_empty()).then(|| s.to_owned())
}

/// Compiles `p` again for `compute_XY` and returns its PTX.
fn recompile_ptx(r: &Real, p: &Program) -> Result<String, String> {
    let opts = options_for_ptx(&p.options).ok_or("no sm_XY architecture option")?;
    let hdr_src: Vec<*const c_char> = p
        .headers
        .iter()
        .map(|(s, _)| s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        .collect();
    let hdr_name: Vec<*const c_char> = p
        .headers
        .iter()
        .map(|(_, n)| n.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        .collect();
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: the strings are owned by `p` and outlive the call; the header arrays hold
    // `headers.len()` entries (or are null when there are none).
    let rc = unsafe {
        (r.create)(
            &mut prog,
            p.source.as_ptr(),
            p.name.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            p.headers.len() as c_int,
            if p.headers.is_empty() {
                std::ptr::null()
            } else {
                hdr_src.as_ptr()
            },
            if p.headers.is_empty() {
                std::ptr::null()
            } else {
                hdr_name.as_ptr()
            },
        )
    };
    if rc != NVRTC_SUCCESS {
        return Err(format!("nvrtcCreateProgram: {rc}"));
    }
    let result = (|| {
        if let Some(add) = r.add_name {
            for e in &p.name_exprs {
                // SAFETY: `prog` is live; `e` is a valid C string.
                let rc = unsafe { add(prog, e.as_ptr()) };
                if rc != NVRTC_SUCCESS {
                    return Err(format!("nvrtcAddNameExpression: {rc}"));
                }
            }
        }
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is live; `ptrs` holds `len` valid C strings owned by `opts`.
        let rc = unsafe { (r.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
        if rc != NVRTC_SUCCESS {
            let log = read_out(prog, r.log_size, r.log)
                .ok()
                .and_then(ptx_text)
                .unwrap_or_default();
            return Err(format!("compile for compute_XY failed ({rc}): {log}"));
        }
        read_out(prog, r.ptx_size, r.ptx)
            .ok()
            .and_then(ptx_text)
            .ok_or_else(|| "no PTX".to_owned())
    })();
    // SAFETY: `prog` is live and destroyed once.
    unsafe { (r.destroy)(&mut prog) };
    result
}

/// 0: read `DEVTENSOR_EMU_PTX_RECOMPILE`; 1: off; 2: on.
static RECOMPILE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn force_recompile() -> bool {
    match RECOMPILE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => std::env::var("DEVTENSOR_EMU_PTX_RECOMPILE").is_ok_and(|v| v.trim() == "1"),
    }
}

/// Always take the PTX from a second compile for `compute_XY` instead of the program's own
/// `nvrtcGetPTX` (as `DEVTENSOR_EMU_PTX_RECOMPILE=1` does). For tests and cross-checks.
pub fn set_ptx_recompile(on: bool) {
    RECOMPILE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Drops the in-memory records (the disk cache stays), as a new process would see them.
/// For tests.
pub fn forget_memory_records() {
    lock(memory()).clear();
}

/// After a cubin was handed out: record its PTX under its hash (once per program).
fn record_for(r: &Real, p: &mut Program, cubin: &[u8]) {
    if cubin.is_empty() {
        return;
    }
    let hash = cubin_hash(cubin);
    if p.recorded.as_deref() == Some(hash.as_str()) {
        return;
    }
    let same_program = if force_recompile() {
        None
    } else {
        read_out(p.real, r.ptx_size, r.ptx).ok().and_then(ptx_text)
    };
    let ptx = match same_program {
        Some(ptx) => ptx,
        None => match recompile_ptx(r, p) {
            Ok(ptx) => ptx,
            Err(e) => {
                eprintln!(
                    "devtensor-emu NVRTC shim: no PTX recorded for cubin {hash} of {}: {e}",
                    p.name.as_ref().map_or("(unnamed)".into(), |n| n.to_string_lossy())
                );
                return;
            }
        },
    };
    record_ptx(&hash, &ptx);
    p.recorded = Some(hash);
}

// ---------------------------------------------------------------------------------------------
// The exported functions (nvrtc.h).

/// `nvrtcVersion`: the real NVRTC's version.
///
/// # Safety
///
/// `major` and `minor` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> NvrtcResult {
    guard(|| {
        let r = real()?;
        // SAFETY: forwarded unchanged; the real NVRTC checks the pointers.
        Ok(unsafe { (r.version)(major, minor) })
    })
}

static OWN_ERRORS: [&CStr; 13] = [
    c"NVRTC_SUCCESS",
    c"NVRTC_ERROR_OUT_OF_MEMORY",
    c"NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
    c"NVRTC_ERROR_INVALID_INPUT",
    c"NVRTC_ERROR_INVALID_PROGRAM",
    c"NVRTC_ERROR_INVALID_OPTION",
    c"NVRTC_ERROR_COMPILATION",
    c"NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
    c"NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
    c"NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    c"NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
    c"NVRTC_ERROR_INTERNAL_ERROR",
    c"NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
];

/// `nvrtcGetErrorString`: the real NVRTC's text, or the enumerator's name when none is loaded.
///
/// # Safety
///
/// Always safe to call; `unsafe` only because it is an exported C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetErrorString(result: NvrtcResult) -> *const c_char {
    let r = catch_unwind(|| match real() {
        // SAFETY: nvrtcGetErrorString returns a static string for any value.
        Ok(r) => unsafe { (r.get_error_string)(result) },
        Err(_) => usize::try_from(result)
            .ok()
            .and_then(|i| OWN_ERRORS.get(i))
            .map_or(c"NVRTC_ERROR unknown".as_ptr(), |s| s.as_ptr()),
    });
    r.unwrap_or(c"NVRTC_ERROR_INTERNAL_ERROR".as_ptr())
}

/// `nvrtcCreateProgram`: creates the real program and a shim handle remembering the inputs.
///
/// # Safety
///
/// As for NVRTC: `prog` valid for a write; `src` a C string; `name` null or a C string;
/// `headers`/`include_names` null or arrays of `num_headers` C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut NvrtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> NvrtcResult {
    guard(|| {
        let r = real()?;
        if prog.is_null() || src.is_null() {
            return Err(NVRTC_ERROR_INVALID_INPUT);
        }
        let mut real_prog: Prog = std::ptr::null_mut();
        // SAFETY: forwarded unchanged (the real NVRTC validates the header arrays).
        let rc = unsafe { (r.create)(&mut real_prog, src, name, num_headers, headers, include_names) };
        if rc != NVRTC_SUCCESS {
            return Err(rc);
        }
        let n = usize::try_from(num_headers).unwrap_or(0);
        let mut hdrs = Vec::with_capacity(n);
        for i in 0..n {
            let entry = |arr: *const *const c_char| {
                // SAFETY: NVRTC accepted the arrays: each is null or holds `num_headers` C strings.
                (!arr.is_null()).then(|| unsafe { copy_cstr(*arr.add(i)) }).flatten()
            };
            let (s, nm) = (entry(headers), entry(include_names));
            hdrs.push((s, nm));
        }
        let p = Box::new(Program {
            real: real_prog,
            // SAFETY: `src` is a non-null C string (checked; NVRTC accepted it).
            source: unsafe { CStr::from_ptr(src) }.to_owned(),
            // SAFETY: `name` is null or a C string.
            name: unsafe { copy_cstr(name) },
            headers: hdrs,
            options: Vec::new(),
            name_exprs: Vec::new(),
            recorded: None,
        });
        let h = Box::into_raw(p);
        lock(live()).insert(h as usize);
        // SAFETY: `prog` is non-null and valid for a write (caller contract).
        unsafe { *prog = h.cast() };
        Ok(NVRTC_SUCCESS)
    })
}

/// `nvrtcDestroyProgram`.
///
/// # Safety
///
/// `prog` must be null or valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut NvrtcProgram) -> NvrtcResult {
    guard(|| {
        let r = real()?;
        if prog.is_null() {
            return Err(NVRTC_ERROR_INVALID_PROGRAM);
        }
        // SAFETY: `prog` is non-null and readable (caller contract).
        let h = unsafe { *prog };
        if h.is_null() || !lock(live()).remove(&(h as usize)) {
            return Err(NVRTC_ERROR_INVALID_PROGRAM);
        }
        // SAFETY: `h` was live in the registry (just removed, so destroyed once) and came from
        // Box::into_raw.
        let mut p = unsafe { Box::from_raw(h.cast::<Program>()) };
        // SAFETY: the real program is live and destroyed once.
        let rc = unsafe { (r.destroy)(&mut p.real) };
        // SAFETY: `prog` is valid for a write (caller contract).
        unsafe { *prog = std::ptr::null_mut() };
        Ok(rc)
    })
}

/// `nvrtcCompileProgram`: forwarded; the options are remembered for the PTX record.
///
/// # Safety
///
/// `options` must be null or an array of `num_options` C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: NvrtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> NvrtcResult {
    guard(|| {
        let r = real()?;
        let p = program(prog)?;
        let mut opts = Vec::new();
        if !options.is_null() {
            for i in 0..usize::try_from(num_options).unwrap_or(0) {
                // SAFETY: `options` holds `num_options` entries (caller contract).
                let o = unsafe { *options.add(i) };
                // SAFETY: each entry is null or a C string.
                if let Some(c) = unsafe { copy_cstr(o) } {
                    opts.push(c);
                }
            }
        }
        // SAFETY: forwarded unchanged to the real program.
        let rc = unsafe { (r.compile)(p.real, num_options, options) };
        p.options = opts;
        p.recorded = None;
        Ok(rc)
    })
}

macro_rules! forward_size {
    ($(#[$doc:meta])* $name:ident, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `size` must be null or valid for a write.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(prog: NvrtcProgram, size: *mut usize) -> NvrtcResult {
            guard(|| {
                let r = real()?;
                let p = program(prog)?;
                // SAFETY: forwarded unchanged to the real program.
                Ok(unsafe { (r.$field)(p.real, size) })
            })
        }
    };
}

macro_rules! forward_get {
    ($(#[$doc:meta])* $name:ident, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `out` must be valid for as many bytes as the matching `…Size` call reported.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(prog: NvrtcProgram, out: *mut c_char) -> NvrtcResult {
            guard(|| {
                let r = real()?;
                let p = program(prog)?;
                // SAFETY: forwarded unchanged to the real program.
                Ok(unsafe { (r.$field)(p.real, out) })
            })
        }
    };
}

forward_size!(
    /// `nvrtcGetProgramLogSize`.
    nvrtcGetProgramLogSize, log_size
);
forward_get!(
    /// `nvrtcGetProgramLog`.
    nvrtcGetProgramLog, log
);
forward_size!(
    /// `nvrtcGetPTXSize`.
    nvrtcGetPTXSize, ptx_size
);
forward_get!(
    /// `nvrtcGetPTX`.
    nvrtcGetPTX, ptx
);
forward_size!(
    /// `nvrtcGetCUBINSize`.
    nvrtcGetCUBINSize, cubin_size
);

/// `nvrtcGetCUBIN`: forwarded; on success the program's PTX is recorded under the cubin's hash.
///
/// # Safety
///
/// `cubin` must be valid for as many bytes as `nvrtcGetCUBINSize` reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: NvrtcProgram, cubin: *mut c_char) -> NvrtcResult {
    guard(|| {
        let r = real()?;
        let p = program(prog)?;
        // SAFETY: forwarded unchanged to the real program.
        let rc = unsafe { (r.cubin)(p.real, cubin) };
        if rc != NVRTC_SUCCESS || cubin.is_null() {
            return Ok(rc);
        }
        let mut n = 0usize;
        // SAFETY: live real program; valid out-pointer.
        if unsafe { (r.cubin_size)(p.real, &mut n) } == NVRTC_SUCCESS && n > 0 {
            // SAFETY: NVRTC just wrote `n` bytes at `cubin`.
            let bytes = unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), n) };
            record_for(r, p, bytes);
        }
        Ok(rc)
    })
}

/// `nvrtcGetNumSupportedArchs` (NVRTC 11.2+).
///
/// # Safety
///
/// `num` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetNumSupportedArchs(num: *mut c_int) -> NvrtcResult {
    guard(|| {
        let f = real()?.num_archs.ok_or(NVRTC_ERROR_INTERNAL_ERROR)?;
        // SAFETY: forwarded unchanged.
        Ok(unsafe { f(num) })
    })
}

/// `nvrtcGetSupportedArchs` (NVRTC 11.2+).
///
/// # Safety
///
/// `archs` must be valid for as many ints as `nvrtcGetNumSupportedArchs` reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetSupportedArchs(archs: *mut c_int) -> NvrtcResult {
    guard(|| {
        let f = real()?.archs.ok_or(NVRTC_ERROR_INTERNAL_ERROR)?;
        // SAFETY: forwarded unchanged.
        Ok(unsafe { f(archs) })
    })
}

/// `nvrtcAddNameExpression`: forwarded, and remembered for a `compute_XY` recompile.
///
/// # Safety
///
/// `name_expression` must be null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcAddNameExpression(prog: NvrtcProgram, name_expression: *const c_char) -> NvrtcResult {
    guard(|| {
        let f = real()?.add_name.ok_or(NVRTC_ERROR_INTERNAL_ERROR)?;
        let p = program(prog)?;
        // SAFETY: forwarded unchanged.
        let rc = unsafe { f(p.real, name_expression) };
        if rc == NVRTC_SUCCESS {
            // SAFETY: NVRTC accepted it, so it is a C string.
            if let Some(c) = unsafe { copy_cstr(name_expression) } {
                p.name_exprs.push(c);
            }
        }
        Ok(rc)
    })
}

/// `nvrtcGetLoweredName`: forwarded (the string is owned by the real program).
///
/// # Safety
///
/// `name_expression` a C string; `lowered_name` null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetLoweredName(
    prog: NvrtcProgram,
    name_expression: *const c_char,
    lowered_name: *mut *const c_char,
) -> NvrtcResult {
    guard(|| {
        let f = real()?.lowered_name.ok_or(NVRTC_ERROR_INTERNAL_ERROR)?;
        let p = program(prog)?;
        // SAFETY: forwarded unchanged.
        Ok(unsafe { f(p.real, name_expression, lowered_name) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: &[&str]) -> Vec<CString> {
        v.iter().map(|s| CString::new(*s).unwrap()).collect()
    }

    fn strs(v: &[CString]) -> Vec<String> {
        v.iter().map(|c| c.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn arch_spellings() {
        for (given, want) in [
            (
                vec!["--gpu-architecture=sm_90", "--std=c++17"],
                vec!["--gpu-architecture=compute_90", "--std=c++17"],
            ),
            (vec!["-arch=sm_80"], vec!["-arch=compute_80"]),
            (vec!["-arch", "sm_120"], vec!["-arch", "compute_120"]),
            (
                vec!["--gpu-architecture", "sm_90a", "-default-device"],
                vec!["--gpu-architecture", "compute_90a", "-default-device"],
            ),
            // The last one wins, as in NVRTC.
            (
                vec!["-arch=sm_80", "--gpu-architecture=sm_90"],
                vec!["-arch=sm_80", "--gpu-architecture=compute_90"],
            ),
        ] {
            assert_eq!(strs(&options_for_ptx(&opts(&given)).unwrap()), want, "{given:?}");
        }
        assert!(options_for_ptx(&opts(&["-arch=compute_90"])).is_none());
        assert!(options_for_ptx(&opts(&["--std=c++17"])).is_none());
        assert!(options_for_ptx(&opts(&["-arch"])).is_none());
    }

    #[test]
    fn hash_is_fnv1a_over_the_image() {
        // FNV-1a 64 test vectors (the empty string and "a").
        assert_eq!(cubin_hash(b""), "cbf29ce484222325");
        assert_eq!(cubin_hash(b"a"), "af63dc4c8601ec8c");
        // An ELF header whose extent is 64 bytes: trailing bytes do not change the hash.
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let h = cubin_hash(&elf);
        elf.extend_from_slice(&[1, 2, 3]);
        assert_eq!(cubin_hash(&elf), h);
    }

    #[test]
    fn error_names_without_nvrtc() {
        assert_eq!(
            OWN_ERRORS[NVRTC_ERROR_INTERNAL_ERROR as usize],
            c"NVRTC_ERROR_INTERNAL_ERROR"
        );
        assert_eq!(OWN_ERRORS[NVRTC_ERROR_COMPILATION as usize], c"NVRTC_ERROR_COMPILATION");
    }
}
