//! cubin.rs against real cubins: committed fixtures (always run) and, when pip's NVRTC is
//! present, the project's own kernels compiled now. Regenerate the fixtures with
//! `DEVTENSOR_EMU_REGENERATE_FIXTURES=1 cargo test -p devtensor-emu --test cubin_parse`.

mod nvrtc_support;

use std::path::{Path, PathBuf};

use devtensor_emu::cubin::{self, CubinInfo, ParamInfo};
use nvrtc_support::{RealNvrtc, project_options, real_nvrtc, skip, strided_copy_source};

const ARCHS: [u32; 7] = [75, 80, 86, 89, 90, 100, 120];
const STRIDED_ARCHS: [u32; 3] = [80, 90, 120];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cubin")
}

fn load(name: &str) -> (Vec<u8>, CubinInfo) {
    let path = fixtures().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let info = cubin::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    (bytes, info)
}

/// (ordinal, offset, size) triples.
fn layout(params: &[ParamInfo]) -> Vec<(u32, u32, u32)> {
    params.iter().map(|p| (p.ordinal, p.offset, p.size)).collect()
}

/// Kernels of the strided_copy.cu subset (small fixtures, same code).
const SUBSET: [&str; 4] = ["copy_strided_e1", "copy_strided64_e1", "fill_e1", "transpose_tiled_e4"];

/// strided_copy.cu with only the one-line `extern "C"` instances of [`SUBSET`] kept. The
/// committed strided_subset.cu and strided_nvrtc*.cubin were cut from an earlier, macro-based
/// strided_copy.cu that also had `copy_contig_v16`; `strided_copy_kernels` checks them as they are.
fn strided_subset() -> String {
    strided_copy_source()
        .lines()
        .filter(|l| {
            let Some(rest) = l.strip_prefix("extern \"C\" __global__ void ") else {
                return true;
            };
            SUBSET.iter().any(|k| rest.starts_with(&format!("{k}(")))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rewrites tests/fixtures/cubin/*.cubin from pip's NVRTC 12 and 13; run by
/// `arch_from_e_flags_for_every_sm_and_both_layouts` first when
/// `DEVTENSOR_EMU_REGENERATE_FIXTURES=1`.
fn regenerate_fixtures() {
    let dir = fixtures();
    let misc = std::fs::read_to_string(dir.join("misc.cu")).unwrap();
    let tiny = std::fs::read_to_string(dir.join("tiny.cu")).unwrap();
    let subset = strided_subset();
    std::fs::write(dir.join("strided_subset.cu"), &subset).unwrap();
    for major in [12, 13] {
        let nvrtc = real_nvrtc(major).unwrap_or_else(|| panic!("NVRTC {major} not found"));
        let build = |src: &str, arch: u32, out: String| {
            let opts = project_options(&format!("sm_{arch}"));
            let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
            let (cubin, _) = nvrtc.compile(src, &opts).unwrap_or_else(|log| panic!("{out}: {log}"));
            std::fs::write(dir.join(&out), cubin).unwrap();
        };
        for arch in ARCHS {
            build(&tiny, arch, format!("tiny_nvrtc{major}_sm{arch}.cubin"));
        }
        for arch in STRIDED_ARCHS {
            build(&subset, arch, format!("strided_nvrtc{major}_sm{arch}.cubin"));
            build(&misc, arch, format!("misc_nvrtc{major}_sm{arch}.cubin"));
        }
    }
}

#[test]
fn arch_from_e_flags_for_every_sm_and_both_layouts() {
    if std::env::var_os("DEVTENSOR_EMU_REGENERATE_FIXTURES").is_some() {
        regenerate_fixtures();
    }
    for major in [12, 13] {
        for arch in ARCHS {
            let name = format!("tiny_nvrtc{major}_sm{arch}.cubin");
            let (bytes, info) = load(&name);
            assert_eq!(info.arch, arch, "{name}: e_flags {:#x}", info.e_flags);
            // CUDA 13's layout (ABI version 8) for NVRTC 13, and for NVRTC 12 from sm_100 on.
            let want_abi = if major == 13 || arch >= 100 { 8 } else { 7 };
            assert_eq!(info.abi_version, want_abi, "{name}");
            // SAFETY: `bytes` holds the whole image (more than 64 bytes).
            assert_eq!(unsafe { cubin::image_len(bytes.as_ptr()) }, Some(bytes.len()), "{name}");
            let k = info.kernel("k1").unwrap_or_else(|| panic!("{name}: no k1 in {info:?}"));
            assert_eq!(layout(&k.params), [(0, 0, 8), (1, 8, 8), (2, 16, 4)], "{name}");
            assert_eq!(k.param_bytes, 20, "{name}");
            assert!(k.regcount.is_some_and(|r| (4..=32).contains(&r)), "{name}: {k:?}");
            assert_eq!((k.shared_bytes, k.shared_reserved_bytes), (0, 0), "{name}");
            assert_eq!(info.kernels.len(), 1, "{name}");
        }
    }
}

#[test]
fn strided_copy_kernels() {
    for major in [12, 13] {
        for arch in STRIDED_ARCHS {
            let name = format!("strided_nvrtc{major}_sm{arch}.cubin");
            let (bytes, info) = load(&name);
            assert_eq!(info.arch, arch, "{name}");
            // SAFETY: `bytes` holds the whole image.
            assert_eq!(unsafe { cubin::image_len(bytes.as_ptr()) }, Some(bytes.len()), "{name}");
            let mut names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
            names.sort();
            assert_eq!(
                names,
                [
                    "copy_contig_v16",
                    "copy_strided64_e1",
                    "copy_strided_e1",
                    "fill_e1",
                    "transpose_tiled_e4"
                ],
                "{name}"
            );
            let k = |n: &str| info.kernel(n).unwrap();
            // StridedArgs: 8 + 16·12 + 2·16·4 = 328 bytes; TransposeArgs: 24 + 328 = 352.
            assert_eq!(
                layout(&k("copy_strided_e1").params),
                [(0, 0, 8), (1, 8, 8), (2, 16, 328)],
                "{name}"
            );
            assert_eq!(k("copy_strided_e1").param_bytes, 344, "{name}");
            // `u8 value` between a pointer and the 4-aligned struct.
            assert_eq!(
                layout(&k("fill_e1").params),
                [(0, 0, 8), (1, 8, 1), (2, 12, 328)],
                "{name}"
            );
            assert_eq!(k("fill_e1").param_bytes, 340, "{name}");
            // StridedArgs64: 8 + 4 (+4) + 3·16·8 = 400.
            assert_eq!(
                layout(&k("copy_strided64_e1").params),
                [(0, 0, 8), (1, 8, 8), (2, 16, 400)],
                "{name}"
            );
            assert_eq!(
                layout(&k("copy_contig_v16").params),
                [(0, 0, 8), (1, 8, 8), (2, 16, 8)],
                "{name}"
            );
            let t = k("transpose_tiled_e4");
            assert_eq!(layout(&t.params), [(0, 0, 8), (1, 8, 8), (2, 16, 352)], "{name}");
            assert_eq!(t.param_bytes, 368, "{name}");
            // 32 × 33 × 4 bytes of tile; from sm_90 on the section adds the 1 KiB reserved per block.
            assert_eq!(t.shared_bytes, 4224, "{name}");
            assert_eq!(t.shared_reserved_bytes, if arch >= 90 { 1024 } else { 0 }, "{name}");
            for kern in &info.kernels {
                assert!(
                    kern.regcount.is_some_and(|r| (8..=255).contains(&r)),
                    "{name}: {kern:?}"
                );
                assert!(kern.code_bytes > 0, "{name}: {kern:?}");
                if kern.name != "transpose_tiled_e4" {
                    assert_eq!(
                        (kern.shared_bytes, kern.shared_reserved_bytes),
                        (0, 0),
                        "{name}: {kern:?}"
                    );
                }
            }
        }
    }
    // The register counts the research measured (NVRTC 13, sm_90).
    let (_, info) = load("strided_nvrtc13_sm90.cubin");
    assert_eq!(info.kernel("copy_strided_e1").unwrap().regcount, Some(34));
    assert_eq!(info.kernel("transpose_tiled_e4").unwrap().regcount, Some(32));
}

#[test]
fn misc_layouts_launch_bounds_and_shared() {
    for major in [12, 13] {
        for arch in STRIDED_ARCHS {
            let name = format!("misc_nvrtc{major}_sm{arch}.cubin");
            let (_, info) = load(&name);
            assert_eq!(info.arch, arch, "{name}");
            let k = |n: &str| info.kernel(n).unwrap_or_else(|| panic!("{name}: no {n}"));
            // Past 16 KiB NVRTC switches to KPARAM_INFO_V2 (0x45).
            let b = k("bigp");
            assert_eq!(
                layout(&b.params),
                [(0, 0, 8), (1, 8, 17000), (2, 17008, 1), (3, 17009, 7), (4, 17016, 8)],
                "{name}"
            );
            assert_eq!(b.param_bytes, 17024, "{name}");
            assert_eq!(b.max_threads, Some([256, 1, 1]), "{name}");
            assert_eq!(b.max_threads_per_block(), Some(256), "{name}");
            let l = k("lb");
            assert_eq!(layout(&l.params), [(0, 0, 8), (1, 8, 2), (2, 16, 16)], "{name}");
            assert_eq!(l.param_bytes, 32, "{name}");
            assert_eq!(l.max_threads, Some([128, 1, 1]), "{name}");
            assert_eq!(l.max_reg_count, Some(128), "{name}");
            let s = k("sh1");
            assert_eq!(s.shared_bytes, 1, "{name}");
            assert_eq!(s.shared_reserved_bytes, if arch >= 90 { 1024 } else { 0 }, "{name}");
            assert_eq!(s.max_threads, None, "{name}");
            assert_eq!(s.max_reg_count, None, "{name}");
            let n = k("noparam");
            assert!(n.params.is_empty(), "{name}");
            assert_eq!(n.param_bytes, 0, "{name}");
        }
    }
}

#[test]
fn truncated_or_corrupt_images_are_errors() {
    let (bytes, _) = load("tiny_nvrtc13_sm90.cubin");
    for cut in [10, 63, 64, 200, bytes.len() / 2, bytes.len() - 1] {
        let r = cubin::parse(&bytes[..cut]);
        assert!(r.is_err(), "parse of the first {cut} bytes succeeded: {r:?}");
    }
    let mut bad = bytes.clone();
    bad[0x12] = 0x3e; // e_machine = EM_X86_64
    assert!(cubin::parse(&bad).unwrap_err().contains("EM_CUDA"));
    let mut bad = bytes;
    bad[4] = 1; // ELFCLASS32
    assert!(cubin::parse(&bad).is_err());
    // SAFETY: `bad` has more than 64 bytes.
    assert_eq!(unsafe { cubin::image_len(bad.as_ptr()) }, None);
}

/// The project's current kernel file, every kernel, compiled now (SKIP without NVRTC).
#[test]
fn project_kernels_compiled_now() {
    let mut ran = false;
    for major in [12, 13] {
        let Some(nvrtc) = real_nvrtc(major) else {
            skip("project_kernels_compiled_now", &format!("NVRTC {major} not found"));
            continue;
        };
        ran = true;
        check_project_kernels(&nvrtc);
    }
    if !ran {
        skip(
            "project_kernels_compiled_now",
            "set DEVTENSOR_NVRTC or run ci/test.sh once",
        );
    }
}

fn check_project_kernels(nvrtc: &RealNvrtc) {
    let src = strided_copy_source();
    for arch in [80, 90, 100, 120] {
        let opts = project_options(&format!("sm_{arch}"));
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let (cubin, _) = nvrtc.compile(&src, &opts).unwrap();
        let info = cubin::parse(&cubin).unwrap();
        let tag = format!("{} sm_{arch}", nvrtc.path.display());
        assert_eq!(info.arch, arch, "{tag}");
        assert_eq!(
            info.kernels.len(),
            5 * 3 + 4 + 4 + 4 + 2 + 2 + 3 + 1,
            "{tag}: {:?}",
            info.kernels
        );
        // transpose_packed_eE: a tile of 32·P rows of 32 u32s (P = 4 / e).
        for (e, rows) in [(1, 128), (2, 64)] {
            let t = info.kernel(&format!("transpose_packed_e{e}")).unwrap();
            assert_eq!(t.shared_bytes, rows * 32 * 4, "{tag}");
        }
        // The folded tiles: the plain and packed tiles' shared memory, and
        // their argument struct with six more 4-byte fields.
        for (plain, sizes) in [("transpose_tiled", &[1, 2, 4, 8][..]), ("transpose_packed", &[1, 2])] {
            for e in sizes {
                let t = info.kernel(&format!("{plain}_e{e}")).unwrap();
                let f = info.kernel(&format!("{plain}_folded_e{e}")).unwrap();
                assert_eq!(
                    (f.shared_bytes, f.param_bytes),
                    (t.shared_bytes, t.param_bytes + 24),
                    "{tag} {plain} e{e}"
                );
            }
        }
        // transpose_rgb_eE: 32 rows of 136, 132 or 99 elements of e bytes.
        for (e, row) in [(1, 136), (2, 132), (4, 99)] {
            let t = info.kernel(&format!("transpose_rgb_e{e}")).unwrap();
            assert_eq!(t.shared_bytes, 32 * row * e, "{tag}");
        }
        // transpose_rgb_packed_e1: 32 rows of 100 bytes.
        let t = info.kernel("transpose_rgb_packed_e1").unwrap();
        assert_eq!(t.shared_bytes, 32 * 100, "{tag}");
        for e in [1u32, 2, 4, 8, 16] {
            let k = |n: String| info.kernel(&n).unwrap_or_else(|| panic!("{tag}: no {n}"));
            let arg = |k: &cubin::KernelInfo| layout(&k.params);
            assert_eq!(
                arg(k(format!("copy_strided_e{e}"))),
                [(0, 0, 8), (1, 8, 8), (2, 16, 328)],
                "{tag}"
            );
            assert_eq!(
                arg(k(format!("copy_strided64_e{e}"))),
                [(0, 0, 8), (1, 8, 8), (2, 16, 400)],
                "{tag}"
            );
            let value_off = 8 + e;
            let args_off = if e == 16 { 32 } else { value_off.div_ceil(4) * 4 };
            let value_at = if e == 16 { 16 } else { 8 };
            assert_eq!(
                arg(k(format!("fill_e{e}"))),
                [(0, 0, 8), (1, value_at, e), (2, args_off, 328)],
                "{tag}"
            );
        }
        for e in [1, 2, 4, 8] {
            let t = info.kernel(&format!("transpose_tiled_e{e}")).unwrap();
            assert_eq!(t.shared_bytes, 32 * 33 * e, "{tag}");
            assert_eq!(t.shared_reserved_bytes, if arch >= 90 { 1024 } else { 0 }, "{tag}");
            // copy_vec_eE: VecArgs is a DivMagic, three ints and a StridedArgs.
            let v = info.kernel(&format!("copy_vec_e{e}")).unwrap();
            assert_eq!(
                layout(&v.params),
                [(0, 0, 8), (1, 8, 8), (2, 16, 12 + 12 + 328)],
                "{tag}"
            );
        }
    }
}
