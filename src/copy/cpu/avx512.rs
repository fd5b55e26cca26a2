//! AVX-512 transposes whose every store is one whole, streamed cache line:
//! micro tiles of `64 / E` rows × `64 / E` elements (64 × 64 bytes, 32 × 32
//! 2-byte elements, 16 × 16 4-byte ones, 8 × 8 8-byte ones; 64 rows × 16
//! 3-byte pixels, three lines a destination row, where it has VBMI too), used
//! by large streamed transposes with line-aligned destination rows where the
//! CPU has AVX-512 (F and BW, detected at run time), and of 4- and 8-byte
//! elements into rows that are not ([`sheared_tiles`]). The AVX2 kernels write half a
//! line a store, so a line completes only when a second store reaches it;
//! streamed that way, the CPU's few write-combining buffers flush lines in
//! pieces, and those kernels go through an L1 staging tile instead (a second
//! load and store of every byte), or pair two micro tiles' halves of each
//! line ([`super::avx2::line_tiles`]). A whole-line store leaves nothing open:
//! tiles go straight from the source to memory. Also the whole-line copy of
//! streamed runs ([`stream_lines`]) and the row copies of row tiles in cache
//! ([`copy_runs`]).

use std::arch::x86_64::{
    __m512i, _mm_loadu_si128, _mm256_loadu_si256, _mm256_storeu_si256, _mm512_add_epi8, _mm512_add_epi16,
    _mm512_add_epi32, _mm512_add_epi64, _mm512_broadcast_i32x4, _mm512_castsi128_si512, _mm512_inserti32x4,
    _mm512_loadu_si512, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8, _mm512_permutex2var_epi8,
    _mm512_permutex2var_epi16, _mm512_permutex2var_epi32, _mm512_permutex2var_epi64, _mm512_set_epi8, _mm512_set_epi16,
    _mm512_set_epi32, _mm512_set_epi64, _mm512_set1_epi8, _mm512_set1_epi16, _mm512_set1_epi32, _mm512_set1_epi64,
    _mm512_setzero_si512, _mm512_shuffle_epi8, _mm512_store_si512, _mm512_storeu_si512, _mm512_stream_si512,
    _mm512_unpackhi_epi8, _mm512_unpackhi_epi16, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64, _mm512_unpacklo_epi8,
    _mm512_unpacklo_epi16, _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
};
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::{LINE, rows_crowd_l1_sets};

/// 0: not yet decided, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Whether the AVX-512 kernels run: the AVX2 ones do ([`super::avx2::enabled`]),
/// the CPU has AVX-512 F and BW, and neither `DEVTENSOR_DISABLE_AVX512` nor
/// [`set_allowed`] has turned them off.
#[inline(always)]
pub(super) fn enabled() -> bool {
    let own = match STATE.load(Ordering::Relaxed) {
        0 => {
            let off = std::env::var_os("DEVTENSOR_DISABLE_AVX512").is_some_and(|v| v != "0");
            let on = !off && detected();
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    };
    own && super::avx2::enabled()
}

fn detected() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
}

/// Allows the AVX-512 kernels (where the CPU has them and the AVX2 ones are
/// allowed) or forbids them (tests, comparisons).
pub(super) fn set_allowed(allowed: bool) {
    let on = allowed && detected();
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// The bytes of a 64-byte vector `at` bytes into a range of `len`.
#[inline(always)]
pub(super) fn lanes(at: usize, len: usize) -> u64 {
    match len.saturating_sub(at) {
        0 => 0,
        v if v >= 64 => !0,
        v => (1u64 << v) - 1,
    }
}

/// Elements of `(lo, hi)` picked by `index`, for `E`-byte elements of 2, 4
/// or 8 bytes (one µop for 4 and 8). Always inlined, as `unpack_round`: it
/// runs in the hot loops of its callers, which carry the target features.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW.
#[inline(always)]
pub(super) unsafe fn permute_wide<const E: usize>(lo: __m512i, index: __m512i, hi: __m512i) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        match E {
            2 => _mm512_permutex2var_epi16(lo, index, hi),
            4 => _mm512_permutex2var_epi32(lo, index, hi),
            _ => _mm512_permutex2var_epi64(lo, index, hi),
        }
    }
}

/// For each `k[c]`, the index of a two-register permute that shifts by
/// `k[c]` elements (`E` bytes of 1, 2, 4 or 8, `k[c] < 64 / E`): result
/// element `j` is element `j + k[c]` of `(lo, hi)`. An add to the elements'
/// indices each: built byte by byte in a loop (LLVM made it 64 byte inserts
/// a vector), the tables took a third of a folded 32² f64 transpose's lines
/// walk. Safe to call from functions with AVX-512 F and BW enabled, which
/// inline it.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) fn shift_indices<const E: usize, const C: usize>(k: [usize; C]) -> [__m512i; C] {
    let mut out = [_mm512_setzero_si512(); C];
    // Plain loops, not closures, which were left out of line in target-feature
    // functions.
    match E {
        1 => {
            let iota = _mm512_set_epi8(
                63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38,
                37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
            );
            for (v, k) in out.iter_mut().zip(k) {
                *v = _mm512_add_epi8(iota, _mm512_set1_epi8(k as i8));
            }
        }
        2 => {
            let iota = _mm512_set_epi16(
                31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5,
                4, 3, 2, 1, 0,
            );
            for (v, k) in out.iter_mut().zip(k) {
                *v = _mm512_add_epi16(iota, _mm512_set1_epi16(k as i16));
            }
        }
        4 => {
            let iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            for (v, k) in out.iter_mut().zip(k) {
                *v = _mm512_add_epi32(iota, _mm512_set1_epi32(k as i32));
            }
        }
        _ => {
            let iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
            for (v, k) in out.iter_mut().zip(k) {
                *v = _mm512_add_epi64(iota, _mm512_set1_epi64(k as i64));
            }
        }
    }
    out
}

/// One round of the perfect-shuffle network: `t[2k] = lo(x[k], x[k + P/2])`,
/// `t[2k + 1] = hi(…)`, for `P` of 2, 4, 8 or 16.
///
/// Written out for each `P`, not a loop nor `array::from_fn`: whether LLVM
/// unrolled those into registers changed with unrelated code elsewhere in
/// the crate, and rolled (16 registers kept on the stack, a branch an
/// element) they ran 8192² u8 transposes at 34 % of memcpy instead of 58 %.
#[inline(always)]
pub(super) fn unpack_round<const P: usize>(
    x: [__m512i; P],
    lo: impl Fn(__m512i, __m512i) -> __m512i,
    hi: impl Fn(__m512i, __m512i) -> __m512i,
) -> [__m512i; P] {
    let v: &[__m512i] = &x;
    macro_rules! round {
        ($half:literal; $($k:literal)*) => {
            [$(lo(v[$k], v[$k + $half]), hi(v[$k], v[$k + $half])),*]
        };
    }
    let mut t = x;
    let out: &mut [__m512i] = &mut t;
    match P {
        16 => out.copy_from_slice(&round!(8; 0 1 2 3 4 5 6 7)),
        8 => out.copy_from_slice(&round!(4; 0 1 2 3)),
        4 => out.copy_from_slice(&round!(2; 0 1)),
        2 => out.copy_from_slice(&round!(1; 0)),
        _ => unreachable!("rounds of 2, 4, 8 or 16 registers"),
    }
    t
}

/// Elements of `$e` bytes: each 128-bit lane of a register holds `P = 16 /
/// E` elements of one source row, lane `L` of register `k` from row `P·L +
/// k`, so that an in-lane `P × P` transpose (the perfect-shuffle network of
/// `log2 P` unpack rounds) leaves in register `q` a whole destination line:
/// column `q` of the lane's rows, lane after lane. A source line takes four
/// such groups (its four 16-byte chunks). Loading lanes from four rows costs
/// three inserts a register, which can run on a port the 512-bit shuffles
/// do not use, where a whole-line load per row would need two more shuffle
/// rounds across lanes (a C prototype, 4096² f32: as fast from line-aligned
/// rows, 1.07× from a 4112-wide matrix).
///
/// `chunk_lines!(e, lo, hi, chunk)` is that group for the chunk whose 16
/// bytes of source row `k` (`k < 4·P`) `chunk(k)` loads: for chunk `c`, the
/// `P` lines of destination rows `P·c .. P·c + P` (a macro, not a function
/// taking the unpacks: LLVM then kept the rounds' registers on the stack or
/// stopped inlining the unpacks). Unsafe as `chunk` is.
macro_rules! chunk_lines {
    ($e:expr, $lo:ident, $hi:ident, $chunk:expr) => {{
        const P: usize = 16 / $e;
        let chunk = $chunk;
        let mut x = [_mm512_setzero_si512(); P];
        for (k, v) in x.iter_mut().enumerate() {
            let mut r = _mm512_castsi128_si512(chunk(k));
            r = _mm512_inserti32x4::<1>(r, chunk(P + k));
            r = _mm512_inserti32x4::<2>(r, chunk(2 * P + k));
            *v = _mm512_inserti32x4::<3>(r, chunk(3 * P + k));
        }
        // One call a round, not a loop over rounds: LLVM kept the 16
        // registers of a byte tile on the stack in that loop.
        if P >= 2 {
            x = unpack_round(x, |a, b| $lo(a, b), |a, b| $hi(a, b));
        }
        if P >= 4 {
            x = unpack_round(x, |a, b| $lo(a, b), |a, b| $hi(a, b));
        }
        if P >= 8 {
            x = unpack_round(x, |a, b| $lo(a, b), |a, b| $hi(a, b));
        }
        if P >= 16 {
            x = unpack_round(x, |a, b| $lo(a, b), |a, b| $hi(a, b));
        }
        x
    }};
}
pub(super) use chunk_lines;

macro_rules! line_micro {
    ($(#[$doc:meta])* $name:ident, $e:expr, $lo:ident, $hi:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F and BW; rows `src + k·sa` readable for 64
        /// bytes and `dst + q·db` writable for 64 bytes and 64-byte aligned,
        /// `k, q < 64 / E`.
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        unsafe fn $name(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
            const P: usize = 16 / $e;
            for c in 0..4 {
                // SAFETY: the caller's contract: bytes 16·c .. 16·c + 16 of rows
                // k < 4·P, and destination rows P·c + q < 4·P.
                unsafe {
                    let chunk = |row: usize| _mm_loadu_si128(src.offset(row as isize * sa).add(16 * c).cast());
                    let x = chunk_lines!($e, $lo, $hi, chunk);
                    for (q, v) in x.iter().enumerate() {
                        _mm512_stream_si512(dst.offset((P * c + q) as isize * db).cast(), *v);
                    }
                }
            }
        }
    };
}

line_micro!(
    /// 64 × 64 bytes.
    micro1, 1, _mm512_unpacklo_epi8, _mm512_unpackhi_epi8
);
line_micro!(
    /// 32 × 32 2-byte elements.
    micro2, 2, _mm512_unpacklo_epi16, _mm512_unpackhi_epi16
);
line_micro!(
    /// 16 × 16 4-byte elements.
    micro4, 4, _mm512_unpacklo_epi32, _mm512_unpackhi_epi32
);
line_micro!(
    /// 8 × 8 8-byte elements.
    micro8, 8, _mm512_unpacklo_epi64, _mm512_unpackhi_epi64
);

/// Bytes `12·c .. 12·c + 12` of a row (four 3-byte pixels) in a 16-byte
/// load, as [`micro3`] makes it: from byte `12·c`, or, for the last four
/// (`c == 3`), from byte 32, which keeps the load inside the row's 48.
const fn pixel_load_at(c: usize) -> usize {
    if c == 3 { 32 } else { 12 * c }
}

/// The byte shuffle that spreads the four pixels of a [`pixel_load_at`]
/// load into four 4-byte slots (the fourth byte zero).
const fn pixel_spread(c: usize) -> [i8; 16] {
    let skip = 12 * c - pixel_load_at(c);
    let mut m = [-1i8; 16];
    let mut k = 0;
    while k < 12 {
        m[k / 3 * 4 + k % 3] = (skip + k) as i8;
        k += 1;
    }
    m
}

/// The two-register byte permute that packs 4-byte pixel slots back into 3
/// bytes: line `n` (bytes `64·n .. 64·n + 64` of 64 pixels) from the slots
/// of groups `n` (pixels `16·n ..`, first operand) and `n + 1` (second).
const fn pixel_pack(n: usize) -> [u8; 64] {
    let mut m = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        let at = 64 * n + b;
        let (pixel, byte) = (at / 3, at % 3);
        let slot = (pixel % 16 * 4 + byte) as u8;
        m[b] = if pixel / 16 == n { slot } else { 64 + slot };
        b += 1;
    }
    m
}

const PIXEL_SPREAD: [[i8; 16]; 4] = [pixel_spread(0), pixel_spread(1), pixel_spread(2), pixel_spread(3)];
const PIXEL_PACK: [[u8; 64]; 3] = [pixel_pack(0), pixel_pack(1), pixel_pack(2)];

/// 64 × 16 3-byte pixels (RGB): 64 source rows of 16 pixels to 16
/// destination rows of 64 pixels, three whole lines each. Four pixels of a
/// row are spread into 4-byte slots by a byte shuffle, transposed as 4-byte
/// elements are (four lanes of 16 source rows a register, two unpack
/// rounds), and four such groups along the destination row are packed into
/// its three lines by two-register byte permutes (VBMI).
///
/// # Safety
///
/// The CPU has AVX-512 F, BW and VBMI; rows `src + k·sa` readable for 48
/// bytes, `k < 64`; `dst + q·db` writable for 192 bytes and 64-byte
/// aligned, `q < 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn micro3(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
    // SAFETY: the caller's contract: every load is 16 bytes within a row's 48
    // (`pixel_load_at`), every store one of a destination row's three lines;
    // the tables are plain bytes.
    unsafe {
        let pack: [__m512i; 3] = std::array::from_fn(|n| _mm512_loadu_si512(PIXEL_PACK[n].as_ptr().cast()));
        for (c, spread) in PIXEL_SPREAD.iter().enumerate() {
            let spread = _mm512_broadcast_i32x4(_mm_loadu_si128(spread.as_ptr().cast()));
            let at = pixel_load_at(c);
            // Group g: source rows 16·g .. 16·g + 16 as 4-byte slots; after the
            // rounds, register q holds destination row 4·c + q's pixels 16·g ..
            let mut group = [[_mm512_setzero_si512(); 4]; 4];
            for (g, x) in group.iter_mut().enumerate() {
                let rows = src.offset((16 * g) as isize * sa);
                let chunk = |row: usize| _mm_loadu_si128(rows.offset(row as isize * sa).add(at).cast());
                for (k, v) in x.iter_mut().enumerate() {
                    let mut r = _mm512_castsi128_si512(chunk(k));
                    r = _mm512_inserti32x4::<1>(r, chunk(4 + k));
                    r = _mm512_inserti32x4::<2>(r, chunk(8 + k));
                    r = _mm512_inserti32x4::<3>(r, chunk(12 + k));
                    *v = _mm512_shuffle_epi8(r, spread);
                }
                *x = unpack_round(
                    *x,
                    |a, b| _mm512_unpacklo_epi32(a, b),
                    |a, b| _mm512_unpackhi_epi32(a, b),
                );
                *x = unpack_round(
                    *x,
                    |a, b| _mm512_unpacklo_epi32(a, b),
                    |a, b| _mm512_unpackhi_epi32(a, b),
                );
            }
            for q in 0..4 {
                let row = dst.offset((4 * c + q) as isize * db);
                for (n, (p, pair)) in pack.iter().zip(group.windows(2)).enumerate() {
                    let line = _mm512_permutex2var_epi8(pair[0][q], *p, pair[1][q]);
                    _mm512_stream_si512(row.add(n * LINE).cast(), line);
                }
            }
        }
    }
}

/// Destination rows that do not start on a line (4097 × 4095 f32: each row
/// 4 bytes further from its line than the one before) still get whole,
/// streamed lines: the line of row `q` that starts `s_q` elements into the
/// tile joins the end of one micro tile's line for that row to the start of
/// the next one's (a two-register permute whose indices `s_q .. s_q + M`
/// are the row's own), so each row takes its lines from the micro tiles in
/// turn, one micro tile behind. `M = 64 / E` rows of the destination a
/// call, `lines` lines each, from source rows `0 .. M·(lines + 1)`.
macro_rules! sheared_micro {
    ($(#[$doc:meta])* $name:ident, $e:expr, $lo:ident, $hi:ident, $permute:ident, $add:ident, $set1:ident, $iota:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F and BW; rows `src + k·sa` readable for 64
        /// bytes, `k < M·(lines + 1)`; destination row `q < M` writable at
        /// `dst + q·db` for `M·lines + M` elements and `E`-aligned.
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        unsafe fn $name(dst: *mut u8, src: *const u8, lines: usize, sa: isize, db: isize) {
            const P: usize = 16 / $e;
            const M: usize = 64 / $e;
            // SAFETY: the caller's contract: destination rows q < M from their
            // first line on (s_q < M elements in), source rows k < M·(lines + 1).
            unsafe {
                let iota = $iota;
                let mut row = [dst; M];
                let mut index = [_mm512_setzero_si512(); M];
                for (q, (r, i)) in row.iter_mut().zip(&mut index).enumerate() {
                    let at = dst.offset(q as isize * db);
                    let s = (LINE - at as usize % LINE) % LINE / $e;
                    *r = at.add(s * $e);
                    *i = $add(iota, $set1(s as _));
                }
                let mut prev = [_mm512_setzero_si512(); M];
                for c in 0..4 {
                    let chunk = |row: usize| _mm_loadu_si128(src.offset(row as isize * sa).add(16 * c).cast());
                    let x = chunk_lines!($e, $lo, $hi, chunk);
                    prev[P * c..P * c + P].copy_from_slice(&x);
                }
                for k in 0..lines {
                    let src = src.offset(((k + 1) * M) as isize * sa);
                    for c in 0..4 {
                        let chunk = |row: usize| _mm_loadu_si128(src.offset(row as isize * sa).add(16 * c).cast());
                        let x = chunk_lines!($e, $lo, $hi, chunk);
                        for (q, v) in x.iter().enumerate() {
                            let r = P * c + q;
                            let line = $permute(prev[r], index[r], *v);
                            _mm512_stream_si512(row[r].add(k * LINE).cast(), line);
                            prev[r] = *v;
                        }
                    }
                }
            }
        }
    };
}

sheared_micro!(
    /// 16 rows of 4-byte elements.
    sheared4, 4, _mm512_unpacklo_epi32, _mm512_unpackhi_epi32, _mm512_permutex2var_epi32, _mm512_add_epi32, _mm512_set1_epi32,
    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
);
sheared_micro!(
    /// 8 rows of 8-byte elements.
    sheared8, 8, _mm512_unpacklo_epi64, _mm512_unpackhi_epi64, _mm512_permutex2var_epi64, _mm512_add_epi64, _mm512_set1_epi64,
    _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0)
);

/// Whether `e`-byte elements have a kernel here: every power of two up to 8.
/// Bytes too, since each round is its own call ([`unpack_round`]): in a loop
/// over rounds, LLVM kept the byte tile's 16 registers on the stack, and
/// the byte route ran at 0.62–1.02× the prefetched one's speed. Unrolled,
/// `devtensor bench` against 62a227f, six alternated runs (% of memcpy):
/// 8192² u8 51–53 → 56–62, from an 8256-wide matrix 62–64 → 71–73; in
/// Python from NumPy arrays, against `DEVTENSOR_DISABLE_AVX512=1` (the
/// median of three processes each, GB/s): 8192² 28.2 → 31.0, 8192 × 4096 from 8256-wide rows 33.0 → 36.6, 16 × 4096 × 1024
/// 30.7 → 36.9, 64⁴ 3021 19.9 → 30.3; 4096², 32⁵ 03142 alike (byte copies
/// from half the streaming size have since left this route for AVX2's and
/// the prefetched one: see `bytes_off_avx512` in `transpose`). And 3-byte
/// pixels where the CPU has VBMI ([`micro3`]): `devtensor bench`, 4096 × 2048
/// RGB, against the AVX2 kernel's prefetched route, two alternated runs (%
/// of memcpy): 61–63 → 70–71.
pub(super) fn has_kernel(e: usize) -> bool {
    matches!(e, 1 | 2 | 4 | 8) || e == 3 && std::is_x86_feature_detected!("avx512vbmi")
}

/// The micro tile of `e`-byte elements as (source rows, source elements a
/// row): `64 / e` square, but 64 × 16 for 3-byte pixels ([`micro3`]).
pub(super) fn micro_dims(e: usize) -> (usize, usize) {
    if e == 3 { (64, 16) } else { (LINE / e, LINE / e) }
}

/// `dst[i·e + j·db] = src[i·sa + j·e]` for `i < fi`, `j < fj` (multiples of
/// the micro tile's sides, [`micro_dims`]) with streaming stores, a column of micro tiles after another
/// (`j` outer): the tile's source rows are read along, one line each a step,
/// which the hardware prefetchers follow, while each destination row
/// receives `fi·e` contiguous bytes a step. `each` runs before each micro
/// tile (the route's prefetches of its next tile). Pixels from rows that
/// crowd L1 sets are read from an L1 copy ([`copied_line_tiles`]).
///
/// # Safety
///
/// The CPU has AVX-512 F and BW ([`enabled`]); [`has_kernel`]`(e)`; every
/// address formed is an element of its operand; `dst` and `db` are
/// multiples of a line.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn line_tiles(
    e: usize,
    dst: *mut u8,
    src: *const u8,
    fi: usize,
    fj: usize,
    sa: isize,
    db: isize,
    mut each: impl FnMut(),
) {
    debug_assert!((dst as usize).is_multiple_of(LINE) && db % LINE as isize == 0);
    let (mi, mj) = micro_dims(e);
    let micro = match e {
        1 => micro1,
        2 => micro2,
        3 => micro3,
        4 => micro4,
        _ => micro8,
    };
    if e == 3 && rows_crowd_l1_sets(sa, mi) {
        // SAFETY: forwarded; `has_kernel(3)` (the caller's contract) means
        // the CPU has VBMI.
        return unsafe { copied_line_tiles(dst, src, fi, fj, sa, db, each) };
    }
    let mut j = 0;
    while j < fj {
        let mut i = 0;
        while i < fi {
            each();
            // SAFETY: micro tile (i, j) lies inside the block (the caller's
            // contract); its destination rows start on lines.
            unsafe {
                micro(
                    dst.add(i * e).offset(j as isize * db),
                    src.offset(i as isize * sa).add(j * e),
                    sa,
                    db,
                )
            };
            i += mi;
        }
        j += mj;
    }
}

/// Micro tiles whose source rows crowd L1 sets ([`rows_crowd_l1_sets`]), read
/// from an L1 copy: for each block of four micro tiles along the rows (or
/// what is left of the row), the block's bytes of each of its source rows are
/// copied, whole lines at a time, into a buffer whose rows spread over the
/// sets; its micro tiles then read the buffer. Each micro tile loads its rows
/// 16 bytes at a time, a pass over all of them for each 16 bytes; from rows
/// a multiple of 2 KiB apart (64 rows in one or two sets) every pass found
/// its lines evicted by the last. Taken by 3-byte pixels (`line_tiles`).
/// Emerald Rapids VM (48 KiB 12-way L1D), two threads, Python, from NumPy
/// arrays into a reused output, in-process A/B, best of 8 alternated calls,
/// speed-up: RGB images (height × width) transposed, 4096 × 2048 (rows 6
/// KiB apart) 1.22–1.44×, 2048 × 4096 1.21–1.43×, 8192 × 4096 1.06–1.10×;
/// rows that do not crowd keep the kernel's own reads (copied, 4096 × 2048
/// from 2064- and 2049-pixel rows and 2048 × 4096 from 4112-pixel ones ran
/// 0.81–0.91×). `devtensor bench`'s 4096 × 2048 RGB, alternated runs: 59.5
/// and 62.3 % of memcpy → 85.0 and 84.2 %. Not other elements (their
/// crowded rows lost: f32 4096² 0.64×, 2048 × 8192 0.68×, f64 2048 × 4096
/// 0.91×; u8 4096² 0.82×; u8 8192² and f16 4096² moved onto this route
/// 0.76× and 0.66×).
///
/// # Safety
///
/// As [`line_tiles`]'s for 3-byte pixels (the CPU has VBMI too).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn copied_line_tiles(
    dst: *mut u8,
    src: *const u8,
    fi: usize,
    fj: usize,
    sa: isize,
    db: isize,
    mut each: impl FnMut(),
) {
    let e = 3;
    /// 64 rows of four micro tiles' 16 pixels: three lines each.
    #[repr(C, align(64))]
    struct Copy([[u8; 3 * LINE]; 64]);
    let (mi, mj) = micro_dims(e);
    // Not zeroed (12 KiB of stores a call): the micro tiles read only bytes
    // the same block copied in.
    let mut copy = std::mem::MaybeUninit::<Copy>::uninit();
    let buf = copy.as_mut_ptr().cast::<u8>();
    // The buffer's rows: four micro tiles' bytes (192) apart, which spreads
    // them over the sets.
    let stride = 4 * mj * e;
    debug_assert_eq!(stride, size_of::<[u8; 3 * LINE]>());
    let mut j = 0;
    while j < fj {
        let w = (4 * mj).min(fj - j);
        let bytes = w * e;
        let mut i = 0;
        while i < fi {
            // SAFETY: source rows i .. i + mi, elements j .. j + w, lie in the
            // block (the caller's contract), and the masked loads read no
            // byte past them; each buffer row holds `stride ≥ bytes` bytes
            // from a line (`stride` is three lines). The micro tiles read
            // the buffer as [`micro3`]'s contract asks: `mi` rows, `stride`
            // bytes apart, 48 bytes each from `m · e` (at most `bytes - 48`)
            // on, all written by this block's copy.
            unsafe {
                let rows = src.offset(i as isize * sa).add(j * e);
                for r in 0..mi {
                    let (from, to) = (rows.offset(r as isize * sa), buf.add(r * stride));
                    for at in (0..bytes).step_by(LINE) {
                        let line = _mm512_maskz_loadu_epi8(lanes(at, bytes), from.add(at).cast());
                        _mm512_store_si512(to.add(at).cast(), line);
                    }
                }
                for m in (0..w).step_by(mj) {
                    each();
                    micro3(
                        dst.add(i * e).offset((j + m) as isize * db),
                        buf.add(m * e),
                        stride as isize,
                        db,
                    );
                }
            }
            i += mi;
        }
        j += w;
    }
}

/// Whether `e`-byte elements have a kernel for destination rows that do not
/// start on a line ([`sheared_tiles`]): 4 and 8 bytes. A 2-byte one (32
/// rows a micro tile, bands of 64 to 128 rows) measured 0.90–0.94× the
/// prefetched route on 4097 × 4095 f16 (1.19× on 3000 × 5001).
pub(super) fn has_sheared_kernel(e: usize) -> bool {
    matches!(e, 4 | 8)
}

/// [`line_tiles`] for destination rows that need not start on a line:
/// `dst[i·e + j·db] = src[i·sa + j·e]` for `j < fj` (a multiple of `64 / e`)
/// and, in row `j`, the `lines` whole lines from the first line boundary at
/// or after `dst + j·db` (`s_j < 64 / e` elements in: `i` from `s_j` to
/// `s_j + lines · 64 / e`), streamed. Reads source rows below
/// `(lines + 1) · 64 / e`. `each` runs before each micro tile's column.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW ([`enabled`]); [`has_sheared_kernel`]`(e)`;
/// every address formed is an element of its operand; `dst` and `db` are
/// multiples of `e`.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sheared_tiles(
    e: usize,
    dst: *mut u8,
    src: *const u8,
    lines: usize,
    fj: usize,
    sa: isize,
    db: isize,
    mut each: impl FnMut(),
) {
    debug_assert!((dst as usize).is_multiple_of(e) && db % e as isize == 0);
    let m = LINE / e;
    let micro = match e {
        4 => sheared4,
        _ => sheared8,
    };
    for j in (0..fj).step_by(m) {
        each();
        // SAFETY: rows j .. j + m of the destination and columns j .. j + m of
        // the source lie inside the block (the caller's contract).
        unsafe { micro(dst.offset(j as isize * db), src.add(j * e), lines, sa, db) };
    }
}

/// Streams the whole lines of `n` bytes from `dst` (line-aligned) on, one
/// 64-byte load and streaming store a line; returns the bytes copied.
///
/// # Safety
///
/// The CPU has AVX-512 F ([`enabled`]); `dst` is line-aligned; as
/// `ptr::copy_nonoverlapping(src, dst, n)`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn stream_lines(dst: *mut u8, src: *const u8, n: usize) -> usize {
    let mut i = 0;
    while i + LINE <= n {
        // SAFETY: bytes i .. i + 64 of both ranges; `dst + i` is line-aligned.
        unsafe { _mm512_stream_si512(dst.add(i).cast(), _mm512_loadu_si512(src.add(i).cast())) };
        i += LINE;
    }
    i
}

/// Streams `count` runs of `run` bytes (a multiple of a line), `ds` and `ss`
/// bytes apart, one 64-byte load and streaming store a line.
///
/// # Safety
///
/// The CPU has AVX-512 F ([`enabled`]); `dst` and `ds` are multiples of a
/// line; every run as `ptr::copy_nonoverlapping(src + j·ss, dst + j·ds, run)`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn stream_runs(dst: *mut u8, src: *const u8, count: usize, run: usize, ds: isize, ss: isize) {
    let (mut d, mut s) = (dst, src);
    for _ in 0..count {
        // SAFETY: the run's whole lines (the caller's contract).
        unsafe { stream_lines(d, s, run) };
        // Wrapping: past the last run the pointers may leave the operands.
        d = d.wrapping_offset(ds);
        s = s.wrapping_offset(ss);
    }
}

/// Copies `count` runs of `run` bytes, `ds` and `ss` bytes apart, in 64-byte
/// vectors, up to four loaded before any is stored. A run's last partial
/// vector overlaps the one before it (two 32-byte halves in runs of 32 to 63
/// bytes, a masked load and store in shorter ones), half the moves of
/// [`super::avx2::copy_runs`]'s 32-byte ones.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW ([`enabled`]); every run `dst + j·ds`, `src +
/// j·ss` (`j < count`) as `ptr::copy_nonoverlapping(src, dst, run)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn copy_runs(dst: *mut u8, src: *const u8, count: usize, run: usize, ds: isize, ss: isize) {
    let (mut d, mut s) = (dst, src);
    for _ in 0..count {
        // SAFETY: every access lies inside the run's `run` bytes (the caller's
        // contract): blocks end at or before `run`, and where the run has 64
        // bytes or more the rest's vectors start before `at = run - 64`.
        unsafe {
            let mut i = 0;
            while i + 4 * LINE <= run {
                let v = [0, 1, 2, 3].map(|k| _mm512_loadu_si512(s.add(i + k * LINE).cast()));
                for (k, v) in v.into_iter().enumerate() {
                    _mm512_storeu_si512(d.add(i + k * LINE).cast(), v);
                }
                i += 4 * LINE;
            }
            if run < LINE / 2 {
                let m = lanes(0, run);
                _mm512_mask_storeu_epi8(d.cast(), m, _mm512_maskz_loadu_epi8(m, s.cast()));
            } else if run < LINE {
                // Two 32-byte halves, overlapping (masked moves cost more).
                let at = run - LINE / 2;
                let (lo, hi) = (_mm256_loadu_si256(s.cast()), _mm256_loadu_si256(s.add(at).cast()));
                _mm256_storeu_si256(d.cast(), lo);
                _mm256_storeu_si256(d.add(at).cast(), hi);
            } else if i < run {
                // The rest: up to three whole vectors and the overlapping last.
                let at = run - LINE;
                let last = _mm512_loadu_si512(s.add(at).cast());
                while i < at {
                    _mm512_storeu_si512(d.add(i).cast(), _mm512_loadu_si512(s.add(i).cast()));
                    i += LINE;
                }
                _mm512_storeu_si512(d.add(at).cast(), last);
            }
        }
        // Wrapping: past the last run the pointers may leave the operands.
        d = d.wrapping_offset(ds);
        s = s.wrapping_offset(ss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    #[repr(C, align(64))]
    struct Lines([u8; 64 * 64]);

    /// Pixels from rows 4 KiB and 6 KiB apart (every row's lines in one L1
    /// set, or in two) take the L1 copy: a whole block of four micro tiles
    /// and a last one of one, from a line and off it, rows checked pixel by
    /// pixel.
    #[test]
    fn pixels_from_crowded_rows_are_transposed_from_a_copy() {
        if !detected() || !has_kernel(3) {
            println!("SKIP: the CPU has no AVX-512 F, BW and VBMI");
            return;
        }
        let (fi, fj) = (128usize, 80usize);
        let db = fi * 3; // 384 bytes: whole lines
        for sa in [4096usize, 6144] {
            assert!(rows_crowd_l1_sets(sa as isize, 64), "{sa}");
            for off in [0usize, 5] {
                let src: Vec<u8> = (0..off + (fi - 1) * sa + fj * 3)
                    .map(|k| (k * 7 + k / 253) as u8)
                    .collect();
                let mut dst = vec![Lines([0; 64 * 64]); (fj * db).div_ceil(64 * 64)];
                let out = dst.as_mut_ptr().cast::<u8>();
                // SAFETY: the CPU has the kernels' instructions; `fi` rows of
                // `fj` pixels, `sa` bytes apart from `off`, lie in `src`; `dst`
                // holds `fj` rows of `db` bytes from a line.
                unsafe { line_tiles(3, out, src.as_ptr().add(off), fi, fj, sa as isize, db as isize, || {}) };
                // SAFETY: `dst` holds `fj · db` initialized bytes.
                let got = unsafe { std::slice::from_raw_parts(out, fj * db) };
                for i in 0..fi {
                    for j in 0..fj {
                        let s = off + i * sa + j * 3;
                        assert_eq!(
                            got[j * db + i * 3..][..3],
                            src[s..s + 3],
                            "sa = {sa}, off = {off}, ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    /// Each kernel against the definition (3-byte pixels too), from source
    /// rows at odd offsets and strides.
    #[test]
    fn line_micro_tiles_transpose() {
        if !detected() {
            println!("SKIP: the CPU has no AVX-512 F and BW");
            return;
        }
        for e in [1usize, 2, 3, 4, 8] {
            if !has_kernel(e) {
                println!("SKIP: {e}-byte elements: the CPU has no AVX-512 VBMI");
                continue;
            }
            // `mi` source rows of `mj` elements; a destination row is one
            // line (three for pixels).
            let (mi, mj) = micro_dims(e);
            let db = mi * e;
            for (off, sa) in [(0usize, 64isize), (3, 64 + 5), (16, 200)] {
                let src: Vec<u8> = (0..off + mi * sa as usize + 64)
                    .map(|k| (k * 7 + k / 251) as u8)
                    .collect();
                let mut dst = Lines([0; 64 * 64]);
                // SAFETY: the CPU has the kernels' instructions; `mi` rows of
                // `sa` bytes from `off` lie in `src`; `dst` holds `mj` rows of
                // `db` bytes from a line.
                unsafe {
                    line_tiles(
                        e,
                        dst.0.as_mut_ptr(),
                        src.as_ptr().add(off),
                        mi,
                        mj,
                        sa,
                        db as isize,
                        || {},
                    )
                };
                for i in 0..mi {
                    for j in 0..mj {
                        let s = off + i * sa as usize + j * e;
                        assert_eq!(
                            dst.0[j * db + i * e..][..e],
                            src[s..s + e],
                            "e = {e}, sa = {sa}, ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    /// The sheared kernels against the definition: rows at every distance from
    /// a line (rows an element longer than whole lines, from a first row 0,
    /// 1 or 5 elements past one), exactly their whole lines written.
    #[test]
    fn sheared_tiles_write_each_rows_whole_lines() {
        if !detected() {
            println!("SKIP: the CPU has no AVX-512 F and BW");
            return;
        }
        for e in [4usize, 8] {
            for (lines, off, sa) in [(1usize, 0usize, 64usize), (3, 1, 64 * 3 + 2 * e), (2, 5, 200)] {
                // SAFETY: the CPU has the kernels' instructions; `check_sheared`
                // hands the kernel buffers that hold what it reads and writes.
                super::super::avx2::tests::check_sheared(e, lines, off, sa, |d, s, l, fj, sa, db| unsafe {
                    sheared_tiles(e, d, s, l, fj, sa, db, || {})
                });
            }
        }
    }
}
