//! Transposes (`PlanKind::Transpose`): blocked 2-D tiles of register
//! micro-transposes, batched over the other dims, straight into the
//! destination or through a staging tile.

use smallvec::SmallVec;

use super::elem::Elem;
use super::general::{gather, scatter};
use super::parallel::{Shared, for_each_segment, par_for};
use super::runs::{copy_run, store_fence};
use super::stage::{STAGE, with_stage};
use crate::copy::plan::{CopyPlan, INLINE_DIMS, PlanDim};

/// Largest transpose (bytes) done without a staging tile.
const DIRECT_MAX_BYTES: usize = 2 << 20;

/// Blocked transpose over (`dims[0]`: unit dst stride, `dims[k]`: unit src
/// stride); the other dims are a batch. Small copies transpose each L1-sized
/// tile straight into the destination. Larger ones transpose a bigger tile
/// into a contiguous staging buffer (no cache-set conflicts between
/// power-of-two rows) and write it out as contiguous destination runs,
/// streaming when `nt`. Tiles (batch-major, then source row blocks, then
/// source column blocks) are split across threads.
///
/// # Safety
///
/// As [`execute`](super::execute).
pub(super) unsafe fn transpose<T: Elem>(plan: &CopyPlan, k: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>();
    let m = T::MICRO;
    let a = plan.dims[0];
    let b = plan.dims[k];
    let batch: SmallVec<[PlanDim; INLINE_DIMS]> = plan
        .dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 0 && i != k)
        .map(|(_, d)| *d)
        .collect();
    // Small copies (≤ 2 MiB, cache-resident): 256 destination bytes × 64 source
    // bytes, straight into the destination. Larger: up to 512 destination bytes
    // × 2 KiB of source row, at most 256 KiB (L2-resident) of staging. Long runs
    // on both sides matter more than L1 residency once the data come from
    // DRAM: the hardware prefetchers need several lines of a page per visit,
    // and streaming stores want whole lines. A short side is taken whole and
    // the other grows to fill the tile.
    let direct = !nt && plan.bytes() <= DIRECT_MAX_BYTES;
    let (tile_dst, tile_src, tile_max) = if direct {
        (256, 64, STAGE)
    } else {
        (512, 2048, 256 << 10)
    };
    let base_i = (tile_dst / e / m).max(1) * m;
    let base_j = (tile_src / e / m).max(1) * m;
    let (bi, bj) = if b.len < base_j {
        let bj = b.len;
        (a.len.min((tile_max / (bj * e) / m).max(1) * m), bj)
    } else {
        let bi = a.len.min(base_i);
        let cap = (tile_max / (bi * e) / m).max(1) * m;
        (bi, b.len.min(base_j).min(cap))
    };
    let stage_bytes = if direct { 0 } else { bi * bj * e };
    let nbi = a.len.div_ceil(bi);
    let nbj = b.len.div_ceil(bj);
    let per_slice = nbi * nbj;
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (sa, db) = (a.src, b.dst);
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, plan.bytes(), |t0, t1| {
        with_stage(stage_bytes, |buf| {
            for_each_segment(&batch, per_slice, t0, t1, |dof, so, first, n| {
                for t in first..first + n {
                    let (jb, ib) = (t % nbj, t / nbj);
                    let (i0, j0) = (ib * bi, jb * bj);
                    let ni = bi.min(a.len - i0);
                    let nj = bj.min(b.len - j0);
                    let tb = ni * e; // staging row stride
                    // SAFETY: the tile's elements are elements of the plan; the
                    // staging buffer holds `ni * nj * e ≤ stage_bytes` bytes.
                    unsafe {
                        let dt = d.get().offset(dof + (i0 * e) as isize + j0 as isize * db);
                        let st = s.get().offset(so + i0 as isize * sa + (j0 * e) as isize);
                        if direct {
                            tile::<T>(dt, st, ni, nj, sa, db);
                            continue;
                        }
                        tile::<T>(buf, st, ni, nj, sa, tb as isize);
                        if db == tb as isize {
                            copy_run(dt, buf, tb * nj, nt);
                        } else {
                            for j in 0..nj {
                                copy_run(dt.offset(j as isize * db), buf.add(j * tb), tb, nt);
                            }
                        }
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// One `ni × nj` tile: `dst[i·E + j·db] = src[i·sa + j·E]`, micro tiles
/// row-block by row-block so each source line is consumed while cached.
///
/// # Safety
///
/// Every address formed for `i < ni`, `j < nj` is an element of its operand.
#[inline(always)]
unsafe fn tile<T: Elem>(dst: *mut u8, src: *const u8, ni: usize, nj: usize, sa: isize, db: isize) {
    let e = size_of::<T>();
    let m = T::MICRO;
    let (fi, fj) = (ni / m * m, nj / m * m);
    // SAFETY: all offsets below stay within the `ni × nj` tile.
    unsafe {
        let mut i = 0;
        while i < fi {
            let mut j = 0;
            while j < fj {
                T::micro(
                    dst.offset((i * e) as isize + j as isize * db),
                    src.offset(i as isize * sa + (j * e) as isize),
                    sa,
                    db,
                );
                j += m;
            }
            i += m;
        }
        if fj < nj {
            // Right strip: j in fj..nj, i in 0..fi.
            edge::<T>(dst.offset(fj as isize * db), src.add(fj * e), fi, nj - fj, sa, db);
        }
        if fi < ni {
            // Bottom strip: i in fi..ni, all j.
            edge::<T>(dst.add(fi * e), src.offset(fi as isize * sa), ni - fi, nj, sa, db);
        }
    }
}

/// Scalar tile remainder, longer extent innermost.
///
/// # Safety
///
/// As [`tile`].
#[inline(always)]
unsafe fn edge<T: Elem>(dst: *mut u8, src: *const u8, ni: usize, nj: usize, sa: isize, db: isize) {
    let e = size_of::<T>();
    // SAFETY: as the caller's.
    unsafe {
        if ni >= nj {
            for j in 0..nj {
                gather::<T>(dst.offset(j as isize * db), src.add(j * e), ni, sa);
            }
        } else {
            for i in 0..ni {
                scatter::<T>(dst.add(i * e), src.offset(i as isize * sa), nj, db);
            }
        }
    }
}
