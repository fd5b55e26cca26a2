//! Transposes whose tile sides are short runs, extended by batch dims: each
//! tile is a group of whole slices ([`Extension`]), staged so that both its
//! source and destination runs are long.

use smallvec::SmallVec;

use super::super::blocks::LINE;
use super::super::caches::{l2_has_few_ways, l2_sets};
use super::super::elem::Elem;
use super::super::parallel::{Shared, for_each_segment, par_for_slow, slow_workers};
use super::super::runs::{copy_run, store_fence};
use super::super::stage::with_stage;
use super::prefetches::NextTile;
use super::{Kernels, avx2_enabled, continuing_both_sides, on_32_bytes, tile};
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Longest runs (bytes) of a tile side that batch dims may extend.
const EXTEND_MAX_RUN: usize = 1024;
/// Destination runs an extension aims at (bytes, at most), and source runs.
/// 64⁴ f32 permute 3021 on two cores (one run, GB/s): 21 unextended, 31 with
/// 512-byte destination runs, 18 with 1 KiB; 32⁴ × 16 f32 permute 43210:
/// 8.7 unextended, 14.7 with 512 × 256 bytes, 10.8 with 256 × 256 (now 22
/// with 256- or 1024-byte source runs, 21 with 2 KiB).
const EXTENDED_DST_RUN: usize = 512;
const EXTENDED_SRC_RUN: usize = 256;
/// Source runs an extension aims at when no batch dim continues the
/// destination runs: up to 8 KiB, as long as a tile's source rows hold at
/// most 256 KiB (the next tile's are prefetched into L2 meanwhile), and at
/// least 1 KiB. 03142-like permutes read whole source rows then, where the
/// rows are up to 8 KiB: reading half of each row ran at half the speed
/// (likely the hardware prefetchers fetching the other half, which the next
/// tiles do not read). Reading alone (C, two cores, Zen 3 VM), 32 rows 2 KiB
/// apart: 1 KiB of each 8.5–9.5 GB/s, 2 KiB 16–18, a sequential read 17–20.
/// Against 1 KiB runs, two cores, Python, into a reused output, the median
/// of 13–15 paired calls in one process:
/// - whole rows: 32⁵ f16 (the bench's, 2 KiB rows) 1.05×, 1.19×, 1.12×; 32⁵
///   f32 (4 KiB) 1.41×, 1.48×; 16 × 64 × 32 × 64 × 16 f32 1.42×; 8 × 16 ×
///   32 × 64 × 64 f16 (8 KiB) 1.08×; 32 × 32 × 64 × 32 × 64 u8 1.14×;
/// - 31 × 29 × 33 × 31 × 30 f16 1.14×, u8 1.00×; 7 × 61 × 67 × 59 × 13 f32
///   04321 1.14×; 16 × 64 × 8 × 64 × 8 f64 1.05×; 32 × 64 × 16 × 64 × 16
///   f32 1.01×; small ones (not streamed) 2 × 16⁴ f16 1.02×, 4 × 32 × 8 ×
///   32 × 8 f32 1.01×.
///
/// First measured on 32⁵ f16 (three runs each, median GB/s, memcpy 56): 14.4
/// unextended; with its contiguous destination runs written in one copy,
/// 27.5 with 256-byte source runs, 28.3 with 512, 28.7 with 1 KiB, 28.2 with
/// 2 KiB.
const EXTENDED_SRC_RUN_ALONE: usize = 8 << 10;
const EXTENDED_SRC_RUN_ALONE_MIN: usize = 1 << 10;
const EXTENDED_SRC_TILE_ALONE: usize = 256 << 10;
/// Tiles each worker of a split copy gets at least, where no batch dim
/// continues the destination runs: the source tile shrinks to a quarter of a
/// worker's share ([`alone_tile`]), down to the 1 KiB runs. A copy of one
/// or two such tiles ran on one thread (each a `par_for` of its own in
/// [`extended_split`]). Zen 2 VM, two cores, Python, into a new output, the
/// best of three alternated processes, speed-up: 31 × 29 × 27 × 3 f32
/// permuted 3120 (291 KiB, two tiles before) 1.71×, × 2 1.59×, 33 × 35 × 37 ×
/// 4 u16 3120 1.91×; 27 other permutes 0.98–1.01× (61 × 67 × 59 × 3 f64, too
/// noisy to tell, 0.89–1.09×); two tiles a worker 1.80×, 1.59×, 1.63×, eight
/// 1.64×, 1.58×, 1.87×.
const EXTENDED_TILES_A_WORKER: usize = 4;

/// Bytes of source a tile extended along the source only reads at most
/// ([`EXTENDED_SRC_TILE_ALONE`], [`EXTENDED_TILES_A_WORKER`]).
fn alone_tile(bytes: usize) -> usize {
    match slow_workers(bytes) {
        1 => EXTENDED_SRC_TILE_ALONE,
        workers => EXTENDED_SRC_TILE_ALONE.min(bytes / (EXTENDED_TILES_A_WORKER * workers)),
    }
}

/// When batch dims extend both sides of a tile and another batch dim is
/// left (five or more dims), consecutive tiles read on along the same source
/// rows, as the 2-D routes' do, instead of continuing the destination runs
/// from new source rows; and the runs grow to 1 KiB × 512 bytes as long as a
/// tile keeps at most these many source and destination rows. Two cores,
/// median of five alternated runs each, into a reused destination, against
/// the destination order with 512 × 256-byte runs:
/// - 32⁴ × 16 f32 43210: source order 1.20–1.37×, with the longer runs
///   1.25–1.42× (the bench: 23.1 → 28.5 GB/s, memcpy 56);
/// - 32⁵ f16 43210: 1.41×, but 1.05–1.13× with 1 KiB × 512 (512 source rows);
/// - 32⁵ u8: 1.17×, 1.08× with 256 × 128-byte runs (shorter runs lose);
/// - 16⁶ f32 543210: 1.46–1.52×, longer runs 1.52–1.59×;
/// - 48 × 40 × 36 × 32 × 8 f32 43210: 1.23–1.31×, longer runs 1.35–1.43×;
/// - 32⁴ × 16 f64 43210: 1.09–1.12×.
///
/// Four dims (nothing left over) do not gain: 64⁴ f16 and f32 3210 0.93–1.00×,
/// 64 × 32 × 64 × 32 f32 3210 0.86–0.94×.
const BOTH_MAX_SRC_ROWS: usize = 256;
const BOTH_MAX_DST_ROWS: usize = 128;
/// Source-order tiles where the L2 has few ways ([`l2_has_few_ways`]) and
/// the tile's source rows at the runs above would crowd its sets
/// ([`rows_crowd_l2_sets`]; power-of-two dims, rows a multiple of the set
/// span apart): 512-byte destination runs (fewer source rows) × 1 KiB source
/// runs, the tile staged whole ([`SOURCE_ORDER_STAGE`]) and the next tile
/// not prefetched. Where a set holds 8 of the tile's 256 source rows, one
/// `k2` at a time read one line of each row, all in one set: 8 misses in
/// flight at most, the rest evicting each other, and the prefetched next
/// tile with them. Staged whole, each row's 16 lines of a micro tile's rows
/// are in flight at once, in 16 sets. Zen 2 VM (8-way 512 KiB L2), two cores:
/// - `devtensor bench`, 32⁴ × 16 f32 43210, % of memcpy, two runs each:
///   38.9–40.7 → 64.2–68.3; staged whole with the old runs 45–50, and
///   without the prefetch 54–56; 256 × 1024, 512 × 2048 and 1024 × 1024
///   bytes 58, 63–67 and 53–54;
/// - Python, into a new output, the best of two processes, speed-up: 32⁵
///   f16 43210 1.66×, u8 2.22×, 16⁶ f32 543210 1.54×, 16 × 64 × 32 × 64 × 16
///   f32 1.52×, 48 × 40 × 36 × 32 × 8 f32 1.56×, 16⁵ f32 1.05×; 32⁴ × 16
///   f64 0.93–0.95× (2 KiB source runs: 1.01×).
const CROWDED_DST_RUN: usize = 512;
const CROWDED_SRC_RUN: usize = 1024;

/// Most bytes of a source-order tile staged at once where the L2 has few
/// ways (the whole tile, mostly; one `k2` at a time elsewhere, see
/// [`extended`]): its source rows are read along `n2` runs, not one. Zen 2
/// VM, two cores, Python, into a new output, the best of two processes,
/// speed-up, rows that do not crowd the L2's sets: 8⁵ f32 43210 1.40×, 2 ×
/// 16⁴ f16 1.98×, 16⁵ u8 2.67×, 4 × 32 × 8 × 32 × 8 f32 1.41×, 12 × 10 × 8
/// × 16 × 8 f32 1.69×, 9 × 10 × 11 × 12 × 13 f32 1.69×, 24 × 20 × 18 × 16
/// × 8 f64 1.04×, 31 × 33 × 29 × 31 × 16 f32 1.00×.
const SOURCE_ORDER_STAGE: usize = 128 << 10;

/// The largest divisor `n` of `len` that keeps `run · n` within `target`
/// (at least 1).
fn grow(len: usize, run: usize, target: usize) -> usize {
    (1..=len.min(target / run.max(1)))
        .rev()
        .find(|n| len.is_multiple_of(*n))
        .unwrap_or(1)
}

/// Indices of a batch dim of `len` that extend source runs of `run` bytes
/// toward `target` where tiles are not walked in source order: [`grow`]'s
/// divisor, unless the runs are shorter than a line and the divisor is half
/// or less of the most that fit (`len` prime or of few divisors). Then the
/// most that fit, and the dim is split into whole blocks and a shorter last
/// one ([`extended_split`]); a prime `len` left such runs unextended. Two
/// cores, Python, into a reused output, the median of 12 paired calls in one
/// process, speed-up over the divisor:
/// - 43210: 31 × 37 × 29 × 41 × 7 f32 1.65×, 1.73×; 31 × 29 × 33 × 31 × 6
///   f64 1.72×, 1.90×; 04321: 7 × 61 × 67 × 59 × 13 f32 1.56×; 03142: 31 × 29
///   × 33 × 31 × 30 f16 1.50×, 1.53×, u8 0.98×;
/// - where destination runs are extended too, but the tiles are not walked in
///   source order (Zen 2 VM, Python, into a new output, the best of three
///   alternated processes): 33 × 35 × 37 × 4 u16 3210 (source runs of 8
///   bytes, 37 prime) 2.77×; 121 other permutes of 2 to 4 channels, 81 of
///   them of prime dims, 0.96–1.04×;
/// - where destination runs are extended too and the tiles walked in source
///   order, split source runs lost: 31 × 33 × 29 × 31 × 15 f32 43210 0.86×,
///   × 16 0.94×;
///   so did runs of a line or more (61 × 67 × 59 × 63 f32 3021: 0.71×) and
///   split destination runs (61 × 67 × 59 × 3 f32 3210 0.34×).
fn block(len: usize, run: usize, target: usize) -> usize {
    let fit = (target / run.max(1)).clamp(1, len);
    let divisor = grow(len, run, target);
    if run >= LINE || 2 * divisor > fit { divisor } else { fit }
}

/// Bytes of destination an extended tile writes in one piece where its
/// `a × b` slices are contiguous there and no batch dim continues its
/// destination runs (the slices' destination rows are consecutive): a
/// batch dim that continues the slices joins up to this many bytes of
/// them, where a slice is a quarter of it or less. Each piece is one
/// contiguous write among pieces far apart, and short ones cost the memory
/// more than their bytes. 03142 permutes, two cores, Python, into a reused
/// output, the median of 11–13 paired calls in one process, speed-up over
/// one slice a piece:
/// - 512-byte slices (32 × 64 × 16 × 64 × 16 f16): 1 KiB pieces 1.23×, 2
///   KiB 1.40×, 4 KiB 1.53×, 1.22×, 1.15×, 8 KiB 1.45×; 2 × 16⁴ f16 (4
///   KiB, not streamed) 1.12×; 32 × 64 × 32 × 64 × 16 u8 1.01×;
/// - 1 KiB slices (that shape in f32): 2 KiB 1.19×, 4 KiB 1.26×, 1.05×,
///   1.05×, 8 KiB 1.19×; 16 × 64 × 8 × 64 × 8 f64 1.13×; 4 × 32 × 8 × 32 ×
///   8 f32 (not streamed) 1.08×;
/// - 2 KiB slices, left alone: the bench's 32⁵ f16 4 KiB 0.98×, 1.02×,
///   1.01×, 1.15×, 0.95×, 8 KiB 0.97×, 1.04×, 1.07×, 1.09×.
const EXTENDED_DST_PIECE: usize = 4096;

/// Batch dims that continue a short tile side: `da` has the destination
/// stride of a whole `a` run (destination runs grow `da.1`-fold), `sb` the
/// source stride of a whole `b` run (source runs grow `sb.1`-fold), `ds`
/// the destination stride of a whole `a × b` slice where the slice is
/// contiguous there and `da` is none ([`EXTENDED_DST_PIECE`]). Each as
/// (batch index, indices per tile).
#[derive(Clone, Copy)]
pub(super) struct Extension {
    da: Option<(usize, usize)>,
    sb: Option<(usize, usize)>,
    ds: Option<(usize, usize)>,
    /// Tiles walked in source order ([`BOTH_MAX_SRC_ROWS`]).
    source_order: bool,
}

impl Extension {
    pub(super) fn find<T: Elem>(
        a: PlanDim,
        b: PlanDim,
        batch: &[PlanDim],
        nt: bool,
        bytes: usize,
    ) -> Option<Extension> {
        let e = size_of::<T>();
        let (ra, rb) = (a.len * e, b.len * e);
        if ra > EXTEND_MAX_RUN || rb > EXTEND_MAX_RUN {
            return None;
        }
        // A dim that continues the runs of both sides goes to the source's
        // where source runs are narrower than a micro tile: there the
        // extension's groups reach the micro tiles. Python, µs, destination
        // side → source side (torch): 31 × 29 × 27 × 3 f32 permuted 0321
        // 38.2 → 17.2 (18.0), 3021 36.8 → 17.5, 1320 37.2 → 17.4; 29 × 27 × 3
        // f32 210 2.32 → 1.13 (NumPy 1.09).
        let to_source = (b.len < T::micro_len(avx2_enabled()))
            .then(|| continuing_both_sides(a, b, batch, e))
            .flatten();
        let da = batch
            .iter()
            .enumerate()
            .position(|(k, c)| c.dst == ra as isize && to_source != Some(k))
            .map(|k| (k, grow(batch[k].len, ra, EXTENDED_DST_RUN)))
            .filter(|&(_, n)| n > 1);
        let src_run = if da.is_some() {
            EXTENDED_SRC_RUN
        } else {
            (alone_tile(bytes) / a.len.max(1)).clamp(EXTENDED_SRC_RUN_ALONE_MIN, EXTENDED_SRC_RUN_ALONE)
        };
        let sb = batch
            .iter()
            .enumerate()
            .position(|(k, c)| c.src == rb as isize && da.is_none_or(|(ka, _)| ka != k))
            .map(|k| match da {
                // Tiles in source order (both sides extended, a batch dim
                // left: below) keep whole divisors.
                Some(_) if batch.len() >= 3 => (k, grow(batch[k].len, rb, src_run)),
                _ => (k, block(batch[k].len, rb, src_run)),
            })
            .filter(|&(_, n)| n > 1);
        if let (Some((ka, _)), Some((kb, _))) = (da, sb)
            && batch.len() >= 3
        {
            // Both sides extended, tiles walked in source order: longer runs,
            // as long as a tile keeps its rows (see [`BOTH_MAX_SRC_ROWS`]).
            let mut dst_run = (BOTH_MAX_SRC_ROWS / a.len * ra).clamp(EXTENDED_DST_RUN, 2 * EXTENDED_DST_RUN);
            let mut src_run = (BOTH_MAX_DST_ROWS / b.len * rb).clamp(EXTENDED_SRC_RUN, 2 * EXTENDED_SRC_RUN);
            let n1 = grow(batch[ka].len, ra, dst_run);
            if nt && l2_has_few_ways() && rows_crowd_l2_sets(&[(a.len, a.src), (n1, batch[ka].src)]) {
                (dst_run, src_run) = (CROWDED_DST_RUN, CROWDED_SRC_RUN);
            }
            return Some(Extension {
                da: Some((ka, grow(batch[ka].len, ra, dst_run))),
                sb: Some((kb, grow(batch[kb].len, rb, src_run))),
                ds: None,
                source_order: true,
            });
        }
        // Slices narrower than a micro tile are staged in groups
        // ([`extended`]), whose staging leaves no room for joined slices.
        let slice = ra * b.len;
        let joinable = da.is_none()
            && b.dst == ra as isize
            && 4 * slice <= EXTENDED_DST_PIECE
            && b.len >= T::micro_len(avx2_enabled());
        let ds = batch
            .iter()
            .enumerate()
            .position(|(k, c)| joinable && c.dst == slice as isize && sb.is_none_or(|(kb, _)| kb != k))
            .map(|k| (k, grow(batch[k].len, slice, EXTENDED_DST_PIECE)))
            .filter(|&(_, n)| n > 1);
        (da.is_some() || sb.is_some()).then_some(Extension {
            da,
            sb,
            ds,
            source_order: false,
        })
    }
}

/// [`extended`] where the block of the dim that extends source runs does
/// not divide its length ([`block`]): its whole blocks, then the rest, one
/// shorter block (or no extension where one index is left).
///
/// # Safety
///
/// As [`execute`](super::super::execute).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn extended_split<T: Elem>(
    a: PlanDim,
    b: PlanDim,
    batch: SmallVec<[PlanDim; INLINE_DIMS]>,
    ext: Extension,
    dst: *mut u8,
    src: *const u8,
    nt: bool,
    bytes: usize,
) {
    let Some((k, n)) = ext.sb.filter(|&(k, n)| !batch[k].len.is_multiple_of(n)) else {
        // SAFETY: forwarded.
        return unsafe { extended::<T>(a, b, batch, ext, dst, src, nt, bytes) };
    };
    let c = batch[k];
    let whole = c.len / n * n;
    let rest = c.len - whole;
    let mut head = batch.clone();
    head[k].len = whole;
    let mut tail = batch;
    tail[k].len = rest;
    let tail_ext = Extension {
        sb: (rest > 1).then_some((k, rest)),
        ..ext
    };
    // SAFETY: the two parts are the plan's elements with index `0..whole`
    // and `whole..c.len` along batch dim `k`; each extension divides its dim.
    unsafe {
        extended::<T>(a, b, head, ext, dst, src, nt, bytes / c.len * whole);
        let (dst, src) = (dst.offset(whole as isize * c.dst), src.offset(whole as isize * c.src));
        extended::<T>(a, b, tail, tail_ext, dst, src, nt, bytes / c.len * rest);
    }
}

/// A transpose whose short tile sides are extended by batch dims
/// ([`Extension`]): each tile is the whole `a × b` slice for `n1 × n2` index
/// pairs of the two extending dims, staged so that the destination runs are
/// `n1` slices long, and read `n2` slices along the source rows. The next
/// tile's source is prefetched while this one is written out: its rows are
/// many pages apart, one or a few lines each, which the hardware prefetchers
/// do not follow (64⁴ f32 permute 3021: 21 GB/s without, 29–31 with). Not
/// when the copy does not stream (`nt`), and its source is taken to be in
/// cache: there the prefetches' address arithmetic costs more than it hides
/// (Python, alternated runs: 32³ f32 permute 210, rows sharing L1 sets,
/// 10.4–11.1 GB/s with, 19.5–26.6 without; 96³ 21–23 → 30–39, 4 × 512 × 384
/// batched f32 34–36 → 41–45).
///
/// # Safety
///
/// As [`execute`](super::super::execute).
#[allow(clippy::too_many_arguments)]
unsafe fn extended<T: Elem>(
    a: PlanDim,
    b: PlanDim,
    mut batch: SmallVec<[PlanDim; INLINE_DIMS]>,
    ext: Extension,
    dst: *mut u8,
    src: *const u8,
    nt: bool,
    bytes: usize,
) {
    let e = size_of::<T>();
    let zero = PlanDim { len: 1, src: 0, dst: 0 };
    let mut take = |x: Option<(usize, usize)>| match x {
        Some((k, n)) => {
            let c = batch[k];
            batch[k] = PlanDim {
                len: c.len / n,
                src: c.src * n as isize,
                dst: c.dst * n as isize,
            };
            (PlanDim { len: n, ..c }, n)
        }
        None => (zero, 1),
    };
    let (c1, n1) = take(ext.da);
    let (c2, n2) = take(ext.sb);
    let (c3, n3) = take(ext.ds);
    if ext.source_order {
        // Stable: ties keep their destination order.
        batch.sort_by_key(|d| d.src.unsigned_abs());
    }
    let tb = n1 * a.len * e; // one destination run
    // The staging row stride: for elements of 1 and 2 bytes, a run padded to
    // whole lines where the runs are written one by one (not as one
    // contiguous copy) and the padding is at most an eighth, so that the
    // micro tiles' stores do not split lines. Python, as [`tile`]'s figures,
    // µs, with its overlapped edges: 127 × 131 × 5 u16 permuted 210 (254-byte
    // runs) 14.2–14.4 → 12.8–13.1, u8 9.7–9.9 → 8.5–9.0, 300 × 200 × 6 f16
    // 26.9–27.3 → 24.7–25.4. Not where the padding is more (40 × 50 × 60 u8,
    // 40-byte runs: 13.2–13.6 → 13.6–13.9), nor for wider elements, whose
    // small slices the group staging below takes (17 × 19 × 23 × 2 f32
    // permuted 3210: 6.8–6.9 → 7.4; 31 × 29 × 27 × 3: 18.4–18.6 → 19.1–20.9).
    let padded = tb.next_multiple_of(LINE);
    let ts = if e <= 2 && b.dst != tb as isize && padded - tb <= tb / 8 {
        padded
    } else {
        tb
    };
    // AVX2 micro tiles where every 32-byte access they make is aligned (the
    // staging buffer is line-aligned): 32⁴ × 16 f32 permute 43210 24.5 → 26
    // GB/s, 64⁴ permute 3021 47 → 50. Bytes take them at any alignment (their
    // loads are 16 bytes wide, see `tiles_take_avx2`) where a slice holds a
    // whole micro tile: Zen 3 VM, two cores, in-process A/B, best of 40–60
    // alternated calls, speed-up, source 16 bytes off a line (1 byte, 8):
    // 64³ u8 reversed 1.32–1.35× (1.40×, 1.17×), 96³ 1.35× (1.18×, 1.15×),
    // 128² × 64 1.40× (1.17×, 1.16×), 32⁵ permuted 43210 1.29× (1.36×,
    // 1.33×), 64⁴ 3021 1.14× (1.14×, 1.18×), 256² × 32 210 0.99× (3 bytes
    // off 1.20×); 0.96–1.04× on 16⁵ and 31 × 29 × 33 × 31 × 30 43210, 40 ×
    // 50 × 60 and 200 × 30 × 40 210, 33 × 35 × 37 × 4 3120. Slices under a
    // micro tile keep the baseline's: with AVX2's they are staged in groups
    // (below), which lost on 16⁵ u8 43210 from unaligned sources (0.24×).
    let m = T::micro_len(true);
    let aligned = on_32_bytes([src as isize, a.src, c1.src, c2.src, c3.src, tb as isize]);
    let whole_micro_tiles = a.len >= m && b.len >= m;
    let avx2 = avx2_enabled() && (aligned || (size_of::<T>() == 1 && whole_micro_tiles));
    let kernels = if avx2 { Kernels::Avx2 } else { Kernels::Baseline };
    // One `k2` at a time: its `b.len` destination runs are staged, then
    // written out, and the staging stays in L1 (Zen 5 VM, 16-way L2: 32⁴ ×
    // 16 f32 permute 43210, 1 KiB × 512-byte runs, 128 KiB staged at once
    // before: 27.7 → 29.0 GB/s, five alternated runs; 0.98–1.04× on eleven
    // other 4–6-D permutes). Not source-order tiles where the L2 has few
    // ways, staged whole ([`SOURCE_ORDER_STAGE`]).
    // Unless a slice is narrower than a micro tile: then `group` of them
    // (as many as 32 KiB of staging holds, the last group of `n2` shorter)
    // are staged at once, one tile of `group · b.len` source columns (the
    // extension continues the source runs: column `c` is `c · e` bytes
    // along), which the micro tiles take, instead of `b.len` scalar gathers
    // from rows far apart for each (a 64³ × 2 f32 tensor reversed, Python,
    // two alternated runs: 3.0–3.2 → 26.3–26.5 GB/s). Groups were a divisor
    // of `n2` before, one slice where `n2` is prime: against that, paired
    // calls, 61 × 67 × 59 × 13 u8 permuted 3021 3.3×, × 7 f16 5.2×, 61 × 67
    // × 59 × 3 f32 3210 3.0×; 64³ × 2 f32 3210 1.00×.
    let whole_source_order = ext.source_order && l2_has_few_ways();
    let group = if b.len < T::micro_len(avx2) {
        ((32 << 10) / (ts * b.len)).clamp(1, n2)
    } else if whole_source_order {
        (SOURCE_ORDER_STAGE / (ts * b.len)).clamp(1, n2)
    } else {
        1
    };
    debug_assert!(group == 1 || c2.src == (b.len * e) as isize);
    debug_assert!(n3 == 1 || (group == 1 && b.dst == tb as isize));
    let stage_bytes = ts * b.len * group * n3;
    // Not where a source-order tile staged whole has rows that crowd the L2
    // ([`CROWDED_DST_RUN`]): the next tile's lines would evict each other
    // and this one's.
    let prefetch_next = !(whole_source_order && rows_crowd_l2_sets(&[(a.len, a.src), (n1, c1.src), (n3, c3.src)]));
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (sa, db) = (a.src, b.dst);
    let (d, s) = (Shared(dst), Shared(src));
    par_for_slow(slices, bytes, |t0, t1| {
        with_stage(stage_bytes, |buf| {
            // The next slice's source lines, refilled for each slice.
            let mut next: SmallVec<[NextTile; 8]> = SmallVec::new();
            for_each_segment(&batch, 1, t0, t1, |dof, so, _, _| {
                // SAFETY: every sub-tile is an `a × b` slice of the plan; the
                // staging buffer holds the `b.len` rows of `tb` bytes of each
                // of `group` `k2`s (their columns `e` bytes apart), or of each
                // of `n3` `k3`s (`group` is then 1); with `db == tb` the
                // `b.len` destination runs of a `k2` are the contiguous `b.len
                // · tb` bytes from its first, and those of its `n3` `k3`s the
                // `n3 · b.len · tb` bytes from the first's (`c3.dst` is a
                // slice's bytes).
                unsafe {
                    let stage = |k2: usize, group: usize| {
                        for k3 in 0..n3 {
                            for k1 in 0..n1 {
                                let st = s
                                    .get()
                                    .offset(so + k1 as isize * c1.src + k2 as isize * c2.src + k3 as isize * c3.src);
                                tile::<T>(
                                    kernels,
                                    buf.add(k1 * a.len * e + k3 * b.len * ts),
                                    st,
                                    a.len,
                                    group * b.len,
                                    sa,
                                    ts as isize,
                                    false,
                                    false,
                                    None,
                                );
                            }
                        }
                    };
                    // The next slice along the fastest batch dim (a guess
                    // where that dim wraps: a prefetch is only a hint), for
                    // each `k1` and `k3`: `a.len` rows of `n2` source runs.
                    // One step a destination run written out.
                    next.clear();
                    if nt && prefetch_next {
                        for k3 in 0..n3 {
                            for k1 in 0..n1 {
                                let at = s
                                    .get()
                                    .wrapping_offset(so + batch[0].src + k1 as isize * c1.src + k3 as isize * c3.src);
                                next.push(NextTile::new(at, a.len, n2 * b.len * e, sa, n2 * b.len));
                            }
                        }
                    }
                    let mut write = |k2: usize, buf: *mut u8| {
                        let dt = d.get().offset(dof + k2 as isize * c2.dst);
                        if db == tb as isize {
                            // Contiguous destination runs: one copy of them all.
                            for _ in 0..b.len {
                                next.iter_mut().for_each(NextTile::step);
                            }
                            copy_run(dt, buf, n3 * b.len * tb, nt);
                            return;
                        }
                        for j in 0..b.len {
                            next.iter_mut().for_each(NextTile::step);
                            copy_run(dt.offset(j as isize * db), buf.add(j * ts), tb, nt);
                        }
                    };
                    for k2 in (0..n2).step_by(group) {
                        let group = group.min(n2 - k2);
                        stage(k2, group);
                        for g in 0..group {
                            write(k2 + g, buf.add(g * b.len * ts));
                        }
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// Whether the rows of a tile's source, `len` rows `stride` bytes apart for
/// each `(len, stride)` (the first 1024 of them), start in one L2 set more
/// often than it has ways ([`l2_sets`]), so that the rows' lines at one
/// offset cannot all be in the L2 at once.
pub(super) fn rows_crowd_l2_sets(dims: &[(usize, isize)]) -> bool {
    let (span, ways) = l2_sets();
    let mut sets: SmallVec<[usize; 256]> = smallvec::smallvec![0];
    for &(len, stride) in dims {
        let n = sets.len();
        for k in 1..len {
            if sets.len() >= 1024 {
                break;
            }
            let step = (k as isize * stride).rem_euclid(span as isize) as usize;
            for r in 0..n {
                sets.push((sets[r] + step) % span);
            }
        }
    }
    sets.iter_mut().for_each(|o| *o /= LINE);
    sets.sort_unstable();
    sets.chunk_by(|x, y| x == y).any(|c| c.len() > ways)
}

#[cfg(test)]
mod tests {
    use super::{
        EXTENDED_SRC_RUN_ALONE_MIN, EXTENDED_TILES_A_WORKER, Extension, LINE, PlanDim, l2_sets, rows_crowd_l2_sets,
        slow_workers,
    };

    /// A copy split across threads gets several extended tiles a worker: 31
    /// × 29 × 27 × 3 f32 permuted 3120 (a 31 × 3 slice, 783 batch indices
    /// that continue the source runs, 291 KiB) got two before, one thread's.
    #[test]
    fn extended_tiles_leave_every_worker_several() {
        let (a, b) = (
            PlanDim {
                len: 31,
                dst: 4,
                src: 2349 * 4,
            },
            PlanDim {
                len: 3,
                dst: 24273 * 4,
                src: 4,
            },
        );
        let batch = [PlanDim {
            len: 783,
            dst: 31 * 4,
            src: 3 * 4,
        }];
        let bytes = 31 * 29 * 27 * 3 * 4;
        let ext = Extension::find::<u32>(a, b, &batch, false, bytes).expect("extended");
        let (_, n) = ext.sb.expect("source runs extended");
        let tile = 31 * n * 12;
        let workers = slow_workers(bytes);
        let most = (bytes / (EXTENDED_TILES_A_WORKER * workers)).max(31 * EXTENDED_SRC_RUN_ALONE_MIN);
        assert!(
            workers == 1 || tile <= most,
            "{tile}-byte tiles of {bytes} bytes on {workers} workers"
        );
    }

    #[test]
    fn rows_crowd_the_l2_sets_past_its_ways() {
        let (span, ways) = l2_sets();
        let s = span as isize;
        // A set's worth of rows in one set, then one more, either way.
        assert!(!rows_crowd_l2_sets(&[(ways, s)]));
        assert!(rows_crowd_l2_sets(&[(ways + 1, s)]));
        assert!(rows_crowd_l2_sets(&[(ways + 1, -3 * s)]));
        // A line further each row: every row in a set of its own.
        assert!(!rows_crowd_l2_sets(&[(ways + 1, s + LINE as isize)]));
        // The second dim doubles the rows of each set, or moves them on.
        assert!(rows_crowd_l2_sets(&[(ways, s), (2, 2 * s)]));
        assert!(!rows_crowd_l2_sets(&[(ways, s), (2, s / 2)]));
        assert!(!rows_crowd_l2_sets(&[(ways, 2 * s), (4, LINE as isize), (1, 0)]));
        // Rows a line apart fill every set once; only the first 1024 count.
        assert!(!rows_crowd_l2_sets(&[(1 << 20, LINE as isize)]));
        // The bench's 32⁴ × 16 f32 43210 tile (32 rows 2 MiB apart, 8 of 64
        // KiB): at most span / 64 KiB sets for its 256 rows.
        let sets = (span / (64 << 10)).clamp(1, 8);
        assert_eq!(rows_crowd_l2_sets(&[(32, 2 << 20), (8, 64 << 10)]), 256 / sets > ways);
    }
}
