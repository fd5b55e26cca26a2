//! Row copies (`PlanKind::Rows`): short rows walked with a pointer, long rows
//! as runs, and rows whose order differs between source and destination in
//! tiles of rows.

use smallvec::SmallVec;

use super::blocks::LINE;
use super::caches::{l2_bytes, l2_has_few_ways, l2_is_big};
use super::parallel::{Shared, for_each_segment, par_for};
use super::runs::{Cache, copy_run, prefetch, runs_stream_threshold, store_fence};
use crate::copy::plan::{CopyPlan, INLINE_DIMS, PlanDim};

/// Row copies: `dims[0]` is unit-stride on both sides.
///
/// # Safety
///
/// As [`execute`](super::execute).
pub(super) unsafe fn rows(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
    let e = plan.elem_size;
    let len = plan.dims[0].len;
    let row = (len * e) as isize;
    if plan.dims.len() > 2
        && row <= ROW_TILE_MAX_ROW
        && plan.dims[1].src != row
        && let Some(k) = (2..plan.dims.len()).find(|&k| plan.dims[k].src == row)
    {
        // SAFETY: forwarded.
        return unsafe { rows_tiled(plan, k, dst, src, nt) };
    }
    let outer = &plan.dims[1..];
    let (d, s) = (Shared(dst), Shared(src));
    if let Some((o, batch)) = outer.split_first()
        && row <= SHORT_ROW_MAX
    {
        // Short rows (sliced columns, padded rows): a plain pointer walk along
        // the first outer dim of each slice, the row size a constant where it
        // is a common one ([`SHORT_ROW_MAX`]).
        let (ds, ss, rows) = (o.dst, o.src, plan.numel / len);
        // Short rows cost what they touch, not what they move: a cache line each,
        // and a TLB walk each when a page or more apart (narrow column slices of a
        // wide matrix, where a second thread halves the time of a 512 KiB copy).
        let far = ss.unsigned_abs() >= 4096;
        let touched = if far { 256 } else { 64 };
        let work = rows.saturating_mul((row as usize).max(touched));
        let looped = whole_row_loop(row);
        let ahead = short_rows_ahead(ss, row, looped);
        // SAFETY: the runs are rows `j0..j0 + n` of one slice of the plan, in
        // bounds on both sides.
        row_runs(d, s, o, batch, rows, work, |dp, sp, n| unsafe {
            // Rows of 128 and 256 bytes that are not prefetched: AVX2's
            // whole-row loop ([`SHORT_ROWS_AVX2`]).
            #[cfg(target_arch = "x86_64")]
            if ahead == 0 && looped {
                // SAFETY: as above; the CPU has AVX2 (checked), `row` is 128 or 256.
                return if row == 128 {
                    super::avx2::copy_rows::<128>(dp, sp, n, ds, ss)
                } else {
                    super::avx2::copy_rows::<256>(dp, sp, n, ds, ss)
                };
            }
            // Literal sizes inline to fixed-size copies; others stay dynamic.
            match row {
                4 => short_rows(dp, sp, ds, ss, n, 4, ahead, false),
                8 => short_rows(dp, sp, ds, ss, n, 8, ahead, false),
                16 => short_rows(dp, sp, ds, ss, n, 16, ahead, false),
                32 => short_rows(dp, sp, ds, ss, n, 32, ahead, false),
                64 => short_rows(dp, sp, ds, ss, n, 64, ahead, false),
                128 => short_rows(dp, sp, ds, ss, n, 128, ahead, false),
                256 => short_rows(dp, sp, ds, ss, n, 256, ahead, false),
                other => short_rows(dp, sp, ds, ss, n, other as usize, ahead, false),
            }
        });
        return;
    }
    // Long rows are whole destination lines written once while a strided
    // source streams through the cache: streaming stores pay off from five
    // eighths of the last-level cache on the Zen 5 VM, three eighths on the
    // Zen 3 one (`runs_stream_threshold`). At an eighth, a 4 MiB row flip ran at
    // 0.6× torch's cached stores; at a quarter, 8 MiB of 4 KiB rows at 53 GB/s
    // streamed, 86–116 cached (torch 101–146). Two cores, 32 MiB L3, four
    // alternated runs each, GB/s in the VM's slow / fast memory mode, streamed
    // against cached: 16 MiB of 4 KiB rows 57 / 111 against 65 / 123 (torch
    // 58–64 / 111–120); 20 MiB 55 / 111 against 51–57 (torch 50–56 / 89–96).
    let nt = nt || plan.bytes() >= runs_stream_threshold(false);
    // Rows of a few hundred bytes to 2 KiB: one loop over the rows of each
    // slice, where the CPU has AVX2 ([`ROW_LOOP_MAX`], [`SPARSE_ROWS_SPAN`]).
    #[cfg(target_arch = "x86_64")]
    if let Some((o, batch)) = outer.split_first()
        && (SHORT_ROW_MAX + 1..ROW_LOOP_MAX).contains(&row)
        && (!nt || o.src.unsigned_abs() >= SPARSE_ROWS_SPAN * row as usize)
        && super::avx2::enabled()
    {
        // SAFETY: the runs are rows `j0..j0 + n` of one slice of the plan, in
        // bounds on both sides; the CPU has AVX2 (checked).
        row_runs(d, s, o, batch, plan.numel / len, plan.bytes(), |dp, sp, n| unsafe {
            super::avx2::copy_runs(dp, sp, n, row as usize, o.dst, o.src)
        });
        return;
    }
    par_for(plan.numel, plan.bytes(), |w0, w1| {
        for_each_segment(outer, len, w0, w1, |dof, so, i0, n| {
            let off = (i0 * e) as isize;
            // SAFETY: a piece of one row of the plan, in bounds on both sides.
            unsafe { copy_run(d.get().offset(dof + off), s.get().offset(so + off), n * e, nt) }
        });
        store_fence(nt);
    });
}

/// Calls `f(dst, src, n)` for each run of `n` consecutive rows along the
/// outer dim `o` within one slice of the other outer dims `batch` (the
/// pointers at the run's first row), over `rows` rows in all, split across
/// threads as `work` bytes.
fn row_runs(
    d: Shared<*mut u8>,
    s: Shared<*const u8>,
    o: &PlanDim,
    batch: &[PlanDim],
    rows: usize,
    work: usize,
    f: impl Fn(*mut u8, *const u8, usize) + Sync,
) {
    par_for(rows, work, |r0, r1| {
        for_each_segment(batch, o.len, r0, r1, |dof, so, j0, n| {
            // Wrapping: the plan's offsets, which `f`'s caller vouches for.
            let dp = d.get().wrapping_offset(dof + j0 as isize * o.dst);
            let sp = s.get().wrapping_offset(so + j0 as isize * o.src);
            f(dp, sp, n);
        });
    });
}

/// Rows longer than [`SHORT_ROW_MAX`] and shorter than this many bytes go
/// through one loop a slice ([`super::avx2::copy_runs`]: 32-byte loads, four
/// before their stores), not a [`copy_run`] a row (a call to libc's memcpy for
/// these lengths, through [`for_each_segment`]'s closure): a row a page or more
/// from the next is a demand miss, and the fewer instructions each row costs,
/// the more rows' misses the core keeps in flight. Zen 2 VM, Python, into a new
/// output, alternated processes, µs, a row at a time → the loop (torch): one
/// thread, `x[:, :96]` of 8192² f32 774–776 → 536–574 (487–511), `[:, :128]`
/// 832–836 → 645–668 (601–735); two cores, 100³ f32 `[:, ::2]` 49–54 → 35–40
/// (40–47), 2000 × 512 `[:, :100]` 20–23 → 16–18 (18–21), 2048² u8 flipped
/// `[::-1, :1000]` 40–42 → 37–38. Rows of 2 KiB and more keep [`copy_run`],
/// whose AVX2 blocks and `rep movsb` take them; shorter ones [`short_rows`]
/// (this loop lost on 64-byte rows, 146–157 → 174–180 µs, and matched it on 128
/// and 256).
const ROW_LOOP_MAX: isize = 2048;

/// Streamed copies of rows past [`SHORT_ROW_MAX`] and under [`ROW_LOOP_MAX`]
/// bytes whose rows lie this many row lengths apart or more take the row loop's
/// ordinary stores too. Their source is read a few lines a page, at the pace of
/// one miss a row, which the stores' write-backs do not slow, while streamed
/// stores lost. Zen 2 VM, Python, into a new output, alternated processes, µs,
/// streamed → the loop (torch, NumPy): one thread, `x[:, :200]` of 8192² f32
/// 1455–1577 → 929–932 (925–945), `[:, :256]` 1657–1672 → 1127–1140
/// (1186–1223), 16384 × 4096 `[:, :256]` 3197–3249 → 2313–2360 (2346–2411),
/// 32768 × 2048 `[:, :256]` (32 MiB) 6396–6475 → 4584–4765 (NumPy 4947–7441);
/// two cores, 65536 × 512 `[:, :128]` (2 KiB apart) 5150–5212 → 3597–3664,
/// 8192² `[:, :200]` 815–846 → 540–550 (608–666). Denser rows keep streaming: 1
/// KiB rows 4 KiB apart even (32768 × 1024 `[:, :256]`, 3440–3503 streamed,
/// 3474–3522 cached), 1600-byte rows 4 KiB apart 4653–4682 streamed against
/// 5390–5528, `[:, :500]` of 32768 × 512 3862–4076 against 4859–4986.
const SPARSE_ROWS_SPAN: usize = 4;

/// Short rows of 128 and 256 bytes go through [`super::avx2::copy_rows`]
/// where the CPU has AVX2 and they are not prefetched ([`short_rows_ahead`]):
/// each row loaded whole in four or eight 32-byte loads, then stored, a loop
/// a call. [`short_rows`] moved them in 16-byte blocks (and 256-byte rows
/// through a call to libc's memcpy each: a literal 256 there took 326–365
/// µs where the call took 429–439 on the first figure below). Zen 2 VM,
/// Python, into a new output, alternated processes, µs (torch): one thread,
/// `x[:, :64]` of 8192² f32 424–439 → 309–343 (333–358), `[:, :32]` 256–282 →
/// 205–233 (213–234); two cores, `[:, :64]` 404–431 → 275–286 (295–329),
/// `[:, :32]` 203–218 → 155–156 (172–207), 20000 × 300 `[:, :16]` f64
/// 183–186 → 127–148 (154–216), 4000 × 40 `[:, :32]` f32 14–15 → 12 (15–17),
/// 2000² u8 `[:, :256]` 18–19 → 13–14 (17–23), 1000 × 300 `[:, :64]` f32
/// 10–15 → 11–13 (10–15). Not 64-byte rows: 139–165 → 476 (two loads and
/// stores a row; the cause is not found).
#[cfg(target_arch = "x86_64")]
const SHORT_ROWS_AVX2: [isize; 2] = [128, 256];

/// Rows up to this many bytes take [`short_rows`] along the first outer dim
/// of each slice (ordinary stores: streaming whole lines of short rows
/// measured slower). Under more outer dims than one they took a
/// [`copy_run`] a row through [`for_each_segment`]'s closure: Zen 2 VM,
/// Python, two cores, into a new output, alternated processes, µs (torch):
/// `x[:, :-1, :8]` of 64 × 500 × 100 f32 93–97 → 29–30 (67–74), `[:, :-1,
/// :16]` 110–112 → 48–51 (58–64), of 8 × 2048² f32 `[:, :-1, :16]` 313–329 →
/// 145–147 (138–149), `[:, :-1, :32]` 483–485 → 187–205 (211–238), `[:, :-1,
/// :64]` 577–694 → 361–363 (387–444); 200 × 300² u8 `[:, :-1, :100]` 903–956
/// → 251–789 (342–1021).
const SHORT_ROW_MAX: isize = 256;

/// Rows ahead that [`short_rows`] prefetches when rows are far apart.
const SHORT_ROW_PREFETCH: usize = 4;

/// Whether rows of `row` bytes take AVX2's whole-row loop when not
/// prefetched ([`SHORT_ROWS_AVX2`]: the CPU has AVX2 and allows it).
fn whole_row_loop(row: isize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return SHORT_ROWS_AVX2.contains(&row) && super::avx2::enabled();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = row;
        false
    }
}

/// Rows ahead that [`short_rows`] prefetches for rows of `row` bytes, `ss`
/// bytes apart. Rows a page or more apart are each a demand miss the
/// hardware prefetchers do not follow: fetch a few rows ahead (Zen 5 VM, 64
/// columns of an 8192² f32 matrix, one run: 83 GB/s without, 84/88/93/92 at
/// 2/3/4/6 rows ahead; 16 columns 34 → 45 at 4). Not where the L2 has few
/// ways: there the prefetches only slowed the misses the loads keep in
/// flight themselves (Zen 2 VM, two cores, Python, into a reused output,
/// the best of three alternated processes, µs, columns of an 8192² f32
/// matrix, 4 rows ahead → none: 8 columns 90.6 → 58.2, 16 108.8 → 82.8, 32
/// 150.9 → 152.1, 64 253.2 → 232.1; torch 131.5, 75.1, 121.4, 197.0; one
/// thread, 16 columns 195 → 143, torch 136). Where the L2 is big
/// ([`l2_is_big`]), not rows of a line or less, nor those AVX2's whole-row
/// loop takes ([`SHORT_ROWS_AVX2`]): they lost to the prefetches on the
/// Emerald Rapids VM (two cores, Python, into a reused output, in-process
/// A/B, best of 35–45 alternated calls, prefetched → not, µs, `x[:, 5:5 +
/// k]` of an 8192² f32 matrix: k = 8 44.0–58.3 → 32.1–42.6, 16 38.1–42.0 →
/// 32.5–36.4, 32 56.4–68.0 → 50.3–54.1, 64 77.8–81.7 → 77.8–86.2; 16384²
/// u8, k = 64 64.5–69.7 → 56.6–61.4; from a cold source, 16384² f32, k = 16
/// 247–250 → 222–225; rows of 96 bytes kept them, 53.8–62.9 against
/// 61.0–69.0).
/// `looped`: [`whole_row_loop`] for `row`.
fn short_rows_ahead(ss: isize, row: isize, looped: bool) -> usize {
    let unhelped = l2_is_big() && (row <= LINE as isize || looped);
    if ss.unsigned_abs() >= 4096 && !l2_has_few_ways() && !unhelped {
        SHORT_ROW_PREFETCH
    } else {
        0
    }
}

/// Copies `count` rows of `row` bytes, `ds`/`ss` bytes apart, prefetching
/// the source row `ahead` rows on (none when 0), streamed where `nt` (rows
/// of 256 bytes or more, see [`copy_run`]). Always inlined, so a literal
/// `row` makes the per-row copy a fixed-size one.
///
/// # Safety
///
/// Every row `i < count` at `dst + i·ds` / `src + i·ss` is in bounds, and
/// no destination row overlaps a source row; with `nt`, as [`copy_run`].
#[inline(always)]
#[allow(clippy::too_many_arguments)] // two operands, their strides, the shape, the prefetch and store kinds
unsafe fn short_rows(
    mut dst: *mut u8,
    mut src: *const u8,
    ds: isize,
    ss: isize,
    count: usize,
    row: usize,
    ahead: usize,
    nt: bool,
) {
    for i in 0..count {
        if ahead > 0 && i + ahead < count {
            let next = src.wrapping_offset(ahead as isize * ss);
            for at in (0..row).step_by(LINE).chain([row - 1]) {
                prefetch(next.wrapping_add(at), Cache::L1);
            }
        }
        // SAFETY: the caller's contract, row by row.
        unsafe { copy_run(dst, src, row, nt) };
        // Wrapping: past the last row the pointers may leave the operands.
        dst = dst.wrapping_offset(ds);
        src = src.wrapping_offset(ss);
    }
}

/// Rows up to this many bytes are copied in tiles when the source order of
/// the rows differs from the destination order.
const ROW_TILE_MAX_ROW: isize = 2048;
/// Bytes of consecutive rows a row tile reads (and writes) in one run.
const ROW_TILE_RUN: usize = 2048;
/// The same where the L2 has few ways ([`l2_has_few_ways`]). Zen 2 VM, two
/// cores, Python, into a new output, the best of seven alternated
/// processes, speed-up over 2 KiB (a second run of 2 KiB: 1.00–1.06×): 61
/// × 67 × 59 × 3 permuted 1023 f64 1.25×, u8 1.12×, u16 1.06×, f32 1.03×;
/// 4 × 197 × 12 × 64 f32 0213 1.17×; 100 × 200 × 300 u8 102 1.16×; 33 × 35
/// × 37 × 4 f32 1023 1.05×; 128³ f32 102 1.04×, 31 × 29 × 27 × 3 f32 1023
/// 1.04×, 31 × 29 × 27 × 2 f64 1.03×, 300 × 200 × 100 f32 102 1.02×, 16 ×
/// 1024 × 8 × 128 f16 0213 1.02×. 8 KiB won on some (f32 1023 1.53×) and
/// lost on others (u8 0.83×, 31 × 29 × 27 × 3 f32 0.82×, 128³ f32 0.86×).
const ROW_TILE_RUN_FEW_WAYS: usize = 4096;

/// Row copies whose rows are transposed: `dims[1]` (the next destination dim)
/// is not the next source dim, `dims[k]` is (attention's `[B,S,H,D] →
/// [B,H,S,D]`, `(1, 2, 0, 3)` permutes). Walking rows in destination order
/// would read one short row per source page visit; tiles of rows over
/// (`dims[1]`, `dims[k]`) read and write runs of ~2 KiB on both sides (4
/// KiB where the L2 has few ways).
///
/// # Safety
///
/// As [`execute`](super::execute).
unsafe fn rows_tiled(plan: &CopyPlan, k: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let row_bytes = plan.dims[0].len * plan.elem_size;
    let a = plan.dims[1];
    let b = plan.dims[k];
    let batch: SmallVec<[PlanDim; INLINE_DIMS]> = plan
        .dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i > 1 && i != k)
        .map(|(_, d)| *d)
        .collect();
    let run = if l2_has_few_ways() {
        ROW_TILE_RUN_FEW_WAYS
    } else {
        ROW_TILE_RUN
    };
    let per_run = (run / row_bytes).max(1);
    let (bi, bj) = (per_run.min(a.len), per_run.min(b.len));
    let (nbi, nbj) = (a.len.div_ceil(bi), b.len.div_ceil(bj));
    let per_slice = nbi * nbj;
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    // A tile walks its rows in destination order (runs of `a` rows written
    // whole, one per `b` row, read from rows `a.src` apart) where the source
    // stays in cache (up to half a core's L2, so both operands fit) or rows
    // are shorter than a line (source order writes each a partial line);
    // otherwise in source order, whose reads the hardware prefetchers follow
    // while the store buffer absorbs the scattered stores. One thread,
    // Python, into a reused output, µs, source → destination order:
    // - B × S × H × D → B × H × S × D: f16 1 × 197 × 12 × 64 12.7 → 8.7
    //   (torch 10.5), 1 × 128 × 8 × 32 2.9 → 2.6, f32 1 × 64 × 8 × 64 5.0 →
    //   4.1 (torch 5.0); 61 × 67 × 59 × 3 u8 1023 41.4 → 34.0;
    // - short rows: 31 × 29 × 27 × 3 f64 2013 (24 bytes) 32.9 → 22.9, 100 ×
    //   100 × 3 f64 102 16.9 → 10.0; 33 × 35 × 37 × 4 f64 1203 (32 bytes,
    //   2.9 MiB) 149 → 90, × 6 (48 bytes) 202 → 169;
    // - larger copies of longer rows lost: × 8 (64 bytes) 215 → 235, × 16
    //   479 → 510; two cores, 8 × 512 × 16 × 64 f16 318 → 358, 100 × 200 ×
    //   300 u8 102 284 → 334.
    let in_cache = plan.bytes() <= l2_bytes() / 2;
    let dst_order = row_bytes < LINE || in_cache;
    let (ad, asrc, bd, bsrc) = (a.dst, a.src, b.dst, b.src);
    // Rows in cache, 32 bytes or longer: 64-byte loads and stores (AVX-512)
    // or 32-byte ones (AVX2), where `copy_run` moves 16 bytes at a time (or
    // calls memcpy). AVX2 against `copy_run`, Python, into a reused output,
    // the median of 30 paired calls in one process: B × S × H × D → B × H ×
    // S × D, f16 2 × 333 × 16 × 64 1.18×, 4 × 77 × 12 × 64 1.28×, 1 × 256 ×
    // 8 × 64 1.22×, 2 × 333 × 16 × 32 1.52×; f32 4 × 77 × 12 × 64 1.06×, 2 ×
    // 333 × 16 × 128 1.09×. AVX-512 against AVX2 in cache, one thread,
    // destination order, µs: f16 1 × 197 × 12 × 64 12.9 → 8.9, f32 4 × 77 ×
    // 12 × 64 54.0 → 42.5, 61 × 67 × 59 × 3 u8 1023 43.7 → 35.2; 2 × 333 ×
    // 16 × 32 f16 (64-byte rows) even. Out of cache it runs on rows of
    // three to eight lines only ([`AVX512_ROWS_OUT_OF_CACHE`]): longer ones
    // lost (61 × 67 × 59 × 3 f32 1023, 708-byte rows: 214 → 241 µs, 225 → 241
    // with the stores line-aligned). Streamed copies stream: rows
    // of whole lines into line-aligned rows in one AVX-512 loop
    // ([`RowKernel::pick`]), others through `copy_run`.
    let dst_lines = (dst as usize).is_multiple_of(LINE)
        && [a.dst, b.dst]
            .iter()
            .chain(batch.iter().map(|d| &d.dst))
            .all(|s| s % LINE as isize == 0);
    let kernel = RowKernel::pick(row_bytes, in_cache, nt, dst_lines);
    par_for(per_slice * slices, plan.bytes(), |t0, t1| {
        // Locals, not the captured values: LLVM reloads those after every
        // store, which may alias them.
        let (dp, sp) = (d.get(), s.get());
        for_each_segment(&batch, per_slice, t0, t1, |dof, so, first, n| {
            for t in first..first + n {
                let (i0, j0) = (t / nbj * bi, t % nbj * bj);
                let (ni, nj) = (bi.min(a.len - i0), bj.min(b.len - j0));
                // (count, dst stride, src stride) of the runs, and of the rows
                // that start one each.
                let (outer, runs) = if dst_order {
                    ((nj, bd, bsrc), (ni, ad, asrc))
                } else {
                    ((ni, ad, asrc), (nj, bd, bsrc))
                };
                let (d0, s0) = (
                    dof + i0 as isize * ad + j0 as isize * bd,
                    so + i0 as isize * asrc + j0 as isize * bsrc,
                );
                for o in 0..outer.0 as isize {
                    // SAFETY: one run of rows of the tile (i0..i0 + ni, j0..j0
                    // + nj), in bounds on both sides.
                    unsafe {
                        let (dst, src) = (dp.offset(d0 + o * outer.1), sp.offset(s0 + o * outer.2));
                        kernel.copy(dst, src, runs.0, row_bytes, runs.1, runs.2, nt);
                    }
                }
            }
        });
        store_fence(nt);
    });
}

/// Rows of these many bytes take AVX-512's loop ([`RowKernel::Avx512`]) in
/// row tiles out of the L2 too, not only in it: in-process A/B, Zen 5 VM,
/// into a reused output, best of six alternated calls, both orders, AVX2 →
/// AVX-512, one thread / two: B × S × H × D → B × H × S × D f32, D = 48
/// (192-byte rows) 1.08–1.16× / 0.97–1.18×, 60 1.04–1.14× / 0.95–1.36×, 64
/// 1.32–1.41× / 1.04–1.20×, 100 (400 bytes) 0.98–1.18× / 0.98–1.42×, 128 (2 ×
/// 1000 × 16, 16 MiB) 1.16–1.26× / 0.81–1.10× (once under 0.98), 130 and
/// 150 1.00–1.09× / 1.04–1.11×; f16 D = 96 1.18–1.39× / 1.07–1.16×; 61 × 67 × 59 × 3 u8 1023
/// (177-byte rows) 1.16–1.20× / 1.13–1.33×, 300 × 200 × 100 f32 102 1.06–1.17×
/// / 0.97–1.29×. Rows of two lines (f16 D = 64, f32 D = 32: 0.82–1.05× on two
/// threads, mostly under 1) and long rows lost: 1 KiB 0.92–0.99× on one thread,
/// 708 bytes 0.92–0.98×, 1416 0.85–0.94× (61 × 67 × 59 × 3 f32 and f64 1023,
/// lines split on both sides); 768 and 600 bytes even.
#[cfg(target_arch = "x86_64")]
const AVX512_ROWS_OUT_OF_CACHE: std::ops::RangeInclusive<usize> = 2 * LINE + 1..=8 * LINE;

/// How [`rows_tiled`] copies a run of rows.
#[derive(Clone, Copy)]
enum RowKernel {
    /// [`super::avx512::copy_runs`]: rows of 32 bytes or more of copies in
    /// cache, and of [`AVX512_ROWS_OUT_OF_CACHE`] bytes of other copies not
    /// streamed, where the CPU has AVX-512.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// [`super::avx2::copy_runs`]: other rows of 32 bytes or more, not
    /// streamed, where the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// [`super::avx512::stream_runs`]: rows of whole lines of streamed copies
    /// into line-aligned destination rows, where the CPU has AVX-512.
    #[cfg(target_arch = "x86_64")]
    Avx512Stream,
    /// [`short_rows`], literal sizes inlined: short rows, streamed copies, and
    /// CPUs without AVX2.
    Rows,
}

impl RowKernel {
    /// The kernel for rows of `row_bytes`; `dst_lines`: every destination
    /// row starts on a line.
    fn pick(row_bytes: usize, in_cache: bool, nt: bool, dst_lines: bool) -> RowKernel {
        // Streamed rows of whole lines: one loop of 64-byte loads and streaming
        // stores over a run of rows, where `copy_run` (a call a row, and
        // ordinary stores under 256 bytes) lost. In-process A/B, Zen 5 VM, two
        // cores, best of eight alternated calls, both orders (GB/s): B × S × H
        // × D → B × H × S × D f32, D = 16 (64-byte rows) 38 → 64 and 35 → 58,
        // 32 38 → 58, 48 34 → 45, 64 40 → 50, 128 45 → 54, 256 and 512 (1 and 2
        // KiB) 1.00–1.04×; `devtensor bench`'s attention permutes f16 × 64
        // 38 → 57, × 128 40 → 50, 64⁴ f32 1203 38 → 48.
        #[cfg(target_arch = "x86_64")]
        if nt && dst_lines && row_bytes.is_multiple_of(LINE) && super::avx512::enabled() {
            return RowKernel::Avx512Stream;
        }
        #[cfg(target_arch = "x86_64")]
        if !nt && row_bytes >= 32 {
            if (in_cache || AVX512_ROWS_OUT_OF_CACHE.contains(&row_bytes)) && super::avx512::enabled() {
                return RowKernel::Avx512;
            }
            if super::avx2::enabled() {
                return RowKernel::Avx2;
            }
        }
        let _ = (row_bytes, in_cache, nt, dst_lines);
        RowKernel::Rows
    }

    /// Copies `count` rows of `row` bytes, `ds` and `ss` bytes apart.
    ///
    /// # Safety
    ///
    /// As [`short_rows`] (the CPU has the kernel's instructions: [`Self::pick`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // two operands, their strides, the shape and the store kind
    unsafe fn copy(self, dst: *mut u8, src: *const u8, count: usize, row: usize, ds: isize, ss: isize, nt: bool) {
        // SAFETY: the caller's contract; `pick` chose the kernel for this CPU.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                RowKernel::Avx512 => super::avx512::copy_runs(dst, src, count, row, ds, ss),
                #[cfg(target_arch = "x86_64")]
                RowKernel::Avx2 => super::avx2::copy_runs(dst, src, count, row, ds, ss),
                #[cfg(target_arch = "x86_64")]
                RowKernel::Avx512Stream => super::avx512::stream_runs(dst, src, count, row, ds, ss),
                // Literal sizes of short rows inline to fixed moves (`copy_run`
                // streams 256 bytes or more only). With `rows_tiled`'s locals
                // for the operands, Python, µs: 31 × 29 × 27 × 3 f64 permuted
                // 2013 (24-byte rows) 29.5 → 14.8 (torch 17.0), 100 × 100 × 3
                // f64 102 19.9 → 9.1 (14.2).
                RowKernel::Rows => match row {
                    8 => short_rows(dst, src, ds, ss, count, 8, 0, false),
                    12 => short_rows(dst, src, ds, ss, count, 12, 0, false),
                    16 => short_rows(dst, src, ds, ss, count, 16, 0, false),
                    24 => short_rows(dst, src, ds, ss, count, 24, 0, false),
                    32 => short_rows(dst, src, ds, ss, count, 32, 0, false),
                    other => short_rows(dst, src, ds, ss, count, other, 0, nt),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows near each other are never prefetched; rows a page or more apart
    /// are, but not where the L2 has few ways, nor, where it is big, rows of
    /// a line or less and rows that AVX2's whole-row loop takes.
    #[test]
    fn far_rows_are_prefetched_unless_the_l2_has_few_ways() {
        let short_rows_ahead = |ss, row| short_rows_ahead(ss, row, whole_row_loop(row));
        assert_eq!(short_rows_ahead(64, 96), 0);
        assert_eq!(short_rows_ahead(-4095, 96), 0);
        let far = if l2_has_few_ways() { 0 } else { SHORT_ROW_PREFETCH };
        assert_eq!(short_rows_ahead(8192 * 4, 96), far);
        assert_eq!(short_rows_ahead(-4096, 200), far);
        let big = l2_is_big();
        for row in [4, 16, 64] {
            let ahead = if big { 0 } else { far };
            assert_eq!(short_rows_ahead(8192 * 4, row), ahead, "{row}-byte rows");
        }
        #[cfg(target_arch = "x86_64")]
        let looped = super::super::avx2::enabled();
        #[cfg(not(target_arch = "x86_64"))]
        let looped = false;
        for row in [128, 256] {
            let ahead = if big && looped { 0 } else { far };
            assert_eq!(short_rows_ahead(8192 * 4, row), ahead, "{row}-byte rows");
        }
    }

    /// Out of the L2, row tiles of three to eight lines a row take AVX-512's
    /// loop; rows of two lines and of more than eight keep AVX2's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rows_of_three_to_eight_lines_take_avx512_out_of_cache() {
        if !super::super::avx512::enabled() {
            println!("SKIP: AVX-512 F and BW unavailable or disabled");
            return;
        }
        for (row, avx512) in [
            (128, false),
            (129, true),
            (177, true),
            (512, true),
            (513, false),
            (1024, false),
        ] {
            let kernel = RowKernel::pick(row, false, false, true);
            assert_eq!(matches!(kernel, RowKernel::Avx512), avx512, "{row}-byte rows");
            assert_eq!(matches!(kernel, RowKernel::Avx2), !avx512, "{row}-byte rows");
        }
        // In cache every row of 32 bytes or more takes it.
        assert!(matches!(RowKernel::pick(1024, true, false, true), RowKernel::Avx512));
    }
}
