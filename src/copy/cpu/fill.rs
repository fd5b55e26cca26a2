//! Fills: one element repeated into a pattern, written over contiguous runs.

use super::elem::{ld, st};
use super::parallel::{Shared, for_each_segment, par_for};
use super::runs::{copy_small, store_fence};
use crate::copy::plan::CopyPlan;

/// Bytes of a fill pattern: one element repeated, long enough for a 64-byte
/// window at any phase below 16 plus a short tail.
const PAT: usize = 96;

/// The element at `src` (`e ≤ 16` bytes) repeated over [`PAT`] bytes.
///
/// # Safety
///
/// `src` is readable for `e` bytes.
#[inline(always)]
pub(super) unsafe fn fill_pattern(src: *const u8, e: usize) -> [u8; PAT] {
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
pub(super) unsafe fn fill_run(dst: *mut u8, pat: &[u8; PAT], e: usize, n: usize, nt: bool) {
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
            // A pattern that repeats within a line (elements of 1 to 16 bytes:
            // within 32 bytes too) takes two 32-byte streaming stores a line
            // where the CPU has AVX2, as `copy_run`'s lines do (Zen 3 VM, two
            // cores, in-process A/B, three runs: 64 MiB filled with an f32
            // 1.00–1.01×, with a byte 1.01–1.28×; 4096 f16 broadcast along
            // 4096² rows 1.17–1.18×); four 16-byte ones otherwise.
            if step == 0 && super::avx2::enabled() {
                i += super::avx2::stream_fill(dst.add(i), p.add(ph), n - i);
            } else {
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

/// Fill of contiguous destination rows from a repeated-element pattern.
///
/// # Safety
///
/// As [`execute`](super::execute); `src` points at the one source element.
pub(super) unsafe fn fill_rows(plan: &CopyPlan, dst: *mut u8, src: *const u8, nt: bool) {
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
