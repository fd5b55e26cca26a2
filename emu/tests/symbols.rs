//! The project never calls a driver or NVRTC function the emulator does not export.
//!
//! Collects every `cu*` function devtensor calls through cudarc (`sys::cuX` in src/, plus the
//! `cudarc::driver::result` wrappers it uses, mapped through the table below to the function
//! they call, as read in cudarc 0.19.10's src/driver/result.rs) and every `nvrtc*` function it
//! loads by name (src/backend/cuda/nvrtc.rs), then looks each up with `dlsym` in the cdylib
//! cargo built next to this test. cudarc resolves each symbol on first use and panics on a
//! missing one ("Missing symbol"), so a gap here is a crash in CI.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// `cudarc::driver::result::…` wrappers → the driver functions they call (result.rs).
const RESULT_WRAPPERS: &[(&str, &[&str])] = &[
    ("init", &["cuInit"]),
    ("device::get", &["cuDeviceGet"]),
    ("device::get_count", &["cuDeviceGetCount"]),
    ("device::get_name", &["cuDeviceGetName"]),
    ("device::total_mem", &["cuDeviceTotalMem_v2"]),
    ("device::get_attribute", &["cuDeviceGetAttribute"]),
    ("primary_ctx::retain", &["cuDevicePrimaryCtxRetain"]),
    ("ctx::get_current", &["cuCtxGetCurrent"]),
    ("ctx::set_current", &["cuCtxSetCurrent"]),
    ("ctx::synchronize", &["cuCtxSynchronize"]),
    ("stream::create", &["cuStreamCreate"]),
    ("stream::destroy", &["cuStreamDestroy_v2"]),
    ("stream::synchronize", &["cuStreamSynchronize"]),
    ("stream::wait_event", &["cuStreamWaitEvent"]),
    ("event::create", &["cuEventCreate"]),
    ("event::destroy", &["cuEventDestroy_v2"]),
    ("event::query", &["cuEventQuery"]),
    ("event::record", &["cuEventRecord"]),
    ("event::synchronize", &["cuEventSynchronize"]),
    ("malloc_sync", &["cuMemAlloc_v2"]),
    ("malloc_managed", &["cuMemAllocManaged"]),
    ("malloc_host", &["cuMemHostAlloc"]),
    ("free_sync", &["cuMemFree_v2"]),
    ("free_async", &["cuMemFreeAsync"]),
    ("free_host", &["cuMemFreeHost"]),
    ("mem_pool::create", &["cuMemPoolCreate"]),
    ("mem_pool::destroy", &["cuMemPoolDestroy"]),
    ("mem_pool::set_attribute", &["cuMemPoolSetAttribute"]),
    ("mem_pool::alloc_async", &["cuMemAllocFromPoolAsync"]),
    ("memcpy_peer_async", &["cuMemcpyPeerAsync"]),
    ("module::load_data", &["cuModuleLoadData"]),
    ("module::get_function", &["cuModuleGetFunction"]),
    ("module::unload", &["cuModuleUnload"]),
    ("launch_kernel", &["cuLaunchKernel"]),
    // DriverError::error_name / error_string, and its Debug/Display.
    ("DriverError", &["cuGetErrorName", "cuGetErrorString"]),
];

/// What cudarc's initialisation path calls whatever the project's code says, plus
/// `cuGetExportTable`: NVRTC 12.9 and 13.x `dlopen("libcuda.so.1")` inside nvrtcCompileProgram,
/// find the emulator (its soname), and when it exports `cuInit` call `cuGetExportTable` without
/// checking that dlsym found it (a segfault in NVRTC); it must exist and answer an error with
/// `*ppExportTable = NULL` (tests/nvrtc_shim.rs, real_nvrtc_compiles_with_the_emulator_loaded).
const ALWAYS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetExportTable",
];

fn project_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn ident_after(text: &str, at: usize) -> &str {
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Every `prefix<ident>` in `text`, as `<first><ident>` (e.g. "sys::" + "cuInit").
fn idents_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.match_indices(prefix)
        .map(|(i, _)| ident_after(text, i + prefix.len()))
        .filter(|s| !s.is_empty())
        .collect()
}

/// `result::a::b` paths (module path + function), as "a::b".
fn result_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("result::") {
        // Skip `std::result::`, `core::result::` and identifiers ending in `result` (`CUresult::`).
        let before = &text[..i];
        if before.ends_with("std::")
            || before.ends_with("core::")
            || before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut parts = Vec::new();
        let mut at = i + "result::".len();
        loop {
            let id = ident_after(text, at);
            if id.is_empty() {
                break;
            }
            parts.push(id);
            at += id.len();
            if text[at..].starts_with("::") {
                at += 2;
            } else {
                break;
            }
        }
        if !parts.is_empty() {
            out.push(parts.join("::"));
        }
    }
    out
}

fn wanted() -> (BTreeSet<String>, BTreeSet<String>) {
    let mut files = Vec::new();
    rust_files(&project_src(), &mut files);
    assert!(!files.is_empty(), "no sources under {}", project_src().display());
    let mut cu: BTreeSet<String> = ALWAYS.iter().map(|s| s.to_string()).collect();
    let mut unmapped = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for id in idents_after(&text, "sys::") {
            if id.starts_with("cu") && id[2..].starts_with(|c: char| c.is_ascii_uppercase()) {
                cu.insert(id.to_owned());
            }
        }
        if !text.contains("cudarc") && !text.contains("use super::") {
            continue;
        }
        for path in result_paths(&text) {
            match RESULT_WRAPPERS.iter().find(|(p, _)| *p == path) {
                Some((_, fns)) => cu.extend(fns.iter().map(|s| s.to_string())),
                None => {
                    unmapped.insert(format!("result::{path} ({})", f.display()));
                }
            }
        }
    }
    assert!(
        unmapped.is_empty(),
        "cudarc result:: calls missing from RESULT_WRAPPERS in emu/tests/symbols.rs (read cudarc's \
         src/driver/result.rs and add the cu* functions they call): {unmapped:?}"
    );
    let nvrtc_rs = project_src().join("backend/cuda/nvrtc.rs");
    let text = std::fs::read_to_string(&nvrtc_rs).unwrap();
    // Every `"nvrtcName"` string the loader resolves (`Symbols` and `rtc.symbol(..)`).
    let nv: BTreeSet<String> = text
        .match_indices("\"nvrtc")
        .map(|(i, _)| ident_after(&text, i + 1).to_owned())
        .filter(|s| s["nvrtc".len()..].starts_with(|c: char| c.is_ascii_uppercase()))
        .collect();
    assert!(nv.len() >= 11, "found only {nv:?} in {}", nvrtc_rs.display());
    (cu, nv)
}

/// The cdylib cargo built with this test (target/<profile>/deps/, or target/<profile>/).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [
        deps.join("libdevtensor_emu.so"),
        deps.parent().unwrap().join("libdevtensor_emu.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libdevtensor_emu.so not found at {candidates:?}"))
        .clone()
}

#[test]
fn scanner_finds_what_the_research_listed() {
    let (cu, nv) = wanted();
    for f in [
        "cuLaunchKernel",
        "cuModuleLoadData",
        "cuMemcpy2DAsync_v2",
        "cuDeviceTotalMem_v2",
        "cuEventElapsedTime_v2",
    ] {
        assert!(cu.contains(f), "{f} not found by the scan: {cu:?}");
    }
    assert!(nv.contains("nvrtcGetCUBIN") && nv.contains("nvrtcVersion"), "{nv:?}");
    println!("project calls {} cu* and {} nvrtc* functions", cu.len(), nv.len());
}

#[test]
fn the_emulator_exports_every_function_the_project_calls() {
    let (cu, nv) = wanted();
    let lib = cdylib();
    let c = CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; the emulator's initialisers are Rust statics (lazy).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {} failed", lib.display());
    let missing: Vec<&String> = cu
        .iter()
        .chain(nv.iter())
        .filter(|name| {
            let n = CString::new(name.as_str()).unwrap();
            // SAFETY: live handle, valid C string.
            unsafe { libc::dlsym(h, n.as_ptr()) }.is_null()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not export {} of the {} functions devtensor calls: {}",
        lib.display(),
        missing.len(),
        cu.len() + nv.len(),
        missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    );
}
