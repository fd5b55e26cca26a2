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
//! | `Transpose` | tiles over (dst-fastest, src-fastest) with register micro-transposes — AVX-512 for large streamed ones of 1/2/4/8-byte elements into line-aligned rows (64×64, 32×32, 16×16, 8×8: every store a whole line; bytes below half the streaming size only) and of 3-byte pixels where the CPU has VBMI (64×16, three lines a row) and of 4/8-byte ones into rows off line boundaries (each line joined from two micro tiles), AVX2 for 1/2/4/8-byte elements where the CPU has it (32×32, 16×16, 8×8, 4×4), SSE2 for 1/2/4/8-byte ones (16×16, 8×8, 4×4, 2×2), scalar 4×4 otherwise — written straight into the destination in whole cache lines, or staged with the next tile prefetched; the other dims are a batch, and join the tile where they continue a short run; 3-byte pixels to planes and back by byte shuffles |
//! | `General` | odometer, innermost loop specialised on (src, dst) stride: (E,E), (0,E), (s,E), (E,t), (s,t) |
//! | `Fill` | a repeated-element pattern written over contiguous runs |
//!
//! Copies of at most 2 KiB into a dense destination skip the plan (`tiny`:
//! gathered in place, or through a stack buffer when the ranges may overlap).
//!
//! Elements are moved as `u8/u16/u32/u64/u128` (powers of two) or `[u8; N]`
//! (other sizes up to 16) with unaligned loads and stores, so odd addresses are
//! fine. Larger elements become an extra byte dimension.
//!
//! Runs are copied with libc's `memcpy`, except for destinations about as large
//! as the last-level cache (a fraction of it for row copies and transposes,
//! and for clones too on some CPUs: `runs::runs_stream_threshold`): those are
//! written with non-temporal (streaming) stores over whole cache lines, which
//! skips the read-for-ownership of every destination line (see
//! [`set_stream_threshold`]). Work from 256 KiB on is split
//! across rayon over a flat index space — rows × row elements, or batch × tiles
//! — so a short outer dimension still feeds every thread.
//!
//! The kernels, one concept a file: `parallel` (the parallel loop; `placement`:
//! which CPUs its threads may use), `runs`
//! (contiguous runs, streaming stores), `tiny`, `rows`, `general` (the odometer;
//! `shuffled_gather`: every 2nd to 8th byte or pair, every 2nd 4-byte element,
//! by byte shuffles),
//! `transpose` (`channels`: images of three channels, pixels to planes and back,
//! pixels of 2 and 4 channels, and of 5 to 8 to planes, where `split512` does not run;
//! `split512`: pixels of 2–8 channels to planes; `folded512`: transposes with a
//! narrow side, whose tile sides are folded from two dims each), `fill`; `elem` (element types, their
//! micro-transposes), `avx2` (the AVX2 ones), `avx512` (the whole-line AVX-512 ones)
//! and `stage` (scratch) are what they share.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
mod caches;
#[cfg(target_arch = "x86_64")]
mod channels;
mod cpu_model;
mod elem;
mod fill;
#[cfg(target_arch = "x86_64")]
mod folded512;
mod general;
mod parallel;
pub(crate) mod placement;
mod rows;
mod runs;
#[cfg(target_arch = "x86_64")]
mod shuffled_gather;
#[cfg(target_arch = "x86_64")]
mod split512;
mod stage;
mod tiny;
mod transpose;

use std::ptr;

use smallvec::SmallVec;

use self::fill::{fill_pattern, fill_rows, fill_run};
use self::general::general;
use self::parallel::{PAR_MIN_BYTES, serially};
use self::rows::rows;
use self::runs::{memcpy_par, runs_stream_threshold, stream_threshold};
use self::tiny::copy_tiny;
use self::transpose::transpose;
use crate::copy::plan::{
    BaseAddrs, CopyPlan, INLINE_DIMS, PlanKind, PlanOptions, absolute_range, plan_copy, ranges_overlap, same_layout,
    views_may_share,
};
use crate::error::{Error, Result};

pub use self::parallel::pool_stats;
pub use self::runs::set_stream_threshold;

/// Allows (the default) or forbids the AVX2 transpose kernels, which run only
/// where the CPU has AVX2; forbidden, the SSE2 baseline ones run (for tests
/// and comparisons). No effect off x86-64.
pub fn set_avx2_allowed(allowed: bool) {
    #[cfg(target_arch = "x86_64")]
    avx2::set_allowed(allowed);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = allowed;
}

/// Allows (the default) or forbids the AVX-512 transpose kernels, which run
/// only where the CPU has AVX-512 F and BW and the AVX2 ones are allowed
/// ([`set_avx2_allowed`]); forbidden, the AVX2 ones run (for tests and
/// comparisons). No effect off x86-64.
pub fn set_avx512_allowed(allowed: bool) {
    #[cfg(target_arch = "x86_64")]
    avx512::set_allowed(allowed);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = allowed;
}

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

/// Largest element the typed kernels handle; larger ones get a byte dimension.
const MAX_ELEM: usize = 16;

/// Copies `shape` elements of `elem_size` bytes from `src` to `dst`.
///
/// Pointers point at the logical element `[0, 0, …, 0]`; strides are in
/// elements and may be negative (the source's may also be 0 to broadcast).
/// Any `elem_size ≥ 1` works; 1–16 byte elements take the typed fast paths.
/// When an element of the source shares a byte with an element of the
/// destination (or the bounded search that decides it gives up), the source
/// is first copied into a temporary buffer; views whose elements only
/// interleave are copied in place, and a copy onto an identical layout is a
/// no-op.
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
                op: "copy",
                expected: vec![shape.len()],
                got: vec![strides.len()],
            });
        }
    }
    if crate::layout::is_contiguous(shape, dst_strides)
        // SAFETY: forwarded; the destination is dense.
        && unsafe { copy_tiny(dst, src, src_strides, shape, elem_size) }
    {
        return Ok(());
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
        if same_layout(bases.dst, bases.src, shape, dst_strides, src_strides) {
            return Ok(()); // every element is copied onto itself
        }
        // Views whose elements interleave (`t[::2]` and `t[1::2]`) share no
        // byte that is read and written: copied in place.
        if views_may_share(bases.dst, dst_strides, bases.src, src_strides, shape, elem_size) {
            // SAFETY: forwarded from the caller.
            return unsafe { copy_via_temp(dst, dst_strides, src, src_strides, shape, elem_size, plan.bytes()) };
        }
        // Kernels that load whole vectors around the source's elements (and
        // discard the other lanes) may load the destination's bytes between
        // them: on this thread alone, where no other thread writes them.
        // SAFETY: as below.
        let run = || unsafe { execute(&plan, dst.offset(plan.dst_offset), src.offset(plan.src_offset)) };
        if loads_only_elements(&plan) {
            run()
        } else {
            serially(run)
        }
        return Ok(());
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
        return Err(Error::InvalidArgument {
            op: "fill",
            reason: "the value must be at least one byte".into(),
        });
    }
    if dst_strides.len() != shape.len() {
        return Err(Error::ShapeMismatch {
            op: "fill",
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

/// Whether [`execute`] loads no source byte outside the source's elements
/// for `plan`: runs and rows, and the general kernel's loops but its gathers
/// into unit-stride destination rows (whose constant-stride forms load whole
/// vectors and keep every other lane, every third…). Transposes' kernels
/// load whole lines.
fn loads_only_elements(plan: &CopyPlan) -> bool {
    match plan.kind {
        PlanKind::Empty | PlanKind::Memcpy | PlanKind::Rows => true,
        PlanKind::Fill | PlanKind::General => {
            let (d0, e) = (plan.dims[0], plan.elem_size as isize);
            !(d0.dst == e && d0.src != e && d0.src != 0)
        }
        PlanKind::Transpose { .. } => false,
    }
}

/// Runs a plan on bases already moved by the plan's offsets.
///
/// # Safety
///
/// `dst`/`src` are the plan's bases of layouts satisfying [`copy_strided`]'s
/// contract, and no element of one shares a byte with an element of the
/// other. Where their byte ranges overlap, the call runs [`serially`] unless
/// [`loads_only_elements`] holds.
unsafe fn execute(plan: &CopyPlan, dst: *mut u8, src: *const u8) {
    let nt = plan.bytes() >= stream_threshold();
    // SAFETY: every arm forwards the caller's guarantees.
    unsafe {
        match plan.kind {
            PlanKind::Empty => {}
            PlanKind::Memcpy => memcpy_par(dst, src, plan.bytes(), plan.bytes() >= runs_stream_threshold(true)),
            PlanKind::Rows => rows(plan, dst, src, nt),
            PlanKind::Fill if plan.dims[0].dst == plan.elem_size as isize => fill_rows(plan, dst, src, nt),
            PlanKind::Fill | PlanKind::General => with_elem!(plan.elem_size, general(plan, dst, src, nt)),
            PlanKind::Transpose { src_fast } => with_elem!(plan.elem_size, transpose(plan, src_fast, dst, src, nt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::loads_only_elements;
    use crate::copy::plan::{BaseAddrs, PlanOptions, plan_copy};

    fn loads_only(shape: &[usize], dst: &[isize], src: &[isize]) -> bool {
        let bases = BaseAddrs { dst: 0, src: 4 };
        loads_only_elements(&plan_copy(shape, dst, src, 4, bases, PlanOptions::CPU).unwrap())
    }

    #[test]
    fn interleaved_copies_split_only_where_the_kernels_load_elements_alone() {
        // f32 views of one 4096 × 4096 buffer: even columns from odd ones,
        // the halves of rows, real parts from imaginary ones, a transposed
        // interleaving: element loops, rows, tiles.
        assert!(loads_only(&[4096, 2048], &[4096, 2], &[4096, 2]));
        assert!(loads_only(&[4096, 2048], &[4096, 1], &[4096, 1]));
        assert!(loads_only(&[1 << 23], &[2], &[2]));
        assert!(loads_only(&[2048, 2048], &[4096, 2], &[2, 4096]));
        // Every other element gathered into dense rows (whole vectors loaded,
        // the odd lanes dropped), and a transpose (whole lines): one thread.
        assert!(!loads_only(&[4096, 1024], &[4096, 1], &[4096, 2]));
        assert!(!loads_only(&[4096, 4096], &[4096, 1], &[1, 4096]));
    }
}
