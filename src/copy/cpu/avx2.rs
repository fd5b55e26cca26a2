//! AVX2 register transposes for 1-, 2-, 4- and 8-byte elements (32×32,
//! 16×16, 8×8, 4×4 blocks of 32-byte rows), used when the CPU has AVX2 (detected at run
//! time; the x86-64 baseline is SSE2), and whole-line tiles of 1-, 2- and
//! 4-byte elements for streamed transposes ([`line_tiles`], and
//! [`sheared_tiles`] into rows that do not start on a line). Twice the bytes per instruction of the
//! SSE2 kernels: a large transpose is bound by instructions as much as by
//! memory on two cores (4096² f32, one run: 16×16 SSE2 blocks 27 GB/s, AVX2
//! 53 GB/s, streaming memcpy 79 GB/s).

use std::arch::x86_64::{
    __m256i, _mm_loadu_si128, _mm_storel_epi64, _mm_storeu_si128, _mm256_broadcastsi128_si256, _mm256_castsi128_si256,
    _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_inserti128_si256, _mm256_loadu_si256, _mm256_or_si256,
    _mm256_permute2x128_si256, _mm256_permute4x64_epi64, _mm256_setr_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_storeu_si256, _mm256_stream_si256, _mm256_unpackhi_epi8, _mm256_unpackhi_epi16, _mm256_unpackhi_epi32,
    _mm256_unpackhi_epi64, _mm256_unpacklo_epi8, _mm256_unpacklo_epi16, _mm256_unpacklo_epi32, _mm256_unpacklo_epi64,
};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::{self, Kernel};
use super::runs::{Cache, prefetch};

/// 0: not yet decided, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Whether the AVX2 kernels run: the CPU has AVX2, and neither
/// `DEVTENSOR_DISABLE_AVX2` nor [`set_allowed`] has turned them off.
#[inline(always)]
pub(super) fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            // DEVTENSOR_DISABLE_AVX2 (any value but "0") forbids them from the start,
            // as NumPy's NPY_DISABLE_CPU_FEATURES does its own.
            let off = std::env::var_os("DEVTENSOR_DISABLE_AVX2").is_some_and(|v| v != "0");
            let on = !off && std::is_x86_feature_detected!("avx2");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// Allows the AVX2 kernels (where the CPU has AVX2) or forbids them, so that
/// the SSE2 baseline runs (tests, comparisons).
pub(super) fn set_allowed(allowed: bool) {
    let on = allowed && std::is_x86_feature_detected!("avx2");
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// The blocks of a transpose tile ([`blocks::tiles`]) with an AVX2 kernel,
/// compiled for AVX2 so that the kernel inlines.
///
/// # Safety
///
/// The CPU has AVX2; as [`blocks::tiles`].
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tiles<K: Kernel>(
    dst: *mut u8,
    src: *const u8,
    fi: usize,
    fj: usize,
    sa: isize,
    db: isize,
    nt: bool,
    lines: bool,
) {
    // SAFETY: forwarded.
    unsafe { blocks::tiles::<K>(dst, src, fi, fj, sa, db, nt, lines) }
}

/// An AVX2 micro-transpose of `2·HALF` rows of 32 bytes: each 128-bit lane
/// runs the SSE2 perfect-shuffle network on its half of `HALF` rows, then the
/// two halves are joined lane by lane.
macro_rules! avx2_kernel {
    ($(#[$doc:meta])* $name:ident, $half:expr, $lo:ident, $hi:ident) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl $name {
            /// Source rows `0..M` × elements `0..M` of `src` transposed:
            /// register `q` holds element `q` of every row (32 bytes).
            ///
            /// # Safety
            ///
            /// The CPU has AVX2; rows `src + k·sa` (`k < M`) readable for 32 bytes.
            #[target_feature(enable = "avx2")]
            #[inline]
            unsafe fn columns(src: *const u8, sa: isize) -> [__m256i; 2 * $half] {
                const HALF: usize = $half;
                let zero = _mm256_setzero_si256();
                let mut a = [zero; HALF];
                let mut b = [zero; HALF];
                // SAFETY: the caller's contract.
                unsafe {
                    for k in 0..HALF {
                        a[k] = _mm256_loadu_si256(src.offset(k as isize * sa).cast());
                        b[k] = _mm256_loadu_si256(src.offset((HALF + k) as isize * sa).cast());
                    }
                }
                let mut rounds = HALF.trailing_zeros();
                while rounds > 0 {
                    let (mut ta, mut tb) = ([zero; HALF], [zero; HALF]);
                    for k in 0..HALF / 2 {
                        ta[2 * k] = $lo(a[k], a[k + HALF / 2]);
                        ta[2 * k + 1] = $hi(a[k], a[k + HALF / 2]);
                        tb[2 * k] = $lo(b[k], b[k + HALF / 2]);
                        tb[2 * k + 1] = $hi(b[k], b[k + HALF / 2]);
                    }
                    (a, b) = (ta, tb);
                    rounds -= 1;
                }
                // Lane 0 of a[q] / b[q]: column q of rows 0..HALF / HALF..M;
                // lane 1: column HALF + q.
                let mut out = [zero; 2 * HALF];
                for q in 0..HALF {
                    out[q] = _mm256_permute2x128_si256::<0x20>(a[q], b[q]);
                    out[HALF + q] = _mm256_permute2x128_si256::<0x31>(a[q], b[q]);
                }
                out
            }
        }

        impl Kernel for $name {
            const E: usize = 16 / $half;
            const M: usize = 2 * $half;

            #[target_feature(enable = "avx2")]
            #[inline]
            unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
                // SAFETY: the caller's contract: rows `src + k·sa` readable and
                // `dst + q·db` writable for 32 bytes (32-byte aligned with `NT`).
                unsafe {
                    for (q, v) in Self::columns(src, sa).into_iter().enumerate() {
                        let d = dst.offset(q as isize * db);
                        if NT {
                            _mm256_stream_si256(d.cast(), v);
                        } else {
                            _mm256_storeu_si256(d.cast(), v);
                        }
                    }
                }
            }
        }
    };
}

/// 32×32 blocks of bytes, as two halves of 16 columns: each 32-byte
/// register holds 16 bytes of row `k` in lane 0 and of row `16 + k` in lane
/// 1 (sixteen registers, as many as AVX2 has), the SSE2 network runs on both
/// lanes at once, and each result is a whole 32-byte destination row. Rows
/// of 32 bytes loaded whole, with the halves joined after the network, took
/// 16-byte stores and a lane extract each: two cores, Python, into a reused
/// output, the median of 11 paired calls in one process, speed-up: 8192²
/// 1.02×, 1.02×, from an 8256-wide matrix 1.07×, 4320 × 7680 1.08×, 3000 ×
/// 5001 1.07×, 1500 × 2000 1.17×, 16 × 8192 × 512 1.08×, 2048² 1.04×;
/// 64⁴ 3021 1.01×, 32⁵ 03142 0.98×, 200000 × 128 1.01×.
pub(super) struct U8;

impl U8 {
    /// Source rows `0..32` × bytes `0..16` of `src` transposed: register `q`
    /// holds byte `q` of every row (one half of the micro tile).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2; rows `src + k·sa` (`k < 32`) readable for 16 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn columns(src: *const u8, sa: isize) -> [__m256i; 16] {
        let zero = _mm256_setzero_si256();
        let mut r = [zero; 16];
        // SAFETY: the caller's contract.
        unsafe {
            let mut s = src;
            for row in r.iter_mut() {
                let lo = _mm256_castsi128_si256(_mm_loadu_si128(s.cast()));
                *row = _mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(s.offset(16 * sa).cast()));
                s = s.offset(sa);
            }
        }
        for _ in 0..4 {
            let mut t = [zero; 16];
            for k in 0..8 {
                t[2 * k] = _mm256_unpacklo_epi8(r[k], r[k + 8]);
                t[2 * k + 1] = _mm256_unpackhi_epi8(r[k], r[k + 8]);
            }
            r = t;
        }
        // Lane 0 of r[q]: column q of rows 0..16; lane 1: of rows 16..32.
        r
    }
}

impl Kernel for U8 {
    const E: usize = 1;
    const M: usize = 32;

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
        for h in 0..2 {
            // SAFETY: the caller's contract: rows `src + k·sa` readable and
            // `dst + q·db` writable for 32 bytes (32-byte aligned with `NT`).
            unsafe {
                let mut d = dst.offset(16 * h as isize * db);
                for row in U8::columns(src.add(16 * h), sa) {
                    if NT {
                        _mm256_stream_si256(d.cast(), row);
                    } else {
                        _mm256_storeu_si256(d.cast(), row);
                    }
                    d = d.offset(db);
                }
            }
        }
    }
}

avx2_kernel!(
    /// 16×16 blocks of 2-byte elements.
    U16, 8, _mm256_unpacklo_epi16, _mm256_unpackhi_epi16
);
avx2_kernel!(
    /// 8×8 blocks of 4-byte elements.
    U32, 4, _mm256_unpacklo_epi32, _mm256_unpackhi_epi32
);
avx2_kernel!(
    /// 4×4 blocks of 8-byte elements.
    U64, 2, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64
);

/// 8×8 blocks of 3-byte elements (RGB pixels): a byte shuffle spreads each
/// 24-byte row into eight 4-byte lanes, those are transposed as [`U32`] is,
/// and three more shuffles pack two columns back into 24 bytes each, stored
/// lane by lane (a lane join, a shuffle, a cross-lane permute and an extract
/// per column before: Python, two cores, three alternated runs, GB/s: 1080×1920 pixels
/// transposed 36.7 → 39.1, 2160×3840 33.6 → 35.5, 480×640 47.2 → 54.6).
/// Every access is exactly the block's bytes. The scalar 4×4 tile moves a
/// 3-byte element in two loads and two stores (4096×2048 on two cores, one
/// run: 14 GB/s).
pub(super) struct E3;

impl Kernel for E3 {
    const E: usize = 3;
    const M: usize = 8;

    /// `NT` is ignored: three-byte tiles are never streamed (only line tiles
    /// are, and those take power-of-two elements).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
        // Lane 0 holds row bytes 0..16 and spreads elements 0..4 from them; lane
        // 1 holds bytes 8..24 and spreads elements 4..8 (its bytes 4..16).
        let spread = _mm256_setr_epi8(
            0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, //
            4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1,
        );
        let pack = _mm256_setr_epi8(
            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, //
            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
        );
        // The first 4 of a lane's packed bytes at its end, and the other 8 at
        // its start (the rest zero).
        let pack_end = _mm256_setr_epi8(
            -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 4, //
            -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 4,
        );
        let pack_rest = _mm256_setr_epi8(
            5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, -1, -1, -1, -1, //
            5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let zero = _mm256_setzero_si256();
        // SAFETY: the caller's contract: rows `src + k·sa` readable and
        // `dst + q·db` writable for the 24 bytes of 8 elements, which are
        // exactly the bytes accessed (two 16-byte loads at 0 and 8, a 16- and
        // an 8-byte store at 0 and 16).
        unsafe {
            let row = |k: usize| {
                let p = src.offset(k as isize * sa);
                let lo = _mm256_castsi128_si256(_mm_loadu_si128(p.cast()));
                let v = _mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(p.add(8).cast()));
                _mm256_shuffle_epi8(v, spread)
            };
            let mut a: [__m256i; 4] = std::array::from_fn(&row);
            let mut b: [__m256i; 4] = std::array::from_fn(|k| row(4 + k));
            for _ in 0..2 {
                let (mut ta, mut tb) = ([zero; 4], [zero; 4]);
                for k in 0..2 {
                    ta[2 * k] = _mm256_unpacklo_epi32(a[k], a[k + 2]);
                    ta[2 * k + 1] = _mm256_unpackhi_epi32(a[k], a[k + 2]);
                    tb[2 * k] = _mm256_unpacklo_epi32(b[k], b[k + 2]);
                    tb[2 * k + 1] = _mm256_unpackhi_epi32(b[k], b[k + 2]);
                }
                (a, b) = (ta, tb);
            }
            // Lane 0 of a[q] / b[q]: column q of rows 0..4 / 4..8; lane 1: column
            // 4 + q. A column's 24 bytes are a[q]'s 12 packed, then b[q]'s: the
            // first 16 from a[q] packed or b[q]'s first 4 bytes packed to the
            // lane's end, the last 8 from b[q]'s other 8 packed to its start.
            for q in 0..4 {
                let head = _mm256_or_si256(_mm256_shuffle_epi8(a[q], pack), _mm256_shuffle_epi8(b[q], pack_end));
                let tail = _mm256_shuffle_epi8(b[q], pack_rest);
                let (dl, dh) = (dst.offset(q as isize * db), dst.offset((4 + q) as isize * db));
                _mm_storeu_si128(dl.cast(), _mm256_castsi256_si128(head));
                _mm_storel_epi64(dl.add(16).cast(), _mm256_castsi256_si128(tail));
                _mm_storeu_si128(dh.cast(), _mm256_extracti128_si256::<1>(head));
                _mm_storel_epi64(dh.add(16).cast(), _mm256_extracti128_si256::<1>(tail));
            }
        }
    }
}

/// The byte shuffle that reverses the `E`-byte elements of each 16-byte lane
/// (lane byte k is byte k % E of element k / E; it takes that byte of element
/// 16/E − 1 − k/E), in both lanes of a register.
#[target_feature(enable = "avx2")]
#[inline]
fn lane_reversal<const E: usize>() -> __m256i {
    let idx: [i8; 16] = std::array::from_fn(|k| ((16 / E - 1 - k / E) * E + k % E) as i8);
    // SAFETY: `idx` is 16 readable bytes.
    let lane = unsafe { _mm_loadu_si128(idx.as_ptr().cast()) };
    _mm256_broadcastsi128_si256(lane)
}

/// The 32 bytes that end at `end` (exclusive), their `E`-byte elements in
/// reverse order: reversed in each lane by a byte shuffle, then lanes swapped.
///
/// # Safety
///
/// The CPU has AVX2; the 32 bytes below `end` are readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn reversed_block(end: *const u8, mask: __m256i) -> __m256i {
    // SAFETY: the caller's contract.
    let v = unsafe { _mm256_loadu_si256(end.sub(32).cast()) };
    _mm256_permute4x64_epi64::<0x4E>(_mm256_shuffle_epi8(v, mask))
}

/// `dst[i] = src[-i]` (element offsets) for `i` below the largest multiple of
/// `32 / E` in `n`, elements of `E` (1, 2, 4 or 8) bytes: 32 bytes at a time
/// ([`reversed_block`]). Twice the bytes per instruction of the SSE2 loop LLVM
/// makes (256² f32 column flips ran at 0.8× torch's AVX2 ones). Returns the
/// elements copied.
///
/// # Safety
///
/// The CPU has AVX2; `src - i·E` readable and `dst + i·E` writable for `i < n`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn reverse<const E: usize>(dst: *mut u8, src: *const u8, n: usize) -> usize {
    const { assert!(E == 1 || E == 2 || E == 4 || E == 8) };
    let per = 32 / E;
    let mask = lane_reversal::<E>();
    let full = n / per * per;
    let mut i = 0;
    while i < full {
        // SAFETY: elements `i .. i + per` of both operands (the caller's
        // contract); the source block ends just above element `−i`.
        unsafe { _mm256_storeu_si256(dst.add(i * E).cast(), reversed_block(src.add(E).sub(i * E), mask)) };
        i += per;
    }
    full
}

/// Bytes below the one being read that [`reverse_streamed`] prefetches into
/// L2: a reversed row is read downwards, which the hardware prefetchers
/// follow less well than a rising one. Zen 4 VM, `devtensor bench`'s 4096²
/// f32 row flip, % of memcpy, three alternated runs each: one thread, none
/// 60–63, 1 KiB 65–67, 2 KiB 70–73, 4 KiB 65–67.5 (an experiment that
/// fetched into L1 instead: 50–53); two threads, in the slow memory mode,
/// none 89–90, 1 KiB 92–93, 2 KiB 92–98, 4 KiB 92.5–93.
const REVERSE_PREFETCH_AHEAD: usize = 2048;

/// As [`reverse`], in whole destination lines written with streaming stores,
/// for `i` below the largest multiple of `64 / E` in `n`, the source prefetched
/// [`REVERSE_PREFETCH_AHEAD`] bytes ahead. Returns the elements copied.
///
/// # Safety
///
/// As [`reverse`]; `dst` is 64-byte aligned; the caller fences the streamed
/// stores before the copy returns.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn reverse_streamed<const E: usize>(dst: *mut u8, src: *const u8, n: usize) -> usize {
    const { assert!(E == 1 || E == 2 || E == 4 || E == 8) };
    let per = blocks::LINE / E;
    let mask = lane_reversal::<E>();
    let full = n / per * per;
    let mut i = 0;
    while i < full {
        // The end of the line's source: element −i, and the 64 bytes below.
        let end = src.wrapping_add(E).wrapping_sub(i * E);
        prefetch(end.wrapping_sub(REVERSE_PREFETCH_AHEAD), Cache::L2);
        // SAFETY: elements `i .. i + per` of both operands (the caller's
        // contract), the source's 64 bytes below `end`; `dst + i·E` starts a
        // line (`dst` is aligned, `i·E` a multiple of 64).
        unsafe {
            let d = dst.add(i * E);
            _mm256_stream_si256(d.cast(), reversed_block(end, mask));
            _mm256_stream_si256(d.add(32).cast(), reversed_block(end.sub(32), mask));
        }
        i += per;
    }
    full
}

/// Copies the whole 128-byte blocks of `n` bytes, each loaded (four 32-byte
/// loads) before it is stored; returns the bytes copied.
///
/// # Safety
///
/// The CPU has AVX2; as `ptr::copy_nonoverlapping(src, dst, n)`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn copy_blocks(dst: *mut u8, src: *const u8, n: usize) -> usize {
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: bytes i .. i + 128 of both ranges (the caller's contract).
        unsafe {
            let (s, d) = (src.add(i), dst.add(i));
            let a = _mm256_loadu_si256(s.cast());
            let b = _mm256_loadu_si256(s.add(32).cast());
            let c = _mm256_loadu_si256(s.add(64).cast());
            let e = _mm256_loadu_si256(s.add(96).cast());
            _mm256_storeu_si256(d.cast(), a);
            _mm256_storeu_si256(d.add(32).cast(), b);
            _mm256_storeu_si256(d.add(64).cast(), c);
            _mm256_storeu_si256(d.add(96).cast(), e);
        }
        i += 128;
    }
    i
}

/// Streams the whole lines of `n` bytes from `dst` (line-aligned) on, two
/// 32-byte loads and streaming stores a line; returns the bytes copied.
///
/// # Safety
///
/// The CPU has AVX2; `dst` is line-aligned; as
/// `ptr::copy_nonoverlapping(src, dst, n)`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn stream_lines(dst: *mut u8, src: *const u8, n: usize) -> usize {
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: bytes i .. i + 64 of both ranges; `dst + i` is line-aligned,
        // so both halves are 32-byte aligned.
        unsafe {
            let (s, d) = (src.add(i), dst.add(i));
            let (a, b) = (_mm256_loadu_si256(s.cast()), _mm256_loadu_si256(s.add(32).cast()));
            _mm256_stream_si256(d.cast(), a);
            _mm256_stream_si256(d.add(32).cast(), b);
        }
        i += 64;
    }
    i
}

/// Streams the 32 bytes at `pat` twice into each whole line of `n` bytes
/// from `dst` (line-aligned) on; returns the bytes written.
///
/// # Safety
///
/// The CPU has AVX2; `dst` is line-aligned; `pat` readable for 32 bytes and
/// `dst` writable for `n`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn stream_fill(dst: *mut u8, pat: *const u8, n: usize) -> usize {
    // SAFETY: `pat` holds 32 readable bytes (the caller's contract).
    let v = unsafe { _mm256_loadu_si256(pat.cast()) };
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: bytes i .. i + 64 of `dst`, line-aligned (the caller's contract).
        unsafe {
            let d = dst.add(i);
            _mm256_stream_si256(d.cast(), v);
            _mm256_stream_si256(d.add(32).cast(), v);
        }
        i += 64;
    }
    i
}

/// Copies `count` runs of `run` bytes (at least 32), `ds` and `ss` bytes
/// apart: 128-byte blocks loaded whole before they are stored, then 32-byte
/// pieces, the last one overlapping the bytes before it.
///
/// # Safety
///
/// The CPU has AVX2; every run `dst + j·ds`, `src + j·ss` (`j < count`) as
/// `ptr::copy_nonoverlapping(src, dst, run)`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn copy_runs(dst: *mut u8, src: *const u8, count: usize, run: usize, ds: isize, ss: isize) {
    debug_assert!(run >= 32);
    for j in 0..count {
        // SAFETY: run `j` of both operands (the caller's contract); every access
        // lies inside its `run` bytes.
        unsafe {
            let (d, s) = (dst.offset(j as isize * ds), src.offset(j as isize * ss));
            let mut i = copy_blocks(d, s, run);
            while i + 32 <= run {
                _mm256_storeu_si256(d.add(i).cast(), _mm256_loadu_si256(s.add(i).cast()));
                i += 32;
            }
            if i < run {
                let at = run - 32;
                _mm256_storeu_si256(d.add(at).cast(), _mm256_loadu_si256(s.add(at).cast()));
            }
        }
    }
}

/// Copies `count` rows of `ROW` bytes (128 or 256), `ds` and `ss` bytes
/// apart, each row loaded whole (four or eight 32-byte loads) before it is
/// stored: the least work a row, so that the core keeps the most rows' misses
/// in flight where rows lie far apart ([`super::rows`](mod@super::rows)'s short rows).
///
/// # Safety
///
/// The CPU has AVX2; every row `dst + j·ds`, `src + j·ss` (`j < count`) as
/// `ptr::copy_nonoverlapping(src, dst, ROW)`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn copy_rows<const ROW: usize>(dst: *mut u8, src: *const u8, count: usize, ds: isize, ss: isize) {
    const { assert!(ROW == 128 || ROW == 256) };
    let (mut d, mut s) = (dst, src);
    for _ in 0..count {
        // SAFETY: bytes `0..ROW` of this row of both operands (the caller's
        // contract).
        unsafe {
            let mut v = [_mm256_setzero_si256(); 8];
            for (k, x) in v.iter_mut().take(ROW / 32).enumerate() {
                *x = _mm256_loadu_si256(s.add(32 * k).cast());
            }
            for (k, x) in v.iter().take(ROW / 32).enumerate() {
                _mm256_storeu_si256(d.add(32 * k).cast(), *x);
            }
        }
        // Wrapping: past the last row the pointers may leave the operands.
        d = d.wrapping_offset(ds);
        s = s.wrapping_offset(ss);
    }
}

/// Element sizes with a whole-line kernel ([`line_tiles`]).
pub(super) fn has_line_kernel(e: usize) -> bool {
    matches!(e, 1 | 2 | 4)
}

/// Source rows `0..32 / E` × elements `0..16` of `src` transposed: register
/// `q` holds element `q` of every row (32 bytes, half a destination line).
///
/// # Safety
///
/// The CPU has AVX2; `E` is 1, 2 or 4; rows `src + k·sa` (`k < 32 / E`)
/// readable for `16·E` bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn half_lines<const E: usize>(src: *const u8, sa: isize) -> [__m256i; 16] {
    // SAFETY: the caller's contract.
    unsafe {
        match E {
            1 => U8::columns(src, sa),
            2 => U16::columns(src, sa),
            _ => {
                let mut out = [_mm256_setzero_si256(); 16];
                out[..8].copy_from_slice(&U32::columns(src, sa));
                out[8..].copy_from_slice(&U32::columns(src.add(32), sa));
                out
            }
        }
    }
}

/// `64 / E` source rows × 16 elements into 16 whole destination lines, each
/// streamed in two 32-byte stores back to back, so that no line is ever left
/// half written: the first half of the rows' columns wait in L1 (16 stores)
/// while the second half's are transposed.
///
/// # Safety
///
/// The CPU has AVX2; `E` is 1, 2 or 4; rows `src + k·sa` (`k < 64 / E`)
/// readable for `16·E` bytes, `dst + q·db` (`q < 16`) writable for 64 bytes
/// and 64-byte aligned.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn line_micro<const E: usize>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
    // SAFETY: the caller's contract.
    unsafe {
        let held = half_lines::<E>(src, sa);
        let last = half_lines::<E>(src.offset((32 / E) as isize * sa), sa);
        for (q, (h, l)) in held.into_iter().zip(last).enumerate() {
            let d = dst.offset(q as isize * db);
            _mm256_stream_si256(d.cast(), h);
            _mm256_stream_si256(d.add(32).cast(), l);
        }
    }
}

/// Source lines ahead along each row that [`line_tiles`] prefetches into L2.
/// Zen 2 VM, one thread, `devtensor bench` (% of memcpy), 8192² u8 from an
/// 8256-wide matrix: tiles of 512 rows × 512 bytes, one 51.5, two 52–53,
/// three 50.6; 128 rows × 2 KiB, none 39.6, two 43.8; 256 × 1 KiB, two
/// 49.6, four 47.6.
const LINES_AHEAD: isize = 2;

/// Longest source runs (bytes of each of a tile's rows) for which
/// [`line_tiles`] prefetches down the tile ([`MICRO_TILES_AHEAD`]) instead of
/// along its rows: there the lines [`LINES_AHEAD`] along half the rows' are
/// the next rows' first, read already, and each line column's first micro
/// tiles went unfetched. Zen 4 VM, `devtensor bench` (and permutes of its
/// kind added), GB/s, alternated runs, along the rows → down: one thread, 16
/// × 4096 × 128 f16 batched 17.9–20.5 → 23.2–23.8, 64 × 1024 × 128 18.4–19.3 →
/// 25.6–27.6, 32 × 4096 × 64 19.4–19.6 → 22.9–23.0, 16 × 4096 × 96 12.6–12.9
/// → 15.3–15.5, f32 32 × 4096 × 64 27.4–30.7 → 33.6–34.0; two threads 38.3–45.1
/// → 56.0–57.5, 38.0–54.6 → 68.4–70.2, 39.4–45.7 → 45.4–58.2, 26.2–30.7 →
/// 34.4–34.5, f32 52.3–64.8 → 52.0–63.0. From 512-byte runs down lost (16 ×
/// 4096 × 128 f32 one thread 33.9–35.4 → 32.1–33.4; 4096² f32 from a
/// 4112-wide matrix, 512-byte tiles, 35.0 → 27.1).
const SHORT_RUN_MAX: usize = 256;

/// Micro tiles ahead in [`line_tiles`]' walk whose lines are prefetched where
/// the source runs are short ([`SHORT_RUN_MAX`]): one, two, four and eight
/// did alike (16 × 4096 × 128 f16 batched, one thread, 23.1–26.8 GB/s).
const MICRO_TILES_AHEAD: usize = 2;

/// `dst[i·E + j·db] = src[i·sa + j·E]` for `i < fi`, `j < fj` (multiples of
/// `64 / E` and 16) in whole streamed lines ([`line_micro`]), a column of
/// micro tiles after another (`j` outer), as [`super::avx512::line_tiles`]
/// walks them; at the first micro tile of each source line, the line
/// [`LINES_AHEAD`] further along its rows is prefetched (a tile reads a line
/// of each of hundreds of rows a step, more streams than the hardware
/// prefetchers follow), or for short runs the lines of the micro tile
/// [`MICRO_TILES_AHEAD`] on in the walk ([`SHORT_RUN_MAX`]). With `copied`
/// (and at most [`COPIED_ROWS_MAX`] rows), each line column of the rows is
/// first copied into an L1 buffer and transposed from there: rows whose lines
/// crowd L1 sets evict each other before the micro tiles beside the first come
/// back to them (`through_l1` in `transpose`).
///
/// # Safety
///
/// The CPU has AVX2; `E` is 1, 2 or 4; every address formed is an element of
/// its operand; `dst` and `db` are multiples of a line.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn line_tiles<const E: usize>(
    dst: *mut u8,
    src: *const u8,
    fi: usize,
    fj: usize,
    sa: isize,
    db: isize,
    copied: bool,
) {
    const LINE: usize = blocks::LINE;
    let rows = LINE / E;
    let short_runs = fj * E <= SHORT_RUN_MAX;
    let copied = copied && fi <= COPIED_ROWS_MAX;
    let mut column = MaybeUninit::<LineColumn>::uninit();
    let column = column.as_mut_ptr().cast::<u8>();
    let mut j = 0;
    while j < fj {
        if copied && (j * E).is_multiple_of(LINE) {
            // The line column of every row from element j (less where the
            // block ends inside a line), each row's line once.
            let bytes = ((fj - j) * E).min(LINE);
            for r in 0..fi {
                // SAFETY: row r's `bytes` from element j lie in the block (the
                // caller's contract); the column holds COPIED_ROWS_MAX ≥ fi
                // lines, one a row.
                unsafe {
                    let from = src.offset(r as isize * sa).add(j * E);
                    if bytes == LINE {
                        // A literal size: two 32-byte moves, no call.
                        std::ptr::copy_nonoverlapping(from, column.add(r * LINE), LINE);
                    } else {
                        std::ptr::copy_nonoverlapping(from, column.add(r * LINE), bytes);
                    }
                }
            }
        }
        let mut i = 0;
        while i < fi {
            let at = src.wrapping_offset(i as isize * sa).wrapping_add(j * E);
            if (j * E).is_multiple_of(LINE) {
                let ahead = if short_runs {
                    // The micro tile MICRO_TILES_AHEAD on in the walk: down
                    // the column, or past its foot at the top of the next
                    // line's column.
                    let down = i + MICRO_TILES_AHEAD * rows;
                    let (row, col) = if down < fi {
                        (down, j * E)
                    } else {
                        (down - fi, j * E + LINE)
                    };
                    src.wrapping_offset(row as isize * sa).wrapping_add(col)
                } else {
                    at.wrapping_offset(LINES_AHEAD * LINE as isize)
                };
                prefetch_rows(ahead, rows, sa);
            }
            // SAFETY: micro tile (i, j) lies inside the block (the caller's
            // contract); its destination rows start on lines.
            unsafe {
                let d = dst.add(i * E).offset(j as isize * db);
                if copied {
                    line_micro::<E>(d, column.add(i * LINE + j * E % LINE), LINE as isize, db);
                } else {
                    line_micro::<E>(d, at, sa, db);
                }
            }
            i += rows;
        }
        j += 16;
    }
}

/// Most rows whose line columns [`line_tiles`] copies (with `copied`): a
/// tile's 64 (`BIG_L2_AVX2_LINE_TILE` in `transpose::tile_sizes`).
const COPIED_ROWS_MAX: usize = 64;

/// A line of each of up to [`COPIED_ROWS_MAX`] source rows, one after another.
#[repr(C, align(64))]
struct LineColumn([u8; COPIED_ROWS_MAX * blocks::LINE]);

/// Asks L2 for the line at `at` in each of `rows` rows `sa` bytes apart.
#[inline(always)]
fn prefetch_rows(at: *const u8, rows: usize, sa: isize) {
    for r in 0..rows {
        prefetch(at.wrapping_offset(r as isize * sa), Cache::L2);
    }
}

/// Steps of [`sheared_column`]'s ring of each destination row's transposed
/// lines, and the slot after them that repeats the first, so that any two
/// consecutive steps lie side by side.
const RING_STEPS: usize = 4;

/// One destination row's ring in [`sheared_column`]: [`RING_STEPS`] lines and
/// the copy of the first.
#[repr(C, align(64))]
struct RingRow([u8; (RING_STEPS + 1) * blocks::LINE]);

/// [`line_tiles`] for destination rows that need not start on a line:
/// `dst[i·E + j·db] = src[i·sa + j·E]` for `j < fj` (a multiple of 16) and,
/// in row `j`, the `lines` whole lines from the first line boundary at or
/// after `dst + j·db` (`s_j < 64 / E` elements in: `i` from `s_j` to `s_j +
/// lines · 64 / E`), streamed. Reads source rows below `(lines + 1) · 64 /
/// E`. AVX2's counterpart of [`super::avx512::sheared_tiles`], a column of
/// micro tiles after another (`j` outer) as [`line_tiles`] walks them.
///
/// # Safety
///
/// The CPU has AVX2; `E` is 1, 2 or 4; every address formed is an element of
/// its operand; `dst` and `db` are multiples of `E`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn sheared_tiles<const E: usize>(
    dst: *mut u8,
    src: *const u8,
    lines: usize,
    fj: usize,
    sa: isize,
    db: isize,
) {
    debug_assert!(fj.is_multiple_of(16) && (dst as usize).is_multiple_of(E) && db % E as isize == 0);
    for j in (0..fj).step_by(16) {
        // SAFETY: destination rows j .. j + 16 and source columns j .. j + 16
        // lie inside the block (the caller's contract).
        unsafe { sheared_column::<E>(dst.offset(j as isize * db), src.add(j * E), lines, sa, db) };
    }
}

/// 16 destination rows of [`sheared_tiles`]: a step transposes the next `64 /
/// E` source rows into a line for each destination row ([`half_lines`]) and
/// puts it in that row's ring; the row's line that starts `s` bytes into a
/// step's is then the ring's 64 bytes from there, loaded (two unaligned
/// loads) and streamed two steps later, when the stores that wrote them have
/// left the core (a load that spans two stores in flight waits for both).
///
/// # Safety
///
/// As [`sheared_tiles`], for `fj = 16`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sheared_column<const E: usize>(dst: *mut u8, src: *const u8, lines: usize, sa: isize, db: isize) {
    const LINE: usize = blocks::LINE;
    let rows = LINE / E;
    let mut ring = std::mem::MaybeUninit::<[RingRow; 16]>::uninit();
    let ring = ring.as_mut_ptr().cast::<RingRow>();
    // Each row's first whole line, and its shift (bytes) into a step's line.
    let mut line = [dst; 16];
    let mut shift = [0usize; 16];
    for (q, (l, s)) in line.iter_mut().zip(&mut shift).enumerate() {
        let at = dst.wrapping_offset(q as isize * db);
        *s = (LINE - at as usize % LINE) % LINE;
        *l = at.wrapping_add(*s);
    }
    // SAFETY: the ring's bytes read below were written first (slot `k` of
    // step `k`, the slot after it of step `k + 1`); the source and
    // destination accesses are the caller's contract.
    unsafe {
        let emit = |k: usize| {
            for q in 0..16 {
                let from = ring.add(q).cast::<u8>().add(k % RING_STEPS * LINE + shift[q]);
                let to = line[q].add(k * LINE);
                _mm256_stream_si256(to.cast(), _mm256_loadu_si256(from.cast()));
                _mm256_stream_si256(to.add(32).cast(), _mm256_loadu_si256(from.add(32).cast()));
            }
        };
        for k in 0..=lines {
            let at = src.offset((k * rows) as isize * sa);
            prefetch_rows(at.wrapping_add(LINES_AHEAD as usize * LINE), rows, sa);
            let slot = k % RING_STEPS * LINE;
            for (half, first) in [(0, true), (32, false)] {
                let x = half_lines::<E>(at.offset(if first { 0 } else { (32 / E) as isize * sa }), sa);
                for (q, v) in x.iter().enumerate() {
                    let row = ring.add(q).cast::<u8>();
                    _mm256_storeu_si256(row.add(slot + half).cast(), *v);
                    if slot == 0 {
                        _mm256_storeu_si256(row.add(RING_STEPS * LINE + half).cast(), *v);
                    }
                }
            }
            if k >= 2 {
                emit(k - 2);
            }
        }
        if lines >= 1 {
            emit(lines - 1);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::{line_tiles, sheared_tiles};
    use crate::copy::cpu::blocks::LINE;

    /// A 4 KiB block, line-aligned, to build destinations from.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Lines([u8; 64 * 64]);

    /// A sheared kernel (`dst`, `src`, `lines`, `fj`, `sa`, `db`, as
    /// [`sheared_tiles`] and `avx512::sheared_tiles`) of `e`-byte elements
    /// against the definition, for 32 destination rows an element longer than
    /// whole lines, from a first row `off` elements past a line, source rows
    /// `sa` bytes apart: exactly the rows' `lines` whole lines written.
    pub(in crate::copy::cpu) fn check_sheared(
        e: usize,
        lines: usize,
        off: usize,
        sa: usize,
        kernel: impl Fn(*mut u8, *const u8, usize, usize, isize, isize),
    ) {
        let m = LINE / e;
        let fj = 32;
        let db = (m * (lines + 1) + 1) * e; // a row: one element more than whole lines
        let src: Vec<u8> = (0..m * (lines + 1) * sa + fj * e)
            .map(|k| (k * 7 + k / 251) as u8)
            .collect();
        let mut buf = vec![Lines([0xA5; 64 * 64]); (fj * db + 2 * LINE).div_ceil(64 * 64)];
        // SAFETY: `buf` is a run of 4 KiB blocks without padding.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 64 * 64) };
        let base = LINE + off * e;
        let before = dst.to_vec();
        // Source rows k < m·(lines + 1) and destination rows j < fj from
        // `base` lie inside the buffers, each row's lines within its `db` bytes.
        kernel(
            dst[base..].as_mut_ptr(),
            src.as_ptr(),
            lines,
            fj,
            sa as isize,
            db as isize,
        );
        let mut written = vec![false; dst.len()];
        for j in 0..fj {
            let row = base + j * db;
            let s = (row.next_multiple_of(LINE) - row) / e; // `buf` starts on a line
            for i in s..s + m * lines {
                let (d, at) = (row + i * e, i * sa + j * e);
                assert_eq!(dst[d..d + e], src[at..at + e], "e = {e}, lines = {lines}, ({i}, {j})");
                written[d..d + e].fill(true);
            }
        }
        for (k, w) in written.iter().enumerate() {
            assert!(*w || dst[k] == before[k], "e = {e}, lines = {lines}: byte {k} written");
        }
    }

    /// [`sheared_tiles`] for each element size: rows at every distance from a
    /// line (from a first row 0, 1 or 5 elements past one), runs of 1 to 9
    /// lines (past the ring's four steps), source rows at odd strides.
    #[test]
    fn sheared_tiles_write_each_rows_whole_lines() {
        if !std::is_x86_feature_detected!("avx2") {
            println!("SKIP: the CPU has no AVX2");
            return;
        }
        for (lines, off) in [(1usize, 0usize), (2, 1), (3, 5), (4, 1), (5, 0), (9, 5)] {
            for sa in [64usize, 64 * 3 + 8, 200] {
                // SAFETY: the CPU has AVX2; `check_sheared` hands each kernel
                // buffers that hold what it reads and writes.
                let one = |d, s, l, fj, sa, db| unsafe { sheared_tiles::<1>(d, s, l, fj, sa, db) };
                // SAFETY: as above.
                let two = |d, s, l, fj, sa, db| unsafe { sheared_tiles::<2>(d, s, l, fj, sa, db) };
                // SAFETY: as above.
                let four = |d, s, l, fj, sa, db| unsafe { sheared_tiles::<4>(d, s, l, fj, sa, db) };
                check_sheared(1, lines, off, sa, one);
                check_sheared(2, lines, off, sa, two);
                check_sheared(4, lines, off, sa, four);
            }
        }
    }

    /// [`line_tiles`] of `e`-byte elements, read in place and through the L1
    /// copy of each line column (`copied`), against the definition: 64 source
    /// rows `sa` bytes apart × `fj` elements, whose last line column may be
    /// partial; nothing outside the `fi × fj` block written.
    fn check_line_tiles(e: usize, fj: usize, sa: usize, copied: bool) {
        let fi = 64;
        let db = (fi * e).next_multiple_of(LINE) + LINE;
        let src: Vec<u8> = (0..fi * sa).map(|k| (k * 7 + k / 251) as u8).collect();
        let mut buf = vec![Lines([0xA5; 64 * 64]); (fj * db).div_ceil(64 * 64)];
        // SAFETY: `buf` is a run of 4 KiB blocks without padding.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 64 * 64) };
        let before = dst.to_vec();
        // SAFETY: the caller checked AVX2; rows `k < fi` hold `fj` elements
        // (`fj·e < sa`), destination rows `j < fj` start on lines and hold `fi`.
        unsafe {
            let (d, s, sa, db) = (dst.as_mut_ptr(), src.as_ptr(), sa as isize, db as isize);
            match e {
                1 => line_tiles::<1>(d, s, fi, fj, sa, db, copied),
                2 => line_tiles::<2>(d, s, fi, fj, sa, db, copied),
                _ => line_tiles::<4>(d, s, fi, fj, sa, db, copied),
            }
        }
        let mut written = vec![false; dst.len()];
        for j in 0..fj {
            for i in 0..fi {
                let (d, at) = (i * e + j * db, i * sa + j * e);
                assert_eq!(
                    dst[d..d + e],
                    src[at..at + e],
                    "e = {e}, fj = {fj}, copied = {copied}: ({i}, {j})"
                );
                written[d..d + e].fill(true);
            }
        }
        for (k, w) in written.iter().enumerate() {
            assert!(
                *w || dst[k] == before[k],
                "e = {e}, fj = {fj}, copied = {copied}: byte {k} written"
            );
        }
    }

    /// [`line_tiles`] in place and copied alike, for each element size, from
    /// rows that crowd L1 sets (8 KiB apart: every line of a column in one
    /// set) and rows that do not, along whole and partial line columns.
    #[test]
    fn line_tiles_move_each_element_in_place_and_copied() {
        if !std::is_x86_feature_detected!("avx2") {
            println!("SKIP: the CPU has no AVX2");
            return;
        }
        for e in [1usize, 2, 4] {
            for fj in [16usize, 80, 128] {
                for sa in [8192usize, 8192 + 3 * LINE] {
                    for copied in [false, true] {
                        check_line_tiles(e, fj, sa, copied);
                    }
                }
            }
        }
    }
}
