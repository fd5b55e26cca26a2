//! AVX-512 transposes whose tile sides are folded from two dims each: a
//! tile's source rows are `a`'s rows of several slices of the batch dim
//! that continues `a`'s destination runs, and its columns `b`'s elements of
//! several slices of the one that continues `b`'s source runs. A permute
//! whose source side is 2–4 elements (pixels, pairs) has no other tile wider
//! than that: 31 × 29 × 27 × 3 f32 permuted 3120 is a 31 × 3 transpose, 783
//! times, but one of 31 rows × 2349 columns folded. Rows and columns are
//! then at offsets that a tile computes for its line of each (16 bytes for
//! bytes), and the micro tiles (of [`avx512`](super::avx512)'s 16-byte
//! chunks for 2- and 4-byte elements, of whole rows for 1- and 8-byte ones)
//! write each column's destination run straight from the source, the last
//! chunk and the last rows masked: no staging, and no element-by-element
//! edges but a last row block of a quarter tile or less. Tiles go along the
//! columns. Destination runs of 512 bytes or more (2-, 4- and 8-byte
//! elements) are written in whole lines instead, each column's tiles joined
//! by a permute ([`lines8`]): a store across two lines costs twice an
//! aligned one. Where no dim folds, the tiles are plain `a` × `b` ones: for
//! 8-byte elements, which the other routes of small copies move in SSE2's
//! 2 × 2 tiles, for 4- and 8-byte ones of large copies that would be staged
//! (in SSE2's tiles too), and for bytes whose columns alone are narrow.

use std::arch::x86_64::{
    __m128i, __m512i, _mm_mask_storeu_epi8, _mm_mask_storeu_epi16, _mm_maskz_loadu_epi8, _mm_maskz_loadu_epi16,
    _mm_unpackhi_epi8, _mm_unpackhi_epi16, _mm_unpacklo_epi8, _mm_unpacklo_epi16, _mm512_castsi128_si512,
    _mm512_inserti32x4, _mm512_mask_storeu_epi8, _mm512_mask_storeu_epi16, _mm512_mask_storeu_epi32,
    _mm512_mask_storeu_epi64, _mm512_maskz_loadu_epi64, _mm512_setzero_si512, _mm512_shuffle_i64x2,
    _mm512_storeu_si512, _mm512_unpackhi_epi16, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64, _mm512_unpacklo_epi16,
    _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
};

use smallvec::{Array, SmallVec};

use super::avx512::{chunk_lines, lanes, permute_wide, shift_indices, unpack_round};
use super::blocks::LINE;
use super::parallel::{Shared, for_each_segment, par_for};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Whether the CPU has these kernels' instructions (AVX-512 F, BW and VL)
/// and the AVX-512 kernels are allowed ([`super::avx512::enabled`]).
#[inline]
pub(super) fn enabled() -> bool {
    super::avx512::enabled() && std::is_x86_feature_detected!("avx512vl")
}

/// One side of a folded tile: index `x < len` at byte offset `(x / n)·outer
/// + (x % n)·inner`.
#[derive(Clone, Copy, Debug)]
struct Side {
    len: usize,
    n: usize,
    inner: isize,
    outer: isize,
}

impl Side {
    /// Dim `d`'s indices (stride `inner`), folded with `fold`'s (`outer`).
    fn new(d: PlanDim, inner: isize, fold: Option<(PlanDim, isize)>) -> Side {
        let (count, outer) = fold.map_or((1, 0), |(f, outer)| (f.len, outer));
        Side {
            len: d.len * count,
            n: d.len,
            inner,
            outer,
        }
    }

    /// Index `x` as (outer, inner) indices.
    fn at(self, x: usize) -> (usize, usize) {
        (x / self.n, x % self.n)
    }

    /// The offsets of indices `x .. x + K`, where `x < len` is `(q, r)`;
    /// past `len`, the last one again.
    #[inline(always)]
    fn offsets<const K: usize>(self, x: usize, (mut q, mut r): (usize, usize)) -> [isize; K] {
        let mut at = q as isize * self.outer + r as isize * self.inner;
        let mut out = [0; K];
        for (k, o) in out.iter_mut().enumerate() {
            *o = at;
            if x + k + 1 < self.len {
                r += 1;
                if r == self.n {
                    (q, r) = (q + 1, 0);
                    at = q as isize * self.outer;
                } else {
                    at += self.inner;
                }
            }
        }
        out
    }

    /// Index `(q, r)` moved on by `step = self.at(K)` (no division a tile).
    #[inline(always)]
    fn advance(self, (q, r): (usize, usize), step: (usize, usize)) -> (usize, usize) {
        let (q, r) = (q + step.0, r + step.1);
        if r >= self.n { (q + 1, r - self.n) } else { (q, r) }
    }

    /// Pushes onto `tiles` the offsets of indices `from .. to`, `K` a tile,
    /// tile by tile (as [`offsets`](Self::offsets): past `len`, the last one
    /// again). It fills a vector in place rather than returning one: a
    /// `SmallVec` returned by a call is moved whole, its inline bytes too (8
    /// KiB here), and an iterator into `extend` was not inlined (600 × 20 f64
    /// transposed 1.11× the time).
    #[inline(always)]
    fn push_tile_offsets<const K: usize, A: Array<Item = [isize; K]>>(
        self,
        tiles: &mut SmallVec<A>,
        from: usize,
        to: usize,
    ) {
        let (step, mut at) = (self.at(K), self.at(from));
        for x in (from..to).step_by(K) {
            tiles.push(self.offsets::<K>(x, at));
            at = self.advance(at, step);
        }
    }
}

/// A transpose over (`a`: unit destination stride, `b`: unit source stride)
/// with its tile sides folded: rows are `a`'s, times the batch dim whose
/// destination stride is an `a` run, their destination `E` bytes apart;
/// columns are `b`'s, times the one whose source stride is a `b` run, their
/// source `E` bytes apart. `batch` holds the other dims.
pub(super) struct Folded {
    rows: Side,
    cols: Side,
    batch: SmallVec<[PlanDim; INLINE_DIMS]>,
}

impl Folded {
    /// The folds of a transpose of `e`-byte elements (1, 2, 4 or 8). A
    /// batch dim that continues the runs of both sides goes to the shorter
    /// side. Where neither side has a fold, the plain `a` × `b` tiles if
    /// `plain`, else `None`.
    pub(super) fn find(a: PlanDim, b: PlanDim, batch: &[PlanDim], e: usize, plain: bool) -> Option<Folded> {
        debug_assert!(a.dst == e as isize && b.src == e as isize);
        if !matches!(e, 1 | 2 | 4 | 8) {
            return None;
        }
        let (ra, rb) = ((a.len * e) as isize, (b.len * e) as isize);
        let kb = batch
            .iter()
            .position(|c| c.src == rb && (c.dst != ra || b.len <= a.len));
        let ka = (0..batch.len()).find(|&k| batch[k].dst == ra && Some(k) != kb);
        if ka.is_none() && kb.is_none() && !plain {
            return None;
        }
        Some(Folded {
            rows: Side::new(a, a.src, ka.map(|k| (batch[k], batch[k].src))),
            cols: Side::new(b, b.dst, kb.map(|k| (batch[k], batch[k].dst))),
            batch: (0..batch.len())
                .filter(|&k| Some(k) != ka && Some(k) != kb)
                .map(|k| batch[k])
                .collect(),
        })
    }

    /// The tile's rows and columns a slice.
    pub(super) fn sides(&self) -> (usize, usize) {
        (self.rows.len, self.cols.len)
    }

    /// Whether the tile's rows are folded (more than `a`'s).
    pub(super) fn rows_folded(&self) -> bool {
        self.rows.len != self.rows.n
    }
}

/// Bytes a task copies, about: tasks are pieces of a slice's outer side.
const PIECE_BYTES: usize = 16 << 10;

/// Columns `0 .. 16 / E` (a 16-byte chunk, masked to `nj`) of `64 / E`
/// rows: column `j`'s elements in `[j]`.
macro_rules! chunk_tile {
    ($name:ident, $e:expr, $lo:ident, $hi:ident) => {
        /// # Safety
        ///
        /// The CPU has AVX-512 F, BW and VL; elements `0 .. nj` of rows `src +
        /// rows[k]` readable for `k < 64 / E` (no other byte is read).
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        #[inline]
        unsafe fn $name(src: *const u8, rows: &[isize; 64 / $e], nj: usize) -> [__m512i; 16 / $e] {
            let bytes = (((1u32 << (nj * $e)) - 1) & 0xFFFF) as u16;
            // SAFETY: `nj` elements of row `k` (the caller's contract), masked.
            let chunk = |k: usize| unsafe { _mm_maskz_loadu_epi8(bytes, src.offset(rows[k]).cast()) };
            chunk_lines!($e, $lo, $hi, chunk)
        }
    };
}

chunk_tile!(chunk2, 2, _mm512_unpacklo_epi16, _mm512_unpackhi_epi16);
chunk_tile!(chunk4, 4, _mm512_unpacklo_epi32, _mm512_unpackhi_epi32);

macro_rules! folded_micro {
    ($micro:ident, $e:expr, $chunk:ident, $store:ident) => {
        /// `nr × nj` elements (`nr, nj ≤ 64 / E`): element `j` of source row
        /// `k` (`src + rows[k] + j·E`) to `dst + cols[j] + k·E`, a 16-byte
        /// chunk of each row at a time.
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F, BW and VL; bytes `0 .. nj·E` of rows `src +
        /// rows[k]` readable for every `k < 64 / E` (masked-off bytes of the
        /// last chunk are not read), elements `0 .. nr` from `dst + cols[j]`
        /// writable for `j < nj` (the others are not written).
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        #[inline]
        unsafe fn $micro(
            dst: *mut u8,
            cols: &[isize; 64 / $e],
            nj: usize,
            src: *const u8,
            rows: &[isize; 64 / $e],
            nr: usize,
        ) {
            const P: usize = 16 / $e;
            let mask = if nr >= 64 / $e { u64::MAX } else { (1u64 << nr) - 1 };
            // Written out for whole tiles, whose constant bounds LLVM unrolls
            // (not a closure: LLVM left such closures out of line).
            macro_rules! chunks {
                ($count:expr, $nj:expr) => {
                    for c in 0..$count {
                        // SAFETY: the columns `P·c ..` below `nj` of each row
                        // (the caller's contract), the loads masked to them.
                        let x = unsafe { $chunk(src.add(16 * c), rows, ($nj - P * c).min(P)) };
                        for (q, v) in x.into_iter().enumerate() {
                            if P * c + q < $nj {
                                // SAFETY: `nr` elements of column `P·c + q < nj`
                                // (the caller's contract), masked.
                                unsafe { $store(dst.offset(cols[P * c + q]).cast(), mask as _, v) };
                            }
                        }
                    }
                };
            }
            if nj == 64 / $e {
                chunks!(4, 64 / $e);
            } else {
                chunks!(nj.div_ceil(P), nj);
            }
        }
    };
}

macro_rules! folded_tiles {
    ($tiles:ident, $e:expr, $micro:ident, $cached:expr) => {
        folded_tiles!($tiles, $e, $micro, 64 / $e, $cached);
    };
    ($tiles:ident, $e:expr, $micro:ident, $n:expr, $cached:expr) => {
        /// Indices `x0 .. x1` of the outer side of one slice (columns where
        /// `cols_outer`, else rows), every index of the other, `N` of each a
        /// tile: the inner side's tiles in turn for each group of the outer
        /// side's, a line of its elements (four tiles of bytes, so that each
        /// of the inner side's lines is read or written whole before the
        /// next: 33 × 35 × 37 × 4 u8 permuted 3201 42.0 → 36.9 µs, 9 × 10 ×
        /// 11 × 12 × 13 u8 14032 54.0 → 50.1, with rounds then not unrolled).
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F, BW and VL; `dst` and `src` a slice of a
        /// [`Folded`] plan with these sides, `x0 < x1` indices of the outer.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn $tiles(dst: *mut u8, src: *const u8, rows: Side, cols: Side, cols_outer: bool, x0: usize, x1: usize) {
            const N: usize = $n;
            const G: usize = 64 / ($e * N);
            let (outer, inner) = if cols_outer { (cols, rows) } else { (rows, cols) };
            let step = inner.at(N);
            // The inner side's offsets, tile by tile: once for every group of
            // the outer side's where there are `CACHED` tiles or fewer, else
            // anew for each group. Kept for 8-byte elements, whose offsets
            // took much of a small tile's time (one thread, µs, best of 21:
            // 29 × 81 f64 transposed 1.55 → 1.26, NumPy 1.27; 17 × 19 × 23 ×
            // 2 f64 permuted 0321 8.52 → 8.07, 8.33; 31 × 29 × 27 × 3 1320
            // 38.6 → 33.8, 33.8); bytes lost (33 × 35 × 37 × 4 u8 3201 1.58×
            // the time, 9 × 10 × 11 × 12 × 13 14032 1.21×). `CACHED > 0`
            // leaves the cache out of the other sizes' code (with it there,
            // 33 × 35 × 37 × 4 u8 3201 took 1.09× the time).
            const CACHED: usize = $cached;
            let cached = CACHED > 0 && inner.len.div_ceil(N) <= CACHED;
            let mut yos: SmallVec<[[isize; N]; CACHED]> = SmallVec::new();
            if cached {
                inner.push_tile_offsets(&mut yos, 0, inner.len);
            }
            for xg in (x0..x1).step_by(N * G) {
                let groups = (x1 - xg).div_ceil(N).min(G);
                let xos: [[isize; N]; G] = std::array::from_fn(|g| {
                    let x = xg + g * N;
                    if g < groups { outer.offsets::<N>(x, outer.at(x)) } else { [0; N] }
                });
                let mut at = (0, 0);
                for (t, y) in (0..inner.len).step_by(N).enumerate() {
                    let computed;
                    let yo: &[isize; N] = if cached {
                        &yos[t]
                    } else {
                        computed = inner.offsets::<N>(y, at);
                        at = inner.advance(at, step);
                        &computed
                    };
                    let ny = (inner.len - y).min(N);
                    for (g, xo) in xos.iter().enumerate().take(groups) {
                        let x = xg + g * N;
                        let nx = (x1 - x).min(N);
                        let ((r, ro, nr), (j, co, nj)) = if cols_outer {
                            ((y, yo, ny), (x, xo, nx))
                        } else {
                            ((x, xo, nx), (y, yo, ny))
                        };
                        // Row `r`'s destination and column `j`'s source in the slice.
                        let (dst, src) = (dst.wrapping_add(r * $e), src.wrapping_add(j * $e));
                        // A last row block of a quarter tile or less (of 17 or 33
                        // rows) element by element: a micro tile costs as much for
                        // one row as for all (Python, µs: 17 × 19 × 23 × 2 f64
                        // permuted 1320 7.9 → 6.7, 2130 7.8 → 7.1, f32 2130 5.7 → 4.4).
                        if nr * 4 <= N {
                            for (k, &row) in ro.iter().enumerate().take(nr) {
                                for (i, &col) in co.iter().enumerate().take(nj) {
                                    // SAFETY: element `(r + k, j + i)` of the slice.
                                    unsafe { std::ptr::copy_nonoverlapping(src.offset(row).add(i * $e), dst.offset(col).add(k * $e), $e) };
                                }
                            }
                            continue;
                        }
                        // SAFETY: rows `r ..` (offsets past the last repeat it) and
                        // columns `j ..` of the slice, elements of the plan.
                        unsafe { $micro(dst, co, nj, src, ro, nr) };
                    }
                }
            }
        }
    };
}

folded_micro!(micro2, 2, chunk2, _mm512_mask_storeu_epi16);
folded_micro!(micro4, 4, chunk4, _mm512_mask_storeu_epi32);

folded_tiles!(tiles1, 1, micro1, 16, 0);
folded_tiles!(tiles2, 2, micro2, 0);
folded_tiles!(tiles2s, 2, micro2s, 8, 0);
folded_tiles!(tiles4, 4, micro4, 0);
folded_tiles!(tiles8, 8, micro8, 64);

/// The edge of a folded tile of `e`-byte elements: a line, but 16 bytes
/// (an SSE register) for bytes, whose sides of a line (64 × 64) are too big
/// for the short sides this route takes (9 × 10 × 11 × 12 × 13 u8 permuted
/// 03142, 11 rows × 156 columns: 49.7 → 110 µs in such tiles).
fn edge(e: usize) -> usize {
    if e == 1 { 16 } else { 64 / e }
}

/// 16 × 16 bytes: a load a row (masked to `nj` bytes), four rounds of byte
/// unpacks, a store a column (masked to `nr`). Each round interleaves
/// register `i` with register `i + 8`, which rotates the bits of (row,
/// byte) by one: after four, row and byte have changed places.
///
/// # Safety
///
/// The CPU has AVX-512 BW and VL; bytes `0 .. nj` of rows `src + rows[k]`
/// readable for `k < 16`, bytes `0 .. nr` from `dst + cols[j]` writable for
/// `j < nj` (no other byte is touched).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn micro1(dst: *mut u8, cols: &[isize; 16], nj: usize, src: *const u8, rows: &[isize; 16], nr: usize) {
    let load_mask = ((1u32 << nj) - 1) as u16;
    let store_mask = ((1u32 << nr) - 1) as u16;
    // SAFETY: the caller's contract: `nj` bytes of each row, `nr` of each
    // column (masked-off bytes are not accessed).
    unsafe {
        let x: [__m128i; 16] = std::array::from_fn(|k| _mm_maskz_loadu_epi8(load_mask, src.offset(rows[k]).cast()));
        // Written out, not `from_fn` and not a loop over rounds, which LLVM
        // kept on the stack.
        #[inline(always)]
        fn round(x: [__m128i; 16]) -> [__m128i; 16] {
            macro_rules! pairs {
                ($($k:literal)*) => {
                    // SAFETY: SSE2, which every x86-64 CPU has.
                    unsafe { [$(_mm_unpacklo_epi8(x[$k], x[$k + 8]), _mm_unpackhi_epi8(x[$k], x[$k + 8])),*] }
                };
            }
            pairs!(0 1 2 3 4 5 6 7)
        }
        let x = round(round(round(round(x))));
        // Constant bounds, so that `x` stays in registers.
        for (j, (&col, v)) in cols.iter().zip(x).enumerate() {
            if j < nj {
                _mm_mask_storeu_epi8(dst.offset(col).cast(), store_mask, v);
            }
        }
    }
}

/// 8 × 8 2-byte elements, as [`micro1`]'s bytes: a load a row (masked to
/// `nj` elements), three rounds of 16-bit unpacks (register `i` with `i +
/// 4`, which rotates the bits of (row, element) by one), a store a column
/// (masked to `nr`).
///
/// # Safety
///
/// The CPU has AVX-512 BW and VL; elements `0 .. nj` of rows `src +
/// rows[k]` readable for `k < 8`, elements `0 .. nr` from `dst + cols[j]`
/// writable for `j < nj` (no other byte is touched).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn micro2s(dst: *mut u8, cols: &[isize; 8], nj: usize, src: *const u8, rows: &[isize; 8], nr: usize) {
    let load_mask = ((1u16 << nj) - 1) as u8;
    let store_mask = ((1u16 << nr) - 1) as u8;
    // SAFETY: the caller's contract: `nj` elements of each row, `nr` of each
    // column (masked-off elements are not accessed).
    unsafe {
        let x: [__m128i; 8] = std::array::from_fn(|k| _mm_maskz_loadu_epi16(load_mask, src.offset(rows[k]).cast()));
        #[inline(always)]
        fn round(x: [__m128i; 8]) -> [__m128i; 8] {
            macro_rules! pairs {
                ($($k:literal)*) => {
                    // SAFETY: SSE2, which every x86-64 CPU has.
                    unsafe { [$(_mm_unpacklo_epi16(x[$k], x[$k + 4]), _mm_unpackhi_epi16(x[$k], x[$k + 4])),*] }
                };
            }
            pairs!(0 1 2 3)
        }
        let x = round(round(round(x)));
        for (j, (&col, v)) in cols.iter().zip(x).enumerate() {
            if j < nj {
                _mm_mask_storeu_epi16(dst.offset(col).cast(), store_mask, v);
            }
        }
    }
}

/// 8 × 8 8-byte elements, as [`micro4`]'s tiles but from whole rows: a
/// load a row (masked to `nj` elements), three shuffle rounds (pairs of
/// rows, then 128-bit lanes twice): column `j`'s elements of the 8 rows in
/// `[j]`. The chunks of [`micro4`] hold two 8-byte elements each, and their
/// loads and inserts cost more than these rounds (Python, µs: 17 × 19 × 23
/// × 2 f64 permuted 3201 7.0 → 5.8, 3210 6.8 → 5.7).
///
/// # Safety
///
/// The CPU has AVX-512 F, BW and VL; elements `0 .. nj` of rows `src +
/// rows[k]` readable for `k < 8` (no other byte is read).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn tile8(src: *const u8, rows: &[isize; 8], nj: usize) -> [__m512i; 8] {
    let load_mask = ((1u16 << nj) - 1) as u8;
    // SAFETY: the caller's contract: `nj` elements of each row (masked-off
    // elements are not accessed).
    let r: [__m512i; 8] =
        std::array::from_fn(|k| unsafe { _mm512_maskz_loadu_epi64(load_mask, src.offset(rows[k]).cast()) });
    // Lane `L` of `t[2m]` holds elements `2L` of rows `2m, 2m + 1`; of
    // `t[2m + 1]`, elements `2L + 1`.
    let t: [__m512i; 8] = std::array::from_fn(|k| {
        let (a, b) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Rows 0–3 (`u[0..4]`) and 4–7 (`u[4..8]`): `u[0]` is lanes 0 and 2
    // of `t[0]`, then of `t[2]` (elements 0 and 4 of rows 0–3), `u[1]`
    // lanes 1 and 3 (elements 2 and 6), `u[2]` and `u[3]` the same of
    // `t[1]` and `t[3]` (elements 1 and 5, 3 and 7). Column `j` is then
    // the lanes of `u[g]` and `u[g + 4]` that hold its elements.
    let u: [__m512i; 8] = std::array::from_fn(|k| {
        let base = (k / 4) * 4 + (k / 2) % 2;
        let (a, b) = (t[base], t[base + 2]);
        if k % 2 == 0 {
            _mm512_shuffle_i64x2::<0x88>(a, b)
        } else {
            _mm512_shuffle_i64x2::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|j| {
        let g = [0, 2, 1, 3][j % 4];
        if j < 4 {
            _mm512_shuffle_i64x2::<0x88>(u[g], u[g + 4])
        } else {
            _mm512_shuffle_i64x2::<0xDD>(u[g], u[g + 4])
        }
    })
}

/// A [`tile8`], column `j` stored to `dst + cols[j]` (masked to `nr`).
///
/// # Safety
///
/// As [`tile8`]'s; elements `0 .. nr` from `dst + cols[j]` writable for `j <
/// nj` (no other byte is touched).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn micro8(dst: *mut u8, cols: &[isize; 8], nj: usize, src: *const u8, rows: &[isize; 8], nr: usize) {
    let store_mask = ((1u16 << nr) - 1) as u8;
    // SAFETY: the caller's contract.
    let x = unsafe { tile8(src, rows, nj) };
    for (&col, v) in cols.iter().zip(x).take(nj) {
        // SAFETY: `nr` elements of column `j` (the caller's contract), masked.
        unsafe { _mm512_mask_storeu_epi64(dst.offset(col).cast(), store_mask, v) };
    }
}

/// Destination runs at least this long (bytes) are written in whole lines
/// by the `lines` walks: they add a permute a store and two masked stores
/// a run, which a run of a few lines does not win back (as split512's
/// planes: its `ALIGNED_PLANES_MIN`). Half that for 8-byte elements, whose
/// tiles take more shuffles a store. Python, µs, 512 → 256: 46 × 323 f64
/// transposed (368-byte runs) 8.1 → 6.4, 33 × 323 6.6 → 5.6, but 100 × 100
/// × 3 f32 permuted 210 (400-byte runs) 8.6–10.2 → 10.5–11.1; 256 → 128
/// for 8-byte elements: 17 × 323 f64 3.2 → 4.2.
fn line_runs_min(e: usize) -> usize {
    if e == 8 { 256 } else { 512 }
}

macro_rules! folded_lines {
    ($name:ident, $e:expr, $cols:expr, $tile:ident) => {
        /// The folded tiles' walk for rows `r0 .. r1` and columns `c0 .. c1`
        /// (every column's destination run written from its row `r0` on),
        /// storing whole lines: a 64-byte store across two lines takes about
        /// twice an aligned one's time, and where the runs' length is not a
        /// multiple of a line, a tile's columns are runs at several
        /// alignments (323 × 46 f64 transposed: 2584-byte runs, 8
        /// alignments). `$cols` columns at a time (a tile's, or a 16-byte
        /// chunk's) go down every row; each keeps its last tile's vector and
        /// joins it with the next one's (a two-register permute) into the
        /// line that ends inside the next. Its elements before its first
        /// line and after its last are masked stores.
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F, BW and VL; `dst` and `src` a slice of a
        /// [`Folded`] plan with these sides, `r0 < r1` and `c0 < c1` indices
        /// of them; `dst` and the columns' destination offsets multiples of
        /// the element size.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn $name(dst: *mut u8, src: *const u8, rows: Side, cols: Side, (r0, r1): (usize, usize), (c0, c1): (usize, usize)) {
            const E: usize = $e;
            const R: usize = 64 / E;
            const C: usize = $cols;
            // Every tile's row offsets (the last row's again up to a whole
            // tile), once for all columns; on the stack up to 1024 rows, made
            // empty and filled in place (a `with_capacity` returned here
            // copied 8 KiB of uninitialised inline bytes on every call, a
            // tenth of a 32² f64 transpose).
            let mut offsets: SmallVec<[[isize; R]; 1024 / R]> = SmallVec::new();
            rows.push_tile_offsets(&mut offsets, r0, r1);
            // The run's bytes.
            let len = (r1 - r0) * E;
            for c in (c0..c1).step_by(C) {
                let nj = (c1 - c).min(C);
                let co = cols.offsets::<C>(c, cols.at(c));
                let (dst, src) = (dst.wrapping_add(r0 * E), src.wrapping_add(c * E));
                // Column `j`'s run, its bytes before its first line, and the
                // permute that joins two of its vectors into a line.
                let run: [*mut u8; C] = std::array::from_fn(|j| dst.wrapping_offset(co[j]));
                let head: [usize; C] = std::array::from_fn(|j| (run[j] as usize).wrapping_neg() % LINE);
                let join = shift_indices::<E, C>(head.map(|h| h / E));
                // SAFETY: bytes `at ..` of run `j` below `len` (the caller's
                // contract), masked; whole where that is a line.
                let put = |j: usize, at: usize, v: __m512i| unsafe {
                    let p = run[j].add(at);
                    if at + 64 <= len { _mm512_storeu_si512(p.cast(), v) } else { _mm512_mask_storeu_epi8(p.cast(), lanes(at, len), v) }
                };
                let mut y = 0;
                if head.iter().take(nj).all(|&h| h == 0) {
                    // Every run starts on a line (a transpose of a multiple of
                    // a line into an output of its own): each tile's vector is
                    // a line of its run as it is, no permute to join two.
                    // Python, one thread, one process, best of 31 (µs), f64
                    // transposed: 32² 0.73 → 0.58 (NumPy 0.62), 32 × 81 1.31 →
                    // 1.19 (1.34).
                    for ro in &offsets {
                        // SAFETY: rows `r0 + y / E ..` (offsets past the last
                        // repeat it) and columns `c ..` of the slice.
                        let next = unsafe { $tile(src, ro, nj) };
                        for (j, &v) in next.iter().enumerate().take(nj) {
                            put(j, y, v);
                        }
                        y += 64;
                    }
                    continue;
                }
                let mut last = [_mm512_setzero_si512(); C];
                for ro in &offsets {
                    // SAFETY: rows `r0 + y / E ..` (offsets past the last repeat
                    // it) and columns `c ..` of the slice.
                    let next = unsafe { $tile(src, ro, nj) };
                    for j in 0..C {
                        if j >= nj {
                            continue;
                        }
                        if y == 0 {
                            // SAFETY: the run's bytes before its first line
                            // (and before `len`), masked.
                            unsafe { _mm512_mask_storeu_epi8(run[j].cast(), lanes(0, head[j].min(len)), next[j]) };
                        } else {
                            // SAFETY: the CPU has AVX-512 F and BW (the caller's contract).
                            put(j, y - 64 + head[j], unsafe { permute_wide::<E>(last[j], join[j], next[j]) });
                        }
                    }
                    last = next;
                    y += 64;
                }
                // The lines that end past the last tile.
                for j in 0..nj {
                    if y - 64 + head[j] < len {
                        // SAFETY: as above.
                        put(j, y - 64 + head[j], unsafe { permute_wide::<E>(last[j], join[j], last[j]) });
                    }
                }
            }
        }
    };
}

folded_lines!(lines2, 2, 8, chunk2);
folded_lines!(lines4, 4, 4, chunk4);
folded_lines!(lines8, 8, 8, tile8);

/// The folded transpose of `e`-byte elements: each slice of `f.batch` in
/// pieces of columns, split across threads.
///
/// # Safety
///
/// As [`execute`](super::execute) for the plan `f` was found in, with the
/// `e` it was found for; [`enabled`].
pub(super) unsafe fn transpose(f: &Folded, dst: *mut u8, src: *const u8, e: usize, bytes: usize) {
    let (rows, cols) = (f.rows, f.cols);
    // 2-byte elements with a side of half a tile or less in 8 × 8 tiles of
    // SSE registers ([`micro2s`]): a line's tiles load and unpack 32 rows
    // whatever the side. Python, one thread, µs, 32 → 8 (NumPy): 5 × 7 × 9
    // × 11 × 2 u16 permuted 03142 (9 × 22) 4.89 → 3.75 (4.45), 14032 4.93 →
    // 3.76 (4.73); 9 × 10 × 11 × 12 × 13 14032 (132 × 13) 45.0 → 39.2; but
    // sides of 17 or more lost up to 2.4× the time.
    let short = e == 2 && rows.len.min(cols.len) <= 16;
    let n = if short { 8 } else { edge(e) };
    // Along the columns: each tile reads a line or two of each of its rows,
    // the next tile along them the rest. Python, µs, along the longer side →
    // along the columns: 31 × 29 × 27 × 3 f32 permuted 3210 (899 rows × 81
    // columns) 24.1 → 10.3, 3201 22.6 → 9.9, 33 × 35 × 37 × 4 u16 1203 34.7
    // → 16.0; 17 × 19 × 23 × 2 f64 3201 and 3210 (323 × 46) 0.95–1.05×.
    // Rows outer only where the columns are one tile (the same walk), so
    // that tasks can split the rows.
    let cols_outer = cols.len > n;
    let (outer, inner) = if cols_outer { (cols, rows) } else { (rows, cols) };
    let piece = (PIECE_BYTES / (inner.len * e)).next_multiple_of(LINE / e).max(LINE / e);
    let per_slice = outer.len.div_ceil(piece);
    let slices: usize = f.batch.iter().map(|d| d.len).product();
    // Whole lines where the runs are long and every element is aligned.
    let lines = e >= 2 && rows.len * e >= line_runs_min(e) && ((cols.inner | cols.outer) as usize).is_multiple_of(e);
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, bytes, |t0, t1| {
        for_each_segment(&f.batch, per_slice, t0, t1, |dof, so, first, count| {
            let (x0, x1) = (first * piece, ((first + count) * piece).min(outer.len));
            let (dst, src) = (d.get().wrapping_offset(dof), s.get().wrapping_offset(so));
            // SAFETY: a slice of the plan, indices `x0..x1` of its outer side;
            // the CPU has the instructions (the caller's contract); for the
            // `lines` walks, `dst` and the columns' offsets (`lines`) multiples
            // of the element size.
            unsafe {
                if lines && (dst as usize).is_multiple_of(e) {
                    let (r, c) = if cols_outer {
                        ((0, rows.len), (x0, x1))
                    } else {
                        ((x0, x1), (0, cols.len))
                    };
                    match e {
                        2 => lines2(dst, src, rows, cols, r, c),
                        4 => lines4(dst, src, rows, cols, r, c),
                        _ => lines8(dst, src, rows, cols, r, c),
                    }
                    return;
                }
                match e {
                    1 => tiles1(dst, src, rows, cols, cols_outer, x0, x1),
                    2 if short => tiles2s(dst, src, rows, cols, cols_outer, x0, x1),
                    2 => tiles2(dst, src, rows, cols, cols_outer, x0, x1),
                    4 => tiles4(dst, src, rows, cols, cols_outer, x0, x1),
                    _ => tiles8(dst, src, rows, cols, cols_outer, x0, x1),
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permute of `[n][fa][a][fb][b]` (source order, contiguous) to
    /// `[n][b][fb][fa][a]`, `e`-byte elements, against the definition:
    /// partial tiles on both sides, both walking orders, one slice and
    /// several, on the calling thread and across the pool; nothing written
    /// past the destination, nothing read past the source.
    #[test]
    fn folded_permutes_match_the_definition() {
        if !enabled() {
            println!("SKIP: the CPU has no AVX-512 F, BW and VL");
            return;
        }
        // (a, b, fa, fb, n): rows a·fa, columns b·fb.
        let cases = [
            (31, 3, 1, 50, 1),  // columns outer, rows 16 + 15
            (19, 2, 17, 23, 1), // rows outer (323 × 46)
            (5, 2, 7, 11, 3),   // rows under a tile
            (3, 4, 1, 1, 2),    // no fold: `find` says None, or plain tiles
            (17, 3, 1, 1, 1),   // no fold
            (33, 21, 1, 1, 2),  // no fold, columns outer
            (9, 70, 1, 1, 1),   // no fold, a last row block of one row
            (7, 2, 1, 70, 2),   // one row block of 7
            (40, 1, 1, 9, 1),   // a one-element source side
            (17, 2, 1, 23, 2),  // a last row block of one row (4- and 8-byte elements)
            (65, 2, 1, 9, 1),   // rows outer, a last row block of one row
            (323, 46, 1, 1, 1), // runs in whole lines (8-byte), columns outer, 8 alignments
            (71, 5, 3, 1, 2),   // runs in whole lines (folded rows), rows outer
            (64, 13, 1, 1, 1),  // runs of one alignment, 8 elements a line
            (66, 9, 1, 1, 1),   // runs in whole lines, a last tile of 2 rows
            (1700, 5, 1, 1, 1), // runs in whole lines, rows outer in several pieces
            (600, 20, 1, 1, 1), // columns outer, more row tiles than tiles8 keeps offsets of
            (11, 2, 1, 7, 3),   // 2-byte elements' short tiles, 8 + 3 rows, 14 folded columns
            (2, 5, 1, 3, 1),    // the dim that continues both sides folds the shorter rows
        ];
        for e in [1usize, 2, 4, 8] {
            for &(a, b, fa, fb, n) in &cases {
                let elems = n * fa * a * fb * b;
                let src: Vec<u8> = (0..elems * e).map(|k| (k * 7 + k / 251) as u8).collect();
                let sz = |x: usize| (x * e) as isize;
                // Source strides of [n][fa][a][fb][b], destination ones of [n][b][fb][fa][a].
                let dim = |len, src, dst| PlanDim { len, src, dst };
                let da = dim(a, sz(fb * b), sz(1));
                let db = dim(b, sz(1), sz(fb * fa * a));
                let mut batch: SmallVec<[PlanDim; INLINE_DIMS]> = SmallVec::new();
                if fa > 1 {
                    batch.push(dim(fa, sz(a * fb * b), sz(a)));
                }
                if fb > 1 {
                    batch.push(dim(fb, sz(b), sz(fa * a)));
                }
                if n > 1 {
                    batch.push(dim(n, sz(fa * a * fb * b), sz(b * fb * fa * a)));
                }
                let plain = fa == 1 && fb == 1;
                assert_eq!(
                    Folded::find(da, db, &batch, e, false).is_none(),
                    plain,
                    "e {e}, {a} {b} {fa} {fb}: a fold found where there is none, or none where there is one"
                );
                let f = Folded::find(da, db, &batch, e, true).expect("plain tiles where there is no fold");
                // The rows fold with `fa`; without it, `fb`'s dim continues
                // both sides' runs and goes to the shorter side.
                assert_eq!(f.rows_folded(), fa > 1 || fb > 1 && b > a, "e {e}, {a} {b} {fa} {fb}");
                // Destinations at a line, an element past one, 40 bytes past
                // one, and one byte past one (off the elements' alignment).
                for (bytes, off) in [
                    (elems * e, 0),
                    (4 << 20, 0),
                    (elems * e, e),
                    (4 << 20, 40),
                    (elems * e, 1),
                ] {
                    let mut buf = vec![0xA5u8; elems * e + 192];
                    let lead = buf.as_ptr().align_offset(LINE) + off;
                    let dst = &mut buf[lead..];
                    // SAFETY: the CPU has the instructions; both buffers hold the plan.
                    unsafe { transpose(&f, dst.as_mut_ptr(), src.as_ptr(), e, bytes) };
                    for (k, (((ni, fi), ai), (fj, bj))) in (0..n)
                        .flat_map(|ni| (0..fa).map(move |fi| (ni, fi)))
                        .flat_map(|x| (0..a).map(move |ai| (x, ai)))
                        .flat_map(|x| (0..fb).flat_map(move |fj| (0..b).map(move |bj| (x, (fj, bj)))))
                        .enumerate()
                    {
                        let at = (((ni * b + bj) * fb + fj) * fa + fi) * a + ai;
                        assert_eq!(
                            dst[at * e..][..e],
                            src[k * e..][..e],
                            "e {e}, {a} {b} {fa} {fb} {n}: element ({ni} {fi} {ai} {fj} {bj})"
                        );
                    }
                    assert!(
                        dst[elems * e..].iter().all(|&x| x == 0xA5),
                        "e {e}, offset {off}: wrote past"
                    );
                    assert!(
                        buf[..lead].iter().all(|&x| x == 0xA5),
                        "e {e}, offset {off}: wrote before"
                    );
                }
            }
        }
    }
}
