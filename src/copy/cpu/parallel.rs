//! The parallel loop: [`par_for`] splits a flat index space across the copy
//! pool, and [`for_each_segment`] walks one task's piece of it row by row.

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Below this many bytes a copy runs on the calling thread: waking the pool
/// costs about as much as copying a MiB in cache (same-process comparison with
/// NumPy's single-threaded copies, `bench/cpu_copy_peers.py`: 256 KiB row flips
/// ran at 0.4× NumPy's speed split across two threads).
pub(super) const PAR_MIN_BYTES: usize = 1 << 20;
/// Target bytes per parallel task.
const PAR_CHUNK_BYTES: usize = 1 << 20;

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
    let Some((pool, threads)) = crate::fork::copy_pool().filter(|&(_, workers)| workers >= 2) else {
        f(0, total);
        return;
    };
    // The calling thread copies its share (one worker's) itself while the
    // pool's threads take the rest in chunks (as OpenMP's master thread does),
    // instead of sleeping in `install` until they are done: one thread wake-up
    // fewer before work starts, and no more busy threads than cores (4 MiB row
    // flips on two cores, one run: 0.81× torch's speed with a pool of two
    // beside the caller, 0.97× with one).
    let own = total / threads;
    let rest = total - own;
    let n = (bytes / PAR_CHUNK_BYTES).clamp(threads, threads * 64).min(rest).max(1);
    let split = move |c: usize| own + ((rest as u128 * c as u128) / n as u128) as usize;
    let f = &f;
    pool.in_place_scope(|scope| {
        scope.spawn(move |_| (0..n).into_par_iter().for_each(|c| f(split(c), split(c + 1))));
        f(0, own);
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
