//! How fast can a 2-D transpose be on this machine? Times, side by side in one
//! process, a memcpy, devtensor's f16 transpose (of a dense matrix, from one
//! whose rows are a line longer, and into one: power-of-two row strides put
//! every row's lines in the same cache sets and, on the Zen 4 VM, cost the
//! same kernel a quarter to a half of its speed; the two pitched rows tell
//! whether the source's stride or the destination's costs it), and line
//! kernels that move the transpose's bytes without its arithmetic:
//!
//! - `copy`: every 64-byte line of the source goes whole to the line the
//!   transpose puts its elements in (the same reads, the same streamed
//!   writes, no shuffles), so its time is the memory system's price of a
//!   transpose's access pattern;
//! - `reads`, `writes`: the same line reads alone, the same streamed writes
//!   alone;
//!
//! each in four orders: `tile` (a line from each of 32 rows, then the next
//! line over, as a 32 × 32 transpose kernel reads: each destination row gets
//! one line), `row` (1 KiB of each row in turn), and `tile pairs` and `row
//! pairs`, the same over 64 rows, rows `r` and `r + 32` a line of each in
//! turn, so that each destination row gets two adjacent lines back to back;
//! and each from dense rows and from `pitched` ones (source and destination
//! rows a line longer than `n`).
//! Streamed stores are the right choice here: plain stores made the line copy
//! 2.2× slower on the Zen 4 VM (read-for-ownership traffic).
//!
//! Two probes of the memory system alone, on the dense matrices:
//!
//! - `reads, bands of R rows`: a tile's reads, 256 bytes (four lines) of each
//!   of `R` source rows, then the next four lines of the same rows, with no
//!   software prefetch (what the hardware prefetchers follow alone) and with
//!   the next tile's lines prefetched into L1 a tile ahead (`, prefetched`;
//!   the transposes' `NextTile` prefetches the same lines, the same rows
//!   further along, into L2, spread over the tile's destination runs). The
//!   two tell whether tiles tall enough for long destination runs need the
//!   software prefetches;
//! - `writes, runs of k lines`: streamed writes of `k` adjacent lines to each
//!   destination row in turn, down a strip of every row, then the next strip:
//!   the destination runs a transpose's tiles write.
//!
//! The ratio of each copy to memcpy is the figure issue 15 item 6 asks about:
//! where a shuffle-free `copy` itself sits well under memcpy, no transpose
//! kernel reaches memcpy either, and the gap between `copy` and `transpose` is
//! what the kernel's shuffles (and how they overlap with memory) cost.
//!
//! `cargo bench --bench transpose_ceiling -- [n] [rounds]` (default 4096 × 4096
//! f16, 15 rounds, `n` a multiple of 256; `RAYON_NUM_THREADS` sets the
//! threads).

use std::hint::black_box;
use std::time::{Duration, Instant};

use devtensor::copy::copy_strided;
use rayon::prelude::*;

/// Bytes in a cache line, the unit the line kernels move.
const LINE: usize = 64;
/// f16 elements in a line: a 32 × 32 tile is 32 lines on each side.
const ELEMS_PER_LINE: usize = LINE / 2;
/// Source rows per stripe (a multiple of `ELEMS_PER_LINE`).
const STRIPE_ROWS: usize = 32;
/// Lines per source row read side by side in `Order::Rows` (1 KiB, the width
/// of devtensor's f16 tiles).
const LINES_ACROSS: usize = 16;
const _: () = assert!(STRIPE_ROWS.is_multiple_of(ELEMS_PER_LINE));
/// Elements that the pitched source's rows add to `n` (one line of f16).
const PITCH_PAD: usize = 32;
/// Rows ahead the row-order kernels prefetch.
const PREFETCH_ROWS: usize = 2;
/// Source rows the band probes read at a time (`Op::Bands`).
const BAND_ROWS: [usize; 5] = [8, 16, 32, 64, 128];
/// Lines of each row a band probe reads a tile (the prefetched route's f16
/// tiles read 256 bytes of each row).
const BAND_LINES: usize = 4;
/// Adjacent lines each destination row gets in turn (`Op::RunWrites`).
const RUN_LINES: [usize; 4] = [1, 2, 4, 8];
// `main` takes the largest of the probes' sizes as a multiple of them all,
// which holds for powers of two.
const fn powers_of_two(v: &[usize]) -> bool {
    let mut i = 0;
    while i < v.len() {
        if !v[i].is_power_of_two() {
            return false;
        }
        i += 1;
    }
    true
}
const _: () = assert!(powers_of_two(&BAND_ROWS) && powers_of_two(&RUN_LINES) && BAND_LINES.is_power_of_two());

/// The two buffers, shared by the stripes: each stripe writes lines no other
/// stripe writes, and none writes the source.
#[derive(Clone, Copy)]
struct Buffers {
    src: *const u8,
    dst: *mut u8,
}
// SAFETY: the stripes only read `src` and write disjoint lines of `dst` (see
// `line_target`); the band probes only read, and the run probes' strips write
// disjoint lines.
unsafe impl Send for Buffers {}
// SAFETY: as above.
unsafe impl Sync for Buffers {}

/// Where the transpose of an `n × n` f16 matrix puts the 64-byte line that
/// starts `block` lines into source row `row`: its 32 elements become element
/// `row` of 32 consecutive destination rows, so line `block` of source rows
/// `32k..32k + 32` lands in destination rows `32·block..32·block + 32`, at line
/// `k`. The map is a bijection on lines, so stripes (whole groups of 32 rows)
/// never collide.
fn line_target(row: usize, block: usize, row_bytes: usize) -> usize {
    (block * ELEMS_PER_LINE + row % ELEMS_PER_LINE) * row_bytes + (row / ELEMS_PER_LINE) * LINE
}

/// What a line kernel does with the line at `src` and its target `dst`.
#[derive(Clone, Copy, PartialEq)]
enum LineOp {
    Copy,
    Read,
    Write,
}

/// The order a stripe's lines are visited in.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// Down the stripe one line column at a time: a line from each of its 32
    /// rows, then the next line over, as a 32 × 32 transpose kernel reads.
    Tile,
    /// As `Tile` over two stripes' rows, `r` then `r + 32`: the two lines
    /// land next to each other in one destination row.
    TilePairs,
    /// Along each row, `LINES_ACROSS` lines at a time, then the next row.
    Rows,
    /// As `Rows` over two stripes' rows, `r` and `r + 32` a line of each in
    /// turn: reads along rows, and each destination row gets two adjacent
    /// lines back to back.
    RowPairs,
}

impl Order {
    /// Stripes visited a line at a time together (rows `r`, `r + 32`, …): the
    /// lines each destination row gets back to back.
    fn stripes_together(self) -> usize {
        match self {
            Order::TilePairs | Order::RowPairs => 2,
            Order::Tile | Order::Rows => 1,
        }
    }

    /// Source rows a stripe of this order covers.
    fn stripe_rows(self) -> usize {
        self.stripes_together() * STRIPE_ROWS
    }
}

/// Runs `op` over every line of stripe `stripe` in `order`, and returns a fold
/// of what it read (so reads cannot be dropped).
///
/// # Safety
/// `src` and `dst` hold `n` rows `pitch` bytes apart (`n` f16 each, `row_bytes`,
/// `n` a multiple of `order.stripe_rows()`), are 64-byte aligned and do not
/// overlap; `stripe < n / order.stripe_rows()`.
unsafe fn stripe_lines(
    op: LineOp,
    order: Order,
    src: *const u8,
    dst: *mut u8,
    row_bytes: usize,
    pitch: usize,
    stripe: usize,
) -> u64 {
    let start = stripe * order.stripe_rows();
    // The rows a visit of row `r` of the first stripe takes in turn.
    let together = move |r: usize| (0..order.stripes_together()).map(move |k| r + k * STRIPE_ROWS);
    let lines = row_bytes / LINE;
    let mut fold = 0u64;
    // SAFETY: every (row, line) visited is inside the source (`rows` within
    // `n`, `b < lines`), `line_target` stays inside the destination, and both
    // lines are aligned as the caller promises; prefetches never fault.
    let mut visit = |r: usize, b: usize| unsafe {
        fold ^= move_line(op, src.add(r * pitch + b * LINE), dst.add(line_target(r, b, pitch)));
    };
    let reads = op != LineOp::Write;
    match order {
        Order::Tile | Order::TilePairs => {
            for b in 0..lines {
                for r in (start..start + STRIPE_ROWS).flat_map(together) {
                    if reads && b + 1 < lines {
                        prefetch(src.wrapping_add(r * pitch + (b + 1) * LINE));
                    }
                    visit(r, b);
                }
            }
        }
        Order::Rows | Order::RowPairs => {
            for block0 in (0..lines).step_by(LINES_ACROSS) {
                let blocks = block0..(block0 + LINES_ACROSS).min(lines);
                for r0 in start..start + STRIPE_ROWS {
                    if reads && r0 + PREFETCH_ROWS < start + STRIPE_ROWS {
                        for b in blocks.clone() {
                            for r in together(r0) {
                                prefetch(src.wrapping_add((r + PREFETCH_ROWS) * pitch + b * LINE));
                            }
                        }
                    }
                    for b in blocks.clone() {
                        for r in together(r0) {
                            visit(r, b);
                        }
                    }
                }
            }
        }
    }
    fold
}

/// Asks for the line at `p` in L1; safe for any address (a prefetch never
/// faults).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a prefetch of any address is harmless.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Moves (or only reads, or only writes) one line with 16-byte SSE2 loads and
/// streaming stores, the widths every x86-64 has.
///
/// # Safety
/// `s` (unless `op` only writes) and `d` (unless it only reads) are 64-byte
/// aligned lines inside their buffers.
#[inline(always)]
unsafe fn move_line(op: LineOp, s: *const u8, d: *mut u8) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the four 16-byte lanes are inside the
        // aligned 64-byte lines the caller names.
        unsafe {
            let mut fold = 0u64;
            for k in 0..4 {
                let v = if op == LineOp::Write {
                    _mm_set1_epi8(7)
                } else {
                    _mm_load_si128(s.add(16 * k).cast())
                };
                if op == LineOp::Read {
                    fold ^= _mm_cvtsi128_si64(v) as u64;
                } else {
                    _mm_stream_si128(d.add(16 * k).cast(), v);
                }
            }
            fold
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the lines `op` uses are in bounds (the caller's contract) and,
    // for a copy, do not overlap; the other pointer is not used.
    unsafe {
        match op {
            LineOp::Copy => std::ptr::copy_nonoverlapping(s, d, LINE),
            LineOp::Read => return std::ptr::read_volatile(s.cast::<u64>()),
            LineOp::Write => std::ptr::write_bytes(d, 7, LINE),
        }
        0
    }
}

/// One cache line; a `Vec<Line>` is a 64-byte aligned buffer.
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// An `n × n` f16 matrix's worth of lines, filled with a pattern.
fn matrix_lines(n: usize, seed: usize) -> Vec<Line> {
    (0..2 * n * n / LINE)
        .map(|i| Line(std::array::from_fn(|j| (i.wrapping_mul(31) + j + seed) as u8)))
        .collect()
}

/// One timed operation.
#[derive(Clone, Copy)]
enum Op {
    Memcpy,
    Transpose,
    /// The same transpose from rows `PITCH_PAD` elements longer than `n`.
    TransposePitched,
    /// The same transpose from dense rows into rows `PITCH_PAD` elements
    /// longer than `n`: with `TransposePitched`, tells a cost of the source's
    /// power-of-two row stride from one of the destination's.
    TransposeIntoPitched,
    /// A line kernel, from and to rows a line longer than `n` if `pitched`.
    Lines {
        op: LineOp,
        order: Order,
        pitched: bool,
    },
    /// Reads of [`BAND_LINES`] lines of each of `rows` rows a tile, the next
    /// tile's lines prefetched with `prefetch`.
    Bands {
        rows: usize,
        prefetch: bool,
    },
    /// Streamed writes of `lines` adjacent lines to each row in turn.
    RunWrites {
        lines: usize,
    },
}

/// The timed operations and their names, in the order printed.
fn ops() -> Vec<(String, Op)> {
    let mut v = vec![
        ("memcpy".to_string(), Op::Memcpy),
        ("transpose".to_string(), Op::Transpose),
        ("transpose, pitched".to_string(), Op::TransposePitched),
        ("transpose, into pitched".to_string(), Op::TransposeIntoPitched),
    ];
    for pitched in [false, true] {
        for (kind, op) in [
            ("copy", LineOp::Copy),
            ("reads", LineOp::Read),
            ("writes", LineOp::Write),
        ] {
            for (how, order) in [
                ("tile order", Order::Tile),
                ("tile pairs", Order::TilePairs),
                ("row order", Order::Rows),
                ("row pairs", Order::RowPairs),
            ] {
                let layout = if pitched { ", pitched" } else { "" };
                v.push((format!("{kind}, {how}{layout}"), Op::Lines { op, order, pitched }));
            }
        }
    }
    for prefetch in [false, true] {
        for rows in BAND_ROWS {
            let how = if prefetch { ", prefetched" } else { "" };
            v.push((
                format!("reads, bands of {rows} rows{how}"),
                Op::Bands { rows, prefetch },
            ));
        }
    }
    for lines in RUN_LINES {
        v.push((format!("writes, runs of {lines} lines"), Op::RunWrites { lines }));
    }
    v
}

/// Reads the source rows `band · rows ..` (`rows` of them, `row_bytes` each)
/// [`BAND_LINES`] lines of each at a time, prefetching the next tile's lines
/// (the same rows, the next `BAND_LINES` lines) when `prefetch_next`; returns
/// a fold of what it read.
///
/// # Safety
///
/// `src` holds `(band + 1) · rows` rows of `row_bytes` bytes (a multiple of
/// `BAND_LINES` lines) and is 64-byte aligned.
unsafe fn band_reads(src: *const u8, row_bytes: usize, band: usize, rows: usize, prefetch_next: bool) -> u64 {
    let lines = row_bytes / LINE;
    let mut fold = 0;
    for l0 in (0..lines).step_by(BAND_LINES) {
        for r in band * rows..(band + 1) * rows {
            let row = src.wrapping_add(r * row_bytes);
            for l in l0..l0 + BAND_LINES {
                if prefetch_next && l + BAND_LINES < lines {
                    prefetch(row.wrapping_add((l + BAND_LINES) * LINE));
                }
                // SAFETY: line `l < lines` of row `r` is inside the source (the
                // caller's contract) and aligned; the destination is unused.
                fold ^= unsafe { move_line(LineOp::Read, row.add(l * LINE), std::ptr::null_mut()) };
            }
        }
    }
    fold
}

/// Writes `lines` adjacent lines to each of `rows` rows of `row_bytes` in
/// turn, from line `strip · lines` of each.
///
/// # Safety
///
/// `dst` holds `rows` rows of `row_bytes` bytes (a multiple of a line) and is
/// 64-byte aligned; `(strip + 1) · lines` lines fit in a row; no other thread
/// writes this strip's lines.
unsafe fn run_writes(dst: *mut u8, row_bytes: usize, rows: usize, strip: usize, lines: usize) {
    for r in 0..rows {
        for l in strip * lines..(strip + 1) * lines {
            // SAFETY: line `l` of row `r` is inside the destination and
            // aligned (the caller's contract); a write reads nothing.
            unsafe { move_line(LineOp::Write, std::ptr::null(), dst.add(r * row_bytes + l * LINE)) };
        }
    }
    // The strip's streamed stores, done before the next op reads the time.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// The matrices: `n` rows of `n` f16 (`src`, `dst`), and of `n + PITCH_PAD`
/// (the pitched ones, of which the transpose and the line kernels use the
/// first `n` of each row).
struct Matrices {
    src: Vec<Line>,
    dst: Vec<Line>,
    pitched_src: Vec<Line>,
    pitched_dst: Vec<Line>,
}

/// Runs `op` once on the `n × n` f16 matrices; returns a fold of what a
/// read-only kernel read.
fn run(op: Op, n: usize, m: &mut Matrices) -> u64 {
    let row_bytes = 2 * n;
    let (sp, dp) = (m.src.as_ptr().cast::<u8>(), m.dst.as_mut_ptr().cast::<u8>());
    let ns = n as isize;
    match op {
        // SAFETY: both buffers hold n × row_bytes bytes and do not overlap.
        Op::Memcpy => unsafe { copy_strided(dp, &[1], sp, &[1], &[n * row_bytes], 1) }.expect("memcpy"),
        // SAFETY: both buffers hold n × n two-byte elements; dst[i][j] = src[j][i]
        // stays inside them.
        Op::Transpose => unsafe { copy_strided(dp, &[ns, 1], sp, &[1, ns], &[n, n], 2) }.expect("transpose"),
        // SAFETY: `pitched_src` holds n rows of n + PITCH_PAD two-byte elements.
        Op::TransposePitched => unsafe {
            let pitch = (n + PITCH_PAD) as isize;
            copy_strided(dp, &[ns, 1], m.pitched_src.as_ptr().cast(), &[1, pitch], &[n, n], 2)
        }
        .expect("pitched transpose"),
        // SAFETY: `pitched_dst` holds n rows of n + PITCH_PAD two-byte elements.
        Op::TransposeIntoPitched => unsafe {
            let pitch = (n + PITCH_PAD) as isize;
            copy_strided(m.pitched_dst.as_mut_ptr().cast(), &[pitch, 1], sp, &[1, ns], &[n, n], 2)
        }
        .expect("transpose into pitched rows"),
        Op::Lines { op, order, pitched } => {
            let (bufs, pitch) = if pitched {
                let b = Buffers {
                    src: m.pitched_src.as_ptr().cast(),
                    dst: m.pitched_dst.as_mut_ptr().cast(),
                };
                (b, row_bytes + 2 * PITCH_PAD)
            } else {
                (Buffers { src: sp, dst: dp }, row_bytes)
            };
            return (0..n / order.stripe_rows())
                .into_par_iter()
                .map(|s| {
                    // Moves the whole struct in: a closure naming only its
                    // fields would capture the bare pointers.
                    let b = bufs;
                    // SAFETY: the buffers hold n rows of `pitch` bytes each,
                    // are 64-byte aligned (`Line`) and do not overlap; `s` is
                    // a stripe of them; `main` checks that `n` is a multiple
                    // of every order's stripe; stripes write disjoint lines.
                    unsafe { stripe_lines(op, order, b.src, b.dst, row_bytes, pitch, s) }
                })
                .reduce(|| 0, |a, b| a ^ b);
        }
        Op::Bands { rows, prefetch } => {
            let bufs = Buffers { src: sp, dst: dp };
            return (0..n / rows)
                .into_par_iter()
                .map(|band| {
                    let b = bufs;
                    // SAFETY: the source holds n rows of `row_bytes` (a whole
                    // number of `BAND_LINES` lines: `main` checks n), 64-byte
                    // aligned; `band < n / rows`.
                    unsafe { band_reads(b.src, row_bytes, band, rows, prefetch) }
                })
                .reduce(|| 0, |a, b| a ^ b);
        }
        Op::RunWrites { lines } => {
            let bufs = Buffers { src: sp, dst: dp };
            (0..row_bytes / LINE / lines).into_par_iter().for_each(|strip| {
                let b = bufs;
                // SAFETY: the destination holds n rows of `row_bytes`, 64-byte
                // aligned; strips of `lines` lines tile each row (`main`
                // checks n) and write disjoint lines.
                unsafe { run_writes(b.dst, row_bytes, n, strip, lines) };
            });
        }
    }
    0
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(4096);
    let rounds = args.get(1).copied().unwrap_or(15).max(1);
    // Every probe's rows and lines tile the matrix (all powers of two, so
    // the largest is a multiple of the others).
    let multiple = [
        Order::TilePairs.stripe_rows(),
        BAND_ROWS[BAND_ROWS.len() - 1],
        ELEMS_PER_LINE * BAND_LINES,
        ELEMS_PER_LINE * RUN_LINES[RUN_LINES.len() - 1],
    ]
    .into_iter()
    .max()
    .expect("probes");
    assert!(
        n > 0 && n.is_multiple_of(multiple),
        "n must be a positive multiple of {multiple}, got {n}"
    );
    // The pitched ones: n rows of n + PITCH_PAD elements (the pattern
    // continues into the pad).
    let mut m = Matrices {
        src: matrix_lines(n, 0),
        dst: matrix_lines(n, 1),
        pitched_src: matrix_lines(n + PITCH_PAD, 2),
        pitched_dst: matrix_lines(n + PITCH_PAD, 3),
    };

    // Both transposes are checked, so their rows measure correct kernels.
    let elem = |m: &[Line], row_len: usize, i: usize, j: usize| {
        let b = 2 * (i * row_len + j);
        [m[b / LINE].0[b % LINE], m[b / LINE].0[b % LINE + 1]]
    };
    // (op, source row length, destination row length)
    for (op, from_len, to_len) in [
        (Op::Transpose, n, n),
        (Op::TransposePitched, n + PITCH_PAD, n),
        (Op::TransposeIntoPitched, n, n + PITCH_PAD),
    ] {
        run(op, n, &mut m);
        let from = if from_len == n { &m.src } else { &m.pitched_src };
        let to = if to_len == n { &m.dst } else { &m.pitched_dst };
        for (i, j) in [(0, 1), (1, 0), (n / 3, n - 1), (n - 1, n / 2), (n - 1, n - 1)] {
            assert_eq!(
                elem(to, to_len, i, j),
                elem(from, from_len, j, i),
                "transpose at ({i}, {j})"
            );
        }
    }

    // Alternated rounds, best of each: every op sees the same machine state.
    let ops = ops();
    let mut best = vec![Duration::MAX; ops.len()];
    let mut fold = 0;
    for _ in 0..rounds {
        for ((_, op), b) in ops.iter().zip(best.iter_mut()) {
            let t = Instant::now();
            fold ^= run(*op, n, &mut m);
            *b = (*b).min(t.elapsed());
        }
    }
    black_box(fold);

    let bytes = (2 * n * n) as f64;
    let gbs = |t: Duration| bytes / t.as_secs_f64() / 1e9;
    let of_memcpy = |t: Duration| 100.0 * best[0].as_secs_f64() / t.as_secs_f64();
    println!(
        "transpose_ceiling: {n} x {n} f16 ({} MiB each way), {} threads, best of {rounds} alternated rounds",
        (2 * n * n) >> 20,
        rayon::current_num_threads()
    );
    println!("{:<40} {:>9} {:>12} {:>10}", "op", "ms", "GB/s 1-way", "% memcpy");
    for ((name, op), t) in ops.iter().zip(&best) {
        let pct = match op {
            Op::Lines {
                op: LineOp::Read | LineOp::Write,
                ..
            }
            | Op::Bands { .. }
            | Op::RunWrites { .. } => "-".to_string(),
            _ => format!("{:.1}", of_memcpy(*t)),
        };
        println!("{name:<40} {:>9.3} {:>12.1} {pct:>10}", t.as_secs_f64() * 1e3, gbs(*t));
    }
    // A copy whose reads and writes never overlapped would take the sum of
    // their times; one that overlapped them fully, the longer of the two.
    let time_of = |name: &str| best[ops.iter().position(|(n, _)| n == name).expect("an op")];
    let bounds = |label: &str, reads: &str, writes: &str| {
        let (reads, writes) = (time_of(reads), time_of(writes));
        println!(
            "{label}, bounds: {:.1} % of memcpy (no overlap) .. {:.1} % (full overlap)",
            of_memcpy(reads + writes),
            of_memcpy(reads.max(writes))
        );
    };
    for layout in ["", ", pitched"] {
        for how in ["tile order", "tile pairs", "row order", "row pairs"] {
            bounds(
                &format!("copy, {how}{layout}"),
                &format!("reads, {how}{layout}"),
                &format!("writes, {how}{layout}"),
            );
        }
    }
    // The prefetched route's memory pattern: prefetched tiles of the widest
    // band and the destination runs they write (128 rows of f16: 256 bytes,
    // four lines).
    let rows = BAND_ROWS[BAND_ROWS.len() - 1];
    let lines = rows * 2 / LINE;
    bounds(
        &format!("bands of {rows} rows, prefetched, into runs of {lines} lines"),
        &format!("reads, bands of {rows} rows, prefetched"),
        &format!("writes, runs of {lines} lines"),
    );
}
