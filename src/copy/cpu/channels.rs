//! Byte images with three channels between pixel-interleaved (HWC) and planar
//! (CHW) layouts, the transposes whose short side is 3 bytes: SSSE3 byte
//! shuffles spread 16 pixels (48 bytes) over three 16-byte planes, or gather
//! them back. The tile route does these with a scalar loop per channel (256 ×
//! 224² × 3 u8, two cores, one run: 15 GB/s planar, 24 interleaved).

use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128};

use smallvec::SmallVec;

use super::parallel::{Shared, for_each_segment, par_for};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Pixels per task piece: 16 KiB of source, a multiple of 16.
const PIECE: usize = 16 << 10;

/// `pshufb` masks: `SPLIT[c][k]` picks, from the `k`-th 16 bytes of 16
/// interleaved pixels, the bytes of channel `c` (output byte `j` is pixel `j`;
/// 0x80 zeroes it). `JOIN[o][c]` places, in output vector `o`, the bytes of
/// plane `c` (output byte `j` is interleaved byte `16·o + j`).
const SPLIT: [[[u8; 16]; 3]; 3] = split_masks();
const JOIN: [[[u8; 16]; 3]; 3] = join_masks();

const fn split_masks() -> [[[u8; 16]; 3]; 3] {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut c = 0;
    while c < 3 {
        let mut j = 0;
        while j < 16 {
            let p = 3 * j + c;
            m[c][p / 16][j] = (p % 16) as u8;
            j += 1;
        }
        c += 1;
    }
    m
}

const fn join_masks() -> [[[u8; 16]; 3]; 3] {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut o = 0;
    while o < 3 {
        let mut j = 0;
        while j < 16 {
            let p = 16 * o + j;
            m[o][p % 3][j] = (p / 3) as u8;
            j += 1;
        }
        o += 1;
    }
    m
}

/// Which way the bytes go.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Channels {
    /// `a` pixels of 3 packed bytes (`a.src == 3`) into 3 planes (`b.dst` apart).
    Split,
    /// 3 planes (`a.src` apart) into `b` pixels of 3 packed bytes (`b.dst == 3`).
    Join,
}

impl Channels {
    /// The kernel for a 1-byte transpose over (`a`: unit destination stride,
    /// `b`: unit source stride), if it is one of these.
    pub(super) fn of(a: PlanDim, b: PlanDim) -> Option<Channels> {
        if b.len == 3 && a.src == 3 {
            Some(Channels::Split)
        } else if a.len == 3 && b.dst == 3 {
            Some(Channels::Join)
        } else {
            None
        }
    }
}

/// Copies the transpose of 1-byte elements over `a`, `b` (see [`Channels`]),
/// batched over `batch`, in pieces split across threads.
///
/// # Safety
///
/// As [`execute`](super::execute) for the plan these dims come from; the CPU
/// has SSSE3.
pub(super) unsafe fn channels(
    kind: Channels,
    a: PlanDim,
    b: PlanDim,
    batch: &SmallVec<[PlanDim; INLINE_DIMS]>,
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
) {
    // Pixels (the long side) and the planes' stride on the planar side.
    let (pixels, plane) = match kind {
        Channels::Split => (a.len, b.dst),
        Channels::Join => (b.len, a.src),
    };
    let per_slice = pixels.div_ceil(PIECE);
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, bytes, |t0, t1| {
        for_each_segment(batch, per_slice, t0, t1, |dof, so, first, n| {
            let p0 = first * PIECE;
            let p1 = ((first + n) * PIECE).min(pixels);
            // SAFETY: pixels `p0..p1` of this slice lie inside both operands;
            // the CPU has SSSE3 (the caller's contract).
            unsafe {
                match kind {
                    Channels::Split => split3(
                        d.get().offset(dof).add(p0),
                        plane,
                        s.get().offset(so).add(3 * p0),
                        p1 - p0,
                    ),
                    Channels::Join => join3(
                        d.get().offset(dof).add(3 * p0),
                        s.get().offset(so).add(p0),
                        plane,
                        p1 - p0,
                    ),
                }
            }
        });
    });
}

/// A mask table in registers.
#[inline(always)]
fn registers(masks: &[[[u8; 16]; 3]; 3]) -> [[__m128i; 3]; 3] {
    // SAFETY: SSE2 is part of the x86-64 baseline; each mask is 16 readable bytes.
    std::array::from_fn(|x| std::array::from_fn(|y| unsafe { _mm_loadu_si128(masks[x][y].as_ptr().cast()) }))
}

/// One output vector: the bytes `masks` pick from each of the three inputs.
///
/// # Safety
///
/// The CPU has SSSE3.
#[inline(always)]
unsafe fn gather(v: &[__m128i; 3], masks: &[__m128i; 3]) -> __m128i {
    // SAFETY: SSSE3 (the caller's contract); register operations only.
    unsafe {
        _mm_or_si128(
            _mm_or_si128(_mm_shuffle_epi8(v[0], masks[0]), _mm_shuffle_epi8(v[1], masks[1])),
            _mm_shuffle_epi8(v[2], masks[2]),
        )
    }
}

/// `dst[c·plane + i] = src[3·i + c]` for `i < n`, `c < 3`.
///
/// # Safety
///
/// The CPU has SSSE3; `src` readable for `3·n` bytes, each of the three
/// planes writable for `n`.
#[target_feature(enable = "ssse3")]
unsafe fn split3(dst: *mut u8, plane: isize, src: *const u8, n: usize) {
    // SAFETY: every access is inside the ranges above; the masks are plain bytes.
    unsafe {
        let m = registers(&SPLIT);
        let mut i = 0;
        while i + 16 <= n {
            let p = src.add(3 * i).cast::<__m128i>();
            let v = [_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)), _mm_loadu_si128(p.add(2))];
            for (c, mc) in m.iter().enumerate() {
                _mm_storeu_si128(dst.offset(c as isize * plane).add(i).cast(), gather(&v, mc));
            }
            i += 16;
        }
        for i in i..n {
            for c in 0..3 {
                *dst.offset(c as isize * plane).add(i) = *src.add(3 * i + c);
            }
        }
    }
}

/// `dst[3·i + c] = src[c·plane + i]` for `i < n`, `c < 3`.
///
/// # Safety
///
/// The CPU has SSSE3; `dst` writable for `3·n` bytes, each of the three
/// planes readable for `n`.
#[target_feature(enable = "ssse3")]
unsafe fn join3(dst: *mut u8, src: *const u8, plane: isize, n: usize) {
    // SAFETY: every access is inside the ranges above; the masks are plain bytes.
    unsafe {
        let m = registers(&JOIN);
        let mut i = 0;
        while i + 16 <= n {
            let v = [
                _mm_loadu_si128(src.add(i).cast::<__m128i>()),
                _mm_loadu_si128(src.offset(plane).add(i).cast::<__m128i>()),
                _mm_loadu_si128(src.offset(2 * plane).add(i).cast::<__m128i>()),
            ];
            let out = dst.add(3 * i).cast::<__m128i>();
            for (o, mo) in m.iter().enumerate() {
                _mm_storeu_si128(out.add(o), gather(&v, mo));
            }
            i += 16;
        }
        for i in i..n {
            for c in 0..3 {
                *dst.add(3 * i + c) = *src.offset(c as isize * plane).add(i);
            }
        }
    }
}
