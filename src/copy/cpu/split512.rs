//! Interleaved channels to planes with AVX-512 VBMI two-register permutes:
//! the transposes whose source rows are 2 to 8 elements of 1, 2, 4 or 8
//! bytes (pixels of `s` channels, `n` of them, to `s` planes of `n`), and
//! the gather of every 2nd to 8th element into a contiguous row (one such
//! plane alone). Each step writes 64 bytes of every plane from the
//! `64·s` source bytes they come from, and masked loads and stores take a
//! row's ends, so rows of any length are whole vectors; long planes are
//! written in whole lines (see [`ALIGNED_PLANES_MIN`]). These rows are often
//! short (a permuted 31 × 29 × 27 × 2 tensor is 899 slices of 27 pixels of
//! two channels), where element-by-element tails and per-row calls cost
//! more than the copy: NumPy and torch copy them one element at a time, at
//! about a cycle each.

use std::arch::x86_64::{
    __m512i, _mm512_loadu_si512, _mm512_mask_blend_epi8, _mm512_mask_blend_epi16, _mm512_mask_blend_epi32,
    _mm512_mask_blend_epi64, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8, _mm512_permutex2var_epi8,
    _mm512_setzero_si512, _mm512_storeu_si512,
};

use smallvec::SmallVec;

use super::avx512::{lanes, permute_wide, shift_indices};
use super::parallel::{PIXELS_A_TASK, Shared, for_each_segment, par_for};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Whether the CPU has these kernels' instructions (AVX-512 F, BW and VBMI)
/// and the AVX-512 kernels are allowed ([`super::avx512::enabled`]).
#[inline]
pub(super) fn enabled() -> bool {
    super::avx512::enabled() && std::is_x86_feature_detected!("avx512vbmi")
}

/// Pixels of at most this many channels: a step's `64·s` source bytes are
/// four register pairs at most, each output vector up to four permutes
/// and three blends. From 5 channels on, the tiles that took them before
/// lost to NumPy's element loop (one thread, µs, both builds in one
/// process, tiles → split, NumPy): 40 × 30 × 6 u8 permuted 021 10.5 → 2.4
/// (4.6), f32 4.0 → 1.9 (3.2); 100 × 20 × 7 u8 021 12.6 → 3.6 (5.9); 64 ×
/// 64 × 5 u16 021 9.6 → 2.2 (10.6); 1000 × 5 f64 transposed 2.8 → 1.6
/// (2.1); 100 × 100 × 8 f64 021 58.0 → 28.7 (37.1).
const MAX_PIXEL: usize = 8;

/// Whether a transpose over (`a`: unit destination stride, `b`: unit source
/// stride) of `e`-byte elements is one of [`split`]'s: `b` of 2 to
/// [`MAX_PIXEL`] elements, `a` stepping pixels of `b.len` to [`MAX_PIXEL`]
/// elements (channels, all or the first of them: `x[..., :3]` of RGBA).
/// One thread, µs, x[:, :5].T of 1000 × 8, the tiles → these (NumPy): u8
/// 2.08 → 0.81 (1.95), u16 1.88 → 1.27 (1.95), f64 2.38 → 1.76 (3.26).
pub(super) fn splits(a: PlanDim, b: PlanDim, e: usize) -> bool {
    matches!(e, 1 | 2 | 4 | 8)
        && (2..=MAX_PIXEL).contains(&b.len)
        && b.src == e as isize
        && a.src % e as isize == 0
        && (b.len as isize..=MAX_PIXEL as isize).contains(&(a.src / e as isize))
}

/// A step's permute for channel `c` of pixels of `s` elements of `e` bytes:
/// element `j` of the 64 bytes written comes from element `p = j·s + c` of
/// the `64·s` bytes read; `index` holds `p` modulo `128 / e` (the
/// two-register permute's range) as element `j` of an `e`-byte-element
/// vector, and bit `j` of `pair[q]` says `p` is in register pair `q`
/// (registers `2q` and `2q + 1`, `p / (128 / e) = q`). Element-wide
/// permutes (`vpermt2q`, `vpermt2d`: one µop) where `e` allows, rather than
/// `vpermt2b` (three).
#[derive(Clone, Copy)]
struct Step {
    index: [u8; 64],
    pair: [u64; MAX_PIXEL / 2],
}

const fn step(e: usize, s: usize, c: usize) -> Step {
    let mut index = [0u8; 64];
    let mut pair = [0u64; MAX_PIXEL / 2];
    let per_pair = 128 / e;
    let mut j = 0;
    while j < 64 / e {
        let p = j * s + c;
        // Little-endian: the element's low byte; the index is under 128.
        index[j * e] = (p % per_pair) as u8;
        pair[p / per_pair] |= 1 << j;
        j += 1;
    }
    Step { index, pair }
}

/// `STEPS[log2 e][s - 2][c]`, channels `c < s`.
static STEPS: [[[Step; MAX_PIXEL]; MAX_PIXEL - 1]; 4] = {
    let mut t = [[[Step {
        index: [0; 64],
        pair: [0; MAX_PIXEL / 2],
    }; MAX_PIXEL]; MAX_PIXEL - 1]; 4];
    let mut k = 0;
    while k < 4 {
        let mut s = 2;
        while s <= MAX_PIXEL {
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

/// Elements of `(lo, hi)` picked by `index` (`E`-byte elements).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn permute<const E: usize>(lo: __m512i, index: __m512i, hi: __m512i) -> __m512i {
    if E == 1 {
        _mm512_permutex2var_epi8(lo, index, hi)
    } else {
        // SAFETY: the CPU has AVX-512 F and BW (this function's features).
        unsafe { permute_wide::<E>(lo, index, hi) }
    }
}

/// `b`'s elements where `mask`'s bit is set, `a`'s elsewhere.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
fn blend<const E: usize>(mask: u64, a: __m512i, b: __m512i) -> __m512i {
    match E {
        1 => _mm512_mask_blend_epi8(mask, a, b),
        2 => _mm512_mask_blend_epi16(mask as u32, a, b),
        4 => _mm512_mask_blend_epi32(mask as u16, a, b),
        _ => _mm512_mask_blend_epi64(mask as u8, a, b),
    }
}

/// Planes of this many bytes or more are written in whole lines: a 64-byte
/// store across two lines took twice an aligned one's time (16 × 447 × 2
/// f64 permuted 021, 7.2 µs, against 3.5 for 16 × 448 × 2). Shorter ones
/// are written from their start, as their head and tail steps would
/// outnumber their whole ones.
const ALIGNED_PLANES_MIN: usize = 512;

/// Channels `c < channels` (1 or `s`) of `n` pixels of `s` elements of `e`
/// bytes from `src` to planes `dst + c·plane` (`n` elements each).
///
/// # Safety
///
/// [`enabled`]; `e` 1, 2, 4 or 8, `s` 2 to [`MAX_PIXEL`], `channels` 1 to
/// `s`; bytes `0 .. n·e` of each plane writable, bytes `0 .. (n − 1)·s·e +
/// channels·e` of `src` readable. No other byte is touched: the last
/// pieces' loads and stores are masked (masked-off bytes are not accessed
/// and do not fault).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn split_n(dst: *mut u8, plane: isize, src: *const u8, n: usize, e: usize, s: usize, channels: usize) {
    debug_assert!(matches!(e, 1 | 2 | 4 | 8) && (2..=MAX_PIXEL).contains(&s) && (1..=s).contains(&channels));
    // One instance a shape: the loop's loads, permutes and stores are then
    // straight-line code (a general loop spent about a cycle an element on
    // its branches and masks, as much as NumPy's element loop). Pixels whose
    // first channels only are copied take all channels' instance, storing
    // those.
    macro_rules! pick {
        ($($e:literal, $s:literal);*) => {
            match (e, s, channels == 1) {
                $(
                    // SAFETY: the caller's contract, for these constants.
                    ($e, $s, true) => unsafe { split_k::<$e, $s, 1>(dst, plane, src, n, 1) },
                    // SAFETY: as above.
                    ($e, $s, false) => unsafe { split_k::<$e, $s, $s>(dst, plane, src, n, channels) },
                )*
                _ => unreachable!("split_n: {e}-byte elements, {s} a pixel"),
            }
        };
    }
    pick!(
        1, 2; 1, 3; 1, 4; 1, 5; 1, 6; 1, 7; 1, 8;
        2, 2; 2, 3; 2, 4; 2, 5; 2, 6; 2, 7; 2, 8;
        4, 2; 4, 3; 4, 4; 4, 5; 4, 6; 4, 7; 4, 8;
        8, 2; 8, 3; 8, 4; 8, 5; 8, 6; 8, 7; 8, 8
    )
}

/// The permuted vectors of channels `0 .. C` for one step: the 64 bytes of
/// each plane from the `64·S` source bytes that `load(r)` returns 64 at a
/// time.
///
/// # Safety
///
/// The CPU has AVX-512 VBMI.
#[inline(always)]
unsafe fn permuted<const E: usize, const S: usize, const C: usize>(
    steps: &[Step; MAX_PIXEL],
    index: &[__m512i; C],
    load: impl Fn(usize) -> __m512i,
) -> [__m512i; C] {
    // SAFETY: the CPU has AVX-512 VBMI (the caller's contract).
    unsafe {
        // The `S` source registers, the last again after it where `S` is odd
        // (its pair's upper half, which no element is picked from).
        let mut r = [_mm512_setzero_si512(); MAX_PIXEL];
        for (k, v) in r.iter_mut().enumerate().take(S) {
            *v = load(k);
        }
        if S % 2 == 1 {
            r[S] = r[S - 1];
        }
        let mut out = [_mm512_setzero_si512(); C];
        for (c, v) in out.iter_mut().enumerate() {
            *v = permute::<E>(r[0], index[c], r[1]);
            for q in 1..S.div_ceil(2) {
                *v = blend::<E>(steps[c].pair[q], *v, permute::<E>(r[2 * q], index[c], r[2 * q + 1]));
            }
        }
        out
    }
}

/// One call of [`split_k`]: `n` pixels from `src` (`read` bytes readable)
/// to planes `dst + c·plane` of `out` bytes for channels `c < channels`,
/// with the permutes' tables.
/// (Methods rather than closures: LLVM left closures that return vectors
/// out of line, their vectors passed through the stack.)
struct Planes<'a, const E: usize, const S: usize, const C: usize> {
    steps: &'a [Step; MAX_PIXEL],
    index: [__m512i; C],
    src: *const u8,
    read: usize,
    dst: *mut u8,
    plane: isize,
    out: usize,
    channels: usize,
}

impl<const E: usize, const S: usize, const C: usize> Planes<'_, E, S, C> {
    /// Whether the step at plane byte `o` is whole: its every source byte
    /// below `read` and its every plane byte below `out`.
    #[inline(always)]
    fn whole(&self, o: usize) -> bool {
        o + 64 <= self.out && (o + 64) * S <= self.read
    }

    /// The vectors of the step at plane byte `o` (`o` a multiple of `E`):
    /// whole loads if `whole` ([`Planes::whole`]), masked ones otherwise.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 VBMI; `whole` only where [`Planes::whole`].
    #[inline(always)]
    unsafe fn step(&self, o: usize, whole: bool) -> [__m512i; C] {
        let base = o * S;
        // SAFETY: whole loads read bytes below `read` (the caller's
        // contract); masked ones only the bytes of their mask, below `read`.
        unsafe {
            permuted::<E, S, C>(self.steps, &self.index, |r| {
                let at = self.src.wrapping_add(base + 64 * r);
                if whole {
                    _mm512_loadu_si512(at.cast())
                } else {
                    _mm512_maskz_loadu_epi8(lanes(base + 64 * r, self.read), at.cast())
                }
            })
        }
    }

    /// Byte `o` of plane `c`.
    #[inline(always)]
    fn at(&self, c: usize, o: usize) -> *mut u8 {
        self.dst.wrapping_offset(c as isize * self.plane).wrapping_add(o)
    }

    /// Stores `v` to bytes `o .. end` of plane `c` (a whole store where
    /// that is 64 bytes), where `c` is one of the channels copied.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 BW; `end ≤ out`.
    #[inline(always)]
    unsafe fn store(&self, c: usize, o: usize, end: usize, v: __m512i) {
        if c >= self.channels {
            return;
        }
        // SAFETY: bytes `o .. end` of the plane, below `out`; a masked store
        // writes no other.
        unsafe {
            if o + 64 == end {
                _mm512_storeu_si512(self.at(c, o).cast(), v)
            } else {
                _mm512_mask_storeu_epi8(self.at(c, o).cast(), lanes(o, end), v)
            }
        }
    }
}

/// [`split_n`] for `E`-byte elements, `S` a pixel, channels `0 .. C` of
/// which `0 .. channels` are stored.
///
/// # Safety
///
/// As [`split_n`], `channels ≤ C`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn split_k<const E: usize, const S: usize, const C: usize>(
    dst: *mut u8,
    plane: isize,
    src: *const u8,
    n: usize,
    channels: usize,
) {
    if n == 0 {
        return;
    }
    let steps = &STEPS[E.trailing_zeros() as usize][S - 2];
    let p = Planes::<E, S, C> {
        steps,
        // SAFETY: each table is 64 plain bytes.
        index: std::array::from_fn(|c| unsafe { std::mem::transmute(steps[c].index) }),
        src,
        read: (n - 1) * S * E + channels * E,
        dst,
        plane,
        out: n * E,
        channels,
    };
    let out = p.out;
    // (Steps start at whole elements and joins shift by them: planes off
    // their elements' alignment are written from their start, their stores
    // across lines.)
    let aligned = out >= ALIGNED_PLANES_MIN && (dst as usize).is_multiple_of(E) && plane % E as isize == 0;
    // SAFETY: every step and store below: the CPU has the instructions (the
    // caller's contract); whole steps only where `whole`; stores end at
    // `out` or before.
    unsafe {
        if !aligned || C == 1 || plane % 64 == 0 {
            // One alignment: long planes start with a masked step up to their
            // next line, so that every store after it is a whole line.
            let mut o = if aligned {
                p.at(0, 0).align_offset(64).min(out)
            } else {
                0
            };
            if o > 0 {
                let v = p.step(0, false);
                (0..C).for_each(|c| p.store(c, 0, o, v[c]));
            }
            while p.whole(o) {
                let v = p.step(o, true);
                (0..C).for_each(|c| p.store(c, o, o + 64, v[c]));
                o += 64;
            }
            while o < out {
                let v = p.step(o, false);
                (0..C).for_each(|c| p.store(c, o, out, v[c]));
                o += 64;
            }
            return;
        }
        // Long planes of several alignments: the steps go as above, and each
        // plane's bytes before its first line are stored alone; after that each
        // step's vector is joined with the previous one's (a permute) into the
        // line that ends `r[c]` bytes into it, so that every store is a line.
        let r: [usize; C] = std::array::from_fn(|c| p.at(c, 0).align_offset(64).min(out));
        let shift = shift_indices::<E, C>(r.map(|r| r / E));
        let mut prev = p.step(0, p.whole(0));
        for c in 0..C {
            p.store(c, 0, r[c], prev[c]);
        }
        let mut o = 64;
        // A macro, not a closure: LLVM left the closure out of line, its
        // vectors passed through the stack (a quarter of 100 × 100 × 8 f64
        // permuted 021's time).
        macro_rules! join {
            ($whole:expr) => {
                let v = p.step(o, $whole);
                for c in 0..C {
                    let at = o - 64 + r[c];
                    p.store(c, at, (at + 64).min(out), permute::<E>(prev[c], shift[c], v[c]));
                }
                prev = v;
                o += 64;
            };
        }
        while p.whole(o) {
            join!(true);
        }
        while o < out {
            join!(false);
        }
        // The bytes after each plane's last line.
        let last = o - 64;
        for c in 0..C {
            if last + r[c] < out {
                let line = permute::<E>(prev[c], shift[c], _mm512_setzero_si512());
                p.store(c, last + r[c], out, line);
            }
        }
    }
}

/// `dst[i] = src[i·s]` for `i < n`, elements of `e` bytes (1, 2, 4 or 8),
/// `s` of 2 to [`MAX_PIXEL`]: channel 0 of `n` pixels of `s` elements.
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
/// over `batch`: the first `b.len` channels of each slice's `a.len` pixels
/// (`a.src / e` elements each) to `b.len` planes `b.dst` bytes apart, in
/// pieces split across threads.
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
    let pitch = a.src as usize / e;
    let per_slice = a.len.div_ceil(PIXELS_A_TASK);
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, bytes, |t0, t1| {
        for_each_segment(batch, per_slice, t0, t1, |dof, so, first, n| {
            let p0 = first * PIXELS_A_TASK;
            let p1 = ((first + n) * PIXELS_A_TASK).min(a.len);
            // SAFETY: channels `0 .. b.len` of pixels `p0..p1` of this slice
            // are elements of the plan, read up to the last one's; the CPU
            // has the instructions (the caller's contract).
            unsafe {
                split_n(
                    d.get().offset(dof).add(p0 * e),
                    b.dst,
                    s.get().offset(so).add(p0 * pitch * e),
                    p1 - p0,
                    e,
                    pitch,
                    b.len,
                )
            };
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element size and pixel size, every count of a pixel's first
    /// channels, 1 to 70 pixels (last pieces of every length) and up to a
    /// thousand (whole steps, lines of planes of one alignment and of
    /// several), planes at four offsets from a line (one off the elements'
    /// alignment), against the definition; nothing past each plane written,
    /// and the source ends at the last byte read, where a read past it would
    /// show under a checker (valgrind).
    #[test]
    fn splits_every_channel_count() {
        if !enabled() {
            println!("SKIP: the CPU has no AVX-512 VBMI");
            return;
        }
        for e in [1usize, 2, 4, 8] {
            for s in 2..=MAX_PIXEL {
                for channels in 1..=s {
                    for (n, at) in (1..=70)
                        .chain([127, 128, 129, 200, 257, 512, 520, 700, 1029])
                        .flat_map(|n| [(n, 0), (n, e), (n, 40), (n, 1)])
                    {
                        let src: Vec<u8> = (0..(n - 1) * s * e + channels * e)
                            .map(|k| (k * 7 + k / 251) as u8)
                            .collect();
                        // Planes `at` bytes past a line, `n·e + 64` apart: of
                        // several alignments where `n·e` is not a multiple of 64.
                        let plane = n * e + 64;
                        let mut buf = vec![0xA5u8; channels * plane + 128];
                        let first = buf.as_ptr().align_offset(64) + at;
                        let dst = &mut buf[first..][..channels * plane];
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
                        assert!(
                            buf[..first].iter().all(|&x| x == 0xA5),
                            "e {e}, s {s}, n {n}: wrote before"
                        );
                    }
                }
            }
        }
    }
}
