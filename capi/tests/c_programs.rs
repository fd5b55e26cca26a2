//! The C side of the C ABI: `examples/c/*.c` and the README's C snippet are
//! compiled by the system C compiler (`$CC`, else `cc`) against
//! `include/devtensor.h` and the real `dlpack/dlpack.h` (`DEVTENSOR_DLPACK_H`,
//! as the ABI check), linked to the cdylib cargo built with this test, and run.
//! Without a `dlpack.h` the tests print `SKIP` (they fail instead under
//! `DEVTENSOR_REQUIRE_DLPACK_H=1`, as CI sets); the CUDA example prints `SKIP`
//! without a device (fails under `DEVTENSOR_REQUIRE_GPU=1`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository (this package sits in `capi/`).
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The directory holding `dlpack/dlpack.h`, or `None` after printing `SKIP`.
fn dlpack_include(test: &str) -> Option<PathBuf> {
    let header = std::env::var_os("DEVTENSOR_DLPACK_H").map(PathBuf::from);
    match header.as_deref().and_then(|h| h.parent()?.parent()) {
        Some(dir) if dir.join("dlpack/dlpack.h").is_file() => Some(dir.to_owned()),
        _ if std::env::var("DEVTENSOR_REQUIRE_DLPACK_H").as_deref() == Ok("1") => {
            panic!(
                "{test}: DEVTENSOR_REQUIRE_DLPACK_H=1 but DEVTENSOR_DLPACK_H={header:?} is not a .../dlpack/dlpack.h"
            )
        }
        _ => {
            println!("SKIP {test}: set DEVTENSOR_DLPACK_H to a .../dlpack/dlpack.h (e.g. apache-tvm-ffi's)");
            None
        }
    }
}

/// Where cargo put `libdevtensor_c.so` for this test: next to the test binary
/// (`target/<profile>/deps`).
fn cdylib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps directory").to_owned();
    let lib = deps.join(format!(
        "{}devtensor_c{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(lib.is_file(), "no cdylib at {}", lib.display());
    deps
}

/// The C compiler with our warnings-as-errors flags and include paths.
fn cc(dlpack: &Path) -> (String, Command) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-g"])
        .arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(dlpack);
    (cc, cmd)
}

/// Compiles and links `source` into an executable named `name`.
fn build(name: &str, source: &Path, dlpack: &Path) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let lib = cdylib_dir();
    let (cc, mut cmd) = cc(dlpack);
    let output = cmd
        .arg(source)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-ldevtensor_c", "-ldl"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(
        output.status.success(),
        "{cc} {} failed:\n{}{}",
        source.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Runs `exe`; returns its stdout after asserting it exited with 0.
fn run(exe: &Path) -> String {
    let output = Command::new(exe).output().expect("run the C program");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "{} exited with {}:\n{stdout}{stderr}",
        exe.display(),
        output.status
    );
    print!("{stdout}");
    stdout
}

#[test]
fn cpu_example_runs_and_passes_its_checks() {
    let Some(dlpack) = dlpack_include("cpu_example_runs_and_passes_its_checks") else {
        return;
    };
    let exe = build("cpu_tensors", &root().join("examples/c/cpu_tensors.c"), &dlpack);
    assert!(run(&exe).ends_with("cpu_tensors: OK\n"));
}

/// The allocator entry point converts to dlpack.h's `DLPackManagedTensorAllocator`
/// without a cast, and the compiler would reject one of another type (so the
/// examples' assignments check the exact signature).
#[test]
fn allocator_has_the_exact_dlpack_type_in_c() {
    let Some(dlpack) = dlpack_include("allocator_has_the_exact_dlpack_type_in_c") else {
        return;
    };
    let compiles = |function: &str| {
        let source = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("alloc_type_{function}.c"));
        std::fs::write(
            &source,
            format!(
                "#include <devtensor.h>\nDLPackManagedTensorAllocator slot = {function};\n\
                 DLPackManagedTensorAllocator get(void) {{ return slot; }}\n"
            ),
        )
        .unwrap();
        let (_, mut cmd) = cc(&dlpack);
        cmd.arg("-c").arg(&source).arg("-o").arg(source.with_extension("o"));
        cmd.output().expect("run the C compiler").status.success()
    };
    assert!(compiles("devtensor_managed_tensor_allocator"));
    assert!(
        !compiles("devtensor_empty"),
        "a function of another type must not convert"
    );
}

/// The README's C snippet, as written there, compiles and runs.
#[test]
fn readme_c_snippet_compiles_and_runs() {
    let Some(dlpack) = dlpack_include("readme_c_snippet_compiles_and_runs") else {
        return;
    };
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = readme
        .split("## Use from a kernel library (C)")
        .nth(1)
        .expect("README has the section \"Use from a kernel library (C)\"");
    let snippet = section
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the section has a ```c block");
    let source = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme_snippet.c");
    std::fs::write(&source, snippet).expect("write the snippet");
    let exe = build("readme_snippet", &source, &dlpack);
    assert_eq!(run(&exe), "y[1][1] = 1.5\n");
}

/// examples/c/axpy.c: allocation through the C ABI on its own stream, its own
/// NVRTC kernel launched there, results copied back and checked, every tensor
/// freed through its deleter.
#[test]
fn cuda_axpy_example_runs_its_own_kernel_on_devtensor_tensors() {
    let test = "cuda_axpy_example_runs_its_own_kernel_on_devtensor_tensors";
    if !common::gpu_or_skip(test, devtensor::backend::cuda_status()) {
        return;
    }
    let Some(dlpack) = dlpack_include(test) else {
        return;
    };
    let exe = build("axpy", &root().join("examples/c/axpy.c"), &dlpack);
    let out = run(&exe);
    assert!(out.ends_with(": OK\n"), "{out}");
}
