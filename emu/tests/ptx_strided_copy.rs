//! The kernels of kernels/strided_copy.cu, as NVRTC 12 and 13 compile them for
//! compute_80/90/100/120 (fixtures generated with `--gpu-architecture=compute_XY
//! --std=c++17 -default-device`): every module parses and every kernel copies,
//! fills and transposes correctly, checked against a host reference.
//!
//! The fixtures are a snapshot of an earlier, macro-based strided_copy.cu that also had
//! `copy_contig_v16` (since removed from the project); they test the interpreter and are not
//! regenerated when the source changes. The current source is compiled by cubin_parse.rs and
//! nvrtc_shim.rs and run on the emulator by the project's GPU suite (tests/gpu_cuda.rs).

mod ptx_support;

use devtensor_emu::ptx::{FaultKind, Kernel};
use ptx_support::*;

const ELEMS: [usize; 5] = [1, 2, 4, 8, 16];

fn magic(d: u32) -> [u32; 3] {
    let d = d.max(1);
    let shift = 32 - (d - 1).leading_zeros();
    let mul = (((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1) as u32;
    [mul, shift, d]
}

/// `StridedArgs` (328 bytes): numel, ndim, DivMagic size[16], src_stride[16], dst_stride[16].
fn strided_args(sizes: &[u32], src: &[i32], dst: &[i32]) -> Vec<u8> {
    let mut b = Vec::new();
    let numel: u32 = sizes.iter().product();
    b.extend(numel.to_le_bytes());
    b.extend((sizes.len() as i32).to_le_bytes());
    for d in 0..16 {
        let m = magic(sizes.get(d).copied().unwrap_or(1));
        for v in m {
            b.extend(v.to_le_bytes());
        }
    }
    for s in [src, dst] {
        for d in 0..16 {
            b.extend(s.get(d).copied().unwrap_or(0).to_le_bytes());
        }
    }
    assert_eq!(b.len(), 328);
    b
}

/// `StridedArgs64` (400 bytes).
fn strided_args64(sizes: &[u64], src: &[i64], dst: &[i64]) -> Vec<u8> {
    let mut b = Vec::new();
    let numel: u64 = sizes.iter().product();
    b.extend(numel.to_le_bytes());
    b.extend((sizes.len() as i32).to_le_bytes());
    b.extend([0u8; 4]);
    for d in 0..16 {
        b.extend(sizes.get(d).copied().unwrap_or(1).to_le_bytes());
    }
    for s in [src, dst] {
        for d in 0..16 {
            b.extend(s.get(d).copied().unwrap_or(0).to_le_bytes());
        }
    }
    assert_eq!(b.len(), 400);
    b
}

/// Element offsets (src, dst) of linear index `i`.
fn offsets(i: u64, sizes: &[u64], src: &[i64], dst: &[i64]) -> (i64, i64) {
    let (mut so, mut dof, mut rem) = (0, 0, i);
    for d in 0..sizes.len() {
        let c = (rem % sizes[d]) as i64;
        rem /= sizes[d];
        so += c * src[d];
        dof += c * dst[d];
    }
    (so, dof)
}

struct Case {
    sizes: Vec<u32>,
    src: Vec<i32>,
    dst: Vec<i32>,
    src_elems: usize,
}

fn cases() -> Vec<Case> {
    vec![
        // a transposed 3-D view into a contiguous destination
        Case {
            sizes: vec![7, 5, 3],
            src: vec![15, 3, 1],
            dst: vec![1, 7, 35],
            src_elems: 105,
        },
        // contiguous, several blocks, partial last warp
        Case {
            sizes: vec![1000],
            src: vec![1],
            dst: vec![1],
            src_elems: 1000,
        },
        // negative source stride (start offset supplied by the host via the base pointer)
        Case {
            sizes: vec![33, 9],
            src: vec![-1, 40],
            dst: vec![1, 33],
            src_elems: 400,
        },
        // broadcast (stride 0), 5 dims
        Case {
            sizes: vec![2, 3, 2, 2, 3],
            src: vec![1, 0, 2, 4, 0],
            dst: vec![1, 2, 6, 12, 24],
            src_elems: 8,
        },
    ]
}

fn check_strided(k: &Kernel, e: usize, wide: bool, threads: usize) {
    for (ci, c) in cases().iter().enumerate() {
        let sizes: Vec<u64> = c.sizes.iter().map(|&s| s as u64).collect();
        let src: Vec<i64> = c.src.iter().map(|&s| s as i64).collect();
        let dst: Vec<i64> = c.dst.iter().map(|&s| s as i64).collect();
        let numel: u64 = sizes.iter().product();
        let mut mem = TestMem::new();
        let data = pattern(c.src_elems * e, ci as u64 + 1);
        // negative strides: the base pointer points inside the buffer
        let min_so = (0..numel).map(|i| offsets(i, &sizes, &src, &dst).0).min().unwrap();
        let sva = mem.alloc_with(&data);
        let sbase = (sva as i64 - min_so.min(0) * e as i64) as u64;
        let dva = mem.alloc(numel as usize * e, 0xEE);
        let args = if wide {
            strided_args64(&sizes, &src, &dst)
        } else {
            strided_args(&c.sizes, &c.src, &c.dst)
        };
        let p = params(k, &[&sbase.to_le_bytes(), &dva.to_le_bytes(), &args]);
        let block = 64u32;
        let grid = if wide { 3 } else { (numel as u32).div_ceil(block * 4) };
        let stats = launch(k, &mem, [grid, 1, 1], [block, 1, 1], &p, threads).unwrap_or_else(|e| panic!("{e}"));
        let out = mem.read(dva, numel as usize * e);
        for i in 0..numel {
            let (so, dof) = offsets(i, &sizes, &src, &dst);
            let s = (so - min_so.min(0)) as usize * e;
            let d = dof as usize * e;
            assert_eq!(&out[d..d + e], &data[s..s + e], "{} case {ci} element {i}", k.name);
        }
        assert_eq!(stats.global_store_bytes, numel * e as u64, "{}", k.name);
        // Bytes used count each byte once per request: lanes reading one broadcast
        // element share it.
        if src.iter().take(sizes.len()).all(|&s| s != 0) {
            assert_eq!(stats.global_load_bytes, numel * e as u64, "{}", k.name);
        } else {
            assert!(stats.global_load_bytes < numel * e as u64, "{}", k.name);
        }
        assert!(stats.footprint.iter().any(|a| a.write && a.lo == dva));
    }
}

fn check_fill(k: &Kernel, e: usize) {
    let sizes = [6u32, 7];
    let dst = [7i32, 1];
    let mut mem = TestMem::new();
    let n = 42;
    let dva = mem.alloc(n * e, 0);
    let value = pattern(e, 99);
    let p = params(k, &[&dva.to_le_bytes(), &value, &strided_args(&sizes, &[0, 0], &dst)]);
    launch(k, &mem, [2, 1, 1], [8, 1, 1], &p, 2).unwrap_or_else(|err| panic!("{err}"));
    let out = mem.read(dva, n * e);
    for i in 0..n {
        assert_eq!(&out[i * e..i * e + e], &value[..], "{} element {i}", k.name);
    }
}

fn check_contig(k: &Kernel) {
    let mut mem = TestMem::new();
    let n = 300usize;
    let data = pattern(n * 16, 5);
    let s = mem.alloc_with(&data);
    let d = mem.alloc(n * 16, 0);
    let p = params(k, &[&s.to_le_bytes(), &d.to_le_bytes(), &(n as u64).to_le_bytes()]);
    let st = launch(k, &mem, [2, 1, 1], [64, 1, 1], &p, 2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(mem.read(d, n * 16), data);
    // 16-byte accesses: 4 lanes per 64-byte pair of sectors -> 16 sectors per full warp
    assert_eq!(st.global_load_bytes, (n * 16) as u64);
    assert_eq!(st.global_load_sectors, (n * 16 / 32) as u64);
    assert_eq!(st.global_load_requests, st.global_store_requests);
}

fn check_transpose(k: &Kernel, e: usize) {
    let (r, c, nb) = (37usize, 45usize, 2usize);
    let mut mem = TestMem::new();
    let data = pattern(r * c * nb * e, 17);
    let s = mem.alloc_with(&data);
    let d = mem.alloc(r * c * nb * e, 0xEE);
    let tiles_sf = c.div_ceil(32) as u32;
    let tiles_df = r.div_ceil(32) as u32;
    let mut args = Vec::new();
    for v in [c as u32, r as u32, c as u32, r as u32, tiles_sf, tiles_df] {
        args.extend(v.to_le_bytes());
    }
    args.extend(strided_args(&[nb as u32], &[(r * c) as i32], &[(r * c) as i32]));
    let p = params(k, &[&s.to_le_bytes(), &d.to_le_bytes(), &args]);
    let grid = tiles_sf * tiles_df * nb as u32;
    let st = launch(k, &mem, [grid, 1, 1], [32, 8, 1], &p, 2).unwrap_or_else(|err| panic!("{err}"));
    let out = mem.read(d, r * c * nb * e);
    for b in 0..nb {
        for i in 0..r {
            for j in 0..c {
                let so = (b * r * c + i * c + j) * e;
                let dof = (b * r * c + j * r + i) * e;
                assert_eq!(&out[dof..dof + e], &data[so..so + e], "{} b{b} ({i},{j})", k.name);
            }
        }
    }
    assert!(st.shared_requests > 0);
    if e >= 4 {
        // the +1 column of padding: no bank conflicts for 4- and 8-byte elements
        assert_eq!(st.shared_bank_conflicts, 0, "{}", k.name);
    }
}

fn check_module(file: &str, text: &str, threads: usize) {
    let m = devtensor_emu::ptx::parse(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut ran = 0;
    for &e in &ELEMS {
        check_strided(m.kernel(&format!("copy_strided_e{e}")).unwrap(), e, false, threads);
        check_strided(m.kernel(&format!("copy_strided64_e{e}")).unwrap(), e, true, threads);
        check_fill(m.kernel(&format!("fill_e{e}")).unwrap(), e);
        ran += 3;
        if e <= 8 {
            let k = m.kernel(&format!("transpose_tiled_e{e}")).unwrap();
            assert_eq!(k.shared_bytes, 32 * 33 * e, "{file}");
            check_transpose(k, e);
            ran += 1;
        }
    }
    check_contig(m.kernel("copy_contig_v16").unwrap());
    ran += 1;
    assert_eq!(ran, m.kernels.len(), "{file}: every kernel ran");
}

#[test]
fn every_fixture_parses_and_every_kernel_runs() {
    for (file, text) in fixtures("strided_copy_") {
        check_module(&file, &text, 2);
    }
}

#[test]
fn params_match_the_argument_structs() {
    for (file, text) in fixtures("strided_copy_") {
        let m = devtensor_emu::ptx::parse(&text).unwrap();
        let k = m.kernel("transpose_tiled_e4").unwrap();
        assert_eq!(k.param_bytes, 16 + 352, "{file}");
        assert_eq!(k.params[2].offset, 16);
        assert_eq!(k.params[2].size, 352);
        let f = m.kernel("fill_e16").unwrap();
        assert_eq!(
            (f.params[1].offset, f.params[1].size, f.params[1].align),
            (16, 16, 16),
            "{file}"
        );
        assert_eq!(m.kernel("copy_strided64_e1").unwrap().params[2].align, 8);
    }
}

#[test]
fn single_host_thread_gives_the_same_metrics() {
    let (_, text) = &fixtures("strided_copy_nvrtc13_sm90")[0];
    let m = devtensor_emu::ptx::parse(text).unwrap();
    let k = m.kernel("copy_strided_e4").unwrap();
    let run = |threads| {
        let mut mem = TestMem::new();
        let s = mem.alloc_with(&pattern(4 * 4096, 1));
        let d = mem.alloc(4 * 4096, 0);
        let args = strided_args(&[64, 64], &[64, 1], &[1, 64]);
        let p = params(k, &[&s.to_le_bytes(), &d.to_le_bytes(), &args]);
        launch(k, &mem, [8, 1, 1], [128, 1, 1], &p, threads).unwrap()
    };
    let a = run(1);
    let b = run(2);
    assert_eq!(a, b);
    // transposed read: 32 lanes read 32 different rows -> 32 sectors per request;
    // the contiguous write: 4 sectors per request
    assert_eq!(a.global_load_sectors, a.global_load_requests * 32);
    assert_eq!(a.global_store_sectors, a.global_store_requests * 4);
    assert_eq!(a.footprint.iter().filter(|x| x.write).count(), 1);
}

#[test]
fn out_of_bounds_destination_names_the_thread_and_line() {
    let (_, text) = &fixtures("strided_copy_nvrtc12_sm80")[0];
    let m = devtensor_emu::ptx::parse(text).unwrap();
    let k = m.kernel("copy_strided_e4").unwrap();
    let mut mem = TestMem::new();
    let s = mem.alloc_with(&pattern(4 * 100, 1));
    let d = mem.alloc(4 * 99, 0); // one element short
    let args = strided_args(&[100], &[1], &[1]);
    let p = params(k, &[&s.to_le_bytes(), &d.to_le_bytes(), &args]);
    let e = launch(k, &mem, [1, 1, 1], [32, 1, 1], &p, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::OutOfBounds);
    assert!(e.message.contains("copy_strided_e4"), "{}", e.message);
    assert!(e.message.contains("thread (3,0,0)"), "{}", e.message); // element 99 = base 3 + 3 * 32
    assert!(e.message.contains("st.global"), "{}", e.message);
    assert!(e.message.contains("PTX line"), "{}", e.message);
}
