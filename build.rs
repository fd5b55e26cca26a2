//! Build script.
//!
//! Optional DLPack ABI check: with `DEVTENSOR_DLPACK_H=/path/to/dlpack.h` set,
//! bindgen reads that header into `$OUT_DIR/dlpack_bindings.rs` and the
//! `dlpack_header` cfg turns on the test in `src/dlpack/abi_check.rs`, which
//! compares it with the hand-written `src/dlpack/ffi.rs`. Without the variable
//! nothing is generated and libclang is not needed.

use std::env;
use std::path::{Path, PathBuf};

/// Names the `dlpack.h` to check `src/dlpack/ffi.rs` against.
const DLPACK_H_VAR: &str = "DEVTENSOR_DLPACK_H";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    dlpack_header_check();
}

/// Generates bindings for the `dlpack.h` named by `DEVTENSOR_DLPACK_H`, if any.
fn dlpack_header_check() {
    println!("cargo::rustc-check-cfg=cfg(dlpack_header)");
    println!("cargo::rerun-if-env-changed={DLPACK_H_VAR}");

    let Some(header) = env::var_os(DLPACK_H_VAR).filter(|v| !v.is_empty()) else {
        return;
    };
    let header = PathBuf::from(header);
    if !header.is_file() {
        panic!(
            "{DLPACK_H_VAR}={} does not name a file; point it at a dlpack.h \
             (e.g. from `pip install apache-tvm-ffi`: tvm_ffi/include/dlpack/dlpack.h) or unset it",
            header.display()
        );
    }
    let header = header.canonicalize().unwrap_or(header);
    let header_str = header
        .to_str()
        .unwrap_or_else(|| panic!("{DLPACK_H_VAR}={} is not valid UTF-8", header.display()));
    println!("cargo::rerun-if-changed={header_str}");

    // bindgen panics (rather than returning an error) when libclang cannot be
    // loaded; catch that quietly and report both kinds of failure below.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let generated = std::panic::catch_unwind(|| {
        bindgen::Builder::default()
            .header(header_str)
            .allowlist_type("DL.*")
            .allowlist_var("kDL.*")
            .allowlist_var("DLPACK_.*")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false)
            .layout_tests(false)
            .derive_debug(false)
            .derive_copy(false)
            .generate_comments(false)
            .formatter(bindgen::Formatter::Prettyplease)
            .generate()
            .map_err(|e| e.to_string())
    })
    .unwrap_or_else(|payload| {
        Err(payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "bindgen panicked".to_owned()))
    });
    std::panic::set_hook(default_hook);
    let bindings = generated.unwrap_or_else(|e| {
        panic!(
            "\n{DLPACK_H_VAR}={header_str} asks for the DLPack ABI check, but bindgen failed: {e}\n\
             The check needs libclang when building: install it (Debian/Ubuntu: \
             `apt-get install libclang-dev`; set LIBCLANG_PATH to the directory holding \
             libclang.so if it is elsewhere), or unset {DLPACK_H_VAR} to build without the check.\n"
        )
    });

    let out = Path::new(&env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("dlpack_bindings.rs");
    bindings
        .write_to_file(&out)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));

    println!("cargo::rustc-cfg=dlpack_header");
    println!("cargo::rustc-env=DEVTENSOR_DLPACK_H_USED={header_str}");
}
