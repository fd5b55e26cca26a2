//! Transposes (`PlanKind::Transpose`): blocked 2-D tiles of register
//! micro-transposes, batched over the other dims, written straight into the
//! destination in whole cache lines, or through a staging tile (long runs on
//! both sides, with the next tile's source prefetched meanwhile; destination
//! rows that cannot be line-aligned).
//!
//! This file picks a copy's route and walks its tiles; the tiles' sizes
//! ([`tile_sizes`]), the prefetches made while a tile is written out
//! ([`prefetches`]), the tiles that batch dims extend ([`extension`]) and
//! the AVX-512 tiles staged a page of each crowded row at a time
//! ([`staged_rows`]) have files of their own.

mod extension;
mod prefetches;
mod staged_rows;
mod tile_sizes;

use smallvec::SmallVec;

use self::extension::{Extension, extended_split};
pub(super) use self::prefetches::NextTile;
use self::prefetches::RunEnds;
use self::staged_rows::StagedRows;
use self::tile_sizes::{
    AVX512_SHEARED_TILE, AVX512_TILE, AVX512_TILE_2, AVX512_TILE_3, PREFETCHED_1_OFF_AVX512, SHEARED_MIN_ROW,
    SMALL_DST_RUN, avx2_line_tile, prefetched_tile, small_runs, small_src_len,
};
#[cfg(target_arch = "x86_64")]
use super::avx2::{self, enabled as avx2_enabled};
#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::blocks::{LINE, rows_crowd_l1_sets};
use super::caches::{l2_bytes, l2_has_few_ways, l2_is_big};
#[cfg(target_arch = "x86_64")]
use super::channels::{Channels, channels};
use super::cpu_model::is_zen3;
use super::elem::Elem;
#[cfg(target_arch = "x86_64")]
use super::folded512::{self, Folded};
use super::general::{SHORT_GATHER, gather, general, scatter};
use super::parallel::{Shared, for_each_segment, par_for_slow};
use super::runs::{copy_run, runs_stream_threshold, store_fence, stream_threshold};
#[cfg(target_arch = "x86_64")]
use super::split512;
use super::stage::{STAGE, with_stage};
use crate::copy::plan::{CopyPlan, INLINE_DIMS, PlanDim};

/// No AVX2 kernels off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn avx2_enabled() -> bool {
    false
}

/// Source rows of bytes whose lines AVX2's whole-line kernel needs in L1
/// together: all 64 of a micro tile, read 16 bytes at a time, to which the
/// micro tiles beside it come back. [`Route::Avx2Lines`] takes byte rows
/// whose lines do not crowd L1 sets that many at a time
/// ([`rows_crowd_l1_sets`]). From rows a multiple of 4 KiB apart (every line
/// of a micro tile in one set), two cores, `devtensor bench` (% of memcpy),
/// two runs each: 8192² u8 54–55 prefetched, 25–33 in tiles of 64 to 128
/// rows; Zen 4 VM, Python, GB/s, two alternated processes: 8192² 23–27 and
/// 4096 × 8192 29–30 prefetched, 12–16 in tiles of 64 to 256 rows. Rows of
/// 2- and 4-byte elements take it however they crowd, in shorter tiles
/// ([`avx2_line_tile`]). Of 2-byte ones, the earlier VM's bench read 4096²
/// 56–57 % prefetched, 58–59 in 32-row tiles; the Zen 4 VM (1 MiB 8-way L2),
/// Python, into a reused output, the best GB/s of three alternated
/// processes, prefetched → here: 4096² 21.2 → 27.0, 2048 × 4096 18.3 →
/// 24.9, 4096 × 2048 22.6 → 27.1, 8192 × 4096 22.3 → 24.9, 4096 × 8192
/// 23.3 → 26.0, 8 × 2048² permuted 021 20.9 → 27.7 (each shape's every run
/// here above its every run there).
const AVX2_LINE_BYTE_ROWS_IN_L1: usize = 64;

/// Whether AVX2's whole-line kernels ([`avx2::line_tiles`]) run and have one
/// for `e`-byte elements (none off x86-64).
fn has_avx2_line_kernel(e: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2_enabled() && avx2::has_line_kernel(e)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = e;
        false
    }
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
pub(super) const L1_SET_SPAN: isize = 4096;

/// Ways of the smallest L1D (Zen's 32 KiB, 8-way).
pub(super) const L1_WAYS: usize = 8;

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

/// Fewest elements of each destination run for [`Route::Avx2Lines`] (where
/// source runs are [`PREFETCHED_MIN_RUN`] or longer): 256 bytes, 512 or 1
/// KiB. Python, two cores, from NumPy arrays into a reused output, two
/// alternated runs, µs, prefetched route → this one, NCHW → NHWC of N × C ×
/// 56 × 56: u8 16 × 512 2920–3139 → 1643–1865, 32 × 256 2597–2707 →
/// 1761–1853; f16 32 × 256 4921–4931 → 3118–3353; but 128 channels of f16
/// 2202–2276 → 2207–2381, of f32 4453–4594 → 4295–4490, 64 of f32
/// 2019–2055 → 2085–2283. Shorter source runs lost (64 × 1024 × 384 u8
/// permuted 021, 384-byte source runs: 2376–2799 → 5768–6003; 64 × 2048 ×
/// 128 f32 5901–6020 → 6368–8876).
const AVX2_LINES_MIN_DST_LEN: usize = 256;

/// Fewest bytes of each destination run of a streamed transpose that takes
/// [`Route::Prefetched`] instead of [`Route::Avx2Lines`] on a Zen 3 core
/// (`zen3_prefetched` in [`transpose`]). Zen 3 VM (EPYC family 19h model 01h,
/// two cores, 32 KiB 8-way L1D, 512 KiB 8-way L2 a core, 32 MiB L3), in-process
/// A/B through `copy_strided`, best of six to eight alternated calls, speed-up,
/// two threads, two or three runs: f16 4096² transposed 1.23–1.42×, from a
/// 4128-wide matrix 1.46–1.58×, 8192 × 4096 1.21–1.48×, 3072 × 5000 1.26×,
/// 1024 × 8192 1.36×, 8192 × 1024 1.22×; u8 8192² from an 8256-wide matrix
/// 1.13–2.01×, 6144 × 6000 2.10×; f32 4096² 1.02–1.11× (within the noise),
/// from a 4112-wide matrix 1.18–1.26×, 1024 × 8192 1.21×; 256³ f32 permuted
/// 210 1.32×, 32 × 512² 021 1.08–1.19×; NCHW → NHWC of 1 KiB to 4 KiB pixels:
/// u8 × 1024 channels 1.28–1.43×, × 2048 1.48×, × 4096 1.30×, f16 × 1024
/// 1.53×, f32 × 256 0.90–1.14×, × 1024 1.08×. One thread: f16 4096² 0.90×,
/// f32 1.08×, u8 8192² from an 8256-wide matrix 2.26×, 256³ f32 210 1.24×.
/// Shorter destination runs lost: NCHW → NHWC of 512-byte pixels, u8 16 × 512
/// × 56² 0.44×, f16 32 × 256 × 56² 0.52×. Where the AVX2 route writes a line
/// of each of 16 rows in turn, the prefetched one stages its tile and streams
/// each destination row's run whole: that CPU takes streamed writes a line of
/// each row in turn at half the speed of two lines of each row back to back
/// (`benches/transpose_ceiling.rs`, 4096² f16, two threads: `writes, tile
/// order` 10.7 GB/s, `writes, tile pairs` and `row pairs` 20.6).
const ZEN3_PREFETCHED_MIN_DST_RUN: usize = 1024;

/// Fewest bytes of each source run of a 2-byte transpose that takes
/// [`Route::Avx2Lines`] instead of [`Route::Avx512`] where a core's L2 is
/// big ([`l2_is_big`]; `big_l2_avx2_lines` in [`transpose`]). On an Emerald
/// Rapids VM (2 MiB 16-way L2, 48 KiB 12-way L1, 512-bit AVX-512 units), f16
/// from NumPy arrays, Python, into a reused output, in-process A/B, best of
/// seven alternated calls, speed-up, one thread / two: 4096² transposed
/// 1.13–1.17× / 1.13–1.26×, 8192 × 4096 1.14× / 1.12–1.17×, 4096² of a
/// 4128-wide matrix 1.24–1.25× / 1.06–1.23×, 4096 × 2048 0.95× / 1.00×.
/// Not f32 there (4096² 0.75× / 0.71×, 32 × 512² batched 0.90× / 0.80×), nor
/// f16 with short source runs (64 × 2048 × 128 permuted 021 0.89× / 0.92×;
/// 16 × 4096 × 128 1.05–1.06× / 1.06–1.07×, 64⁴ 3021 1.16× / 1.02×, 32⁵
/// 03142 1.01× / 0.97–0.99×). The Zen 5 VM the AVX-512 route was tuned on
/// (1 MiB 16-way L2) keeps it.
const BIG_L2_AVX2_LINES_MIN_SRC_RUN: usize = 4096;

/// Fewest elements of the runs on both sides of a permute that takes
/// [`Route::Avx2Lines`] where the L2 has few ways instead of [`Route::Avx512`]
/// (`few_ways_avx2_lines` in [`transpose`]), however short. Zen 4 VM, f32,
/// in-process A/B, best of six alternated calls, speed-up, two threads /
/// one: 64⁴ permuted 3021 1.37–1.60× / 1.52–1.66×, 3210 1.98× / 2.00×, f16
/// 3021 1.71× / 1.77×, 128 × 256 × 512 210 1.26× / 1.26×; 64 × 2048 × 128
/// 021 0.95× / 0.99×. Shorter runs, of 32: 32⁵ f32 43210 0.87× / 0.88×,
/// 03142 0.96× / 1.09×, f16 0.70× / 0.73×.
const FEW_WAYS_AVX2_LINES_MIN_LEN: usize = 64;

/// Shortest source runs (bytes) whose tiles on [`Route::Avx2Lines`] start
/// where source lines do, after a narrow first block. Shorter ones start at
/// the run's first element and load across lines: a narrow first block and
/// the narrow last one left 16 of 1 KiB runs' 256 f32 to the tiles' scalar
/// edges, whose ordinary stores wait among the streamed ones. Python, two
/// cores, from NumPy arrays (16 bytes past a line), % of a copy, three
/// alternated runs: 256³ f32 permuted 210 40.8–41.5 → 51.7–53.4. Longer
/// runs keep the first block (from an array offset by one element, 4096 ×
/// 4095 f32 transposed, two runs: 79–83 with it, 73–74 without).
const AVX2_LINES_LEAD_MIN_SRC_RUN: usize = 2048;

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
    /// CPU has AVX-512 (bytes only below half the streaming size), instead
    /// of the prefetched route, or of the others
    /// where destination runs are whole lines: micro tiles whose every store
    /// is a whole line ([`avx512`]), straight from the source to memory,
    /// along bands of source rows that give each destination row two lines a
    /// step (4096² f32 on two cores, Xeon VM, GB/s: 30 prefetched, 45 here;
    /// 4096 × 2048 RGB pixels, three lines a row a step: 36–37 → 41–42).
    /// Where the L2 has few ways, only bytes, 8-byte elements and 2- or
    /// 4-byte ones with short runs take it (`few_ways_avx2_lines` in
    /// [`transpose`]). Tiles whose source rows crowd the L2's sets are
    /// copied a page of each row at a time first ([`StagedRows`]).
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
    /// Not where the L2 has few ways: the prefetched route wins there
    /// (`few_ways_avx2_lines` in [`transpose`]).
    Avx512Sheared,
    /// The AVX-512 route's walk where the CPU has AVX2 only (and for large
    /// copies of bytes where it has AVX-512 too), for 1-, 2- and
    /// 4-byte elements with source runs of [`PREFETCHED_MIN_RUN`] or more and
    /// destination runs of [`AVX2_LINES_MIN_DST_LEN`] elements (of bytes, from
    /// source rows whose lines spread over L1 sets, [`rows_crowd_l1_sets`]): micro
    /// tiles of a line's rows × 16 elements whose lines are streamed whole,
    /// each in two stores back to back ([`avx2::line_tiles`]), in tiles of 512
    /// source rows ([`avx2_line_tile`]), each row's lines prefetched two ahead.
    /// On the prefetched route every byte is stored twice, into the staging
    /// tile and out of it, and the tile's ordinary stores queue behind the
    /// streamed ones in the store buffer: the transposes wait on the writes to
    /// memory instead of overlapping them. Zen 2 VM, two cores, `devtensor
    /// bench` (% of memcpy), three alternated runs, prefetched → here: from a
    /// matrix wider than its rows, 8192² u8 60–61 → 70–71, 4096² f16 63–64 →
    /// 80–81, f32 70–72 → 89–90; 32 × 512² f32 batched 68 → 78, NCHW → NHWC 16
    /// × 256 × 56² f32 66–68 → 85–87, NHWC → NCHW 61–63 → 69–70, 256³ f32
    /// permuted 201 61–62 → 73–76. Python, two cores, from NumPy arrays into a
    /// reused output, two alternated runs, µs: `x.T` of 6144 × 6000 u8
    /// 2796–2854 → 1961–2566, 3072 × 5000 f16 1898–2137 → 1306–1785, 2048 ×
    /// 3000 f32 1504–1626 → 912–1250; 8 × 1024 × 1000 f16 permuted 021 937–1049
    /// → 605–769 (and [`AVX2_LINES_MIN_DST_LEN`]). Byte rows a multiple of 4
    /// KiB apart keep the prefetched route (a micro tile's rows in one L1
    /// set, [`AVX2_LINE_BYTE_ROWS_IN_L1`]; one thread, 8192² u8 37 → 18,
    /// through a copy of each strip 37 → 38), and so do shorter runs (16 ×
    /// 4096 × 128 f16 batched, 256-byte source rows, one thread: 60 → 44) and
    /// 8-byte elements (2048 × 4096 f64: 61 → 36–51). Those of 2- and 4-byte
    /// ones come here, in shorter tiles ([`avx2_line_tile`]): two
    /// cores, alternated runs, 4096² f32 73–75 → 86–87, 256³ permuted 210
    /// 58–63 → 76–77, offset by one 4096 × 4095 66–75 → 82–85; Python, into a
    /// reused output, GB/s, from NumPy arrays, the medians of four alternated
    /// runs: 4096² f32 27.0 → 28.0, 2048 × 4096 27.3 → 31.6, 4096 × 2048 26.5
    /// → 30.0, 8192 × 1024 25.3 → 27.8, 3072² 26.6 → 31.3, 16 × 1024²
    /// permuted 021 25.2 → 29.5, 64 × 512 × 1024 021 26.7 → 30.2; from
    /// line-aligned ones, three alternated runs: 256³ 210 21.6–22.4 →
    /// 26.1–27.6, 512 × 16384 26.4–27.8 → 32.1–33.2, 256 × 32768 22.9–23.6 →
    /// 30.8–33.2. 4096² called back to back gains little (5.7–6.1 ms → 5.5–6.3,
    /// three processes each); with a 64 MiB copy between calls, as in the
    /// bench, 5.9 → 5.2–5.5.
    Avx2Lines,
    /// The sheared route's walk with AVX2's kernel ([`avx2::sheared_tiles`]:
    /// each row's lines joined from two steps' in a ring in L1) where the L2
    /// has few ways, which the sheared AVX-512 route leaves to the prefetched
    /// one: streamed copies of 4-byte elements into destination rows of 8 KiB
    /// or more ([`SHEARED_MIN_ROW`]) that do not start on a line, from source
    /// rows whose lines spread over L1 sets ([`rows_crowd_l1_sets`]), in
    /// [`avx2_line_tile`]'s tiles. Zen 4 VM, `devtensor bench` with these
    /// shapes added, alternated runs, prefetched → here: one thread (% of
    /// memcpy), f32 3000 × 5001 53–54 → 76–77, 5001 × 3000 56–59 → 77–82,
    /// 2000 × 6001 52–62 → 64–65; two threads (GB/s) 40.2–41.9 → 47.6–49.4,
    /// 40.9–41.4 → 48.3–48.5, 44.3–47.7 → 45.6–54.0. Not from crowding rows
    /// (4097 × 4095, rows 16380 bytes apart: one thread 46–49 → 42–47 in
    /// tiles of 64 to 1024 rows, two 35.8–36.0 → 34.6–34.9 GB/s), nor for 2-
    /// and 1-byte elements (one thread: f16 4097 × 4095 40–41 → 25–26, 3000 ×
    /// 5001 55–57 → 56–57; u8 3000 × 5001 45–53 → 42–43, 8193 × 8191 35 → 14).
    Avx2Sheared,
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
    /// AVX2's whole-line kernels ([`super::avx2::line_tiles`]), streamed only;
    /// `copied`: through an L1 copy of each line column ([`through_l1`]).
    Avx2Lines { copied: bool },
}

impl Kernels {
    /// The micro tile for `T` as (source rows, source elements a row): the
    /// element type's square one, the AVX-512 kernel's
    /// ([`avx512::micro_dims`]: 64 × 16 for 3-byte pixels), or AVX2's
    /// whole-line one (a line's elements × 16).
    fn micro_dims<T: Elem>(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512 => avx512::micro_dims(size_of::<T>()),
            Kernels::Avx2Lines { .. } => (LINE / size_of::<T>(), 16),
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
    // rows (of bytes, those under half the streaming size: `bytes_off_avx512`
    // below) go straight to memory in whole lines: those that would be staged
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
    // Where the CPU has AVX2 and not AVX-512 (whose route above comes first),
    // or has it and the copy is of bytes from half the streaming size, streamed
    // copies with long runs on both sides, line-aligned destination
    // rows and source rows whose lines spread over L1 sets take whole-line
    // micro tiles too ([`Route::Avx2Lines`], [`AVX2_LINES_MIN_DST_LEN`]):
    // those lines of byte rows the kernel reads together ([`AVX2_LINE_BYTE_ROWS_IN_L1`]).
    // On a Zen 3 core ([`is_zen3`]), streamed copies whose destination runs
    // are [`ZEN3_PREFETCHED_MIN_DST_RUN`] or longer take the prefetched route
    // instead: each of its tiles' destination rows is written as one run of
    // whole lines, where AVX2's whole-line micro tiles write a line of each of
    // 16 rows in turn.
    let zen3_prefetched = prefetched && a.len * e >= ZEN3_PREFETCHED_MIN_DST_RUN && is_zen3();
    let avx2_lines = nt
        && !zen3_prefetched
        && has_avx2_line_kernel(e)
        && dst_rows_line_aligned
        && a.len >= AVX2_LINES_MIN_DST_LEN
        && b.len * e >= PREFETCHED_MIN_RUN
        && !(e == 1 && rows_crowd_l1_sets(a.src, AVX2_LINE_BYTE_ROWS_IN_L1));
    // Where the L2 has few ways ([`l2_has_few_ways`]; of the CPUs with
    // AVX-512, a Zen 4 VM: 8-way 32 KiB L1, 8-way 1 MiB L2, its AVX-512 run
    // as two 256-bit halves) the AVX-512 routes lose: 3-byte pixels and rows
    // off line boundaries (the sheared route) take the prefetched route, 2-
    // and 4-byte elements AVX2's whole-line one where it takes them. That
    // VM, two cores, `devtensor bench`'s patterns, in-process A/B, best of
    // seven alternated calls, speed-up, two threads / one: 4096 × 2048 RGB
    // 1.65× / 1.52×, 4097 × 4095 f32 1.57× / 1.58×; f16 4096² 1.16–1.21× /
    // 1.18×, from a 4128-wide matrix 1.14–1.20× / 1.17×; f32 4096²
    // 1.05–1.23× / 1.09–1.21×, from a 4112-wide matrix 1.02–1.34× /
    // 1.22–1.31×, offset by one 1.33–1.70× / 1.44–1.58×, 256³ permuted 210
    // 1.35–1.40× / 1.39–1.44×, 201 1.05–1.19× / 1.09–1.15×, 32 × 512²
    // batched 0.94–1.16× / 1.04–1.09×; NCHW ↔ NHWC 16 × 256 × 56² 0.93–1.03×
    // / 0.87–0.93× (the one loss).
    // So do permutes whose runs are [`FEW_WAYS_AVX2_LINES_MIN_LEN`] elements
    // or more on both sides, which AVX2's whole-line route takes there only.
    let few_ways_avx2_lines = l2_has_few_ways()
        && (e == 2 || e == 4)
        && (avx2_lines || a.len >= FEW_WAYS_AVX2_LINES_MIN_LEN && b.len >= FEW_WAYS_AVX2_LINES_MIN_LEN);
    // Where a core's L2 is big ([`l2_is_big`]), 2-byte elements from long
    // source rows take AVX2's whole-line route too.
    let big_l2_avx2_lines = e == 2 && avx2_lines && b.len * e >= BIG_L2_AVX2_LINES_MIN_SRC_RUN && l2_is_big();
    let avx512_whole_lines = nt
        && (prefetched || whole_line_runs)
        && avx512_has_kernel(e, false)
        && dst_rows_line_aligned
        && b.len * e >= LINE;
    let avx512_lines = avx512_whole_lines && !(l2_has_few_ways() && e == 3 || few_ways_avx2_lines || big_l2_avx2_lines);
    // Bytes from half the streaming size on ([`stream_threshold`], the
    // last-level cache) leave the AVX-512 route: for AVX2's whole-line one
    // where their rows spread over L1 sets, else for the prefetched one
    // (staged where runs are short), whose tile ([`PREFETCHED_1_OFF_AVX512`])
    // writes four lines of each destination row together, where the AVX-512
    // route's bands of 128 rows write two (bands of 256 lost there). Zen 5 VM,
    // in-process A/B, into a reused output, best of six alternated calls in
    // both orders, speed-up on one core / two: prefetched, 8192² 1.30–1.37× /
    // 1.21–1.27×, 4096² 1.52–1.59× / 1.30–1.59×, 16384 × 4096 1.37–1.45× /
    // 1.20–1.25×, 4096 × 16384 1.34–1.36× / 1.23–1.28×, 16 × 4096 × 1024
    // batched 1.33–1.41× / 1.13–1.23×, 64 × 1024² 021 1.39–1.43× /
    // 1.08–1.18×; AVX2's, from an 8256-wide matrix 1.35–1.39× / 1.18–1.26×,
    // 7680 × 4320 2.22–2.36× / 1.64–1.82×; staged, 256² × 512 permuted 210
    // 1.28–1.37× / 1.25–1.30×. Smaller copies keep it (the prefetched route:
    // 2048² 0.95–0.96× on one core, 4096 × 2048 0.92–0.95×).
    let bytes_off_avx512 = avx512_lines && e == 1 && plan.bytes() >= stream_threshold() / 2;
    let route = if small && !rows_share_sets() {
        Route::Small
    } else if avx512_lines && !bytes_off_avx512 {
        Route::Avx512
    } else if nt
        && prefetched
        && !l2_has_few_ways()
        && avx512_has_kernel(e, true)
        && dst_rows_elem_aligned
        && b.len * e >= LINE
        && a.len * e >= SHEARED_MIN_ROW
    {
        Route::Avx512Sheared
    } else if nt
        && prefetched
        && l2_has_few_ways()
        && e == 4
        && avx2_enabled()
        && dst_rows_elem_aligned
        && !dst_rows_line_aligned
        && b.len * e >= LINE
        && a.len * e >= SHEARED_MIN_ROW
        && !rows_crowd_l1_sets(a.src, LINE / e)
    {
        Route::Avx2Sheared
    } else if avx2_lines || avx512_whole_lines && few_ways_avx2_lines {
        Route::Avx2Lines
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
    // × 23 × 2 f64 2310 4.6 → 5.4). Nor small ones of 8-byte elements with
    // source runs of 1 to 3, unfolded rows of 9 to 31 (two to four micro
    // tiles, the last one masked) and folded columns: the row gathers below
    // take them. Python, µs, three alternated processes, folded → gathers
    // (NumPy): 17 × 19 × 23 × 2 f64 0321 5.4–5.9 → 4.0–4.2 (4.8), 29 × 27
    // × 3 210 0.93–0.98 → 0.80–0.81 (0.84), 31 × 29 × 27 × 2 2130 11.7–12.8
    // → 10.1–10.3, 31 × 29 × 27 × 3 3120 12.1–12.6 → 11.1–11.3, 5 × 7 × 9 ×
    // 11 × 2 03142 3.8 → 3.3 (3.4), 14032 3.8 → 2.2 (3.5); of 138 f64
    // permutes (bench/cpu_permute_sweep.py), 16 under the faster peer → 9.
    // Rows of 64 and 100 keep the folded tiles (64 × 64 × 2 f64 120 1.43×
    // the time gathered, without AVX-512).
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
    // Small permutes of 8-byte pixels (source runs of 1 to 3) into rows of 9
    // or more: the row gathers below, which the folded tiles leave those of
    // unfolded rows under `SHORT_GATHER` (figures at both uses below).
    let pixel_rows = route == Route::Small && e == 8 && b.len <= 3 && a.len >= 9;
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
        && !(pixel_rows && a.len < SHORT_GATHER && !f.rows_folded())
        && (route == Route::Small || plan.bytes() < stream_threshold() || f.sides().0 * e >= PAGE)
    {
        // SAFETY: forwarded; `enabled` holds and `f` is this plan's.
        unsafe { folded512::transpose(&f, dst, src, e, plan.bytes()) };
        return;
    }
    // Small copies of 8-byte elements whose source runs are one to three of
    // them, under destination runs of 9 or more: the general kernel's row
    // gathers (as for the runs further down), before any extension, whose
    // tiles of SSE2's 2 × 2 micro tiles lose to them there. Python, µs,
    // extended → rows (NumPy, torch): 31 × 29 × 27 × 3 f64 permuted 1320
    // 44.8 → 19.2 (23.6, 31.2), 0321 30.0 → 21.3 (30.0, 34.5), 3120 46.2 →
    // 22.1; 29 × 27 × 3 f64 210 1.78 → 1.21 (1.02). Runs of 9 to 15, best of
    // two processes, AVX-512's folded tiles → rows: 10 × 12 × 14 × 3 3120
    // 2.16 → 1.57 (2.22), 0321 2.18 → 1.80 (2.11); 13 × 11 × 9 × 2 0321 1.58
    // → 0.99 (1.14), 9 × 15 × 11 × 2 1320 1.72 → 1.13 (1.45); of the 62
    // permutes of those shapes, 40 × 9 × 3 and 12 × 30 × 2, 18 faster, none
    // slower by more than 4 %, 33 under NumPy → 22. Not 4-byte ones, whose extension mostly wins:
    // 31 × 29 × 27 × 2 f32 2031 15.2 → 22.8, 17 × 19 × 23 × 2 2130 5.7 → 8.8.
    if pixel_rows {
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
    // tile. AVX2 on the routes whose tiles are line-aligned, and on the small
    // and staged routes where its accesses keep to 32-byte blocks
    // ([`tiles_take_avx2`]): on 16-byte aligned operands half of the
    // 32-byte accesses straddle two lines (128² f32 from and to 16-byte
    // aligned buffers, one run: 63 GB/s with SSE2, 39 with AVX2).
    // Three-byte elements on every route: their only vector kernel is
    // AVX2's, and their rows straddle lines anyway.
    let copied = route == Route::Avx2Lines && through_l1(e, a.src, b.len * e);
    let kernels = if matches!(route, Route::Avx2Lines | Route::Avx2Sheared) {
        Kernels::Avx2Lines { copied }
    } else if matches!(route, Route::Avx512 | Route::Avx512Sheared) {
        Kernels::Avx512
    } else if (matches!(route, Route::Lines | Route::Prefetched)
        || e == 3
        || tiles_take_avx2::<T>(route, a, b, &batch, dst, src))
        && avx2_enabled()
    {
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
        Route::Prefetched if bytes_off_avx512 && !l2_has_few_ways() && a.src % LINE as isize == 0 => {
            PREFETCHED_1_OFF_AVX512
        }
        Route::Prefetched => prefetched_tile(e, a, nt, plan.bytes()),
        Route::Staged => (512, 2048, 256 << 10),
        Route::Avx2Lines => avx2_line_tile(e, !copied && rows_crowd_l1_sets(a.src, LINE / e)),
        Route::Avx512 if e == 3 => AVX512_TILE_3,
        Route::Avx512 if e == 2 => AVX512_TILE_2,
        Route::Avx512 => AVX512_TILE,
        Route::Avx512Sheared => AVX512_SHEARED_TILE,
        Route::Avx2Sheared => avx2_line_tile(e, false),
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
    // The AVX-512 route's tiles whose source rows crowd the L2's sets and go
    // on along the batch: copied a page of each row at a time before their
    // transposes ([`StagedRows`], which regroups the batch's fastest dim).
    // Not where the L2 has few ways. Zen 4 VM (8-way 1 MiB L2), two cores,
    // staged → not: `devtensor bench`, five alternated runs, 32⁴ × 16 f32
    // permuted 43210 25.5–27.4 → 29.9–33.3 GB/s, 64⁴ f32 3021 and 256³ f32
    // 210 0.97–1.02×, 32⁵ f16 03142 0.99–1.03×; Python, from NumPy arrays,
    // best of 12 calls, seven alternated processes: 43210 of 32⁴ × 16 f32
    // 1.3×, 32⁴ × 8 f64 1.4–1.5×, 32⁵ f32 1.4×, 32⁴ × 32 f16 1.0–1.07×;
    // 64⁴ f32 3210, 256³ f32 and f16 210, u8 256 × 128 × 256 210 even.
    let staged = (route == Route::Avx512 && !l2_has_few_ways())
        .then(|| StagedRows::find(a, b, &mut batch, bi, bj, e))
        .flatten();
    let stage_bytes = if let Some(rows) = &staged {
        rows.stage_bytes(bi, bj, e)
    } else if matches!(route, Route::Staged | Route::Prefetched) {
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
        Route::Lines | Route::Prefetched | Route::Avx512 | Route::Avx2Lines => ((LINE - p % LINE) % LINE / e).min(len),
        _ => 0,
    };
    let cols = Blocks::new(a.len, bi, lead(dst as usize, a.len));
    // Not the source's on the AVX-512 route: its kernels load 16 bytes of a
    // row at a time, which a source not line-aligned only spreads over two
    // lines, while a narrow first block leaves source rows of a line or two
    // (permutes) to the scalar edges. From NumPy arrays (data 16 bytes past
    // a line), without the lead block against with: 32⁵ f16 03142 4.2×, 16 ×
    // 4096 × 128 f16 1.21×, 2-D transposes 0.99–1.00×. Nor on AVX2's
    // whole-line route from source runs under [`AVX2_LINES_LEAD_MIN_SRC_RUN`].
    let src_lead = if matches!(route, Route::Avx512 | Route::Avx512Sheared | Route::Avx2Sheared)
        || (route == Route::Avx2Lines && b.len * e < AVX2_LINES_LEAD_MIN_SRC_RUN)
    {
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
    // The AVX-512 routes prefetch each tile's source into L2 while the tile
    // before it is written, a share before each micro tile, where the copy
    // is larger than the last-level cache ([`avx512_prefetches_next`]).
    // Not staged tiles: their rows' lines would evict each other in the L2.
    let avx512_next = matches!(route, Route::Avx512 | Route::Avx512Sheared)
        && staged.is_none()
        && avx512_prefetches_next(e, plan.bytes(), b.len * e);
    // The steps a tile's prefetches are spread over: its micro tiles, or the
    // sheared kernel's columns of them.
    let micro_tiles = |ni: usize, nj: usize| {
        let (mi, mj) = kernels.micro_dims::<T>();
        let columns = (nj / mj).max(1);
        if route == Route::Avx512Sheared {
            columns
        } else {
            (ni / mi).max(1) * columns
        }
    };
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
                    let mut next =
                        ((route == Route::Prefetched && nt || avx512_next) && t + 1 < first + n).then(|| {
                            let (i1, ni1) = cols.get(ci);
                            let (j1, nj1) = rows.get(ri);
                            let at = s.get().wrapping_offset(so + i1 as isize * sa + (j1 * e) as isize);
                            let runs = d.get().wrapping_offset(dof + (i1 * e) as isize + j1 as isize * db);
                            (
                                NextTile::new(at, ni1, nj1 * e, sa, if avx512_next { micro_tiles(ni, nj) } else { nj }),
                                RunEnds::new(runs, nj1, ni1 * e, db),
                            )
                        });
                    // SAFETY: the tile's elements are elements of the plan; the
                    // staging buffer holds `ni * nj * e ≤ stage_bytes` bytes (a
                    // staged-rows tile's, `StagedRows::stage_bytes`); on
                    // the Lines route every destination row of the tile has the
                    // alignment of its first (`db` is a multiple of a line).
                    unsafe {
                        let dt = d.get().offset(dof + (i0 * e) as isize + j0 as isize * db);
                        let st = s.get().offset(so + i0 as isize * sa + (j0 * e) as isize);
                        match route {
                            Route::Small => tile::<T>(kernels, dt, st, ni, nj, sa, db, false, false, None),
                            Route::Lines => tile::<T>(kernels, dt, st, ni, nj, sa, db, nt, true, None),
                            Route::Avx512 | Route::Avx2Lines => match &staged {
                                Some(rows) => rows.tile::<T>(kernels, dt, st, ni, nj, sa, db, buf),
                                None => {
                                    let next = next.as_mut().map(|(next, _)| next);
                                    tile::<T>(kernels, dt, st, ni, nj, sa, db, true, true, next)
                                }
                            },
                            Route::Avx512Sheared | Route::Avx2Sheared => {
                                let next = next.as_mut().map(|(next, _)| next);
                                let avx2 = route == Route::Avx2Sheared;
                                sheared_tile::<T>(avx2, dt, st, ni, nj, sa, db, i0 == 0, a.len - i0, next)
                            }
                            Route::Prefetched | Route::Staged => {
                                tile::<T>(kernels, buf, st, ni, nj, sa, tb as isize, false, false, None);
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

/// Whether every one of `values` (addresses, strides in bytes) is a multiple
/// of 32 bytes: what AVX2's micro tiles of 2- to 8-byte elements ask of their
/// operands, whose 32-byte loads and stores must not split a line.
fn on_32_bytes(values: impl IntoIterator<Item = isize>) -> bool {
    values.into_iter().all(|v| v % 32 == 0)
}

/// Whether the small and staged routes' tiles ([`Route::Small`],
/// [`Route::Staged`]) are made of AVX2's micro tiles rather than SSE2's
/// (elements of 1, 2, 4 or 8 bytes, which have an AVX2 kernel of their own),
/// where both sides hold one of them: bytes always (their kernel loads 16
/// bytes of a row at a time, as SSE2's does, and each shuffle moves 32
/// bytes), wider elements on the small route where every operand, row and
/// slice starts on 32 bytes, so that no 32-byte access straddles two lines.
/// Zen 3 VM, in-process A/B, best of 600 alternated calls (20–30 staged),
/// speed-up over SSE2's tiles:
/// - from and into 256-byte aligned buffers (the library's own): u8 50²
///   1.24×, 100² 1.21×, 40 × 72 1.12×, 200 × 300 1.48×, 512² 1.68×, 1000 × 700
///   (two cores) 1.70×, 16 × 128² permuted 021 1.76×; f16 512² 1.39×, 8 ×
///   256² 021 1.25×; f32 256² 1.38×, 512² 1.54×; f64 256² 1.44×; staged u8
///   (destination rows off a line) 1001 × 3000 1.32–1.41×, 700 × 3000
///   1.29–1.38×, 999 × 4000 1.41–1.42×, 3000 × 1001 1.33–1.45×, 5000 × 1001
///   1.35×, 1001 × 8000 1.30×;
/// - both 16 bytes past that (as NumPy's data can be): the same small u8
///   copies 1.10–1.68×, staged 1.28–1.31×; the wider ones keep SSE2's tiles
///   (1.00–1.03×). Before the alignment was asked for, they lost where rows
///   or operands were 16 bytes off: f16 300 × 200 (rows of 400 and 600
///   bytes) 0.75–0.83×, 100 × 1000 0.73–0.74×, 50² 0.73×; f32 256²
///   0.83–0.95× and f64 256² 0.86–1.01× from or into buffers 16 bytes off.
fn tiles_take_avx2<T: Elem>(
    route: Route,
    a: PlanDim,
    b: PlanDim,
    batch: &[PlanDim],
    dst: *mut u8,
    src: *const u8,
) -> bool {
    let e = size_of::<T>();
    let m = T::micro_len(true);
    let aligned = || {
        on_32_bytes([dst as isize, src as isize, a.src, b.dst])
            && on_32_bytes(batch.iter().flat_map(|d| [d.src, d.dst]))
    };
    let fits = a.len >= m && b.len >= m;
    match route {
        Route::Small => fits && matches!(e, 1 | 2 | 4 | 8) && (e == 1 || aligned()),
        Route::Staged => fits && e == 1,
        _ => false,
    }
}

/// Whether AVX2's whole-line route moves its tiles of `e`-byte elements
/// through an L1 copy of each line column (`copied` in [`avx2::line_tiles`])
/// and in the tiles of rows that do not crowd ([`avx2_line_tile`], 64 rows):
/// 2-byte elements from rows `sa` bytes apart whose lines crowd L1 sets
/// ([`rows_crowd_l1_sets`]: rows a multiple of 4 KiB apart) along source runs of `src_run` bytes from
/// [`BIG_L2_AVX2_LINES_MIN_SRC_RUN`] on, where a core's L2 is big
/// ([`l2_is_big`]): what takes that route on the CPU measured. Emerald Rapids
/// VM, Python, from NumPy arrays into a reused output, in-process A/B, best
/// of twelve alternated calls, speed-up over tiles of 32 rows × 1 KiB read in
/// place ([`avx2_line_tile`]'s for crowded rows), two threads: f16 4096²
/// transposed 1.05–1.09×, 4096 × 2048 1.04×, 2048 × 8192 1.07×, 8192 × 4096
/// 1.05–1.09×, 1024 × 16384 1.00×, 8 × 2048² permuted 021 1.05–1.09×, 4 ×
/// 4096² 1.10×; one thread 0.97–1.18×. Bytes gained nothing there (8192² u8,
/// 4096 × 16384, 16384 × 4096, 16 × 4096 × 1024 021: 0.90–1.06× against the
/// prefetched route) and keep their routes.
fn through_l1(e: usize, sa: isize, src_run: usize) -> bool {
    e == 2 && src_run >= BIG_L2_AVX2_LINES_MIN_SRC_RUN && l2_is_big() && rows_crowd_l1_sets(sa, LINE / e)
}

/// Whether the AVX-512 routes prefetch the next tile's source into L2
/// ([`NextTile`], a share before each micro tile, or each column of them on
/// the sheared route) for a copy of `bytes` of `e`-byte elements: from
/// copies of the streaming size on ([`stream_threshold`], the last-level
/// cache), whose rows the hardware prefetchers, following a line of each of
/// 16 to 64 rows a micro tile, fetch late. Never for bytes, which leave the
/// AVX-512 route from half that size (`bytes_off_avx512` in [`transpose`];
/// before, they prefetched where a tile's rows and the next tile's did not
/// crowd the L2's sets), nor for 3-byte pixels (not measured). In-process
/// A/B on a Zen 5 VM (two cores, `devtensor bench`'s patterns, best of ten
/// alternated calls, GB/s without → with): pitched u8 8192² (pitch 8256,
/// before bytes left the route) 32.6 → 40.3, f16 4096² (pitch
/// 4128) 35.2 → 57.2, f32 (pitch 4112) 45.9 → 55.0, f16 4096² 46.5 → 51.4,
/// f32 43.5 → 46.4, f64 2048 × 4096 52.0 → 55.9, 32 × 512² f32 56.0 → 61.0,
/// NHWC → NCHW f32 16 × 56² × 256 40.5 → 64.3, 256³ f32 201 37.1 → 59.8;
/// the others 0.97–1.04×; the sheared route (rows off line boundaries),
/// 4097 × 4095 f32 33.3 → 38.1, 5001 × 3000 f32 29.0 → 39.5, 8191 × 2049
/// 38.0 → 41.0, 3001² f64 1.00×. Below the last-level cache it lost (2048²
/// u16, 8 MiB: 0.85×).
///
/// Wider elements prefetch however their rows crowd the L2: the next tile
/// lies further along the same rows, in other sets, and a line the L2
/// cannot keep still reaches the L3 (Zen's is filled by the L2's
/// evictions) before its load. Rows 16 KiB or more apart, Zen 5 VM,
/// in-process A/B, best of four to six alternated calls in both orders,
/// speed-up on one core / two: 256³ f32 permuted 210 1.34–1.42× /
/// 1.10–1.14×, 128 × 256 × 512 1.22–1.24× / 1.14–1.24×, 512 × 256 × 128
/// 1.27–1.30× / 1.09–1.16×, f16 256³ 1.06–1.15× / 1.00–1.05×, f64 128² ×
/// 512 1.08–1.22× / 1.00–1.02×; transposed, f32 2048 × 8192 1.34–1.35× /
/// 1.08–1.11×, 1024 × 16384 1.23–1.30× / 1.02–1.13×, f16 4096 × 8192
/// 1.23–1.38× / 1.15–1.20×, f64 1024 × 8192 1.15–1.38× / 1.02–1.13×; 64⁴
/// f32 3021 and 3210, 32⁵ × 16 f32 43210 0.96–1.06×.
///
/// Where a core's L2 is big ([`l2_is_big`]), not from source runs of
/// [`BIG_L2_UNFETCHED_MIN_SRC_RUN`] on.
fn avx512_prefetches_next(e: usize, bytes: usize, src_run: usize) -> bool {
    e != 1 && e != 3 && bytes >= stream_threshold() && !(l2_is_big() && src_run >= BIG_L2_UNFETCHED_MIN_SRC_RUN)
}

/// Shortest source runs (bytes) whose next tiles the AVX-512 routes leave
/// unfetched where a core's L2 is big ([`avx512_prefetches_next`]): a tile
/// reads 16 to 128 rows at a time along runs this long, streams that the
/// hardware prefetchers there follow on their own. Probably (the VM shows
/// no PMU to count it) each software prefetch held one of the core's few
/// line-fill buffers until its line arrived, which the tile's own misses
/// and streamed stores then waited for.
/// Emerald Rapids VM (2 MiB 16-way L2 a core), Python, from NumPy arrays
/// into a reused output, in-process A/B, best of twelve to sixteen
/// alternated calls, speed-up without the prefetches on two threads / one:
/// f32 4096² transposed 1.19× / 1.08×, from a 4112-wide matrix 1.26× /
/// 1.10×, 2048 × 8192 1.12× / 1.14×, f64 2048 × 4096 1.21× / 1.25×, 1024 ×
/// 8192 1.15× / 1.12×; 32 × 512² f32 batched 1.18× / 1.13×; the sheared
/// route, f32 4097 × 4095 1.12× / 1.16×, 3000 × 5001 1.20× / 1.16×; NCHW →
/// NHWC 16 × 256 × 56² f32 1.26× / 1.18×, NHWC → NCHW 1.12× / 1.00×; 256³
/// f32 permuted 210 1.24× / 1.31×, 120 1.31×, 201 0.85–1.08× / 0.97×, f16
/// 201 1.16×, f64 128 × 256² 201 1.05×; 512-byte runs: 16 × 128 × 64 × 128
/// f32 3021 1.37×, 64 × 2048 × 128 021 1.04×, f16 16 × 128 × 64 × 256 3021
/// 1.43×. Shorter runs keep them (two threads): 256 bytes, 64⁴ f32 3021
/// 0.98×, 3210 0.86×, 16 × 4096 × 128 f16 021 0.99×, but 32 × 4096 × 64 f32
/// 021 1.11×; 128 bytes, 64⁴ f16 3021 0.89–0.99×; 64 bytes, 32⁵ f16 03142
/// 0.96–0.99×, 32⁴ × 16 f32 43210 0.96–1.00×.
const BIG_L2_UNFETCHED_MIN_SRC_RUN: usize = 512;

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

/// Whether [`l1_tile`] moves an `ni × nj` tile in AVX2's micro tiles: where
/// the tile holds one, bytes at any alignment (their loads are 16 bytes wide,
/// as [`tiles_take_avx2`] lets the small route's), 2- and 4-byte elements
/// where both operands and both strides are multiples of 32 bytes. Zen 3
/// VM, two cores, in-process A/B, best of 20–400 alternated calls, speed-up
/// over the baseline's micro tiles (bytes, 2-byte elements) or the
/// element-by-element columns (4 bytes), `x[:, ::S].T`: u8 `::2` 4096²
/// 1.11–1.28×, 2048² 1.01–1.03×, 256² 1.04–1.10×, 40 × 1000 0.95–1.15×; `::4`
/// 4096² 1.12–1.22×, 1000 × 40 1.00×; u16 `::2` 2048² 1.22×, 1024²
/// 1.10–1.17×, 512² 1.00×, `::3` 2048² 1.28×; f32 `::2` 4096² 1.17–1.21×,
/// 2048² 1.28–1.34×, 1024² 0.90–1.11×, 512² 1.13–1.19×, 256² 1.41×, `::4`
/// 1.13×, 1.23×, 1.29× (4096², 1024², 256²), `::3` 1.07–1.24×; channel 0
/// of 1080 × 1920 × 3 f32 transposed 1.32–1.37×; 64³ reversed with its last
/// dim `::2` u8 1.11–1.14×, f32 1.24×. Not 8-byte elements: f64 `::2` 512²
/// 0.85–0.86×, `::4` 0.69×.
pub(super) fn l1_tile_takes_avx2<T: Elem>(
    dst: *mut u8,
    src: *const u8,
    ni: usize,
    nj: usize,
    sa: isize,
    db: isize,
) -> bool {
    avx2_enabled() && l1_tile_suits_avx2::<T>(dst, src, ni, nj, sa, db)
}

/// [`l1_tile_takes_avx2`]'s conditions but the CPU's.
fn l1_tile_suits_avx2<T: Elem>(dst: *mut u8, src: *const u8, ni: usize, nj: usize, sa: isize, db: isize) -> bool {
    let m = T::micro_len(true);
    let aligned = || on_32_bytes([dst as isize, src as isize, sa, db]);
    ni >= m
        && nj >= m
        && match size_of::<T>() {
            1 => true,
            2 | 4 => aligned(),
            _ => false,
        }
}

/// An `ni × nj` tile moved as [`Route::Small`] moves one (micro tiles,
/// ordinary stores): for tiles gathered into an L1 buffer first
/// ([`general`](mod@super::general)'s tiled gathers). Source row `i` (at `src + i·sa`,
/// `nj` contiguous elements) becomes destination column `i`
/// (`dst + i·e + j·db`). AVX2's micro tiles with `avx2` (the caller asked
/// [`l1_tile_takes_avx2`] once, for its own choice too), the baseline's
/// without.
///
/// # Safety
///
/// Every address formed for `i < ni`, `j < nj` is an element of its operand;
/// `avx2` only where [`l1_tile_takes_avx2`] holds for these arguments.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn l1_tile<T: Elem>(
    dst: *mut u8,
    src: *const u8,
    ni: usize,
    nj: usize,
    sa: isize,
    db: isize,
    avx2: bool,
) {
    debug_assert!(!avx2 || l1_tile_takes_avx2::<T>(dst, src, ni, nj, sa, db));
    let kernels = if avx2 { Kernels::Avx2 } else { Kernels::Baseline };
    // SAFETY: forwarded; with `avx2` the CPU has AVX2 and the tile suits its
    // micro tiles (the caller's contract), the baseline kernels need no CPU
    // feature.
    unsafe { tile::<T>(kernels, dst, src, ni, nj, sa, db, false, false, None) }
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
/// kernels and AVX2's whole-line ones only with `nt` and `db` a multiple of a
/// line, the latter for 1-, 2- and 4-byte elements. `lines`: micro tiles in
/// line blocks ([`Elem::micro_tiles`]). `next`: the next tile's source, a
/// share of it prefetched before each micro tile (the AVX-512 kernels only).
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
    mut next: Option<&mut NextTile>,
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
    if size_of::<T>() <= 2
        && !nt
        && !matches!(kernels, Kernels::Avx512 | Kernels::Avx2Lines { .. })
        && ni >= mi
        && nj >= m
    {
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
            Kernels::Avx512 => avx512::line_tiles(e, dst_body, src_body, body, fj, sa, db, || step(&mut next)),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2Lines { copied } => match e {
                1 => avx2::line_tiles::<1>(dst_body, src_body, body, fj, sa, db, copied),
                2 => avx2::line_tiles::<2>(dst_body, src_body, body, fj, sa, db, copied),
                _ => avx2::line_tiles::<4>(dst_body, src_body, body, fj, sa, db, copied),
            },
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

/// One `ni × nj` tile of [`Route::Avx512Sheared`], or with `avx2` of
/// [`Route::Avx2Sheared`] (`ni` a multiple of the
/// micro tile unless it is the last, `avail` elements of `a` from the tile's
/// first on): in destination row `j`, whose first whole line starts `s_j`
/// elements in, the elements from `s_j` (from 0 in the first tile) to `ni +
/// s_j` (to the end in the last): whole lines, streamed, but for the
/// partial lines at the ends of the copy, and the lines whose second micro
/// tile would lie past the end, element by element. `next`: the next tile's
/// source, a share of it prefetched before each column of micro tiles (the
/// AVX-512 kernels only).
///
/// # Safety
///
/// Every address formed for `i < avail`, `j < nj` is an element of its
/// operand; the CPU has the AVX-512 kernels for `T`
/// (`avx512_has_kernel(e, true)`), or with `avx2` AVX2 and `T` is 4 bytes;
/// `dst` and `db` are multiples of `size_of::<T>()`.
#[allow(clippy::too_many_arguments)]
unsafe fn sheared_tile<T: Elem>(
    avx2: bool,
    dst: *mut u8,
    src: *const u8,
    ni: usize,
    nj: usize,
    sa: isize,
    db: isize,
    first: bool,
    avail: usize,
    mut next: Option<&mut NextTile>,
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
            if avx2 {
                debug_assert_eq!(e, 4);
                avx2::sheared_tiles::<4>(dst, src, lines, fj, sa, db);
            } else {
                avx512::sheared_tiles(e, dst, src, lines, fj, sa, db, || step(&mut next));
            }
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

/// The next share of `next`'s prefetches, if there is a next tile.
#[inline(always)]
fn step(next: &mut Option<&mut NextTile>) {
    if let Some(next) = next {
        next.step();
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
        PlanDim, few_channels_of_wide_pixels, l2_has_few_ways, runs_stream_threshold, small_tile_lines_per_set,
        stream_from,
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

    /// The small route takes AVX2's tiles for bytes wherever both sides hold
    /// one (32 × 32), at any address; for f32 (8 × 8) only where the
    /// operands, rows and slices start on 32 bytes; the staged route for
    /// bytes only.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn small_and_staged_tiles_take_avx2_where_its_accesses_keep_to_32_bytes() {
        use super::{Route, tiles_take_avx2};
        let small = |a, b, batch: &[PlanDim], dst, src| tiles_take_avx2::<u32>(Route::Small, a, b, batch, dst, src);
        // A `rows × cols` matrix transposed.
        let dims = |rows, cols, e| channels_taken(rows, cols, cols, e);
        let at = |p: usize| p as *mut u8;
        let (d, s, d16, s16) = (at(4096), at(8192), at(4096 + 16), at(8192 + 16));
        let (a, b) = dims(96, 160, 1);
        assert!(tiles_take_avx2::<u8>(Route::Small, a, b, &[], d16, s16));
        assert!(tiles_take_avx2::<u8>(Route::Staged, a, b, &[], d16, s16));
        assert!(!tiles_take_avx2::<u8>(Route::Prefetched, a, b, &[], d, s));
        let (a, b) = dims(31, 160, 1);
        assert!(!tiles_take_avx2::<u8>(Route::Small, a, b, &[], d, s));
        assert!(!tiles_take_avx2::<u8>(Route::Staged, a, b, &[], d, s));
        let (a, b) = dims(96, 160, 4);
        assert!(small(a, b, &[], d, s));
        assert!(!tiles_take_avx2::<u32>(Route::Staged, a, b, &[], d, s));
        assert!(!small(a, b, &[], d16, s));
        assert!(!small(a, b, &[], d, s16));
        let slices = PlanDim {
            len: 3,
            src: 96 * 160 * 4 + 16,
            dst: 96 * 160 * 4,
        };
        assert!(!small(a, b, &[slices], d, s));
        // Destination rows of 400 bytes.
        let (a, b) = dims(100, 160, 4);
        assert!(!small(a, b, &[], d, s));
        // 16-byte elements have no AVX2 kernel.
        let (a, b) = dims(96, 160, 16);
        assert!(!tiles_take_avx2::<u128>(Route::Small, a, b, &[], d, s));
    }

    /// The general kernel's L1 tiles take AVX2's micro tiles for bytes at any
    /// address where the tile holds one (32 × 32), for 2- and 4-byte elements
    /// only where both operands and both strides are multiples of 32 bytes,
    /// never for 8-byte ones.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn l1_tiles_suit_avx2_where_its_accesses_keep_to_32_bytes() {
        use super::l1_tile_suits_avx2 as suits;
        let at = |p: usize| p as *mut u8;
        let (d, s, d16, s16) = (at(4096), at(8192), at(4096 + 16), at(8192 + 16));
        assert!(suits::<u8>(d16, s16, 32, 32, 32, 77));
        assert!(!suits::<u8>(d, s, 31, 32, 32, 96));
        assert!(!suits::<u8>(d, s, 32, 31, 32, 96));
        for (w, db) in [(64isize, 160isize), (128, 320)] {
            let e = (w / 32) as usize;
            let (ni, nj) = (16 / e * 2, 16 / e * 2);
            let check = |d, s, sa, db| match e {
                2 => suits::<u16>(d, s, ni, nj, sa, db),
                _ => suits::<u32>(d, s, ni, nj, sa, db),
            };
            assert!(check(d, s, w, db), "e = {e}");
            assert!(!check(d16, s, w, db), "e = {e}: destination off 32 bytes");
            assert!(!check(d, s16, w, db), "e = {e}: source off 32 bytes");
            assert!(!check(d, s, w + 16, db), "e = {e}: source rows off 32 bytes");
            assert!(!check(d, s, w, db + 16), "e = {e}: destination rows off 32 bytes");
        }
        assert!(!suits::<u64>(d, s, 32, 32, 256, 256));
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
