//! The general kernel (`PlanKind::General`, broadcast fills): an odometer over
//! the outer dims with an inner loop specialised on its (source, destination)
//! strides, gathers and scatters included.

use super::blocks::LINE;
use super::caches::l2_bytes;
use super::elem::{Elem, ld, st};
use super::fill::{fill_pattern, fill_run};
use super::parallel::{Shared, for_each_segment, par_for_slow};
use super::runs::{copy_run, store_fence, stream_threshold};
use super::stage::{STAGE, with_stage};
use super::transpose::{L1_SET_SPAN, L1_WAYS, NextTile, l1_tile, l1_tile_takes_avx2};
use crate::copy::plan::{CopyPlan, INLINE_DIMS, PlanDim};
use smallvec::SmallVec;
use std::mem::MaybeUninit;

/// General copy: odometer over the outer dims, innermost loop specialised on
/// the strides. When `dims[0]` is short, a longer dim with unit source stride
/// becomes the inner loop.
///
/// # Safety
///
/// As [`execute`](super::execute).
pub(super) unsafe fn general<T: Elem>(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>() as isize;
    let mut dims = plan.dims.clone();
    if dims[0].len < 16
        && let Some(k) = (1..dims.len()).find(|&k| dims[k].src == e && dims[k].len >= 2 * dims[0].len)
    {
        let d = dims.remove(k);
        dims.insert(0, d);
    }
    let d0 = dims[0];
    let b = traffic(plan);
    if let Some(k) = tile_partner(&dims) {
        // SAFETY: forwarded.
        unsafe { tiled::<T>(&dims, k, b, dst, src) };
        return;
    }
    // SAFETY: forwarded.
    unsafe {
        match (d0.src, d0.dst) {
            (s, t) if s == e && t == e => general_k::<T, CONTIG>(&dims, b, dst, src, nt),
            (0, t) if t == e => general_k::<T, BCAST>(&dims, b, dst, src, nt),
            (_, t) if t == e => general_k::<T, GATHER>(&dims, b, dst, src, nt),
            (s, _) if s == e => general_k::<T, SCATTER>(&dims, b, dst, src, false),
            _ => general_k::<T, STRIDED>(&dims, b, dst, src, false),
        }
    }
}

/// Side of [`tiled`]'s tiles, in elements.
const TILE: usize = 32;

/// Side of [`tiled`]'s work units, in elements (a multiple of [`TILE`]).
const MACRO: usize = 256;

/// The dim [`tiled`] pairs with `dims[0]` (the destination's fastest), if
/// any. The transpose of a strided view (`x[:, ::2].T`, the real parts of a
/// complex matrix transposed) comes to this kernel, as the planner's
/// transposes need a unit source stride: each step of `dims[0]` reads another
/// source line while another dim, of [`TILE`] / 4 elements or more, steps
/// within one; the one of the shortest source stride is taken. Walked in the
/// destination's order such a copy reads a line an element, and where a
/// sweep's lines crowd the caches (below) each is evicted before its next
/// element is read.
fn tile_partner(dims: &[PlanDim]) -> Option<usize> {
    let d0 = dims[0];
    if d0.len < TILE / 4 || d0.src.unsigned_abs() < LINE {
        return None;
    }
    // Where the caches keep a sweep's lines until the next sweep reads their
    // next elements, the odometer's order costs little. Zen 2 VM, Python,
    // GB/s, odometer → tiles (torch), channel 0 of pixels transposed,
    // `x[:, :, 0].T`:
    // - rows that spread over the sets (not a line multiple apart), tiled
    //   only past half of L2: 300 × 5000 × 3 u16 17.3 → 7.1 (11.9), f32 9.5 →
    //   5.4 (8.7); narrow odd permutes (31 × 29 × 27 × 3 f32 0321, 29 lines
    //   324 bytes apart) 36 → 16 (28);
    // - rows that crowd L2 sets past their ways: 1024 × 4096 × 4 u8 0.53 →
    //   2.5 (0.48), 512 × 512 × 2 f32 2.4 → 17.0 (2.5), 2048 × 1024 × 2 u16
    //   1.1 → 4.5 (1.2), 512 × 512 × 2 u8 (8 a set) 3.0 → 4.5 (2.9);
    // - rows that crowd only L1 sets: 1080 × 1920 × 3 f32 5.2 → 5.9 (5.3).
    //   Elements of 1 and 2 bytes too since their tiles leave the buffer in
    //   micro transposes ([`tiled`]); in scalar moves their tiles cost more
    //   than L2's hits, u8 5.7 → 4.0 (5.2), u16 8.1 → 3.6. Xeon VM (2 MiB
    //   L2), Python, best of 40, odometer → micro-transposed tiles (torch):
    //   u8 1080 × 1920 × 3 5.1 → 6.6–8.4 (5.1–5.5), 2160 × 3840 × 3 1.2 →
    //   6.7 (1.5–2.5: the odometer's sweep of 2160 pages misses the TLB an
    //   element), 512 × 512 × 2 4.1 → 10.9–12.6, 1080 × 1920 × 4 3.7 → 6.0–6.7
    //   (3.3–3.7); u16 1080 × 1920 × 3 5.2 → 9.8–11.2 (5.8–6.1).
    let crowded = if d0.src % LINE as isize != 0 {
        d0.len * LINE > l2_bytes() / 2
    } else {
        sweep_lines_per_set(d0.src, d0.len, l2_bytes() / L2_WAYS) >= L2_WAYS
            || sweep_lines_per_set(d0.src, d0.len, L1_SET_SPAN as usize) > L1_WAYS
    };
    if !crowded {
        return None;
    }
    (1..dims.len())
        .filter(|&k| dims[k].len >= TILE / 4 && dims[k].src != 0 && dims[k].src.unsigned_abs() < LINE)
        .min_by_key(|&k| dims[k].src.unsigned_abs())
}

/// Ways of the L2 [`tile_partner`] reckons with (Zen 2's 512 KiB, 8-way).
const L2_WAYS: usize = 8;

/// Lines of a sweep of `rows` lines `stride` bytes apart (a multiple of a
/// line) that share one set of a cache whose sets repeat every `span` bytes
/// (a power of two): the sweep's lines fall on `sets / g` sets, `g` the
/// largest power of two dividing the stride in lines.
fn sweep_lines_per_set(stride: isize, rows: usize, span: usize) -> usize {
    let sets = (span / LINE).max(1);
    let step = (stride.unsigned_abs() / LINE) % sets;
    let g = if step == 0 {
        sets
    } else {
        (1 << step.trailing_zeros()).min(sets)
    };
    rows.div_ceil(sets / g)
}

/// A tile's L1 buffer in [`tiled`], line-aligned (rows of [`TILE`] elements
/// of 2 and 4 bytes then start on 32 bytes, as AVX2's micro tiles of them
/// want: [`l1_tile_takes_avx2`]).
#[repr(C, align(64))]
struct TileBuf<T>([MaybeUninit<T>; TILE * TILE]);

/// [`general`] in tiles of [`TILE`] × [`TILE`] elements of `dims[0]` and
/// `dims[k]`: a tile reads its source rows (along `dims[k]`, a few lines
/// each) whole into an L1 buffer, then writes the destination along
/// `dims[0]` from there, so no line is fetched twice. Tiles go in work
/// units of up to [`MACRO`] square, whose pages stay in the TLB. Elements of
/// 1 and 2 bytes leave the buffer in micro transposes
/// ([`l1_tile`]), not element by element, and 4-byte ones where AVX2's take
/// them ([`l1_tile_takes_avx2`]; with the baseline's SSE2 ones wider elements
/// lose: Xeon VM, f32 512 × 512 × 2 20 → 15 GB/s, f64 26 → 15). Zen 2 VM,
/// two threads, GB/s read + written, the odometer → tiles in 32-wide strips
/// → through the buffer → in units (NumPy, torch), `x[:, ::2].T` f32: 2048²
/// 1.87 → 3.9 → 5.3 → 6.4 (0.95, 1.84), 4096² 3.5 → 8.0 (0.80, 1.35);
/// 256² 13.9 → 8.7 in one unit, 16.5 in units small enough for both
/// threads (3.7, 7.8).
///
/// # Safety
///
/// As [`execute`](super::execute), with `dims` a reordering of the plan's dims.
unsafe fn tiled<T: Elem>(dims: &[PlanDim], k: usize, bytes: usize, dst: *mut u8, src: *const u8) {
    let (d0, dk) = (dims[0], dims[k]);
    let e = size_of::<T>() as isize;
    let batch: SmallVec<[PlanDim; INLINE_DIMS]> = dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 0 && i != k)
        .map(|(_, d)| *d)
        .collect();
    // Work units of up to MACRO × MACRO elements, along `dims[0]` fastest:
    // the source and destination pages of one stay in the TLB while its tiles
    // run. Smaller ones where that leaves too few to share among threads.
    let count = batch.iter().map(|d| d.len).product::<usize>();
    let units = |m: usize| dk.len.div_ceil(m) * d0.len.div_ceil(m) * count;
    let mut m = MACRO;
    while m > TILE && units(m) < 8 {
        m /= 2;
    }
    let (cols, rows) = (dk.len.div_ceil(m), d0.len.div_ceil(m));
    let total = units(m);
    let (d, s) = (Shared(dst), Shared(src));
    // Each next tile's source rows are prefetched into L2 while this one is
    // read, where the source is too large to stay in cache: its rows, a page
    // or more apart, are read a few lines each, late for the hardware
    // prefetchers. In-process A/B, Zen 5 VM, two cores, best of 12 to 20
    // alternated calls, both orders, speed-up: `x[:, ::2].T` f32 2048² 1.33–
    // 1.44×, 4096² 1.10×, f64 4096² 1.04–1.06×, channel 0 of 1080 × 1920 × 3
    // f32 transposed 1.14×, of 2160 × 3840 × 3 u8 1.21–1.27×; from sources
    // under half the last-level cache it lost (f32 512² 0.89–0.92×, u8
    // 1080 × 1920 × 3 0.91×). `devtensor bench`, three processes each with
    // and without (GB/s): f32 2048² 15.2–16.6 against 13.4–14.9, f64
    // 17.5–19.3 against 16.1–16.4.
    let step = (dk.src.unsigned_abs() / e as usize).max(1);
    let next_tiles = bytes.saturating_mul(step) >= stream_threshold() / 2;
    // Rows of every 2nd to 8th element of 1 or 2 bytes are gathered with
    // SSSE3 byte shuffles (as `gather_with`'s), reading on into the next
    // tile's elements of the row where there are some, so that a whole row
    // of a tile goes in blocks. Not every 7th or 8th from a streamed source.
    // Zen 3 VM, two cores, in-process A/B, best of 20–30 alternated calls,
    // speed-up over the scalar gather (both with AVX2's micro tiles),
    // `x[:, ::S].T`: u8 S = 2 4096² 1.71×, 2048² 1.89×, 512² 1.73×; S = 3
    // 1.35×, 1.27×, 1.56×; S = 4 1.72×, 1.79× (1024² 1.69×), 1.56×; S = 6
    // 1.09×, 1.09× (1024² 1.33×), 1.36×; S = 7 and 8 from 2048² on 0.80–1.34×,
    // mostly under 1 (streamed sources), S = 8 1024² 1.38×, 512² 1.32–1.37×;
    // u16 S = 2 2048² 1.34×, 512² 1.43×; S = 3 1.23×, 1.42×; S = 8 1.08–1.09×,
    // 1.02–1.07×; 64³ u8 reversed with its last dim `::2` 1.38×, `::3` 1.34×.
    // And every 2nd element of 4 bytes (two loads and a `shufps` for four),
    // same runs: f32 `::2` 4096² 1.08–1.17×, 2048² 1.13–1.29×, 1024²
    // 0.93–1.09×, 512² 0.94–1.13×, 256² 0.91–1.19×; source 4 bytes off
    // (`x[:, 1::2]`) 1.03–1.12× but 512² 0.95–1.03×, 16 bytes off
    // 0.98–1.20×; with the destination 8 bytes off too (SSE2's micro tiles)
    // 0.88–1.14×. Not every 3rd or 4th, which lost (0.78–0.89× from 1024²
    // down, 0.99–1.12× above).
    #[cfg(target_arch = "x86_64")]
    let shuffles = dk.src % e == 0
        && match (e, dk.src / e) {
            (1 | 2, 2..=6) => true,
            (1 | 2, 7 | 8) => !next_tiles,
            (4, 2) => true,
            _ => false,
        }
        && super::avx2::enabled();
    par_for_slow(total, bytes, |w0, w1| {
        let mut buf = TileBuf([MaybeUninit::<T>::uninit(); TILE * TILE]);
        for_each_segment(&batch, cols * rows, w0, w1, |dof, so, first, n| {
            for unit in first..first + n {
                let (j_end, i_end) = ((unit / rows + 1) * m, (unit % rows + 1) * m);
                for j0 in (j_end - m..j_end.min(dk.len)).step_by(TILE) {
                    let width = TILE.min(dk.len - j0);
                    let (j, w) = (j0 as isize, width as isize * e);
                    for i0 in (i_end - m..i_end.min(d0.len)).step_by(TILE) {
                        let (i, h) = (i0 as isize, TILE.min(d0.len - i0));
                        // SAFETY: elements `i0..i0 + h` of `dims[0]` by
                        // `j0..j0 + width` of `dims[k]` at a batch index: the
                        // plan's; `buf` holds TILE × TILE elements.
                        unsafe {
                            let sp = s.get().offset(so + j * dk.src + i * d0.src);
                            let dp = d.get().offset(dof + j * dk.dst + i * d0.dst);
                            let next_h = i_end.min(d0.len).saturating_sub(i0 + TILE).min(TILE);
                            if next_tiles && next_h > 0 {
                                // The next tile's rows, from each one's lowest element
                                // (`dk.src` may be negative) to past its highest.
                                let span = (width as isize - 1) * dk.src;
                                let first = sp.wrapping_offset(TILE as isize * d0.src + span.min(0));
                                let row_bytes = span.unsigned_abs() + e as usize;
                                NextTile::new(first, next_h, row_bytes, d0.src, 1).step();
                            }
                            let b = buf.0.as_mut_ptr().cast::<u8>();
                            // Each source line read once, whole: the tile's rows
                            // along `dims[k]` into `buf`, one row after another…
                            // (The scalar loop alone where no shuffles run: beside
                            // them it was compiled slower, f32 256² `::2` 0.6×.)
                            #[cfg(target_arch = "x86_64")]
                            if shuffles {
                                for r in 0..h as isize {
                                    let (bp, rp) = (b.offset(r * w), sp.offset(r * d0.src));
                                    // The row's elements from `j0` to its end
                                    // (`dk.src > 0` with `shuffles`) are
                                    // readable; its tile takes `width` of them.
                                    // The CPU has SSSE3 (AVX2).
                                    let done = super::shuffled_gather::whole_blocks(
                                        bp,
                                        rp,
                                        width,
                                        dk.len - j0,
                                        e as usize,
                                        (dk.src / e) as usize,
                                    );
                                    let g = done as isize;
                                    strided::<T>(bp.offset(g * e), rp.offset(g * dk.src), width - done, dk.src, e);
                                }
                            }
                            #[cfg(target_arch = "x86_64")]
                            let scalar = !shuffles;
                            #[cfg(not(target_arch = "x86_64"))]
                            let scalar = true;
                            if scalar {
                                for r in 0..h as isize {
                                    strided::<T>(b.offset(r * w), sp.offset(r * d0.src), width, dk.src, e);
                                }
                            }
                            // …then, from L1, to the destination along `dims[0]`:
                            // in micro transposes where that is contiguous.
                            let avx2 = d0.dst == e && l1_tile_takes_avx2::<T>(dp, b, h, width, w, dk.dst);
                            if d0.dst == e && (e <= 2 || avx2) {
                                l1_tile::<T>(dp, b, h, width, w, dk.dst, avx2);
                            } else {
                                for c in 0..width as isize {
                                    strided::<T>(dp.offset(c * dk.dst), b.offset(c * e), h, w, d0.dst);
                                }
                            }
                        }
                    }
                }
            }
        });
    });
}

/// The bytes of memory a copy moves, which decide whether it is split across
/// threads: the plan's bytes, or a line per element where every source dim
/// steps a line or more (a few columns of a large matrix). Such a copy waits
/// on a miss per element, and misses to one L1 set (rows a page apart) wait
/// for one another, so each core added is one more L1 to miss in: 8192 × 1–4
/// f32 columns of an 8192² matrix on two cores, two runs each, GB/s, one
/// thread → two: 1.08–1.17 → 2.09–2.19 (×1), 4.5 → 6.8–7.8 (×2), 9.2–9.3 →
/// 13.8–15.5 (×4); NumPy and torch 1.0–1.1, 2.7–4.4, 5.3–8.0.
fn traffic(plan: &CopyPlan) -> usize {
    let lines = plan.dims.iter().all(|d| d.len == 1 || d.src.unsigned_abs() >= LINE);
    if lines {
        plan.bytes().max(plan.numel * LINE)
    } else {
        plan.bytes()
    }
}

/// Inner loop (E, E).
const CONTIG: u8 = 0;
/// Inner loop (0, E).
const BCAST: u8 = 1;
/// Inner loop (s, E).
const GATHER: u8 = 2;
/// Inner loop (E, t).
const SCATTER: u8 = 3;
/// Inner loop (s, t).
const STRIDED: u8 = 4;

/// # Safety
///
/// As [`execute`](super::execute), with `dims` a reordering of the plan's dims.
unsafe fn general_k<T: Elem, const K: u8>(dims: &[PlanDim], bytes: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>();
    let d0 = dims[0];
    let (ss, ds) = (d0.src, d0.dst);
    let outer = &dims[1..];
    let total = d0.len * outer.iter().map(|d| d.len).product::<usize>();
    let (d, s) = (Shared(dst), Shared(src));
    let chunk = STAGE / e; // elements staged at a time
    // Lines that stay in L2 are read again from there: no gather of
    // elements a page apart needs [`gather_lanes`]'s pace then.
    let cached = bytes <= l2_bytes() / 2;
    if K == GATHER && !nt && d0.len < SHORT_GATHER && outer.len() >= 2 {
        // SAFETY: forwarded.
        unsafe { short_gathers::<T>(d0, outer, total, bytes, dst, src) };
        return;
    }
    par_for_slow(total, bytes, |w0, w1| {
        with_stage(if nt { STAGE } else { 0 }, |buf| {
            for_each_segment(outer, d0.len, w0, w1, |dof, so, i0, n| {
                let i0 = i0 as isize;
                // SAFETY: `n` elements of one row starting at index `i0`; every address
                // formed is an element of the plan, in bounds on its side. Staged
                // pieces hold at most `chunk` elements, inside the buffer.
                unsafe {
                    let dp = d.get().offset(dof + i0 * ds);
                    let sp = s.get().offset(so + i0 * ss);
                    match K {
                        CONTIG => copy_run(dp, sp, n * e, nt),
                        BCAST if n * e >= 256 => {
                            let pat = fill_pattern(sp, e);
                            fill_run(dp, &pat, e, n * e, nt);
                        }
                        BCAST => {
                            let v = ld::<T>(sp);
                            for i in 0..n {
                                st(dp.add(i * e), v);
                            }
                        }
                        // A reversed row (`x[:, ::-1]`): streamed whole
                        // lines straight from the shuffles where it can.
                        GATHER if nt && ss == -(e as isize) && streamed_reversal::<T>(dp, sp, n) => {}
                        GATHER if nt => {
                            let mut i = 0;
                            while i < n {
                                let c = (n - i).min(chunk);
                                gather::<T>(buf, sp.offset(i as isize * ss), c, ss);
                                copy_run(dp.add(i * e), buf, c * e, true);
                                i += c;
                            }
                        }
                        GATHER if cached => gather_with::<T, false>(dp, sp, n, ss),
                        GATHER => gather::<T>(dp, sp, n, ss),
                        SCATTER => scatter::<T>(dp, sp, n, ds),
                        _ => strided::<T>(dp, sp, n, ss, ds),
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// Gathered rows shorter than this many elements go [`short_gathers`]. 32,
/// not 16: Zen 2 VM, Python, into a new output, the best of three
/// alternated processes, speed-up: 17 × 19 × 23 × 2 f64 permuted 3021 1.45×,
/// 2130 1.16×, 2031 1.16×, 3120 1.37×, 3210 1.32×, 0321 1.32×; 31 × 29 × 27
/// × 3 f64 2031 1.15×, 3021 1.19×; five other permutes 0.99–1.01×. Up to 64,
/// 17 × 19 × 23 × 2 f64 2031 lost (0.81×).
pub(super) const SHORT_GATHER: usize = 32;

/// [`general_k`]'s gathers of rows of `d0.len` (under [`SHORT_GATHER`])
/// elements: the odometer steps over the dims past `outer[0]`, and each of
/// its blocks of `outer[0].len` rows is a plain loop of plain loops, where
/// the odometer stepped, and a gather was dispatched on the stride, for every
/// row. Zen 2 VM, Python, into a new output, the best of five alternated
/// processes, µs: 5 × 7 × 9 × 11 × 2 f64 permuted 14032 11 → 8 (NumPy 6.6),
/// 03142 11 → 10; ten other permutes of 8- and 4-byte elements 0.97–1.04×
/// (rows under 16 elements then).
///
/// # Safety
///
/// As [`general_k`]; `d0` has a unit destination stride; `total` is the
/// plan's element count.
unsafe fn short_gathers<T: Elem>(
    d0: PlanDim,
    outer: &[PlanDim],
    total: usize,
    bytes: usize,
    dst: *mut u8,
    src: *const u8,
) {
    let (d1, rest) = (outer[0], &outer[1..]);
    let (n0, ss) = (d0.len, d0.src);
    let (d, s) = (Shared(dst), Shared(src));
    par_for_slow(total, bytes, |w0, w1| {
        for_each_segment(rest, n0 * d1.len, w0, w1, |dof, so, first, n| {
            // SAFETY: elements `first..first + n` of one block of the plan.
            unsafe { gather_block::<T>(d.get().offset(dof), s.get().offset(so), n0, ss, d1, first, n) };
        });
    });
}

/// Elements `first..first + n` of a block of rows of `n0` elements (`ss`
/// bytes apart in the source, contiguous in the destination), the rows
/// `d1.dst` and `d1.src` bytes apart: a loop a row, its pointers stepped.
/// A division and a multiply an element before (blocks are a few rows, the
/// loops a few elements): Zen 2 VM, Python, µs, the least of two
/// `bench/cpu_permute_sweep.py` runs alternated with the base: 5 × 7 × 9 ×
/// 11 × 2 permuted 14032 f32 6.28 → 4.21, u8 6.02 → 4.40, 03142 f64 8.34 →
/// 6.20 (NumPy 7.0); 9 × 10 × 11 × 12 × 13 u8 14032 54.4 → 38.7; 17 × 19 ×
/// 23 × 2 f64 3021 7.07 → 5.85; 31 × 29 × 27 × 3 f64 2031 27.1 → 23.2; 34
/// cases 1.09–1.50×; two at 0.81× and 0.92× that swing as much between runs
/// of one build (31 × 29 × 27 × 3 u8 0132: 8.9 or 13.1).
///
/// # Safety
///
/// Every element of those rows is in bounds on its side, and no element of
/// one side shares a byte with an element of the other.
#[inline(always)]
unsafe fn gather_block<T: Elem>(
    dst: *mut u8,
    src: *const u8,
    n0: usize,
    ss: isize,
    d1: PlanDim,
    first: usize,
    n: usize,
) {
    let e = size_of::<T>();
    // Element `first` of the block is element `i` of row `j` (no division
    // where a block is not split, which is nearly always).
    let (j, mut i) = if first < n0 {
        (0, first)
    } else {
        (first / n0, first % n0)
    };
    // Row `j`'s first elements; stepped with wrapping offsets, as the step
    // past the last row leaves the operands.
    let mut dr = dst.wrapping_offset(j as isize * d1.dst);
    let mut sr = src.wrapping_offset(j as isize * d1.src);
    let mut left = n;
    while left > 0 {
        let m = (n0 - i).min(left);
        // SAFETY: elements `i..i + m` of row `j`, in bounds on both sides
        // (the caller's contract).
        unsafe {
            let (mut dp, mut sp) = (dr.add(i * e), sr.offset(i as isize * ss));
            for _ in 0..m {
                st(dp, ld::<T>(sp));
                dp = dp.add(e);
                sp = sp.wrapping_offset(ss);
            }
        }
        left -= m;
        i = 0;
        dr = dr.wrapping_offset(d1.dst);
        sr = sr.wrapping_offset(d1.src);
    }
}

/// `dst[i] = src[i·ss]` for `i < n` (contiguous destination). Source strides
/// of 2 to 8 and −1 elements get loops with constant strides, which LLVM
/// turns into wide loads and shuffles (every other element, one channel of
/// three, a reversal), or at least into constant addressing (one channel
/// of 5 to 8, one thread, µs, x[:, 1] of 10000 × 5 f32 3.39 → 2.78, NumPy
/// 3.59; f64 4.92 → 4.27, 4.61); strides of whole pages go
/// [`gather_lanes`].
///
/// # Safety
///
/// Every address formed is an element of its operand.
#[inline(always)]
pub(super) unsafe fn gather<T: Elem>(dst: *mut u8, src: *const u8, n: usize, ss: isize) {
    // SAFETY: forwarded.
    unsafe { gather_with::<T, true>(dst, src, n, ss) }
}

/// [`gather`], with `FAR`: elements whole pages apart go [`gather_lanes`]
/// (their lines are not taken to be in cache).
///
/// # Safety
///
/// As [`gather`].
#[inline(always)]
unsafe fn gather_with<T: Elem, const FAR: bool>(dst: *mut u8, src: *const u8, n: usize, ss: isize) {
    let e = size_of::<T>();
    // Every 2nd to 4th element with AVX-512 VBMI permutes, and every 5th to
    // 8th for 1- and 2-byte ones. One thread, µs, the odometer → these
    // (NumPy), x[:, 1] of 10000 × 5: u8 2.68 → 1.17 (3.59), u16 3.10 → 1.93
    // (3.60); 4000 × 8 u8 1.09 → 0.64 (1.65); f64 lost (10000 × 6 1.55× the
    // time), as its vectors hold 8 elements.
    #[cfg(target_arch = "x86_64")]
    if (matches!(ss / e as isize, 2..=4) || (e <= 2 && matches!(ss / e as isize, 5..=8)))
        && ss % e as isize == 0
        && e.is_power_of_two()
        && e <= 8
        && super::split512::enabled()
    {
        // SAFETY: forwarded: elements `i·ss` of the source, `n` of the
        // destination; the CPU has the instructions (`enabled`).
        unsafe { super::split512::gather(dst, src, n, e, ss as usize / e) };
        return;
    }
    // Without them, every 2nd to 8th element of 1 or 2 bytes with SSSE3 byte
    // shuffles (gated on AVX2, whose CPUs all have SSSE3), the rest of the
    // row one by one. Zen 2 VM, Python, into a new output, the best
    // of three processes, µs, x[:, 1] of 10000 × S, the loop → these (NumPy
    // 4.1–4.2 for both): u8 S = 2 4.59 → 1.04, 5 4.50 → 1.52, 8 4.54 → 1.98;
    // u16 S = 2 2.14 → 1.49, 5 4.58 → 2.49, 8 4.58 → 3.33.
    #[cfg(target_arch = "x86_64")]
    if e <= 2 && ss % e as isize == 0 && matches!(ss / e as isize, 2..=8) && super::avx2::enabled() {
        // SAFETY: the CPU has AVX2 and so SSSE3; forwarded: elements `i·ss`
        // of the source for `i < n` (their gaps, under 16 bytes, lie in pages
        // that hold elements), `n` of the destination.
        let done = unsafe { super::shuffled_gather::whole_blocks(dst, src, n, n, e, ss as usize / e) };
        // The elements from `done` on, one by one. Falling through to the
        // loops below with the pointers moved slowed them at every stride
        // (two of 4000 × 20 u16 channels to planes, Python, µs: 3.9 → 5.1).
        for i in done..n {
            // SAFETY: element `i < n` on both sides, forwarded.
            unsafe { st(dst.add(i * e), ld::<T>(src.offset(i as isize * ss))) };
        }
        return;
    }
    // SAFETY: forwarded; `ss == k·e` in the constant-stride arms.
    unsafe {
        match ss / e as isize {
            2 if ss == 2 * e as isize => gather_const::<T, 2>(dst, src, n),
            3 if ss == 3 * e as isize => gather_const::<T, 3>(dst, src, n),
            4 if ss == 4 * e as isize => gather_const::<T, 4>(dst, src, n),
            5 if ss == 5 * e as isize => gather_const::<T, 5>(dst, src, n),
            6 if ss == 6 * e as isize => gather_const::<T, 6>(dst, src, n),
            7 if ss == 7 * e as isize => gather_const::<T, 7>(dst, src, n),
            8 if ss == 8 * e as isize => gather_const::<T, 8>(dst, src, n),
            -1 if ss == -(e as isize) => {
                // Reversal: contiguous backwards, 32 bytes at a time with AVX2,
                // else vectorised by LLVM with an SSE2 lane shuffle.
                let done = reverse_avx2(dst, src, n, e);
                for i in done..n {
                    st(dst.add(i * e), ld::<T>(src.sub(i * e)));
                }
            }
            _ if FAR && e.is_multiple_of(4) && e > 4 && ss != 0 && ss.unsigned_abs().is_multiple_of(4096) => {
                // A few columns of rows pages apart (widened to one element):
                // each element is its own line, and at strides of whole pages
                // all fall in one L1 set. One wide load per row keeps so many
                // misses to that set in flight that they evict one another; a
                // loop over the row's 4- or 8-byte lanes (the count hidden
                // from the optimiser, so it stays a loop) issues them slower
                // and finishes sooner: 8192×2 f32 columns of an 8192² matrix
                // 0.47× → 1.05× torch's speed; 8-byte lanes for ×4 columns:
                // 0.50× → 1.16×. Not at other strides, whose lines spread
                // over the sets: on a Zen 2 VM (L2 512 KiB, so 388 KiB
                // permutes were not `cached`), Python, µs, two processes each,
                // lanes → plain (NumPy, torch): 31 × 29 × 27 × 2 f64 permuted
                // 1320 (rows 12.2 KiB apart) 71–75 → 22–23 (27.8, 40.4), 3120
                // 71–72 → 20–21, 3210 74–76 → 24; 31 × 29 × 27 × 3 f64 3210
                // 107–111 → 36–38 (55.3); 8192² f32 columns alike.
                if e.is_multiple_of(16) {
                    gather_lanes::<u64>(dst, src, n, ss, e)
                } else {
                    gather_lanes::<u32>(dst, src, n, ss, e)
                }
            }
            _ => {
                for i in 0..n {
                    st(dst.add(i * e), ld::<T>(src.offset(i as isize * ss)));
                }
            }
        }
    }
}

/// [`gather`] of elements whole pages apart, each copied as its `L`-sized
/// lanes in a loop whose count the optimiser cannot see (so it does not
/// become one wide load per element).
///
/// # Safety
///
/// As [`gather`], with `e` (the element size) a multiple of `size_of::<L>()`.
#[inline(always)]
unsafe fn gather_lanes<L: Copy>(dst: *mut u8, src: *const u8, n: usize, ss: isize, e: usize) {
    let l = size_of::<L>();
    let lanes = std::hint::black_box(e / l);
    for i in 0..n {
        // SAFETY: lane `k` of element `i` lies inside that element, which is
        // in bounds on its side (the caller's contract).
        unsafe {
            let (d, s) = (dst.add(i * e), src.offset(i as isize * ss));
            for k in 0..lanes {
                st(d.add(k * l), ld::<L>(s.add(k * l)));
            }
        }
    }
}

/// The AVX2 part of a reversal ([`super::avx2::reverse`]) where the CPU has
/// it and the element is 1, 2, 4 or 8 bytes; the elements it copied.
///
/// # Safety
///
/// As [`gather`] with `ss == -e`.
#[inline(always)]
unsafe fn reverse_avx2(dst: *mut u8, src: *const u8, n: usize, e: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if n >= 32 && super::avx2::enabled() {
        use super::avx2::reverse;
        // SAFETY: the CPU has AVX2; the caller's operands.
        return unsafe {
            match e {
                1 => reverse::<1>(dst, src, n),
                2 => reverse::<2>(dst, src, n),
                4 => reverse::<4>(dst, src, n),
                8 => reverse::<8>(dst, src, n),
                _ => 0,
            }
        };
    }
    let _ = (dst, src, n, e);
    0
}

/// `dst[i] = src[-i]` for `i < n` (a [`gather`] with `ss == -e`) for a
/// streamed copy: the destination's whole lines straight from AVX2's
/// shuffles with streaming stores ([`super::avx2::reverse_streamed`]), the
/// elements before its first line boundary and after its last with ordinary
/// stores (no line gets both). Returns false, having copied nothing, where
/// the CPU lacks AVX2, the element is not 1, 2, 4 or 8 bytes, or `dst` is not
/// element-aligned. Staged through a buffer (gathered there, then streamed
/// out), the 4096² f32 row flip of `devtensor bench` ran at two thirds of
/// this speed on the Zen 4 VM: % of memcpy, alternated runs, one thread (three
/// runs) 47–49 → 70–73, two threads (six, the slow memory mode) 65–70 → 97–99.
///
/// # Safety
///
/// As [`gather`] with `ss == -e`; the caller fences streamed stores.
#[inline(always)]
unsafe fn streamed_reversal<T: Elem>(dst: *mut u8, src: *const u8, n: usize) -> bool {
    let e = size_of::<T>();
    #[cfg(target_arch = "x86_64")]
    if matches!(e, 1 | 2 | 4 | 8) && (dst as usize).is_multiple_of(e) && super::avx2::enabled() {
        use super::avx2::reverse_streamed;
        // Elements before the first whole line and after the last.
        let one_by_one = |range: std::ops::Range<usize>| {
            for i in range {
                // SAFETY: element `i < n` of both operands, the caller's contract.
                unsafe { st(dst.add(i * e), ld::<T>(src.sub(i * e))) };
            }
        };
        let head = ((LINE - dst as usize % LINE) % LINE / e).min(n);
        one_by_one(0..head);
        // SAFETY: elements `head..n` of both operands; `dst + head·e` starts
        // a line; the CPU has AVX2.
        let lines = unsafe {
            let (d, s, m) = (dst.add(head * e), src.sub(head * e), n - head);
            match e {
                1 => reverse_streamed::<1>(d, s, m),
                2 => reverse_streamed::<2>(d, s, m),
                4 => reverse_streamed::<4>(d, s, m),
                _ => reverse_streamed::<8>(d, s, m),
            }
        };
        one_by_one(head + lines..n);
        return true;
    }
    let _ = (dst, src, n, e);
    false
}

/// `dst[i·ds] = src[i]` for `i < n` (contiguous source); destination strides
/// of 2, 3 and 4 elements are constant-stride loops (interleaving channels).
///
/// # Safety
///
/// Every address formed is an element of its operand.
#[inline(always)]
pub(super) unsafe fn scatter<T: Elem>(dst: *mut u8, src: *const u8, n: usize, ds: isize) {
    let e = size_of::<T>();
    // SAFETY: forwarded; `ds == k·e` in the constant-stride arms.
    unsafe {
        match ds / e as isize {
            2 if ds == 2 * e as isize => scatter_const::<T, 2>(dst, src, n),
            3 if ds == 3 * e as isize => scatter_const::<T, 3>(dst, src, n),
            4 if ds == 4 * e as isize => scatter_const::<T, 4>(dst, src, n),
            _ => {
                for i in 0..n {
                    st(dst.offset(i as isize * ds), ld::<T>(src.add(i * e)));
                }
            }
        }
    }
}

/// `n` elements `ss` bytes apart to `n` elements `ds` bytes apart, four at
/// a time, their loads before their stores: the compiler may not move a load
/// above a store it cannot prove apart, and a loop of single moves waits on
/// that order.
///
/// # Safety
///
/// As [`scatter`], the source `ss` bytes apart; no source element shares a
/// byte with a destination element.
#[inline(always)]
unsafe fn strided<T: Elem>(dst: *mut u8, src: *const u8, n: usize, ss: isize, ds: isize) {
    let (mut d, mut s) = (dst, src);
    // SAFETY: every address formed is one of the `n` elements on its side.
    unsafe {
        for _ in 0..n / 4 {
            let (a, b, c, x) = (
                ld::<T>(s),
                ld::<T>(s.offset(ss)),
                ld::<T>(s.offset(2 * ss)),
                ld::<T>(s.offset(3 * ss)),
            );
            st(d, a);
            st(d.offset(ds), b);
            st(d.offset(2 * ds), c);
            st(d.offset(3 * ds), x);
            (d, s) = (d.wrapping_offset(4 * ds), s.wrapping_offset(4 * ss));
        }
        for _ in 0..n % 4 {
            st(d, ld::<T>(s));
            (d, s) = (d.wrapping_offset(ds), s.wrapping_offset(ss));
        }
    }
}

/// [`scatter`] with a destination stride of `S` elements.
///
/// # Safety
///
/// As [`scatter`].
#[inline(always)]
unsafe fn scatter_const<T: Elem, const S: usize>(dst: *mut u8, src: *const u8, n: usize) {
    let e = size_of::<T>();
    // SAFETY: forwarded.
    unsafe {
        for i in 0..n {
            st(dst.add(i * S * e), ld::<T>(src.add(i * e)));
        }
    }
}

/// [`gather`] with a source stride of `S` elements.
///
/// # Safety
///
/// As [`gather`].
#[inline(always)]
unsafe fn gather_const<T: Elem, const S: usize>(dst: *mut u8, src: *const u8, n: usize) {
    let e = size_of::<T>();
    // SAFETY: forwarded.
    unsafe {
        for i in 0..n {
            st(dst.add(i * e), ld::<T>(src.add(i * S * e)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::plan::{BaseAddrs, PlanOptions, plan_copy};

    /// The plan of `shape` read at element strides `src` into a contiguous f32 tensor.
    fn plan(shape: &[usize], src: &[isize]) -> CopyPlan {
        let dst = crate::layout::contiguous_strides(shape).unwrap();
        plan_copy(shape, &dst, src, 4, BaseAddrs::default(), PlanOptions::CPU).unwrap()
    }

    #[test]
    fn elements_a_line_apart_count_a_line_each() {
        // One column of an 8192² f32 matrix: 32 KiB of elements, 512 KiB of lines.
        assert_eq!(traffic(&plan(&[8192, 1], &[8192, 1])), 8192 * LINE);
        // Two columns: widened to one 8-byte element per row.
        assert_eq!(traffic(&plan(&[8192, 2], &[8192, 1])), 8192 * LINE);
        // A reversal, a stride of two: the plan's own bytes.
        assert_eq!(traffic(&plan(&[8192], &[-1])), 8192 * 4);
        assert_eq!(traffic(&plan(&[8192], &[2])), 8192 * 4);
        // Four columns a line apart whose rows share lines: 16 elements a line.
        assert_eq!(traffic(&plan(&[4, 1024], &[1, 16])), 4096 * 4);
    }

    /// A block of 7 rows of 9 elements (every 5th of the source, rows 2 apart
    /// there, 9 in the destination), from every first element to every end:
    /// pieces that start and end mid-row, as a split copy's do.
    #[test]
    fn gathered_blocks_from_any_element_to_any() {
        let (n0, rows) = (9usize, 7usize);
        let src: Vec<u32> = (0..(n0 * 5 + 2 * rows) as u32).collect();
        let d1 = PlanDim {
            len: rows,
            src: 2 * 4,
            dst: (n0 * 4) as isize,
        };
        let want: Vec<u32> = (0..rows * n0).map(|f| src[f % n0 * 5 + f / n0 * 2]).collect();
        for first in 0..rows * n0 {
            for n in 0..=rows * n0 - first {
                let mut got = vec![u32::MAX; rows * n0];
                // SAFETY: elements `first..first + n` of the block lie in `src`
                // (at most 8 · 5 + 6 · 2 = 52 < 59) and `got`.
                unsafe {
                    gather_block::<u32>(got.as_mut_ptr().cast(), src.as_ptr().cast(), n0, 5 * 4, d1, first, n);
                }
                for (f, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let expected = if (first..first + n).contains(&f) { w } else { u32::MAX };
                    assert_eq!(g, expected, "element {f} of {first}..{}", first + n);
                }
            }
        }
    }
}
