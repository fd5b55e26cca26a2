//! `include/devtensor.h` is what cbindgen makes of `src/capi/` today: the test
//! regenerates it and fails with a diff when the checked-in file differs.
//! `DEVTENSOR_BLESS=1` rewrites the file instead.

use std::path::Path;

fn generate() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("include/cbindgen.toml")).expect("include/cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/capi/mod.rs"))
        .generate()
        .expect("cbindgen reads src/capi/")
        .write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// The first lines where `a` and `b` differ, as a small unified-style listing.
fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let first = e
        .iter()
        .zip(&a)
        .position(|(x, y)| x != y)
        .unwrap_or(e.len().min(a.len()));
    let mut out = format!("first difference at line {}:\n", first + 1);
    for l in e.iter().skip(first).take(8) {
        out += &format!("-{l}\n");
    }
    for l in a.iter().skip(first).take(8) {
        out += &format!("+{l}\n");
    }
    out
}

#[test]
fn checked_in_header_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/devtensor.h");
    let fresh = generate();
    if std::env::var("DEVTENSOR_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &fresh).expect("write include/devtensor.h");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "include/devtensor.h is stale: run `DEVTENSOR_BLESS=1 cargo test --features capi --test capi_header`\n\
         (- checked in, + generated)\n{}",
        diff(&current, &fresh)
    );
}

#[test]
fn header_uses_dlpack_types_without_redefining_them() {
    let h = generate();
    assert!(h.contains("#include <dlpack/dlpack.h>"), "{h}");
    for ty in ["DLTensor", "DLManagedTensorVersioned", "DLDevice", "DLDataType"] {
        assert!(h.contains(ty), "{ty} is used");
        assert!(
            !h.contains(&format!("typedef struct {ty}")),
            "{ty} must come from dlpack.h"
        );
        assert!(!h.contains(&format!("}} {ty};")), "{ty} must come from dlpack.h");
    }
    for f in [
        "devtensor_empty",
        "devtensor_zeros",
        "devtensor_managed_tensor_allocator",
        "devtensor_get_stream",
        "devtensor_set_stream",
        "devtensor_copy",
        "devtensor_copy_managed",
        "devtensor_contiguous",
        "devtensor_memory_stats",
        "devtensor_empty_cache",
        "devtensor_last_error",
        "devtensor_status_name",
        "devtensor_live_tensors",
    ] {
        let declared = h.contains(&format!(" {f}(")) || h.contains(&format!("*{f}("));
        assert!(declared, "{f} is declared");
    }
    assert!(h.contains("DEVTENSOR_STATUS_OK = 0"), "{h}");
}
