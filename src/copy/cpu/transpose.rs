//! Transposes (`PlanKind::Transpose`): blocked 2-D tiles of register
//! micro-transposes, batched over the other dims, written straight into the
//! destination in whole cache lines, or through a staging tile (long runs on
//! both sides, with the next tile's source prefetched meanwhile; destination
//! rows that cannot be line-aligned).

use smallvec::SmallVec;

#[cfg(target_arch = "x86_64")]
use super::avx2::enabled as avx2_enabled;
#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::blocks::LINE;
use super::caches::{l2_bytes, l2_has_few_ways, l2_sets};
#[cfg(target_arch = "x86_64")]
use super::channels::{Channels, channels};
use super::elem::Elem;
#[cfg(target_arch = "x86_64")]
use super::folded512::{self, Folded};
use super::general::{SHORT_GATHER, gather, general, scatter};
use super::parallel::{Shared, for_each_segment, par_for_slow, slow_workers};
use super::runs::{Cache, copy_run, prefetch, runs_stream_threshold, store_fence, stream_threshold};
#[cfg(target_arch = "x86_64")]
use super::split512;
use super::stage::{STAGE, with_stage};
use crate::copy::plan::{CopyPlan, INLINE_DIMS, PlanDim};

/// No AVX2 kernels off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn avx2_enabled() -> bool {
    false
}

/// Whether the AVX-512 kernels ([`avx512`]) run and have one for `e`-byte
/// elements (none off x86-64): the whole-line one ([`avx512::line_tiles`]),
/// or with `sheared` the one for destination rows off line boundaries
/// ([`avx512::sheared_tiles`]).
fn avx512_has_kernel(e: usize, sheared: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::enabled()
            && if sheared {
                avx512::has_sheared_kernel(e)
            } else {
                avx512::has_kernel(e)
            }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (e, sheared);
        false
    }
}

/// Largest transpose (bytes) done in small, L1-sized tiles.
const DIRECT_MAX_BYTES: usize = 2 << 20;

/// The same for elements of 8 bytes or more, whose larger copies up to where
/// copies stream (4 MiB here) also go faster in small tiles than staged and
/// prefetched. Python, one process, 2 → 8 MiB in turn batch by batch, best
/// of seven, one thread / two: 700² f64 transposed 0.87× / 0.80× the time
/// (NumPy's plain loop had been faster on one thread), 500² complex128 0.59×
/// / 0.62×, 300 × 1200 f64 0.96× / 0.66×; but 1000² f32 1.15× / 0.90×,
/// 2000 × 1500 u8 1.54× / 1.31×, which keep the smaller limit.
const DIRECT_MAX_BYTES_WIDE: usize = 8 << 20;

/// A page: columns whose destination runs are this long take the folded
/// tiles at any size (see [`transpose`]).
const PAGE: usize = 4096;

/// Bytes apart at which lines share an L1 set (64 sets of 64-byte lines: a
/// 32 KiB 8-way or 48 KiB 12-way L1D). Destination rows a multiple of this
/// apart put every line a small tile writes into one or two sets, which hold
/// 8 (or 12): a tile of 16 such rows evicts its own lines before finishing
/// them, and each is fetched again for every micro tile that writes it.
/// Small copies with such rows take the large copies' routes instead (whole
/// lines or runs written at once), without their prefetches. Two cores,
/// Python, into a reused output, three alternated runs, GB/s:
/// - permutes: 32³ f32 210 9–10 → 22–28, 64³ 13–17 → 49–52, 64³ f16 11–15 →
///   30–32, 64³ f32 201 17–20 → 33–37, 128³ u8 210 8–10 → 18–23, NHWC → NCHW
///   1 × 32 × 32 × 64 f32 16–18 → 32–36;
/// - transposes: 1024 × 256 f32 17–20 → 42–51, 512² f64 31–40 → 60–68, 2048
///   × 256 f16 15–16 → 18–28, 4 × 1024 × 64 batched f32 18–20 → 33–38.
///
/// So do those whose rows are closer but put more than [`L1_WAYS`] of the
/// tile's lines in a set all the same ([`small_tile_lines_per_set`]): rows 1
/// or 2 KiB apart, of bytes (64 rows a tile) or 2-byte elements (32).
/// Matrices transposed (source shape), Xeon VM (48 KiB 12-way L1), the
/// median of seven paired calls in one process, speed-up: u8 1024² 1.25×,
/// 1024 × 1536 (rows 1 KiB apart) 1.16×, 2048 × 1024 1.10×, 2048 × 512
/// 1.21×, 4096 × 256 (rows 4 KiB apart, which bytes without batch dims were
/// left out of before) 1.39×; f16 1024² 1.11×, 1024 × 512 1.39×; others
/// 0.98–1.05×. With eight lines a set or fewer the large routes mostly lose:
/// f16 512 × 2048 0.70×, 768 × 1024 (rows that spread) 0.49×, f32 256 × 1024
/// 0.82×, u8 1536 × 1024 0.71×; f32 512² and 512 × 1024 1.00×, u8 512 ×
/// 2048 1.10×.
const L1_SET_SPAN: isize = 4096;

/// Ways of the smallest L1D (Zen's 32 KiB, 8-way).
const L1_WAYS: usize = 8;

/// Source spans (bytes) that [`few_channels_of_wide_pixels`] reads once a
/// channel: this Xeon's 48 KiB L1D, where the rule was measured.
const GATHERED_SPAN_MAX: usize = 48 << 10;

/// Channels of wider pixels ([`Channels::first_of_wide_pixels`]) that go one
/// pass over the pixels at any size (not streamed), where the tiles, a micro
/// tile wide, read and transpose lanes for nothing. Zen 2 VM, Python, into a
/// new output, the best of two runs, µs, tiles → one pass (NumPy):
/// `x[:, :3].T` of 100000 × 16 f32 133 → 51 (246), of 100000 × 9 f64 155 →
/// 66 (310), of 20000 × 64 u8 50.5 → 18.1 (49.9); `x[:, :2].T` of 100000 ×
/// 64 u16 247 → 86 (346), of 20000 × 64 f32 40.5 → 20.2 (37.3). Of 132 such
/// copies (2000, 20000 and 100000 rows, pitches 5 to 64, 2 and 3 channels,
/// u8 to f64, those the gathers took included), the median 1.30×, 82 over
/// 1.1×, the least 0.96×. Not 4 channels (f64 20000 × 10, 18 → 25 µs; f32
/// 20000 × 16, 14.5 → 18.1), nor pixels of under 7 bytes, of which a 16 ×
/// 16 byte tile's row loads hold 2 or 3 (20000 × 5 u8, k = 2: 4.2 → 4.9; 7
/// bytes: 5.5 → 5.0).
#[cfg(target_arch = "x86_64")]
const FIRST_CHANNELS_IN_ONE_PASS: usize = 3;

/// Pixels a slice of a batched transpose (`batched`: slices of permutes
/// whose unit-stride source side is 2 or 3 elements) has at least for
/// [`first_channels_in_one_pass`], of elements of 8 bytes, or of 4 where the
/// copy leaves the small tiles' cache-resident route, and where the slice's
/// planes are not consecutive runs of the destination. Zen 2 VM, Python, into
/// a new output, µs, two alternated runs, tiles → one pass (the faster peer):
/// 512² × 3 f32 permuted 210 1061–1092 → 477–481 (952–989), 480 × 640 × 3
/// 669–680 → 216–220 (581–592); 61 × 67 × 59 × 3 f32 3201 353–361 → 120
/// (263), f64 3021 346–375 → 159–163 (317–346); f64 128² × 3 210 28 → 16,
/// 200 × 300 × 2 36 → 29. Lost: 256² × 3 f32 210 (planes 256 KiB apart
/// leave the small route) 40 → 50 (123). Kept in tiles: f32 in the small
/// route, 128² × 3 210 12 → 14; consecutive planes, 61 × 67 × 59 × 3 f32
/// 2031 136 → 189; slices of 1- and 2-byte elements, or of fewer pixels,
/// whose steps leave many pixels one by one: 31 × 29 × 27 × 2 u16 2031 13.5
/// → 42, u8 64² × 2 210 2.3 → 3.7, 5 × 7 × 9 × 11 × 2 f64 03142 8.4 → 12.2.
#[cfg(target_arch = "x86_64")]
const BATCHED_ONE_PASS_MIN_PIXELS: usize = 64;

/// Whether the first `b.len` channels of pixels `a.src` bytes apart go one
/// pass over the pixels at any size ([`FIRST_CHANNELS_IN_ONE_PASS`]); with
/// batch dims (`batched`), not in the small route (`small`), see
/// [`BATCHED_ONE_PASS_MIN_PIXELS`].
#[cfg(target_arch = "x86_64")]
fn first_channels_in_one_pass(a: PlanDim, b: PlanDim, e: usize, batched: bool, small: bool) -> bool {
    let few = b.len <= FIRST_CHANNELS_IN_ONE_PASS && !(e == 1 && a.src.unsigned_abs() < 7);
    let slices_take_it =
        (e == 8 || e == 4 && !small) && a.len >= BATCHED_ONE_PASS_MIN_PIXELS && b.dst != (a.len * e) as isize;
    few && (!batched || slices_take_it)
}

/// Whether a transpose of `k = b.len` channels out of pixels of `a.src / e`
/// elements (9 or more: [`split512`] takes up to 8) is better done as `k`
/// gathers, one a channel, than in tiles: the tiles of 1- and 2-byte
/// elements are 16 and 8 wide whatever the channel count, so a few channels
/// pay for a whole tile. Tiles keep 2- and 4-byte channels that fill 16-byte
/// vectors, and channels past 3 whose source outgrows the L1 (each gather
/// reads it again), but where 1- and 2-byte channels of at most 4 have pixels
/// under a line. One thread, µs, tiles → gathers (NumPy), `x[:, :k].T` of
/// rows × pitch: u8 4000 × 20, k = 2, 6.46 → 2.87 (2.99); 1000 × 16, 3, 2.06
/// → 1.01 (1.28); 4000 × 10, 6, 7.20 → 5.53 (8.34); u16 1000 × 16, 3, 1.91 →
/// 1.13 (1.28); f32 300 × 16, 3, 0.87 → 0.64 (0.58); 1000 × 10, 7, 2.78 →
/// 2.07 (2.62); f64 300 × 20, 6, 1.45 → 1.03 (0.85). Of 504 such copies (300
/// to 4000 rows, pitches 10 to 64, 2 to 8 channels, u8 to f64), under 0.9×
/// NumPy's speed 126 → 49, the worst 0.39× → 0.73×. Kept in tiles: u16 1000
/// × 10, k = 8, 1.08 (gathers 1.12, NumPy 2.95), f32 1000 × 16, 4, 1.69
/// (2.48), u8 4000 × 64, 4, 6.88 (8.63). Where the CPU has AVX2 these go
/// one pass over the pixels instead of the gathers
/// ([`Channels::first_of_wide_pixels`]).
fn few_channels_of_wide_pixels(a: PlanDim, b: PlanDim, e: usize) -> bool {
    let (k, es) = (b.len, e as isize);
    if b.src != es || a.src % es != 0 || a.src / es <= 8 || k > 8 || !matches!(e, 1 | 2 | 4 | 8) {
        return false;
    }
    let pixel = a.src.unsigned_abs();
    let span = a.len * pixel;
    let fills_vectors = matches!(e, 2 | 4) && (k * e).is_multiple_of(16);
    !fills_vectors && (k <= 3 && span <= l2_bytes() || span <= GATHERED_SPAN_MAX || e <= 2 && k <= 4 && pixel < LINE)
}

/// Whether a small copy's `a × b` slices are scalar work: source runs under
/// 16 bytes and destination runs under 16 elements, which no micro tile
/// reaches. The extension stages such slices element by element and writes
/// each run out apart; the general kernel's gathers write them once. Zen 2
/// VM, Python, µs, the least of two `bench/cpu_permute_sweep.py` runs
/// alternated with the extension (NumPy): 5 × 7 × 9 × 11 × 2 u8 permuted
/// 14032 11.2 → 6.0 (6.6; 4.4 since the gathers step their pointers),
/// 03142 8.80 → 6.10 (7.3), 43210 8.72 → 6.36; f32 14032 8.4 → 6.3, 03142
/// 7.43 → 6.15 (6.9); u16 43210 7.88 → 6.55; 9 × 10 × 11 × 12 × 13 u8 03142
/// 48.8 → 38.6, 43210 57.7 → 53.4; the other cases within the noise but two
/// that still beat their peers: u16 03142 5.4 → 6.1 (NumPy 7), f32 43210
/// 7.5 → 8.0–8.8 (10). Not wider source runs (9 × 10 × 11 × 12 × 13 u16
/// 14032, 26 bytes: 53 → 61), nor longer destination runs (5 × 7 × 30 × 11
/// × 2 u16 14032: 8 → 13).
///
/// Also destination runs under [`SHORT_GATHER`] elements of 4 bytes (8-byte
/// ones have no source run under 16 bytes) where a batch dim continues both
/// sides (its destination stride an `a` run, its source stride a `b` run, as
/// in `x[i, k, j] → out[j, k, i]`): f32, the least of three runs alternated
/// with the extension, µs (torch): 17 × 19 × 23 × 2 permuted 3120 10.5 →
/// 6.2 (8.9), 1320 10.8 → 6.4, 3021 10.3 → 6.6, 0321 10.3 → 6.8; 31 × 29 ×
/// 27 × 2 3120 14.5 → 11.8 (15.1), 1320 and 3021 1.13×; 31 × 29 × 27 × 3
/// 3120 20.5 → 16.8; 70 other f32 permutes of those shapes and of 29 × 27 ×
/// 3, 64² × 2 and 100² × 3 within the noise. Not 1- and 2-byte elements
/// (31 × 29 × 27 × 2 u8 3201: 7.7 → 26.6), nor 4-element source runs (33 ×
/// 35 × 37 × 4 f32 3120: 43 → 56).
fn scalar_slices(a: PlanDim, b: PlanDim, batch: &[PlanDim], e: usize) -> bool {
    b.len * e < 16 && (a.len < 16 || e == 4 && a.len < SHORT_GATHER && continuing_both_sides(a, b, batch, e).is_some())
}

/// The batch dim that continues the runs of both sides, if any: its
/// destination stride is a whole `a` run and its source stride a whole `b`
/// run (`k` in `x[i, k, j] → out[j, k, i]`).
fn continuing_both_sides(a: PlanDim, b: PlanDim, batch: &[PlanDim], e: usize) -> Option<usize> {
    batch
        .iter()
        .position(|c| c.dst == (a.len * e) as isize && c.src == (b.len * e) as isize)
}

/// Lines of a small tile's destination that share one L1 set, at most: `rows`
/// rows `db` bytes apart, of `row_bytes` each, on the 64 sets of
/// [`L1_SET_SPAN`] (rows that do not start on a line spread over every set:
/// none are counted).
fn small_tile_lines_per_set(db: isize, rows: usize, row_bytes: usize) -> usize {
    let sets = L1_SET_SPAN as usize / LINE;
    if db % LINE as isize != 0 {
        return 0;
    }
    // Row starts step `step` sets: they fall on `sets / g` sets, `g` apart
    // (`g` the largest power of two dividing `step`, as `sets` is one).
    let step = (db.unsigned_abs() / LINE) % sets;
    let g = if step == 0 { sets } else { 1 << step.trailing_zeros() };
    let rows_per_start = rows.div_ceil(sets / g);
    // A row's lines cover `row_bytes / LINE` consecutive sets, which rows of
    // that many neighbouring starts overlap; a row of a span or less has one
    // line in a set, so there are no more than the rows (1 KiB rows of
    // complex128, eight a tile, 64 bytes apart: 8, not 16).
    (rows_per_start * row_bytes.div_ceil(LINE).div_ceil(g).min(sets / g)).min(rows)
}

/// The small tiles: destination runs × source runs (bytes), L1-resident.
const SMALL_DST_RUN: usize = 256;
const SMALL_SRC_RUN: usize = 64;

/// The small tiles of 16-byte elements (complex128): 64 elements (1 KiB) of
/// each destination row × 8 of each source row, not 16 × 4 (a tile's setup
/// and walk for every 64 moves). Python, one process, the choices in turn
/// batch by batch, best of nine; destination runs 256 → 1024 bytes: 100²
/// transposed 0.70× the time, 150² 0.78×, 500 × 30 0.76×, 30 × 500 0.89×,
/// 200² to 360² 0.87–0.97× (2048 bytes: 0.73–0.77× on the small ones, but
/// 1.01–1.25× from 200²); then source runs 64 → 128 bytes, one thread: 100²
/// 0.95×, 130² 0.94×, 150² 0.96×, 200² 0.85×, 300² 0.93×, 30 × 500 0.89×
/// (256 bytes: 0.84–1.04×).
const SMALL_RUNS_16: (usize, usize) = (1024, 128);

/// The small tiles' (destination run, source run) in bytes for `e`-byte
/// elements.
fn small_runs(e: usize) -> (usize, usize) {
    if e == 16 {
        SMALL_RUNS_16
    } else {
        (SMALL_DST_RUN, SMALL_SRC_RUN)
    }
}

/// Source bytes of a small tile whose destination side is shorter than the
/// small tiles' destination runs (a short `a`, as in many small matrices of a
/// few rows transposed): that side is taken whole, and the source runs grow
/// to fill these many bytes, instead of one micro tile's 64 bytes. Xeon VM
/// (48 KiB 12-way L1, 2 MiB L2), two cores, Python, into a reused output,
/// the median of 9–11 paired calls in one process, speed-up:
/// - 100 × 7 × 100 f64 permuted 021 (the peers' worst row, torch up to 1.3×
///   faster) 1.45×, f32 1.59×; 100 × 13 × 100 f64 1.27×; 50 × 7 × 300 f16
///   1.31×; 20 × 30 × 40 f32 210 1.14×; 32 × 24 × 300 f32 021 1.13×, 64 ×
///   20 × 200 1.04×;
/// - matrices of a few rows transposed: 5 × 20000 f64 2.09×, 7 × 50000 f32
///   1.43×, 16 × 50000 u8 1.34×, 8 × 100000 1.11×, 16 × 100000 1.05×; 3 ×
///   50000 f32 0.92× and 3 × 20000 f64 1.07×, within the ±10 % of repeated
///   runs there;
/// - 8 KiB did about as well (64 × 20 × 200: 0.95× of 4 KiB).
const SMALL_SHORT_DST_SRC_BYTES: usize = 4 << 10;

/// Source elements a small tile takes along each source row, where its
/// destination side is `a_bytes` (a whole short side: see
/// [`SMALL_SHORT_DST_SRC_BYTES`]), before rounding to micro tiles.
fn small_src_len(a_bytes: usize, e: usize) -> usize {
    if a_bytes < SMALL_DST_RUN {
        SMALL_SHORT_DST_SRC_BYTES / a_bytes.max(1)
    } else {
        small_runs(e).1 / e
    }
}

/// Sixteenths of the last-level cache ([`stream_threshold`]) from which
/// transposes stream where the L2 has few ways ([`l2_has_few_ways`]): 5 MiB
/// of a 16 MiB L3, where an eighth (2 MiB) streamed copies whose source and
/// destination stay in it between calls. Zen 2 VM (16 MiB L3), two cores,
/// Python, into a new output, the best of two processes, speed-up over an
/// eighth: 1024² f32 (4 MiB) 2.12×, 1.27×, 700² f64 1.89×, 61 × 67 × 59 × 3
/// f32 permuted 3021 1.92×, 1320 1.18×, 100³ f32 210 1.54×, 16 × 256² f32
/// 021 1.40×, 2048² u8 1.01×. With six sixteenths and more, caching lost
/// on 2-D transposes (1250² f32, 6 MiB, 0.74×; 2400² u8 0.69×; 1448² f32,
/// 8 MiB, 0.51×), though not on narrow permutes (61 × 67 × 59 × 3 f64 3120,
/// 5.5 MiB, 2.30×), which stream from the row copies' threshold instead.
const TRANSPOSE_STREAM_FEW_WAYS: usize = 5;

/// Shortest destination rows (bytes) worth line-aligned tiles. Shorter ones
/// are mostly the narrow blocks before the first and after the last line of
/// each row when the operands are not line-aligned, and the staged route's
/// whole-slice tiles (contiguous runs on both sides) win: 64 × 64 f32 slices
/// (a 4-D permute), one run: 20 GB/s staged, 8 in lines.
const LINES_MIN_ROW: usize = 4096;

/// Shortest runs (bytes) on both sides for [`Route::Prefetched`]: with
/// shorter ones a tile reads too few lines of each source row to be worth
/// prefetching, and the older routes win (64⁴ f32 permute, 256-byte runs:
/// 33 % of memcpy through the staging tile, 24 % prefetched).
const PREFETCHED_MIN_RUN: usize = 1024;

/// Shortest source runs (bytes) for [`Route::Prefetched`] in streamed copies
/// whose destination runs are [`PREFETCHED_MIN_RUN`] or longer: tall, narrow
/// matrices transposed and batches of them, whose tiles read blocks of
/// adjacent short source rows. The line tiles they took before (streaming
/// stores straight into the destination) ran at a third of the speed on the
/// Zen 3 VM. Two cores there, Python, into a reused output, median GB/s of
/// three alternated runs:
/// - f32 200000 × 64 6.4 → 16.2, 50000 × 200 5.0 → 16.8, 100000 × 48 5.9 →
///   21.4, 200000 × 32 6.4 → 14.5; batched 64 × 2048 × 64 5.3 → 15.9, 32 ×
///   4096 × 100 4.8 → 14.5;
/// - f64 100000 × 64 11.9 → 14.0, c128 100000 × 16 12.2 → 15.2, u8 200000
///   × 128 11.2 → 15.4, 16 × 8192 × 512 7.5 → 9.6; f16 and other u8 shapes
///   even (200000 × 128 f16 11.5 → 11.6);
/// - the bench, 16 × 4096 × 128 f16 batched: 11.2 → 26.1 (32 → 84 % of
///   memcpy);
/// - 64-byte runs lost (u8 1000000 × 64: 7.0 → 3.9), and copies that do not
///   stream keep the older routes (f32 10000 × 64, 2.4 MiB: 28.6 → 20.3).
const PREFETCHED_MIN_SRC_RUN_STREAMED: usize = 128;

/// The prefetched route's tiles of 2- and 4-byte elements: 768-byte
/// destination runs × 128 source bytes, at most 32 KiB (f16 tiles then take
/// one source line a row), where destination rows hold two runs or more.
/// Against 512 × 256, two cores, median GB/s of alternated runs, memcpy 56:
/// - f32, five runs: 4096² 41.7 → 45.7, 4097 × 4095 37.7 → 39.5, from a
///   4112-wide matrix 41.1 → 50.5, 32 × 512² batched 46.1 → 50.6;
/// - three runs: f32 offset by one 37.6 → 44.1, 256³ f32 permute 201 40.2 →
///   47.0; f16 4096² 34.2 → 34.9, from a 4128-wide matrix 41.3 → 46.8, 16 ×
///   4096 × 128 batched 46 → 52, attention's 8 × 2048 × 16 × 64 45.0 → 47.4;
/// - 640 and 896-byte runs did as well on f32 (two runs each); 1 KiB runs
///   lost on 4097 × 4095 f32; one source line a row lost on f32 (4096²: 35);
///   f64 (48.8 → 42.4), u8 (28.4 → 18.1) and RGB pixels (34.2 → 28.7) lose;
/// - 1 KiB rows as 768 + 256 bytes lost (256³ f32 permute 210: 37.0 → 35.0),
///   and so did two 512-byte blocks of 16 KiB tiles.
///
/// Streamed 2-byte transposes from line-aligned rows take
/// [`PREFETCHED_2_STREAMED`] instead (measured against this tile on the
/// Zen 3 and Xeon VMs, not on the Zen 5 one of the figures above).
const PREFETCHED_2_4: (usize, usize, usize) = (768, 128, 32 << 10);

/// [`PREFETCHED_2_4`] for 2-byte elements whose source rows do not keep one
/// alignment (a row stride not a multiple of a line): two source lines a row
/// (384 × 64), 48 KiB. A row's 64 bytes span two lines, half of what is
/// fetched; 128 bytes span three, two thirds. Against [`PREFETCHED_2_4`],
/// Python, into a reused output, two cores, three alternated runs, GB/s:
/// f16 3000 × 5001 19.9–30.8 → 33.6–35.9, 5001 × 3000 23.2–29.5 → 32.3–34.0,
/// 1999 × 3001 27.3–29.8 → 34.7–35.2, 4097 × 4095 18.0–20.2 → 21.3–24.2;
/// i16 3000 × 5001 28.8–32.0 → 35.8–36.6. Line-aligned rows lose with them
/// (the bench's 4128-wide f16 47.3 → 43.2), and f32's 256 source bytes a
/// row gained nothing clear (3000 × 5001, 4097 × 4095, six runs each).
const PREFETCHED_2_MISALIGNED: (usize, usize, usize) = (768, 128, 48 << 10);

/// The prefetched route's tiles of bytes: 640-byte destination runs × one
/// source line, 40 KiB, where destination rows hold two runs or more and
/// source rows are not a multiple of 4 KiB apart. Against 512 × 64, two
/// cores, GB/s of alternated runs:
/// - Python, into a reused output, three runs: 4320 × 7680 31.6 → 35.6,
///   7680 × 4320 24.7 → 27.6, 6000² 30.9 → 32.6, 3000 × 5001 29.5 → 30.8;
/// - the bench's 8192² from an 8256-wide matrix, six runs: 40.0 → 42.7
///   (memcpy 87), ten runs: 38.4 → 40.1 (memcpy 57);
/// - rows 8 KiB apart lose (the bench's 8192², six runs: 31.1 → 29.4), and
///   keep 512 × 64: their lines share few L2 sets, which longer runs crowd.
const PREFETCHED_1: (usize, usize, usize) = (640, 64, 40 << 10);

/// [`PREFETCHED_1`] for source rows that are not line-aligned: 448-byte runs
/// × two source lines, 56 KiB (one line of bytes spans two). Against
/// [`PREFETCHED_1`], Python, into a reused output, two cores, three
/// alternated runs, GB/s: u8 3000 × 5001 30.9–31.3 → 33.9–35.1, 5001 × 3000
/// 32.4–33.4 → 34.7–34.9 (and one run of 18.2), 1999 × 3001 26.3–26.5 →
/// 33.7–34.3; 4097 × 4095 17.2–17.6 → 16.1–16.9. Runs of 384 and 512 bytes
/// did almost as well, of 640 less.
const PREFETCHED_1_MISALIGNED: (usize, usize, usize) = (448, 128, 56 << 10);

/// Streamed 2- and 4-byte transposes take tiles of 128 source rows, not
/// [`PREFETCHED_2_4`]'s 192, on CPUs whose L2 has few ways
/// ([`l2_has_few_ways`]): f32 this tile, [`PREFETCHED_DEFAULT`]'s 512 × 256
/// bytes (four lines a row instead of two), f16 from line-aligned rows
/// [`PREFETCHED_2_STREAMED`] (as other CPUs do). On the Zen 3 VM (8-way 512
/// KiB L2) reading two lines of 192 source rows lost to four lines of 128 on
/// every streamed f32 transpose, most where source rows are (nearly) a
/// multiple of 2 KiB apart and their lines share few cache sets. f32 on Zen
/// 3, two cores, median GB/s of three alternated runs:
/// - the bench (memcpy 32–36): 4096² 14.7 → 22.1, 4097 × 4095 15.6 → 18.5,
///   offset by one 14.0 → 21.1, from a 4112-wide matrix 19.0 → 22.1, 32 ×
///   512² batched 18.3 → 23.2;
/// - Python, into a reused output: 4096² 16.9 → 22.2, 8192 × 2048 15.9 →
///   20.1, 3000 × 5001 19.7 → 20.8; with the tile forced, 2048 × 8192 14.2 →
///   21.8, 4096 × 4608 16.7 → 24.9, 2000 × 6000 20.1 → 24.5;
/// - copies that do not stream lost (1401 × 701 f32, 3.7 MiB, 32 → 23).
const PREFETCHED_4_FEW_WAYS: (usize, usize, usize) = PREFETCHED_DEFAULT;

/// The tile of streamed 2-byte transposes from line-aligned rows: 256-byte
/// destination runs × 512 source bytes, 32 KiB, which cuts them to 256 (four
/// lines of 128 rows) where source rows are 512 bytes or longer. First where
/// the L2 has few ways ([`PREFETCHED_4_FEW_WAYS`]); on the Xeon VM (16-way 2
/// MiB L2) too, against [`PREFETCHED_2_4`], Python, into a reused output,
/// from a written source, the median of five to seven paired calls in one
/// process: 4096² 1.35×, 1.60×, 1024 × 8192 1.34×, 2048 × 8192 1.36×, 8192
/// × 2048 1.39×, 16 × 4096 × 128 batched 1.15×, 1.13×; from a 4128-wide
/// matrix 0.99×, 1.01×, 4096 × 4160 1.04×, attention's 8 × 2048 × 16 × 64
/// 1.00×; 48 KiB tiles lost (4096² 1.13×, from 4128 wide 0.88×). Against
/// [`PREFETCHED_2_4`], Zen 3, two cores, median GB/s of alternated runs:
/// - the bench's 4096², six sets of three to five runs: 11.3 → 20.3, 10.4 →
///   16.2, 12.4 → 15.8, 12.1 → 16.4, 18.3 → 19.8, 16.1 → 16.6; from a
///   4128-wide matrix even (16.6 → 17.0, 18.7 → 17.5, 20.4 → 19.5);
/// - Python, into a reused output: 4096² 11.4 → 13.7, 4096 × 4160 15.1 →
///   18.2, 8192 × 2048 11.4 → 13.9, 2048 × 8192 10.6 → 16.3, u16 4096² 10.7
///   → 15.2;
/// - the bench's 4096², four runs, tiles bounded at 32 KiB: 256 rows × 128
///   bytes 13.6, 192 × 160 13.0, 128-byte runs 8.7–9.0 (and this tile 12.8
///   and 15.3, which shows the noise); 256 rows × 256 bytes (64 KiB, paired
///   calls in one process, Python) 1.04× and 1.06× at 4096² and 2048 ×
///   8192, 128 × 512 0.90× and 0.95×, 256 × 512 0.92× and 0.98×;
/// - rows that are not line-aligned keep [`PREFETCHED_2_MISALIGNED`] (Python
///   2000 × 6000 21.3 → 15.3, 3000 × 5001 15.5 → 13.3).
const PREFETCHED_2_STREAMED: (usize, usize, usize) = (256, 512, 32 << 10);

/// The byte tile where the L2 has few ways ([`PREFETCHED_4_FEW_WAYS`]),
/// from line-aligned rows: 256-byte destination runs × 256 source bytes
/// (four lines of 256 rows), 64 KiB. [`PREFETCHED_1`]'s tile and
/// [`PREFETCHED_DEFAULT`] (which rows 4 KiB apart took) fill 32 KiB with one
/// source line a row, and this VM prefers four. Zen 3, two cores, Python,
/// into a reused output, the median of 12–16 paired calls of each tile
/// alternated in one process, speed-up
/// over the old tile:
/// - rows 4 KiB apart: 8192² 1.55×, 1.66× (the bench: 28 → 40 % of
///   memcpy, four alternated runs), 4096² 1.22×, 2048 × 16384 1.43×;
/// - others: from an 8256-wide matrix 1.08×, 4320 × 7680 1.15×;
/// - 512 × 256 (128 KiB) 1.30×, 1.40×; 320 × 256 1.66×; 256 × 384 1.59×;
///   128 or 192 rows 0.98–1.07×; without the next tile's prefetches 0.57×;
/// - rows that are not line-aligned lose and keep [`PREFETCHED_1_MISALIGNED`]
///   (3000 × 5001 0.90×, 5001 × 3000 0.89×, 4097 × 4095 0.95×).
const PREFETCHED_1_FEW_WAYS: (usize, usize, usize) = (256, 256, 64 << 10);

/// The byte tile of streamed copies from rows a multiple of 4 KiB apart
/// where the L2 has many ways: 256-byte destination runs × 128 source bytes
/// (two lines of 256 rows), 32 KiB. [`PREFETCHED_DEFAULT`]'s 512 rows of
/// one line, which these rows took, ran a third slower. Xeon VM (16-way 2
/// MiB L2), two cores, Python, into a reused output, from a written source,
/// the median of five to seven paired calls in one process, speed-up: 8192²
/// 1.30×, 1.37×, 4096² 1.45×, 2048 × 16384 1.35×, 8192 × 4096 1.44×, 16384
/// × 2048 1.34×; [`PREFETCHED_1_FEW_WAYS`] 1.13–1.34×, 256 × 192 bytes
/// 1.23–1.34×, 384 × 128 1.21–1.29×. Rows not a multiple of 4 KiB apart keep
/// [`PREFETCHED_1`] (this tile: from an 8256-wide matrix 0.87×, 4320 × 7680
/// 0.79×, 6016² 1.00×, 16 × 8192 × 512 batched 0.97×).
const PREFETCHED_1_ALIASED: (usize, usize, usize) = (256, 128, 32 << 10);

/// The prefetched route's tile of three-byte elements (RGB pixels) whose
/// source cannot stay in the last-level cache (from three eighths of it,
/// [`PIXELS_LARGE`]): 576-byte destination runs (192 pixels, nine lines) ×
/// 240 source bytes (80 pixels), 45 KiB. [`PREFETCHED_DEFAULT`]'s 512 bytes
/// made runs of 168 pixels, 504 bytes, which end inside a line (the partial
/// lines at either end of every run take ordinary stores among the streamed
/// ones, a read of the line each). Zen 3 VM, two cores, Python, into a
/// reused output, the median of 11–21 paired calls in one process, speed-up
/// over that tile:
/// - 4096 × 2048 pixels transposed (the bench's): 1.37×, 1.23×, 1.30×;
///   2160 × 3840 1.19×, 1.15×; 3840 × 2160 1.16×, 1.09×; 4096 × 2047 1.17×;
///   4000 × 3000 1.18×; 2600² 1.14×; 3000 × 2000 1.08×, 2000 × 3000 1.04×;
///   2048² 1.06×; 3000 × 5001 1.10×, 1.05×;
/// - smaller copies lose, whose source the cache keeps between calls: 1600 ×
///   2000 0.95×, 2000 × 1600 0.94×, 1024 × 2048 0.79×, 2048 × 1024 0.84×,
///   1920 × 1080 0.81×, 0.89×, 1080 × 1920 1.04×, 0.96×, 0.95×; 1400 × 2000
///   1.02×;
/// - other whole-line runs on the large ones: 384 × 288 bytes 1.49×, 1.24×,
///   1.26×, 1.09×; 576 × 288 1.60×, 1.31×, 1.24×, 1.08×; 384 × 192 1.21×,
///   1.36×; 768 × 192 1.23×; runs of 240 bytes (80 pixels, not whole lines)
///   0.69×, 0.75×.
const PREFETCHED_3: (usize, usize, usize) = (576, 240, 45 << 10);

/// Eighths of the last-level cache ([`stream_threshold`]) from which
/// transposes of pixels take [`PREFETCHED_3`]: 12 MiB of a 32 MiB one.
const PIXELS_LARGE: usize = 3;

/// The prefetched route's tile where no other applies (and f32's where the L2
/// has few ways): 512-byte destination runs × 256 source bytes, 32 KiB.
const PREFETCHED_DEFAULT: (usize, usize, usize) = (512, 256, 32 << 10);

/// The AVX-512 route's tile (destination run, source run, most bytes): bands
/// of source rows that give each destination row two whole lines a step,
/// along 2 KiB of the rows, at most 32 KiB (Python, two cores, into a reused
/// output, the median of five paired calls, against the prefetched route:
/// 4096² f32 1.47–1.51×, from a 4112-wide matrix 1.43×, 2048² 1.25×, 8192
/// × 2048 1.33×, 1024² 1.24×; f16 4096² 1.17–1.22×, 16 × 4096 × 128 1.06–1.17×;
/// f64 2048 × 4096 1.17–1.19×, 1024² 1.12×). Bands giving one line a row
/// a step: f32 4096² 1.20×; four: 1.48× for f32 but 1.06× for f16. At most
/// 64 KiB: 16 × 4096 × 128 f16, whose 256-byte source rows make tall
/// tiles, 0.78×.
const AVX512_TILE: (usize, usize, usize) = (128, 2048, 32 << 10);

/// Shortest destination rows (bytes) for [`Route::Avx512Sheared`]: each
/// row's last lines, whose second micro tile would lie past the end, and its
/// first partial line are copied element by element, which shorter rows do
/// not repay (Python, two cores, from NumPy arrays, the median of three
/// processes against the prefetched route: f32 16 × 1025 × 1023 021 0.92×,
/// 1025 × 4095 0.97×, 2049 × 2047 1.00×, 4 × 2049 × 2047 021 1.03×).
const SHEARED_MIN_ROW: usize = 8 << 10;

/// [`AVX512_TILE`] for 3-byte pixels: bands of 64 source rows (one micro
/// tile: three whole lines a destination row a step), along 1536 bytes of
/// the rows (512 pixels). 4096 × 2048 RGB, two cores, `devtensor bench` (%
/// of memcpy, two runs each): 68–71 here, 68–72 along 768 to 6144 bytes, 68–70
/// for bands of 128 rows.
const AVX512_TILE_3: (usize, usize, usize) = (192, 1536, 96 << 10);

/// The sheared AVX-512 route's tile ([`Route::Avx512Sheared`]): each band
/// of source rows reads a micro tile's rows past its end (the lines that
/// straddle the two bands), so bands are taller: 64 f32 rows, four lines a
/// destination row a step. 4097 × 4095 f32, two cores, `devtensor bench`
/// (% of memcpy, two runs each): 32 rows 68–70, 64 rows 74–76 (1 or 4 KiB
/// of the rows alike), 96 rows 68–70, 128 rows 65–66.
const AVX512_SHEARED_TILE: (usize, usize, usize) = (256, 2048, 64 << 10);

/// The prefetched route's tile (destination run, source run, most bytes) for
/// a copy of `bytes` of `e`-byte elements with destination rows along `a`,
/// streamed (`nt`) or not: [`PREFETCHED_DEFAULT`], or one of the tiles above
/// where their destination runs fit at least twice in a destination row.
fn prefetched_tile(e: usize, a: PlanDim, nt: bool, bytes: usize) -> (usize, usize, usize) {
    let misaligned = a.src % LINE as isize != 0;
    let few_l2_ways = nt && l2_has_few_ways();
    let tile = match e {
        4 if few_l2_ways => Some(PREFETCHED_4_FEW_WAYS),
        2 if misaligned => Some(PREFETCHED_2_MISALIGNED),
        2 if nt => Some(PREFETCHED_2_STREAMED),
        2 | 4 => Some(PREFETCHED_2_4),
        1 if misaligned => Some(PREFETCHED_1_MISALIGNED),
        1 if few_l2_ways => Some(PREFETCHED_1_FEW_WAYS),
        1 if a.src % 4096 != 0 => Some(PREFETCHED_1),
        1 if nt => Some(PREFETCHED_1_ALIASED),
        3 if bytes >= stream_threshold() / 8 * PIXELS_LARGE => Some(PREFETCHED_3),
        _ => None,
    };
    tile.filter(|t| a.len * e >= 2 * t.0).unwrap_or(PREFETCHED_DEFAULT)
}

/// How a transpose's tiles reach the destination.
#[derive(Clone, Copy, PartialEq)]
enum Route {
    /// Small, cache-resident copies: L1-sized tiles straight into the
    /// destination, unless its rows share L1 sets ([`L1_SET_SPAN`]).
    Small,
    /// Large ones with long runs on both sides (streamed ones with short source
    /// runs too, [`PREFETCHED_MIN_SRC_RUN_STREAMED`]): 128 destination × 256 source
    /// bytes staged in L1 (AVX2 micro tiles, line-aligned blocks), each
    /// destination run then streamed out while the next tile's source lines
    /// are prefetched into L2. A tile reading a line of each of many source
    /// rows waits on one miss per row, which the hardware prefetchers never
    /// cover; the prefetches overlap those misses with the writes. 4096² f32
    /// on two cores (Zen 5 VM, one run, GB/s): 21 in line tiles (the route
    /// below), 29 staged without prefetches, 44 with, 65 for memcpy.
    /// Power-of-two elements, and three-byte ones (AVX2 kernel): 4096×2048
    /// RGB pixels, two runs each, 24 GB/s staged, 38 prefetched.
    Prefetched,
    /// Large ones whose destination rows keep one alignment (power-of-two
    /// elements, row stride a multiple of a line): tiles of whole destination
    /// lines, streamed when `nt`. 4096² f32 on two cores (one run, GB/s, read +
    /// write): 53 in 1 KiB × 128 B tiles of AVX2 micro tiles, 15 through a
    /// staging tile, 79 for a streaming memcpy.
    Lines,
    /// The rest (odd element sizes, rows of odd lengths): a bigger tile
    /// transposed into a staging buffer, written out as contiguous runs.
    Staged,
    /// Large streamed ones whose destination rows are line-aligned, where the
    /// CPU has AVX-512, instead of the prefetched route, or of the others
    /// where destination runs are whole lines: micro tiles whose every store
    /// is a whole line ([`avx512`]), straight from the source to memory,
    /// along bands of source rows that give each destination row two lines a
    /// step (4096² f32 on two cores, Xeon VM, GB/s: 30 prefetched, 45 here;
    /// 4096 × 2048 RGB pixels, three lines a row a step: 36–37 → 41–42).
    Avx512,
    /// The same for destination rows of 8 KiB or more ([`SHEARED_MIN_ROW`])
    /// that do not start on a line, of 4- or 8-byte elements: each row's
    /// whole lines are joined from two micro tiles' ([`avx512::sheared_tiles`]),
    /// each tile covering, in each row, the lines that start in it, with the
    /// row's partial lines at either end of the copy element by element.
    /// Python, two cores, from NumPy arrays, the median of three processes
    /// against the prefetched route (GB/s): f32 4097 × 4095 32.5 → 41.2,
    /// 3000 × 5001 37.9 → 47.2, 5000 × 3000 31.2 → 51.7; f64 2049 × 4095 38.1
    /// → 48.9, 1025 × 2047 39.8 → 43.4, 16 × 1025 × 511 021 44.4 → 49.6.
    Avx512Sheared,
}

/// Which micro tiles a transpose's tiles are made of (one choice a copy).
#[derive(Clone, Copy, PartialEq)]
enum Kernels {
    /// The element type's baseline kernel ([`Elem::micro_len`]).
    Baseline,
    /// Its AVX2 kernel.
    Avx2,
    /// The whole-line AVX-512 kernels ([`avx512::line_tiles`]), streamed only.
    Avx512,
}

impl Kernels {
    /// The micro tile for `T` as (source rows, source elements a row): the
    /// element type's square one, or the AVX-512 kernel's
    /// ([`avx512::micro_dims`]: 64 × 16 for 3-byte pixels).
    fn micro_dims<T: Elem>(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512 => avx512::micro_dims(size_of::<T>()),
            k => {
                let m = T::micro_len(k == Kernels::Avx2);
                (m, m)
            }
        }
    }
}

/// The destination bytes from which a transpose over `a`, `b` of `e`-byte
/// elements streams. Transposes stream from an eighth of the last-level
/// cache: ordinary stores read every destination line first, and a
/// transpose cannot hide that behind sequential prefetching (1024² f32 on
/// two cores, one run: 68 GB/s streamed, 38–50 cached; 512²: 56 streamed,
/// 105 cached). From
/// five sixteenths where the L2 has few ways ([`TRANSPOSE_STREAM_FEW_WAYS`]),
/// and there from the row copies' threshold where a side's runs are under
/// [`PREFETCHED_MIN_RUN`]: those are read or written in runs of a few
/// lines at most, as rows are, and ordinary stores kept source and
/// destination in the L3 between calls. Zen 2 VM (16 MiB L3: five
/// sixteenths 5 MiB, the rows' three eighths 6 MiB), Python, into a new
/// output, the best of two processes, speed-up: 61 × 67 × 59 × 3 f64 (5.5
/// MiB) 1320 2.35×, 3120 2.14×, 0321 2.08×, 3021 2.07×, 3201 1.57×, 3210
/// 1.49×, 2031 1.44×, 0231 1.37×, the 14 others 0.90–1.05× (row copies
/// and channel shuffles, which it does not reach); 61 × 67 × 59 × 6 f32
/// 1320 2.39×, 3210 1.67×; 100 × 7000 f64 transposed 2.23×, 6 × 116000
/// 2.50×, 7000 × 100 1.41×. Past 6 MiB cached stores lost as well as won
/// (200 × 10000 f32, 7.6 MiB, 0.61×; 61 × 134 × 59 × 3 f64 0321, 11 MiB,
/// 0.67×; 1320 1.32×); 2400² u8 and 300 × 4600 f32 are not narrow (1.0×).
fn stream_from(a: PlanDim, b: PlanDim, e: usize) -> usize {
    if !l2_has_few_ways() {
        stream_threshold() / 8
    } else if a.len * e < PREFETCHED_MIN_RUN || b.len * e < PREFETCHED_MIN_RUN {
        runs_stream_threshold(false)
    } else {
        stream_threshold() / 16 * TRANSPOSE_STREAM_FEW_WAYS
    }
}

/// Blocked transpose over (`dims[0]`: unit dst stride, `dims[k]`: unit src
/// stride); the other dims are a batch. Tiles (batch-major, then source row
/// blocks, then source column blocks) are split across threads.
///
/// # Safety
///
/// As [`execute`](super::execute).
pub(super) unsafe fn transpose<T: Elem>(plan: &CopyPlan, k: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>();
    let a = plan.dims[0];
    let b = plan.dims[k];
    let mut batch: SmallVec<[PlanDim; INLINE_DIMS]> = plan
        .dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 0 && i != k)
        .map(|(_, d)| *d)
        .collect();
    let nt = nt || plan.bytes() >= stream_from(a, b, e);
    // Pixels of 2 to 8 channels to planes, in cache: whole vectors for
    // slices of any length (bench/cpu_permute_sweep.py's 31 × 29 × 27 × 2 u8
    // 3102: 53.9 → 9.1 µs, NumPy 13.9). Streamed copies keep the routes
    // below, whose stores stream.
    #[cfg(target_arch = "x86_64")]
    if !nt && split512::splits(a, b, e) && split512::enabled() {
        // SAFETY: forwarded; `splits` and `enabled` hold.
        unsafe { split512::split(a, b, &batch, dst, src, e, plan.bytes()) };
        return;
    }
    // Pixels of three channels to planes and back: byte shuffles (SSSE3, which
    // every CPU with AVX2 has; the AVX2 switch turns both off for tests). Of
    // two and four channels too, in cache, where [`split512`] does not run,
    // and pixels of 5 to 8 channels of up to 4 bytes to planes.
    #[cfg(target_arch = "x86_64")]
    if avx2_enabled()
        && let Some(kind) = Channels::of(a, b, e, !nt && !split512::enabled())
    {
        // SAFETY: forwarded; the CPU has AVX2, hence SSSE3; `of` took `e` of 1, 2, 4 or 8 bytes.
        unsafe { channels(kind, a, b, &batch, dst, src, e, plan.bytes(), nt) };
        return;
    }
    let direct_max = if e >= 8 {
        DIRECT_MAX_BYTES_WIDE
    } else {
        DIRECT_MAX_BYTES
    };
    let small = !nt && plan.bytes() <= direct_max;
    // Small copies whose tile's destination rows crowd L1 sets take the
    // large routes (the tile: `small_src_len` rows of at most a small tile's
    // destination run).
    let rows_share_sets = || {
        let rows = small_src_len(a.len * e, e).clamp(1, b.len.max(1));
        let row_bytes = (a.len * e).min(small_runs(e).0);
        b.dst % L1_SET_SPAN == 0 || small_tile_lines_per_set(b.dst, rows, row_bytes) > L1_WAYS
    };
    let min_src_run = if nt {
        PREFETCHED_MIN_SRC_RUN_STREAMED
    } else {
        PREFETCHED_MIN_RUN
    };
    // Where the CPU has AVX-512, streamed copies with line-aligned destination
    // rows go straight to memory in whole lines: those that would be staged
    // with prefetches, and the others whose destination runs are whole lines
    // (permutes whose runs are a line or two, which the extension staged
    // before: Python, two cores, into a reused output, the median of five
    // paired calls, from NumPy arrays: 32⁵ f16 03142 1.77×, 32⁴ × 16 f32
    // 43210 1.42×, 40213 1.42×, 64⁴ f32 3021 1.16×, f16 3210 1.43×; 1203,
    // 256³ 210, 201, 102, NCHW ↔ NHWC, attention 0.98–1.01×).
    let prefetched = (e.is_power_of_two() || e == 3) && a.len * e >= PREFETCHED_MIN_RUN && b.len * e >= min_src_run;
    // Pixels of three bytes: every row and batch slice starts where the
    // first does, on a whole pixel from a line (the AVX-512 kernel's tiles
    // are 64 pixels, three lines, along the row).
    let dst_rows_line_aligned = b.dst % LINE as isize == 0
        && if e == 3 {
            (dst as usize).is_multiple_of(LINE) && batch.iter().all(|d| d.dst % LINE as isize == 0)
        } else {
            (dst as usize).is_multiple_of(e)
        };
    let dst_rows_elem_aligned = b.dst % e as isize == 0 && (dst as usize).is_multiple_of(e);
    let whole_line_runs = a.len * e >= LINE && (a.len * e).is_multiple_of(LINE);
    let route = if small && !rows_share_sets() {
        Route::Small
    } else if nt
        && (prefetched || whole_line_runs)
        && avx512_has_kernel(e, false)
        && dst_rows_line_aligned
        && b.len * e >= LINE
    {
        Route::Avx512
    } else if nt
        && prefetched
        && avx512_has_kernel(e, true)
        && dst_rows_elem_aligned
        && b.len * e >= LINE
        && a.len * e >= SHEARED_MIN_ROW
    {
        Route::Avx512Sheared
    } else if prefetched {
        Route::Prefetched
    } else if e.is_power_of_two() && dst_rows_line_aligned && a.len * e >= LINES_MIN_ROW {
        Route::Lines
    } else {
        Route::Staged
    };
    // The AVX-512 route's tiles of a batch go along the source (its dims by
    // source stride, smallest first): the next tile reads the next line of
    // the same source rows (03142 in the batch's own order: 0.96×).
    if matches!(route, Route::Avx512 | Route::Avx512Sheared) {
        batch.sort_by_key(|d| d.src.unsigned_abs());
    }
    // A few channels of pixels wider than [`split512`] takes (`x[:, :k].T`):
    // one pass over the pixels, each one's first elements transposed in
    // registers ([`Channels::first_of_wide_pixels`]), where the CPU has AVX2:
    // those the gathers below would take, and 2 or 3 channels at any size
    // that does not stream ([`FIRST_CHANNELS_IN_ONE_PASS`]), in slices of
    // batch dims too ([`BATCHED_ONE_PASS_MIN_PIXELS`]). Else the general
    // kernel's gather a channel, as NumPy copies them, but never with batch
    // dims, where the "pixels" are slices of permutes, whose tiles win over
    // the gathers (31 × 29 × 27 × 3 f32 3210 0.83× the faster peer's speed
    // gathered, 5 × 7 × 9 × 11 × 2 f64 03142 0.64×).
    let gathered = route == Route::Small && batch.is_empty() && few_channels_of_wide_pixels(a, b, e);
    #[cfg(target_arch = "x86_64")]
    if (gathered || !nt && first_channels_in_one_pass(a, b, e, !batch.is_empty(), route == Route::Small))
        && avx2_enabled()
        && let Some(kind) = Channels::first_of_wide_pixels(a, b, e)
    {
        // SAFETY: forwarded; the CPU has AVX2, hence SSSE3 and AVX; `e` is 1, 2, 4 or 8.
        unsafe { channels(kind, a, b, &batch, dst, src, e, plan.bytes(), nt) };
        return;
    }
    if gathered {
        // SAFETY: forwarded.
        unsafe { general::<T>(plan, dst, src, nt) };
        return;
    }
    // Copies with a side shorter than a line, where the CPU has AVX-512:
    // tiles folded from two dims a side ([`folded512`]), whose rows and
    // columns reach the micro tiles, straight to the destination.
    // bench/cpu_permute_sweep.py, µs, the routes below → folded (NumPy,
    // torch): 31 × 29 × 27 × 3 f32 permuted 3120 33.7 → 10.5 (20.9, 17.2),
    // u16 3201 33.1 → 10.6 (30.6, 21.3), 33 × 35 × 37 × 4 f64 2013 154 →
    // 34.1 (246, 71.8), 5 × 7 × 9 × 11 × 2 f64 43210 11.6 → 3.3 (6.3,
    // 10.6), 17 × 19 × 23 × 2 f64 3210 8.9 → 5.7 (5.9); bytes in 16 × 16
    // tiles: 33 × 35 × 37 × 4 u8 3201 68 → 11 (65, 34), 9 × 10 × 11 × 12 ×
    // 13 u8 14032 72 → 22 (61, 41), 03142 42 → 25 (60, 40); plain where
    // only the columns are narrow: 40123 (an 11880 × 13 transpose) 39 → 16
    // (38, 24). Not narrow rows of bytes (17 × 19 × 23 × 2 u8 1230, 17 ×
    // 874, the others' tiles at 0.9–1.1× the time). Plain also where 2-byte
    // elements' source rows are under 8 long, which [`folded512`] takes in 8
    // × 8 tiles: those that [`split512`] does not take, pixels wider than 8
    // elements and streamed copies. One thread, µs, NumPy: x[:, :7].T of
    // 1000 × 10 u16 5.66 → 3.41 (3.29), of 3000 × 9 15.5 → 8.7 (9.7); and,
    // before split512 took them, 1000 × 7 transposed 2.98 → 2.12 (2.65).
    // Rows of 13 or more lost (1000 × 15 1.19×, 13 × 2000 2.98× the time),
    // as did short destination rows (7 × 1000 1.36×).
    //
    // Larger copies too, while the destination stays in the last-level
    // cache, or where a column's destination run (the tile's rows) is a
    // page or more: ordinary stores, where the other routes stream them.
    // Python, µs, the best of two runs, others → folded: 61 × 67 × 59 × 3
    // f64 (5.5 MiB) 1320 498 → 251 (NumPy 427, torch 290), 2031 375 → 231;
    // 121 × 131 × 119 × 3 f32 (22 MiB) 3201 0.27× the time, 257 × 255 × 129
    // × 2 u16 (32 MiB) 3201 0.09×. Of 120 permutes of 3.7 to 141 MiB (u8 to
    // f64, 2–4 channels), 13 under the faster peer before, 1 after (0.96×),
    // the worst loss 1.84× the time (u8 257 × 255 × 129 × 2 2130, still 5.1×
    // torch's speed). Folding every such copy instead: 0 under, but 201 ×
    // 301 × 203 × 3 u16 2130 at 0.23× the speed: with short runs far apart
    // the streamed routes' prefetches and whole-line stores win.
    //
    // Small copies of 8-byte elements with both sides a line or longer, and
    // of 16 or more columns, folded or not: the other small routes' SSE2
    // tiles are 2 × 2 (33 × 35 × 37 × 4 f64 permuted 1230, a 33 × 5180
    // transpose, 151 → 35, NumPy 67, torch 57; 9 × 10 × 11 × 12 × 13
    // 43210 58 → 39). Not 2- and 4-byte elements, whose SSE2 tiles mostly
    // win there (17 × 19 × 23 × 2 f32 1230 1.35×, 9 × 10 × 11 × 12 × 13 f32
    // 40123 1.56× the time), nor fewer columns (9 × 10 × 11 × 12 × 13 f64
    // 40123, 13 columns, 26 → 43), nor a narrow side with no fold (17 × 19
    // × 23 × 2 f64 2310 4.6 → 5.4).
    //
    // Large ones of 4- and 8-byte elements that would be staged (destination
    // runs under 1 KiB, which the staged tiles transpose with SSE2's 2 × 2
    // or 4 × 4 micro tiles): few source rows, very long, transposed. Python,
    // µs, staged → folded (NumPy, torch), one thread: 61 × 11859 f64 747 →
    // 481 (431, 1034), 200 × 10000 f32 1381 → 714 (1128), 61 × 5000 f64 313
    // → 190 (191), 300 × 300 × 30 f32 210 1382 → 951; two cores: 61 × 67 ×
    // 59 × 3 f64 0231 431 → 270 (433, 264), 1230 425 → 270 (439, 293), 2310
    // 410 → 327 (708, 363), 30 × 30000 f32 320 → 162 (384). Not 1- and
    // 2-byte ones (200 × 30000 u16 1674 → 2222).
    #[cfg(target_arch = "x86_64")]
    let narrow = b.len * e < LINE || a.len * e < LINE;
    #[cfg(target_arch = "x86_64")]
    if (narrow || (e >= 4 && route == Route::Staged) || (e == 8 && route == Route::Small))
        && folded512::enabled()
        && let Some(f) = Folded::find(
            a,
            b,
            &batch,
            e,
            !narrow || (e == 1 && a.len * e >= LINE) || (e == 2 && b.len < 8),
        )
        && (narrow || f.sides().1 >= 16)
        && (route == Route::Small || plan.bytes() < stream_threshold() || f.sides().0 * e >= PAGE)
    {
        // SAFETY: forwarded; `enabled` holds and `f` is this plan's.
        unsafe { folded512::transpose(&f, dst, src, e, plan.bytes()) };
        return;
    }
    // Small copies of 8-byte elements whose source runs are one to three of
    // them, under destination runs of 16 or more: the general kernel's row
    // gathers (as for the runs further down), before any extension, whose
    // tiles of SSE2's 2 × 2 micro tiles lose to them there. Python, µs,
    // extended → rows (NumPy, torch): 31 × 29 × 27 × 3 f64 permuted 1320
    // 44.8 → 19.2 (23.6, 31.2), 0321 30.0 → 21.3 (30.0, 34.5), 3120 46.2 →
    // 22.1; 29 × 27 × 3 f64 210 1.78 → 1.21 (1.02). Not 4-byte ones, whose extension mostly wins:
    // 31 × 29 × 27 × 2 f32 2031 15.2 → 22.8, 17 × 19 × 23 × 2 2130 5.7 → 8.8.
    if route == Route::Small && e == 8 && b.len <= 3 && a.len >= 16 {
        // SAFETY: forwarded.
        unsafe { general::<T>(plan, dst, src, nt) };
        return;
    }
    // Small copies of scalar slices: the general kernel's gathers ([`scalar_slices`]).
    if route == Route::Small && scalar_slices(a, b, &batch, e) {
        // SAFETY: forwarded.
        unsafe { general::<T>(plan, dst, src, nt) };
        return;
    }
    // Small copies whose source runs are narrower than the smallest micro
    // tile take the extension too: its groups of slices reach the micro
    // tiles, where small tiles of such slices gather every element alone.
    // Python, into a reused output, the median of 30 paired calls in one
    // process: 127 × 131 × 5 u8 permuted 210 3.9×, u16 2.3×, 300 × 200 × 6
    // f16 1.7×, 31 × 29 × 27 × 3 f32 3210 2.6×, 17 × 19 × 23 × 2 f32 2.3×,
    // 61 × 67 × 59 × 3 u16 2.6×; 2 × 32³ × 16 f32 43210, 100² × 3 f64 210
    // and 131 × 127 × 7 f32 210 (runs of a micro tile or more) 0.99–1.01×.
    // So do those whose destination runs are shorter than a line (each
    // written in pieces, where the extension writes them whole): 7 × 11 × 13
    // × 17 × 19 f32 43210 1.15×, 3 × 5 × 7 × 11 × 13 × 17 f32 543210 1.17×,
    // 9 × 10 × 11 × 12 × 13 f16 43210 1.20×; 16⁵ f32 43210, 32³ f32 210,
    // 20 × 30 × 40 f32 210, 64³ f32 021 0.99–1.04×. Small copies of longer
    // runs keep their tiles (20 × 30 × 40 f32 210 extended: 0.88×).
    let narrow_small = route == Route::Small && (b.len < T::micro_len(false) || a.len * e < LINE);
    if (narrow_small || !matches!(route, Route::Small | Route::Prefetched | Route::Avx512))
        && let Some(ext) = Extension::find::<T>(a, b, &batch, nt, plan.bytes())
    {
        // SAFETY: forwarded.
        unsafe { extended_split::<T>(a, b, batch, ext, dst, src, nt, plan.bytes()) };
        return;
    }
    // Small copies that no extension took, whose source runs are narrower
    // than the small tiles' micro tile, or one or two elements of 4 bytes or
    // more: the general kernel's row-by-row gathers.
    // - Narrower than the micro tile (16 bytes, 8 2-byte elements, 4 of 4
    //   bytes, 2 of 8): every tile would be its edges, element by element,
    //   after a check of its rows' L1 sets. Where the CPU has AVX-512,
    //   [`split512`] and [`folded512`] take most of them above; on a Zen 2 VM
    //   (AVX2), Python, µs, two processes each, tiles → gathers (NumPy,
    //   torch): 31 × 29 × 27 × 2 u8 permuted 3102 115 → 35 (25.7, 17.7), u16
    //   103 → 27 (26.0, 17.4); 33 × 35 × 37 × 4 u8 0132 210 → 107 (81, 62),
    //   3201 118–120 → 107; 64 × 64 × 2 u8 021 9.6 → 5.1 (4.0); 224 × 224 ×
    //   4 u8 201 90 → 81 (73, 55); x.T of 1000 × 15 u8 7.5 → 5.4 (6.2); 1000
    //   × 7 u16 3.75 → 3.57 (3.25); 10000 × 5 u8 22.2 → 20.3 (18.8); 300 ×
    //   200 × 6 f16 201 79.6 → 74.1 (96.8); 28 other permutes and
    //   transposes, which it does not reach, 0.97–1.03×.
    // - One or two elements of 4 bytes or more (the rule above takes all of
    //   them but two f64, which fill their 2 × 2 micro tile): a row's
    //   gather costs less than a tile's setup and its micro tiles' edges
    //   for every run. Python, µs, tiles → rows (NumPy,
    //   torch): 17 × 19 × 23 × 2 f64 permuted 3210 13.6 → 8.6 (6.2, 10.4),
    //   2031 13.0 → 8.4; f32 3201 6.9 → 3.6 (4.8, 6.5); 31 × 29 × 27 × 2 f64
    //   0321 19.2 → 13.4 (17.0, 22.7). Not runs of four (33 × 35 × 37 × 4
    //   f32 3201 25.4 → 44.0), nor those an extension takes (5 × 7 × 9 × 11 ×
    //   2 f32 43210 4.5 → 10.3).
    if route == Route::Small && (b.len < T::micro_len(false) || (e >= 4 && b.len <= 2)) {
        // SAFETY: forwarded.
        unsafe { general::<T>(plan, dst, src, nt) };
        return;
    }
    // One choice of kernel for the whole copy: tiles are sized for its micro
    // tile. AVX2 on the routes whose tiles are line-aligned only: on 16-byte
    // aligned operands half of the 32-byte accesses straddle two lines
    // (128² f32 from and to 16-byte aligned buffers, one run: 63 GB/s with
    // SSE2, 39 with AVX2). Three-byte elements on every route: their only
    // vector kernel is AVX2's, and their rows straddle lines anyway.
    let kernels = if matches!(route, Route::Avx512 | Route::Avx512Sheared) {
        Kernels::Avx512
    } else if (matches!(route, Route::Lines | Route::Prefetched) || e == 3) && avx2_enabled() {
        Kernels::Avx2
    } else {
        Kernels::Baseline
    };
    // The micro tile's edge along the source rows, which tiles are sized in.
    let m = kernels.micro_dims::<T>().1;
    // Tiles as (destination run, source run) bytes, at most `tile_max` bytes.
    // Small: 256 × 64, L1-resident. Lines: 1 KiB destination runs (the
    // prefetchers want several lines of a page per visit) × 128 source bytes,
    // at most 256 source rows, whose lines stay in L1 between the column
    // steps. Prefetched: 512 × 256 bytes (128 × 64 f32), 32 KiB of staging
    // in L1 (the best of the power-of-two runs from 128 B to 2 KiB on 4096²
    // f32: 44 GB/s, against 29–41 for the others), or the tiles of
    // [`prefetched_tile`]. Staged: up to 512 × 2 KiB, at most 256 KiB (L2) of
    // staging. A short source side is taken whole and the other grows to
    // fill the tile; so is a short destination side of a small tile, whose
    // source side then grows to [`SMALL_SHORT_DST_SRC_BYTES`].
    let (tile_dst, tile_src, tile_max) = match route {
        Route::Small => {
            let (dst_run, src_run) = small_runs(e);
            (dst_run, src_run, STAGE)
        }
        Route::Lines => ((256 * e).min(1024), 128, 32 << 10),
        Route::Prefetched => prefetched_tile(e, a, nt, plan.bytes()),
        Route::Staged => (512, 2048, 256 << 10),
        Route::Avx512 if e == 3 => AVX512_TILE_3,
        Route::Avx512 => AVX512_TILE,
        Route::Avx512Sheared => AVX512_SHEARED_TILE,
    };
    let base_i = (tile_dst / e / m).max(1) * m;
    let base_j = (tile_src / e / m).max(1) * m;
    let (bi, bj) = if b.len < base_j {
        let bj = b.len;
        (a.len.min((tile_max / (bj * e) / m).max(1) * m), bj)
    } else if route == Route::Small && a.len * e < SMALL_DST_RUN {
        (a.len, b.len.min((small_src_len(a.len * e, e) / m).max(1) * m))
    } else {
        let bi = a.len.min(base_i);
        let cap = (tile_max / (bi * e) / m).max(1) * m;
        (bi, b.len.min(base_j).min(cap))
    };
    let stage_bytes = if matches!(route, Route::Staged | Route::Prefetched) {
        bi * bj * e
    } else {
        0
    };
    // Lines: the column blocks start where destination lines do and the row
    // blocks where source lines do, after a narrow first block when the
    // operand is not line-aligned (NumPy's are 16-byte aligned). Otherwise
    // every tile would end in partial lines, and the source's loads would
    // straddle lines (a 16-byte offset halved a 4096² f32 transpose).
    // Assumes the batch keeps the alignment: a slice that does not is still
    // correct, only slower (tile() cuts partial lines off itself).
    let lead = |p: usize, len: usize| match route {
        Route::Lines | Route::Prefetched | Route::Avx512 => ((LINE - p % LINE) % LINE / e).min(len),
        _ => 0,
    };
    let cols = Blocks::new(a.len, bi, lead(dst as usize, a.len));
    // Not the source's on the AVX-512 route: its kernels load 16 bytes of a
    // row at a time, which a source not line-aligned only spreads over two
    // lines, while a narrow first block leaves source rows of a line or two
    // (permutes) to the scalar edges. From NumPy arrays (data 16 bytes past
    // a line), without the lead block against with: 32⁵ f16 03142 4.2×, 16 ×
    // 4096 × 128 f16 1.21×, 2-D transposes 0.99–1.00×.
    let src_lead = if matches!(route, Route::Avx512 | Route::Avx512Sheared) {
        0
    } else {
        lead(src as usize, b.len)
    };
    let rows = Blocks::new(b.len, bj, src_lead);
    let row_blocks = rows.count();
    let col_blocks = cols.count();
    let per_slice = col_blocks * row_blocks;
    // Small tiles of a copy split across threads go row block by row block
    // (destination rows outer), so that each thread's share is whole
    // destination rows, but for the row block where two shares meet. Column
    // block by column block, the shares split every destination row, and
    // the lines where they met in each row went back and forth between the
    // cores. Python, two cores, one process, both builds (µs, best of
    // nine), column → row blocks outer: 600² u8 transposed 49.4 → 23.2,
    // 1000² 125 → 64, 300² f32 31.6 → 16.4, 300 × 500 48.6 → 24.8, 150²
    // complex128 19.9 → 11.1 (NumPy 11.6), 64³ f32 permuted 210 80.8 →
    // 38.8, 33 × 35 × 37 × 4 f64 1302 93.0 → 51.1; 400² f32 18.1 → 18.9.
    // Copies on one thread keep column blocks outer (row blocks outer there:
    // 300² f32 1.08× the time, 400² 1.10×). `par_for_slow` runs a copy it
    // keeps on one thread as one call over the whole range, and only a split
    // one in parts, so every call of one copy picks the same order.
    let slices: usize = batch.iter().map(|d| d.len).product();
    let total = per_slice * slices;
    let (sa, db) = (a.src, b.dst);
    let (d, s) = (Shared(dst), Shared(src));
    par_for_slow(total, plan.bytes(), |t0, t1| {
        let rows_outer = route == Route::Small && t1 - t0 < total;
        with_stage(stage_bytes, |buf| {
            for_each_segment(&batch, per_slice, t0, t1, |dof, so, first, n| {
                // Tile t is (column block t / row_blocks, row block t %
                // row_blocks), or the other way round with `rows_outer`,
                // stepped to rather than divided out for each tile (three
                // divisions a tile, whose work can be as little as 64
                // elements).
                let (mut ci, mut ri) = if rows_outer {
                    (first % col_blocks, first / col_blocks)
                } else {
                    (first / row_blocks, first % row_blocks)
                };
                for t in first..first + n {
                    let (i0, ni) = cols.get(ci);
                    let (j0, nj) = rows.get(ri);
                    (ci, ri) = if rows_outer {
                        if ci + 1 == col_blocks {
                            (0, ri + 1)
                        } else {
                            (ci + 1, ri)
                        }
                    } else if ri + 1 == row_blocks {
                        (ci + 1, 0)
                    } else {
                        (ci, ri + 1)
                    };
                    let tb = ni * e; // staging row stride
                    // The next tile's source (same source rows, further along
                    // them), prefetched while this one is written out; not
                    // when the copy does not stream, and its source is taken
                    // to be in cache (three alternated runs each: 1024 × 256
                    // f32, rows sharing L1 sets, 26–36 GB/s with, 33–43
                    // without; 512² f64 34–36 → 44–50; 1400 × 700 f32, 3.7
                    // MiB, 17–22 → 24–35).
                    let mut next = (route == Route::Prefetched && nt && t + 1 < first + n).then(|| {
                        let (i1, ni1) = cols.get(ci);
                        let (j1, nj1) = rows.get(ri);
                        let at = s.get().wrapping_offset(so + i1 as isize * sa + (j1 * e) as isize);
                        let runs = d.get().wrapping_offset(dof + (i1 * e) as isize + j1 as isize * db);
                        (
                            NextTile::new(at, ni1, nj1 * e, sa, nj),
                            RunEnds::new(runs, nj1, ni1 * e, db),
                        )
                    });
                    // SAFETY: the tile's elements are elements of the plan; the
                    // staging buffer holds `ni * nj * e ≤ stage_bytes` bytes; on
                    // the Lines route every destination row of the tile has the
                    // alignment of its first (`db` is a multiple of a line).
                    unsafe {
                        let dt = d.get().offset(dof + (i0 * e) as isize + j0 as isize * db);
                        let st = s.get().offset(so + i0 as isize * sa + (j0 * e) as isize);
                        match route {
                            Route::Small => tile::<T>(kernels, dt, st, ni, nj, sa, db, false, false),
                            Route::Lines => tile::<T>(kernels, dt, st, ni, nj, sa, db, nt, true),
                            Route::Avx512 => tile::<T>(kernels, dt, st, ni, nj, sa, db, true, true),
                            Route::Avx512Sheared => sheared_tile::<T>(dt, st, ni, nj, sa, db, i0 == 0, a.len - i0),
                            Route::Prefetched | Route::Staged => {
                                tile::<T>(kernels, buf, st, ni, nj, sa, tb as isize, false, false);
                                match &mut next {
                                    // Contiguous destination rows: one run.
                                    None if db == tb as isize => copy_run(dt, buf, tb * nj, nt),
                                    next => {
                                        // This tile's first ends, unless the tile
                                        // before prefetched them (on the
                                        // prefetched route of a streamed copy).
                                        let ends = RunEnds::new(dt, nj, tb, db);
                                        let own_ends = route == Route::Staged || !nt;
                                        if t == first || own_ends {
                                            (0..RunEnds::AHEAD).for_each(|j| ends.prefetch(j));
                                        }
                                        for j in 0..nj {
                                            if let Some((next, next_ends)) = next.as_mut() {
                                                match j + RunEnds::AHEAD {
                                                    k if k < nj => ends.prefetch(k),
                                                    k => next_ends.prefetch(k - nj),
                                                }
                                                next.step();
                                            } else if own_ends {
                                                ends.prefetch(j + RunEnds::AHEAD);
                                            }
                                            copy_run(dt.offset(j as isize * db), buf.add(j * tb), tb, nt);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// The source of the tile after this one: `rows` rows `sa` bytes apart, of
/// `row_lines` lines each, prefetched into L2 in `steps` equal shares, one per
/// destination run written out ([`NextTile::step`]). The shares are counted
/// with an accumulator, not divided out: a division a line and two a step
/// (the lines' row and column, the share's bounds) took most of a 32⁵ f16
/// 03142 permute's time on a Zen 2 VM, whose divider is slow and one a core
/// (`perf`: the extension's loop 35 % of the samples, its tiles' transposes
/// 7 %; 6.9 GB/s, memcpy 26).
struct NextTile {
    /// The row of the next line to prefetch, and that line in it.
    row: *const u8,
    line: usize,
    row_lines: usize,
    sa: isize,
    /// Lines not yet prefetched.
    left: usize,
    /// Lines a step adds to `due` (the tile's), and the steps that owe a line
    /// for each `steps` of `due`: step `s` prefetches the lines from
    /// `s · total / steps` up to `(s + 1) · total / steps`, rounded down.
    total: usize,
    steps: usize,
    due: usize,
}

impl NextTile {
    /// The tile of `rows` rows of `row_bytes` from `src`, `sa` bytes apart,
    /// prefetched over `steps` steps. Rows that do not start on a line span
    /// one line more than their bytes fill: that line, left out, was a demand
    /// miss per row and tile (4097 × 4095 f32 on two cores, three runs each:
    /// 22.4 GB/s without it, 31.1 with).
    #[inline(always)]
    fn new(src: *const u8, rows: usize, row_bytes: usize, sa: isize, steps: usize) -> NextTile {
        let misaligned = !(src as usize).is_multiple_of(LINE) || sa % LINE as isize != 0;
        let row_lines = row_bytes.div_ceil(LINE) + usize::from(misaligned);
        let total = rows * row_lines;
        NextTile {
            row: src,
            line: 0,
            row_lines,
            sa,
            left: total,
            total,
            steps: steps.max(1),
            due: 0,
        }
    }

    /// Prefetches into L2 the next of the `steps` shares of the tile's source
    /// lines (calls past the last prefetch nothing).
    #[inline(always)]
    fn step(&mut self) {
        self.step_with(|line| prefetch(line, Cache::L2));
    }

    /// [`NextTile::step`], handing each line's address to `f`.
    #[inline(always)]
    fn step_with(&mut self, mut f: impl FnMut(*const u8)) {
        self.due += self.total;
        while self.due >= self.steps && self.left > 0 {
            self.due -= self.steps;
            self.left -= 1;
            f(self.row.wrapping_add(self.line * LINE));
            self.line += 1;
            if self.line == self.row_lines {
                self.line = 0;
                self.row = self.row.wrapping_offset(self.sa);
            }
        }
    }
}

/// The partial lines at the ends of a tile's destination runs when those
/// rows have different alignments (`db` not a multiple of a line). They get
/// ordinary stores, each a miss that holds up the stores behind it (stores
/// commit in order, the streamed lines too). Prefetched into L1 a few runs
/// ahead, they are there when written. Two cores, GB/s:
/// - the bench's 4097 × 4095 f32, three alternated runs: 29.4 → 36.1 (memcpy
///   55); two runs each of 4, 8 and 16 runs ahead and of 8 into L2: 35.7,
///   36.7, 36.3 and 32.3;
/// - Python, transposes into a reused output, three alternated runs: 4097 ×
///   4095 f32 29.5–31.4 → 32.7–34.7, 5001 × 3000 f32 28–30 → 37–41, 3000 ×
///   5001 i16 23–25 → 35, 4097 × 4095 f16 17 → 20–22, 2049 × 2047 f64
///   36–37 → 38–42; 4096² f32 (no partial lines) 36–38 → 39;
/// - the staged route's tiles too, within each tile: 300 × 40001 f16 9.5–9.7
///   → 14.9–15.4, 100001 × 200 f32 19.2–19.9 → 21.1–22.1.
///
/// Rows of one alignment are left out: the partial lines at the ends of
/// three-byte pixels' runs gained nothing (4096 × 2048, 31.5 → 31.3).
struct RunEnds {
    dst: *mut u8,
    runs: usize,
    run: usize,
    db: isize,
}

impl RunEnds {
    /// Runs ahead of the one written whose ends are prefetched.
    const AHEAD: usize = 8;

    /// `runs` runs of `run` bytes from `dst`, `db` bytes apart; none where the
    /// rows keep one alignment.
    #[inline(always)]
    fn new(dst: *mut u8, runs: usize, run: usize, db: isize) -> RunEnds {
        let runs = if db % LINE as isize == 0 { 0 } else { runs };
        RunEnds { dst, runs, run, db }
    }

    /// Prefetches into L1 the partial lines at either end of run `k` (none
    /// past the last run).
    #[inline(always)]
    fn prefetch(&self, k: usize) {
        if k < self.runs {
            let start = self.dst.wrapping_offset(k as isize * self.db);
            let end = start.wrapping_add(self.run);
            for p in [start, end] {
                if !(p as usize).is_multiple_of(LINE) {
                    prefetch(p, Cache::L1);
                }
            }
        }
    }
}

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
struct Extension {
    da: Option<(usize, usize)>,
    sb: Option<(usize, usize)>,
    ds: Option<(usize, usize)>,
    /// Tiles walked in source order ([`BOTH_MAX_SRC_ROWS`]).
    source_order: bool,
}

impl Extension {
    fn find<T: Elem>(a: PlanDim, b: PlanDim, batch: &[PlanDim], nt: bool, bytes: usize) -> Option<Extension> {
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
/// As [`execute`](super::execute).
#[allow(clippy::too_many_arguments)]
unsafe fn extended_split<T: Elem>(
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
/// As [`execute`](super::execute).
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
    // GB/s, 64⁴ permute 3021 47 → 50.
    let aligned = |x: isize| x % 32 == 0;
    let avx2 = avx2_enabled()
        && aligned(src as isize)
        && aligned(a.src)
        && aligned(c1.src)
        && aligned(c2.src)
        && aligned(c3.src)
        && aligned(tb as isize);
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
fn rows_crowd_l2_sets(dims: &[(usize, isize)]) -> bool {
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

/// The blocks of one tile dimension: `lead` elements, then blocks of `size`.
#[derive(Clone, Copy)]
struct Blocks {
    len: usize,
    size: usize,
    lead: usize,
}

impl Blocks {
    fn new(len: usize, size: usize, lead: usize) -> Blocks {
        Blocks { len, size, lead }
    }

    fn count(self) -> usize {
        usize::from(self.lead > 0) + (self.len - self.lead).div_ceil(self.size)
    }

    /// Block `k` as (first element, elements).
    fn get(self, k: usize) -> (usize, usize) {
        let start = match (self.lead, k) {
            (0, _) => k * self.size,
            (lead, 0) => return (0, lead),
            (lead, _) => lead + (k - 1) * self.size,
        };
        (start, self.size.min(self.len - start))
    }
}

/// One `ni × nj` tile: `dst[i·E + j·db] = src[i·sa + j·E]`. With `nt`, the
/// micro tiles write whole destination lines with streaming stores, and the
/// partial lines at either end of each destination row (`dst` not
/// line-aligned, or a row that does not end on a line) get ordinary stores:
/// a line is written one way only, since a streamed line rewritten by an
/// ordinary store costs a round trip to memory.
///
/// # Safety
///
/// Every address formed for `i < ni`, `j < nj` is an element of its operand;
/// the CPU has the instructions of `kernels`; with `nt`, `size_of::<T>()` is a
/// power of two (or 3, on the AVX-512 kernels) and every destination row
/// `dst + j·db` has the alignment of `dst` modulo a line; the AVX-512
/// kernels only with `nt` and `db` a multiple of a line. `lines`: micro tiles in line blocks ([`Elem::micro_tiles`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<T: Elem>(
    kernels: Kernels,
    dst: *mut u8,
    src: *const u8,
    ni: usize,
    nj: usize,
    sa: isize,
    db: isize,
    nt: bool,
    lines: bool,
) {
    let e = size_of::<T>();
    // Micro tiles of `mi` source rows × `m` elements of each.
    let (mi, m) = kernels.micro_dims::<T>();
    // Columns [head, head + body) of each destination row are whole lines.
    let (head, body) = if nt {
        let lead = (LINE - dst as usize % LINE) % LINE;
        if lead.is_multiple_of(e) {
            let head = (lead / e).min(ni);
            // Whole lines of whole micro tiles along the row.
            let step = (LINE / e).max(mi);
            (head, (ni - head) / step * step)
        } else {
            (ni, 0)
        }
    } else {
        (0, ni / mi * mi)
    };
    let fj = nj / m * m;
    // Elements of 1 and 2 bytes, without streaming stores: a tile of a micro
    // tile or more ends in micro tiles moved back over the last whole ones,
    // which write some elements twice (the same values, inside the tile),
    // instead of up to 15 rows or columns element by element. Python, into
    // a new output, best of nine loops, three runs each (µs), without → with:
    // 40 × 50 × 60 u8 permuted 210 20.8–21.4 → 13.6–13.7, 127 × 131 × 5 u16
    // 16.3–16.7 → 14.6–15.2, 300 × 200 × 6 f16 32.7–35.1 → 27.1–27.8, 200 ×
    // 300 u8 transposed 4.5–4.7 → 4.3–4.6. Not for wider elements, whose
    // micro tiles leave at most 3 (SSE2) or 7 (AVX2) behind: f32 100 × 100
    // 1.73 → 1.81, 20 × 30 × 40 3.54 → 3.72.
    if size_of::<T>() <= 2 && !nt && kernels != Kernels::Avx512 && ni >= mi && nj >= m {
        let avx2 = kernels == Kernels::Avx2;
        // SAFETY: every block below lies within the `ni × nj` tile.
        let block = |i: usize, j: usize, fi: usize, fj: usize| unsafe {
            T::micro_tiles(
                avx2,
                dst.add(i * e).offset(j as isize * db),
                src.offset(i as isize * sa).add(j * e),
                fi,
                fj,
                sa,
                db,
                false,
                lines,
            )
        };
        block(0, 0, body, fj);
        if fj < nj {
            block(0, nj - m, body, m);
        }
        if body < ni {
            block(ni - mi, 0, mi, fj);
            if fj < nj {
                block(ni - mi, nj - m, mi, m);
            }
        }
        return;
    }
    // SAFETY: all offsets below stay within the `ni × nj` tile; the body's
    // destination rows start on a line (32-byte aligned micro tiles) with `nt`.
    unsafe {
        let (dst_body, src_body) = (dst.add(head * e), src.offset(head as isize * sa));
        match kernels {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512 => avx512::line_tiles(e, dst_body, src_body, body, fj, sa, db),
            k => T::micro_tiles(k == Kernels::Avx2, dst_body, src_body, body, fj, sa, db, nt, lines),
        }
        if fj < nj {
            // Right strip: j in fj..nj, i in the body.
            edge::<T>(
                dst.add(head * e).offset(fj as isize * db),
                src.offset(head as isize * sa).add(fj * e),
                body,
                nj - fj,
                sa,
                db,
            );
        }
        if head > 0 {
            // Left strip: i in 0..head, all j.
            edge::<T>(dst, src, head, nj, sa, db);
        }
        let done = head + body;
        if done < ni {
            // Bottom strip: i in done..ni, all j.
            edge::<T>(dst.add(done * e), src.offset(done as isize * sa), ni - done, nj, sa, db);
        }
    }
}

/// One `ni × nj` tile of [`Route::Avx512Sheared`] (`ni` a multiple of the
/// micro tile unless it is the last, `avail` elements of `a` from the tile's
/// first on): in destination row `j`, whose first whole line starts `s_j`
/// elements in, the elements from `s_j` (from 0 in the first tile) to `ni +
/// s_j` (to the end in the last): whole lines, streamed, but for the
/// partial lines at the ends of the copy, and the lines whose second micro
/// tile would lie past the end, element by element.
///
/// # Safety
///
/// Every address formed for `i < avail`, `j < nj` is an element of its
/// operand; the CPU has the AVX-512 kernels for `T`
/// (`avx512_has_kernel(e, true)`); `dst` and `db` are multiples of `size_of::<T>()`.
#[allow(clippy::too_many_arguments)]
unsafe fn sheared_tile<T: Elem>(
    dst: *mut u8,
    src: *const u8,
    ni: usize,
    nj: usize,
    sa: isize,
    db: isize,
    first: bool,
    avail: usize,
) {
    let e = size_of::<T>();
    let m = LINE / e;
    let lines = (ni / m).min((avail / m).saturating_sub(1));
    let fj = if lines > 0 { nj / m * m } else { 0 };
    // SAFETY: the kernel reads source rows i < m·(lines + 1) ≤ avail and
    // writes, in row j < fj, elements s_j .. s_j + m·lines < m·(lines + 1) ≤
    // avail (s_j < m); the rest below stays within [0, avail) of each row.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if fj > 0 {
            avx512::sheared_tiles(e, dst, src, lines, fj, sa, db);
        }
        // Between the first and the last tiles, the lines cover each row's
        // share but for the rows past the micro tiles (a loop over every
        // row of every tile cost 10 % of 4097 × 4095 f32).
        let inner = !first && lines * m == ni && ni < avail;
        for j in if inner { fj } else { 0 }..nj {
            let row = dst.offset(j as isize * db);
            let s = (LINE - row as usize % LINE) % LINE / e;
            let lo = if first { 0 } else { s.min(avail) };
            let hi = if ni == avail { avail } else { (ni + s).min(avail) };
            let (vlo, vhi) = if j < fj { (s, s + m * lines) } else { (lo, lo) };
            for (from, to) in [(lo, vlo), (vhi, hi)] {
                if from < to {
                    gather::<T>(
                        row.add(from * e),
                        src.offset(from as isize * sa).add(j * e),
                        to - from,
                        sa,
                    );
                }
            }
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

#[cfg(test)]
mod tests {
    use super::{
        EXTENDED_SRC_RUN_ALONE_MIN, EXTENDED_TILES_A_WORKER, Extension, LINE, NextTile, PlanDim,
        few_channels_of_wide_pixels, l2_has_few_ways, l2_sets, rows_crowd_l2_sets, runs_stream_threshold, slow_workers,
        small_tile_lines_per_set, stream_from,
    };

    /// Where the L2 has few ways, a transpose with a side of runs under 1
    /// KiB (61 × 11859 f64) streams from the row copies' threshold, later
    /// than one whose sides are both long (2400² u8); elsewhere alike.
    #[test]
    fn narrow_transposes_stream_later_where_the_l2_has_few_ways() {
        let (narrow_a, narrow_b) = channels_taken(61, 11859, 11859, 8);
        let (wide_a, wide_b) = channels_taken(2400, 2400, 2400, 1);
        let (narrow, wide) = (stream_from(narrow_a, narrow_b, 8), stream_from(wide_a, wide_b, 1));
        if l2_has_few_ways() {
            assert_eq!(narrow, runs_stream_threshold(false));
            assert!(narrow > wide, "{narrow} against {wide}");
        } else {
            assert_eq!(narrow, wide);
        }
    }

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

    /// `x[:, :k].T` of a `rows × pitch` matrix of `e`-byte elements: its
    /// (unit destination stride, unit source stride) dims.
    fn channels_taken(rows: usize, pitch: usize, k: usize, e: usize) -> (PlanDim, PlanDim) {
        let a = PlanDim {
            len: rows,
            src: (pitch * e) as isize,
            dst: e as isize,
        };
        let b = PlanDim {
            len: k,
            src: e as isize,
            dst: (rows * e) as isize,
        };
        (a, b)
    }

    #[test]
    fn a_few_channels_of_wide_pixels_leave_the_tiles() {
        let gathered = |rows, pitch, k, e| {
            let (a, b) = channels_taken(rows, pitch, k, e);
            few_channels_of_wide_pixels(a, b, e)
        };
        // Up to 3 channels, whatever the span in L2; more where the source
        // stays in L1, or 1- and 2-byte pixels under a line with up to 4.
        assert!(gathered(4000, 20, 2, 1));
        assert!(gathered(4000, 64, 3, 2));
        assert!(gathered(300, 20, 6, 8));
        assert!(gathered(4000, 20, 4, 1));
        // Pixels split512 takes; channels that fill 16-byte vectors (u16 × 8,
        // f32 × 4); more than 3 channels of a source past L1, the 4 of
        // 1- and 2-byte elements too where a pixel is a line.
        assert!(!gathered(4000, 8, 2, 1));
        assert!(!gathered(300, 20, 8, 2));
        assert!(!gathered(300, 20, 4, 4));
        assert!(!gathered(4000, 20, 6, 1));
        assert!(!gathered(4000, 64, 4, 1));
        // Not channels at all: source rows that do not have unit stride, more
        // than 8 channels, pitches not whole elements.
        let (a, mut b) = channels_taken(4000, 20, 2, 1);
        b.src = 2;
        assert!(!few_channels_of_wide_pixels(a, b, 1));
        assert!(!gathered(300, 20, 9, 1));
        let (mut a, b) = channels_taken(300, 20, 2, 4);
        a.src = 81;
        assert!(!few_channels_of_wide_pixels(a, b, 4));
    }

    /// The one-pass split takes 2 to 8 channels of wider pixels of every
    /// element size, with pixels for a step.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn first_channels_of_wide_pixels_go_one_pass() {
        use super::super::channels::Channels;
        use super::first_channels_in_one_pass;
        let split = |rows, pitch, k, e| {
            let (a, b) = channels_taken(rows, pitch, k, e);
            Channels::first_of_wide_pixels(a, b, e)
        };
        for e in [1, 2, 4, 8] {
            assert_eq!(split(4000, 20, 2, e), Some(Channels::SplitWide(2)));
            assert_eq!(split(300, 9, 8, e), Some(Channels::SplitWide(8)));
            // Packed pixels (the other splits'), more than 8 channels, one.
            assert_eq!(split(4000, 3, 3, e), None);
            assert_eq!(split(4000, 20, 9, e), None);
            assert_eq!(split(4000, 20, 1, e), None);
        }
        // Fewer pixels than a step (16 bytes, 8 f32, 4 f64); 3-byte elements.
        assert_eq!(split(15, 20, 2, 1), None);
        assert_eq!(split(16, 20, 2, 1), Some(Channels::SplitWide(2)));
        assert_eq!(split(7, 20, 2, 4), None);
        assert_eq!(split(3, 20, 2, 8), None);
        assert_eq!(split(4000, 20, 2, 3), None);
        // At any size: 2 and 3 channels, not 4, nor pixels of under 7 bytes.
        let one_pass = |pitch, k, e| {
            let (a, b) = channels_taken(100_000, pitch, k, e);
            first_channels_in_one_pass(a, b, e, false, false)
        };
        assert!(one_pass(64, 2, 4) && one_pass(9, 3, 8) && one_pass(7, 2, 1) && one_pass(5, 3, 2));
        assert!(!one_pass(64, 4, 4) && !one_pass(6, 2, 1));
        // Slices of a batch: 8-byte elements, 4-byte ones out of the small
        // route, 64 pixels or more, planes that are not consecutive runs
        // (here a batch dim of 7 between them).
        let sliced = |rows: usize, e: usize, small| {
            let (a, mut b) = channels_taken(rows, 20, 3, e);
            b.dst = (7 * rows * e) as isize;
            first_channels_in_one_pass(a, b, e, true, small)
        };
        assert!(sliced(64, 4, false) && sliced(512, 8, false) && sliced(512, 8, true));
        assert!(!sliced(63, 4, false) && !sliced(512, 2, false) && !sliced(512, 4, true));
        let (a, mut b) = channels_taken(67, 20, 3, 4);
        b.dst = 67 * 4;
        assert!(!first_channels_in_one_pass(a, b, 4, true, false));
        assert!(first_channels_in_one_pass(a, b, 4, false, true));
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

    #[test]
    fn next_tiles_lines_come_in_the_divided_shares() {
        // The schedule the accumulator replaces: step `s` of `steps` took the
        // lines `s · total / steps .. (s + 1) · total / steps`, line `k` at
        // row `k / row_lines`, line `k % row_lines` of it.
        let base = 1usize << 20;
        for (rows, row_bytes, sa, steps) in [
            (32, 2048, 4096, 32),
            (256, 64, 2 << 20, 512),
            (7, 100, 1000, 3),
            (5, 64, 64, 1),
            (1, 64, 0, 9),
            (130, 1000, 4160, 17),
        ] {
            let mut next = NextTile::new(base as *const u8, rows, row_bytes, sa, steps);
            let row_lines = next.row_lines;
            let total = rows * row_lines;
            for step in 0..steps + 2 {
                let mut got = Vec::new();
                next.step_with(|p| got.push(p as usize));
                let lines = (step * total / steps).min(total)..((step + 1) * total / steps).min(total);
                let want: Vec<usize> = lines
                    .map(|k| base.wrapping_add_signed((k / row_lines) as isize * sa) + k % row_lines * LINE)
                    .collect();
                assert_eq!(
                    got, want,
                    "rows {rows}, {row_bytes} bytes, sa {sa}, step {step} of {steps}"
                );
            }
        }
    }

    #[test]
    fn small_tile_lines_per_l1_set() {
        // (row stride, rows, row bytes) of small tiles: bytes, rows 1 KiB
        // apart (16 start sets), 64 rows of four lines; f16 2 KiB apart.
        assert_eq!(small_tile_lines_per_set(1024, 64, 256), 16);
        assert_eq!(small_tile_lines_per_set(2048, 32, 256), 16);
        // f32 rows 2 KiB apart, 16 rows: eight a set; f64 4 KiB apart: eight.
        assert_eq!(small_tile_lines_per_set(2048, 16, 256), 8);
        assert_eq!(small_tile_lines_per_set(4096, 8, 256), 8);
        assert_eq!(small_tile_lines_per_set(-4096, 8, 256), 8);
        // Rows 1536 bytes apart start on 8 sets 8 apart: four rows each.
        assert_eq!(small_tile_lines_per_set(1536, 32, 256), 4);
        // Rows longer than the gap between starts overlap their neighbours':
        // 64 rows of four lines cover the 64 sets four times over.
        assert_eq!(small_tile_lines_per_set(64, 64, 256), 4);
        assert_eq!(small_tile_lines_per_set(128, 64, 256), 4);
        assert_eq!(small_tile_lines_per_set(128, 64, 64), 2);
        // Rows that do not start on a line.
        assert_eq!(small_tile_lines_per_set(1000, 64, 256), 0);
        // Eight complex128 rows of 1 KiB, 1600 bytes apart (100² transposed):
        // no set holds more than the eight rows.
        assert_eq!(small_tile_lines_per_set(1600, 8, 1024), 8);
    }

    /// The most lines of the tile in one of the 64 sets, counted line by line.
    fn lines_per_set_counted(db: isize, rows: usize, row_bytes: usize) -> usize {
        let mut count = [0usize; 64];
        for r in 0..rows as isize {
            let first = (r * db).div_euclid(64);
            let lines = row_bytes.div_ceil(64).min(64) as isize;
            for l in 0..lines {
                count[(first + l).rem_euclid(64) as usize] += 1;
            }
        }
        count.into_iter().max().unwrap_or(0)
    }

    #[test]
    fn small_tile_lines_per_l1_set_never_undercounts() {
        for db in (-64 * 130..=64 * 130).step_by(64).filter(|&d| d != 0) {
            for rows in [1, 2, 4, 8, 16, 32, 64, 256] {
                for row_bytes in [16, 64, 128, 256, 1024] {
                    let bound = small_tile_lines_per_set(db, rows, row_bytes);
                    let counted = lines_per_set_counted(db, rows, row_bytes);
                    assert!(
                        bound >= counted && bound <= rows,
                        "{db} {rows} {row_bytes}: {bound} < {counted}"
                    );
                }
            }
        }
    }
}
