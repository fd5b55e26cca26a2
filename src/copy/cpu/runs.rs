//! Contiguous runs: small and page-sized copies, libc's memcpy, and
//! non-temporal (streaming) stores for destinations larger than the
//! last-level cache; the `Memcpy` kernel splits one run across threads.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::caches::{l2_has_few_ways, l2_is_under_1mib, llc_bytes};
use super::elem::{ld, st};
use super::parallel::{Shared, par_for};

/// Destinations of at least this many bytes are written with non-temporal
/// (streaming) stores: the size of the last-level cache (from sysfs, 32 MiB if
/// unknown), at most [`LLC_STREAM_MAX`]. Such a destination cannot stay
/// cached anyway, and ordinary stores would first read every destination line
/// (a third more traffic); below it, ordinary stores measured faster.
/// `DEVTENSOR_STREAM_BYTES` overrides it.
pub(super) fn stream_threshold() -> usize {
    match STREAM_BYTES.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var("DEVTENSOR_STREAM_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| llc_bytes().map_or(LLC_STREAM_MAX, |b| b.clamp(1 << 20, LLC_STREAM_MAX)))
                .max(1);
            STREAM_BYTES.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// The most of the last-level cache a copy's destination is taken to stay in.
/// A larger one is a whole socket's (sysfs shows the Xeon VM's 480 MiB L3 to
/// its two CPUs), which the rest of the socket and other guests use too:
/// there copies streamed from 480 MiB (transposes from 60) ran faster
/// streamed from 32 (from 4). Two cores, Python, into a reused output, from
/// a source written before (not the zero page), the median of five to seven
/// paired calls in one process, speed-up:
/// - clones: 16 and 32 MiB 1.00×, 64 MiB 1.32×, 128 MiB 1.40×; half of
///   each 8 KiB row: 16 MiB 1.00×, 32 MiB 1.26×, 128 MiB 1.46×;
/// - transposes: f32 1024² 1.52×, 2048² 1.23×, f16 2048² 1.10×, 4096²
///   1.32×, from a 4128-wide matrix 1.73×, u8 4096² 1.11×, batched 32 × 512²
///   f32 1.32×, 16 × 4096 × 128 f16 1.17×; u8 64 × 224² × 3 to planes 1.04×;
///   64 MiB ones (streamed either way) 0.98–1.01×.
///
/// From 16 MiB (transposes from 2 MiB), clones of 16 MiB did not gain
/// (0.96×), though 2 MiB transposes did (512 × 1024 f32 1.88×); the 32 MiB
/// L3s of the Zen VMs the copies were first tuned on stay whole.
const LLC_STREAM_MAX: usize = 32 << 20;

/// Where copies of whole runs stream: clones (`clone`) from
/// [`stream_threshold`], row copies from five eighths of it (see
/// [`rows`](super::rows::rows)); where the L2 has few ways
/// ([`l2_has_few_ways`]), row copies from three eighths (12 MiB of a 32 MiB
/// L3), and clones too where the L2 is under 1 MiB ([`l2_is_under_1mib`]),
/// from five eighths (20 MiB) where it is not. On the Zen 3 VM (8-way 512
/// KiB L2, 32 MiB L3), two cores, into a reused output, median GB/s of six
/// phases of 20 calls each, ordinary → streaming stores:
/// - clones: 8 MiB 73.5 → 41.0, 10 MiB 39.0 → 40.1, 12 MiB 32.9 → 37.4, 14
///   MiB 26.7 → 34.5, 16 MiB 27.2 → 35.6, 24 MiB 31.5 → 39.9;
/// - 4 KiB rows of a 2×-wide f32 matrix: 8 MiB 50.0 → 39.0, 10 MiB 31.3 →
///   39.8, 12 MiB 28.3 → 34.1, 16 MiB 23.7 → 27.5;
/// - row flips of 16 KiB rows: 8 MiB 69.8 → 40.9, 10 MiB 49.7 → 40.3, 12 MiB
///   34.1 → 38.5, 16 MiB 27.4 → 35.9.
///
/// On the Zen 4 VM (8-way 1 MiB L2, 32 MiB L3), two cores, Python, f32
/// clones against torch's (which never streams), speed ratio:
/// - `bench/cpu_copy_peers.py`, 16 MiB, best of three rounds: streamed
///   0.73–0.97× in six runs, ordinary 1.22–1.36× in seven;
/// - the median of seven calls, two runs, streamed → ordinary: 16 MiB into
///   a reused output 0.85–1.19× → 0.95–1.54×, then read by NumPy 0.51–0.96×
///   → 1.32–1.37×, from cold caches 1.08–1.27× → 0.95–1.02×, cold and read
///   0.87–0.91× → 1.02–1.12×; 24 MiB into a reused output 1.27–1.53× →
///   0.88–0.99× (it streams).
///
/// The price is a clone from cold caches that nothing reads soon:
/// `cargo bench --bench clone_stores` there, 16 MiB, ordinary at 0.72–0.88×
/// streaming's speed (12 MiB 0.75–0.97×); with the output read after it,
/// 0.77–1.70×.
pub(super) fn runs_stream_threshold(clone: bool) -> usize {
    let t = stream_threshold();
    match (l2_has_few_ways(), clone) {
        (false, true) => t,
        (true, true) if !l2_is_under_1mib() => t / 8 * 5,
        (true, _) => t / 8 * 3,
        (false, false) => t / 8 * 5,
    }
}

/// The streaming threshold in bytes; 0 until first computed.
static STREAM_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Sets the destination size (bytes) from which copies use non-temporal
/// (streaming) stores; row copies and transposes stream from fixed fractions
/// of it, and clones too where the L2 has under 16 ways. `None` restores the
/// default (the last-level cache size up to 32 MiB, or
/// `DEVTENSOR_STREAM_BYTES`). `Some(1)` streams everything, which tests use
/// to cover those paths; `Some(usize::MAX)` never streams.
pub fn set_stream_threshold(bytes: Option<usize>) {
    STREAM_BYTES.store(bytes.map_or(0, |b| b.max(1)), Ordering::Relaxed);
}

/// Makes a task's non-temporal stores globally visible before it ends.
#[inline(always)]
pub(super) fn store_fence(nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt {
        // SAFETY: SSE2 is part of the x86-64 baseline; `sfence` has no
        // memory-safety preconditions.
        unsafe { std::arch::x86_64::_mm_sfence() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = nt;
}

/// Copies fewer than 64 bytes with overlapping unaligned words.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, n)`, `n < 64`.
#[inline(always)]
pub(super) unsafe fn copy_small(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: every access below lies inside `[0, n)` of both ranges.
    unsafe {
        if n >= 32 {
            let (a, b) = (ld::<u128>(src), ld::<u128>(src.add(16)));
            let (c, d) = (ld::<u128>(src.add(n - 32)), ld::<u128>(src.add(n - 16)));
            st(dst, a);
            st(dst.add(16), b);
            st(dst.add(n - 32), c);
            st(dst.add(n - 16), d);
        } else if n >= 16 {
            let (a, b) = (ld::<u128>(src), ld::<u128>(src.add(n - 16)));
            st(dst, a);
            st(dst.add(n - 16), b);
        } else if n >= 8 {
            let (a, b) = (ld::<u64>(src), ld::<u64>(src.add(n - 8)));
            st(dst, a);
            st(dst.add(n - 8), b);
        } else if n >= 4 {
            let (a, b) = (ld::<u32>(src), ld::<u32>(src.add(n - 4)));
            st(dst, a);
            st(dst.add(n - 4), b);
        } else if n >= 2 {
            let (a, b) = (ld::<u16>(src), ld::<u16>(src.add(n - 2)));
            st(dst, a);
            st(dst.add(n - 2), b);
        } else if n == 1 {
            *dst = *src;
        }
    }
}

/// Where [`prefetch`] brings a line.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Cache {
    /// For a use within a few rows.
    L1,
    /// For the next tile (L1 holds the current one).
    L2,
    /// For stores within a few steps: fetched for ownership (`prefetchw`),
    /// so the stores that reach the line find it writable in L1.
    L1Write,
}

/// Asks for the cache line holding `p` in `cache`; a hint that never faults,
/// whatever the address.
#[inline(always)]
pub(super) fn prefetch(p: *const u8, cache: Cache) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86-64 baseline; a prefetch never faults.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_ET0, _MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        match cache {
            Cache::L1 => _mm_prefetch::<_MM_HINT_T0>(p.cast()),
            Cache::L2 => _mm_prefetch::<_MM_HINT_T1>(p.cast()),
            Cache::L1Write => _mm_prefetch::<_MM_HINT_ET0>(p.cast()),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, cache);
}

/// Copies `n` bytes: libc's `memcpy` (tuned per CPU), or — when `nt` — a
/// loop of streaming stores over whole destination cache lines.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, n)`. With `nt`, the task must call
/// [`store_fence`] before it ends.
#[inline(always)]
pub(super) unsafe fn copy_run(dst: *mut u8, src: *const u8, n: usize, nt: bool) {
    // SAFETY: every access below lies inside `[0, n)` of both ranges.
    unsafe {
        if n < 64 {
            copy_small(dst, src, n);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if nt && n >= 256 {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
            // Stream whole destination cache lines only: a partial line written
            // with non-temporal stores costs a read-modify-write in memory.
            let mut i = (64 - dst as usize % 64) % 64;
            copy_small(dst, src, i);
            // One 64-byte store a line where the CPU has AVX-512, four 16-byte
            // ones otherwise (separate processes, two cores, four alternated
            // runs each, medians: clones of 128 MiB 1.07×, 64 MiB 1.02×; staged
            // transposes, whose runs come through here: u8 8192² 1.04×, from an
            // 8256-wide matrix 1.06×, f32 4097 × 4095 1.03×, RGB 1.00×).
            // Where it has AVX2, two 32-byte ones: Zen 3 VM, two cores,
            // in-process A/B against four 16-byte ones, best of 30–40
            // alternated calls, three to six runs, speed-up: contiguous copies
            // of 256 MiB 1.03–1.07×, 64 MiB 1.03–1.16×, 32 MiB 1.01–1.07×;
            // transposes (their runs streamed out through here) f32 4096²
            // 0.99–1.18×, f16 1.00–1.05×, u8 8192² 0.97–1.09×, RGB 4096 × 2048
            // 0.95–1.07×; permutes 32⁴ × 16 f32 43210 1.09× each run, 32⁵ f16
            // 03142 1.02–1.08×, 64⁴ f32 3021 1.06–1.12×.
            if super::avx512::enabled() {
                i += super::avx512::stream_lines(dst.add(i), src.add(i), n - i);
            } else if super::avx2::enabled() {
                i += super::avx2::stream_lines(dst.add(i), src.add(i), n - i);
            }
            while i + 64 <= n {
                let s = src.add(i).cast::<__m128i>();
                let d = dst.add(i).cast::<__m128i>();
                let (a, b, c, e) = (
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                );
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                i += 64;
            }
            // The partial last line, with ordinary stores that do not touch the
            // streamed lines (rewriting a line just streamed is very slow).
            copy_small(dst.add(i), src.add(i), n - i);
            return;
        }
        if n <= INLINE_RUN_MAX && !LIBC_RUNS.contains(&n) {
            // Runs up to a few pages inline (no call): 128-byte blocks that load
            // all their bytes before storing any, then an overlapping tail.
            // libc's memcpy switches to `rep movsb` around 2 KiB, which stalls
            // on rows whose source and destination are a multiple of 4 KiB
            // apart (4K aliasing: a load waits on an earlier store to the same
            // page offset): 4 KiB rows of a 2×-wide source measured 15–16.5
            // GB/s through it, 18–20 GB/s here (one thread, noisy VM).
            let mut i = 0;
            // 32-byte loads and stores where the CPU has them: rows of 4 KiB
            // from a 2×-wide source, 2–4 MiB in cache, one thread, two runs
            // each: 47 → 51 GB/s (4 MiB), 57 → 63 (2 MiB).
            #[cfg(target_arch = "x86_64")]
            if n >= 2048 && super::avx2::enabled() {
                // SAFETY: the CPU has AVX2 (checked); the ranges as above.
                i = super::avx2::copy_blocks(dst, src, n);
            }
            #[cfg(target_arch = "x86_64")]
            while i + 128 <= n {
                use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
                // Vector registers: a u128 moves through two general ones.
                let (s, d) = (src.add(i).cast::<__m128i>(), dst.add(i).cast::<__m128i>());
                let v: [__m128i; 8] = std::array::from_fn(|k| _mm_loadu_si128(s.add(k)));
                for (k, x) in v.into_iter().enumerate() {
                    _mm_storeu_si128(d.add(k), x);
                }
                i += 128;
            }
            if i + 64 <= n {
                copy_small(dst.add(i), src.add(i), 32);
                copy_small(dst.add(i + 32), src.add(i + 32), 32);
                i += 64;
            }
            if i < n {
                copy_small(dst.add(n - 64), src.add(n - 64), 32);
                copy_small(dst.add(n - 32), src.add(n - 32), 32);
            }
            return;
        }
        ptr::copy_nonoverlapping(src, dst, n);
    }
}

/// Longest run [`copy_run`] copies with its own loop rather than libc's memcpy.
const INLINE_RUN_MAX: usize = 16 << 10;

/// Runs of these lengths go to libc's memcpy even so: its vector loops, chosen
/// for the CPU when the program loads (AVX2, AVX-512), beat the SSE2 blocks
/// above once a run is a few hundred bytes (1 KiB rows of a 256² f32 row flip,
/// one run: 101 GB/s against 79; NumPy, which calls memcpy, 105). Shorter runs
/// would pay for the call, longer ones may meet `rep movsb`.
const LIBC_RUNS: std::ops::Range<usize> = 256..2048;

/// Contiguous copy, split across threads in 4 KiB pieces.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, bytes)`.
pub(super) unsafe fn memcpy_par(dst: *mut u8, src: *const u8, bytes: usize, nt: bool) {
    const BLK: usize = 4096;
    let (d, s) = (Shared(dst), Shared(src));
    // Piece boundaries at 4 KiB-aligned destination addresses.
    let head = (BLK - dst as usize % BLK) % BLK;
    let head = if head >= bytes { 0 } else { head };
    let blocks = 1 + (bytes - head).div_ceil(BLK);
    par_for(blocks, bytes, |b0, b1| {
        let at = |b: usize| if b == 0 { 0 } else { (head + (b - 1) * BLK).min(bytes) };
        let (lo, hi) = (at(b0), at(b1));
        // SAFETY: `[lo, hi)` is inside `[0, bytes)`; tasks get disjoint ranges.
        unsafe { copy_run(d.get().add(lo), s.get().add(lo), hi - lo, nt) }
        store_fence(nt);
    });
}

#[cfg(test)]
mod tests {
    use super::{
        LLC_STREAM_MAX, l2_has_few_ways, l2_is_under_1mib, llc_bytes, runs_stream_threshold, stream_threshold,
    };

    #[test]
    fn the_default_threshold_is_the_last_level_cache_up_to_its_cap() {
        // Nothing in the unit tests sets the threshold; the variable overrides.
        if std::env::var_os("DEVTENSOR_STREAM_BYTES").is_some() {
            println!("SKIP: DEVTENSOR_STREAM_BYTES is set");
            return;
        }
        let want = llc_bytes().map_or(LLC_STREAM_MAX, |b| b.clamp(1 << 20, LLC_STREAM_MAX));
        assert_eq!(stream_threshold(), want);
        assert!(stream_threshold() <= 32 << 20);
    }

    #[test]
    fn whole_runs_stream_from_their_fraction_of_the_threshold() {
        let t = stream_threshold();
        let got = (runs_stream_threshold(true), runs_stream_threshold(false));
        let want = match (l2_has_few_ways(), l2_is_under_1mib()) {
            (false, _) => (t, t / 8 * 5),
            (true, false) => (t / 8 * 5, t / 8 * 3),
            (true, true) => (t / 8 * 3, t / 8 * 3),
        };
        assert_eq!(got, want);
        // Clones never stream from a smaller size than row copies.
        assert!(got.0 >= got.1);
    }
}
