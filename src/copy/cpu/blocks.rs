//! Blocks of register micro-transposes (what a transpose tile is made of):
//! straight into the destination, or — for streaming stores whose micro tiles
//! would leave many lines half-written — through a small L1 buffer whose
//! whole lines are then streamed out one by one.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::elem::Elem;

/// A cache line.
pub(super) const LINE: usize = 64;

/// A register micro-transpose of `M × M` elements of `E` bytes.
pub(super) trait Kernel {
    /// Element bytes.
    const E: usize;
    /// Edge of the micro tile.
    const M: usize;

    /// `dst[i·E + j·db] = src[i·sa + j·E]` for `i, j < M`; `NT`: streaming stores.
    ///
    /// # Safety
    ///
    /// Every address formed is readable (source) or writable (destination);
    /// the CPU has the kernel's instructions; with `NT`, every destination row
    /// is aligned to the kernel's row (`M·E` bytes).
    unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize);
}

/// The baseline micro-transpose of an element type ([`Elem::micro`]).
pub(super) struct Base<T>(PhantomData<T>);

impl<T: Elem> Kernel for Base<T> {
    const E: usize = size_of::<T>();
    const M: usize = T::MICRO;

    #[inline(always)]
    unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
        // SAFETY: forwarded.
        unsafe { T::micro::<NT>(dst, src, sa, db) }
    }
}

/// Walks the `M × M` micro tiles of an `fi × fj` block (multiples of `M`) in
/// blocks of `l` square (a multiple of `M`). Line blocks ([`line_block`]): the micro tiles of a line block read whole source lines and
/// complete whole destination lines, one after the other. Visiting a source
/// line once instead of once per column of micro tiles matters on DRAM-bound
/// transposes (4096² f32, one run: 57 GB/s against 37 in 8 × 8 steps).
/// `dst_major`: line blocks along destination rows (source rows inner),
/// else along source rows. A macro, not a closure, so that the micro tile
/// inlines into the AVX2 functions that expand it.
macro_rules! for_each_micro {
    ($l:expr, $m:expr, $fi:expr, $fj:expr, $dst_major:expr, |$i:ident, $j:ident| $body:block) => {{
        let (l, m, fi, fj): (usize, usize, usize, usize) = ($l, $m, $fi, $fj);
        let step = |at: usize, end: usize| if at + l <= end { l } else { m };
        let (outer_end, inner_end) = if $dst_major { (fj, fi) } else { (fi, fj) };
        let mut o0 = 0;
        while o0 < outer_end {
            let no = step(o0, outer_end);
            let mut n0 = 0;
            while n0 < inner_end {
                let nn = step(n0, inner_end);
                let (i0, ni, j0, nj) = if $dst_major { (n0, nn, o0, no) } else { (o0, no, n0, nn) };
                let mut $j = j0;
                while $j < j0 + nj {
                    let mut $i = i0;
                    while $i < i0 + ni {
                        $body
                        $i += m;
                    }
                    $j += m;
                }
                n0 += nn;
            }
            o0 += no;
        }
    }};
}

/// Edge of a line block of `e`-byte elements with `m × m` micro tiles: a
/// line's elements, rounded down to a multiple of `m` (elements of 3, 5, ...
/// bytes: 64 / E is not), at least `m`.
#[inline(always)]
fn line_block(e: usize, m: usize) -> usize {
    (LINE / e / m).max(1) * m
}

/// An `fi × fj` block of micro tiles (multiples of `K::M`):
/// `dst[i·E + j·db] = src[i·sa + j·E]`, in line blocks when `lines` (tiles
/// that come from memory), else row of micro tiles by row (cache-resident
/// tiles, where a line block's short loops cost more than they save: 128²
/// f32, one run: 74 GB/s against 55). With `nt` (streaming stores), `fi` is
/// a multiple of a line's elements and every destination row starts a line.
/// Kernels with 32-byte rows and at most 8 of them (AVX2's 4- and 8-byte ones)
/// stream their rows directly: two stores complete a line while at most eight
/// are open. The others would keep 16 lines open, or fill a line in four
/// stores: the CPU's few write-combining buffers then flush lines in pieces
/// (4096² f32 with SSE2 4 × 4 tiles, one run: 19 GB/s directly, 27 through
/// the line buffer). Streamed blocks go along destination rows, whose lines
/// need no prefetching (4096² f32: 32 GB/s, 21 along source rows); others go
/// along source rows, which the prefetchers then follow.
///
/// # Safety
///
/// As [`Kernel::micro`] for every micro tile, and the alignment above with `nt`.
#[inline(always)]
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
    let l = if lines || nt { line_block(K::E, K::M) } else { K::M };
    // SAFETY: forwarded.
    unsafe {
        if !nt {
            direct::<K, false>(l, dst, src, fi, fj, sa, db);
        } else if K::M * K::E >= 32 && K::M <= 8 {
            direct::<K, true>(l, dst, src, fi, fj, sa, db);
        } else {
            streamed::<K>(dst, src, fi, fj, sa, db);
        }
    }
}

/// [`tiles`] with the micro tiles writing the destination.
///
/// # Safety
///
/// As [`tiles`].
#[inline(always)]
unsafe fn direct<K: Kernel, const NT: bool>(
    l: usize,
    dst: *mut u8,
    src: *const u8,
    fi: usize,
    fj: usize,
    sa: isize,
    db: isize,
) {
    let (e, m) = (K::E, K::M);
    let at = |i: usize, j: usize| {
        // SAFETY: both walks pass micro tiles (i, j) inside the block.
        unsafe {
            K::micro::<NT>(
                dst.offset((i * e) as isize + j as isize * db),
                src.offset(i as isize * sa + (j * e) as isize),
                sa,
                db,
            )
        }
    };
    if l == m && !NT {
        if rows_crowd_l1_sets(sa, m) && m * fj * e <= SCRATCH_BYTES {
            // SAFETY: forwarded.
            unsafe { through_scratch::<K>(dst, src, fi, fj, sa, db) };
            return;
        }
        // Row of micro tiles by row: two plain loops (a 32² f32 tile spends
        // a sixth of its time in the line walk's four).
        let mut i = 0;
        while i < fi {
            let mut j = 0;
            while j < fj {
                at(i, j);
                j += m;
            }
            i += m;
        }
        return;
    }
    for_each_micro!(l, m, fi, fj, NT, |i, j| {
        at(i, j);
    });
}

/// Whether the lines that a column of `m` rows `sa` bytes apart touches
/// crowd into few L1 sets: more than 8 (the ways of a 32 KiB L1D) in one of
/// the 64 sets that lines a page apart share. Asked once per block, so
/// cheap where it can be: blocks of permutes are a micro tile or two.
#[inline(always)]
pub(super) fn rows_crowd_l1_sets(sa: isize, m: usize) -> bool {
    const WAYS: usize = 8;
    if m <= WAYS {
        return false;
    }
    // A stride and its negative visit the same number of sets.
    let sa = sa.unsigned_abs() % 4096;
    if sa.is_multiple_of(LINE) {
        // Each row a whole number of sets on: the rows cycle through 64 / gcd.
        let sets = 64 >> (sa / LINE).trailing_zeros().min(6);
        return m.div_ceil(sets) > WAYS;
    }
    let mut rows = [0u8; 64];
    (0..m).any(|k| {
        let set = k * sa % 4096 / LINE;
        rows[set] += 1;
        usize::from(rows[set]) > WAYS
    })
}

/// Bytes of [`through_scratch`]'s copy of a strip of source rows.
const SCRATCH_BYTES: usize = 16 << 10;

#[repr(C, align(64))]
struct Scratch([u8; SCRATCH_BYTES]);

/// [`direct`]'s row-by-row walk for source rows whose lines crowd into few L1
/// sets ([`rows_crowd_l1_sets`]): each strip of `M` source rows is first
/// copied into a contiguous L1 buffer, then transposed from there. Read in
/// place, a strip's lines evict each other before the next micro tile reads
/// their other half (AVX2 byte kernels: 32 rows, 8 ways). A 256 × 256-byte
/// tile staged from L2-resident rows 8 KiB apart, one core: 7.3 µs in
/// place, 4.0 through the copy (3.1 from rows 8256 bytes apart). Two cores,
/// Python, into a reused output, the median of 9–11 paired calls in one
/// process, speed-up: u8 8192² 1.09×, 1.15×, 4096² 1.19×, 4096 × 16384
/// 1.06×, from an 8193-wide matrix 1.21×; u16 2048² 1.11×, f16 4096² 0.96×,
/// 1.03×, 1.06×, 2048 × 8192 1.04×; 4–5-D u8 and f16 permutes 0.99–1.03×.
///
/// # Safety
///
/// As [`direct`]; `M · fj · E ≤ SCRATCH_BYTES`.
#[inline(always)]
unsafe fn through_scratch<K: Kernel>(dst: *mut u8, src: *const u8, fi: usize, fj: usize, sa: isize, db: isize) {
    let (e, m) = (K::E, K::M);
    let w = fj * e;
    let mut buf = MaybeUninit::<Scratch>::uninit();
    let b = buf.as_mut_ptr().cast::<u8>();
    let mut i = 0;
    while i < fi {
        // SAFETY: the strip's rows are `w` bytes of the block; the buffer holds
        // `m · w` bytes, each written before it is read.
        unsafe {
            for r in 0..m {
                let s = src.offset((i + r) as isize * sa);
                let d = b.add(r * w);
                let mut c = 0;
                while c < w {
                    std::ptr::copy_nonoverlapping(s.add(c), d.add(c), m * e);
                    c += m * e;
                }
            }
            let mut j = 0;
            while j < fj {
                K::micro::<false>(dst.add(i * e).offset(j as isize * db), b.add(j * e), w as isize, db);
                j += m;
            }
        }
        i += m;
    }
}

/// Most lines a line block has: 64 one-byte elements.
const BLOCK_LINES: usize = LINE;

/// A line block's buffer: one line per destination row.
#[repr(C, align(64))]
struct LineBuf([u8; BLOCK_LINES * LINE]);

/// [`tiles`] through a line buffer: each line block (a line of destination
/// columns × up to a line's elements of destination rows) is transposed into
/// an L1-resident buffer, whose lines are then streamed out one at a time.
///
/// # Safety
///
/// As [`tiles`] with `nt`.
#[inline(always)]
unsafe fn streamed<K: Kernel>(dst: *mut u8, src: *const u8, fi: usize, fj: usize, sa: isize, db: isize) {
    let (e, m) = (K::E, K::M);
    let l = line_block(e, m);
    debug_assert!(l == LINE / e && fi.is_multiple_of(l) && l <= BLOCK_LINES);
    let mut buf = MaybeUninit::<LineBuf>::uninit();
    let b = buf.as_mut_ptr().cast::<u8>();
    let mut j0 = 0;
    while j0 < fj {
        let nj = l.min(fj - j0);
        let mut i0 = 0;
        while i0 < fi {
            // SAFETY: the block's micro tiles lie inside the caller's block; the
            // buffer holds `nj ≤ BLOCK_LINES` lines, each written whole (`l`
            // elements) before it is read.
            unsafe {
                let s = src.offset(i0 as isize * sa + (j0 * e) as isize);
                let mut jj = 0;
                while jj < nj {
                    let mut ii = 0;
                    while ii < l {
                        K::micro::<false>(
                            b.add(ii * e + jj * LINE),
                            s.offset(ii as isize * sa).add(jj * e),
                            sa,
                            LINE as isize,
                        );
                        ii += m;
                    }
                    jj += m;
                }
                let d = dst.offset((i0 * e) as isize + j0 as isize * db);
                for r in 0..nj {
                    stream_line(d.offset(r as isize * db), b.add(r * LINE));
                }
            }
            i0 += l;
        }
        j0 += nj;
    }
}

/// Writes one line from `src` to `dst` with streaming stores.
///
/// # Safety
///
/// `src` readable and `dst` writable for a line, both line-aligned.
#[inline(always)]
unsafe fn stream_line(dst: *mut u8, src: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86-64 baseline; both ranges are a whole,
    // aligned line (the caller's contract).
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        let (s, d) = (src.cast::<__m128i>(), dst.cast::<__m128i>());
        let v = [
            _mm_load_si128(s),
            _mm_load_si128(s.add(1)),
            _mm_load_si128(s.add(2)),
            _mm_load_si128(s.add(3)),
        ];
        for (k, x) in v.into_iter().enumerate() {
            _mm_stream_si128(d.add(k), x);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller's.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, LINE)
    }
}

#[cfg(test)]
mod tests {
    use super::rows_crowd_l1_sets;

    #[test]
    fn rows_a_page_apart_crowd_one_set_and_shifted_rows_do_not() {
        // 32 rows a multiple of 4 KiB apart: one set; 2 KiB: two sets of 16.
        assert!(rows_crowd_l1_sets(8192, 32));
        assert!(rows_crowd_l1_sets(-4096, 16));
        assert!(rows_crowd_l1_sets(2048, 32));
        // One byte past a page (either way): a new set every 64 rows.
        assert!(rows_crowd_l1_sets(8193, 32));
        assert!(rows_crowd_l1_sets(-4097, 32));
        assert!(!rows_crowd_l1_sets(4097, 8));
        // 16 rows 2 KiB apart: 8 in each of two sets.
        assert!(!rows_crowd_l1_sets(2048, 16));
        // 8 rows in a set are as many as it has ways.
        assert!(!rows_crowd_l1_sets(8192, 8));
        assert!(!rows_crowd_l1_sets(1024, 32));
        assert!(!rows_crowd_l1_sets(8256, 32));
        assert!(!rows_crowd_l1_sets(8200, 32));
        assert!(!rows_crowd_l1_sets(256, 32));
    }
}
