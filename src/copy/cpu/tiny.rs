//! Tiny copies into a dense destination (a `contiguous()` of a 4 × 4 view):
//! every source element gathered into place, or into a stack buffer and then
//! written in one go when source and destination may overlap. No
//! plan: for a few hundred bytes, normalising and dispatching the copy cost
//! more than the copy itself (`Tensor::copy_from` of a 4 × 4 f32 transpose,
//! one run: 145 ns through the plan, 55 this way; a 2 KiB 8³ f32 permute into
//! a fresh tensor 436 → 342 ns). Through the buffer, reading everything
//! before writing anything makes any overlap harmless.

use std::mem::MaybeUninit;
use std::ptr;

use super::MAX_ELEM;
use crate::copy::plan::ranges_overlap;

/// Largest copy (bytes) taken this way, the stack buffer: at 2 KiB the
/// gather still matches the planned kernels.
pub(super) const TINY_MAX_BYTES: usize = 2048;

/// Elements of 8 bytes gathered this way past [`TINY_MAX_BYTES`] (straight
/// into a fresh destination, never through the stage): up to this many, in
/// at most three dims, in destination rows of [`TINY_WIDE_MIN_ROW`] or more
/// elements that lie more than four apart in the source (transposes; not
/// the channel splits and row copies the planned kernels take whole). The
/// plan's setup and its 8 × 8 tiles' edges cost more there. Python, one
/// thread, both builds in one process, best of 21 (µs), planned → gathered
/// (NumPy): f64 transposed 16 × 17 0.51 → 0.35 (0.36), 170 × 6 0.65 → 0.49
/// (0.63), 32² 0.59 → 0.54 (0.62), 10³ permuted 210 0.92 → 0.71 (0.92).
/// Shorter rows lost (6 × 170 transposed 0.66 → 0.95, 8 × 8 × 16 permuted
/// 201 0.66 → 0.81), as did 4-byte elements (16 × 64 f32 transposed 1.09×).
const TINY_WIDE_MAX_ELEMS: usize = 1024;
/// Shortest destination row of [`TINY_WIDE_MAX_ELEMS`]' gathers.
const TINY_WIDE_MIN_ROW: usize = 10;

/// Copies `shape` from `src` (element strides `src_strides`) to the dense,
/// C-ordered `dst`, when the copy is tiny; `false` (nothing done) otherwise.
///
/// # Safety
///
/// As [`copy_strided`](super::copy_strided), with `dst` dense: its
/// `numel · elem_size` bytes valid for writes.
pub(super) unsafe fn copy_tiny(
    dst: *mut u8,
    src: *const u8,
    src_strides: &[isize],
    shape: &[usize],
    elem_size: usize,
) -> bool {
    let Some(bytes) = shape.iter().try_fold(elem_size, |acc, &n| acc.checked_mul(n)) else {
        return false;
    };
    let fits_stage = bytes <= TINY_MAX_BYTES;
    let wide = elem_size == 8
        && bytes <= TINY_WIDE_MAX_ELEMS * 8
        && shape.len() <= 3
        && shape.last().is_some_and(|&n| n >= TINY_WIDE_MIN_ROW)
        && src_strides.last().is_some_and(|s| s.unsigned_abs() > 4);
    if !fits_stage && !wide {
        return false;
    }
    // Empty copies and zero-sized elements go to the plan, which validates
    // them; wide elements it turns into a byte dim.
    if bytes == 0 || elem_size > MAX_ELEM {
        return false;
    }
    // A source extent that overflows goes to the plan too, which reports it.
    // (Folded here rather than through `layout::offset_range`, whose `Result`
    // cost a 4 × 4 copy a fifth of its time.)
    let e = elem_size as isize;
    let span = shape
        .iter()
        .zip(src_strides)
        .try_fold((0isize, e), |(lo, hi), (&n, &s)| {
            let ext = (n as isize - 1).checked_mul(s)?.checked_mul(e)?;
            Some(if ext < 0 {
                (lo.checked_add(ext)?, hi)
            } else {
                (lo, hi.checked_add(ext)?)
            })
        });
    let Some((lo, hi)) = span else {
        return false;
    };
    // Disjoint ranges (a fresh destination): gathered straight into place.
    let (d, sp) = (dst as usize, src as usize);
    let src_range = (sp.wrapping_add_signed(lo), sp.wrapping_add_signed(hi));
    let direct = src_range.0 <= src_range.1 && !ranges_overlap((d, d + bytes), src_range);
    if !direct && !fits_stage {
        return false; // larger than the stage
    }
    let mut stage = MaybeUninit::<[u8; TINY_MAX_BYTES]>::uninit();
    let buf = if direct { dst } else { stage.as_mut_ptr().cast::<u8>() };
    // SAFETY: forwarded; the gathered elements fill exactly `bytes`: the dense
    // destination, or the buffer when the ranges may overlap.
    unsafe {
        match elem_size {
            1 => gather::<u8>(buf, src, src_strides, shape),
            2 => gather::<u16>(buf, src, src_strides, shape),
            4 => gather::<u32>(buf, src, src_strides, shape),
            8 => gather::<u64>(buf, src, src_strides, shape),
            16 => gather::<u128>(buf, src, src_strides, shape),
            e => gather_bytes(buf, src, src_strides, shape, e),
        }
        if !direct {
            ptr::copy_nonoverlapping(buf, dst, bytes);
        }
    }
    true
}

/// Gathers the elements of `shape` in C order into `out`: the last dim in
/// a tight loop, the others by an odometer.
///
/// # Safety
///
/// Every element of the source layout is readable; `out` holds them all.
unsafe fn gather<T: Copy>(out: *mut u8, src: *const u8, strides: &[isize], shape: &[usize]) {
    let e = size_of::<T>() as isize;
    // SAFETY: forwarded.
    unsafe {
        odometer(out, src, strides, shape, e, |o, s, n, step| {
            if step == e {
                return ptr::copy_nonoverlapping(s, o, n * e as usize); // a dense row
            }
            let o = o.cast::<T>();
            for i in 0..n {
                o.add(i)
                    .write_unaligned(s.offset(i as isize * step).cast::<T>().read_unaligned());
            }
        })
    }
}

/// [`gather`] for element sizes that are not a power of two.
///
/// # Safety
///
/// As [`gather`].
unsafe fn gather_bytes(out: *mut u8, src: *const u8, strides: &[isize], shape: &[usize], e: usize) {
    // SAFETY: forwarded.
    unsafe {
        odometer(out, src, strides, shape, e as isize, |o, s, n, step| {
            for i in 0..n {
                ptr::copy_nonoverlapping(s.offset(i as isize * step), o.add(i * e), e);
            }
        })
    }
}

/// Calls `row(out, src row start, len, byte step)` for every row of the last
/// dim, in C order, `out` advancing densely.
///
/// # Safety
///
/// As [`gather`].
unsafe fn odometer(
    mut out: *mut u8,
    src: *const u8,
    strides: &[isize],
    shape: &[usize],
    e: isize,
    mut row: impl FnMut(*mut u8, *const u8, usize, isize),
) {
    let Some((&n, outer)) = shape.split_last() else {
        row(out, src, 1, 0); // a 0-d copy: its one element
        return;
    };
    // Wrapping: a size-1 dim's stride is never stepped and may be any value
    // (an imported one of `i64::MAX`); every stride stepped more than once
    // had its extent checked by `copy_tiny`.
    let step = strides[shape.len() - 1].wrapping_mul(e);
    // The outer dims' counters, on the stack up to 8 dims. A 64-counter
    // index cost a 512-byte memset per call: `contiguous()` of a 4 × 4 f32
    // transpose from Python, best of 15, three alternated runs: 244 → 232 ns.
    let (mut inline, mut heap) = ([0usize; 8], Vec::new());
    let index: &mut [usize] = if outer.len() <= inline.len() {
        &mut inline[..outer.len()]
    } else {
        heap.resize(outer.len(), 0);
        &mut heap
    };
    let mut at = src;
    loop {
        row(out, at, n, step);
        // SAFETY: `out` stays within the dense `numel · e` bytes.
        out = unsafe { out.add(n * e as usize) };
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            if outer[d] == 1 {
                continue;
            }
            index[d] += 1;
            at = at.wrapping_offset(strides[d] * e);
            if index[d] < outer[d] {
                break;
            }
            // `outer[d]` strides back, modulo the address space as the steps were.
            at = at.wrapping_offset(
                (outer[d] as isize)
                    .wrapping_mul(strides[d])
                    .wrapping_mul(e)
                    .wrapping_neg(),
            );
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_tiny;

    /// A transpose of `rows × cols` `e`-byte elements from `src` (row-major)
    /// into a dense `dst` (rows of `rows`): whether the tiny path took it.
    fn transposed(dst: *mut u8, src: *const u8, rows: usize, cols: usize, e: usize) -> bool {
        // SAFETY: the source is `rows × cols` row-major elements, read at
        // strides (1, cols) over the shape (cols, rows); `dst` holds them all.
        unsafe { copy_tiny(dst, src, &[1, cols as isize], &[cols, rows], e) }
    }

    #[test]
    fn wide_elements_past_the_stage_are_gathered_into_a_fresh_destination_only() {
        // 20 × 20 f64 (3200 bytes): gathered, and right.
        let src: Vec<u64> = (0..400).collect();
        let mut dst = vec![0u64; 400];
        assert!(transposed(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 20, 20, 8));
        assert!((0..20).all(|i| (0..20).all(|j| dst[i * 20 + j] == src[j * 20 + i])));
        // Onto its own source: larger than the stage, left to the plan.
        let mut own = src.clone();
        assert!(!transposed(own.as_mut_ptr().cast(), own.as_ptr().cast(), 20, 20, 8));
        assert_eq!(own, src);
        // Destination rows of 6 (a 6 × 170 transpose), and 4-byte elements
        // past the stage (30 × 30 f32): the plan's.
        let src: Vec<u64> = (0..1020).collect();
        let mut dst = vec![0u64; 1020];
        assert!(!transposed(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 6, 170, 8));
        // Rows of 170 (a 170 × 6 transpose, sources 6 apart): gathered.
        assert!(transposed(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 170, 6, 8));
        assert!((0..6).all(|i| (0..170).all(|j| dst[i * 170 + j] == src[j * 6 + i])));
        let src: Vec<u32> = (0..900).collect();
        let mut dst = vec![0u32; 900];
        assert!(!transposed(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 30, 30, 4));
        // 1025 elements: the plan's.
        let src: Vec<u64> = (0..1025).collect();
        let mut dst = vec![0u64; 1025];
        assert!(!transposed(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 41, 25, 8));
    }
}
