//! The parallel loop: [`par_for`] splits a flat index space across the copy
//! pool, and [`for_each_segment`] walks one task's piece of it row by row.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use smallvec::SmallVec;

use super::caches::l2_bytes;
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Below this many bytes a copy runs on the calling thread: two of torch's
/// grains (`parallel_for` gives a thread at least 32768 elements). With a
/// sleeping caller ([`FINISH_SPIN`]) splitting cost about a MiB of copying
/// and this was 1 MiB (256 KiB row flips had run at 0.4× NumPy's speed on two
/// threads); with a spinning one, 512 KiB copies on two cores, two runs each,
/// GB/s, one thread → two: clone 73–91 → 128–138, row flip 73 → 123–130
/// (torch 122–134); 256 KiB row flip 94–99 → 104 (torch 100–103).
pub(super) const PAR_MIN_BYTES: usize = 256 << 10;
/// Target bytes per task of the balanced schedule.
const PAR_CHUNK_BYTES: usize = 1 << 20;
/// Fewest bytes worth a worker of their own in the static schedule (torch's
/// `parallel_for` gives each thread at least 32768 elements, 128 KiB of f32).
const PAR_SHARE_MIN_BYTES: usize = 128 << 10;

/// How long the calling thread, its own share done, spins for the pool's
/// before it sleeps in rayon's wait (as OpenMP's threads spin at a barrier).
/// A sleeping caller is woken by the last pool thread, and on a VM that
/// wake-up costs about as much as copying a MiB: two cores, two runs each,
/// GB/s, sleeping → spinning: 1 MiB clone 120–138 → 148–152, 1 MiB row flip
/// 64–66 → 140–142 (one thread: 75), 2 MiB of 4 KiB rows 92–95 → 137–138,
/// 4 MiB clone 125–129 → 168.
const FINISH_SPIN: Duration = Duration::from_micros(200);

/// Spins until `done()` holds or [`FINISH_SPIN`] has passed.
fn spin_until(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() && start.elapsed() < FINISH_SPIN {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}

/// A raw pointer that may cross to rayon's threads.
#[derive(Clone, Copy)]
pub(super) struct Shared<P>(pub(super) P);

// SAFETY: the executor hands each task a disjoint set of destination elements
// (chunks of a partition of the flat index space) and only reads the source,
// which nothing writes during the copy (the caller's contract).
unsafe impl<P> Send for Shared<P> {}
// SAFETY: see `Send`; the wrapped pointer is only copied out, never mutated.
unsafe impl<P> Sync for Shared<P> {}

impl<P: Copy> Shared<P> {
    /// Returns the pointer (a method, so closures capture the whole `Shared`).
    #[inline(always)]
    pub(super) fn get(self) -> P {
        self.0
    }
}

/// Runs `f(lo, hi)` over a partition of `0..total`, in parallel when `bytes` is
/// large enough.
pub(super) fn par_for(total: usize, bytes: usize, f: impl Fn(usize, usize) + Sync) {
    // Small work never touches rayon (whose first use spawns the pool).
    if total < 2 || bytes < PAR_MIN_BYTES {
        f(0, total);
        return;
    }
    // Our own pool, made again in a fork()ed child (crate::fork); its threads
    // and this one are the workers.
    let Some((pool, workers)) = crate::fork::copy_pool().filter(|&(_, workers)| workers >= 2) else {
        f(0, total);
        return;
    };
    // Either way the calling thread copies a share itself (as OpenMP's master
    // thread does) instead of sleeping until the pool is done: one thread
    // wake-up fewer before work starts, and no more busy threads than cores
    // (4 MiB row flips on two cores, one run: 0.81× torch's speed with a pool
    // of two beside the caller, 0.97× with one).
    match static_share_count(total, bytes, workers, l2_bytes()) {
        Some(shares) => static_shares(pool, shares, total, &f),
        None => balanced(pool, workers, total, bytes, &f),
    }
}

/// The number of shares when a copy of `bytes` over `0..total` runs in
/// [`static_shares`] (each share, read and written, fits in `l2` bytes, a
/// worker's part of its L2), `None` when it runs [`balanced`].
fn static_share_count(total: usize, bytes: usize, workers: usize, l2: usize) -> Option<usize> {
    let shares = workers.min(bytes / PAR_SHARE_MIN_BYTES).min(total).max(1);
    (bytes.saturating_mul(2) / shares <= l2).then_some(shares)
}

/// Where each worker's share of a copy (read and written) fits in its core's
/// L2: worker k always gets the k-th of equal shares (OpenMP's
/// `schedule(static)`, which torch's `parallel_for` uses), so a copy repeated
/// on the same buffers finds its share in the cache of the core that copied
/// it last time; [`balanced`] hands the pieces out anew on every call, and
/// each core then reads what others wrote. 16-core Xeon (L2 2 MiB a core),
/// GB/s, two alternated runs each, work stealing → static: 4 MiB row flips
/// 158/179 → 398/514 (torch 382–530), 1 MiB clone 102/104 → 270/269 (torch
/// 186–231), 64 columns of an 8192² f32 matrix 90/92 → 155/265 (torch
/// 180–203). Larger copies lose the affinity anyway, and static shares lost
/// there: a 4096² f32 transpose ran at 48/44 GB/s balanced, 26/30 static.
fn static_shares<F: Fn(usize, usize) + Sync + ?Sized>(pool: &rayon::ThreadPool, shares: usize, total: usize, f: &F) {
    let threads = pool.current_num_threads();
    // A share without a thread would be skipped.
    debug_assert!(threads + 1 >= shares);
    let range = move |k: usize| {
        let at = |k: usize| ((total as u128 * k as u128) / shares as u128) as usize;
        (at(k), at(k + 1))
    };
    // Pool threads done with their broadcast job (share or none).
    let finished = &AtomicUsize::new(0);
    pool.in_place_scope(|scope| {
        // Pool thread i takes share i + 1, on every call.
        scope.spawn_broadcast(move |_, ctx| {
            let k = ctx.index() + 1;
            if k < shares {
                let (lo, hi) = range(k);
                f(lo, hi);
            }
            finished.fetch_add(1, Ordering::Release);
        });
        let (lo, hi) = range(0);
        f(lo, hi);
        spin_until(|| finished.load(Ordering::Acquire) == threads);
    });
}

/// The calling thread takes one worker's share; the pool's threads take the
/// rest in chunks of about [`PAR_CHUNK_BYTES`], whichever thread is free.
fn balanced<F: Fn(usize, usize) + Sync + ?Sized>(
    pool: &rayon::ThreadPool,
    workers: usize,
    total: usize,
    bytes: usize,
    f: &F,
) {
    let own = total / workers;
    let rest = total - own;
    let n = (bytes / PAR_CHUNK_BYTES).clamp(workers, workers * 64).min(rest).max(1);
    let split = move |c: usize| own + ((rest as u128 * c as u128) / n as u128) as usize;
    let finished = &AtomicBool::new(false);
    pool.in_place_scope(|scope| {
        scope.spawn(move |_| {
            (0..n).into_par_iter().for_each(|c| f(split(c), split(c + 1)));
            finished.store(true, Ordering::Release);
        });
        f(0, own);
        spin_until(|| finished.load(Ordering::Acquire));
    });
}

/// Walks the flat index range `[w0, w1)` of `outer × inner_len`
/// (`flat = row · inner_len + i`, `outer[0]` the fastest outer dim) and calls
/// `f(dst_off, src_off, i0, count)` once per piece of a row, with the byte
/// offsets of the row's element 0. One div/mod per call, none per row.
#[inline(always)]
pub(super) fn for_each_segment(
    outer: &[PlanDim],
    inner_len: usize,
    w0: usize,
    w1: usize,
    mut f: impl FnMut(isize, isize, usize, usize),
) {
    if w0 >= w1 || inner_len == 0 {
        return;
    }
    let mut idx: SmallVec<[usize; INLINE_DIMS]> = SmallVec::from_elem(0, outer.len());
    let (mut so, mut dof) = (0isize, 0isize);
    let mut r = w0 / inner_len;
    let mut i0 = w0 % inner_len;
    for (k, d) in outer.iter().enumerate() {
        let c = r % d.len;
        r /= d.len;
        idx[k] = c;
        so += c as isize * d.src;
        dof += c as isize * d.dst;
    }
    let mut left = w1 - w0;
    loop {
        let n = (inner_len - i0).min(left);
        f(dof, so, i0, n);
        left -= n;
        if left == 0 {
            return;
        }
        i0 = 0;
        for (k, d) in outer.iter().enumerate() {
            idx[k] += 1;
            so += d.src;
            dof += d.dst;
            if idx[k] < d.len {
                break;
            }
            idx[k] = 0;
            so -= d.len as isize * d.src;
            dof -= d.len as isize * d.dst;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use super::{FINISH_SPIN, balanced, spin_until, static_share_count, static_shares};

    /// Which thread visited each index of `0..total`, once per index.
    fn visits(total: usize, run: impl FnOnce(&(dyn Fn(usize, usize) + Sync))) -> Vec<ThreadId> {
        let seen: Mutex<Vec<Vec<ThreadId>>> = Mutex::new(vec![Vec::new(); total]);
        run(&|lo, hi| {
            let me = std::thread::current().id();
            let mut seen = seen.lock().unwrap();
            for v in &mut seen[lo..hi] {
                v.push(me);
            }
        });
        let seen = seen.into_inner().unwrap();
        for (i, v) in seen.iter().enumerate() {
            assert_eq!(v.len(), 1, "index {i} of {total} visited {} times", v.len());
        }
        seen.into_iter().map(|v| v[0]).collect()
    }

    #[test]
    fn both_schedules_visit_every_index_once_and_static_shares_keep_their_thread() {
        let workers = 4;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers - 1)
            .build()
            .unwrap();
        for total in [2, 3, 7, 64, 1000, 12345] {
            let shares = workers.min(total);
            let first = visits(total, |f| static_shares(&pool, shares, total, f));
            let again = visits(total, |f| static_shares(&pool, shares, total, f));
            // The same index on the same thread, call after call: the affinity
            // the static schedule exists for.
            assert_eq!(first, again, "total {total}");
            let threads: std::collections::HashSet<_> = first.iter().collect();
            assert_eq!(threads.len(), shares, "total {total}");
            for bytes in [1 << 20, 4 << 20, 64 << 20] {
                visits(total, |f| balanced(&pool, workers, total, bytes, f));
            }
        }
    }

    #[test]
    fn the_caller_spins_until_the_pool_is_done_and_no_longer_than_its_cap() {
        use std::time::{Duration, Instant};
        // Done already: no wait.
        let t = Instant::now();
        spin_until(|| true);
        assert!(t.elapsed() < FINISH_SPIN);
        // Never done: it gives up after the cap (and not long after).
        let t = Instant::now();
        spin_until(|| false);
        assert!(t.elapsed() >= FINISH_SPIN && t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn static_shares_where_each_fits_in_a_workers_l2() {
        let mib = 1 << 20;
        // 16 workers, 2 MiB of L2 each: 4 MiB in 16 shares of 512 KiB read and
        // written; 1 MiB in 8 (128 KiB each at least); 64 MiB does not fit.
        assert_eq!(static_share_count(1 << 20, 4 * mib, 16, 2 * mib), Some(16));
        assert_eq!(static_share_count(1 << 20, mib, 16, 2 * mib), Some(8));
        assert_eq!(static_share_count(1 << 20, 64 * mib, 16, 2 * mib), None);
        // Two pieces of 8 MiB each cannot stay in a 2 MiB L2, however many workers.
        assert_eq!(static_share_count(2, 16 * mib, 16, 2 * mib), None);
        // Two workers, 1 MiB of L2 each.
        assert_eq!(static_share_count(1000, mib, 2, mib), Some(2));
        assert_eq!(static_share_count(1000, 2 * mib, 2, mib), None);
    }
}
