//! Views move no data; copies match a per-element reference.

use devtensor::{DType, Device, Error, Tensor};

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<i32> = (0..n as i32).collect();
    Tensor::from_slice(&data, shape).unwrap()
}

#[test]
fn slicing_with_steps_matches_python() {
    let t = arange(&[10]);
    assert_eq!(
        t.slice(0, Some(2), Some(8), 3).unwrap().to_vec::<i32>().unwrap(),
        vec![2, 5]
    );
    assert_eq!(
        t.slice(0, None, None, -1).unwrap().to_vec::<i32>().unwrap(),
        (0..10).rev().collect::<Vec<_>>()
    );
    assert_eq!(
        t.slice(0, Some(-2), None, -3).unwrap().to_vec::<i32>().unwrap(),
        vec![8, 5, 2]
    );
    let empty = t.slice(0, Some(5), Some(5), 1).unwrap();
    assert_eq!(empty.shape(), &[0]);
    assert!(empty.to_vec::<i32>().unwrap().is_empty());
    assert!(matches!(t.slice(0, None, None, 0), Err(Error::InvalidLayout(_))));
    assert!(matches!(t.slice(1, None, None, 1), Err(Error::DimOutOfRange { .. })));
}

#[test]
fn views_share_storage() {
    let t = arange(&[3, 4]);
    let v = t.transpose(0, 1).unwrap();
    assert!(std::sync::Arc::ptr_eq(t.storage(), v.storage()));
    assert_eq!(v.shape(), &[4, 3]);
    assert_eq!(v.strides(), &[1, 4]);
    assert!(!v.is_contiguous());
    // A write through a view is seen by the base.
    v.select(0, 1).unwrap().select(0, 2).unwrap().fill(-7i32).unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap()[2 * 4 + 1], -7);
}

#[test]
fn select_permute_flip_expand() {
    let t = arange(&[2, 3, 4]);
    assert_eq!(
        t.select(1, -1).unwrap().to_vec::<i32>().unwrap(),
        vec![8, 9, 10, 11, 20, 21, 22, 23]
    );
    assert!(matches!(t.select(0, 2), Err(Error::IndexOutOfRange { .. })));
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.to_vec::<i32>().unwrap()[..6], [0, 4, 8, 12, 16, 20]);
    assert!(t.permute(&[0, 0, 1]).is_err());
    let f = t.flip(&[0, 2]).unwrap();
    assert_eq!(f.to_vec::<i32>().unwrap()[..4], [15, 14, 13, 12]);
    let row = arange(&[1, 3]);
    let e = row.expand(&[2, -1, -1]).unwrap();
    assert_eq!(e.shape(), &[2, 1, 3]);
    assert_eq!(e.strides(), &[0, 0, 1]);
    assert_eq!(e.to_vec::<i32>().unwrap(), vec![0, 1, 2, 0, 1, 2]);
    assert!(matches!(arange(&[2]).expand(&[3]), Err(Error::ShapeMismatch { .. })));
    // An expanded view is filled (each element it names once), as torch's
    // `fill_`; a copy into it stays refused (its elements would differ).
    let base = arange(&[2, 1]);
    let grid = base.expand(&[2, 4]).unwrap();
    grid.fill(5i32).unwrap();
    assert_eq!(base.to_vec::<i32>().unwrap(), vec![5, 5]);
    assert_eq!(grid.to_vec::<i32>().unwrap(), vec![5; 8]);
    assert!(grid.copy_from(&arange(&[2, 4])).is_err());
}

#[test]
fn reshape_views_when_possible_and_copies_otherwise() {
    let t = arange(&[2, 3, 4]);
    let v = t.reshape(&[6, -1]).unwrap();
    assert!(std::sync::Arc::ptr_eq(t.storage(), v.storage()));
    let tt = t.transpose(1, 2).unwrap();
    assert!(matches!(tt.view(&[-1]), Err(Error::InvalidLayout(_))));
    let flat = tt.reshape(&[-1]).unwrap();
    assert!(!std::sync::Arc::ptr_eq(t.storage(), flat.storage()));
    assert_eq!(flat.to_vec::<i32>().unwrap(), tt.to_vec::<i32>().unwrap());
    assert_eq!(flat.to_vec::<i32>().unwrap()[..4], [0, 4, 8, 1]);
}

#[test]
fn contiguous_and_copy_from_any_layout() {
    let t = arange(&[5, 7]);
    let tt = t.transpose(0, 1).unwrap().flip(&[1]).unwrap();
    let c = tt.contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.to_vec::<i32>().unwrap(), tt.to_vec::<i32>().unwrap());
    // Same contiguous tensor: no copy.
    assert!(std::sync::Arc::ptr_eq(c.storage(), c.contiguous().unwrap().storage()));
    let dst = Tensor::zeros(&[7, 5], DType::I32, Device::Cpu).unwrap();
    dst.transpose(0, 1).unwrap().copy_from(&t).unwrap();
    assert_eq!(
        dst.to_vec::<i32>().unwrap(),
        t.transpose(0, 1).unwrap().to_vec::<i32>().unwrap()
    );
    assert!(matches!(dst.copy_from(&t), Err(Error::ShapeMismatch { .. })));
    let f = Tensor::zeros(&[5, 7], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(f.copy_from(&t), Err(Error::DTypeMismatch { .. })));
    // Writing into a broadcast view would write one element many times.
    let b = arange(&[1, 7]).expand(&[5, 7]).unwrap();
    assert!(matches!(b.copy_from(&t), Err(Error::OverlappingDestination)));
}

#[test]
fn overlapping_copy_goes_through_a_temporary() {
    let t = arange(&[6]);
    let head = t.slice(0, Some(0), Some(5), 1).unwrap();
    let tail = t.slice(0, Some(1), Some(6), 1).unwrap();
    tail.copy_from(&head).unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![0, 0, 1, 2, 3, 4]);
}

#[test]
fn fill_full_zeros_and_dtype_checks() {
    let t = Tensor::full(&[3, 2], 2.5f64, Device::Cpu).unwrap();
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![2.5; 6]);
    assert!(matches!(t.fill(1i32), Err(Error::DTypeMismatch { .. })));
    let z = Tensor::zeros(&[4], DType::BF16, Device::Cpu).unwrap();
    assert_eq!(z.nbytes(), 8);
    z.fill_bytes(&[0x80, 0x3f]).unwrap();
    assert!(matches!(z.fill_bytes(&[1]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(z.to_vec::<u16>(), Err(Error::DTypeMismatch { .. })));
    let scalar = Tensor::full(&[], 7u8, Device::Cpu).unwrap();
    assert_eq!((scalar.ndim(), scalar.numel()), (0, 1));
    assert_eq!(scalar.to_vec::<u8>().unwrap(), vec![7]);
}

#[test]
fn gpu_devices_without_a_backend_are_typed_errors() {
    let status = devtensor::backend::cuda_status();
    if status.is_available() {
        println!("SKIP gpu_devices_without_a_backend_are_typed_errors: a CUDA device is present");
        return;
    }
    for d in [Device::Cuda(0), Device::CudaHost, Device::Rocm(0)] {
        let err = Tensor::empty(&[4], DType::F32, d).unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    }
}

#[test]
fn shape_overflow_is_an_error_not_a_panic() {
    let err = Tensor::empty(&[1 << 40, 1 << 40], DType::F32, Device::Cpu).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }));
    let err = Tensor::empty(&[1 << 62], DType::F64, Device::Cpu).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }));
}

/// No dimension past `isize::MAX` (DLPack's `int64_t`), even beside a zero
/// one: `[usize::MAX, 0]` was made, then exported with a shape of -1 that
/// its own import refused. Empty views whose sizes, reordered, overflow
/// before the zero have no elements (`numel` panicked in debug builds).
#[test]
fn dimensions_past_int64_are_refused_and_empty_views_count_zero_elements() {
    use devtensor::dlpack::ExportOptions;
    let huge = usize::MAX;
    for shape in [[huge, 0], [0, 1 << 63]] {
        let err = Tensor::empty(&shape, DType::F32, Device::Cpu).unwrap_err();
        assert!(matches!(err, Error::Overflow { .. }), "{err}");
    }
    let t = arange(&[10]);
    let err = t.as_strided(&[huge, 0, 2], &[1, 1, 1], 0).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err}");
    // The largest size there is: three dims whose product overflows but for the zero.
    let max = isize::MAX as usize;
    let v = t
        .as_strided(&[max, 0, max], &[1, 1, 1], 0)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert_eq!(v.shape(), &[max, max, 0]);
    assert_eq!((v.numel(), v.nbytes()), (0, 0));
    assert_eq!(v.reshape(&[-1]).unwrap().shape(), &[0]);
    assert_eq!(v.to_vec::<i32>().unwrap(), Vec::<i32>::new());
    assert!(matches!(v.select(0, 5), Ok(s) if s.shape() == [max, 0]));
    let m = v.to_dlpack_versioned(ExportOptions::default());
    // SAFETY: `m` is a live export; its shape array has `ndim` entries.
    let shape = unsafe {
        let d = &(*m.as_ptr()).dl_tensor;
        std::slice::from_raw_parts(d.shape, d.ndim as usize).to_vec()
    };
    assert_eq!(shape, [i64::MAX, i64::MAX, 0]);
    // SAFETY: a fresh export, consumed once.
    let back = unsafe { devtensor::from_dlpack_versioned(m.into_raw()) }.unwrap();
    assert_eq!(back.shape(), v.shape());
}

#[test]
fn extreme_strides_and_broadcasts_are_errors_or_right_never_panics() {
    let t = arange(&[10]);
    // Python: list(range(10))[::-2**63] == [9].
    let last = t.slice(0, None, None, isize::MIN).unwrap();
    assert_eq!(last.to_vec::<i32>().unwrap(), vec![9]);
    // Rows 3 elements apart: the step times the stride overflows, yet one row is kept
    // (NumPy: np.arange(9).reshape(3, 3)[::2**62] is the first row).
    let m = arange(&[3, 3]);
    for step in [1 << 62, isize::MAX, -(1 << 62), isize::MIN] {
        let row = m.slice(0, None, None, step).unwrap();
        let first = if step > 0 { vec![0, 1, 2] } else { vec![6, 7, 8] };
        assert_eq!(
            (row.shape(), row.to_vec::<i32>().unwrap()),
            (&[1usize, 3][..], first),
            "{step}"
        );
    }
    // Size-1 dims' strides address nothing and may be anything: the one
    // element is copied, and flipped, as it is.
    let one = t.as_strided(&[1, 1], &[isize::MAX, isize::MIN], 3).unwrap();
    assert_eq!(one.contiguous().unwrap().to_vec::<i32>().unwrap(), vec![3]);
    assert_eq!(one.flip(&[0, 1]).unwrap().to_vec::<i32>().unwrap(), vec![3]);
    // Broadcasts whose bytes would pass isize::MAX (`nbytes` wrapped to 0,
    // `to_vec` panicked on the capacity).
    let b = Tensor::from_slice(&[1u8], &[1]).unwrap();
    assert!(matches!(b.expand(&[1 << 62, 2]), Err(Error::Overflow { .. })));
    let f = Tensor::from_slice(&[1f64], &[1]).unwrap();
    assert!(matches!(f.expand(&[1 << 61]), Err(Error::Overflow { .. })));
    assert!(matches!(f.as_strided(&[1 << 61], &[0], 0), Err(Error::Overflow { .. })));
    // The largest that fit are still views.
    assert_eq!(b.expand(&[1 << 40, 1 << 22]).unwrap().nbytes(), 1 << 62);
    assert_eq!(f.expand(&[1 << 59]).unwrap().nbytes(), 1 << 62);
}

#[test]
fn no_tensor_has_more_dimensions_than_dlpack_import_accepts() {
    use devtensor::layout::MAX_NDIM;
    let too_many = |r: devtensor::Result<Tensor>| matches!(r, Err(Error::TooManyDimensions { ndim, max: MAX_NDIM }) if ndim == MAX_NDIM + 1);
    let ones = vec![1usize; MAX_NDIM + 1];
    let ones_i = vec![1isize; MAX_NDIM + 1];
    // Creation.
    assert!(too_many(Tensor::empty(&ones, DType::F32, Device::Cpu)));
    assert!(too_many(Tensor::zeros(&ones, DType::F32, Device::Cpu)));
    assert!(too_many(Tensor::from_slice(&[1i32], &ones)));
    // The limit itself is fine, and exchanges.
    let full = Tensor::zeros(&ones[..MAX_NDIM], DType::F32, Device::Cpu).unwrap();
    let dl = full.to_dlpack_versioned(Default::default()).into_raw();
    // SAFETY: a live export, imported once (the import owns it).
    let back = unsafe { devtensor::from_dlpack_versioned(dl) }.unwrap();
    assert_eq!(back.ndim(), MAX_NDIM);
    // Views that add dimensions.
    assert!(too_many(full.unsqueeze(0)));
    assert!(too_many(full.reshape(&ones_i)));
    assert!(too_many(full.view(&ones_i)));
    assert!(too_many(full.expand(&ones_i)));
    assert!(too_many(full.as_strided(&ones, &ones_i, 0)));
    let small = arange(&[2, 3]);
    assert!(too_many(
        small.reshape(&[&[2isize, 3][..], &ones_i[..MAX_NDIM - 1]].concat())
    ));
    // Views that keep the count are untouched.
    assert_eq!(
        full.permute(&(0..MAX_NDIM as isize).rev().collect::<Vec<_>>())
            .unwrap()
            .ndim(),
        MAX_NDIM
    );
}

#[test]
fn a_tensor_stays_within_128_bytes_and_more_than_five_dims_still_work() {
    // Within 128 bytes the compiler moves a tensor inline instead of calling
    // memcpy; a Python `empty()` moves it three times.
    assert!(
        std::mem::size_of::<Tensor>() <= 128,
        "{}",
        std::mem::size_of::<Tensor>()
    );
    // Six and seven dims no longer fit the inline shape: views and copies of
    // them must be as right as ever.
    for shape in [&[2usize, 3, 2, 1, 2, 3][..], &[1, 2, 3, 2, 1, 2, 2]] {
        let t = arange(shape);
        let n = shape.len();
        let dims: Vec<isize> = (0..n as isize).rev().collect();
        let p = t.permute(&dims).unwrap();
        assert_eq!(p.shape(), shape.iter().rev().copied().collect::<Vec<_>>().as_slice());
        let back = p.contiguous().unwrap().permute(&dims).unwrap().contiguous().unwrap();
        assert_eq!(back.to_vec::<i32>().unwrap(), t.to_vec::<i32>().unwrap());
    }
}

#[test]
fn to_vec_of_a_view_too_large_for_memory_is_an_error_not_an_abort() {
    let huge = Tensor::zeros(&[1], DType::F32, Device::Cpu)
        .unwrap()
        .expand(&[1 << 45])
        .unwrap();
    assert!(matches!(huge.to_vec::<f32>(), Err(Error::OutOfMemory { .. })));
}

#[test]
fn views_of_no_element_move_no_start() {
    // Rows of an empty matrix too long to address: selecting or slicing one
    // computed a byte offset past isize (an overflow error).
    let z = Tensor::empty(&[1 << 62, 0], DType::F32, Device::Cpu).unwrap();
    assert_eq!(z.select(0, -1).unwrap().shape(), &[0]);
    assert_eq!(z.slice(0, Some(1 << 61), None, 1).unwrap().shape(), &[1 << 61, 0]);
    assert_eq!(z.flip(&[0]).unwrap().shape(), &[1 << 62, 0]);
    // A flipped empty view (negative stride) stepped before its storage's start.
    let e = Tensor::empty(&[3, 0], DType::F64, Device::Cpu)
        .unwrap()
        .flip(&[0])
        .unwrap();
    assert_eq!(e.select(0, 2).unwrap().shape(), &[0]);
    assert_eq!(e.slice(0, Some(1), None, 1).unwrap().shape(), &[2, 0]);
}

#[test]
fn bytes_round_trip_in_c_order_and_sizes_are_checked() {
    let t = arange(&[3, 4]).permute(&[1, 0]).unwrap().flip(&[0]).unwrap();
    let bytes = t.to_bytes().unwrap();
    let want: Vec<u8> = t
        .to_vec::<i32>()
        .unwrap()
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    assert_eq!(bytes, want);
    let back = Tensor::from_bytes(&bytes, t.shape(), t.dtype()).unwrap();
    assert_eq!(back.to_vec::<i32>().unwrap(), t.to_vec::<i32>().unwrap());
    assert!(matches!(
        Tensor::from_bytes(&bytes[1..], t.shape(), t.dtype()),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(
        Tensor::from_bytes(&[], &[0, 5], DType::F64)
            .unwrap()
            .to_bytes()
            .unwrap()
            .is_empty()
    );
}
