//! The NVRTC shim (src/nvrtc.rs) against pip's real NVRTC 12 and 13: forwarding, PTX records
//! by cubin hash (memory and disk), the compute_XY recompile path, errors passing through, and
//! the refusal to forward to itself. Each NVRTC runs in a child process (the shim binds one real
//! library per process). Without NVRTC every test prints SKIP.

mod nvrtc_support;

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use devtensor_emu::config::{self, Config};
use devtensor_emu::nvrtc::{self, *};
use nvrtc_support::{RealNvrtc, cstr, project_options, real_nvrtc_libs, skip, strided_copy_source};

const CHILD_ENV: &str = "DEVTENSOR_EMU_TEST_SHIM_NVRTC";
const SELF_ENV: &str = "DEVTENSOR_EMU_TEST_SHIM_SELF";

fn run_child(test: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    // The same test, run again in a child with `envs` set: it then acts as its own child.
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn shim_forwards_and_records_ptx_with_each_real_nvrtc() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_checks();
    }
    let libs = real_nvrtc_libs();
    if libs.is_empty() {
        skip(
            "shim_forwards_and_records_ptx_with_each_real_nvrtc",
            "no real NVRTC (set DEVTENSOR_NVRTC)",
        );
        return;
    }
    for lib in libs {
        let out = run_child(
            "shim_forwards_and_records_ptx_with_each_real_nvrtc",
            &[(CHILD_ENV, lib.to_str().unwrap())],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}:\n{text}", lib.display());
        assert!(text.contains("child_checks: all passed"), "{}:\n{text}", lib.display());
        println!("{}: shim checks passed", lib.display());
    }
}

struct Prog(NvrtcProgram);

fn create(src: &str, headers: &[(&str, &str)]) -> Prog {
    let src = CString::new(src).unwrap();
    let hs: Vec<CString> = headers.iter().map(|h| CString::new(h.1).unwrap()).collect();
    let hn: Vec<CString> = headers.iter().map(|h| CString::new(h.0).unwrap()).collect();
    let hs_p: Vec<*const c_char> = hs.iter().map(|c| c.as_ptr()).collect();
    let hn_p: Vec<*const c_char> = hn.iter().map(|c| c.as_ptr()).collect();
    let mut p: NvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid C strings and arrays of `headers.len()` entries.
    let rc = unsafe {
        nvrtcCreateProgram(
            &mut p,
            src.as_ptr(),
            c"t.cu".as_ptr(),
            headers.len() as c_int,
            hs_p.as_ptr(),
            hn_p.as_ptr(),
        )
    };
    assert_eq!(rc, NVRTC_SUCCESS);
    Prog(p)
}

impl Prog {
    fn compile(&self, opts: &[&str]) -> c_int {
        let c: Vec<CString> = opts.iter().map(|o| CString::new(*o).unwrap()).collect();
        let p: Vec<*const c_char> = c.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: live program; `p` holds valid C strings.
        unsafe { nvrtcCompileProgram(self.0, p.len() as c_int, p.as_ptr()) }
    }

    fn read(
        &self,
        size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
        get: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    ) -> Vec<u8> {
        let mut n = 0;
        // SAFETY: live program, valid out-pointer.
        assert_eq!(unsafe { size(self.0, &mut n) }, NVRTC_SUCCESS);
        let mut v = vec![0u8; n.max(1)];
        // SAFETY: `v` holds n bytes.
        assert_eq!(unsafe { get(self.0, v.as_mut_ptr().cast()) }, NVRTC_SUCCESS);
        v.truncate(n);
        v
    }

    fn cubin(&self) -> Vec<u8> {
        self.read(nvrtcGetCUBINSize, nvrtcGetCUBIN)
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.read(nvrtcGetProgramLogSize, nvrtcGetProgramLog))
            .trim_end_matches('\0')
            .into()
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a live handle or null (then INVALID_PROGRAM).
        unsafe { nvrtcDestroyProgram(&mut self.0) };
    }
}

fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines().find_map(|l| l.strip_prefix(".target "))
}

/// Everything for one real NVRTC, in one process (run by the test above).
/// The child half of `shim_forwards_and_records_ptx_with_each_real_nvrtc` (run with `CHILD_ENV` set).
fn child_checks() {
    let Some(lib) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else {
        return;
    };
    let cache = std::env::temp_dir().join(format!("devtensor-emu-shim-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    assert!(config::set(Config {
        nvrtc: Some(lib.clone()),
        ptx_cache: Some(cache.clone()),
        ..Config::default()
    }));
    let direct = RealNvrtc::open(&lib).unwrap();

    // Version and error strings are the real library's.
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { nvrtcVersion(&mut major, &mut minor) }, NVRTC_SUCCESS);
    assert_eq!((major, minor), direct.version());
    assert_eq!(
        nvrtc::real_nvrtc_path().unwrap(),
        std::fs::canonicalize(&lib).unwrap().to_str().unwrap()
    );
    // SAFETY: any value is accepted.
    let text = unsafe { nvrtcGetErrorString(NVRTC_ERROR_COMPILATION) };
    assert_eq!(cstr(text), "NVRTC_ERROR_COMPILATION");

    // The project's kernels, compiled as the project does.
    let src = strided_copy_source();
    for arch in ["sm_80", "sm_90", "sm_120"] {
        let opts = project_options(arch);
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let p = create(&src, &[]);
        assert_eq!(p.compile(&opts), NVRTC_SUCCESS, "{}", p.log());
        let cubin = p.cubin();
        let ptx = nvrtc::ptx_for_cubin(&cubin).unwrap_or_else(|| panic!("no PTX recorded for {arch}"));
        assert_eq!(ptx_target(&ptx), Some(arch), "{arch}");
        assert!(ptx.contains(".entry copy_strided_e1("), "{arch}");
        // The same PTX as a compile for compute_XY with the real NVRTC.
        let compute = arch.replace("sm_", "compute_");
        let copts = project_options(&compute);
        let copts: Vec<&str> = copts.iter().map(String::as_str).collect();
        let (_, want) = direct.compile(&src, &copts).unwrap();
        assert_eq!(ptx, want, "{arch}: PTX differs from the compute_XY compile");
        // And the cubin is the real one, byte for byte.
        assert_eq!(cubin, direct.compile(&src, &opts).unwrap().0, "{arch}");
        // On disk, atomically written, under the hash.
        let hash = nvrtc::cubin_hash(&cubin);
        assert_eq!(std::fs::read_to_string(cache.join(format!("{hash}.ptx"))).unwrap(), ptx);
        // A buffer with trailing bytes names the same image.
        let mut longer = cubin.clone();
        longer.extend_from_slice(&[0xab; 100]);
        assert_eq!(nvrtc::cubin_hash(&longer), hash);
        // A later process (memory empty) still finds it on disk.
        nvrtc::forget_memory_records();
        assert_eq!(nvrtc::ptx_for_cubin(&cubin).as_deref(), Some(ptx.as_str()));
    }
    let leftovers: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".ptx"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // Headers, a name expression and `-arch` `sm_XY` as two strings; then the same program
    // through the compute_XY recompile path must give the same PTX.
    let header = (
        "tk.cuh",
        "template <typename T> __global__ void tk(T* p) { p[threadIdx.x] += T(1); }\n",
    );
    let tsrc = "#include \"tk.cuh\"\n";
    let name_expr = CString::new("tk<int>").unwrap();
    let mut recorded = Vec::new();
    for recompile in [false, true] {
        nvrtc::set_ptx_recompile(recompile);
        nvrtc::forget_memory_records();
        let _ = std::fs::remove_dir_all(&cache);
        let p = create(tsrc, &[header]);
        // SAFETY: live program, valid C string.
        let rc = unsafe { nvrtcAddNameExpression(p.0, name_expr.as_ptr()) };
        assert_eq!(rc, NVRTC_SUCCESS);
        assert_eq!(
            p.compile(&["-arch", "sm_90", "-default-device"]),
            NVRTC_SUCCESS,
            "{}",
            p.log()
        );
        let mut lowered: *const c_char = std::ptr::null();
        // SAFETY: live program, valid C string and out-pointer.
        let rc = unsafe { nvrtcGetLoweredName(p.0, name_expr.as_ptr(), &mut lowered) };
        assert_eq!(rc, NVRTC_SUCCESS);
        let lowered = cstr(lowered);
        assert!(lowered.starts_with("_Z2tkIiEvPT_"), "{lowered}");
        let cubin = p.cubin();
        let ptx = nvrtc::ptx_for_cubin(&cubin).unwrap_or_else(|| panic!("no PTX (recompile={recompile})"));
        assert_eq!(ptx_target(&ptx), Some("sm_90"));
        assert!(ptx.contains(&format!(".entry {lowered}(")), "recompile={recompile}");
        recorded.push(ptx);
    }
    assert_eq!(
        recorded[0], recorded[1],
        "recompiled PTX differs from the program's own"
    );
    nvrtc::set_ptx_recompile(false);

    // A PTX-only compile hands out no cubin and records nothing.
    let p = create(&src, &[]);
    assert_eq!(p.compile(&["--gpu-architecture=compute_90"]), NVRTC_SUCCESS);
    let mut n = 1;
    // SAFETY: live program, valid out-pointer.
    assert_eq!(unsafe { nvrtcGetCUBINSize(p.0, &mut n) }, NVRTC_SUCCESS);
    assert_eq!(n, 0);
    drop(p);

    // Compile errors pass through, log included.
    let bad = create("extern \"C\" __global__ void k() { undeclared_thing(); }", &[]);
    assert_eq!(bad.compile(&["--gpu-architecture=sm_90"]), NVRTC_ERROR_COMPILATION);
    let log = bad.log();
    assert!(log.contains("undeclared_thing") && log.contains("error"), "{log}");
    let bad_opt = create("extern \"C\" __global__ void k() {}", &[]);
    assert_eq!(bad_opt.compile(&["-arch sm_90"]), NVRTC_ERROR_INVALID_OPTION);
    drop(bad_opt);

    // Handles: unknown ones are refused, destroy clears and refuses a second time.
    let mut bogus = 0x1000usize as NvrtcProgram;
    let mut n = 0;
    // SAFETY: the shim checks handles before use.
    assert_eq!(unsafe { nvrtcGetPTXSize(bogus, &mut n) }, NVRTC_ERROR_INVALID_PROGRAM);
    // SAFETY: as above.
    assert_eq!(unsafe { nvrtcDestroyProgram(&mut bogus) }, NVRTC_ERROR_INVALID_PROGRAM);
    let mut h = create("__global__ void k() {}", &[]).0;
    // The Prog wrapper was dropped above (destroying `h`): a second destroy is refused.
    // SAFETY: checked handle.
    assert_eq!(unsafe { nvrtcDestroyProgram(&mut h) }, NVRTC_ERROR_INVALID_PROGRAM);
    let mut p = create("__global__ void k() {}", &[]);
    // SAFETY: live handle.
    assert_eq!(unsafe { nvrtcDestroyProgram(&mut p.0) }, NVRTC_SUCCESS);
    assert!(p.0.is_null());

    // Supported architectures are forwarded.
    let mut count = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { nvrtcGetNumSupportedArchs(&mut count) }, NVRTC_SUCCESS);
    let mut archs = vec![0; count as usize];
    // SAFETY: `archs` holds `count` ints.
    assert_eq!(unsafe { nvrtcGetSupportedArchs(archs.as_mut_ptr()) }, NVRTC_SUCCESS);
    assert!(archs.contains(&90) && archs.contains(&120), "{archs:?}");

    let _ = std::fs::remove_dir_all(&cache);
    println!("child_checks: all passed ({})", lib.display());
}

/// The cdylib cargo built with this test: target/<profile>/deps/libdevtensor_emu.so (or the
/// copy `cargo build` puts in target/<profile>/).
fn cdylib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [
        deps.join("libdevtensor_emu.so"),
        deps.parent()?.join("libdevtensor_emu.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The installed shim must not forward to itself when the loader path resolves its name to it.
#[test]
fn shim_refuses_to_forward_to_itself() {
    if std::env::var_os(SELF_ENV).is_some() {
        return self_child();
    }
    let Some(lib) = cdylib() else {
        skip(
            "shim_refuses_to_forward_to_itself",
            "target/<profile>/libdevtensor_emu.so not built",
        );
        return;
    };
    let out = run_child(
        "shim_refuses_to_forward_to_itself",
        &[
            (SELF_ENV, lib.to_str().unwrap()),
            ("DEVTENSOR_EMU_NVRTC", lib.to_str().unwrap()),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("self_child: refused"), "{text}");
    assert!(text.contains("resolves to this shim itself"), "{text}");
}

/// The child half of `shim_refuses_to_forward_to_itself` (run with `SELF_ENV` set).
fn self_child() {
    let Some(lib) = std::env::var_os(SELF_ENV) else { return };
    let c = CString::new(Path::new(&lib).as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    // SAFETY: live handle, valid C string.
    let f = unsafe { libc::dlsym(h, c"nvrtcVersion".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: nvrtcVersion's C signature.
    let f: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int = unsafe { std::mem::transmute::<*mut c_void, _>(f) };
    let (mut a, mut b) = (0, 0);
    // SAFETY: valid out-pointers.
    let rc = unsafe { f(&mut a, &mut b) };
    assert_eq!(rc, NVRTC_ERROR_INTERNAL_ERROR);
    println!("self_child: refused (rc {rc})");
}

const PRESENCE_ENV: &str = "DEVTENSOR_EMU_TEST_PRESENCE";

/// NVRTC `dlopen`s "libcuda.so.1" during nvrtcCompileProgram and, since the emulator's soname is
/// libcuda.so.1, gets the emulator when it is loaded (as it is whenever the project compiles a
/// kernel under it). When `cuInit` is exported NVRTC then calls `cuGetExportTable` unchecked:
/// the emulator has to export it (answering an error with a null table) or NVRTC segfaults.
#[test]
fn real_nvrtc_compiles_with_the_emulator_loaded() {
    if std::env::var_os(PRESENCE_ENV).is_some() {
        return presence_child();
    }
    let Some(emu) = cdylib() else {
        skip(
            "real_nvrtc_compiles_with_the_emulator_loaded",
            "libdevtensor_emu.so not built",
        );
        return;
    };
    let libs = real_nvrtc_libs();
    if libs.is_empty() {
        skip(
            "real_nvrtc_compiles_with_the_emulator_loaded",
            "no real NVRTC (set DEVTENSOR_NVRTC)",
        );
        return;
    }
    for lib in libs {
        let arg = format!("{}\n{}", emu.display(), lib.display());
        let out = run_child("real_nvrtc_compiles_with_the_emulator_loaded", &[(PRESENCE_ENV, &arg)]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("presence_child: compiled"),
            "{} crashed or failed compiling with the emulator loaded ({:?}). NVRTC dlopen()s \
             libcuda.so.1 (= the emulator) and calls cuGetExportTable when cuInit exists: export \
             cuGetExportTable returning an error with *ppExportTable = NULL.\n{text}",
            lib.display(),
            out.status
        );
    }
}

/// The child half of `real_nvrtc_compiles_with_the_emulator_loaded` (run with `PRESENCE_ENV` set).
fn presence_child() {
    let Some(arg) = std::env::var_os(PRESENCE_ENV) else {
        return;
    };
    let arg = arg.to_string_lossy().into_owned();
    let (emu, lib) = arg.split_once('\n').unwrap();
    let c = CString::new(emu).unwrap();
    // SAFETY: valid C string; loading the emulator runs no code of its own.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    let nvrtc = RealNvrtc::open(Path::new(lib)).unwrap();
    let (cubin, _) = nvrtc
        .compile(
            "extern \"C\" __global__ void k(int* p) { p[0] = 1; }",
            &["--gpu-architecture=sm_90"],
        )
        .unwrap();
    assert!(!cubin.is_empty());
    println!("presence_child: compiled");
}
