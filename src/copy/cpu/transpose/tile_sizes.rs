//! The transposes' tile sizes: the small route's L1-resident tiles, and the
//! prefetched and AVX-512 routes' tiles, measured for each element size,
//! alignment and cache.

use super::super::blocks::LINE;
use super::super::caches::{l2_bytes, l2_has_few_ways, l2_is_big};
use super::super::runs::stream_threshold;
use crate::copy::plan::PlanDim;

/// The small tiles: destination runs × source runs (bytes), L1-resident.
pub(super) const SMALL_DST_RUN: usize = 256;
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
pub(super) fn small_runs(e: usize) -> (usize, usize) {
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
pub(super) fn small_src_len(a_bytes: usize, e: usize) -> usize {
    if a_bytes < SMALL_DST_RUN {
        SMALL_SHORT_DST_SRC_BYTES / a_bytes.max(1)
    } else {
        small_runs(e).1 / e
    }
}

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

/// [`PREFETCHED_1_FEW_WAYS`] where the L2 (with few ways) is 1 MiB or more:
/// 512-byte destination runs × 128 source bytes (two lines of 512 rows), 64
/// KiB. Zen 4 VM (8-way 1 MiB L2), in-process A/B against
/// [`PREFETCHED_1_FEW_WAYS`], best of six alternated calls, speed-up on two
/// threads / one: 8192² 1.14–1.29× / 1.10–1.28×, 4096² 1.06× / 1.23×, 16384
/// × 4096 1.08× / 1.20×, 4096 × 16384 1.02× / 1.21×, 4320 × 7680 1.03× /
/// 1.14×. 384 rows × 128 bytes won less (1.02–1.09× / 1.12–1.16×), as did
/// 512 × 192 (0.97–1.10× / 1.10–1.26×); at 8192², 1024 × 128 lost on two
/// threads (0.65×), 512 × 64 won less (1.22× / 1.16×). The Zen 3 VM (512
/// KiB L2) keeps the other, measured there.
const PREFETCHED_1_FEW_WAYS_LARGE_L2: (usize, usize, usize) = (512, 128, 64 << 10);

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

/// The prefetched route's tile of large byte transposes that leave the
/// AVX-512 route ([`Route::Avx512`](super::Route::Avx512)) where AVX2's
/// whole-line route does not take them: [`PREFETCHED_1_ALIASED`]'s, whatever
/// the distance of the source rows. Zen 5 VM, two cores, in-process A/B
/// against [`PREFETCHED_1`]'s tile, which rows not a multiple of 4 KiB apart
/// took, best of six alternated calls in both orders, speed-up over the
/// AVX-512 route with this tile against with that one: 16 × 4096 × 1024 u8
/// batched 1.13–1.23× against 0.75–0.98× (once 1.24×), 64 × 1024² 021
/// 1.08–1.18× against 0.78–0.95× (once 1.05×). The others' tile is this one.
/// Where the L2 has few ways they keep [`prefetched_tile`]'s
/// ([`PREFETCHED_1_FEW_WAYS`] from line-aligned rows; not measured there).
pub(super) const PREFETCHED_1_OFF_AVX512: (usize, usize, usize) = PREFETCHED_1_ALIASED;

/// The prefetched route's tile of three-byte elements (RGB pixels) whose
/// source cannot stay in the last-level cache (from three eighths of it,
/// [`PIXELS_LARGE`], to its size, [`PREFETCHED_3_HUGE`]): 576-byte
/// destination runs (192 pixels, nine lines) × 240 source bytes (80 pixels),
/// 45 KiB. [`PREFETCHED_DEFAULT`]'s 512 bytes made runs of 168 pixels, 504
/// bytes, which end inside a line (the partial lines at either end of every
/// run take ordinary stores among the streamed ones, a read of the line
/// each). Zen 3 VM, two cores, Python, into a
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

/// The prefetched route's tile of three-byte elements from the size of the
/// last-level cache on ([`stream_threshold`]), where destination rows hold it
/// twice: 1152-byte destination runs (384 pixels, 18 lines) × 384 source
/// bytes (128 pixels, six lines), 144 KiB, staged in L2. Each tile reads and
/// writes longer runs of each row than [`PREFETCHED_3`]'s. Zen 2 VM,
/// `devtensor bench`, 4096 × 2048 pixels transposed: one thread, % of memcpy,
/// 40.2 and 37.6 with [`PREFETCHED_3`], 44.9 and 43.5 with this tile (other
/// tiles of 768–2304 × 240–1536 bytes 40.6–43.4, 384 or 576 × 96–240
/// 31.7–38.4, 192 × 96–384 23.9–27.1); two cores, three alternated runs,
/// 23.5–23.6 → 25.5–25.7 GB/s. Python, two cores, from NumPy arrays of (h, w,
/// 3) bytes permuted 102, into a new output, the median of 11 calls, GB/s,
/// three alternated processes each, then two more in a slower memory mode:
/// - 4096 × 2048 23.4–23.9 → 26.0–26.4, then 21.2–21.3 → 22.0–22.7;
///   2160 × 3840 22.4–23.1 → 24.8–25.3, 19.0–19.3 → 20.8–20.9; 3840 × 2160
///   23.9–24.5 → 25.9–26.2, 21.8–22.3 → 21.9–23.0; 4000 × 3000 21.7–22.2 →
///   24.1–24.2, 20.5–20.7 → 21.9–22.1; 3000 × 5001 19.9–20.6 → 22.2–22.6,
///   19.6–20.3 → 20.8–20.9; 4096 × 2047 23.4–23.7 → 25.6–26.0; 2600² (20 MB)
///   24.8–25.9 → 25.6–25.8, 20.1–20.7 → 22.2–22.4;
/// - below the last-level cache it lost (1500² 26.1–26.4 → 24.4–24.8, 2000 ×
///   1600 26.0–26.1 → 24.2–24.7), and there the copies keep [`PREFETCHED_3`];
/// - 768 × 384 bytes gained less (4096 × 2048 21.8–21.9, 2600² 20.3–20.8),
///   1536 × 768 less still (21.4–22.4, 18.6–19.0).
const PREFETCHED_3_HUGE: (usize, usize, usize) = (1152, 384, 144 << 10);

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
pub(super) const AVX512_TILE: (usize, usize, usize) = (128, 2048, 32 << 10);

/// [`AVX512_TILE`] for 2-byte elements: bands of 128 source rows (four whole
/// lines a destination row a step), which the 32 KiB cap keeps to 256 bytes
/// of the rows. Zen 5 VM, in-process A/B against [`AVX512_TILE`], best of six
/// alternated calls in both orders, speed-up on one core / two: 4096² f16
/// from a 4128-wide matrix 1.22–1.23× / 1.01–1.26×, 4096² 1.04–1.11× /
/// 1.00–1.12×, 8192 × 4096 1.03–1.08× / 0.84–1.10× (once under 0.93), 4096
/// × 8192 1.05–1.08× / 0.93–1.09×, 16384 × 2048 1.02–1.03× / 0.93–1.10×.
/// Copies whose short source rows size the tile (16 × 4096 × 128 batched,
/// 256³ permuted 210, attention heads) keep theirs. Not for bytes (bands of
/// 256 rows: 16384 × 4096 0.58–1.05×) nor for 4-byte elements (64 rows:
/// 0.83–1.25×, no gain overall).
pub(super) const AVX512_TILE_2: (usize, usize, usize) = (256, 2048, 32 << 10);

/// Shortest destination rows (bytes) for the sheared AVX-512 route
/// ([`Route::Avx512Sheared`](super::Route::Avx512Sheared)): each row's last
/// lines, whose second micro tile would lie past the end, and its first
/// partial line are copied element by element, which shorter rows do not
/// repay (Python, two cores, from NumPy arrays, the median of three
/// processes against the prefetched route: f32 16 × 1025 × 1023 021 0.92×,
/// 1025 × 4095 0.97×, 2049 × 2047 1.00×, 4 × 2049 × 2047 021 1.03×).
pub(super) const SHEARED_MIN_ROW: usize = 8 << 10;

/// [`AVX512_TILE`] for 3-byte pixels: bands of 64 source rows (one micro
/// tile: three whole lines a destination row a step), along 1536 bytes of
/// the rows (512 pixels). 4096 × 2048 RGB, two cores, `devtensor bench` (%
/// of memcpy, two runs each): 68–71 here, 68–72 along 768 to 6144 bytes, 68–70
/// for bands of 128 rows.
pub(super) const AVX512_TILE_3: (usize, usize, usize) = (192, 1536, 96 << 10);

/// The sheared AVX-512 route's tile: each band of source rows reads a micro
/// tile's rows past its end (the lines that straddle the two bands), so
/// bands are taller: 64 f32 rows, four lines a
/// destination row a step. 4097 × 4095 f32, two cores, `devtensor bench`
/// (% of memcpy, two runs each): 32 rows 68–70, 64 rows 74–76 (1 or 4 KiB
/// of the rows alike), 96 rows 68–70, 128 rows 65–66.
pub(super) const AVX512_SHEARED_TILE: (usize, usize, usize) = (256, 2048, 64 << 10);

/// The prefetched route's tile (destination run, source run, most bytes) for
/// a copy of `bytes` of `e`-byte elements with destination rows along `a`,
/// streamed (`nt`) or not: [`PREFETCHED_DEFAULT`], or one of the tiles above
/// where their destination runs fit at least twice in a destination row.
pub(super) fn prefetched_tile(e: usize, a: PlanDim, nt: bool, bytes: usize) -> (usize, usize, usize) {
    let misaligned = a.src % LINE as isize != 0;
    let few_l2_ways = nt && l2_has_few_ways();
    let tile = match e {
        4 if few_l2_ways => Some(PREFETCHED_4_FEW_WAYS),
        2 if misaligned => Some(PREFETCHED_2_MISALIGNED),
        2 if nt => Some(PREFETCHED_2_STREAMED),
        2 | 4 => Some(PREFETCHED_2_4),
        1 if misaligned => Some(PREFETCHED_1_MISALIGNED),
        1 if few_l2_ways && l2_bytes() >= 1 << 20 => Some(PREFETCHED_1_FEW_WAYS_LARGE_L2),
        1 if few_l2_ways => Some(PREFETCHED_1_FEW_WAYS),
        1 if a.src % 4096 != 0 => Some(PREFETCHED_1),
        1 if nt => Some(PREFETCHED_1_ALIASED),
        3 if bytes >= stream_threshold() && a.len * e >= 2 * PREFETCHED_3_HUGE.0 => Some(PREFETCHED_3_HUGE),
        3 if bytes >= stream_threshold() / 8 * PIXELS_LARGE => Some(PREFETCHED_3),
        _ => None,
    };
    tile.filter(|t| a.len * e >= 2 * t.0).unwrap_or(PREFETCHED_DEFAULT)
}

/// Source rows of the tiles of AVX2's whole-line route
/// ([`Route::Avx2Lines`](super::Route::Avx2Lines)).
const AVX2_LINE_TILE_ROWS: usize = 512;

/// Source bytes of each row of those tiles.
const AVX2_LINE_TILE_SRC: usize = 512;

/// The tile of AVX2's whole-line route for `e`-byte elements (destination
/// run, source run, most bytes): [`AVX2_LINE_TILE_ROWS`] ×
/// [`AVX2_LINE_TILE_SRC`] bytes, 256 KiB. Zen 2 VM, one thread, `devtensor
/// bench` (% of memcpy), transposes from a matrix wider than its rows
/// (source rows × bytes): u8 512 × 512 52–53, 512 × 256 51, 512 × 1 KiB 50,
/// 256 × 1 KiB 49, 1024 × 256 or 512 48–49, 128 × 2 KiB 44, 64 × 2 KiB
/// 25–34; f16 512 or 1024 × 256 to 1024 65–67, 256 × 1 KiB 57, 128 × 1 KiB
/// 49; f32 512 × 256 to 1024 66–68, 1024 × 512 69, 256 × 512 67. Where a
/// core's L2 is big, [`BIG_L2_AVX2_LINE_TILE`].
pub(super) fn avx2_line_tile(e: usize, rows_crowd_sets: bool) -> (usize, usize, usize) {
    let (rows, src) = if rows_crowd_sets {
        AVX2_LINE_TILE_CROWDED
    } else if l2_is_big() {
        BIG_L2_AVX2_LINE_TILE
    } else {
        (AVX2_LINE_TILE_ROWS, AVX2_LINE_TILE_SRC)
    };
    (rows * e, src, rows * src)
}

/// AVX2's whole-line tiles (source rows, bytes of each) where a core's L2 is
/// big ([`l2_is_big`]) and the rows do not crowd L1 sets: a byte micro tile's
/// 64 rows (two of 2-byte elements) along 2 KiB: fewer streams at a time, each
/// longer, which the hardware prefetchers there follow (as they do the AVX-512
/// route's bands, [`avx512_prefetches_next`](super::avx512_prefetches_next)),
/// with the lines two ahead still prefetched as well. Emerald Rapids VM (2 MiB
/// 16-way L2 a core), Python, from NumPy arrays into a reused output,
/// in-process A/B, best of twelve alternated calls, speed-up against 512 rows ×
/// 512 bytes, two threads / one: u8 8192² from an 8256-wide matrix 1.39–1.41× /
/// 1.11×, 6144 × 6000 1.27–1.42× / 1.17×, 16 × 512 × 56² NCHW → NHWC 1.19× /
/// 0.95×; f16 4096² from a 4128-wide matrix 1.19–1.24× / 1.35×, 3072 × 5000
/// 1.24× / 1.37×, 8 × 1024 × 4000 permuted 021 1.20× / 1.46×. Along 1 or 4 KiB
/// alike (0.85–1.09×), 128 or 192 rows slower (0.64–0.93×), without the lines
/// prefetched ahead ([`super::super::avx2::line_tiles`]) slower (u8 0.80–0.90×,
/// f16 0.91–1.00×); 32 rows of f16 alike (0.90–1.07×).
const BIG_L2_AVX2_LINE_TILE: (usize, usize) = (64, 2048);

/// AVX2's whole-line tiles (source rows, bytes of each) from source rows whose
/// lines crowd L1 sets ([`rows_crowd_l1_sets`](super::super::blocks::rows_crowd_l1_sets)
/// over a line's rows), which crowd L2 sets as well: of 4096² f32, rows 16
/// KiB apart, every fourth row's lines share the sets of the 8-way 512 KiB
/// L2, so that a tile of 512 rows puts 128 lines of each column in one set
/// and the lines prefetched ahead are gone before they are read; 32 rows put
/// 8, the L2's ways. Rows further apart crowd more (256³ f32 permuted 210,
/// rows 256 KiB apart: all 32 in one set), yet fewer rows still win there
/// too. Zen 2 VM, `devtensor bench` (% of memcpy): two cores, two runs each,
/// 4096² 512 × 512 bytes 79, 64 rows × 4 KiB 79–81, 32 × 1, 2, 4 or 8 KiB
/// 83–86, 16 × 8 KiB 63–65; one thread, two runs each, 32 rows × 1 KiB
/// against 32 × 2 KiB (64 rows of 210's 1 KiB source rows): 4096² 65–67
/// against 67–71, 210 56–60 against 39–40. Where the transpose copies each
/// line column into L1 first (`through_l1` in `transpose`), crowded rows take
/// the others' tiles.
const AVX2_LINE_TILE_CROWDED: (usize, usize) = (32, 1024);
