//! Images with three channels between pixel-interleaved (HWC) and planar
//! (CHW) layouts, the transposes whose short side is 3 elements of 1, 2, 4 or
//! 8 bytes: SSSE3 byte shuffles spread 48 bytes of pixels over three 16-byte
//! planes, or gather them back. The tile route does these with a scalar loop
//! per channel (256 × 224² × 3 u8, two cores, one run: 15 GB/s planar, 24
//! interleaved). Two cores, Python, into a reused output, the median of
//! 11–15 paired calls in one process, against that route (elements of 2 and
//! 4 bytes took it until these shuffles covered them):
//! - to planes, 64 × 224² × 3: f32 1.16×, 1.21×, f16 1.99×, 1.89×;
//! - to pixels, 64 × 3 × 224²: f32 1.63×, f16 2.96× (streamed, about a
//!   memcpy's speed); u8 (these shuffles before, without streaming stores)
//!   1.42×.
//!
//! Pixels of 5 to 8 channels of up to 4 bytes to planes, in cache, where the
//! CPU lacks `split512`, and the first 2 to 8 channels of wider pixels: eight
//! elements of each pixel transposed in registers ([`split_wide`]).
//!
//! Pixels of two and four channels that fit a vector, in cache, where the CPU
//! lacks [`split512`](super::split512)'s AVX-512 (which takes them first):
//! the byte shuffles group each vector's channels, and a transpose of 8- or
//! 4-byte lanes makes planes of them (Zen 2 VM, Python, µs, the general
//! kernel's gathers or tiles → these, torch): 33 × 35 × 37 × 4 u8 permuted 1302
//! 164 → 21 (51), u16 3102 103 → 26 (53), 0312 49 → 17 (49); 224² × 4 u8 201
//! 80 → 8.9 (55); 17 × 19 × 23 × 2 u8 3102 29 → 4.4 (12).

use std::arch::x86_64::{
    __m128i, _mm_loadl_epi64, _mm_loadu_si128, _mm_or_si128, _mm_setzero_si128, _mm_shuffle_epi8, _mm_storeu_si128,
    _mm_stream_si128, _mm_unpackhi_epi16, _mm_unpackhi_epi32, _mm_unpackhi_epi64, _mm_unpacklo_epi8,
    _mm_unpacklo_epi16, _mm_unpacklo_epi32, _mm_unpacklo_epi64,
};

use std::arch::x86_64::{
    _mm256_loadu_pd, _mm256_loadu_ps, _mm256_permute2f128_pd, _mm256_permute2f128_ps, _mm256_shuffle_ps,
    _mm256_storeu_pd, _mm256_storeu_ps, _mm256_unpackhi_pd, _mm256_unpackhi_ps, _mm256_unpacklo_pd, _mm256_unpacklo_ps,
};
use std::ops::Range;

use smallvec::SmallVec;

use super::parallel::{PIXELS_A_TASK, Shared, for_each_segment, par_for_slow};
use super::runs::{Cache, copy_small, prefetch, store_fence};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Planes a multiple of this many bytes apart are written with ordinary
/// stores even in streamed copies: three streams of 16-byte streaming stores
/// at such distances ran slower than ordinary stores, and faster at others.
/// Two cores, Python, into a reused output, paired calls, streamed against
/// ordinary stores, by plane stride:
/// - 49 KiB (u8 256 × 224² × 3) 1.28×, 1.31×; 40000 bytes (u8 200²) 1.33×;
///   351.6 KiB (f32 300²) 1.35×; 195 KiB (f32 208 × 240) 1.41×;
/// - multiples of 2 KiB: 98 KiB (f16 224²) 0.70×, 0.69×; 196 KiB (f32 224²)
///   0.80×, 0.82×; 198 KiB (f32 176 × 288) 0.84×; 256 KiB (u8 512²) 0.76×;
///   512 KiB (i16 512²) 0.78×; 1 MiB (f32 512²) 0.81×.
///
/// The pixel side is one stream, and its streaming stores won everywhere.
const PLANES_ALIAS: isize = 2048;

/// `pshufb` masks for one element size: `[x][y]` picks the bytes of input
/// vector `y` that go to output vector `x` (0x80 zeroes a byte).
type Masks = [[[u8; 16]; 3]; 3];

/// Split masks, `SPLIT[s]` for elements of `1 << s` bytes: `SPLIT[s][c][k]` picks,
/// from the `k`-th 16 bytes of 48 bytes of interleaved pixels, the bytes of
/// channel `c` (output byte `j` is byte `j % e` of pixel `j / e`).
const SPLIT: [Masks; 4] = [split_masks(1), split_masks(2), split_masks(4), split_masks(8)];
/// Join masks: `JOIN[s][o][c]` places, in output vector `o`, the bytes of
/// plane `c` (output byte `j` is interleaved byte `16·o + j`).
const JOIN: [Masks; 4] = [join_masks(1), join_masks(2), join_masks(4), join_masks(8)];

const fn split_masks(e: usize) -> Masks {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut c = 0;
    while c < 3 {
        let mut j = 0;
        while j < 16 {
            let p = (3 * (j / e) + c) * e + j % e;
            m[c][p / 16][j] = (p % 16) as u8;
            j += 1;
        }
        c += 1;
    }
    m
}

const fn join_masks(e: usize) -> Masks {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut o = 0;
    while o < 3 {
        let mut j = 0;
        while j < 16 {
            // Byte `p % e` of channel `(p / e) % 3` of pixel `p / 3e`.
            let p = 16 * o + j;
            m[o][(p / e) % 3][j] = (p / (3 * e) * e + p % e) as u8;
            j += 1;
        }
        o += 1;
    }
    m
}

/// Which way the pixels go.
/// `pshufb` masks that gather, in a 16-byte vector of pixels of `k` elements
/// of `e` bytes (`k·e ≤ 16`), each channel's elements together, channel
/// after channel (`16 / k` bytes each: [`transpose_lanes`]' lanes), for `e`
/// of 1, 2, 4 and 8 bytes (the masks of wider pixels are never used).
const GROUP2: [[u8; 16]; 4] = [group_mask(2, 1), group_mask(2, 2), group_mask(2, 4), group_mask(2, 8)];
const GROUP4: [[u8; 16]; 4] = [group_mask(4, 1), group_mask(4, 2), group_mask(4, 4), group_mask(4, 4)];
/// Their inverses: each channel's elements back between the others'.
const UNGROUP2: [[u8; 16]; 4] = [
    ungroup_mask(2, 1),
    ungroup_mask(2, 2),
    ungroup_mask(2, 4),
    ungroup_mask(2, 8),
];
const UNGROUP4: [[u8; 16]; 4] = [
    ungroup_mask(4, 1),
    ungroup_mask(4, 2),
    ungroup_mask(4, 4),
    ungroup_mask(4, 4),
];

/// Output byte `c·P·e + q·e + b` is input byte `(q·k + c)·e + b` (byte `b`
/// of channel `c` of pixel `q`, `P = 16 / (k·e)` pixels).
const fn group_mask(k: usize, e: usize) -> [u8; 16] {
    let mut m = [0u8; 16];
    let p = 16 / (k * e);
    let mut j = 0;
    while j < 16 {
        let (c, q, b) = (j / (p * e), j % (p * e) / e, j % e);
        m[j] = ((q * k + c) * e + b) as u8;
        j += 1;
    }
    m
}

const fn ungroup_mask(k: usize, e: usize) -> [u8; 16] {
    let g = group_mask(k, e);
    let mut m = [0u8; 16];
    let mut j = 0;
    while j < 16 {
        m[g[j] as usize] = j as u8;
        j += 1;
    }
    m
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Channels {
    /// `a` pixels of `k` packed elements (`a.src == k·e`) into `k` planes
    /// (`b.dst` apart).
    Split(usize),
    /// `k` planes (`a.src` apart) into `b` pixels of `k` packed elements
    /// (`b.dst == k·e`).
    Join(usize),
    /// `a` pixels (`a.src` apart, at least `k·e`: packed, or the first `k`
    /// channels of wider ones) of `k` elements into `k` planes
    /// ([`split_wide`]): 5 to 8 of 1, 2 or 4 bytes ([`Channels::of`]), and
    /// 2 to 8 of 1, 2, 4 or 8 bytes out of wider pixels
    /// ([`Channels::first_of_wide_pixels`]).
    SplitWide(usize),
}

impl Channels {
    /// The kernel for a transpose of `e`-byte elements over (`a`: unit
    /// destination stride, `b`: unit source stride), if it is one of these:
    /// pixels of 3 channels, and with `few`, of 2 or 4 that fit a vector,
    /// and 5 to 8 channels of up to 4 bytes to planes, a step of
    /// [`split_wide`] or more.
    pub(super) fn of(a: PlanDim, b: PlanDim, e: usize, few: bool) -> Option<Channels> {
        let takes = |k: usize| k == 3 || (few && matches!(k, 2 | 4) && k * e <= 16);
        if !matches!(e, 1 | 2 | 4 | 8) {
            None
        } else if takes(b.len) && a.src == (b.len * e) as isize {
            Some(Channels::Split(b.len))
        } else if takes(a.len) && b.dst == (a.len * e) as isize {
            Some(Channels::Join(a.len))
        } else if few
            && e <= 4
            && (5..=8).contains(&b.len)
            && a.src >= (b.len * e) as isize
            && a.src % e as isize == 0
            && a.len >= wide_step(e)
        {
            Some(Channels::SplitWide(b.len))
        } else {
            None
        }
    }

    /// The kernel for the first `k = b.len` channels (2 to 8) of pixels of
    /// more than `k` elements of 1, 2, 4 or 8 bytes (`a.src` apart) to planes,
    /// if there are pixels for a [`split_wide`] step: one pass over the
    /// pixels, where gathers a channel (as NumPy copies them) read every line
    /// of the source `k` times, from L2 at best. The caller decides when
    /// these beat tiles ([`mod@super::transpose`]'s `few_channels_of_wide_pixels`).
    /// Zen 2 VM, Python, into a new output, µs, gathers → one pass (NumPy):
    /// `x[:, :2].T` of 4000 × 20 f32 6.10 → 3.51 (5.79), u16 3.95 → 2.39
    /// (4.18); `x[:, :3].T` of 1000 × 16 f32 2.71 → 1.45 (2.52), f64 2.82 →
    /// 1.48 (2.55), u8 1.69 → 0.97 (1.69); `x[:, :6].T` of 500 × 12 f64 2.60
    /// → 1.40 (2.40). Of 341 such copies (300 to 100000 rows, pitches 10 to
    /// 64, 2 to 8 channels, u8 to f64), the best of two runs each, those
    /// slower than NumPy 102 → 11 (the 300-row ones at 0.91× or better), none
    /// slower than the gathers by more than noise (0.97×).
    pub(super) fn first_of_wide_pixels(a: PlanDim, b: PlanDim, e: usize) -> Option<Channels> {
        let k = b.len;
        let wide = b.src == e as isize && a.src > (k * e) as isize && a.src % e as isize == 0;
        (matches!(e, 1 | 2 | 4 | 8) && (2..=8).contains(&k) && wide && a.len >= wide_step(e))
            .then_some(Channels::SplitWide(k))
    }
}

/// Copies the transpose of `e`-byte elements over `a`, `b` (see
/// [`Channels`]), batched over `batch`, in pieces split across threads;
/// with `nt`, streaming stores where the outputs are 16-byte aligned (and
/// planes not a multiple of [`PLANES_ALIAS`] apart).
///
/// # Safety
///
/// As [`execute`](super::execute) for the plan these dims come from; the CPU
/// has SSSE3; `e` is 1, 2, 4 or 8.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn channels(
    kind: Channels,
    a: PlanDim,
    b: PlanDim,
    batch: &SmallVec<[PlanDim; INLINE_DIMS]>,
    dst: *mut u8,
    src: *const u8,
    e: usize,
    bytes: usize,
    nt: bool,
) {
    // Pixels (the long side) and the planes' stride on the planar side.
    let (pixels, plane, k) = match kind {
        Channels::Split(k) | Channels::SplitWide(k) => (a.len, b.dst, k),
        Channels::Join(k) => (b.len, a.src, k),
    };
    // The mask tables' index: elements of `1 << size_index` bytes.
    let size_index = e.trailing_zeros() as usize;
    let per_slice = pixels.div_ceil(PIXELS_A_TASK);
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    par_for_slow(per_slice * slices, bytes, |t0, t1| {
        for_each_segment(batch, per_slice, t0, t1, |dof, so, first, n| {
            let p0 = first * PIXELS_A_TASK;
            let p1 = ((first + n) * PIXELS_A_TASK).min(pixels);
            // SAFETY: pixels `p0..p1` of this slice lie inside both operands;
            // the CPU has SSSE3 (the caller's contract).
            unsafe {
                let n = p1 - p0;
                match kind {
                    Channels::Split(_) => {
                        let out = d.get().offset(dof).add(p0 * e);
                        let stream =
                            nt && (out as usize).is_multiple_of(16) && plane % 16 == 0 && plane % PLANES_ALIAS != 0;
                        let input = s.get().offset(so).add(k * p0 * e);
                        match (k, stream) {
                            (3, true) => split3::<true>(out, plane, input, n, e, &SPLIT[size_index]),
                            (3, false) => split3::<false>(out, plane, input, n, e, &SPLIT[size_index]),
                            (2, true) => split_lanes::<true, 2>(out, plane, input, n, e, &GROUP2[size_index]),
                            (2, false) => split_lanes::<false, 2>(out, plane, input, n, e, &GROUP2[size_index]),
                            (_, true) => split_lanes::<true, 4>(out, plane, input, n, e, &GROUP4[size_index]),
                            (_, false) => split_lanes::<false, 4>(out, plane, input, n, e, &GROUP4[size_index]),
                        }
                    }
                    Channels::SplitWide(_) => {
                        let out = d.get().offset(dof).add(p0 * e);
                        let input = s.get().offset(so + p0 as isize * a.src);
                        split_wide(out, plane, input, n, e, k, a.src as usize / e);
                    }
                    Channels::Join(_) => {
                        let out = d.get().offset(dof).add(k * p0 * e);
                        let input = s.get().offset(so).add(p0 * e);
                        match (k, nt && (out as usize).is_multiple_of(16)) {
                            (3, true) => join3::<true>(out, input, plane, n, e, &JOIN[size_index]),
                            (3, false) => join3::<false>(out, input, plane, n, e, &JOIN[size_index]),
                            (2, true) => join_lanes::<true, 2>(out, input, plane, n, e, &UNGROUP2[size_index]),
                            (2, false) => join_lanes::<false, 2>(out, input, plane, n, e, &UNGROUP2[size_index]),
                            (_, true) => join_lanes::<true, 4>(out, input, plane, n, e, &UNGROUP4[size_index]),
                            (_, false) => join_lanes::<false, 4>(out, input, plane, n, e, &UNGROUP4[size_index]),
                        }
                    }
                }
            }
        });
        store_fence(nt);
    });
}

/// Runs `pixels(i)` for the whole steps of `step` pixels in `n`, then, with
/// ordinary stores (not `NT`: the step would start off the 16-byte
/// alignment) and `n ≥ step`, once more for the step ending at the last
/// pixel, over some of the step before (the same values). Returns the first
/// pixel left for [`split_rest`] or [`join_rest`] (`n` when none).
#[inline(always)]
fn in_steps<const NT: bool>(n: usize, step: usize, mut pixels: impl FnMut(usize)) -> usize {
    let mut i = 0;
    while i + step <= n {
        pixels(i);
        i += step;
    }
    if !NT && i < n && n >= step {
        pixels(n - step);
        return n;
    }
    i
}

/// `dst[c·plane + i] = src[s·i + c]` for `i` in `pixels`, `c < k`, `e`-byte
/// elements (offsets in elements), one element at a time, with word loads
/// ([`copy_small`]): `copy_nonoverlapping` with a run-time length is a call to
/// `memmove`, which took a third of a 31 × 29 × 27 × 3 u8 permute's time
/// (3102, the 11 pixels past the last whole step of each 27).
///
/// # Safety
///
/// As the splits for those pixels; `e` is 1, 2, 4 or 8.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // two operands, their strides, the pixels and their shape
unsafe fn split_rest(dst: *mut u8, plane: isize, src: *const u8, s: usize, pixels: Range<usize>, k: usize, e: usize) {
    for i in pixels {
        for c in 0..k {
            // SAFETY: forwarded.
            unsafe { copy_small(dst.offset(c as isize * plane).add(i * e), src.add((s * i + c) * e), e) };
        }
    }
}

/// `dst[k·i + c] = src[c·plane + i]` for `i` in `pixels`, `c < k`, as
/// [`split_rest`].
///
/// # Safety
///
/// As the joins for those pixels; `e` is 1, 2, 4 or 8.
#[inline(always)]
unsafe fn join_rest(dst: *mut u8, src: *const u8, plane: isize, pixels: Range<usize>, k: usize, e: usize) {
    for i in pixels {
        for c in 0..k {
            // SAFETY: forwarded.
            unsafe { copy_small(dst.add((k * i + c) * e), src.offset(c as isize * plane).add(i * e), e) };
        }
    }
}

/// Stores 16 bytes, streamed with `NT` (then `p` is 16-byte aligned).
///
/// # Safety
///
/// `p` writable for 16 bytes; 16-byte aligned with `NT`.
#[inline(always)]
unsafe fn store<const NT: bool>(p: *mut u8, v: __m128i) {
    // SAFETY: the caller's contract; SSE2 is part of the x86-64 baseline.
    unsafe {
        if NT {
            _mm_stream_si128(p.cast(), v);
        } else {
            _mm_storeu_si128(p.cast(), v);
        }
    }
}

/// A mask table in registers.
#[inline(always)]
fn registers(masks: &Masks) -> [[__m128i; 3]; 3] {
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

/// `dst[c·plane + i] = src[3·i + c]` for `i < n`, `c < 3`, `e`-byte elements
/// (offsets in elements), 16 / e pixels a step.
///
/// # Safety
///
/// The CPU has SSSE3; `src` readable for `3·n` elements, each of the three
/// planes writable for `n`; with `NT`, `dst` and `plane` multiples of 16.
#[target_feature(enable = "ssse3")]
unsafe fn split3<const NT: bool>(dst: *mut u8, plane: isize, src: *const u8, n: usize, e: usize, masks: &Masks) {
    // SAFETY: every access is inside the ranges above; the masks are plain bytes.
    unsafe {
        let m = registers(masks);
        let step = 16 / e;
        let pixels = |i: usize| {
            let p = src.add(3 * i * e).cast::<__m128i>();
            let v = [_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)), _mm_loadu_si128(p.add(2))];
            for (c, mc) in m.iter().enumerate() {
                store::<NT>(dst.offset(c as isize * plane).add(i * e), gather(&v, mc));
            }
        };
        let rest = in_steps::<NT>(n, step, pixels);
        split_rest(dst, plane, src, 3, rest..n, 3, e);
    }
}

/// `dst[3·i + c] = src[c·plane + i]` for `i < n`, `c < 3`, `e`-byte elements
/// (offsets in elements), 16 / e pixels a step.
///
/// # Safety
///
/// The CPU has SSSE3; `dst` writable for `3·n` elements, each of the three
/// planes readable for `n`; with `NT`, `dst` a multiple of 16.
#[target_feature(enable = "ssse3")]
unsafe fn join3<const NT: bool>(dst: *mut u8, src: *const u8, plane: isize, n: usize, e: usize, masks: &Masks) {
    // SAFETY: every access is inside the ranges above; the masks are plain bytes.
    unsafe {
        let m = registers(masks);
        let step = 16 / e;
        let pixels = |i: usize| {
            let v = [
                _mm_loadu_si128(src.add(i * e).cast::<__m128i>()),
                _mm_loadu_si128(src.offset(plane).add(i * e).cast::<__m128i>()),
                _mm_loadu_si128(src.offset(2 * plane).add(i * e).cast::<__m128i>()),
            ];
            let out = dst.add(3 * i * e);
            for (o, mo) in m.iter().enumerate() {
                store::<NT>(out.add(16 * o), gather(&v, mo));
            }
        };
        let rest = in_steps::<NT>(n, step, pixels);
        join_rest(dst, src, plane, rest..n, 3, e);
    }
}

/// Transposes the `K × K` matrix of `16 / K`-byte lanes in `v` (`K` of 2 or
/// 4): lane `j` of vector `i` goes to lane `i` of vector `j`. Its own inverse.
#[inline(always)]
fn transpose_lanes<const K: usize>(v: &mut [__m128i; K]) {
    // SAFETY: SSE2 is part of the x86-64 baseline; register operations only.
    unsafe {
        if K == 2 {
            let (x, y) = (v[0], v[1]);
            v[0] = _mm_unpacklo_epi64(x, y);
            v[1] = _mm_unpackhi_epi64(x, y);
        } else {
            let t0 = _mm_unpacklo_epi32(v[0], v[1]);
            let t1 = _mm_unpackhi_epi32(v[0], v[1]);
            let t2 = _mm_unpacklo_epi32(v[2], v[3]);
            let t3 = _mm_unpackhi_epi32(v[2], v[3]);
            v[0] = _mm_unpacklo_epi64(t0, t2);
            v[1] = _mm_unpackhi_epi64(t0, t2);
            v[2] = _mm_unpacklo_epi64(t1, t3);
            v[3] = _mm_unpackhi_epi64(t1, t3);
        }
    }
}

/// `dst[c·plane + i] = src[K·i + c]` for `i < n`, `c < K` (2 or 4), `e`-byte
/// elements (`K·e ≤ 16`; offsets in elements), 16 / e pixels a step: each of
/// `K` vectors of pixels grouped by channel ([`GROUP2`], [`GROUP4`]), then
/// their lanes transposed, a vector a plane. As [`split3`], the last pixels in
/// one more step over the step before.
///
/// # Safety
///
/// The CPU has SSSE3; `src` readable for `K·n` elements, each of the `K`
/// planes writable for `n`; with `NT`, `dst` and `plane` multiples of 16.
#[target_feature(enable = "ssse3")]
unsafe fn split_lanes<const NT: bool, const K: usize>(
    dst: *mut u8,
    plane: isize,
    src: *const u8,
    n: usize,
    e: usize,
    group: &[u8; 16],
) {
    // SAFETY: every access is inside the ranges above; the mask is 16 plain bytes.
    unsafe {
        let m = _mm_loadu_si128(group.as_ptr().cast());
        let step = 16 / e;
        let pixels = |i: usize| {
            let p = src.add(K * i * e).cast::<__m128i>();
            let mut v = [_mm_setzero_si128(); K];
            for (j, x) in v.iter_mut().enumerate() {
                *x = _mm_shuffle_epi8(_mm_loadu_si128(p.add(j)), m);
            }
            transpose_lanes(&mut v);
            for (c, x) in v.iter().enumerate() {
                store::<NT>(dst.offset(c as isize * plane).add(i * e), *x);
            }
        };
        let rest = in_steps::<NT>(n, step, pixels);
        split_rest(dst, plane, src, K, rest..n, K, e);
    }
}

/// `dst[K·i + c] = src[c·plane + i]` for `i < n`, `c < K` (2 or 4), `e`-byte
/// elements (`K·e ≤ 16`; offsets in elements), 16 / e pixels a step: a vector
/// of each plane, their lanes transposed, each then shuffled back into
/// pixels ([`UNGROUP2`], [`UNGROUP4`]).
///
/// # Safety
///
/// The CPU has SSSE3; `dst` writable for `K·n` elements, each of the `K`
/// planes readable for `n`; with `NT`, `dst` a multiple of 16.
#[target_feature(enable = "ssse3")]
unsafe fn join_lanes<const NT: bool, const K: usize>(
    dst: *mut u8,
    src: *const u8,
    plane: isize,
    n: usize,
    e: usize,
    ungroup: &[u8; 16],
) {
    // SAFETY: every access is inside the ranges above; the mask is 16 plain bytes.
    unsafe {
        let m = _mm_loadu_si128(ungroup.as_ptr().cast());
        let step = 16 / e;
        let pixels = |i: usize| {
            let mut v = [_mm_setzero_si128(); K];
            for (c, x) in v.iter_mut().enumerate() {
                *x = _mm_loadu_si128(src.offset(c as isize * plane).add(i * e).cast());
            }
            transpose_lanes(&mut v);
            let out = dst.add(K * i * e);
            for (j, x) in v.iter().enumerate() {
                store::<NT>(out.add(16 * j), _mm_shuffle_epi8(*x, m));
            }
        };
        let rest = in_steps::<NT>(n, step, pixels);
        join_rest(dst, src, plane, rest..n, K, e);
    }
}

/// Pixels a [`split_wide`] step takes: a 16-byte vector a plane for
/// elements of 1 and 2 bytes, 32 bytes for 4.
fn wide_step(e: usize) -> usize {
    if e <= 2 { 16 / e } else { 32 / e }
}

/// Bytes past a [`split_wide`] step's stores at which each plane's line is
/// fetched for writing ([`prefetch_planes`]).
const PLANES_WRITE_AHEAD: usize = 128;

/// Fetches for writing, in each of the `K` planes `plane` bytes apart from
/// `dst`, the line [`PLANES_WRITE_AHEAD`] bytes past byte `at`. A step's
/// stores go to `K` lines far apart, and a store to a line not in L1 holds
/// every later store in the store buffer until the line is there: out of
/// L1, the steps waited on the planes' lines one after another. Emerald
/// Rapids VM, Python, into a reused output, the best of nine alternated
/// runs, µs, `x[:, :6].T` of f64 pixels of 12 (NumPy): 350 pixels 1.52 →
/// 0.97 (1.23), 500 1.92 → 1.23 (1.65), 300 of 20 1.19 → 0.84 (1.13); 200
/// (in L1) and 1000 to 2000 unchanged.
#[inline(always)]
fn prefetch_planes<const K: usize>(dst: *mut u8, plane: isize, at: usize) {
    for c in 0..K {
        prefetch(
            dst.wrapping_offset(c as isize * plane)
                .wrapping_add(at + PLANES_WRITE_AHEAD),
            Cache::L1Write,
        );
    }
}

/// `dst[c·plane + i] = src[s·i + c]` for `i < n`, `c < k` (2 to 8),
/// `e`-byte elements (offsets in elements), [`wide_step`] pixels a step:
/// eight elements read from each pixel (8-byte ones: four where `k ≤ 4`; up
/// to `8 − k` past its channels), the block transposed in registers (SSE2
/// unpacks for 1 and 2 bytes, AVX ones for 4 and 8), a vector a plane, each
/// plane's line two ahead fetched for writing ([`prefetch_planes`]). The
/// pixels whose reads would pass the last one's channels go one by one, as
/// [`split3`]'s rest. The general kernel's gathers took these element by
/// element. Zen 2 VM, `bench/cpu_copy_peers.py`,
/// two runs each, GB/s, gathers → steps (NumPy): pixels to planes u8 40 × 30
/// × 6 2.4 → 6.3 (3.3), 100 × 20 × 7 2.2 → 6.1 (3.1), u16 64 × 64 × 5 6.6 →
/// 20.0–20.3 (9.1), f32 40 × 30 × 6 12.0 → 22.2–23.0 (12.8); `x[:, :5].T` of
/// 1000 × 8 u8 3.5 → 8.7–8.8 (3.9), u16 7.0 → 15.7 (7.6), f32 20.8–21.0 →
/// 30.0 (13.8); `x[:, :6].T` of 500 × 12 u8 3.3–3.4 → 6.1–6.2 (3.3), u16
/// 6.6–6.7 → 11.9 (6.5), f32 12.2–12.3 → 19.8 (12.2). Not packed pixels of
/// 8-byte elements, whose tiles and gathers won (f64 100 × 100 × 8 83 → 75,
/// 1000 × 5 35 → 29); [`Channels::first_of_wide_pixels`] has the first
/// channels of wider pixels, of every size.
///
/// # Safety
///
/// `src` readable for the `k` channels of each of the `n` pixels `s ≥ k`
/// elements apart, each of the `k` planes writable for `n` elements; no
/// element of the planes shares a byte with a channel read (other bytes of
/// the pixels may be the planes' where one thread copies: `copy_strided`'s
/// interleaved views); `e` is 1, 2, 4 or 8, and the CPU has
/// AVX where it is 4 or 8.
#[allow(clippy::too_many_arguments)] // two operands, their strides, the pixels and their shape
unsafe fn split_wide(dst: *mut u8, plane: isize, src: *const u8, n: usize, e: usize, k: usize, s: usize) {
    // Pixels whose eight elements (four 8-byte ones and `k ≤ 4`: fewer)
    // end within the last pixel's channels.
    let whole = n.saturating_sub((8 - k).div_ceil(s));
    // SAFETY: forwarded; pixels `0..whole` are readable for eight elements.
    unsafe {
        let rest = match (e, k) {
            (1, 2) => split_wide_steps::<1, 2>(dst, plane, src, whole, s),
            (1, 3) => split_wide_steps::<1, 3>(dst, plane, src, whole, s),
            (1, 4) => split_wide_steps::<1, 4>(dst, plane, src, whole, s),
            (2, 2) => split_wide_steps::<2, 2>(dst, plane, src, whole, s),
            (2, 3) => split_wide_steps::<2, 3>(dst, plane, src, whole, s),
            (2, 4) => split_wide_steps::<2, 4>(dst, plane, src, whole, s),
            (1, 5) => split_wide_steps::<1, 5>(dst, plane, src, whole, s),
            (1, 6) => split_wide_steps::<1, 6>(dst, plane, src, whole, s),
            (1, 7) => split_wide_steps::<1, 7>(dst, plane, src, whole, s),
            (1, _) => split_wide_steps::<1, 8>(dst, plane, src, whole, s),
            (2, 5) => split_wide_steps::<2, 5>(dst, plane, src, whole, s),
            (2, 6) => split_wide_steps::<2, 6>(dst, plane, src, whole, s),
            (2, 7) => split_wide_steps::<2, 7>(dst, plane, src, whole, s),
            (2, _) => split_wide_steps::<2, 8>(dst, plane, src, whole, s),
            (8, 2) => split_wide_f64::<2>(dst, plane, src, whole, s),
            (8, 3) => split_wide_f64::<3>(dst, plane, src, whole, s),
            (8, 4) => split_wide_f64::<4>(dst, plane, src, whole, s),
            (8, 5) => split_wide_f64::<5>(dst, plane, src, whole, s),
            (8, 6) => split_wide_f64::<6>(dst, plane, src, whole, s),
            (8, 7) => split_wide_f64::<7>(dst, plane, src, whole, s),
            (8, _) => split_wide_f64::<8>(dst, plane, src, whole, s),
            (_, 2) => split_wide_f32::<2>(dst, plane, src, whole, s),
            (_, 3) => split_wide_f32::<3>(dst, plane, src, whole, s),
            (_, 4) => split_wide_f32::<4>(dst, plane, src, whole, s),
            (_, 5) => split_wide_f32::<5>(dst, plane, src, whole, s),
            (_, 6) => split_wide_f32::<6>(dst, plane, src, whole, s),
            (_, 7) => split_wide_f32::<7>(dst, plane, src, whole, s),
            _ => split_wide_f32::<8>(dst, plane, src, whole, s),
        };
        split_rest(dst, plane, src, s, rest..n, k, e);
    }
}

/// [`split_wide`]'s steps over the first `n` pixels, each readable for eight
/// `E`-byte elements (1 or 2); returns the first pixel left.
///
/// # Safety
///
/// As [`split_wide`], with `n` pixels readable for eight elements each.
#[inline(always)]
unsafe fn split_wide_steps<const E: usize, const K: usize>(
    dst: *mut u8,
    plane: isize,
    src: *const u8,
    n: usize,
    s: usize,
) -> usize {
    let pixels = |i: usize| {
        prefetch_planes::<K>(dst, plane, i * E);
        // SAFETY: pixels `i..i + step` are readable for eight elements (the
        // caller's `n`); the planes' elements `i..i + step` are writable.
        unsafe {
            let at = |j: usize| src.add((i + j) * s * E).cast::<__m128i>();
            // Channels 0–3 and 4–7 of four pixels each, in 32-bit lanes.
            let (lo, hi): ([__m128i; 4], [__m128i; 4]) = if E == 1 {
                // Pixel pairs: a 16-bit lane a channel.
                let x: [__m128i; 16] = std::array::from_fn(|j| _mm_loadl_epi64(at(j)));
                let p: [__m128i; 8] = std::array::from_fn(|j| _mm_unpacklo_epi8(x[2 * j], x[2 * j + 1]));
                (
                    std::array::from_fn(|j| _mm_unpacklo_epi16(p[2 * j], p[2 * j + 1])),
                    std::array::from_fn(|j| _mm_unpackhi_epi16(p[2 * j], p[2 * j + 1])),
                )
            } else {
                let x: [__m128i; 8] = std::array::from_fn(|j| _mm_loadu_si128(at(j)));
                (
                    std::array::from_fn(|j| _mm_unpacklo_epi16(x[2 * j], x[2 * j + 1])),
                    std::array::from_fn(|j| _mm_unpackhi_epi16(x[2 * j], x[2 * j + 1])),
                )
            };
            for c in 0..K {
                let v = if c < 4 { &lo } else { &hi };
                // Channels `c & !1` and `c | 1` of each half's pixels, in 64-bit lanes.
                let (x, y) = if c % 4 < 2 {
                    (_mm_unpacklo_epi32(v[0], v[1]), _mm_unpacklo_epi32(v[2], v[3]))
                } else {
                    (_mm_unpackhi_epi32(v[0], v[1]), _mm_unpackhi_epi32(v[2], v[3]))
                };
                let out = if c % 2 == 0 {
                    _mm_unpacklo_epi64(x, y)
                } else {
                    _mm_unpackhi_epi64(x, y)
                };
                store::<false>(dst.offset(c as isize * plane).add(i * E), out);
            }
        }
    };
    in_steps::<false>(n, wide_step(E), pixels)
}

/// [`split_wide_steps`] for 4-byte elements: eight pixels a step, an AVX
/// 8 × 8 transpose.
///
/// # Safety
///
/// As [`split_wide_steps`]; the CPU has AVX.
#[target_feature(enable = "avx")]
unsafe fn split_wide_f32<const K: usize>(dst: *mut u8, plane: isize, src: *const u8, n: usize, s: usize) -> usize {
    let pixels = |i: usize| {
        prefetch_planes::<K>(dst, plane, i * 4);
        // SAFETY: as in `split_wide_steps`; AVX (the caller's contract).
        unsafe {
            let x: [_; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.add((i + j) * s * 4).cast()));
            // Pixel pairs, channels (0, 1 | 4, 5) and (2, 3 | 6, 7).
            let t: [_; 8] = std::array::from_fn(|j| {
                let (p, q) = (x[j / 2 * 2], x[j / 2 * 2 + 1]);
                if j % 2 == 0 {
                    _mm256_unpacklo_ps(p, q)
                } else {
                    _mm256_unpackhi_ps(p, q)
                }
            });
            // Channel `c | c + 4` of pixels 0–3 (`u[c]`) and 4–7 (`u[c + 4]`).
            let u: [_; 8] = std::array::from_fn(|j| {
                let (h, c) = (j / 4, j % 4);
                let (p, q) = (t[4 * h + c / 2], t[4 * h + 2 + c / 2]);
                if c % 2 == 0 {
                    _mm256_shuffle_ps::<0x44>(p, q)
                } else {
                    _mm256_shuffle_ps::<0xEE>(p, q)
                }
            });
            for c in 0..K {
                let out = if c < 4 {
                    _mm256_permute2f128_ps::<0x20>(u[c], u[c + 4])
                } else {
                    _mm256_permute2f128_ps::<0x31>(u[c - 4], u[c])
                };
                _mm256_storeu_ps(dst.offset(c as isize * plane).add(i * 4).cast(), out);
            }
        }
    };
    in_steps::<false>(n, wide_step(4), pixels)
}

/// [`split_wide_steps`] for 8-byte elements: four pixels a step, an AVX 4 × 4
/// transpose of each pixel's channels 0–3 and, where `K > 4`, of 4–7.
///
/// # Safety
///
/// As [`split_wide_steps`], with the `n` pixels readable for `4·⌈K / 4⌉`
/// elements each; the CPU has AVX.
#[target_feature(enable = "avx")]
unsafe fn split_wide_f64<const K: usize>(dst: *mut u8, plane: isize, src: *const u8, n: usize, s: usize) -> usize {
    let pixels = |i: usize| {
        prefetch_planes::<K>(dst, plane, i * 8);
        for h in 0..K.div_ceil(4) {
            // SAFETY: pixels `i..i + 4` are readable for elements `4·h ..
            // 4·h + 4` (the caller's `n`); the planes' elements `i..i + 4`
            // are writable; AVX (the caller's contract).
            unsafe {
                let x: [_; 4] = std::array::from_fn(|j| _mm256_loadu_pd(src.add(((i + j) * s + 4 * h) * 8).cast()));
                // Pixel pairs, channels (0 | 2) and (1 | 3) of this half.
                let t = [
                    _mm256_unpacklo_pd(x[0], x[1]),
                    _mm256_unpackhi_pd(x[0], x[1]),
                    _mm256_unpacklo_pd(x[2], x[3]),
                    _mm256_unpackhi_pd(x[2], x[3]),
                ];
                for c in 4 * h..K.min(4 * h + 4) {
                    let out = match c % 4 {
                        0 => _mm256_permute2f128_pd::<0x20>(t[0], t[2]),
                        1 => _mm256_permute2f128_pd::<0x20>(t[1], t[3]),
                        2 => _mm256_permute2f128_pd::<0x31>(t[0], t[2]),
                        _ => _mm256_permute2f128_pd::<0x31>(t[1], t[3]),
                    };
                    _mm256_storeu_pd(dst.offset(c as isize * plane).add(i * 8).cast(), out);
                }
            }
        }
    };
    in_steps::<false>(n, wide_step(8), pixels)
}
