//! AVX-512 transposes whose every store is one whole, streamed cache line:
//! micro tiles of `64 / E` rows × `64 / E` elements (64 × 64 bytes, 32 × 32
//! 2-byte elements, 16 × 16 4-byte ones, 8 × 8 8-byte ones), used by large
//! streamed transposes with line-aligned destination rows where the CPU has
//! AVX-512 (F and BW, detected at run time). The AVX2 kernels write half a
//! line a store, so a line completes only when a second store reaches it;
//! streamed that way, the CPU's few write-combining buffers flush lines in
//! pieces, and those kernels go through an L1 staging tile instead (a second
//! load and store of every byte). A whole-line store leaves nothing open:
//! tiles go straight from the source to memory. Also the whole-line copy of
//! streamed runs ([`stream_lines`]).

use std::arch::x86_64::{
    __m512i, _mm_loadu_si128, _mm512_castsi128_si512, _mm512_inserti32x4, _mm512_loadu_si512, _mm512_setzero_si512,
    _mm512_stream_si512, _mm512_unpackhi_epi8, _mm512_unpackhi_epi16, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64,
    _mm512_unpacklo_epi8, _mm512_unpacklo_epi16, _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
};
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::LINE;

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

/// One round of the perfect-shuffle network: `t[2k] = lo(x[k], x[k + P/2])`,
/// `t[2k + 1] = hi(…)`.
#[inline(always)]
fn unpack_round<const P: usize>(
    x: [__m512i; P],
    lo: impl Fn(__m512i, __m512i) -> __m512i,
    hi: impl Fn(__m512i, __m512i) -> __m512i,
) -> [__m512i; P] {
    std::array::from_fn(|i| {
        let (k, odd) = (i / 2, i % 2 == 1);
        if odd {
            hi(x[k], x[k + P / 2])
        } else {
            lo(x[k], x[k + P / 2])
        }
    })
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
            let zero = _mm512_setzero_si512();
            for c in 0..4 {
                // SAFETY: the caller's contract: bytes 16·c .. 16·c + 16 of rows
                // k < 4·P, and destination rows P·c + q < 4·P.
                unsafe {
                    let chunk = |row: usize| _mm_loadu_si128(src.offset(row as isize * sa).add(16 * c).cast());
                    let mut x = [zero; P];
                    for (k, v) in x.iter_mut().enumerate() {
                        let mut r = _mm512_castsi128_si512(chunk(k));
                        r = _mm512_inserti32x4::<1>(r, chunk(P + k));
                        r = _mm512_inserti32x4::<2>(r, chunk(2 * P + k));
                        *v = _mm512_inserti32x4::<3>(r, chunk(3 * P + k));
                    }
                    // One call a round, not a loop over rounds: LLVM kept the
                    // 16 registers of a byte tile on the stack in that loop.
                    // Written out here: moved into a helper taking the unpacks
                    // as closures, they were no longer inlined (a call each).
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

/// Whether `e`-byte elements have a kernel here: every power of two up to 8.
/// Bytes too, since each round is its own call ([`unpack_round`]): in a loop
/// over rounds, LLVM kept the byte tile's 16 registers on the stack, and
/// the byte route ran at 0.62–1.02× the prefetched one's speed. Unrolled,
/// `devtensor bench` against 62a227f, six alternated runs (% of memcpy):
/// 8192² u8 51–53 → 56–62, from an 8256-wide matrix 62–64 → 71–73; in
/// Python from NumPy arrays, against `DEVTENSOR_DISABLE_AVX512=1` (the
/// median of three processes each, GB/s): 8192² 28.2 → 31.0, 8192 × 4096 from 8256-wide rows 33.0 → 36.6, 16 × 4096 × 1024
/// 30.7 → 36.9, 64⁴ 3021 19.9 → 30.3; 4096², 32⁵ 03142 alike.
pub(super) fn has_kernel(e: usize) -> bool {
    matches!(e, 1 | 2 | 4 | 8)
}

/// `dst[i·e + j·db] = src[i·sa + j·e]` for `i < fi`, `j < fj` (multiples of
/// `64 / e`) with streaming stores, a column of micro tiles after another
/// (`j` outer): the tile's source rows are read along, one line each a step,
/// which the hardware prefetchers follow, while each destination row
/// receives `fi·e` contiguous bytes a step.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW ([`enabled`]); [`has_kernel`]`(e)`; every
/// address formed is an element of its operand; `dst` and `db` are
/// multiples of a line.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn line_tiles(e: usize, dst: *mut u8, src: *const u8, fi: usize, fj: usize, sa: isize, db: isize) {
    debug_assert!((dst as usize).is_multiple_of(LINE) && db % LINE as isize == 0);
    let m = LINE / e;
    let micro = match e {
        1 => micro1,
        2 => micro2,
        4 => micro4,
        _ => micro8,
    };
    let mut j = 0;
    while j < fj {
        let mut i = 0;
        while i < fi {
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
            i += m;
        }
        j += m;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Lines([u8; 64 * 64]);

    /// Each kernel against the definition, from source rows at odd offsets and
    /// strides.
    #[test]
    fn line_micro_tiles_transpose() {
        if !detected() {
            println!("SKIP: the CPU has no AVX-512 F and BW");
            return;
        }
        for e in [1usize, 2, 4, 8] {
            let m = 64 / e;
            for (off, sa) in [(0usize, 64isize), (3, 64 + 5), (16, 200)] {
                let src: Vec<u8> = (0..off + m * sa as usize + 64)
                    .map(|k| (k * 7 + k / 251) as u8)
                    .collect();
                let mut dst = Lines([0; 64 * 64]);
                // SAFETY: the CPU has the kernels' instructions; `m` rows of
                // `sa` bytes from `off` lie in `src`; `dst` is `m` aligned lines.
                unsafe { line_tiles(e, dst.0.as_mut_ptr(), src.as_ptr().add(off), m, m, sa, 64) };
                for i in 0..m {
                    for j in 0..m {
                        let s = off + i * sa as usize + j * e;
                        assert_eq!(
                            dst.0[j * 64 + i * e..][..e],
                            src[s..s + e],
                            "e = {e}, sa = {sa}, ({i}, {j})"
                        );
                    }
                }
            }
        }
    }
}
