//! Proof that it bites (issue item 9): deliberately broken CUDA programs, each written as a
//! real program would be — CUDA C compiled for sm_90 through the emulator's own `nvrtc*`
//! exports (forwarding to pip's real NVRTC), the cubin loaded with `cuModuleLoadData`, and
//! everything else through the exported `cu*` functions — which the emulator must report with
//! the right `CUresult` and a message naming the call site. Next to each broken program is its
//! correct twin (the same program, fixed), which must run cleanly and compute the right
//! result: the checks must not fire on correct code.
//!
//! Every program runs in a child process (this test binary re-run with `CHILD_ENV` naming the
//! variant): kernel faults are sticky and poison the context, and one program dies of SIGSEGV.
//! The child prints `RESULT <step> <code>` and `MESSAGE <step> <text>` lines on stdout; the
//! parent asserts on them and on the `devtensor-emu: ...` lines of the child's stderr.
//!
//! Without a real NVRTC every test prints SKIP (or fails, with DEVTENSOR_REQUIRE_GPU=1).

mod nvrtc_support;

use std::ffi::{CString, c_char, c_int, c_void};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::ptr::null_mut;

use devtensor_emu::driver::context::*;
use devtensor_emu::driver::device::cuInit;
use devtensor_emu::driver::event::*;
use devtensor_emu::driver::launch::*;
use devtensor_emu::driver::memory::*;
use devtensor_emu::driver::module::*;
use devtensor_emu::driver::stream::*;
use devtensor_emu::driver::*;
use devtensor_emu::nvrtc::*;
use nvrtc_support::{real_nvrtc_libs, skip};

/// Set in a child: the variant (`broken` or `fixed`) of the test's program to run.
const CHILD_ENV: &str = "DEVTENSOR_EMU_BROKEN_PROGRAM";

// ---------------------------------------------------------------------------------------------
// The parent: runs the variants in children and checks what they saw.

/// The real NVRTC the children's shim forwards to, or `None` after printing SKIP
/// (a failure instead when DEVTENSOR_REQUIRE_GPU=1).
fn nvrtc_or_skip(test: &str) -> Option<PathBuf> {
    let lib = real_nvrtc_libs().into_iter().next();
    if lib.is_none() {
        assert!(
            std::env::var("DEVTENSOR_REQUIRE_GPU").as_deref() != Ok("1"),
            "{test}: no real NVRTC (set DEVTENSOR_NVRTC) and DEVTENSOR_REQUIRE_GPU=1"
        );
        skip(test, "no real NVRTC (set DEVTENSOR_NVRTC)");
    }
    lib
}

/// What one child did.
struct Outcome {
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `variant` of `test` in a child with the emulator's defaults plus `env`.
fn run_variant(test: &str, variant: &str, nvrtc: &Path, env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, variant)
        .env("DEVTENSOR_EMU_NVRTC", nvrtc)
        .env(
            "DEVTENSOR_EMU_PTX_CACHE",
            std::env::temp_dir().join("devtensor-emu-broken-programs"),
        );
    // The checks under test must be on and the device the default one, whatever the caller set.
    for var in [
        "DEVTENSOR_EMU_SEED",
        "DEVTENSOR_EMU_RACECHECK",
        "DEVTENSOR_EMU_DRIVER_VERSION",
        "DEVTENSOR_EMU_MEMORY",
        "DEVTENSOR_EMU_DEVICES",
        "DEVTENSOR_EMU_REPORT",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    Outcome {
        what: format!("{test} [{variant}] {env:?}"),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Outcome {
    fn dump(&self) -> String {
        format!(
            "{}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    /// The value of the child's `<tag> <step> <value>` line.
    fn line(&self, tag: &str, step: &str) -> Option<&str> {
        // Anywhere in a line: libtest's `test <name> ... ` may precede the first one.
        let prefix = format!("{tag} {step} ");
        self.stdout
            .lines()
            .find_map(|l| l.find(prefix.as_str()).map(|i| &l[i + prefix.len()..]))
    }

    /// The child got through its program (no panic, no signal).
    fn finished(&self) {
        assert!(self.status.success(), "{}", self.dump());
        assert!(self.stdout.contains("PROGRAM DONE"), "{}", self.dump());
    }

    /// Step `step` returned `code`, with a message containing every needle, printed on stderr.
    fn expect(&self, step: &str, code: i64, needles: &[&str]) {
        let got = self.line("RESULT", step).and_then(|v| v.trim().parse::<i64>().ok());
        assert_eq!(got, Some(code), "step `{step}`\n{}", self.dump());
        let msg = self.line("MESSAGE", step).unwrap_or("");
        for n in needles {
            assert!(
                msg.contains(n),
                "step `{step}`: message lacks {n:?}: {msg}\n{}",
                self.dump()
            );
        }
        if !needles.is_empty() {
            assert!(
                self.stderr.contains(&format!("devtensor-emu: {msg}")),
                "step `{step}`: the message was not printed on stderr\n{}",
                self.dump()
            );
        }
    }

    /// A correct program: it finished, checked its results, and the emulator said nothing.
    fn clean(&self) {
        self.finished();
        assert!(self.stdout.contains("RESULTS OK"), "{}", self.dump());
        assert!(!self.stderr.contains("devtensor-emu:"), "{}", self.dump());
    }
}

// ---------------------------------------------------------------------------------------------
// The child: a CUDA program's view of the driver.

/// The variant this process runs, when it is a child.
fn child_variant() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Records the result of a step for the parent (and the message, when it failed).
fn step(name: &str, rc: CUresult) -> CUresult {
    println!("RESULT {name} {rc}");
    if rc != CUDA_SUCCESS {
        println!("MESSAGE {name} {}", last_error_message().unwrap_or_default());
    }
    rc
}

/// Asserts a call of a correct program succeeded.
fn ok(what: &str, rc: CUresult) {
    assert_eq!(rc, CUDA_SUCCESS, "{what}: {:?}", last_error_message());
}

fn done(results_checked: bool) {
    if results_checked {
        println!("RESULTS OK");
    }
    println!("PROGRAM DONE");
}

fn init() {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ok("cuInit", cuInit(0));
        let mut ctx = null_mut();
        ok("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
    }
}

/// Compiles CUDA C for sm_90 through the emulator's NVRTC exports: the cubin, or
/// (the NVRTC result, the log).
fn nvrtc_compile(src: &str) -> std::result::Result<Vec<u8>, (NvrtcResult, String)> {
    let src = CString::new(src).unwrap();
    let opts = [c"--gpu-architecture=sm_90", c"--std=c++17"];
    let opts: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut p: NvrtcProgram = null_mut();
    // SAFETY: valid C strings, no headers, valid out-pointers and buffers of the sizes NVRTC
    // reports; the program is destroyed once.
    unsafe {
        let rc = nvrtcCreateProgram(&mut p, src.as_ptr(), c"program.cu".as_ptr(), 0, null_mut(), null_mut());
        assert_eq!(rc, NVRTC_SUCCESS);
        let rc = nvrtcCompileProgram(p, opts.len() as c_int, opts.as_ptr());
        let out = if rc == NVRTC_SUCCESS {
            let mut n = 0;
            assert_eq!(nvrtcGetCUBINSize(p, &mut n), NVRTC_SUCCESS);
            let mut cubin = vec![0u8; n];
            assert_eq!(nvrtcGetCUBIN(p, cubin.as_mut_ptr().cast()), NVRTC_SUCCESS);
            Ok(cubin)
        } else {
            let mut n = 0;
            assert_eq!(nvrtcGetProgramLogSize(p, &mut n), NVRTC_SUCCESS);
            let mut log = vec![0u8; n.max(1)];
            assert_eq!(nvrtcGetProgramLog(p, log.as_mut_ptr().cast()), NVRTC_SUCCESS);
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_owned();
            Err((rc, log))
        };
        nvrtcDestroyProgram(&mut p);
        out
    }
}

/// Compiles `src` and loads it with cuModuleLoadData.
fn load(src: &str) -> Handle {
    let cubin = nvrtc_compile(src).unwrap_or_else(|(rc, log)| panic!("NVRTC {rc}: {log}"));
    let mut m = null_mut();
    // SAFETY: a complete cubin image; valid out-pointer.
    ok("cuModuleLoadData", unsafe {
        cuModuleLoadData(&mut m, cubin.as_ptr().cast())
    });
    m
}

fn function(m: Handle, name: &str) -> Handle {
    let name = CString::new(name).unwrap();
    let mut f = null_mut();
    // SAFETY: a loaded module, a valid C string, a valid out-pointer.
    ok("cuModuleGetFunction", unsafe {
        cuModuleGetFunction(&mut f, m, name.as_ptr())
    });
    f
}

/// A kernel argument for `kernelParams`.
fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// cuLaunchKernel with `args` (one pointer per kernel parameter, each to a value of its size).
fn launch(
    f: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: Handle,
    args: &mut [*mut c_void],
) -> CUresult {
    // SAFETY: `args` holds one valid pointer per parameter of `f` (the caller's contract).
    unsafe {
        cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            stream,
            args.as_mut_ptr(),
            null_mut(),
        )
    }
}

fn alloc(bytes: usize) -> CUdeviceptr {
    let mut d = 0;
    // SAFETY: valid out-pointer.
    ok("cuMemAlloc_v2", unsafe { cuMemAlloc_v2(&mut d, bytes) });
    d
}

fn upload<T: Copy>(d: CUdeviceptr, data: &[T]) {
    // SAFETY: `data` is valid for its byte size; the range is checked by the driver.
    ok("cuMemcpyHtoD_v2", unsafe {
        cuMemcpyHtoD_v2(d, data.as_ptr().cast(), std::mem::size_of_val(data))
    });
}

fn download<T: Copy + Default>(d: CUdeviceptr, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    // SAFETY: `v` is valid for its byte size; the range is checked by the driver.
    ok("cuMemcpyDtoH_v2", unsafe {
        cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), d, std::mem::size_of_val(v.as_slice()))
    });
    v
}

fn ctx_sync() -> CUresult {
    // SAFETY: no arguments.
    unsafe { cuCtxSynchronize() }
}

fn stream_create(flags: u32) -> Handle {
    let mut s = null_mut();
    // SAFETY: valid out-pointer.
    ok("cuStreamCreate", unsafe { cuStreamCreate(&mut s, flags) });
    s
}

// ---------------------------------------------------------------------------------------------
// 1. A tiled transpose without its __syncthreads: a shared-memory race.

/// The classic tiled transpose (32×33 tile against bank conflicts, 32×8 threads per tile), as
/// kernels/strided_copy.cu's transpose_tiled does it.
const TRANSPOSE_SRC: &str = r#"
#define TILE 32
#define ROWS 8
extern "C" __global__ void transpose_tiled(const float* __restrict__ in, float* __restrict__ out,
                                           int w, int h) {
  __shared__ float tile[TILE][TILE + 1];
  int x = blockIdx.x * TILE + threadIdx.x;
  int y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < w && y + j < h) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * w + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < h && y + j < w) out[(y + j) * h + x] = tile[threadIdx.x][threadIdx.y + j];
}
"#;

fn transpose_program(fixed: bool) {
    init();
    let src = if fixed {
        TRANSPOSE_SRC.to_owned()
    } else {
        let broken = TRANSPOSE_SRC.replace("  __syncthreads();\n", "");
        assert_ne!(broken, TRANSPOSE_SRC);
        broken
    };
    let f = function(load(&src), "transpose_tiled");
    let (w, h) = (96usize, 64usize);
    let input: Vec<f32> = (0..w * h).map(|i| i as f32).collect();
    let (d_in, d_out) = (alloc(4 * w * h), alloc(4 * w * h));
    upload(d_in, &input);
    let (mut a, mut b, mut wi, mut hi) = (d_in, d_out, w as i32, h as i32);
    let rc = launch(
        f,
        [(w / 32) as u32, (h / 32) as u32, 1],
        [32, 8, 1],
        0,
        null_mut(),
        &mut [arg(&mut a), arg(&mut b), arg(&mut wi), arg(&mut hi)],
    );
    step("launch", rc);
    if step("sync", ctx_sync()) == CUDA_SUCCESS {
        let out: Vec<f32> = download(d_out, w * h);
        for y in 0..h {
            for x in 0..w {
                assert_eq!(out[x * h + y], input[y * w + x], "out[{x}][{y}]");
            }
        }
        done(true);
    } else {
        done(false);
    }
}

#[test]
fn transpose_without_syncthreads_races() {
    const T: &str = "transpose_without_syncthreads_races";
    if let Some(v) = child_variant() {
        return transpose_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    bad.expect("launch", 0, &[]);
    // A race has no driver code of its own: sticky CUDA_ERROR_LAUNCH_FAILED, like a GPU
    // running compute-sanitizer's racecheck.
    bad.expect(
        "sync",
        CUDA_ERROR_LAUNCH_FAILED as i64,
        &[
            "kernel `transpose_tiled`",
            "SharedRace in block (",
            "since the last barrier",
            "ld.shared",
        ],
    );
    assert!(bad.stdout.to_lowercase().contains("race"), "{}", bad.dump());
    run_variant(T, "fixed", &lib, &[]).clean();
}

// ---------------------------------------------------------------------------------------------
// 2. A 2-D copy with the wrong pitch.

const FILL_ROWS_SRC: &str = r#"
extern "C" __global__ void fill_rows(float* m, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) m[y * w + x] = y * 1000.0f + x;
}
"#;

fn copy_2d(
    src: CUdeviceptr,
    src_pitch: usize,
    dst: &mut [f32],
    dst_pitch: usize,
    width: usize,
    height: usize,
    s: Handle,
) -> CUresult {
    assert!(height == 0 || (height - 1) * dst_pitch + width <= 4 * dst.len());
    let p = CudaMemcpy2D {
        src_x_in_bytes: 0,
        src_y: 0,
        src_memory_type: CU_MEMORYTYPE_DEVICE,
        src_host: std::ptr::null(),
        src_device: src,
        src_array: null_mut(),
        src_pitch,
        dst_x_in_bytes: 0,
        dst_y: 0,
        dst_memory_type: CU_MEMORYTYPE_HOST,
        dst_host: dst.as_mut_ptr().cast(),
        dst_device: 0,
        dst_array: null_mut(),
        dst_pitch,
        width_in_bytes: width,
        height,
    };
    // SAFETY: a complete CUDA_MEMCPY2D; the host side holds the region (asserted above) and
    // outlives the copy (the caller synchronises the stream before using `dst`).
    unsafe { cuMemcpy2DAsync_v2(&p, s) }
}

fn pitch_program(fixed: bool) {
    init();
    let f = function(load(FILL_ROWS_SRC), "fill_rows");
    // A dense w×h matrix of floats: its pitch is 4·w = 400 bytes.
    let (w, h) = (100usize, 50usize);
    let d = alloc(4 * w * h);
    let (mut p, mut wi, mut hi) = (d, w as i32, h as i32);
    let s = stream_create(CU_STREAM_NON_BLOCKING);
    ok(
        "fill_rows",
        launch(
            f,
            [1, h as u32, 1],
            [128, 1, 1],
            0,
            s,
            &mut [arg(&mut p), arg(&mut wi), arg(&mut hi)],
        ),
    );
    let mut host = vec![0f32; 128 * h];
    if fixed {
        // Dense to dense, then into a host image with a wider (512-byte) pitch.
        let mut dense = vec![0f32; w * h];
        ok("cuMemcpy2DAsync_v2", copy_2d(d, 4 * w, &mut dense, 4 * w, 4 * w, h, s));
        ok("cuMemcpy2DAsync_v2", copy_2d(d, 4 * w, &mut host, 512, 4 * w, h, s));
        // SAFETY: a live stream.
        ok("cuStreamSynchronize", unsafe { cuStreamSynchronize(s) });
        for y in 0..h {
            for x in 0..w {
                let want = y as f32 * 1000.0 + x as f32;
                assert_eq!(dense[y * w + x], want);
                assert_eq!(host[y * 128 + x], want);
            }
        }
        done(true);
        return;
    }
    // The bug: the source pitch of a 512-byte-aligned pitched allocation, but the matrix is
    // dense; row 49 would start at 49·512 = 25088, past the 20000 bytes allocated.
    step("pitch_past_end", copy_2d(d, 512, &mut host, 512, 4 * w, h, s));
    // And a pitch smaller than a row.
    step("width_over_pitch", copy_2d(d, 256, &mut host, 512, 4 * w, h, s));
    // Errors of the call, not of the context: the stream still works.
    // SAFETY: a live stream.
    step("sync", unsafe { cuStreamSynchronize(s) });
    done(false);
}

#[test]
fn copy_2d_with_wrong_pitch_is_refused() {
    const T: &str = "copy_2d_with_wrong_pitch_is_refused";
    if let Some(v) = child_variant() {
        return pitch_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    bad.expect(
        "pitch_past_end",
        CUDA_ERROR_INVALID_VALUE as i64,
        &["cuMemcpy2DAsync_v2", "past the end", "20000 bytes"],
    );
    bad.expect(
        "width_over_pitch",
        CUDA_ERROR_INVALID_VALUE as i64,
        &["cuMemcpy2DAsync_v2", "WidthInBytes 400", "srcPitch 256"],
    );
    bad.expect("sync", 0, &[]);
    run_variant(T, "fixed", &lib, &[]).clean();
}

// ---------------------------------------------------------------------------------------------
// 3. Producer and consumer on two non-blocking streams without an event between them.

const PRODUCER_CONSUMER_SRC: &str = r#"
extern "C" __global__ void produce(float* buf, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = 2.0f * i;
}
extern "C" __global__ void consume(const float* buf, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = buf[i] + 1.0f;
}
"#;

fn streams_program(fixed: bool) {
    init();
    let m = load(PRODUCER_CONSUMER_SRC);
    let (produce, consume) = (function(m, "produce"), function(m, "consume"));
    let n = 4096usize;
    let (buf, out) = (alloc(4 * n), alloc(4 * n));
    let (s1, s2) = (
        stream_create(CU_STREAM_NON_BLOCKING),
        stream_create(CU_STREAM_NON_BLOCKING),
    );
    let grid = [(n / 128) as u32, 1, 1];
    let (mut b, mut o, mut nn) = (buf, out, n as i32);
    ok(
        "produce",
        launch(produce, grid, [128, 1, 1], 0, s1, &mut [arg(&mut b), arg(&mut nn)]),
    );
    if fixed {
        let mut e = null_mut();
        // SAFETY: valid out-pointer and live handles.
        unsafe {
            ok("cuEventCreate", cuEventCreate(&mut e, CU_EVENT_DISABLE_TIMING));
            ok("cuEventRecord", cuEventRecord(e, s1));
            ok("cuStreamWaitEvent", cuStreamWaitEvent(s2, e, 0));
        }
    }
    ok(
        "consume",
        launch(
            consume,
            grid,
            [128, 1, 1],
            0,
            s2,
            &mut [arg(&mut b), arg(&mut o), arg(&mut nn)],
        ),
    );
    // SAFETY: live streams.
    unsafe {
        step("sync_s2", cuStreamSynchronize(s2));
        step("sync_s1", cuStreamSynchronize(s1));
    }
    if step("sync", ctx_sync()) == CUDA_SUCCESS {
        let got: Vec<f32> = download(out, n);
        assert!(got.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
        done(true);
    } else {
        done(false);
    }
}

#[test]
fn unordered_streams_race() {
    const T: &str = "unordered_streams_race";
    if let Some(v) = child_variant() {
        return streams_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    for seed in ["0", "5"] {
        let bad = run_variant(T, "broken", &lib, &[("DEVTENSOR_EMU_SEED", seed)]);
        bad.finished();
        bad.expect(
            "sync",
            CUDA_ERROR_LAUNCH_FAILED as i64,
            &["data race", "no stream order, event wait or synchronisation"],
        );
        let msg = bad.line("MESSAGE", "sync").unwrap();
        assert!(msg.contains("produce") && msg.contains("consume"), "{}", bad.dump());
    }
    for seed in ["0", "7", "12345"] {
        run_variant(T, "fixed", &lib, &[("DEVTENSOR_EMU_SEED", seed)]).clean();
    }
}

// ---------------------------------------------------------------------------------------------
// 4. A kernel reading a block after cuMemFree_v2.

const SCALE_SRC: &str = r#"
extern "C" __global__ void scale(const float* in, float* out, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i];
}
"#;

fn use_after_free_program(fixed: bool) {
    init();
    let f = function(load(SCALE_SRC), "scale");
    let n = 1000usize;
    let (d_in, d_out) = (alloc(4 * n), alloc(4 * n));
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    upload(d_in, &input);
    let free_in = || {
        // SAFETY: a live allocation, freed once.
        ok("cuMemFree_v2", unsafe { cuMemFree_v2(d_in) });
    };
    if !fixed {
        // The bug: the input is released before the kernel that reads it.
        free_in();
    }
    let (mut i, mut o, mut a, mut nn) = (d_in, d_out, 3.0f32, n as i32);
    let rc = launch(
        f,
        [(n as u32).div_ceil(256), 1, 1],
        [256, 1, 1],
        0,
        null_mut(),
        &mut [arg(&mut i), arg(&mut o), arg(&mut a), arg(&mut nn)],
    );
    step("launch", rc);
    if step("sync", ctx_sync()) != CUDA_SUCCESS {
        // Sticky: the context is unusable from now on.
        let mut d = 0;
        // SAFETY: valid out-pointer.
        step("alloc_after", unsafe { cuMemAlloc_v2(&mut d, 16) });
        return done(false);
    }
    free_in();
    let out: Vec<f32> = download(d_out, n);
    assert!(out.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32));
    done(true);
}

#[test]
fn kernel_reading_freed_block() {
    const T: &str = "kernel_reading_freed_block";
    if let Some(v) = child_variant() {
        return use_after_free_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    bad.expect("launch", 0, &[]);
    bad.expect(
        "sync",
        CUDA_ERROR_ILLEGAL_ADDRESS as i64,
        &[
            "kernel `scale`",
            "Freed in block (0,0,0) thread (0,0,0)",
            "freed by cuMemFree_v2",
            "ld.global",
        ],
    );
    bad.expect("alloc_after", CUDA_ERROR_ILLEGAL_ADDRESS as i64, &[]);
    run_variant(T, "fixed", &lib, &[]).clean();
}

/// Every block reads the freed input, block 0 only after a long loop: its workers meet the
/// other blocks' faults first, and the report must still name block 0 (the lowest faulting
/// block, whichever fault a worker met first), so that it is the same on every run.
const LATE_FIRST_SRC: &str = r#"
extern "C" __global__ void late_first(const float* in, float* out, int spin) {
  float acc = 0.0f;
  if (blockIdx.x == 0) {
    for (int k = 0; k < spin; ++k) acc += 0.5f * (float)k;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = in[threadIdx.x] + acc;
}
"#;

fn lowest_block_program(fixed: bool) {
    init();
    let f = function(load(LATE_FIRST_SRC), "late_first");
    let blocks = 8usize;
    let (d_in, d_out) = (alloc(4 * 32), alloc(4 * 32 * blocks));
    upload(d_in, &[1.0f32; 32]);
    if !fixed {
        // SAFETY: a live allocation, freed once.
        ok("cuMemFree_v2", unsafe { cuMemFree_v2(d_in) });
    }
    let (mut i, mut o, mut spin) = (d_in, d_out, if fixed { 4 } else { 20_000 });
    let rc = launch(
        f,
        [blocks as u32, 1, 1],
        [32, 1, 1],
        0,
        null_mut(),
        &mut [arg(&mut i), arg(&mut o), arg(&mut spin)],
    );
    step("launch", rc);
    if step("sync", ctx_sync()) != CUDA_SUCCESS {
        return done(false);
    }
    let out: Vec<f32> = download(d_out, 32 * blocks);
    // Block 0 adds 0.5 · (0 + 1 + 2 + 3) = 3.
    assert!(
        out.iter()
            .enumerate()
            .all(|(k, &v)| v == if k < 32 { 4.0 } else { 1.0 })
    );
    done(true);
}

#[test]
fn the_lowest_faulting_block_is_reported() {
    const T: &str = "the_lowest_faulting_block_is_reported";
    if let Some(v) = child_variant() {
        return lowest_block_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    // Four workers even on a smaller host: blocks 1.. fault while block 0 still loops.
    let bad = run_variant(T, "broken", &lib, &[("DEVTENSOR_EMU_THREADS", "4")]);
    bad.finished();
    bad.expect("launch", 0, &[]);
    bad.expect(
        "sync",
        CUDA_ERROR_ILLEGAL_ADDRESS as i64,
        &["kernel `late_first`", "Freed in block (0,0,0) thread (0,0,0)"],
    );
    run_variant(T, "fixed", &lib, &[("DEVTENSOR_EMU_THREADS", "4")]).clean();
}

// ---------------------------------------------------------------------------------------------
// 5. An out-of-bounds store from an off-by-one grid.

const IOTA_SRC: &str = r#"
extern "C" __global__ void iota(unsigned* out) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = i;  // no bounds check: the grid must cover exactly the buffer
}
"#;

fn off_by_one_program(fixed: bool) {
    init();
    let f = function(load(IOTA_SRC), "iota");
    let n = 1024usize;
    let d = alloc(4 * n);
    // The bug: one block too many (`n / 256 + 1` instead of `n.div_ceil(256)`).
    let blocks = if fixed { n.div_ceil(256) } else { n / 256 + 1 } as u32;
    let mut p = d;
    step(
        "launch",
        launch(f, [blocks, 1, 1], [256, 1, 1], 0, null_mut(), &mut [arg(&mut p)]),
    );
    if step("sync", ctx_sync()) != CUDA_SUCCESS {
        return done(false);
    }
    let out: Vec<u32> = download(d, n);
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32));
    done(true);
}

#[test]
fn out_of_bounds_store_from_off_by_one_grid() {
    const T: &str = "out_of_bounds_store_from_off_by_one_grid";
    if let Some(v) = child_variant() {
        return off_by_one_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    bad.expect("launch", 0, &[]);
    bad.expect(
        "sync",
        CUDA_ERROR_ILLEGAL_ADDRESS as i64,
        &[
            "kernel `iota`",
            "<<<(5,1,1), (256,1,1)>>>",
            "OutOfBounds in block (4,0,0) thread (0,0,0)",
            "st.global",
            "past the end",
        ],
    );
    run_variant(T, "fixed", &lib, &[]).clean();
}

// ---------------------------------------------------------------------------------------------
// 6. A host write into device memory.

const ADD_ONE_SRC: &str = r#"
extern "C" __global__ void add_one(unsigned* p) { p[threadIdx.x] += 1; }
"#;

fn host_write_program(fixed: bool) {
    init();
    let f = function(load(ADD_ONE_SRC), "add_one");
    let d = alloc(4 * 32);
    if fixed {
        upload(d, &[1u32; 32]);
    } else {
        println!("writing through the device pointer {d:#x} on the host");
        // SAFETY: none — this is the bug being demonstrated: `d` is a device address, not
        // host memory. The emulator maps it PROT_NONE, so the process must die here.
        unsafe { std::ptr::write_volatile(d as *mut u32, 1) };
        println!("SURVIVED the host write");
    }
    let mut p = d;
    ok(
        "add_one",
        launch(f, [1, 1, 1], [32, 1, 1], 0, null_mut(), &mut [arg(&mut p)]),
    );
    let out: Vec<u32> = download(d, 32);
    assert_eq!(out, vec![2u32; 32]);
    done(true);
}

#[test]
fn host_write_into_device_memory_segfaults() {
    const T: &str = "host_write_into_device_memory_segfaults";
    if let Some(v) = child_variant() {
        return host_write_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    assert_eq!(bad.status.signal(), Some(libc::SIGSEGV), "{}", bad.dump());
    assert!(
        bad.stdout.contains("writing through the device pointer"),
        "{}",
        bad.dump()
    );
    assert!(!bad.stdout.contains("SURVIVED"), "{}", bad.dump());
    run_variant(T, "fixed", &lib, &[]).clean();
}

// ---------------------------------------------------------------------------------------------
// 7. Launches over the limits (group__CUDA__EXEC cuLaunchKernel; H100 device attributes:
// 1024 threads per block, grid y ≤ 65535, 48 KiB of shared memory per block without the
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES opt-in).

const LIMITS_SRC: &str = r#"
extern "C" __global__ void mark(unsigned* out) {
  unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
  unsigned i = b * blockDim.x + threadIdx.x;
  out[i] = i + 1;
}
// 48 KiB of static shared memory: the most a block may have without opting in.
extern "C" __global__ void reverse48k(const unsigned* in, unsigned* out) {
  __shared__ unsigned s[12288];
  for (int i = threadIdx.x; i < 12288; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < 12288; i += blockDim.x) out[i] = s[12287 - i];
}
// 40 KiB static: with 24 KiB of dynamic shared memory the block would need 64 KiB.
extern "C" __global__ void stage40k(const unsigned* in, unsigned* out) {
  __shared__ unsigned s[10240];
  for (int i = threadIdx.x; i < 10240; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < 10240; i += blockDim.x) out[i] = s[10239 - i];
}
"#;

/// 64 KiB of static shared memory: ptxas refuses it (static shared memory cannot opt in).
const STATIC_64K_SRC: &str = r#"
extern "C" __global__ void reverse64k(const unsigned* in, unsigned* out) {
  __shared__ unsigned s[16384];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) out[i] = s[16383 - i];
}
"#;

fn limits_program(fixed: bool) {
    init();
    let m = load(LIMITS_SRC);
    let (mark, rev48, stage40) = (function(m, "mark"), function(m, "reverse48k"), function(m, "stage40k"));
    let out = alloc(4 * 65536);
    let input: Vec<u32> = (0..12288u32).map(|i| i * 7).collect();
    let d_in = alloc(4 * input.len());
    upload(d_in, &input);
    let (mut o, mut i) = (out, d_in);
    let (threads, grid_y) = if fixed { (1024, 65535) } else { (1025, 65536) };
    step(
        "threads",
        launch(mark, [1, 1, 1], [threads, 1, 1], 0, null_mut(), &mut [arg(&mut o)]),
    );
    if fixed {
        ok("sync", ctx_sync());
        let got: Vec<u32> = download(out, 1024);
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
    }
    step(
        "grid_y",
        launch(mark, [1, grid_y, 1], [1, 1, 1], 0, null_mut(), &mut [arg(&mut o)]),
    );
    if fixed {
        ok("sync", ctx_sync());
        let got: Vec<u32> = download(out, 65535);
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
    }
    // Shared memory.
    if fixed {
        ok(
            "reverse48k",
            launch(
                rev48,
                [1, 1, 1],
                [256, 1, 1],
                0,
                null_mut(),
                &mut [arg(&mut i), arg(&mut o)],
            ),
        );
        ok("sync", ctx_sync());
        let got: Vec<u32> = download(out, 12288);
        assert!(got.iter().enumerate().all(|(k, &v)| v == input[12287 - k]));
        ok(
            "stage40k",
            launch(
                stage40,
                [1, 1, 1],
                [256, 1, 1],
                0,
                null_mut(),
                &mut [arg(&mut i), arg(&mut o)],
            ),
        );
        ok("sync", ctx_sync());
        let got: Vec<u32> = download(out, 10240);
        assert!(got.iter().enumerate().all(|(k, &v)| v == input[10239 - k]));
        // With the opt-in, 64 KiB of dynamic shared memory is within the limits. (The
        // emulator does not run kernels with dynamic shared memory yet and may answer
        // CUDA_ERROR_NOT_SUPPORTED; what matters here is that the limit check passes.)
        // SAFETY: a valid function handle.
        ok("cuFuncSetAttribute", unsafe {
            cuFuncSetAttribute(mark, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 << 10)
        });
        let rc = launch(mark, [1, 1, 1], [32, 1, 1], 64 << 10, null_mut(), &mut [arg(&mut o)]);
        println!("RESULT dynamic64k_optin {rc}");
        if rc != CUDA_SUCCESS {
            println!("MESSAGE dynamic64k_optin {}", last_error_message().unwrap_or_default());
        }
        ok("sync", ctx_sync());
        return done(true);
    }
    step(
        "dynamic64k",
        launch(mark, [1, 1, 1], [32, 1, 1], 64 << 10, null_mut(), &mut [arg(&mut o)]),
    );
    step(
        "static40k_dynamic24k",
        launch(
            stage40,
            [1, 1, 1],
            [256, 1, 1],
            24 << 10,
            null_mut(),
            &mut [arg(&mut i), arg(&mut o)],
        ),
    );
    match nvrtc_compile(STATIC_64K_SRC) {
        Ok(_) => println!("RESULT static64k_compile 0"),
        Err((rc, log)) => {
            println!("RESULT static64k_compile {rc}");
            println!("MESSAGE static64k_compile {}", log.replace('\n', " | "));
        }
    }
    // Launch-configuration errors are not sticky: a correct launch still works.
    step(
        "mark_after",
        launch(mark, [1, 1, 1], [32, 1, 1], 0, null_mut(), &mut [arg(&mut o)]),
    );
    step("sync", ctx_sync());
    done(false);
}

#[test]
fn launches_over_the_limits() {
    const T: &str = "launches_over_the_limits";
    if let Some(v) = child_variant() {
        return limits_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    let inval = CUDA_ERROR_INVALID_VALUE as i64;
    bad.expect(
        "threads",
        inval,
        &[
            "cuLaunchKernel",
            "kernel `mark`",
            "block dimension x = 1025 exceeds 1024",
        ],
    );
    bad.expect(
        "grid_y",
        inval,
        &[
            "cuLaunchKernel",
            "kernel `mark`",
            "grid dimension y = 65536 exceeds 65535",
        ],
    );
    bad.expect(
        "dynamic64k",
        inval,
        &[
            "cuLaunchKernel",
            "kernel `mark`",
            "0 bytes of static + 65536 of dynamic shared memory",
        ],
    );
    bad.expect(
        "static40k_dynamic24k",
        inval,
        &[
            "cuLaunchKernel",
            "kernel `stage40k`",
            "40960 bytes of static + 24576 of dynamic",
        ],
    );
    // Static shared memory cannot opt in: the compiler refuses 64 KiB.
    let log = bad.line("MESSAGE", "static64k_compile").unwrap_or("");
    assert_eq!(
        bad.line("RESULT", "static64k_compile"),
        Some(NVRTC_ERROR_COMPILATION.to_string().as_str()),
        "{}",
        bad.dump()
    );
    assert!(log.contains("shared data"), "{log}");
    bad.expect("mark_after", 0, &[]);
    bad.expect("sync", 0, &[]);

    let good = run_variant(T, "fixed", &lib, &[]);
    good.finished();
    assert!(good.stdout.contains("RESULTS OK"), "{}", good.dump());
    match good.line("RESULT", "dynamic64k_optin") {
        Some("0") => assert!(!good.stderr.contains("devtensor-emu:"), "{}", good.dump()),
        Some(rc) if rc == CUDA_ERROR_NOT_SUPPORTED.to_string() => {
            let msg = good.line("MESSAGE", "dynamic64k_optin").unwrap_or("");
            assert!(msg.contains("dynamic shared memory is not emulated"), "{}", good.dump());
            let others: Vec<&str> = good
                .stderr
                .lines()
                .filter(|l| l.contains("devtensor-emu:") && !l.contains("not emulated"))
                .collect();
            assert!(others.is_empty(), "{}", good.dump());
        }
        other => panic!("dynamic64k_optin: {other:?}\n{}", good.dump()),
    }
}

// ---------------------------------------------------------------------------------------------
// 8. A misaligned 16-byte vector load.

const SUM4_SRC: &str = r#"
extern "C" __global__ void sum4(const uint4* in, unsigned* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    uint4 v = in[i];
    out[i] = v.x + v.y + v.z + v.w;
  }
}
"#;

fn misaligned_program(fixed: bool) {
    init();
    let f = function(load(SUM4_SRC), "sum4");
    let n = 256usize;
    // A record: a header, then n uint4 vectors. The bug: the header is taken as 8 bytes,
    // so the vectors start 8-byte aligned; the fix pads the header to 16 bytes.
    let header = if fixed { 16 } else { 8 };
    let d = alloc(16 + 16 * n);
    let words: Vec<u32> = (0..(4 + 4 * n) as u32).collect();
    upload(d, &words);
    let out = alloc(4 * n);
    let (mut i, mut o, mut nn) = (d + header, out, n as i32);
    step(
        "launch",
        launch(
            f,
            [1, 1, 1],
            [n as u32, 1, 1],
            0,
            null_mut(),
            &mut [arg(&mut i), arg(&mut o), arg(&mut nn)],
        ),
    );
    if step("sync", ctx_sync()) != CUDA_SUCCESS {
        return done(false);
    }
    let got: Vec<u32> = download(out, n);
    let first = (header / 4) as u32;
    assert!(got.iter().enumerate().all(|(k, &v)| {
        let w = first + 4 * k as u32;
        v == 4 * w + 6
    }));
    done(true);
}

#[test]
fn misaligned_vector_load() {
    const T: &str = "misaligned_vector_load";
    if let Some(v) = child_variant() {
        return misaligned_program(v == "fixed");
    }
    let Some(lib) = nvrtc_or_skip(T) else { return };
    let bad = run_variant(T, "broken", &lib, &[]);
    bad.finished();
    bad.expect("launch", 0, &[]);
    bad.expect(
        "sync",
        CUDA_ERROR_MISALIGNED_ADDRESS as i64,
        &[
            "kernel `sum4`",
            "Misaligned in block (0,0,0) thread (0,0,0)",
            "16-byte access not aligned to 16 bytes",
        ],
    );
    run_variant(T, "fixed", &lib, &[]).clean();
}
