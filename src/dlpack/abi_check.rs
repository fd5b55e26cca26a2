//! Checks the hand-written DLPack ABI in [`super::ffi`] against a real `dlpack.h`.
//!
//! With `DEVTENSOR_DLPACK_H=/path/to/dlpack.h` set at build time, `build.rs`
//! runs bindgen on that header into `$OUT_DIR/dlpack_bindings.rs` and sets
//! `cfg(dlpack_header)`. The test then compares the size and alignment of every
//! struct, the offset and size of every field, the size of every typedef and
//! the value of every constant. Without the header it skips, unless
//! `DEVTENSOR_REQUIRE_DLPACK_H=1` (set by CI) makes the skip a failure.

#[cfg(not(dlpack_header))]
#[test]
fn dlpack_abi_matches_header() {
    // CI sets this: there, a skipped comparison is a failure.
    let required = std::env::var("DEVTENSOR_REQUIRE_DLPACK_H").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "DEVTENSOR_REQUIRE_DLPACK_H is set but this test binary was built without a dlpack.h: \
         set DEVTENSOR_DLPACK_H=/path/to/dlpack.h when building (needs libclang, e.g. \
         `apt-get install libclang-dev`)"
    );
    println!(
        "SKIP dlpack_abi_matches_header: set DEVTENSOR_DLPACK_H=/path/to/dlpack.h \
         to compare against a real header"
    );
}

/// bindgen's reading of the header named by `DEVTENSOR_DLPACK_H`.
#[cfg(dlpack_header)]
mod c {
    #![allow(
        dead_code,
        missing_docs,
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        unsafe_op_in_unsafe_fn,
        unused,
        clippy::all,
        clippy::undocumented_unsafe_blocks,
        clippy::missing_safety_doc
    )]
    include!(concat!(env!("OUT_DIR"), "/dlpack_bindings.rs"));
}

#[cfg(dlpack_header)]
mod with_header {
    use super::super::ffi;
    use super::c;
    use std::collections::BTreeSet;
    use std::fmt::Debug;
    use std::mem::{align_of, offset_of, size_of};

    /// The header the bindings were generated from.
    const HEADER: &str = env!("DEVTENSOR_DLPACK_H_USED");
    /// The generated bindings, scanned for items the test does not compare.
    const BINDINGS: &str = include_str!(concat!(env!("OUT_DIR"), "/dlpack_bindings.rs"));

    /// Typedefs deliberately not compared by size.
    ///
    /// `DLDataTypeCode` is an `int`-sized C enum, but its values only ever live
    /// in the `u8` field `DLDataType::code`, so `ffi.rs` names it `u8`; its
    /// constants' values are still compared.
    const NOT_SIZE_COMPARED: &[&str] = &["DLDataTypeCode"];

    #[derive(Default)]
    struct Report {
        structs: usize,
        fields: usize,
        constants: usize,
        typedefs: usize,
        /// Every struct, typedef and constant name compared.
        seen: BTreeSet<&'static str>,
        mismatches: Vec<String>,
    }

    impl Report {
        fn same<T: PartialEq + Debug>(&mut self, what: &str, ours: T, header: T) {
            if ours != header {
                self.mismatches
                    .push(format!("{what}: ffi.rs has {ours:?}, dlpack.h has {header:?}"));
            }
        }
    }

    /// The size of the field that `get` projects to.
    fn field_size<S, F>(_get: impl Fn(&S) -> &F) -> usize {
        size_of::<F>()
    }

    /// Compares size, alignment and every field (offset and size) of a struct.
    /// The field list must name every field of both structs: the exhaustive
    /// destructuring below does not compile otherwise.
    macro_rules! check_struct {
        ($r:ident, $name:ident { $($field:ident),+ $(,)? }) => {{
            // A compile error here means the two structs' field lists differ.
            let _exhaustive = |ours: ffi::$name, header: c::$name| {
                let ffi::$name { $($field: _),+ } = ours;
                let c::$name { $($field: _),+ } = header;
            };
            let name = stringify!($name);
            $r.structs += 1;
            $r.seen.insert(name);
            $r.same(&format!("size_of::<{name}>()"), size_of::<ffi::$name>(), size_of::<c::$name>());
            $r.same(&format!("align_of::<{name}>()"), align_of::<ffi::$name>(), align_of::<c::$name>());
            $(
                $r.fields += 1;
                let field = stringify!($field);
                $r.same(
                    &format!("offset_of!({name}, {field})"),
                    offset_of!(ffi::$name, $field),
                    offset_of!(c::$name, $field),
                );
                $r.same(
                    &format!("size of {name}::{field}"),
                    field_size(|s: &ffi::$name| &s.$field),
                    field_size(|s: &c::$name| &s.$field),
                );
            )+
        }};
    }

    /// Compares the size and alignment of typedefs (enums, function pointers).
    macro_rules! check_typedefs {
        ($r:ident, $($name:ident),+ $(,)?) => {$(
            let name = stringify!($name);
            $r.typedefs += 1;
            $r.seen.insert(name);
            $r.same(&format!("size_of::<{name}>()"), size_of::<ffi::$name>(), size_of::<c::$name>());
            $r.same(&format!("align_of::<{name}>()"), align_of::<ffi::$name>(), align_of::<c::$name>());
        )+};
    }

    /// Compares constant values (as `i128`: the two sides' integer types differ).
    macro_rules! check_consts {
        ($r:ident, $($name:ident),+ $(,)?) => {$(
            $r.constants += 1;
            $r.seen.insert(stringify!($name));
            $r.same(stringify!($name), i128::from(ffi::$name), i128::from(c::$name));
        )+};
    }

    /// Names of the `pub const` / `pub struct` / `pub type` items in the bindings.
    fn generated_items() -> BTreeSet<&'static str> {
        let tokens: Vec<&str> = BINDINGS
            .split(|ch: char| ch.is_whitespace() || ":;{}=<>(),".contains(ch))
            .filter(|t| !t.is_empty())
            .collect();
        tokens
            .windows(3)
            .filter(|w| w[0] == "pub" && matches!(w[1], "const" | "struct" | "type"))
            .map(|w| w[2])
            .collect()
    }

    #[test]
    fn dlpack_abi_matches_header() {
        let mut r = Report::default();

        check_struct!(r, DLPackVersion { major, minor });
        check_struct!(r, DLDevice { device_type, device_id });
        check_struct!(r, DLDataType { code, bits, lanes });
        check_struct!(
            r,
            DLTensor {
                data,
                device,
                ndim,
                dtype,
                shape,
                strides,
                byte_offset
            }
        );
        check_struct!(
            r,
            DLManagedTensor {
                dl_tensor,
                manager_ctx,
                deleter
            }
        );
        check_struct!(
            r,
            DLManagedTensorVersioned {
                version,
                manager_ctx,
                deleter,
                flags,
                dl_tensor
            }
        );
        check_struct!(r, DLPackExchangeAPIHeader { version, prev_api });
        check_struct!(
            r,
            DLPackExchangeAPI {
                header,
                managed_tensor_allocator,
                managed_tensor_from_py_object_no_sync,
                managed_tensor_to_py_object_no_sync,
                dltensor_from_py_object_no_sync,
                current_work_stream,
            }
        );

        check_typedefs!(
            r,
            DLDeviceType,
            DLPackManagedTensorAllocator,
            DLPackManagedTensorFromPyObjectNoSync,
            DLPackManagedTensorToPyObjectNoSync,
            DLPackDLTensorFromPyObjectNoSync,
            DLPackCurrentWorkStream,
        );

        check_consts!(r, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
        check_consts!(
            r,
            DLPACK_FLAG_BITMASK_READ_ONLY,
            DLPACK_FLAG_BITMASK_IS_COPIED,
            DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
        );
        check_consts!(
            r,
            kDLCPU,
            kDLCUDA,
            kDLCUDAHost,
            kDLOpenCL,
            kDLVulkan,
            kDLMetal,
            kDLVPI,
            kDLROCM,
            kDLROCMHost,
            kDLExtDev,
            kDLCUDAManaged,
            kDLOneAPI,
            kDLWebGPU,
            kDLHexagon,
            kDLMAIA,
            kDLTrn,
        );
        check_consts!(
            r,
            kDLInt,
            kDLUInt,
            kDLFloat,
            kDLOpaqueHandle,
            kDLBfloat,
            kDLComplex,
            kDLBool,
            kDLFloat8_e3m4,
            kDLFloat8_e4m3,
            kDLFloat8_e4m3b11fnuz,
            kDLFloat8_e4m3fn,
            kDLFloat8_e4m3fnuz,
            kDLFloat8_e5m2,
            kDLFloat8_e5m2fnuz,
            kDLFloat8_e8m0fnu,
            kDLFloat6_e2m3fn,
            kDLFloat6_e3m2fn,
            kDLFloat4_e2m1fn,
        );

        // Anything the header defines that ffi.rs lacks (a newer header's device
        // type, say) is a mismatch too.
        let unchecked: Vec<&str> = generated_items()
            .into_iter()
            .filter(|n| !r.seen.contains(n) && !NOT_SIZE_COMPARED.contains(n))
            .collect();
        if !unchecked.is_empty() {
            r.mismatches.push(format!(
                "dlpack.h defines items this test does not compare: {unchecked:?}"
            ));
        }

        assert!(
            r.mismatches.is_empty(),
            "src/dlpack/ffi.rs disagrees with {HEADER}:\n  {}",
            r.mismatches.join("\n  ")
        );
        println!(
            "DLPack ABI checked against {HEADER} (v{}.{}): {} structs, {} fields, {} constants match",
            c::DLPACK_MAJOR_VERSION,
            c::DLPACK_MINOR_VERSION,
            r.structs,
            r.fields,
            r.constants
        );
    }
}
