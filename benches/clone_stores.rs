//! Streaming or ordinary stores for a contiguous clone? Times devtensor's
//! clone (`copy_strided` of one dense run) of several sizes both ways, side
//! by side in one process, in four settings:
//!
//! - `hot`: clone into the same output again and again (the loop a peer
//!   benchmark runs; both buffers may stay in the last-level cache), timed
//!   after a few untimed clones in the same mode, each read after;
//! - `cold`: the caches filled with other data first (96 MiB written);
//! - `read`, `cold read`: as above, then one thread reads the whole output
//!   (a consumer using the clone, as NumPy or torch would next), timed
//!   together with the clone.
//!
//! Streamed (non-temporal) stores skip the read-for-ownership of every
//! destination line but leave the output in memory, not in the cache; which
//! wins depends on the size, the cache and what comes next, and the
//! thresholds in `src/copy/cpu/runs.rs` come from this comparison.
//!
//! `cargo bench --bench clone_stores -- [rounds] [MiB...]` (default 15 rounds,
//! 4 8 12 16 24 32 64 MiB; `RAYON_NUM_THREADS` sets the copy's threads).

use std::hint::black_box;
use std::time::{Duration, Instant};

use devtensor::copy::{copy_strided, set_stream_threshold};

/// Bytes written to push the clone's buffers out of a 32 MiB L3 (three times
/// over).
const EVICT_BYTES: usize = 96 << 20;
/// Untimed clones (and reads) before a timed `hot` or `read` one.
const WARM_UPS: usize = 3;

#[derive(Clone, Copy)]
enum Setting {
    Hot,
    Cold,
    Read,
    ColdRead,
}

const SETTINGS: [(&str, Setting); 4] = [
    ("hot", Setting::Hot),
    ("cold", Setting::Cold),
    ("read", Setting::Read),
    ("cold read", Setting::ColdRead),
];

/// Clones `src` into `dst` with streamed or ordinary stores.
fn clone(dst: &mut [u64], src: &[u64], stream: bool) {
    set_stream_threshold(Some(if stream { 1 } else { usize::MAX }));
    // SAFETY: both buffers hold `src.len()` u64s and do not overlap.
    unsafe {
        copy_strided(
            dst.as_mut_ptr().cast(),
            &[1],
            src.as_ptr().cast(),
            &[1],
            &[src.len()],
            8,
        )
    }
    .expect("a dense 1-D copy");
}

/// One thread reads every word of `v` (the consumer).
fn read(v: &[u64]) -> u64 {
    v.iter().fold(0, |a, &x| a ^ x)
}

/// Times one clone (and read) in `setting`; eviction is not timed.
fn time(setting: Setting, dst: &mut [u64], src: &[u64], scratch: &mut [u64], stream: bool) -> (Duration, u64) {
    if matches!(setting, Setting::Cold | Setting::ColdRead) {
        scratch.iter_mut().for_each(|w| *w = w.wrapping_add(1));
        black_box(&mut *scratch);
    } else {
        // Warm up in this mode: the other mode's last clone left the caches
        // as it wants them.
        for _ in 0..WARM_UPS {
            clone(dst, src, stream);
            black_box(read(dst));
        }
    }
    let t = Instant::now();
    clone(dst, src, stream);
    let fold = if matches!(setting, Setting::Read | Setting::ColdRead) {
        read(dst)
    } else {
        dst[dst.len() / 2]
    };
    (t.elapsed(), fold)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rounds = args.first().copied().unwrap_or(15).max(1);
    let mibs = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        vec![4, 8, 12, 16, 24, 32, 64]
    };
    let mut scratch = vec![1u64; EVICT_BYTES / 8];
    println!(
        "clone_stores: {} threads, best of {rounds} alternated rounds; GB/s counts the clone's bytes once",
        rayon::current_num_threads()
    );
    println!(
        "{:>5} {:<10} {:>10} {:>10} {:>16}",
        "MiB", "setting", "streamed", "ordinary", "ordinary/stream"
    );
    let mut fold = 0;
    for mib in mibs {
        let words = (mib << 20) / 8;
        let src: Vec<u64> = (0..words as u64).collect();
        let mut dst = vec![0u64; words];
        clone(&mut dst, &src, true);
        assert_eq!(dst, src, "streamed clone of {mib} MiB");
        dst.fill(0);
        clone(&mut dst, &src, false);
        assert_eq!(dst, src, "ordinary clone of {mib} MiB");
        for (name, setting) in SETTINGS {
            let mut best = [Duration::MAX; 2];
            for _ in 0..rounds {
                for (b, stream) in best.iter_mut().zip([true, false]) {
                    let (t, f) = time(setting, &mut dst, &src, &mut scratch, stream);
                    fold ^= f;
                    *b = (*b).min(t);
                }
            }
            let gbs = |t: Duration| (mib << 20) as f64 / t.as_secs_f64() / 1e9;
            println!(
                "{mib:>5} {name:<10} {:>10.1} {:>10.1} {:>15.2}x",
                gbs(best[0]),
                gbs(best[1]),
                best[0].as_secs_f64() / best[1].as_secs_f64()
            );
        }
    }
    set_stream_threshold(None);
    black_box(fold);
}
