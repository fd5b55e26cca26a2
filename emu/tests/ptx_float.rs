//! f32 / f16 / bf16 kernels (tests/fixtures/ptx/axpy.cu, compiled by NVRTC 12
//! and 13 for compute_80..120): every module parses and the results are
//! bit-exact against a host reference of the PTX semantics.

mod ptx_support;

use devtensor_emu::ptx::float::{BF16, F16, Rnd, from_bits, to_bits};
use ptx_support::*;

fn f2h(x: f32) -> u16 {
    to_bits(x as f64, F16, Rnd::N) as u16
}
fn h2f(h: u16) -> f32 {
    from_bits(h as u64, F16) as f32
}
fn f2b(x: f32) -> u16 {
    to_bits(x as f64, BF16, Rnd::N) as u16
}
fn b2f(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

const N: usize = 77;

fn inputs() -> (Vec<f32>, Vec<f32>) {
    let x = (0..N).map(|i| (i as f32 - 30.0) * 0.37 + 1e-3 * i as f32).collect();
    let y = (0..N).map(|i| 100.0 / (i as f32 + 0.5) - 7.25).collect();
    (x, y)
}

fn run_axpy(k: &devtensor_emu::ptx::Kernel, a: &[u8], x: Vec<u8>, y: Vec<u8>) -> Vec<u8> {
    let mut mem = TestMem::new();
    let xv = mem.alloc_with(&x);
    let yv = mem.alloc_with(&y);
    let p = params(k, &[a, &xv.to_le_bytes(), &yv.to_le_bytes(), &(N as u32).to_le_bytes()]);
    launch(k, &mem, [3, 1, 1], [32, 1, 1], &p, 1).unwrap_or_else(|e| panic!("{e}"));
    mem.read(yv, y.len())
}

fn bytes16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}
fn from16(b: &[u8]) -> Vec<u16> {
    b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

#[test]
fn axpy_kernels_are_bit_exact() {
    let (x, y) = inputs();
    let a = 1.75f32;
    for (file, text) in fixtures("axpy_") {
        let m = devtensor_emu::ptx::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        // f32: fma.rn.f32 (a * x + y rounded once)
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = run_axpy(m.kernel("axpy_f32").unwrap(), &a.to_le_bytes(), xb.clone(), yb);
        for i in 0..N {
            let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(got.to_bits(), x[i].mul_add(a, y[i]).to_bits(), "{file} f32 {i}");
        }
        // f16 storage, f32 math: cvt.f32.f16, fma.rn.f32, cvt.rn.f16.f32
        let xh: Vec<u16> = x.iter().map(|&v| f2h(v)).collect();
        let yh: Vec<u16> = y.iter().map(|&v| f2h(v)).collect();
        let out = from16(&run_axpy(
            m.kernel("axpy_f16").unwrap(),
            &a.to_le_bytes(),
            bytes16(&xh),
            bytes16(&yh),
        ));
        for i in 0..N {
            assert_eq!(out[i], f2h(h2f(xh[i]).mul_add(a, h2f(yh[i]))), "{file} f16 {i}");
        }
        // bf16 storage: mov.b32 %f, {0, %rs} and cvt.rn.bf16.f32
        let xb16: Vec<u16> = x.iter().map(|&v| f2b(v)).collect();
        let yb16: Vec<u16> = y.iter().map(|&v| f2b(v)).collect();
        let out = from16(&run_axpy(
            m.kernel("axpy_bf16").unwrap(),
            &a.to_le_bytes(),
            bytes16(&xb16),
            bytes16(&yb16),
        ));
        for i in 0..N {
            assert_eq!(out[i], f2b(b2f(xb16[i]).mul_add(a, b2f(yb16[i]))), "{file} bf16 {i}");
        }
        // fma.rn.f16 / fma.rn.bf16: one rounding of the exact a * x + y
        let ah = f2h(a);
        let out = from16(&run_axpy(
            m.kernel("hfma_f16").unwrap(),
            &ah.to_le_bytes(),
            bytes16(&xh),
            bytes16(&yh),
        ));
        for i in 0..N {
            let exact = (h2f(ah) as f64) * (h2f(xh[i]) as f64) + h2f(yh[i]) as f64;
            assert_eq!(out[i], to_bits(exact, F16, Rnd::N) as u16, "{file} hfma {i}");
        }
        let ab = f2b(a);
        let out = from16(&run_axpy(
            m.kernel("hfma_bf16").unwrap(),
            &ab.to_le_bytes(),
            bytes16(&xb16),
            bytes16(&yb16),
        ));
        for i in 0..N {
            let exact = (b2f(ab) as f64) * (b2f(xb16[i]) as f64) + b2f(yb16[i]) as f64;
            assert_eq!(out[i], to_bits(exact, BF16, Rnd::N) as u16, "{file} bfma {i}");
        }
        // misc_f32: abs, fma with an immediate, max/min with mov'd immediates, sub, cvt.rn.f32.s32
        let k = m.kernel("misc_f32").unwrap();
        let mut mem = TestMem::new();
        let xv = mem.alloc_with(&xb);
        let yv = mem.alloc(N * 4, 0);
        let p = params(k, &[&xv.to_le_bytes(), &yv.to_le_bytes(), &(N as u32).to_le_bytes()]);
        launch(k, &mem, [1, 1, 1], [128, 1, 1], &p, 1).unwrap();
        let out = mem.read(yv, N * 4);
        for i in 0..N {
            let v = x[i];
            let want = (v.mul_add(0.5, v.abs()) + v.max(1.0) - v.min(2.0)) + i as f32;
            let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(got.to_bits(), want.to_bits(), "{file} misc {i}");
        }
    }
}
