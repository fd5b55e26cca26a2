//! The copy planner shared by every backend.
//!
//! A strided copy is described by one logical `shape`, a destination and a source
//! stride per dimension (in elements, signed; the source may use stride 0 to
//! broadcast) and an element size. [`plan_copy`] normalises that description
//! into a [`CopyPlan`] the way NumPy and PyTorch's `TensorIterator` do
//! (research notes §a.1):
//!
//! 1. strides are converted to **bytes** (checked), size-1 dimensions dropped;
//! 2. the destination is checked for internal overlap: sorted by stride, each
//!    stride clears the extent of the faster dims, or else an exact search
//!    shows no two elements share a byte (interleaved rows);
//! 3. negative destination strides are flipped: both base offsets move to the
//!    last element of that dimension and both strides are negated;
//! 4. dimensions are sorted by destination stride, fastest first (stable,
//!    ties broken on the source stride, then on the extent);
//! 5. neighbouring dimensions that are contiguous in *both* operands are
//!    coalesced;
//! 6. when the innermost dimension is unit-stride on both sides, the element is
//!    widened (two contiguous `u16` become one `u32`, a 12-byte row one 12-byte
//!    element, ...) as far as [`PlanOptions`] allow;
//! 7. the result is classified into a [`PlanKind`] *after* coalescing, so
//!    size-1 and stride-0 dimensions cannot fool the classification (a
//!    destination that does not nest is always [`PlanKind::General`]).
//!
//! Nothing here dereferences a pointer: base addresses are only taken as
//! `usize` for alignment checks, so the GPU backends reuse the planner as is.
//! Planning is `O(ndim²)` on inline [`SmallVec`]s: no allocation below nine
//! dimensions.

use smallvec::SmallVec;

use crate::error::{Error, Result};

/// Dimensions up to this count are kept inline (no heap allocation).
pub const INLINE_DIMS: usize = 8;

/// One dimension of a plan. Strides are in **bytes**.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanDim {
    /// Number of elements along this dimension (always ≥ 2 in a built plan,
    /// except the single dimension of a one-element copy).
    pub len: usize,
    /// Source stride in bytes (0 = broadcast, may be negative).
    pub src: isize,
    /// Destination stride in bytes (always > 0 in a built plan).
    pub dst: isize,
}

/// The dimensions of a plan, fastest destination dimension first.
pub type PlanDims = SmallVec<[PlanDim; INLINE_DIMS]>;

/// What kind of kernel a plan needs, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanKind {
    /// Nothing to copy (some extent is 0).
    Empty,
    /// One contiguous block: `dims` has one dimension with unit stride on
    /// both sides (`numel * elem_size` bytes, a plain `memcpy`).
    Memcpy,
    /// Every source stride is 0: one source element written everywhere.
    Fill,
    /// The innermost dimension is unit-stride on both sides: a loop of
    /// contiguous row copies over the outer dimensions.
    Rows,
    /// The fastest destination dimension (`dims[0]`, unit destination stride)
    /// differs from the fastest source dimension (`dims[src_fast]`, unit
    /// source stride), `dims[0]` is not broadcast, and both are long enough
    /// to tile: a blocked 2-D
    /// transpose, the other dimensions being a batch.
    Transpose {
        /// Index in [`CopyPlan::dims`] of the dimension with unit source stride.
        src_fast: usize,
    },
    /// Anything else: a gather ordered by the destination.
    General,
}

/// Knobs of the planner that differ between backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Largest element size (bytes) widening may produce; 1 disables widening
    /// beyond the original element size.
    pub max_widen: usize,
    /// Only widen when both base addresses and every outer byte stride are
    /// multiples of the widened size (GPUs need aligned vector accesses; a CPU
    /// executor using unaligned loads does not).
    pub require_alignment: bool,
    /// Only widen to powers of two. When `false`, a whole contiguous row of
    /// at most `max_widen` bytes becomes one element even when its size is not
    /// a power of two (12-byte rows become 12-byte elements).
    pub pow2_only: bool,
    /// Minimum extent of both tiled dimensions for [`PlanKind::Transpose`].
    pub transpose_min_extent: usize,
}

impl PlanOptions {
    /// Settings for GPU kernels: aligned, power-of-two widening up to 16 bytes,
    /// tiling from 16 elements on (cuTT's `MIN_TILED_DIM`).
    pub const GPU: Self = Self {
        max_widen: 16,
        require_alignment: true,
        pow2_only: true,
        transpose_min_extent: 16,
    };
    /// Settings for the CPU executor: unaligned loads, any row size up to 16
    /// bytes may become one element, and every transpose is tiled (its tile
    /// kernel handles short extents: a tile keeps the short dimension whole, so
    /// NHWC → NCHW with C = 3 still reads each source line once).
    pub const CPU: Self = Self {
        max_widen: 16,
        require_alignment: false,
        pow2_only: false,
        transpose_min_extent: 2,
    };
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self::GPU
    }
}

/// Base addresses of the two operands (of their logical element `[0, …, 0]`),
/// used only for alignment checks when widening.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BaseAddrs {
    /// Address of the destination's first logical element.
    pub dst: usize,
    /// Address of the source's first logical element.
    pub src: usize,
}

/// A normalised strided copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// Which kernel to run.
    pub kind: PlanKind,
    /// Element size in bytes after widening.
    pub elem_size: usize,
    /// Remaining dimensions, fastest destination stride first, byte strides.
    /// Empty only for [`PlanKind::Empty`].
    pub dims: PlanDims,
    /// Byte offset from the caller's source pointer to the plan's source base
    /// (non-zero when destination strides were flipped).
    pub src_offset: isize,
    /// Byte offset from the caller's destination pointer to the plan's
    /// destination base.
    pub dst_offset: isize,
    /// Number of (widened) elements copied.
    pub numel: usize,
    /// Byte range `[lo, hi)` touched in the source, relative to the caller's
    /// source pointer.
    pub src_span: (isize, isize),
    /// Byte range `[lo, hi)` written in the destination, relative to the
    /// caller's destination pointer.
    pub dst_span: (isize, isize),
}

impl CopyPlan {
    /// Total bytes written (`numel * elem_size`).
    pub fn bytes(&self) -> usize {
        // Cannot overflow: the destination span was computed with checked arithmetic.
        self.numel * self.elem_size
    }

    /// Number of elements along the outer dimensions (`dims[1..]`), i.e. the
    /// number of rows of length `dims[0].len`.
    pub fn outer_count(&self) -> usize {
        self.dims.iter().skip(1).map(|d| d.len).product()
    }
}

fn overflow(what: &'static str) -> Error {
    Error::Overflow { what }
}

fn check_lengths(shape: &[usize], strides: &[isize]) -> Result<()> {
    if strides.len() == shape.len() {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op: "copy",
            expected: vec![shape.len()],
            got: vec![strides.len()],
        })
    }
}

/// `true` when the half-open address ranges `a = [a.0, a.1)` and
/// `b = [b.0, b.1)` share a byte. Empty ranges overlap nothing.
pub(crate) fn ranges_overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// `true` when two views of `shape` at the same base address have the same
/// layout (strides equal wherever the length exceeds 1): a copy between them
/// moves each element onto itself.
pub(crate) fn same_layout(dst_base: usize, src_base: usize, shape: &[usize], dst: &[isize], src: &[isize]) -> bool {
    dst_base == src_base
        && shape
            .iter()
            .zip(dst.iter().zip(src))
            .all(|(&n, (a, b))| n == 1 || a == b)
}

/// Absolute address range `[base + span.0, base + span.1)`, checked.
pub(crate) fn absolute_range(base: usize, span: (isize, isize)) -> Result<(usize, usize)> {
    let lo = base
        .checked_add_signed(span.0)
        .ok_or_else(|| overflow("address range"))?;
    let hi = base
        .checked_add_signed(span.1)
        .ok_or_else(|| overflow("address range"))?;
    Ok((lo, hi))
}

fn insertion_sort_by_key<T: Copy, K: Ord>(v: &mut [T], key: impl Fn(&T) -> K) {
    for i in 1..v.len() {
        let x = v[i];
        let kx = key(&x);
        let mut j = i;
        while j > 0 && key(&v[j - 1]) > kx {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

/// Whether `dims` (byte strides ≥ 0, sorted ascending) nest: each stride is at
/// least the extent of the faster dims, element included. Every dense tensor's
/// permutations, slices, steps and flips do; such a layout addresses each
/// element once.
fn nests(dims: &[PlanDim], e: isize) -> bool {
    let mut extent = e;
    for d in dims {
        if d.dst == 0 || d.dst < extent {
            return false;
        }
        // Each dim's extent was checked in step 1, their sum was not: the
        // halves of the span are, and flipped dims fall in the lower one. A
        // sum past `isize::MAX` leaves the answer to the exact search.
        match extent.checked_add((d.len as isize - 1) * d.dst) {
            Some(x) => extent = x,
            None => return false,
        }
    }
    true
}

/// Steps the exact overlap search may take before [`addresses_may_repeat`]
/// gives up and answers "may" (about 150 µs on this project's 2-core VM; the
/// layouts met in practice need a few dozen steps).
const OVERLAP_SEARCH_BUDGET: u32 = 1 << 12;

/// Whether two distinct elements of a destination share a byte, for dims with
/// byte strides > 0 and lengths ≥ 2, sorted ascending: whether some integers
/// `xᵢ`, `|xᵢ| < lenᵢ`, not all 0, give `|Σ xᵢ·strideᵢ| < e`. That is the
/// bounded Diophantine problem NumPy's `solve_may_self_overlap` solves
/// (`numpy/_core/src/common/mem_overlap.c`); here a depth-first search from
/// the largest stride, where the faster dims can reach at most `Σ (lenⱼ −
/// 1)·strideⱼ` and so bound each `xᵢ` to a few values. `true` ("may") also
/// when the search runs past [`OVERLAP_SEARCH_BUDGET`].
fn addresses_may_repeat(dims: &[PlanDim], e: isize) -> bool {
    // reach[i]: the most the dims before i move an address (≤ the checked span).
    let mut reach: SmallVec<[i128; INLINE_DIMS]> = SmallVec::with_capacity(dims.len() + 1);
    reach.push(0);
    for d in dims {
        let r = reach[reach.len() - 1] + (d.len as i128 - 1) * d.dst as i128;
        reach.push(r);
    }
    let mut budget = OVERLAP_SEARCH_BUDGET;
    search_collision(dims, &reach, dims.len(), 0, false, e as i128, &mut budget).unwrap_or(true)
}

/// [`addresses_may_repeat`]'s search alone: `None` when it runs past `budget` steps.
#[cfg(test)]
fn search_within(dims: &[PlanDim], e: isize, mut budget: u32) -> Option<bool> {
    let mut reach = vec![0i128];
    for d in dims {
        reach.push(reach[reach.len() - 1] + (d.len as i128 - 1) * d.dst as i128);
    }
    search_collision(dims, &reach, dims.len(), 0, false, e as i128, &mut budget)
}

/// One level of [`addresses_may_repeat`]'s search: can the dims before `i`
/// bring the offset `t` into `(−e, e)` (with some `x` non-zero when `moved` is
/// false)? The first non-zero `x` is taken positive: a solution's negation is
/// one too. `None` when the budget is spent.
fn search_collision(
    dims: &[PlanDim],
    reach: &[i128],
    i: usize,
    t: i128,
    moved: bool,
    e: i128,
    budget: &mut u32,
) -> Option<bool> {
    if i == 0 {
        return Some(moved && t.abs() < e);
    }
    *budget = budget.checked_sub(1)?;
    let d = dims[i - 1];
    let (s, m) = (d.dst as i128, d.len as i128 - 1);
    // |t + x·s| must be below what the faster dims can still undo, plus e.
    let r = reach[i - 1] + e;
    let lo = ((-r - t).div_euclid(s) + 1).max(if moved { -m } else { 0 });
    let hi = (-(t - r).div_euclid(s) - 1).min(m); // ⌈(r − t)/s⌉ − 1
    for x in lo..=hi {
        if search_collision(dims, reach, i - 1, t + x * s, moved || x != 0, e, budget)? {
            return Some(true);
        }
    }
    Some(false)
}

/// Whether an element of the view at `dst_base` shares a byte with an element
/// of the view at `src_base`: both of `shape` elements of `e` bytes, strides
/// in elements. Exact where byte ranges alone are not: `t[::2]` and `t[1::2]`
/// span the same bytes and share none, and a copy between them needs no
/// temporary. NumPy decides such copies on the bounds alone
/// (`arrays_overlap`, `NPY_MAY_SHARE_BOUNDS`); this is its exact
/// `solve_may_share_memory` question, asked of a bounded search: `true`
/// ("may") also when a stride overflows or the search runs past
/// [`OVERLAP_SEARCH_BUDGET`].
pub(crate) fn views_may_share(
    dst_base: usize,
    dst: &[isize],
    src_base: usize,
    src: &[isize],
    shape: &[usize],
    e: usize,
) -> bool {
    if shape.contains(&0) {
        return false;
    }
    // Σ dᵢ·xᵢ − Σ sᵢ·yᵢ + (dst_base − src_base) within (−e, e), for
    // 0 ≤ xᵢ, yᵢ ≤ lenᵢ − 1. A negative coefficient c takes x = m − x′,
    // moving c·m into the constant: every term is then c·x with c > 0.
    // Lengths and strides are below 2^64 and e below 2^32 in any layout that
    // fits memory; a product or sum past i128 answers "may" all the same.
    let Ok(eb) = u32::try_from(e).map(i128::from) else {
        return true;
    };
    let mut t = dst_base as i128 - src_base as i128;
    let mut terms: SmallVec<[(i128, i128); 2 * INLINE_DIMS]> = SmallVec::new();
    for (i, &n) in shape.iter().enumerate() {
        let m = n as i128 - 1;
        if m == 0 {
            continue;
        }
        for c in [dst[i] as i128 * eb, -(src[i] as i128) * eb] {
            if c < 0 {
                match c.checked_mul(m).and_then(|x| t.checked_add(x)) {
                    Some(x) => t = x,
                    None => return true,
                }
            }
            if c != 0 {
                terms.push((c.abs(), m));
            }
        }
    }
    insertion_sort_by_key(&mut terms, |&(c, _)| c);
    // Terms of one coefficient are one term: x + y takes every value of
    // [0, m₁ + m₂]. The rows of both views, often of one stride, then cost
    // a few steps instead of one per row.
    let mut merged: SmallVec<[(i128, i128); 2 * INLINE_DIMS]> = SmallVec::new();
    for (c, m) in terms {
        match merged.last_mut() {
            Some(last) if last.0 == c => last.1 += m,
            _ => merged.push((c, m)),
        }
    }
    let terms = merged;
    let mut reach: SmallVec<[i128; 2 * INLINE_DIMS]> = SmallVec::with_capacity(terms.len() + 1);
    reach.push(0);
    for &(c, m) in &terms {
        match c.checked_mul(m).and_then(|x| x.checked_add(reach[reach.len() - 1])) {
            Some(r) => reach.push(r),
            None => return true,
        }
    }
    let mut budget = OVERLAP_SEARCH_BUDGET;
    search_meeting(&terms, &reach, terms.len(), t, eb, &mut budget).unwrap_or(true)
}

/// One level of [`views_may_share`]'s search: can the terms before `i` (each
/// `c·x`, `0 ≤ x ≤ m`, sorted by `c`) bring `v` into `(−e, e)`? `None` when the
/// budget is spent.
fn search_meeting(
    terms: &[(i128, i128)],
    reach: &[i128],
    i: usize,
    v: i128,
    e: i128,
    budget: &mut u32,
) -> Option<bool> {
    if i == 0 {
        return Some(v.abs() < e);
    }
    *budget = budget.checked_sub(1)?;
    let (c, m) = terms[i - 1];
    // v + c·x < e, and v + c·x + reach[i − 1] > −e.
    let hi = (e - v - 1).div_euclid(c).min(m);
    let lo = ((-e - v - reach[i - 1]).div_euclid(c) + 1).max(0);
    for x in lo..=hi {
        if search_meeting(terms, reach, i - 1, v + c * x, e, budget)? {
            return Some(true);
        }
    }
    Some(false)
}

/// Plans a copy of `shape` elements of `elem_size` bytes.
///
/// `dst_strides` and `src_strides` are in elements (signed; the source may use
/// 0 to broadcast). `bases` are only used for the alignment check of
/// widening. Errors: [`Error::ShapeMismatch`] when a stride slice's length
/// differs from `shape`'s, [`Error::InvalidLayout`] for `elem_size == 0`,
/// [`Error::OverlappingDestination`] when the destination (with more than one
/// element) may address an element twice, [`Error::Overflow`] when a byte
/// stride, an extent or the element count overflows.
pub fn plan_copy(
    shape: &[usize],
    dst_strides: &[isize],
    src_strides: &[isize],
    elem_size: usize,
    bases: BaseAddrs,
    opts: PlanOptions,
) -> Result<CopyPlan> {
    plan(shape, dst_strides, src_strides, elem_size, bases, opts, true)
}

/// [`plan_copy`]; `split_misaligned`: whether elements not naturally aligned
/// may become several aligned units (not for fills, whose value is one element).
fn plan(
    shape: &[usize],
    dst_strides: &[isize],
    src_strides: &[isize],
    elem_size: usize,
    bases: BaseAddrs,
    opts: PlanOptions,
    split_misaligned: bool,
) -> Result<CopyPlan> {
    check_lengths(shape, dst_strides)?;
    check_lengths(shape, src_strides)?;
    if elem_size == 0 {
        return Err(Error::InvalidArgument {
            op: "copy",
            reason: "the element size must be at least one byte".into(),
        });
    }
    let e = isize::try_from(elem_size).map_err(|_| overflow("element size"))?;
    let n = crate::layout::numel(shape)?;
    let mut plan = CopyPlan {
        kind: PlanKind::Empty,
        elem_size,
        dims: PlanDims::new(),
        src_offset: 0,
        dst_offset: 0,
        numel: n,
        src_span: (0, 0),
        dst_span: (0, 0),
    };
    if n == 0 {
        return Ok(plan);
    }

    // 1. Byte strides and spans (checked), size-1 dims dropped, negative
    //    destination strides flipped. One pass, no allocation.
    let ovf = |what| move || overflow(what);
    let (mut dlo, mut dhi, mut slo, mut shi) = (0isize, e, 0isize, e);
    let mut dims = PlanDims::new();
    for ((&len, &d), &s) in shape.iter().zip(dst_strides).zip(src_strides) {
        if len == 1 {
            continue;
        }
        let d = d.checked_mul(e).ok_or_else(ovf("byte stride"))?;
        let s = s.checked_mul(e).ok_or_else(ovf("byte stride"))?;
        let last = isize::try_from(len - 1).map_err(|_| overflow("extent"))?;
        let de = last.checked_mul(d).ok_or_else(ovf("extent"))?;
        let se = last.checked_mul(s).ok_or_else(ovf("extent"))?;
        if de < 0 {
            dlo = dlo.checked_add(de).ok_or_else(ovf("extent"))?;
        } else {
            dhi = dhi.checked_add(de).ok_or_else(ovf("extent"))?;
        }
        if se < 0 {
            slo = slo.checked_add(se).ok_or_else(ovf("extent"))?;
        } else {
            shi = shi.checked_add(se).ok_or_else(ovf("extent"))?;
        }
        let mut dim = PlanDim { len, src: s, dst: d };
        if d < 0 {
            // Partial sums of the checked extents: no overflow.
            plan.dst_offset += de;
            plan.src_offset += se;
            dim.dst = -d;
            dim.src = -s;
        }
        dims.push(dim);
    }
    plan.dst_span = (dlo, dhi);
    plan.src_span = (slo, shi);

    // 2. Sort by destination stride, fastest first (stable), then check the
    //    destination for internal overlap. Nearly every layout nests: each
    //    stride clears the extent of the faster dims. One that does not
    //    (rows interleaved with rows: shape (2, 3), strides (3, 2)) may still
    //    address distinct elements, as NumPy and torch let one write; an exact
    //    search decides, and such a layout goes to the general kernel, whose
    //    every store is one of its elements.
    insertion_sort_by_key(&mut dims, |d| (d.dst, d.src.unsigned_abs(), d.len));
    let nested = nests(&dims, e);
    if !nested && (dims.iter().any(|d| d.dst == 0) || addresses_may_repeat(&dims, e)) {
        return Err(Error::OverlappingDestination);
    }

    // 3. Coalesce dims contiguous in both operands, in place.
    let mut k = 0;
    for i in 0..dims.len() {
        let dim = dims[i];
        if i > 0 {
            let last = &mut dims[k - 1];
            let l = last.len as isize; // the product of lens is ≤ numel, no overflow
            if l.checked_mul(last.dst) == Some(dim.dst) && l.checked_mul(last.src) == Some(dim.src) {
                last.len *= dim.len;
                continue;
            }
        }
        dims[k] = dim;
        k += 1;
    }
    dims.truncate(k);
    let mut elem = elem_size;

    // 4. Widen when the innermost dim is unit-stride on both sides.
    if let Some(&d0) = dims.first()
        && d0.src == e
        && d0.dst == e
        && d0.len > 1
    {
        let row = d0.len * elem_size; // ≤ dst span, no overflow
        let src_base = bases.src.wrapping_add_signed(plan.src_offset);
        let dst_base = bases.dst.wrapping_add_signed(plan.dst_offset);
        let aligned = |w: usize| {
            !opts.require_alignment
                || (src_base.is_multiple_of(w)
                    && dst_base.is_multiple_of(w)
                    && dims[1..]
                        .iter()
                        .all(|d| d.src.unsigned_abs() % w == 0 && d.dst.unsigned_abs() % w == 0))
        };
        let mut w = 0;
        if !opts.pow2_only && row <= opts.max_widen && aligned(row) {
            w = row;
        } else {
            let mut cand = opts.max_widen.min(row).max(1);
            cand = 1 << (usize::BITS - 1 - cand.leading_zeros()); // largest power of two ≤
            while cand > elem_size {
                if row.is_multiple_of(cand) && aligned(cand) {
                    w = cand;
                    break;
                }
                cand /= 2;
            }
        }
        if w > elem_size {
            let wi = w as isize;
            if row == w {
                dims.remove(0);
            } else {
                dims[0] = PlanDim {
                    len: row / w,
                    src: wi,
                    dst: wi,
                };
            }
            elem = w;
            plan.numel = plan.numel * elem_size / w;
        }
    }
    // 4b. GPU kernels access an element with its natural alignment, but a foreign
    //     buffer may place it anywhere (a complex128 at any 8-byte boundary through
    //     DLPack's byte_offset): split elements into the largest aligned unit.
    if opts.require_alignment && split_misaligned {
        let src_base = bases.src.wrapping_add_signed(plan.src_offset);
        let dst_base = bases.dst.wrapping_add_signed(plan.dst_offset);
        let bits = dims.iter().fold(elem | src_base | dst_base, |g, d| {
            g | d.src.unsigned_abs() | d.dst.unsigned_abs()
        });
        let unit = 1usize << bits.trailing_zeros();
        if unit < elem {
            let u = unit as isize;
            let parts = elem / unit;
            match dims.first_mut() {
                // The old innermost dim was contiguous: the units extend it.
                Some(d0) if d0.src == elem as isize && d0.dst == elem as isize => {
                    d0.len *= parts;
                    d0.src = u;
                    d0.dst = u;
                }
                _ => dims.insert(
                    0,
                    PlanDim {
                        len: parts,
                        src: u,
                        dst: u,
                    },
                ),
            }
            plan.numel *= parts;
            elem = unit;
        }
    }
    plan.elem_size = elem;
    let e = elem as isize;
    if dims.is_empty() {
        dims.push(PlanDim { len: 1, src: e, dst: e });
    }

    // 5. Classify.
    let min = opts.transpose_min_extent.max(2);
    plan.kind = if !nested {
        PlanKind::General
    } else if dims.len() == 1 && dims[0].src == e && dims[0].dst == e {
        PlanKind::Memcpy
    } else if dims.iter().all(|d| d.src == 0) {
        PlanKind::Fill
    } else if dims[0].src == e && dims[0].dst == e {
        PlanKind::Rows
    } else if let Some(k) = (1..dims.len()).find(|&k| dims[k].src == e)
        && dims[0].dst == e
        && dims[0].src != 0
        && dims[0].len >= min
        && dims[k].len >= min
    {
        PlanKind::Transpose { src_fast: k }
    } else {
        PlanKind::General
    };
    plan.dims = dims;
    Ok(plan)
}

/// Plans a fill of `shape` elements of `elem_size` bytes: a copy from a
/// fully broadcast source (every source stride 0).
pub fn plan_fill(
    shape: &[usize],
    dst_strides: &[isize],
    elem_size: usize,
    dst_addr: usize,
    opts: PlanOptions,
) -> Result<CopyPlan> {
    let zeros: SmallVec<[isize; INLINE_DIMS]> = SmallVec::from_elem(0, shape.len());
    plan(
        shape,
        dst_strides,
        &zeros,
        elem_size,
        BaseAddrs { dst: dst_addr, src: 0 },
        opts,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(shape: &[usize]) -> Vec<isize> {
        let mut s = vec![0isize; shape.len()];
        let mut acc = 1isize;
        for i in (0..shape.len()).rev() {
            s[i] = acc;
            acc *= shape[i] as isize;
        }
        s
    }

    fn permute<T: Copy>(v: &[T], perm: &[usize]) -> Vec<T> {
        perm.iter().map(|&p| v[p]).collect()
    }

    fn plan(shape: &[usize], dst: &[isize], src: &[isize], e: usize) -> CopyPlan {
        super::plan_copy(shape, dst, src, e, BaseAddrs::default(), PlanOptions::GPU).unwrap()
    }

    #[test]
    fn contiguous_is_memcpy() {
        let shape = [4, 5, 6];
        let s = contiguous(&shape);
        let p = plan(&shape, &s, &s, 4);
        assert_eq!(p.kind, PlanKind::Memcpy);
        // 120 f32 = 480 bytes, widened to 16-byte elements.
        assert_eq!(p.elem_size, 16);
        assert_eq!(p.dims.len(), 1);
        assert_eq!(p.dims[0].len * p.elem_size, 480);
        assert_eq!(p.bytes(), 480);
    }

    #[test]
    fn identical_dense_permutation_is_memcpy() {
        // Both operands channels-last: the same permutation of a dense layout.
        let shape = [2, 3, 4, 5];
        let s = contiguous(&[2, 4, 5, 3]);
        let strides = [s[0], s[3], s[1], s[2]];
        let p = plan(&shape, &strides, &strides, 2);
        assert_eq!(p.kind, PlanKind::Memcpy);
        assert_eq!(p.bytes(), 2 * 3 * 4 * 5 * 2);
    }

    #[test]
    fn transpose_is_classified() {
        let src = contiguous(&[64, 32]);
        let p = plan(&[32, 64], &contiguous(&[32, 64]), &[src[1], src[0]], 4);
        assert_eq!(p.kind, PlanKind::Transpose { src_fast: 1 });
        assert_eq!(p.elem_size, 4);
        assert_eq!(
            p.dims[0],
            PlanDim {
                len: 64,
                src: 32 * 4,
                dst: 4
            }
        );
        assert_eq!(
            p.dims[1],
            PlanDim {
                len: 32,
                src: 4,
                dst: 64 * 4
            }
        );
    }

    #[test]
    fn batched_transpose_and_small_extent() {
        // [B, M, N] -> perm (0, 2, 1)
        let s = contiguous(&[8, 40, 50]);
        let p = plan(&[8, 50, 40], &contiguous(&[8, 50, 40]), &permute(&s, &[0, 2, 1]), 4);
        assert_eq!(p.kind, PlanKind::Transpose { src_fast: 1 });
        assert_eq!(p.dims.len(), 3);
        // Extent 3 on the dst-fastest dim is too short to tile (NCHW -> NHWC, C = 3).
        let s = contiguous(&[2, 3, 20, 20]);
        let p = plan(
            &[2, 20, 20, 3],
            &contiguous(&[2, 20, 20, 3]),
            &permute(&s, &[0, 2, 3, 1]),
            4,
        );
        assert_eq!(p.kind, PlanKind::General);
        // H and W coalesce in both operands.
        assert_eq!(p.dims.len(), 3);
        assert_eq!(p.dims[1].len, 400);
    }

    #[test]
    fn n11_is_not_a_transpose() {
        // ROCm/pytorch #1993: (n, 1, 1) tensors must not reach the transpose kernel.
        let p = plan(&[100, 1, 1], &[1, 1, 1], &[1, 7, 3], 4);
        assert_eq!(p.kind, PlanKind::Memcpy);
    }

    #[test]
    fn size_one_dims_dropped() {
        let p = plan(&[1, 7, 1, 9, 1], &[999, 9, -5, 1, 0], &[3, 1, 77, 7, 0], 8);
        assert_eq!(p.kind, PlanKind::General);
        assert_eq!(
            p.dims.as_slice(),
            &[
                PlanDim {
                    len: 9,
                    src: 56,
                    dst: 8
                },
                PlanDim {
                    len: 7,
                    src: 8,
                    dst: 72
                }
            ]
        );
    }

    #[test]
    fn negative_dst_flip() {
        // dst walks backwards, src forwards: after the flip the dst is forward,
        // the src backwards, and the bases move to the last element.
        let p = plan(&[10], &[-1], &[1], 4);
        assert_eq!(p.kind, PlanKind::General);
        assert_eq!(p.dst_offset, -36);
        assert_eq!(p.src_offset, 36);
        assert_eq!(
            p.dims[0],
            PlanDim {
                len: 10,
                src: -4,
                dst: 4
            }
        );
        assert_eq!(p.dst_span, (-36, 4));
        // Both reversed: a plain memcpy from the flipped bases.
        let p = plan(&[10], &[-1], &[-1], 4);
        assert_eq!(p.kind, PlanKind::Memcpy);
        assert_eq!((p.dst_offset, p.src_offset), (-36, -36));
    }

    #[test]
    fn broadcast_is_fill_and_rows() {
        let p = plan(&[30, 40], &contiguous(&[30, 40]), &[0, 0], 4);
        assert_eq!(p.kind, PlanKind::Fill);
        assert_eq!(p.dims.len(), 1);
        assert_eq!(p.dims[0].len, 1200);
        // [1, N] -> [M, N]: rows copied from the same source row.
        let p = plan(&[30, 40], &contiguous(&[30, 40]), &[0, 1], 4);
        assert_eq!(p.kind, PlanKind::Rows);
        assert_eq!(
            p.dims[1],
            PlanDim {
                len: 30,
                src: 0,
                dst: 160
            }
        );
        // [M, 1] -> [M, N]: a per-row fill.
        let p = plan(&[30, 40], &contiguous(&[30, 40]), &[1, 0], 4);
        assert_eq!(p.kind, PlanKind::General);
        assert_eq!(
            p.dims[0],
            PlanDim {
                len: 40,
                src: 0,
                dst: 4
            }
        );
        let p = plan_fill(&[3, 4], &[4, 1], 2, 0, PlanOptions::CPU).unwrap();
        assert_eq!(p.kind, PlanKind::Fill);
    }

    #[test]
    fn gpu_plans_split_misaligned_elements_into_aligned_units() {
        // complex128 (16 bytes) at an 8-byte boundary: 8-byte units, twice as many.
        let bases = BaseAddrs {
            dst: 4096,
            src: 4096 + 8,
        };
        let p = plan_copy(&[10, 3], &[3, 1], &[1, 10], 16, bases, PlanOptions::GPU).unwrap();
        assert_eq!(p.elem_size, 8);
        assert_eq!(p.numel, 60);
        assert_eq!(p.dims[0], PlanDim { len: 2, src: 8, dst: 8 });
        // Contiguous rows: the units extend the row instead of adding a dim.
        let p = plan_copy(&[4, 5], &[5, 1], &[6, 1], 16, bases, PlanOptions::GPU).unwrap();
        assert_eq!(p.elem_size, 8);
        assert_eq!(
            p.dims[0],
            PlanDim {
                len: 10,
                src: 8,
                dst: 8
            }
        );
        // A 2-byte-aligned float32 view: 2-byte units.
        let odd = BaseAddrs {
            dst: 4096,
            src: 4096 + 2,
        };
        let p = plan_copy(&[7], &[1], &[3], 4, odd, PlanOptions::GPU).unwrap();
        assert_eq!(p.elem_size, 2);
        assert_eq!(p.numel, 14);
        // Aligned: nothing changes; the CPU planner never splits.
        let p = plan_copy(
            &[10, 3],
            &[3, 1],
            &[1, 10],
            16,
            BaseAddrs { dst: 0, src: 16 },
            PlanOptions::GPU,
        )
        .unwrap();
        assert_eq!(p.elem_size, 16);
        let p = plan_copy(&[10, 3], &[3, 1], &[1, 10], 16, bases, PlanOptions::CPU).unwrap();
        assert_eq!(p.elem_size, 16);
    }

    #[test]
    fn widening() {
        // [M, N, 2] u16, perm (1, 0, 2): pairs of u16 become u32, a transpose.
        let s = contiguous(&[64, 32, 2]);
        let p = plan(&[32, 64, 2], &contiguous(&[32, 64, 2]), &permute(&s, &[1, 0, 2]), 2);
        assert_eq!(p.elem_size, 4);
        assert_eq!(p.kind, PlanKind::Transpose { src_fast: 1 });
        // Misaligned base: the GPU planner refuses, the CPU planner does not care.
        let b = BaseAddrs { dst: 0, src: 2 };
        let p = plan_copy(
            &[32, 64, 2],
            &contiguous(&[32, 64, 2]),
            &permute(&s, &[1, 0, 2]),
            2,
            b,
            PlanOptions::GPU,
        )
        .unwrap();
        assert_eq!(p.elem_size, 2);
        assert_eq!(p.kind, PlanKind::Rows);
        let p = plan_copy(
            &[32, 64, 2],
            &contiguous(&[32, 64, 2]),
            &permute(&s, &[1, 0, 2]),
            2,
            b,
            PlanOptions::CPU,
        )
        .unwrap();
        assert_eq!(p.elem_size, 4);
        // Sliced rows of 3 f32: 12-byte elements on the CPU, rows on the GPU.
        let p = plan_copy(&[100, 3], &[3, 1], &[10, 1], 4, BaseAddrs::default(), PlanOptions::CPU).unwrap();
        assert_eq!((p.kind, p.elem_size), (PlanKind::General, 12));
        let p = plan(&[100, 3], &[3, 1], &[10, 1], 4);
        assert_eq!((p.kind, p.elem_size), (PlanKind::Rows, 4));
        // Rows of 64 f16 with 16-byte aligned strides widen to 16-byte elements.
        let p = plan(&[10, 64], &[64, 1], &[128, 1], 2);
        assert_eq!((p.kind, p.elem_size), (PlanKind::Rows, 16));
        assert_eq!(p.dims[0].len, 8);
        // Outer stride not a multiple of 16 bytes: widen to 4 only.
        let p = plan(&[10, 64], &[64, 1], &[66, 1], 2);
        assert_eq!((p.kind, p.elem_size), (PlanKind::Rows, 4));
    }

    /// Whether two distinct elements of the layout share a byte, by listing
    /// every element's address.
    fn brute_force_overlap(shape: &[usize], strides: &[isize], e: usize) -> bool {
        let mut addrs = vec![0isize];
        for (&len, &s) in shape.iter().zip(strides) {
            addrs = addrs
                .iter()
                .flat_map(|&a| (0..len as isize).map(move |i| a + i * s * e as isize))
                .collect();
        }
        addrs.sort_unstable();
        addrs.windows(2).any(|w| w[1] - w[0] < e as isize)
    }

    fn overlaps(shape: &[usize], strides: &[isize], e: usize) -> bool {
        let zeros = vec![0; shape.len()];
        match plan_copy(shape, strides, &zeros, e, BaseAddrs::default(), PlanOptions::CPU) {
            Ok(_) => false,
            Err(Error::OverlappingDestination) => true,
            Err(err) => panic!("{shape:?} {strides:?}: {err}"),
        }
    }

    #[test]
    fn overlap_detection() {
        // Stride 0 on a real dim.
        assert!(overlaps(&[4, 5], &[0, 1], 4));
        // Rows overlap: rows of 5 start 2 elements apart.
        assert!(overlaps(&[4, 5], &[2, 1], 4));
        // Dims whose extents sum past isize::MAX (each one's fits): elements
        // [0, 1, 1] and [0, 0, 0] share address 0; the rule's sum used to overflow.
        let far = 1isize << 62;
        assert!(overlaps(&[2, 2, 2], &[-(far - 1), far, -far], 1));
        // Dense, transposed, sliced, flipped: no overlap.
        assert!(!overlaps(&[4, 5], &[5, 1], 4));
        assert!(!overlaps(&[5, 4], &[1, 5], 4));
        assert!(!overlaps(&[2, 5], &[-10, 2], 4));
        assert!(overlaps(&[3, 1, 2], &[0, 0, 1], 4));
        assert!(!overlaps(&[1, 1, 2], &[0, 0, 1], 4));
        assert!(!overlaps(&[0, 5], &[0, 0], 4));
        // Interleaved rows of distinct elements (0 2 4 / 3 5 7), as NumPy and
        // torch write them: a general plan.
        assert!(!overlaps(&[2, 3], &[3, 2], 4));
        let p = plan_copy(&[2, 3], &[3, 2], &[3, 1], 4, BaseAddrs::default(), PlanOptions::CPU).unwrap();
        assert_eq!(p.kind, PlanKind::General);
        // ... and ones that collide (0 2 4 / 2 4 6; 0 3 6 / 2 5 8 / 4 7 10 / 6).
        assert!(overlaps(&[2, 3], &[2, 2], 4));
        assert!(overlaps(&[4, 3], &[2, 3], 1));
        let e = plan_copy(&[3, 3], &[1, 1], &[3, 1], 4, BaseAddrs::default(), PlanOptions::CPU);
        assert!(matches!(e, Err(Error::OverlappingDestination)));
        // One element: never overlaps.
        assert!(plan_copy(&[1, 1], &[0, 0], &[0, 0], 4, BaseAddrs::default(), PlanOptions::CPU).is_ok());
        assert!(ranges_overlap((0, 10), (9, 20)));
        assert!(!ranges_overlap((0, 10), (10, 20)));
        assert!(!ranges_overlap((5, 5), (0, 20)));
    }

    /// The planner refuses exactly the layouts where two elements share a
    /// byte: every layout of up to three dims of lengths 1–4, strides −7..=7
    /// and elements of 1–3 bytes, against the listed addresses.
    #[test]
    fn overlap_detection_is_exact() {
        let mut checked = (0, 0);
        for ndim in 1..=3usize {
            let combos = (4 * 15usize).pow(ndim as u32);
            for mut c in 0..combos {
                let mut shape = vec![0; ndim];
                let mut strides = vec![0; ndim];
                for k in 0..ndim {
                    shape[k] = c % 4 + 1;
                    strides[k] = (c / 4 % 15) as isize - 7;
                    c /= 60;
                }
                for e in 1..=3 {
                    let expected = brute_force_overlap(&shape, &strides, e);
                    assert_eq!(overlaps(&shape, &strides, e), expected, "{shape:?} {strides:?} e={e}");
                    if expected {
                        checked.0 += 1;
                    } else {
                        checked.1 += 1;
                    }
                }
            }
        }
        // Both answers were exercised, many times.
        assert!(checked.0 > 10_000 && checked.1 > 10_000, "{checked:?}");
    }

    /// A search past its budget answers "may overlap" rather than running
    /// on: 40 dims of two elements with pseudo-random 41-bit strides have
    /// 3^40 sign patterns to try (an unbounded search would not end), and
    /// the budget is what ends it.
    #[test]
    fn overlap_search_is_bounded() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let strides: Vec<isize> = (0..40)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((1u64 << 40) | (x >> 24)) as isize
            })
            .collect();
        assert!(overlaps(&[2; 40], &strides, 1));
        let mut dims: Vec<PlanDim> = strides.iter().map(|&s| PlanDim { len: 2, src: 0, dst: s }).collect();
        dims.sort_by_key(|d| d.dst);
        assert_eq!(search_within(&dims, 1, OVERLAP_SEARCH_BUDGET), None);
        // With room, the same search answers (a small layout, exactly).
        let small = [PlanDim { len: 3, src: 0, dst: 2 }, PlanDim { len: 2, src: 0, dst: 3 }];
        assert_eq!(search_within(&small, 1, OVERLAP_SEARCH_BUDGET), Some(false));
    }

    /// Element addresses (in bytes, from the view's base) of a layout.
    fn element_addresses(shape: &[usize], strides: &[isize], e: usize) -> Vec<isize> {
        let mut addrs = vec![0isize];
        for (&len, &s) in shape.iter().zip(strides) {
            addrs = addrs
                .iter()
                .flat_map(|&a| (0..len as isize).map(move |i| a + i * s * e as isize))
                .collect();
        }
        addrs
    }

    #[test]
    fn views_may_share_is_exact() {
        // Every pair of layouts of up to 2 dims, lengths 1–3, strides −3..3,
        // the source's base −4..4 bytes from the destination's, elements of
        // 1–2 bytes, against the listed addresses.
        let mut layouts: Vec<(Vec<usize>, Vec<isize>)> = vec![];
        for n0 in 1..=3usize {
            for s0 in -3..=3isize {
                layouts.push((vec![n0], vec![s0]));
                for n1 in 1..=3usize {
                    for s1 in -3..=3isize {
                        layouts.push((vec![n0, n1], vec![s0, s1]));
                    }
                }
            }
        }
        let (mut shared, mut apart) = (0, 0);
        for e in 1..=2usize {
            for (shape, ds) in &layouts {
                let da = element_addresses(shape, ds, e);
                for (_, ss) in layouts.iter().filter(|(s, _)| s == shape) {
                    let sa = element_addresses(shape, ss, e);
                    for off in -4..=4isize {
                        let truth = da
                            .iter()
                            .any(|&a| sa.iter().any(|&b| (a - (b + off)).abs() < e as isize));
                        let got = views_may_share(1000, ds, (1000 + off) as usize, ss, shape, e);
                        assert_eq!(got, truth, "shape {shape:?} dst {ds:?} src {ss:?} +{off} e {e}");
                        if truth { shared += 1 } else { apart += 1 }
                    }
                }
            }
        }
        assert!(shared > 10_000 && apart > 10_000, "{shared} shared, {apart} apart");
    }

    #[test]
    fn views_may_share_answers_the_common_cases_within_budget() {
        let f = 4; // f32, a 4096 × 4096 tensor at 0
        let rows = [4096isize, 2];
        // Its even and odd columns: interleaved, no byte in common.
        assert!(!views_may_share(0, &rows, f, &rows, &[4096, 2048], f));
        // Real and imaginary parts of complex pairs.
        assert!(!views_may_share(0, &[2], f, &[2], &[1 << 20], f));
        // The left and right halves of each row: byte ranges overlap, rows do not.
        assert!(!views_may_share(0, &[4096, 1], 2048 * f, &[4096, 1], &[4096, 2048], f));
        // A shift by one element, the transpose, the flip: shared.
        assert!(views_may_share(f, &[4096, 1], 0, &[4096, 1], &[4096, 4095], f));
        assert!(views_may_share(0, &[4096, 1], 0, &[1, 4096], &[4096, 4096], f));
        assert!(views_may_share(0, &[1], 4095 * f, &[-1], &[4096], f));
        // A source a byte into the destination's elements.
        assert!(views_may_share(0, &[2], 1, &[2], &[8], f));
        // A broadcast source inside the destination, and beside it.
        assert!(views_may_share(0, &[1], 8 * f, &[0], &[16], f));
        assert!(!views_may_share(0, &[2], f, &[0], &[16], f));
        // Empty views share nothing.
        assert!(!views_may_share(0, &[1], 0, &[1], &[0], f));
    }

    #[test]
    fn overflow_is_an_error() {
        let big = usize::MAX / 2;
        let e = plan_copy(&[big, 4], &[4, 1], &[4, 1], 1, BaseAddrs::default(), PlanOptions::CPU);
        assert!(matches!(e, Err(Error::Overflow { .. })));
        let e = plan_copy(&[2], &[isize::MAX / 2], &[1], 4, BaseAddrs::default(), PlanOptions::CPU);
        assert!(matches!(e, Err(Error::Overflow { .. })));
        let e = plan_copy(
            &[1 << 40, 1 << 30],
            &[1 << 30, 1],
            &[1, 1 << 40],
            1,
            BaseAddrs::default(),
            PlanOptions::CPU,
        );
        assert!(matches!(e, Err(Error::Overflow { .. })));
        assert!(matches!(
            plan_copy(&[2], &[1, 1], &[1], 4, BaseAddrs::default(), PlanOptions::CPU),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            plan_copy(&[2], &[1], &[1], 0, BaseAddrs::default(), PlanOptions::CPU),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn empty() {
        let p = plan(&[3, 0, 2], &[0, 0, 0], &[1, 1, 1], 4);
        assert_eq!(p.kind, PlanKind::Empty);
    }
}
