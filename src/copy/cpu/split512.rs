//! Interleaved channels to planes with AVX-512 VBMI byte permutes: the
//! transposes whose source rows are 2, 3 or 4 elements of 1, 2, 4 or 8 bytes
//! (pixels of `s` channels, `n` of them, to `s` planes of `n`), and the
//! gather of every 2nd, 3rd or 4th element into a contiguous row (one such
//! plane alone). Each step writes 64 bytes of a plane from the `64·s`
//! source bytes they come from, and masked loads and stores take a row's
//! last piece, so rows of any length are whole vectors. These rows are often
//! short (a permuted 31 × 29 × 27 × 2 tensor is 899 slices of 27 pixels of
//! two channels), where element-by-element tails and per-row calls cost
//! more than the copy: NumPy and torch copy them one element at a time, at
//! about a cycle each.

use std::arch::x86_64::{
    __m512i, _mm512_mask_blend_epi8, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8, _mm512_permutex2var_epi8,
};

use smallvec::SmallVec;

use super::parallel::{PIXELS_A_TASK, Shared, for_each_segment, par_for};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Whether the CPU has these kernels' instructions (AVX-512 F, BW and VBMI)
/// and the AVX-512 kernels are allowed ([`super::avx512::enabled`]).
#[inline]
pub(super) fn enabled() -> bool {
    super::avx512::enabled() && std::is_x86_feature_detected!("avx512vbmi")
}

/// Whether a transpose over (`a`: unit destination stride, `b`: unit source
/// stride) of `e`-byte elements is one of [`split`]'s: `b` of 2 to 4
/// elements, `a` stepping one such row (pixels, channels).
pub(super) fn splits(a: PlanDim, b: PlanDim, e: usize) -> bool {
    matches!(e, 1 | 2 | 4 | 8) && (2..=4).contains(&b.len) && a.src == (b.len * e) as isize && b.src == e as isize
}

/// A step's byte permute for channel `c` of pixels of `s` elements of `e`
/// bytes: byte `j` of the 64 written comes from byte `p = (j / e)·s·e +
/// c·e + j % e` of the `64·s` read; `index[j]` is `p` modulo 128 (the
/// two-register permute's range), and bit `j` of `upper` says `p ≥ 128`
/// (taken from the third and fourth registers).
#[derive(Clone, Copy)]
struct Step {
    index: [u8; 64],
    upper: u64,
}

const fn step(e: usize, s: usize, c: usize) -> Step {
    let mut index = [0u8; 64];
    let mut upper = 0u64;
    let mut j = 0;
    while j < 64 {
        let p = (j / e) * s * e + c * e + j % e;
        index[j] = (p % 128) as u8;
        if p >= 128 {
            upper |= 1 << j;
        }
        j += 1;
    }
    Step { index, upper }
}

/// `STEPS[log2 e][s - 2][c]`, channels `c < s`.
const STEPS: [[[Step; 4]; 3]; 4] = {
    let mut t = [[[Step {
        index: [0; 64],
        upper: 0,
    }; 4]; 3]; 4];
    let mut k = 0;
    while k < 4 {
        let mut s = 2;
        while s <= 4 {
            let mut c = 0;
            while c < s {
                t[k][s - 2][c] = step(1 << k, s, c);
                c += 1;
            }
            s += 1;
        }
        k += 1;
    }
    t
};

/// The bytes of a 64-byte vector `at` bytes into a range of `len`.
#[inline(always)]
fn lanes(at: usize, len: usize) -> u64 {
    match len.saturating_sub(at) {
        0 => 0,
        v if v >= 64 => !0,
        v => (1u64 << v) - 1,
    }
}

/// Channels `c < channels` of `n` pixels of `s` elements of `e` bytes from
/// `src` to planes `dst + c·plane` (`n` elements each).
///
/// # Safety
///
/// [`enabled`]; `e` 1, 2, 4 or 8, `s` 2 to 4, `channels ≤ s`; bytes `0 ..
/// n·e` of each plane writable, bytes `0 .. (n − 1)·s·e + channels·e` of
/// `src` readable. No other byte is touched: the last piece's loads and
/// stores are masked (masked-off bytes are not accessed and do not fault).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn split_n(dst: *mut u8, plane: isize, src: *const u8, n: usize, e: usize, s: usize, channels: usize) {
    debug_assert!(matches!(e, 1 | 2 | 4 | 8) && (2..=4).contains(&s) && channels <= s);
    if n == 0 {
        return;
    }
    let steps = &STEPS[e.trailing_zeros() as usize][s - 2];
    // SAFETY: each table is 64 plain bytes.
    let index: [__m512i; 4] = std::array::from_fn(|c| unsafe { std::mem::transmute(steps[c].index) });
    let (out, read) = (n * e, (n - 1) * s * e + channels * e);
    let mut o = 0;
    while o < out {
        let base = o * s;
        // SAFETY: each load reads only the bytes of its mask, below `read`;
        // each store only bytes below `out` of its plane.
        unsafe {
            let load = |r: usize| _mm512_maskz_loadu_epi8(lanes(base + 64 * r, read), src.add(base + 64 * r).cast());
            let (r0, r1) = (load(0), load(1));
            let (r2, r3) = match s {
                2 => (r0, r1),
                3 => {
                    let r2 = load(2);
                    (r2, r2)
                }
                _ => (load(2), load(3)),
            };
            let mask = lanes(o, out);
            for (c, step) in steps.iter().enumerate().take(channels) {
                let mut v = _mm512_permutex2var_epi8(r0, index[c], r1);
                if s > 2 {
                    v = _mm512_mask_blend_epi8(step.upper, v, _mm512_permutex2var_epi8(r2, index[c], r3));
                }
                _mm512_mask_storeu_epi8(dst.offset(c as isize * plane).add(o).cast(), mask, v);
            }
        }
        o += 64;
    }
}

/// `dst[i] = src[i·s]` for `i < n`, elements of `e` bytes (1, 2, 4 or 8),
/// `s` of 2, 3 or 4: channel 0 of `n` pixels of `s` elements.
///
/// # Safety
///
/// [`enabled`]; bytes `0 .. n·e` of `dst` writable, bytes `i·s·e .. i·s·e +
/// e` of `src` readable for `i < n` (and no others are touched).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(super) unsafe fn gather(dst: *mut u8, src: *const u8, n: usize, e: usize, s: usize) {
    // SAFETY: one channel: the caller's bytes.
    unsafe { split_n(dst, 0, src, n, e, s, 1) }
}

/// The transpose of `e`-byte elements over `a` and `b` ([`splits`]), batched
/// over `batch`: each slice's `a.len` pixels of `b.len` channels to `b.len`
/// planes `b.dst` bytes apart, in pieces split across threads.
///
/// # Safety
///
/// As [`execute`](super::execute) for the plan these dims come from;
/// [`enabled`]; [`splits`]`(a, b, e)`.
pub(super) unsafe fn split(
    a: PlanDim,
    b: PlanDim,
    batch: &SmallVec<[PlanDim; INLINE_DIMS]>,
    dst: *mut u8,
    src: *const u8,
    e: usize,
    bytes: usize,
) {
    let per_slice = a.len.div_ceil(PIXELS_A_TASK);
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, bytes, |t0, t1| {
        for_each_segment(batch, per_slice, t0, t1, |dof, so, first, n| {
            let p0 = first * PIXELS_A_TASK;
            let p1 = ((first + n) * PIXELS_A_TASK).min(a.len);
            // SAFETY: pixels `p0..p1` of this slice, all their channels, are
            // elements of the plan; the CPU has the instructions (the
            // caller's contract).
            unsafe {
                split_n(
                    d.get().offset(dof).add(p0 * e),
                    b.dst,
                    s.get().offset(so).add(p0 * b.len * e),
                    p1 - p0,
                    e,
                    b.len,
                    b.len,
                )
            };
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element size, pixel size and channel count, 1 to 70 pixels
    /// (last pieces of every length), against the definition; nothing past
    /// each plane written, and the source ends at the last byte read, where
    /// a read past it would show under a checker (valgrind).
    #[test]
    fn splits_every_channel_count() {
        if !enabled() {
            println!("SKIP: the CPU has no AVX-512 VBMI");
            return;
        }
        for e in [1usize, 2, 4, 8] {
            for s in 2..=4 {
                for channels in 1..=s {
                    for n in 1..=70 {
                        let src: Vec<u8> = (0..(n - 1) * s * e + channels * e)
                            .map(|k| (k * 7 + k / 251) as u8)
                            .collect();
                        let plane = n * e + 64;
                        let mut dst = vec![0xA5u8; channels * plane];
                        // SAFETY: the CPU has the instructions; `src` holds the
                        // bytes read, each plane n·e bytes and more.
                        unsafe { split_n(dst.as_mut_ptr(), plane as isize, src.as_ptr(), n, e, s, channels) };
                        for c in 0..channels {
                            let out = &dst[c * plane..][..plane];
                            for i in 0..n {
                                let at = (i * s + c) * e;
                                assert_eq!(out[i * e..][..e], src[at..at + e], "e {e}, s {s}, c {c}, n {n}, i {i}");
                            }
                            assert!(
                                out[n * e..].iter().all(|&x| x == 0xA5),
                                "e {e}, s {s}, c {c}, n {n}: wrote past"
                            );
                        }
                    }
                }
            }
        }
    }
}
