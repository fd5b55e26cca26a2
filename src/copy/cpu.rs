//! The CPU executor of copy plans.
//!
//! [`copy_strided`] plans the copy with [`plan_copy`] (CPU options: unaligned
//! widening up to 16 bytes) and runs the cheapest kernel for the plan's
//! [`PlanKind`] (research notes §d):
//!
//! | kind | kernel |
//! |---|---|
//! | `Memcpy` | one contiguous run, split into 4 KiB-aligned pieces across rayon |
//! | `Rows` | odometer over the outer dims (no div/mod per row), one run per row |
//! | `Transpose` | tiles over (dst-fastest, src-fastest) with SSE2 register micro-transposes for 1/2/4/8-byte elements (16×16, 8×8, 4×4, 2×2), scalar 4×4 otherwise; the other dims are a batch |
//! | `General` | odometer, innermost loop specialised on (src, dst) stride: (E,E), (0,E), (s,E), (E,t), (s,t) |
//! | `Fill` | a repeated-element pattern written over contiguous runs |
//!
//! Elements are moved as `u8/u16/u32/u64/u128` (powers of two) or `[u8; N]`
//! (other sizes up to 16) with unaligned loads and stores, so odd addresses are
//! fine. Larger elements become an extra byte dimension.
//!
//! Runs are copied with libc's `memcpy`, except for destinations larger than
//! the last-level cache: those are written with non-temporal (streaming)
//! stores over whole cache lines, which skips the read-for-ownership of every
//! destination line (see [`set_stream_threshold`]). Work from 1 MiB on is split
//! across rayon over a flat index space — rows × row elements, or batch × tiles
//! — so a short outer dimension still feeds every thread.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::copy::plan::{
    BaseAddrs, CopyPlan, INLINE_DIMS, PlanDim, PlanKind, PlanOptions, absolute_range, plan_copy, ranges_overlap,
};
use crate::error::{Error, Result};

/// Calls `$f::<T>(args)` with `T` the element type of `$e` bytes.
macro_rules! with_elem {
    ($e:expr, $f:ident ( $($a:expr),* )) => {
        match $e {
            1 => $f::<u8>($($a),*),
            2 => $f::<u16>($($a),*),
            3 => $f::<[u8; 3]>($($a),*),
            4 => $f::<u32>($($a),*),
            5 => $f::<[u8; 5]>($($a),*),
            6 => $f::<[u8; 6]>($($a),*),
            7 => $f::<[u8; 7]>($($a),*),
            8 => $f::<u64>($($a),*),
            9 => $f::<[u8; 9]>($($a),*),
            10 => $f::<[u8; 10]>($($a),*),
            11 => $f::<[u8; 11]>($($a),*),
            12 => $f::<[u8; 12]>($($a),*),
            13 => $f::<[u8; 13]>($($a),*),
            14 => $f::<[u8; 14]>($($a),*),
            15 => $f::<[u8; 15]>($($a),*),
            16 => $f::<u128>($($a),*),
            _ => unreachable!("elements above {MAX_ELEM} bytes become a byte dimension"),
        }
    };
}

/// Below this many bytes a copy runs on the calling thread: waking the pool
/// costs about as much as copying a MiB in cache (same-process comparison with
/// NumPy's single-threaded copies, `bench/cpu_copy_peers.py`: 256 KiB row flips
/// ran at 0.4× NumPy's speed split across two threads).
const PAR_MIN_BYTES: usize = 1 << 20;
/// Target bytes per parallel task.
const PAR_CHUNK_BYTES: usize = 1 << 20;
/// Largest element the typed kernels handle; larger ones get a byte dimension.
const MAX_ELEM: usize = 16;

/// Copies `shape` elements of `elem_size` bytes from `src` to `dst`.
///
/// Pointers point at the logical element `[0, 0, …, 0]`; strides are in
/// elements and may be negative (the source's may also be 0 to broadcast).
/// Any `elem_size ≥ 1` works; 1–16 byte elements take the typed fast paths.
/// When the source and destination byte ranges overlap, the source is first
/// copied into a temporary buffer (a copy onto an identical layout is a no-op).
///
/// Errors: [`Error::ShapeMismatch`] when a stride slice's length differs from
/// `shape`'s, [`Error::OverlappingDestination`] when the destination (with more
/// than one element) may address an element twice, [`Error::Overflow`] when
/// an extent overflows, [`Error::InvalidLayout`] for `elem_size == 0`.
///
/// # Safety
///
/// For every index within `shape`, `src` offset by `Σ index·src_stride·elem_size`
/// bytes must be valid for reads of `elem_size` bytes, and `dst` offset by
/// `Σ index·dst_stride·elem_size` bytes valid for writes of `elem_size` bytes,
/// all inside one allocation each. Nothing else may access the destination
/// during the call. The destination may be uninitialised; the source may not.
pub unsafe fn copy_strided(
    dst: *mut u8,
    dst_strides: &[isize],
    src: *const u8,
    src_strides: &[isize],
    shape: &[usize],
    elem_size: usize,
) -> Result<()> {
    for strides in [dst_strides, src_strides] {
        if strides.len() != shape.len() {
            return Err(Error::ShapeMismatch {
                expected: vec![shape.len()],
                got: vec![strides.len()],
            });
        }
    }
    if elem_size > MAX_ELEM {
        // A wide element is a row of bytes: add a byte dimension.
        let e = isize::try_from(elem_size).map_err(|_| Error::Overflow { what: "element size" })?;
        let widen = |s: &[isize]| -> Result<SmallVec<[isize; INLINE_DIMS]>> {
            let mut v: SmallVec<[isize; INLINE_DIMS]> = s
                .iter()
                .map(|&x| x.checked_mul(e).ok_or(Error::Overflow { what: "byte stride" }))
                .collect::<Result<_>>()?;
            v.push(1);
            Ok(v)
        };
        let mut shape2: SmallVec<[usize; INLINE_DIMS]> = shape.iter().copied().collect();
        shape2.push(elem_size);
        let (d2, s2) = (widen(dst_strides)?, widen(src_strides)?);
        // SAFETY: the same bytes as the caller's layout, described with one more
        // (byte) dimension; the caller's guarantees carry over unchanged.
        return unsafe { copy_strided(dst, &d2, src, &s2, &shape2, 1) };
    }
    let bases = BaseAddrs {
        dst: dst as usize,
        src: src as usize,
    };
    let plan = plan_copy(shape, dst_strides, src_strides, elem_size, bases, PlanOptions::CPU)?;
    if plan.kind == PlanKind::Empty {
        return Ok(());
    }
    let d_range = absolute_range(bases.dst, plan.dst_span)?;
    let s_range = absolute_range(bases.src, plan.src_span)?;
    if ranges_overlap(d_range, s_range) {
        let same = bases.dst == bases.src
            && shape
                .iter()
                .zip(dst_strides.iter().zip(src_strides))
                .all(|(&n, (a, b))| n == 1 || a == b);
        if same {
            return Ok(()); // every element is copied onto itself
        }
        // SAFETY: forwarded from the caller.
        return unsafe { copy_via_temp(dst, dst_strides, src, src_strides, shape, elem_size, plan.bytes()) };
    }
    // SAFETY: the plan's offsets move the bases to elements of the caller's
    // layouts (the flipped dimensions' last elements), which are in bounds.
    unsafe {
        execute(&plan, dst.offset(plan.dst_offset), src.offset(plan.src_offset));
    }
    Ok(())
}

/// Writes `value` (`elem_size = value.len()` bytes) to every element.
///
/// Errors as [`copy_strided`]; an empty `value` is [`Error::InvalidLayout`].
///
/// # Safety
///
/// For every index within `shape`, `dst` offset by
/// `Σ index·dst_stride·value.len()` bytes must be valid for writes of
/// `value.len()` bytes, all inside one allocation, and nothing else may access
/// the destination during the call.
pub unsafe fn fill_strided(dst: *mut u8, dst_strides: &[isize], shape: &[usize], value: &[u8]) -> Result<()> {
    if value.is_empty() {
        return Err(Error::InvalidLayout("fill value must be at least one byte"));
    }
    if dst_strides.len() != shape.len() {
        return Err(Error::ShapeMismatch {
            expected: vec![shape.len()],
            got: vec![dst_strides.len()],
        });
    }
    // A small dense fill (a fresh `zeros` or `full`) is one run: no plan, no
    // overlap analysis, which cost ten times the writes of a 4 KiB tensor.
    let e = value.len();
    if e <= MAX_ELEM && crate::layout::is_contiguous(shape, dst_strides) {
        let bytes = crate::layout::numel(shape)?
            .checked_mul(e)
            .ok_or(Error::Overflow { what: "fill size" })?;
        if bytes < PAR_MIN_BYTES {
            // SAFETY: a C-contiguous view of `bytes` bytes starting at `dst`, all
            // writable (the caller's guarantee). `value` is read into `pat` (or
            // `b`) before the first write, so it may alias the destination.
            unsafe {
                if value.iter().all(|&b| b == value[0]) {
                    ptr::write_bytes(dst, value[0], bytes);
                } else {
                    let pat = fill_pattern(value.as_ptr(), e);
                    fill_run(dst, &pat, e, bytes, false);
                }
            }
            return Ok(());
        }
    }
    let zeros: SmallVec<[isize; INLINE_DIMS]> = SmallVec::from_elem(0, shape.len());
    // SAFETY: a fill is a copy from a fully broadcast source; `value` is valid
    // for reads of `value.len()` bytes at every (zero) source offset. Should
    // `value` alias the destination, `copy_strided` goes through a temporary.
    unsafe { copy_strided(dst, dst_strides, value.as_ptr(), &zeros, shape, value.len()) }
}

/// Copies through a temporary laid out like the destination (same dimension
/// order and signs, dense), so both copies stay cache-friendly.
///
/// # Safety
///
/// As [`copy_strided`].
unsafe fn copy_via_temp(
    dst: *mut u8,
    dst_strides: &[isize],
    src: *const u8,
    src_strides: &[isize],
    shape: &[usize],
    elem_size: usize,
    bytes: usize,
) -> Result<()> {
    let mut order: SmallVec<[usize; INLINE_DIMS]> = (0..shape.len()).filter(|&i| shape[i] > 1).collect();
    order.sort_by_key(|&i| dst_strides[i].unsigned_abs());
    let mut tmp_strides: SmallVec<[isize; INLINE_DIMS]> = SmallVec::from_elem(0, shape.len());
    let mut acc: isize = 1;
    let mut base: isize = 0; // element offset of logical [0..0] inside the temporary
    for &i in &order {
        let len = shape[i] as isize; // numel fits isize: the plan checked it
        if dst_strides[i] < 0 {
            tmp_strides[i] = -acc;
            base += (len - 1) * acc;
        } else {
            tmp_strides[i] = acc;
        }
        acc *= len;
    }
    let mut tmp: Vec<u8> = Vec::with_capacity(bytes);
    // SAFETY: `tmp` holds `bytes` = numel × elem_size bytes, dense; `base` is the element offset of
    // logical index 0 in that dense layout, so every element lies inside it.
    // The temporary overlaps neither operand. The first copy initialises every
    // byte of it before the second reads it.
    unsafe {
        let t = tmp.as_mut_ptr().add(base as usize * elem_size);
        copy_strided(t, &tmp_strides, src, src_strides, shape, elem_size)?;
        copy_strided(dst, dst_strides, t, &tmp_strides, shape, elem_size)
    }
}

/// A raw pointer that may cross to rayon's threads.
#[derive(Clone, Copy)]
struct Shared<P>(P);

// SAFETY: the executor hands each task a disjoint set of destination elements
// (chunks of a partition of the flat index space) and only reads the source,
// which nothing writes during the copy (the caller's contract).
unsafe impl<P> Send for Shared<P> {}
// SAFETY: see `Send`; the wrapped pointer is only copied out, never mutated.
unsafe impl<P> Sync for Shared<P> {}

impl<P: Copy> Shared<P> {
    /// Returns the pointer (a method, so closures capture the whole `Shared`).
    #[inline(always)]
    fn get(self) -> P {
        self.0
    }
}

/// Runs `f(lo, hi)` over a partition of `0..total`, in parallel when `bytes` is
/// large enough.
fn par_for(total: usize, bytes: usize, f: impl Fn(usize, usize) + Sync) {
    // Small work never touches rayon (whose first use spawns the pool).
    if total < 2 || bytes < PAR_MIN_BYTES {
        f(0, total);
        return;
    }
    // Our own pool, made again in a fork()ed child (crate::fork).
    let Some(pool) = crate::fork::copy_pool().filter(|p| p.current_num_threads() >= 2) else {
        f(0, total);
        return;
    };
    let threads = pool.current_num_threads();
    let n = (bytes / PAR_CHUNK_BYTES).clamp(threads, threads * 64).min(total);
    let split = move |c: usize| ((total as u128 * c as u128) / n as u128) as usize;
    // The calling thread copies the first chunk itself while the pool's threads
    // take the others (as OpenMP's master thread does), instead of sleeping in
    // `install` until they are done: one thread wake-up fewer before work starts.
    let f = &f;
    pool.in_place_scope(|scope| {
        scope.spawn(move |_| (1..n).into_par_iter().for_each(|c| f(split(c), split(c + 1))));
        f(split(0), split(1));
    });
}

/// Walks the flat index range `[w0, w1)` of `outer × inner_len`
/// (`flat = row · inner_len + i`, `outer[0]` the fastest outer dim) and calls
/// `f(dst_off, src_off, i0, count)` once per piece of a row, with the byte
/// offsets of the row's element 0. One div/mod per call, none per row.
#[inline(always)]
fn for_each_segment(
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

/// Runs a plan on bases already moved by the plan's offsets.
///
/// # Safety
///
/// `dst`/`src` are the plan's bases of layouts satisfying [`copy_strided`]'s
/// contract, and the two do not overlap.
unsafe fn execute(plan: &CopyPlan, dst: *mut u8, src: *const u8) {
    let nt = plan.bytes() >= stream_threshold();
    // SAFETY: every arm forwards the caller's guarantees.
    unsafe {
        match plan.kind {
            PlanKind::Empty => {}
            PlanKind::Memcpy => memcpy_par(dst, src, plan.bytes(), nt),
            PlanKind::Rows => rows(plan, dst, src, nt),
            PlanKind::Fill if plan.dims[0].dst == plan.elem_size as isize => fill_rows(plan, dst, src, nt),
            PlanKind::Fill | PlanKind::General => with_elem!(plan.elem_size, general(plan, dst, src, nt)),
            PlanKind::Transpose { src_fast } => with_elem!(plan.elem_size, transpose(plan, src_fast, dst, src, nt)),
        }
    }
}

/// Destinations of at least this many bytes are written with non-temporal
/// (streaming) stores: the size of the last-level cache (from sysfs, 32 MiB if
/// unknown). Such a destination cannot stay cached anyway, and ordinary stores
/// would first read every destination line (a third more traffic); below it,
/// ordinary stores measured faster. `DEVTENSOR_STREAM_BYTES` overrides it.
fn stream_threshold() -> usize {
    match STREAM_BYTES.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var("DEVTENSOR_STREAM_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| llc_bytes().map_or(32 << 20, |b| b.max(1 << 20)))
                .max(1);
            STREAM_BYTES.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// The streaming threshold in bytes; 0 until first computed.
static STREAM_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Sets the destination size (bytes) from which copies use non-temporal
/// (streaming) stores; `None` restores the default (the last-level cache
/// size, or `DEVTENSOR_STREAM_BYTES`). `Some(1)` streams everything, which
/// tests use to cover those paths; `Some(usize::MAX)` never streams.
pub fn set_stream_threshold(bytes: Option<usize>) {
    STREAM_BYTES.store(bytes.map_or(0, |b| b.max(1)), Ordering::Relaxed);
}

/// Size of the largest CPU cache, from Linux sysfs.
fn llc_bytes() -> Option<usize> {
    let mut best = None;
    for i in 0..8 {
        let Ok(s) = std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size")) else {
            break;
        };
        let s = s.trim();
        let (num, mult) = match s.as_bytes().last() {
            Some(b'K') => (&s[..s.len() - 1], 1usize << 10),
            Some(b'M') => (&s[..s.len() - 1], 1 << 20),
            Some(b'G') => (&s[..s.len() - 1], 1 << 30),
            _ => (s, 1),
        };
        if let Ok(n) = num.parse::<usize>() {
            best = best.max(Some(n * mult));
        }
    }
    best
}

#[inline(always)]
unsafe fn ld<T: Copy>(p: *const u8) -> T {
    // SAFETY: the caller guarantees `p` is readable for `size_of::<T>()` bytes.
    unsafe { p.cast::<T>().read_unaligned() }
}

#[inline(always)]
unsafe fn st<T: Copy>(p: *mut u8, v: T) {
    // SAFETY: the caller guarantees `p` is writable for `size_of::<T>()` bytes.
    unsafe { p.cast::<T>().write_unaligned(v) }
}

/// Makes a task's non-temporal stores globally visible before it ends.
#[inline(always)]
fn store_fence(nt: bool) {
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
unsafe fn copy_small(dst: *mut u8, src: *const u8, n: usize) {
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

/// Copies `n` bytes: libc's `memcpy` (tuned per CPU), or — when `nt` — a
/// loop of streaming stores over whole destination cache lines.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, n)`. With `nt`, the task must call
/// [`store_fence`] before it ends.
#[inline(always)]
unsafe fn copy_run(dst: *mut u8, src: *const u8, n: usize, nt: bool) {
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
        if n <= INLINE_RUN_MAX {
            // Runs up to a few pages inline (no call): 128-byte blocks that load
            // all their bytes before storing any, then an overlapping tail.
            // libc's memcpy switches to `rep movsb` around 2 KiB, which stalls
            // on rows whose source and destination are a multiple of 4 KiB
            // apart (4K aliasing: a load waits on an earlier store to the same
            // page offset): 4 KiB rows of a 2×-wide source measured 15–16.5
            // GB/s through it, 18–20 GB/s here (one thread, noisy VM).
            let mut i = 0;
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

/// Bytes of a fill pattern: one element repeated, long enough for a 64-byte
/// window at any phase below 16 plus a short tail.
const PAT: usize = 96;

/// The element at `src` (`e ≤ 16` bytes) repeated over [`PAT`] bytes.
///
/// # Safety
///
/// `src` is readable for `e` bytes.
#[inline(always)]
unsafe fn fill_pattern(src: *const u8, e: usize) -> [u8; PAT] {
    let mut pat = [0u8; PAT];
    // SAFETY: `src` is readable for `e` bytes.
    let v = unsafe { std::slice::from_raw_parts(src, e) };
    for (k, b) in pat.iter_mut().enumerate() {
        *b = v[k % e];
    }
    pat
}

/// Writes `n` bytes of the repeated element of `pat` (period `e`) at `dst`,
/// which must be the start of an element; streaming stores when `nt`.
///
/// # Safety
///
/// `dst` is writable for `n` bytes; with `nt` the task must call
/// [`store_fence`] before it ends.
#[inline(always)]
unsafe fn fill_run(dst: *mut u8, pat: &[u8; PAT], e: usize, n: usize, nt: bool) {
    let p = pat.as_ptr();
    let step = 64 % e;
    // SAFETY: writes stay inside `[0, n)`; reads of `pat` start at a phase
    // `ph < e ≤ 16` and read at most 64 bytes (96-byte pattern).
    unsafe {
        if n < 64 {
            copy_small(dst, p, n);
            return;
        }
        let mut i = 0;
        let mut ph = 0;
        #[cfg(target_arch = "x86_64")]
        if nt && n >= 256 {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
            i = (64 - dst as usize % 64) % 64;
            copy_small(dst, p, i);
            ph = i % e;
            let q = p.add(ph).cast::<__m128i>();
            let (mut a, mut b, mut c, mut f) = (
                _mm_loadu_si128(q),
                _mm_loadu_si128(q.add(1)),
                _mm_loadu_si128(q.add(2)),
                _mm_loadu_si128(q.add(3)),
            );
            while i + 64 <= n {
                if step != 0 {
                    let q = p.add(ph).cast::<__m128i>();
                    (a, b, c, f) = (
                        _mm_loadu_si128(q),
                        _mm_loadu_si128(q.add(1)),
                        _mm_loadu_si128(q.add(2)),
                        _mm_loadu_si128(q.add(3)),
                    );
                    ph += step;
                    if ph >= e {
                        ph -= e;
                    }
                }
                let d = dst.add(i).cast::<__m128i>();
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), f);
                i += 64;
            }
        }
        while i + 64 <= n {
            let q = p.add(ph);
            let (a, b) = (ld::<u128>(q), ld::<u128>(q.add(16)));
            let (c, f) = (ld::<u128>(q.add(32)), ld::<u128>(q.add(48)));
            st(dst.add(i), a);
            st(dst.add(i + 16), b);
            st(dst.add(i + 32), c);
            st(dst.add(i + 48), f);
            ph += step;
            if ph >= e {
                ph -= e;
            }
            i += 64;
        }
        copy_small(dst.add(i), p.add(ph), n - i);
    }
}

/// Bytes of the on-stack staging buffer (a gathered run, a small tile).
const STAGE: usize = 16 << 10;

/// A 64-byte aligned, uninitialised staging buffer.
#[repr(C, align(64))]
struct Stage(std::mem::MaybeUninit<[u8; STAGE]>);

thread_local! {
    /// Per-thread staging area for tiles larger than [`STAGE`], kept between calls.
    static BIG_STAGE: std::cell::RefCell<Vec<u128>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with an uninitialised scratch buffer of at least `bytes` bytes
/// (16-byte aligned): on the stack up to [`STAGE`], else a per-thread buffer.
#[inline(always)]
fn with_stage<R>(bytes: usize, f: impl FnOnce(*mut u8) -> R) -> R {
    if bytes <= STAGE {
        let mut stage = Stage(std::mem::MaybeUninit::uninit());
        return f(stage.0.as_mut_ptr().cast());
    }
    let words = bytes.div_ceil(16);
    let mut f = Some(f);
    let r = BIG_STAGE.try_with(|cell| {
        let mut v = cell.try_borrow_mut().ok()?;
        v.reserve(words); // len stays 0: capacity ≥ words
        let f = f.take()?;
        Some(f(v.as_mut_ptr().cast()))
    });
    match (r, f) {
        (Ok(Some(r)), _) => r,
        // Re-entered or torn down thread-local: a fresh buffer.
        (_, Some(f)) => {
            let mut v: Vec<u128> = Vec::with_capacity(words);
            f(v.as_mut_ptr().cast())
        }
        (_, None) => unreachable!("the closure ran but produced no value"),
    }
}

/// Contiguous copy, split across threads in 4 KiB pieces.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, bytes)`.
unsafe fn memcpy_par(dst: *mut u8, src: *const u8, bytes: usize, nt: bool) {
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

/// Row copies: `dims[0]` is unit-stride on both sides.
///
/// # Safety
///
/// As [`execute`].
unsafe fn rows(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
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
    if let [o] = outer
        && row <= SHORT_ROW_MAX
    {
        // One outer dim of short rows (sliced columns, padded rows): a plain
        // pointer walk, the row size a constant where it is a common one.
        let (ds, ss, rows) = (o.dst, o.src, o.len);
        // Short rows cost what they touch, not what they move: a cache line each,
        // and a TLB walk each when a page or more apart (narrow column slices of a
        // wide matrix, where a second thread halves the time of a 512 KiB copy).
        let touched = if ss.unsigned_abs() >= 4096 { 256 } else { 64 };
        let work = rows.saturating_mul((row as usize).max(touched));
        par_for(rows, work, |r0, r1| {
            // SAFETY: rows `r0..r1` of the plan, in bounds on both sides.
            unsafe {
                let (dp, sp) = (d.get().offset(r0 as isize * ds), s.get().offset(r0 as isize * ss));
                // Literal sizes inline to fixed-size copies; others stay dynamic.
                let n = r1 - r0;
                match row {
                    4 => short_rows(dp, sp, ds, ss, n, 4),
                    8 => short_rows(dp, sp, ds, ss, n, 8),
                    16 => short_rows(dp, sp, ds, ss, n, 16),
                    32 => short_rows(dp, sp, ds, ss, n, 32),
                    64 => short_rows(dp, sp, ds, ss, n, 64),
                    128 => short_rows(dp, sp, ds, ss, n, 128),
                    other => short_rows(dp, sp, ds, ss, n, other as usize),
                }
            }
        });
        return;
    }
    // Long rows are whole destination lines written once while a strided
    // source streams through the cache: streaming stores pay off from a
    // quarter of the last-level cache (4 KiB rows of 16 MiB: 18 → 33 GB/s;
    // at an eighth, a 4 MiB row flip ran at 0.6× torch's cached stores).
    let nt = nt || plan.bytes() >= stream_threshold() / 4;
    par_for(plan.numel, plan.bytes(), |w0, w1| {
        for_each_segment(outer, len, w0, w1, |dof, so, i0, n| {
            let off = (i0 * e) as isize;
            // SAFETY: a piece of one row of the plan, in bounds on both sides.
            unsafe { copy_run(d.get().offset(dof + off), s.get().offset(so + off), n * e, nt) }
        });
        store_fence(nt);
    });
}

/// Rows up to this many bytes, under one outer dim, take [`short_rows`]
/// (ordinary stores: streaming whole lines of short rows measured slower).
const SHORT_ROW_MAX: isize = 256;

/// Copies `count` rows of `row` bytes, `ds`/`ss` bytes apart. Always inlined,
/// so a literal `row` makes the per-row copy a fixed-size one.
///
/// # Safety
///
/// Every row `i < count` at `dst + i·ds` / `src + i·ss` is in bounds, and
/// no destination row overlaps a source row.
#[inline(always)]
unsafe fn short_rows(mut dst: *mut u8, mut src: *const u8, ds: isize, ss: isize, count: usize, row: usize) {
    for _ in 0..count {
        // SAFETY: the caller's contract, row by row.
        unsafe {
            copy_run(dst, src, row, false);
            dst = dst.offset(ds);
            src = src.offset(ss);
        }
    }
}

/// Rows up to this many bytes are copied in tiles when the source order of
/// the rows differs from the destination order.
const ROW_TILE_MAX_ROW: isize = 2048;
/// Bytes of consecutive rows a row tile reads (and writes) in one run.
const ROW_TILE_RUN: usize = 2048;

/// Row copies whose rows are transposed: `dims[1]` (the next destination dim)
/// is not the next source dim, `dims[k]` is (attention's `[B,S,H,D] →
/// [B,H,S,D]`, `(1, 2, 0, 3)` permutes). Walking rows in destination order
/// would read one short row per source page visit; tiles of rows over
/// (`dims[1]`, `dims[k]`) read and write runs of ~2 KiB on both sides.
///
/// # Safety
///
/// As [`execute`].
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
    let per_run = (ROW_TILE_RUN / row_bytes).max(1);
    let (bi, bj) = (per_run.min(a.len), per_run.min(b.len));
    let (nbi, nbj) = (a.len.div_ceil(bi), b.len.div_ceil(bj));
    let per_slice = nbi * nbj;
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, plan.bytes(), |t0, t1| {
        for_each_segment(&batch, per_slice, t0, t1, |dof, so, first, n| {
            for t in first..first + n {
                let (i0, j0) = (t / nbj * bi, t % nbj * bj);
                let (ni, nj) = (bi.min(a.len - i0), bj.min(b.len - j0));
                for i in i0..i0 + ni {
                    let (di, si) = (dof + i as isize * a.dst, so + i as isize * a.src);
                    for j in j0..j0 + nj {
                        let j = j as isize;
                        // SAFETY: row (i, j) of the plan, in bounds on both sides.
                        unsafe {
                            copy_run(
                                d.get().offset(di + j * b.dst),
                                s.get().offset(si + j * b.src),
                                row_bytes,
                                nt,
                            )
                        }
                    }
                }
            }
        });
        store_fence(nt);
    });
}

/// Fill of contiguous destination rows from a repeated-element pattern.
///
/// # Safety
///
/// As [`execute`]; `src` points at the one source element.
unsafe fn fill_rows(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
    let e = plan.elem_size;
    // SAFETY: `src` is readable for `e` bytes.
    let pat = unsafe { fill_pattern(src, e) };
    let pat = &pat;
    let len = plan.dims[0].len;
    let outer = &plan.dims[1..];
    let d = Shared(dst);
    par_for(plan.numel, plan.bytes(), |w0, w1| {
        for_each_segment(outer, len, w0, w1, |dof, _, i0, n| {
            // SAFETY: `n` elements of a destination row starting at an element.
            unsafe { fill_run(d.get().offset(dof + (i0 * e) as isize), pat, e, n * e, nt) }
        });
        store_fence(nt);
    });
}

/// General copy: odometer over the outer dims, innermost loop specialised on
/// the strides. When `dims[0]` is short, a longer dim with unit source stride
/// becomes the inner loop.
///
/// # Safety
///
/// As [`execute`].
unsafe fn general<T: Elem>(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>() as isize;
    let mut dims = plan.dims.clone();
    if dims[0].len < 16
        && let Some(k) = (1..dims.len()).find(|&k| dims[k].src == e && dims[k].len >= 2 * dims[0].len)
    {
        let d = dims.remove(k);
        dims.insert(0, d);
    }
    let d0 = dims[0];
    let b = plan.bytes();
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
/// As [`execute`], with `dims` a reordering of the plan's dims.
unsafe fn general_k<T: Elem, const K: u8>(dims: &[PlanDim], bytes: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>();
    let d0 = dims[0];
    let (ss, ds) = (d0.src, d0.dst);
    let outer = &dims[1..];
    let total = d0.len * outer.iter().map(|d| d.len).product::<usize>();
    let (d, s) = (Shared(dst), Shared(src));
    let chunk = STAGE / e; // elements staged at a time
    par_for(total, bytes, |w0, w1| {
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
                        GATHER if nt => {
                            let mut i = 0;
                            while i < n {
                                let c = (n - i).min(chunk);
                                gather::<T>(buf, sp.offset(i as isize * ss), c, ss);
                                copy_run(dp.add(i * e), buf, c * e, true);
                                i += c;
                            }
                        }
                        GATHER => gather::<T>(dp, sp, n, ss),
                        SCATTER => scatter::<T>(dp, sp, n, ds),
                        _ => {
                            for i in 0..n {
                                let i = i as isize;
                                st(dp.offset(i * ds), ld::<T>(sp.offset(i * ss)));
                            }
                        }
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// `dst[i] = src[i·ss]` for `i < n` (contiguous destination). Source strides
/// of 2, 3, 4 and −1 elements get loops with constant strides, which LLVM
/// turns into wide loads and shuffles (every other element, one channel of
/// three, a reversal).
///
/// # Safety
///
/// Every address formed is an element of its operand.
#[inline(always)]
unsafe fn gather<T: Elem>(dst: *mut u8, src: *const u8, n: usize, ss: isize) {
    let e = size_of::<T>();
    // SAFETY: forwarded; `ss == k·e` in the constant-stride arms.
    unsafe {
        match ss / e as isize {
            2 if ss == 2 * e as isize => gather_const::<T, 2>(dst, src, n),
            3 if ss == 3 * e as isize => gather_const::<T, 3>(dst, src, n),
            4 if ss == 4 * e as isize => gather_const::<T, 4>(dst, src, n),
            -1 if ss == -(e as isize) => {
                // Reversal: contiguous backwards, vectorised with a lane shuffle.
                for i in 0..n {
                    st(dst.add(i * e), ld::<T>(src.sub(i * e)));
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

/// `dst[i·ds] = src[i]` for `i < n` (contiguous source); destination strides
/// of 2, 3 and 4 elements are constant-stride loops (interleaving channels).
///
/// # Safety
///
/// Every address formed is an element of its operand.
#[inline(always)]
unsafe fn scatter<T: Elem>(dst: *mut u8, src: *const u8, n: usize, ds: isize) {
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

/// An element type the kernels move: a power-of-two integer or a byte array.
trait Elem: Copy + Send + Sync + 'static {
    /// Edge of the register micro tile.
    const MICRO: usize;

    /// Transposes one `MICRO × MICRO` block:
    /// `dst[i·E + j·db] = src[i·sa + j·E]` for `i, j < MICRO`.
    ///
    /// # Safety
    ///
    /// Every address formed is readable (source) or writable (destination).
    #[inline(always)]
    unsafe fn micro(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
        let e = size_of::<Self>();
        // SAFETY: forwarded; indices stay below MICRO.
        unsafe {
            for j in 0..Self::MICRO {
                let dr = dst.offset(j as isize * db);
                let sc = src.add(j * e);
                for i in 0..Self::MICRO {
                    st(dr.add(i * e), ld::<Self>(sc.offset(i as isize * sa)));
                }
            }
        }
    }
}

macro_rules! scalar_elem {
    ($($t:ty => $micro:expr;)*) => {
        $(impl Elem for $t {
            const MICRO: usize = $micro;
        })*
    };
}

scalar_elem! {
    [u8; 3] => 4;
    [u8; 5] => 4;
    [u8; 6] => 4;
    [u8; 7] => 4;
    [u8; 9] => 4;
    [u8; 10] => 4;
    [u8; 11] => 4;
    [u8; 12] => 4;
    [u8; 13] => 4;
    [u8; 14] => 4;
    [u8; 15] => 4;
    u128 => 4;
}

#[cfg(not(target_arch = "x86_64"))]
scalar_elem! {
    u8 => 8;
    u16 => 8;
    u32 => 8;
    u64 => 4;
}

#[cfg(target_arch = "x86_64")]
mod sse {
    //! SSE2 (x86-64 baseline) register transposes: a `16/E × 16/E` block of
    //! `E`-byte elements in `log2(16/E)` rounds of interleaves.
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128, _mm_unpackhi_epi8, _mm_unpackhi_epi16,
        _mm_unpackhi_epi32, _mm_unpackhi_epi64, _mm_unpacklo_epi8, _mm_unpacklo_epi16, _mm_unpacklo_epi32,
        _mm_unpacklo_epi64,
    };

    use super::Elem;

    /// Loads `N` rows, runs `rounds` perfect shuffles, stores `N` rows.
    ///
    /// # Safety
    ///
    /// `src + i·sa` readable and `dst + j·db` writable for 16 bytes, `i, j < N`.
    #[inline(always)]
    unsafe fn transpose<const N: usize>(
        dst: *mut u8,
        src: *const u8,
        sa: isize,
        db: isize,
        lo: impl Fn(__m128i, __m128i) -> __m128i,
        hi: impl Fn(__m128i, __m128i) -> __m128i,
    ) {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        let zero = unsafe { _mm_setzero_si128() };
        let mut r = [zero; N];
        for (i, row) in r.iter_mut().enumerate() {
            // SAFETY: forwarded from the caller.
            *row = unsafe { _mm_loadu_si128(src.offset(i as isize * sa).cast()) };
        }
        let h = N / 2;
        let mut rounds = N.trailing_zeros();
        while rounds > 0 {
            let mut t = [zero; N];
            for k in 0..h {
                t[2 * k] = lo(r[k], r[k + h]);
                t[2 * k + 1] = hi(r[k], r[k + h]);
            }
            r = t;
            rounds -= 1;
        }
        for (j, row) in r.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            unsafe { _mm_storeu_si128(dst.offset(j as isize * db).cast(), *row) };
        }
    }

    impl Elem for u8 {
        const MICRO: usize = 16;
        #[inline(always)]
        unsafe fn micro(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
            // SAFETY: forwarded.
            unsafe {
                transpose::<16>(
                    dst,
                    src,
                    sa,
                    db,
                    |a, b| _mm_unpacklo_epi8(a, b),
                    |a, b| _mm_unpackhi_epi8(a, b),
                )
            }
        }
    }
    impl Elem for u16 {
        const MICRO: usize = 8;
        #[inline(always)]
        unsafe fn micro(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
            // SAFETY: forwarded.
            unsafe {
                transpose::<8>(
                    dst,
                    src,
                    sa,
                    db,
                    |a, b| _mm_unpacklo_epi16(a, b),
                    |a, b| _mm_unpackhi_epi16(a, b),
                )
            }
        }
    }
    impl Elem for u32 {
        const MICRO: usize = 4;
        #[inline(always)]
        unsafe fn micro(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
            // SAFETY: forwarded.
            unsafe {
                transpose::<4>(
                    dst,
                    src,
                    sa,
                    db,
                    |a, b| _mm_unpacklo_epi32(a, b),
                    |a, b| _mm_unpackhi_epi32(a, b),
                )
            }
        }
    }
    impl Elem for u64 {
        const MICRO: usize = 2;
        #[inline(always)]
        unsafe fn micro(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
            // SAFETY: forwarded.
            unsafe {
                transpose::<2>(
                    dst,
                    src,
                    sa,
                    db,
                    |a, b| _mm_unpacklo_epi64(a, b),
                    |a, b| _mm_unpackhi_epi64(a, b),
                )
            }
        }
    }
}

/// Largest transpose (bytes) done without a staging tile.
const DIRECT_MAX_BYTES: usize = 2 << 20;

/// Blocked transpose over (`dims[0]`: unit dst stride, `dims[k]`: unit src
/// stride); the other dims are a batch. Small copies transpose each L1-sized
/// tile straight into the destination. Larger ones transpose a bigger tile
/// into a contiguous staging buffer (no cache-set conflicts between
/// power-of-two rows) and write it out as contiguous destination runs,
/// streaming when `nt`. Tiles (batch-major, then source row blocks, then
/// source column blocks) are split across threads.
///
/// # Safety
///
/// As [`execute`].
unsafe fn transpose<T: Elem>(plan: &CopyPlan, k: usize, dst: *mut u8, src: *const u8, nt: bool) {
    let e = size_of::<T>();
    let m = T::MICRO;
    let a = plan.dims[0];
    let b = plan.dims[k];
    let batch: SmallVec<[PlanDim; INLINE_DIMS]> = plan
        .dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 0 && i != k)
        .map(|(_, d)| *d)
        .collect();
    // Small copies (≤ 2 MiB, cache-resident): 256 destination bytes × 64 source
    // bytes, straight into the destination. Larger: up to 512 destination bytes
    // × 2 KiB of source row, at most 256 KiB (L2-resident) of staging. Long runs
    // on both sides matter more than L1 residency once the data come from
    // DRAM: the hardware prefetchers need several lines of a page per visit,
    // and streaming stores want whole lines. A short side is taken whole and
    // the other grows to fill the tile.
    let direct = !nt && plan.bytes() <= DIRECT_MAX_BYTES;
    let (tile_dst, tile_src, tile_max) = if direct {
        (256, 64, STAGE)
    } else {
        (512, 2048, 256 << 10)
    };
    let base_i = (tile_dst / e / m).max(1) * m;
    let base_j = (tile_src / e / m).max(1) * m;
    let (bi, bj) = if b.len < base_j {
        let bj = b.len;
        (a.len.min((tile_max / (bj * e) / m).max(1) * m), bj)
    } else {
        let bi = a.len.min(base_i);
        let cap = (tile_max / (bi * e) / m).max(1) * m;
        (bi, b.len.min(base_j).min(cap))
    };
    let stage_bytes = if direct { 0 } else { bi * bj * e };
    let nbi = a.len.div_ceil(bi);
    let nbj = b.len.div_ceil(bj);
    let per_slice = nbi * nbj;
    let slices: usize = batch.iter().map(|d| d.len).product();
    let (sa, db) = (a.src, b.dst);
    let (d, s) = (Shared(dst), Shared(src));
    par_for(per_slice * slices, plan.bytes(), |t0, t1| {
        with_stage(stage_bytes, |buf| {
            for_each_segment(&batch, per_slice, t0, t1, |dof, so, first, n| {
                for t in first..first + n {
                    let (jb, ib) = (t % nbj, t / nbj);
                    let (i0, j0) = (ib * bi, jb * bj);
                    let ni = bi.min(a.len - i0);
                    let nj = bj.min(b.len - j0);
                    let tb = ni * e; // staging row stride
                    // SAFETY: the tile's elements are elements of the plan; the
                    // staging buffer holds `ni * nj * e ≤ stage_bytes` bytes.
                    unsafe {
                        let dt = d.get().offset(dof + (i0 * e) as isize + j0 as isize * db);
                        let st = s.get().offset(so + i0 as isize * sa + (j0 * e) as isize);
                        if direct {
                            tile::<T>(dt, st, ni, nj, sa, db);
                            continue;
                        }
                        tile::<T>(buf, st, ni, nj, sa, tb as isize);
                        if db == tb as isize {
                            copy_run(dt, buf, tb * nj, nt);
                        } else {
                            for j in 0..nj {
                                copy_run(dt.offset(j as isize * db), buf.add(j * tb), tb, nt);
                            }
                        }
                    }
                }
            });
        });
        store_fence(nt);
    });
}

/// One `ni × nj` tile: `dst[i·E + j·db] = src[i·sa + j·E]`, micro tiles
/// row-block by row-block so each source line is consumed while cached.
///
/// # Safety
///
/// Every address formed for `i < ni`, `j < nj` is an element of its operand.
#[inline(always)]
unsafe fn tile<T: Elem>(dst: *mut u8, src: *const u8, ni: usize, nj: usize, sa: isize, db: isize) {
    let e = size_of::<T>();
    let m = T::MICRO;
    let (fi, fj) = (ni / m * m, nj / m * m);
    // SAFETY: all offsets below stay within the `ni × nj` tile.
    unsafe {
        let mut i = 0;
        while i < fi {
            let mut j = 0;
            while j < fj {
                T::micro(
                    dst.offset((i * e) as isize + j as isize * db),
                    src.offset(i as isize * sa + (j * e) as isize),
                    sa,
                    db,
                );
                j += m;
            }
            i += m;
        }
        if fj < nj {
            // Right strip: j in fj..nj, i in 0..fi.
            edge::<T>(dst.offset(fj as isize * db), src.add(fj * e), fi, nj - fj, sa, db);
        }
        if fi < ni {
            // Bottom strip: i in fi..ni, all j.
            edge::<T>(dst.add(fi * e), src.offset(fi as isize * sa), ni - fi, nj, sa, db);
        }
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
