//! What the prefetched routes fetch while a tile is written out: the next
//! tile's source lines into L2 ([`NextTile`]), and the partial lines at the
//! ends of the destination runs into L1 ([`RunEnds`]).

use super::super::blocks::LINE;
use super::super::runs::{Cache, prefetch};

/// The source of the tile after this one: `rows` rows `sa` bytes apart, of
/// `row_lines` lines each, prefetched into L2 in `steps` equal shares, one per
/// destination run written out ([`NextTile::step`]). The shares are counted
/// with an accumulator, not divided out: a division a line and two a step
/// (the lines' row and column, the share's bounds) took most of a 32⁵ f16
/// 03142 permute's time on a Zen 2 VM, whose divider is slow and one a core
/// (`perf`: the extension's loop 35 % of the samples, its tiles' transposes
/// 7 %; 6.9 GB/s, memcpy 26).
pub(in crate::copy::cpu) struct NextTile {
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
    pub(in crate::copy::cpu) fn new(
        src: *const u8,
        rows: usize,
        row_bytes: usize,
        sa: isize,
        steps: usize,
    ) -> NextTile {
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
    pub(in crate::copy::cpu) fn step(&mut self) {
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
pub(super) struct RunEnds {
    dst: *mut u8,
    runs: usize,
    run: usize,
    db: isize,
}

impl RunEnds {
    /// Runs ahead of the one written whose ends are prefetched.
    pub(super) const AHEAD: usize = 8;

    /// `runs` runs of `run` bytes from `dst`, `db` bytes apart; none where the
    /// rows keep one alignment.
    #[inline(always)]
    pub(super) fn new(dst: *mut u8, runs: usize, run: usize, db: isize) -> RunEnds {
        let runs = if db % LINE as isize == 0 { 0 } else { runs };
        RunEnds { dst, runs, run, db }
    }

    /// Prefetches into L1 the partial lines at either end of run `k` (none
    /// past the last run).
    #[inline(always)]
    pub(super) fn prefetch(&self, k: usize) {
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

#[cfg(test)]
mod tests {
    use super::{LINE, NextTile};

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
}
