//! The AVX-512 route's tiles whose source rows crowd the L2's sets: each
//! tile's rows copied one by one into a buffer first, and the tile
//! transposed from there ([`StagedRows`]).

use super::super::blocks::LINE;
use super::super::elem::Elem;
use super::extension::rows_crowd_l2_sets;
use super::{Kernels, tile};
use crate::copy::plan::PlanDim;

/// Bytes of each source row a staged tile copies at most: a page, where the
/// hardware prefetchers stop, so that none of the lines they fetch along a
/// row lands outside the copy. Against 1 KiB (in the measurements of
/// [`StagedRows`], grouping the fastest batch dim only): 32⁴ × 16 f32 43210
/// (2 KiB then) 1.02–1.04×, 64⁴ f32 3210 1.09–1.21×, 32⁵ f32 43210
/// 1.10–1.13×, 256³ f32 210 1.16× (not staged at all with 1 KiB: its rows
/// are 1 KiB long); 2 KiB and 8 KiB read about the same as 4. Reaching a
/// page through the next batch dim too, against the fastest alone, two
/// runs: 32⁴ × 16 f32 43210 (2 → 4 KiB) 1.05–1.09×, 32⁴ × 8 f64 1.09×, 32⁴ ×
/// 32 f16 1.05–1.07×, the others 0.96–1.03×.
const STAGED_ROW_MAX: usize = 4096;

/// Tiles of the AVX-512 route ([`super::Route::Avx512`]) whose source rows
/// start in one L2 set more often than it has ways ([`rows_crowd_l2_sets`]:
/// rows a multiple of the L2's set span apart, as in permutes that reverse
/// their dims, whose rows are a whole slice apart), and whose rows go on
/// along the fastest batch dim. The kernel reads a line of each of the
/// tile's rows, then the next line of each: the hardware prefetchers fetch
/// each row's next lines into one set, where the other rows' evict them
/// before they are read. Here each tile covers consecutive slices of that
/// batch dim, and of the next where it covers the whole of the first and
/// the next continues the rows (the tile covering every source column), up
/// to [`STAGED_ROW_MAX`] bytes of each row, which are copied row by row into
/// a buffer first: a row or two are read at a time, whole, and the
/// transposes read the buffer's lines, which crowd no set.
///
/// Emerald Rapids VM (2 MiB 16-way L2 a core), Python, from NumPy arrays
/// into a reused output, in-process A/B, best of eight alternated calls, two
/// threads, GB/s, the kernel's own reads → staged (the fastest batch dim
/// grouped only): 32⁴ × 16 f32 permuted 43210 (rows 2 MiB apart) 26.8–28.0
/// → 35.3–36.6, from rows 2 MiB + 128 KiB apart 27.8 → 35.8; 32⁴ × 8 f64
/// 33.3 → 42.0–42.1; 32⁴ × 32 f16 20.9–22.3 → 30.7–31.6; 32⁵ f32 33.2–35.4
/// → 38.9–41.0; 64⁴ f32 3210 28.8–30.3 → 37.9–40.5; 256³ f32 210 36.4 →
/// 42.3; with the next batch dim grouped too, 2-byte elements and bytes,
/// whose tiles are 128 rows (512 KiB staged): f16 256³ 210 18.1 → 29.6, 128
/// × 256² 21.3 → 30.9, 64 × 32⁴ 43210 16.0 → 26.7, u8 256 × 128 × 256 210
/// 19.9 → 27.8 (capped at 128 KiB a tile: 0.89–0.98× of that). The same
/// from rows that do not crowd (2 MiB plus a line, or plus 4 or 8 KiB
/// apart) 37.2–50.3 either way: those are not staged; the first
/// try, which staged them, lost there (0.88–0.92×). Nor are tiles of rows
/// that do not go on along a batch dim (2-D transposes): f32 1024 × 32768
/// staged a tile's 1 KiB of each row 0.93×. Prefetching the next tile's
/// first 4 to 12 rows into L2 while the tile is written out gained nothing
/// (0.93–1.06×). Not where the L2 has few ways (the Zen 4 VM's 8-way 1 MiB
/// one: the 43210 permutes above ran 1.3–1.5× faster without, see `transpose`).
#[derive(Clone, Copy)]
pub(super) struct StagedRows {
    /// Slices of the fastest batch dim a tile covers, and that dim's
    /// destination stride (bytes) before the grouping.
    inner: (usize, isize),
    /// Where the tile covers the whole fastest dim, slices of the next one
    /// (which continues the rows too) it covers, and that dim's destination
    /// stride; else `(1, 0)`.
    outer: (usize, isize),
}

/// The largest divisor of `len` no larger than `most` (at least 1).
fn divisor_within(len: usize, most: usize) -> usize {
    (1..=len.min(most)).rev().find(|&g| len.is_multiple_of(g)).unwrap_or(1)
}

impl StagedRows {
    /// Whether tiles of `bi` rows `a.src` bytes apart are staged; if so, the
    /// batch's first dims (the batch sorted by source stride) become the
    /// steps of whole groups. `nj` is the tile's source elements a row.
    pub(super) fn find(a: PlanDim, b: PlanDim, batch: &mut [PlanDim], bi: usize, nj: usize, e: usize) -> Option<Self> {
        if !rows_crowd_l2_sets(&[(a.len.min(bi), a.src)]) {
            return None;
        }
        let run = b.len * e;
        let continues = |d: &PlanDim, run: usize| d.src == run as isize;
        let first = match batch.first() {
            Some(d) if nj == b.len && continues(d, run) && run.is_multiple_of(LINE) => *d,
            _ => return None,
        };
        let g0 = divisor_within(first.len, STAGED_ROW_MAX / run);
        let whole = first.len * run;
        let outer = match batch.get(1) {
            Some(d) if g0 == first.len && continues(d, whole) => (divisor_within(d.len, STAGED_ROW_MAX / whole), d.dst),
            _ => (1, 0),
        };
        let g1 = outer.0;
        if g0 * g1 == 1 {
            return None;
        }
        let regroup = |d: &mut PlanDim, g: usize| {
            *d = PlanDim {
                len: d.len / g,
                src: d.src * g as isize,
                dst: d.dst * g as isize,
            }
        };
        regroup(&mut batch[0], g0);
        if g1 > 1 {
            regroup(&mut batch[1], g1);
        }
        Some(StagedRows {
            inner: (g0, first.dst),
            outer: if g1 > 1 { outer } else { (1, 0) },
        })
    }

    /// Slices a tile covers.
    fn group(&self) -> usize {
        self.inner.0 * self.outer.0
    }

    /// The buffer's row stride for tiles of `nj` elements a row: a line
    /// more than the rows' bytes, so that a micro tile's rows in it never
    /// share an L1 set.
    fn stride(&self, nj: usize, e: usize) -> usize {
        (nj * e * self.group()).next_multiple_of(LINE) + LINE
    }

    /// Bytes of buffer a tile of at most `bi × bj` elements needs.
    pub(super) fn stage_bytes(&self, bi: usize, bj: usize, e: usize) -> usize {
        bi * self.stride(bj, e)
    }

    /// Copies the tile's `ni` source rows (`nj` elements of each of
    /// `group` slices) into `buf`, then transposes each slice from there.
    ///
    /// # Safety
    ///
    /// As [`tile`]'s for each of the `group` slices (`dst` and `src` those
    /// of the first, the rest [`Self::find`]'s steps on); `buf` is writable
    /// for [`Self::stage_bytes`] of the copy's tile and line-aligned.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) unsafe fn tile<T: Elem>(
        &self,
        kernels: Kernels,
        dst: *mut u8,
        src: *const u8,
        ni: usize,
        nj: usize,
        sa: isize,
        db: isize,
        buf: *mut u8,
    ) {
        let e = size_of::<T>();
        let (run, w) = (nj * e * self.group(), self.stride(nj, e));
        for i in 0..ni {
            // SAFETY: row i's slices are `run` contiguous source bytes
            // (`find` grouped only slices that continue the rows); the buffer
            // holds `ni` rows of `w ≥ run` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.offset(i as isize * sa), buf.add(i * w), run) };
        }
        let ((n0, d0), (n1, d1)) = (self.inner, self.outer);
        let mut from = buf;
        for k1 in 0..n1 {
            for k0 in 0..n0 {
                // SAFETY: the slice's destination is the caller's; its source
                // is the buffer's copy of it, rows `w` bytes apart, each
                // starting a whole number of lines in (a slice's run is a
                // multiple of a line).
                unsafe {
                    let to = dst.offset(k0 as isize * d0 + k1 as isize * d1);
                    tile::<T>(kernels, to, from, ni, nj, w as isize, db, true, true, None);
                    from = from.add(nj * e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::caches::l2_sets;
    use super::super::super::elem::Elem;
    use super::super::{Kernels, avx512_has_kernel};
    use super::{LINE, PlanDim, STAGED_ROW_MAX, StagedRows};

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; LINE]);

    /// A batch dim of `len` slices `src` and `dst` bytes apart.
    fn dim(len: usize, src: isize, dst: isize) -> PlanDim {
        PlanDim { len, src, dst }
    }

    #[test]
    fn only_crowded_rows_that_go_on_along_the_batch_are_staged() {
        let (span, ways) = l2_sets();
        let rows = ways + 1;
        // Rows of 16 4-byte elements, going on along 256 slices.
        let (a, b) = (dim(rows, span as isize, 4), dim(16, 4, 4 << 20));
        let batch = [dim(256, 64, 4096), dim(3, 1 << 30, 1 << 20)];
        let mut grouped = batch;
        let staged = StagedRows::find(a, b, &mut grouped, rows, b.len, 4).expect("crowded rows staged");
        // A page of each row: 64 slices of 64 bytes, the batch dim stepping
        // a group at a time.
        let g = STAGED_ROW_MAX / 64;
        assert_eq!((staged.inner, staged.outer), ((g, 4096), (1, 0)));
        assert_eq!(grouped, [dim(256 / g, 64 * g as isize, 4096 * g as isize), batch[1]]);
        // A fastest dim shorter than a page, whose next one goes on along
        // the rows: all of the first, and of the second what fills the page.
        let short = [dim(16, 64, 4096), dim(12, 1024, 1 << 16), batch[1]];
        let mut grouped = short;
        let staged = StagedRows::find(a, b, &mut grouped, rows, b.len, 4).expect("crowded rows staged");
        assert_eq!((staged.inner, staged.outer), ((16, 4096), (4, 1 << 16)));
        assert_eq!(grouped, [dim(1, 1024, 1 << 16), dim(3, 4096, 1 << 18), batch[1]]);
        let unstaged = |a: PlanDim, b: PlanDim, batch: &[PlanDim], bi: usize, nj: usize| {
            let mut after = batch.to_vec();
            StagedRows::find(a, b, &mut after, bi, nj, 4).is_none() && after == batch
        };
        // Rows a line further apart each: every row in a set of its own.
        assert!(unstaged(dim(rows, a.src + LINE as isize, 4), b, &batch, rows, b.len));
        // Tiles of a set's worth of rows.
        assert!(unstaged(a, b, &batch, ways, b.len));
        // Tiles that cover part of each row: slices do not continue them.
        assert!(unstaged(a, b, &batch, rows, 8));
        // A batch whose fastest dim does not continue the rows, or none.
        assert!(unstaged(a, b, &[dim(256, 128, 4096), batch[1]], rows, b.len));
        assert!(unstaged(a, b, &[], rows, b.len));
        // A fastest dim of a prime length, with no dim after it to group.
        assert!(unstaged(a, b, &[dim(127, 64, 4096)], rows, b.len));
    }

    /// Staged tiles of `T` against the definition: 32 source rows a set span
    /// apart, each going on along 8 × 16 slices of 64 bytes (two groups of
    /// 8 × 8), into destination rows of 32 elements; the slices of the
    /// second batch dim are consecutive in the destination, those of the
    /// first 16 apart.
    fn check_staged_tiles<T: Elem>() {
        let e = size_of::<T>();
        let (span, _) = l2_sets();
        let (rows, per_row) = (32usize, LINE / e);
        let (n0, n1) = (8usize, 16usize);
        let db = rows * e; // two lines
        let slice = per_row * db;
        let (a, b) = (
            dim(rows, span as isize, e as isize),
            dim(per_row, e as isize, db as isize),
        );
        let mut batch = [
            dim(n0, LINE as isize, (n1 * slice) as isize),
            dim(n1, (n0 * LINE) as isize, slice as isize),
        ];
        let staged = StagedRows::find(a, b, &mut batch, rows, per_row, e).expect("crowded rows staged");
        assert_eq!((staged.inner.0, staged.outer.0), (n0, n1 / 2));
        let src: Vec<u8> = (0..rows * span).map(|k| (k * 7 + k / 251) as u8).collect();
        let mut dst_lines = vec![Line([0xA5; LINE]); n0 * n1 * slice / LINE];
        let mut buf = vec![Line([0; LINE]); staged.stage_bytes(rows, per_row, e).div_ceil(LINE)];
        let kernels = if avx512_has_kernel(e, false) {
            Kernels::Avx512
        } else {
            Kernels::Baseline
        };
        let (d, s, bp) = (
            dst_lines.as_mut_ptr().cast::<u8>(),
            src.as_ptr(),
            buf.as_mut_ptr().cast::<u8>(),
        );
        for g in 0..batch[1].len {
            // SAFETY: each group's slices lie in `src` (rows `span` apart, 8
            // KiB of each read) and `dst` (line-aligned, rows two lines
            // apart); `buf` holds the stage's bytes.
            unsafe {
                let (to, from) = (d.offset(g as isize * batch[1].dst), s.offset(g as isize * batch[1].src));
                staged.tile::<T>(kernels, to, from, rows, per_row, a.src, b.dst, bp)
            };
        }
        // SAFETY: `dst_lines` is a run of lines without padding.
        let dst = unsafe { std::slice::from_raw_parts(d, dst_lines.len() * LINE) };
        for k1 in 0..n1 {
            for k0 in 0..n0 {
                for j in 0..per_row {
                    for i in 0..rows {
                        let at = i * e + j * db + (k0 * n1 + k1) * slice;
                        let from = i * span + (k1 * n0 + k0) * LINE + j * e;
                        assert_eq!(
                            dst[at..at + e],
                            src[from..from + e],
                            "e = {e}: ({i}, {j}) of slice ({k0}, {k1})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn staged_tiles_move_every_element() {
        let (span, ways) = l2_sets();
        if ways >= 32 || span < 128 * LINE {
            println!("SKIP: 32 rows a set span ({span} bytes) apart do not crowd this L2's {ways} ways");
            return;
        }
        check_staged_tiles::<u16>();
        check_staged_tiles::<u32>();
        check_staged_tiles::<u64>();
    }
}
