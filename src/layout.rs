//! Shape, stride and offset arithmetic. Pure functions, every product checked.
//!
//! Strides are counted in elements and may be negative (flipped views) or zero
//! (broadcast views). Offsets of a view are relative to element `[0, 0, ..]`.

use smallvec::SmallVec;

use crate::error::{Error, Result};

/// Dims a [`Shape`] and [`Strides`] hold inline (most tensors have at most 5).
/// Five keep a [`Tensor`](crate::Tensor) within 128 bytes, which the compiler
/// moves inline rather than through a `memcpy` call: a Python `empty((16,))`
/// moves its tensor three times.
const SHAPE_INLINE_DIMS: usize = 5;

/// Inline storage for shapes (five dims inline).
pub type Shape = SmallVec<[usize; SHAPE_INLINE_DIMS]>;
/// Inline storage for strides, in elements.
pub type Strides = SmallVec<[isize; SHAPE_INLINE_DIMS]>;

/// Most dimensions a tensor may have (the DLPack import limit as well).
pub const MAX_NDIM: usize = 64;

/// `Err(TooManyDimensions)` when a tensor of `ndim` dimensions would pass [`MAX_NDIM`].
pub fn check_ndim(ndim: usize) -> Result<()> {
    if ndim > MAX_NDIM {
        return Err(Error::TooManyDimensions { ndim, max: MAX_NDIM });
    }
    Ok(())
}

/// Number of elements, `Err(Overflow)` when it does not fit `isize`, or when
/// a dimension does not (DLPack's shapes are `int64_t`, and a view may
/// reorder the dimensions of an empty tensor, so each one is bounded, not
/// only their product). Zero when any dimension is, whatever the others.
#[inline]
pub fn numel(shape: &[usize]) -> Result<usize> {
    const MAX: usize = isize::MAX as usize;
    // `let … else`, not `ok_or`: no error value built (and dropped) on the
    // way that succeeds, which every allocation takes.
    let Some(n) = shape.iter().try_fold(
        1usize,
        |acc, &d| if d > MAX { None } else { Some(acc.saturating_mul(d)) },
    ) else {
        return Err(Error::Overflow {
            what: "a dimension's size",
        });
    };
    // Saturated, and zero from a zero dimension on.
    if n > MAX {
        return Err(Error::Overflow {
            what: "number of elements",
        });
    }
    Ok(n)
}

/// The bytes of `shape`'s elements of `elem_size` bytes, checked: at most
/// `isize::MAX`, as every tensor's are (so `Tensor::nbytes` cannot overflow,
/// even for a broadcast view whose elements share a few bytes).
#[inline]
pub fn nbytes(shape: &[usize], elem_size: usize) -> Result<usize> {
    match numel(shape)?.checked_mul(elem_size) {
        Some(n) if n <= isize::MAX as usize => Ok(n),
        _ => Err(Error::Overflow { what: "size in bytes" }),
    }
}

/// Row-major (C-contiguous) strides for `shape`.
#[inline]
pub fn contiguous_strides(shape: &[usize]) -> Result<Strides> {
    if shape.len() <= SHAPE_INLINE_DIMS {
        // Without `SmallVec::from_elem`, whose `memset` call (and the store
        // forwarding stalls of its wide stores when the strides are moved
        // right after) were a tenth of `devtensor.empty((16,))`.
        let mut buf = [0isize; SHAPE_INLINE_DIMS];
        let acc = strides_into(&mut buf[..shape.len()], shape)?;
        check_stride_bound(acc)?;
        return Ok(Strides::from_buf_and_len(buf, shape.len()));
    }
    let mut strides: Strides = SmallVec::from_elem(0, shape.len());
    let acc = strides_into(&mut strides, shape)?;
    check_stride_bound(acc)?;
    Ok(strides)
}

/// Writes `shape`'s row-major strides into `strides` (as long as `shape`);
/// returns the first dim's stride.
#[inline(always)]
fn strides_into(strides: &mut [isize], shape: &[usize]) -> Result<usize> {
    let mut acc: usize = 1;
    for (k, (s, &d)) in strides.iter_mut().zip(shape).enumerate().rev() {
        // Checked once, after the loop: `acc` only grows, so the last value
        // (the first dim's stride) bounds every stride.
        *s = acc as isize;
        if k == 0 {
            // Not the product of every size: no stride (an empty tensor of
            // `[2⁶², 2⁶², 0]` has strides `[2⁶², 1, 1]`).
            break;
        }
        // A zero-sized dim makes later products zero; keep the stride meaningful.
        let Some(next) = acc.checked_mul(d.max(1)) else {
            return Err(Error::Overflow { what: "strides" });
        };
        acc = next;
    }
    Ok(acc)
}

/// The largest stride of a row-major layout fits an `isize`.
#[inline(always)]
fn check_stride_bound(acc: usize) -> Result<()> {
    if acc > isize::MAX as usize {
        return Err(Error::Overflow { what: "strides" });
    }
    Ok(())
}

/// Smallest and largest element offset (relative to element 0) a view touches.
/// `None` for an empty view.
pub fn offset_range(shape: &[usize], strides: &[isize]) -> Result<Option<(isize, isize)>> {
    check_rank(shape, strides)?;
    if shape.contains(&0) {
        return Ok(None);
    }
    let ovf = || Error::Overflow { what: "view extent" };
    let (mut lo, mut hi) = (0isize, 0isize);
    for (&d, &s) in shape.iter().zip(strides) {
        let last = isize::try_from(d - 1).map_err(|_| ovf())?;
        let reach = last.checked_mul(s).ok_or_else(ovf)?;
        if reach < 0 {
            lo = lo.checked_add(reach).ok_or_else(ovf)?;
        } else {
            hi = hi.checked_add(reach).ok_or_else(ovf)?;
        }
    }
    Ok(Some((lo, hi)))
}

/// Byte range `[start, end)` relative to the address of element 0, checked.
/// `None` for an empty view.
pub fn byte_range(shape: &[usize], strides: &[isize], elem_size: usize) -> Result<Option<(isize, isize)>> {
    let ovf = || Error::Overflow { what: "byte extent" };
    let Some((lo, hi)) = offset_range(shape, strides)? else {
        return Ok(None);
    };
    let e = isize::try_from(elem_size).map_err(|_| ovf())?;
    let start = lo.checked_mul(e).ok_or_else(ovf)?;
    let end = hi.checked_mul(e).and_then(|x| x.checked_add(e)).ok_or_else(ovf)?;
    Ok(Some((start, end)))
}

/// Whether a view whose element 0 lies `start` bytes into a block of `len`
/// bytes and whose bytes span `range` around it ([`byte_range`]'s) lies
/// wholly in the block; an empty view (`None`) only needs `start <= len`.
pub fn range_fits(start: usize, range: Option<(isize, isize)>, len: usize) -> bool {
    match range {
        None => start <= len,
        Some((lo, hi)) => {
            start.checked_add_signed(lo).is_some() && start.checked_add_signed(hi).is_some_and(|end| end <= len)
        }
    }
}

/// True when the view is C-contiguous. Size-1 dims are ignored and an empty
/// view is contiguous (as torch and tvm-ffi decide).
pub fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    shape.contains(&0) || packs_densely(shape.iter().copied().zip(strides.iter().copied()).rev())
}

/// True when the view's elements fill its memory densely in some order of
/// its dims: C-contiguous strides permuted (size-1 dims take any stride, an
/// empty view is dense). The layouts that importers which accept
/// transpositions only, as XLA's DLPack import, take without a copy.
pub fn is_dense_permutation(shape: &[usize], strides: &[isize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut dims: SmallVec<[(isize, usize); 8]> = strides.iter().copied().zip(shape.iter().copied()).collect();
    dims.sort_unstable();
    packs_densely(dims.into_iter().map(|(s, d)| (d, s)))
}

/// Whether `dims` (size, stride), innermost first, pack their elements
/// densely: each stride the product of the sizes inside it (size-1 dims,
/// which take any stride, left out).
fn packs_densely(dims: impl Iterator<Item = (usize, isize)>) -> bool {
    let mut expected: isize = 1;
    for (d, s) in dims.filter(|&(d, _)| d != 1) {
        if s != expected {
            return false;
        }
        expected = match expected.checked_mul(d as isize) {
            Some(x) => x,
            None => return false,
        };
    }
    true
}

/// Resolves a possibly negative dimension index.
pub fn normalize_dim(dim: isize, ndim: usize) -> Result<usize> {
    let n = ndim as isize;
    let d = if dim < 0 { dim + n } else { dim };
    if (0..n).contains(&d) {
        Ok(d as usize)
    } else {
        Err(Error::DimOutOfRange { dim, ndim })
    }
}

/// Python's `slice(start, stop, step).indices(size)` followed by the length:
/// returns (first index, number of elements).
pub fn slice_indices(size: usize, start: Option<isize>, stop: Option<isize>, step: isize) -> Result<(usize, usize)> {
    if step == 0 {
        return Err(Error::InvalidLayout("slice step cannot be zero"));
    }
    let n = isize::try_from(size).map_err(|_| Error::Overflow { what: "slice" })?;
    let clamp = |v: isize, lo: isize, hi: isize| v.clamp(lo, hi);
    let resolve = |v: isize, lo: isize, hi: isize| clamp(if v < 0 { v + n } else { v }, lo, hi);
    let (first, len) = if step > 0 {
        let a = start.map_or(0, |v| resolve(v, 0, n));
        let b = stop.map_or(n, |v| resolve(v, 0, n));
        let len = if b > a {
            (b - a - 1) as usize / step as usize + 1
        } else {
            0
        };
        (a, len)
    } else {
        let a = start.map_or(n - 1, |v| resolve(v, -1, n - 1));
        let b = stop.map_or(-1, |v| resolve(v, -1, n - 1));
        // `unsigned_abs`: a step of `isize::MIN` has no negation.
        let len = if a > b {
            (a - b - 1) as usize / step.unsigned_abs() + 1
        } else {
            0
        };
        (a, len)
    };
    // An empty slice may start at `n` or -1; clamp so the base offset stays in bounds.
    let first = if len == 0 { 0 } else { first };
    Ok((first as usize, len))
}

/// Resolves a requested shape with at most one `-1` against `numel`.
pub fn infer_shape(requested: &[isize], numel: usize) -> Result<Shape> {
    let mut infer_at = None;
    let mut known: usize = 1;
    for (i, &d) in requested.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => infer_at = Some(i),
            -1 => return Err(Error::InvalidLayout("only one dimension can be -1")),
            d if d < 0 => return Err(Error::InvalidLayout("negative dimension size")),
            d => known = known.checked_mul(d as usize).ok_or(Error::Overflow { what: "shape" })?,
        }
    }
    let mut shape: Shape = requested.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer_at {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::InvalidLayout(
                "shape is incompatible with the number of elements",
            ));
        }
        shape[i] = numel / known;
    } else if known != numel {
        return Err(Error::InvalidLayout(
            "shape is incompatible with the number of elements",
        ));
    }
    Ok(shape)
}

/// Strides that let `new_shape` view the same elements as (`shape`, `strides`)
/// without moving data, or `None` when a copy is required (PyTorch's
/// `computeStride`: each run of old dims merged into new dims must be
/// contiguous within itself). `None` too for strides of another length than
/// the shape and for sizes whose product overflows.
pub fn view_strides(shape: &[usize], strides: &[isize], new_shape: &[usize]) -> Option<Strides> {
    if strides.len() != shape.len() {
        return None;
    }
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    if numel == 0 || shape.is_empty() {
        // Empty tensors and scalars can take any shape with the same numel.
        return contiguous_strides(new_shape).ok();
    }
    let mut out: Strides = SmallVec::from_elem(0, new_shape.len());
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base_stride = *strides.last()?;
    let mut tensor_numel: usize = 1;
    let mut view_numel: usize = 1;
    for tensor_d in (0..shape.len()).rev() {
        tensor_numel *= shape[tensor_d];
        let chunk_ends = tensor_d == 0
            || (shape[tensor_d - 1] != 1
                && strides[tensor_d - 1] != (tensor_numel as isize).checked_mul(chunk_base_stride)?);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                out[view_d as usize] = (view_numel as isize).checked_mul(chunk_base_stride)?;
                view_numel = view_numel.checked_mul(new_shape[view_d as usize])?;
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// Source strides of `src_shape` broadcast to `dst_shape` (NumPy rules: shapes
/// are right-aligned, missing leading dimensions and size-1 dimensions get
/// stride 0). Errors with [`Error::ShapeMismatch`] when the shapes are not
/// broadcast-compatible.
pub fn broadcast_strides(src_shape: &[usize], src_strides: &[isize], dst_shape: &[usize]) -> Result<Strides> {
    if src_strides.len() != src_shape.len() {
        return Err(Error::ShapeMismatch {
            op: "broadcast",
            expected: vec![src_shape.len()],
            got: vec![src_strides.len()],
        });
    }
    let mismatch = || Error::ShapeMismatch {
        op: "broadcast",
        expected: dst_shape.to_vec(),
        got: src_shape.to_vec(),
    };
    if src_shape.len() > dst_shape.len() {
        return Err(mismatch());
    }
    let lead = dst_shape.len() - src_shape.len();
    let mut out: Strides = SmallVec::from_elem(0, dst_shape.len());
    for (i, (&len, &s)) in src_shape.iter().zip(src_strides).enumerate() {
        let d = dst_shape[lead + i];
        out[lead + i] = if len == d {
            s
        } else if len == 1 {
            0
        } else {
            return Err(mismatch());
        };
    }
    Ok(out)
}

fn check_rank(shape: &[usize], strides: &[isize]) -> Result<()> {
    if shape.len() != strides.len() {
        return Err(Error::InvalidLayout("shape and strides differ in length"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numel_and_contiguous_strides() {
        assert_eq!(numel(&[]).unwrap(), 1);
        assert_eq!(numel(&[2, 3, 4]).unwrap(), 24);
        assert_eq!(numel(&[2, 0, 4]).unwrap(), 0);
        assert!(matches!(numel(&[usize::MAX, 2]), Err(Error::Overflow { .. })));
        assert!(matches!(numel(&[1 << 40, 1 << 40]), Err(Error::Overflow { .. })));
        // Empty whatever the order; no dimension past isize::MAX (int64_t in DLPack).
        assert_eq!(numel(&[1 << 40, 1 << 40, 0]).unwrap(), 0);
        assert_eq!(numel(&[isize::MAX as usize, isize::MAX as usize, 0]).unwrap(), 0);
        assert!(matches!(numel(&[usize::MAX, 0]), Err(Error::Overflow { .. })));
        assert!(matches!(numel(&[0, 1 << 63]), Err(Error::Overflow { .. })));
        assert_eq!(contiguous_strides(&[2, 3, 4]).unwrap().as_slice(), &[12, 4, 1]);
        assert_eq!(contiguous_strides(&[2, 0, 4]).unwrap().as_slice(), &[4, 4, 1]);
        // A stride past isize::MAX, with and without an overflowing product.
        let overflows = |shape: &[usize]| matches!(contiguous_strides(shape), Err(Error::Overflow { .. }));
        assert!(overflows(&[1, 1 << 63]));
        assert!(overflows(&[0, 1 << 63]));
        assert!(overflows(&[2, 1 << 62, 2]));
        assert!(overflows(&[3, usize::MAX]));
        assert_eq!(contiguous_strides(&[1, 1 << 62]).unwrap().as_slice(), &[1 << 62, 1]);
        let max = isize::MAX as usize;
        assert_eq!(
            contiguous_strides(&[max, max, 0]).unwrap().as_slice(),
            &[isize::MAX, 1, 1]
        );
        assert_eq!(contiguous_strides(&[]).unwrap().as_slice(), &[] as &[isize]);
        // Past the inline five dims (another buffer): the same strides and checks.
        assert_eq!(
            contiguous_strides(&[2, 3, 1, 5, 0, 7]).unwrap().as_slice(),
            &[105, 35, 35, 7, 7, 1]
        );
        assert_eq!(contiguous_strides(&[1; 9]).unwrap().as_slice(), &[1; 9]);
        assert!(overflows(&[1, 1, 1, 1, 2, 1 << 62, 2]));
        assert!(overflows(&[1, 1, 1, 1, 1, 0, 1 << 63]));
    }

    #[test]
    fn offset_ranges_under_negative_and_zero_strides() {
        assert_eq!(offset_range(&[3, 4], &[4, 1]).unwrap(), Some((0, 11)));
        assert_eq!(offset_range(&[3, 4], &[-4, 1]).unwrap(), Some((-8, 3)));
        assert_eq!(offset_range(&[3, 4], &[0, -1]).unwrap(), Some((-3, 0)));
        assert_eq!(offset_range(&[3, 0], &[4, 1]).unwrap(), None);
        assert_eq!(byte_range(&[3, 4], &[-4, 1], 4).unwrap(), Some((-32, 16)));
        assert!(matches!(
            offset_range(&[1 << 40, 2], &[1 << 30, 1]),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn contiguity_ignores_size_one_dims_and_empty_views() {
        assert!(is_contiguous(&[2, 1, 3], &[3, 99, 1]));
        assert!(is_contiguous(&[2, 0], &[7, 7]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[], &[]));
    }

    #[test]
    fn dense_permutations_are_transposes_of_dense_layouts() {
        assert!(is_dense_permutation(&[2, 3], &[3, 1]));
        assert!(is_dense_permutation(&[3, 2], &[1, 3]));
        assert!(is_dense_permutation(&[4, 1, 5, 6], &[1, 77, 24, 4]));
        assert!(is_dense_permutation(&[2, 0], &[5, 9]));
        assert!(is_dense_permutation(&[], &[]));
        // A step, a flip, a broadcast, a gap between rows, overlapping rows.
        assert!(!is_dense_permutation(&[3, 2], &[2, 6]));
        assert!(!is_dense_permutation(&[3, 2], &[-2, 1]));
        assert!(!is_dense_permutation(&[3, 2], &[0, 1]));
        assert!(!is_dense_permutation(&[3, 2], &[3, 1]));
        assert!(!is_dense_permutation(&[3, 2], &[1, 1]));
    }

    #[test]
    fn slices_match_python() {
        assert_eq!(slice_indices(10, None, None, 1).unwrap(), (0, 10));
        assert_eq!(slice_indices(10, Some(2), Some(8), 3).unwrap(), (2, 2));
        assert_eq!(slice_indices(10, None, None, -1).unwrap(), (9, 10));
        assert_eq!(slice_indices(10, Some(-2), None, -3).unwrap(), (8, 3));
        assert_eq!(slice_indices(10, Some(20), Some(30), 1).unwrap(), (0, 0));
        assert_eq!(slice_indices(10, Some(-100), Some(3), 1).unwrap(), (0, 3));
        assert_eq!(slice_indices(0, None, None, -1).unwrap(), (0, 0));
        assert!(slice_indices(10, None, None, 0).is_err());
    }

    #[test]
    fn views_follow_torch_rules() {
        let s = |v: Option<Strides>| v.map(|x| x.to_vec());
        assert_eq!(s(view_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4])), Some(vec![4, 1]));
        assert_eq!(s(view_strides(&[2, 3, 4], &[12, 4, 1], &[2, 12])), Some(vec![12, 1]));
        // Transposed: the two dims cannot merge.
        assert_eq!(s(view_strides(&[3, 2], &[1, 3], &[6])), None);
        // Splitting a transposed dim is fine.
        assert_eq!(s(view_strides(&[4, 2], &[1, 4], &[2, 2, 2])), Some(vec![2, 1, 4]));
        assert_eq!(s(view_strides(&[2, 3], &[3, 1], &[1, 2, 1, 3])), Some(vec![6, 3, 3, 1]));
        // Strides of another length, sizes whose product overflows: no view, no panic.
        assert_eq!(s(view_strides(&[2, 3, 4], &[1], &[24])), None);
        assert_eq!(s(view_strides(&[usize::MAX, 4], &[4, 1], &[4])), None);
        assert_eq!(s(view_strides(&[2, 3], &[3, 1], &[usize::MAX, 6, 4])), None);
        assert_eq!(infer_shape(&[-1, 4], 12).unwrap().to_vec(), vec![3, 4]);
        assert!(infer_shape(&[-1, 5], 12).is_err());
        assert!(infer_shape(&[-1, -1], 12).is_err());
    }

    #[test]
    fn dims_normalize() {
        assert_eq!(normalize_dim(-1, 3).unwrap(), 2);
        assert!(normalize_dim(3, 3).is_err());
        assert!(normalize_dim(0, 0).is_err());
    }

    #[test]
    fn broadcast_strides_rules() {
        assert_eq!(
            broadcast_strides(&[1, 5], &[5, 1], &[3, 4, 5]).unwrap().as_slice(),
            &[0, 0, 1]
        );
        assert_eq!(
            broadcast_strides(&[4, 1], &[1, 1], &[4, 6]).unwrap().as_slice(),
            &[1, 0]
        );
        assert!(broadcast_strides(&[3], &[1], &[4]).is_err());
    }
}
