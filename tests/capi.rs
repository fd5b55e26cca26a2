//! The C ABI (`src/capi/`) called as C calls it, from Rust: status codes and
//! last-error text, the `DLPackManagedTensorAllocator` entry point through the
//! DLPack function-pointer type, streams per thread, every dtype, deleters run
//! once, and CUDA tensors on a stream of our own (on a GPU or the emulator;
//! `SKIP` without one, a failure under `DEVTENSOR_REQUIRE_GPU=1`).

mod common;

use std::ffi::{CStr, c_char, c_void};
use std::ptr;

use devtensor::DType;
use devtensor::capi::*;
use devtensor::dlpack::ffi::{
    DLDataType, DLDevice, DLManagedTensorVersioned, DLPackManagedTensorAllocator, DLTensor, kDLCPU, kDLCUDA, kDLFloat,
    kDLInt,
};
use serial_test::serial; // live-tensor and pool counts are process-wide: one test at a time

const CPU: DLDevice = DLDevice {
    device_type: kDLCPU,
    device_id: 0,
};
const F32: DLDataType = DLDataType {
    code: kDLFloat,
    bits: 32,
    lanes: 1,
};

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(devtensor_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Allocates with `devtensor_empty`/`devtensor_zeros`, asserting success.
fn make(zeros: bool, shape: &[i64], dtype: DLDataType, device: DLDevice, stream: *mut c_void) -> Managed {
    let mut out = ptr::null_mut();
    let f = if zeros { devtensor_zeros } else { devtensor_empty };
    // SAFETY: `shape` holds `len` sizes; `out` is writable.
    let s = unsafe { f(shape.as_ptr(), shape.len() as i32, dtype, device, stream, &mut out) };
    assert_eq!(s, DevtensorStatus::Ok, "{}", last_error());
    Managed(out)
}

/// An owning `DLManagedTensorVersioned*` whose deleter runs on drop, once.
struct Managed(*mut DLManagedTensorVersioned);

impl Managed {
    fn dl(&self) -> &DLTensor {
        // SAFETY: a live tensor handed out by devtensor.
        unsafe { &(*self.0).dl_tensor }
    }

    fn as_slice<T>(&self) -> &[T] {
        let n: i64 = (0..self.dl().ndim as usize)
            // SAFETY: `shape` holds `ndim` sizes.
            .map(|d| unsafe { *self.dl().shape.add(d) })
            .product();
        // SAFETY: a contiguous host tensor of `n` elements of `T`.
        unsafe { std::slice::from_raw_parts(self.dl().data.cast::<T>(), n as usize) }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: the deleter of a tensor we own, called once.
        unsafe { ((*self.0).deleter.expect("devtensor sets a deleter"))(self.0) }
    }
}

#[derive(Default)]
struct Errors {
    calls: usize,
    kind: String,
    message: String,
}

unsafe extern "C" fn record_error(ctx: *mut c_void, kind: *const c_char, message: *const c_char) {
    // SAFETY: `ctx` is the `Errors` the test passed; both strings are valid for the call.
    unsafe {
        let e = &mut *ctx.cast::<Errors>();
        e.calls += 1;
        e.kind = CStr::from_ptr(kind).to_string_lossy().into_owned();
        e.message = CStr::from_ptr(message).to_string_lossy().into_owned();
    }
}

#[test]
#[serial(counters)]
fn allocator_is_a_dlpack_managed_tensor_allocator() {
    // The entry point has the exact type of DLPack's allocator slot.
    const SLOT: DLPackManagedTensorAllocator = Some(devtensor_managed_tensor_allocator);
    let Some(alloc) = SLOT else { unreachable!() };
    let mut shape = [4i64, 5];
    let mut proto = DLTensor {
        data: ptr::null_mut(),
        device: CPU,
        ndim: 2,
        dtype: DLDataType {
            code: kDLInt,
            bits: 16,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    };
    let mut errors = Errors::default();
    let ctx = (&raw mut errors).cast::<c_void>();
    let mut out = ptr::null_mut();
    // SAFETY: a readable prototype, writable out, our SetError with its context.
    assert_eq!(unsafe { alloc(&mut proto, &mut out, ctx, Some(record_error)) }, 0);
    let t = Managed(out);
    assert_eq!(errors.calls, 0);
    assert_eq!(DType::from_dlpack(t.dl().dtype).unwrap(), DType::I16);
    assert_eq!(t.as_slice::<i16>().len(), 20);
    // SAFETY: `strides` holds 2 values.
    assert_eq!(unsafe { [*t.dl().strides, *t.dl().strides.add(1)] }, [5, 1]);

    // Out of memory: MemoryError, once, and *out untouched.
    shape = [1 << 40, 1 << 20];
    proto.shape = shape.as_mut_ptr();
    proto.dtype = F32;
    let mut untouched = ptr::null_mut();
    // SAFETY: as above.
    let rc = unsafe { alloc(&mut proto, &mut untouched, ctx, Some(record_error)) };
    assert_eq!(rc, -1);
    assert!(untouched.is_null());
    assert_eq!(errors.calls, 1);
    assert_eq!(errors.kind, "MemoryError");
    assert!(errors.message.contains("out of memory on cpu"), "{}", errors.message);
    assert_eq!(errors.message, last_error());

    // A negative size: ValueError.
    shape = [3, -1];
    proto.shape = shape.as_mut_ptr();
    // SAFETY: as above.
    let rc = unsafe { alloc(&mut proto, &mut untouched, ctx, Some(record_error)) };
    assert_eq!(rc, -1);
    assert_eq!((errors.calls, errors.kind.as_str()), (2, "ValueError"));
    assert!(
        errors.message.contains("negative size -1 in dimension 1"),
        "{}",
        errors.message
    );
    // NULL out: TypeError.
    // SAFETY: a NULL out pointer is checked, not written.
    let rc = unsafe { alloc(&mut proto, ptr::null_mut(), ctx, Some(record_error)) };
    assert_eq!(rc, -1);
    assert_eq!((errors.calls, errors.kind.as_str()), (3, "TypeError"));
}

#[test]
#[serial(counters)]
fn status_codes_for_bad_arguments() {
    let shape = [2i64, 3];
    let mut out = ptr::null_mut();
    let cases: [(DLDataType, DLDevice, i32, DevtensorStatus, &str); 5] = [
        (
            DLDataType {
                code: 200,
                bits: 32,
                lanes: 1,
            },
            CPU,
            2,
            DevtensorStatus::UnsupportedDtype,
            "code 200",
        ),
        (
            F32,
            DLDevice {
                device_type: 42,
                device_id: 0,
            },
            2,
            DevtensorStatus::UnsupportedDevice,
            "unsupported device type 42",
        ),
        (
            F32,
            DLDevice {
                device_type: kDLCPU,
                device_id: -2,
            },
            2,
            DevtensorStatus::UnsupportedDevice,
            "invalid device id -2",
        ),
        (F32, CPU, -5, DevtensorStatus::InvalidArgument, "ndim -5 out of range"),
        (
            F32,
            CPU,
            1000,
            DevtensorStatus::InvalidArgument,
            "ndim 1000 out of range",
        ),
    ];
    for (dtype, device, ndim, want, text) in cases {
        // SAFETY: `shape` holds at least the sizes read before validation fails.
        let s = unsafe { devtensor_empty(shape.as_ptr(), ndim, dtype, device, ptr::null_mut(), &mut out) };
        assert_eq!(s, want, "{text}");
        assert!(last_error().starts_with("devtensor_empty: "), "{}", last_error());
        assert!(last_error().contains(text), "{} lacks {text}", last_error());
        assert!(out.is_null());
    }
    // SAFETY: NULL pointers are checked before use.
    unsafe {
        assert_eq!(devtensor_get_stream(CPU, ptr::null_mut()), DevtensorStatus::NullPointer);
        assert_eq!(
            devtensor_contiguous(ptr::null(), ptr::null_mut(), &mut out),
            DevtensorStatus::NullPointer
        );
        assert_eq!(last_error(), "devtensor_contiguous: `src` is NULL");
        assert_eq!(
            devtensor_copy_managed(ptr::null(), ptr::null(), ptr::null_mut()),
            DevtensorStatus::NullPointer
        );
        assert_eq!(devtensor_empty_cache(CPU, ptr::null_mut()), DevtensorStatus::Ok);
    }
    for (code, name) in [
        (0, "DEVTENSOR_STATUS_OK"),
        (5, "DEVTENSOR_STATUS_BACKEND_UNAVAILABLE"),
        (13, "DEVTENSOR_STATUS_INTERNAL"),
        (-1, "DEVTENSOR_STATUS_UNKNOWN"),
        (14, "DEVTENSOR_STATUS_UNKNOWN"),
    ] {
        // SAFETY: a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(devtensor_status_name(code)) };
        assert_eq!(got.to_str().unwrap(), name);
    }
}

#[test]
#[serial(counters)]
fn streams_are_per_thread_and_per_device() {
    let cuda0 = DLDevice {
        device_type: kDLCUDA,
        device_id: 0,
    };
    let cuda1 = DLDevice {
        device_type: kDLCUDA,
        device_id: 1,
    };
    let get = |d| {
        let mut s = ptr::dangling_mut::<c_void>();
        // SAFETY: `s` is writable.
        assert_eq!(unsafe { devtensor_get_stream(d, &mut s) }, DevtensorStatus::Ok);
        s as usize
    };
    // SAFETY: a bookkeeping call: the stream is never used here.
    let rc = unsafe { devtensor_set_stream(cuda0, 0x50 as *mut c_void, ptr::null_mut()) };
    assert_eq!(rc, DevtensorStatus::Ok);
    assert_eq!((get(cuda0), get(cuda1)), (0x50, 0));
    std::thread::spawn(move || assert_eq!(get(cuda0), 0)).join().unwrap();
    let mut prev = ptr::null_mut();
    // SAFETY: as above; `prev` is writable.
    let rc = unsafe { devtensor_set_stream(cuda0, ptr::null_mut(), &mut prev) };
    assert_eq!(rc, DevtensorStatus::Ok);
    assert_eq!((prev as usize, get(cuda0)), (0x50, 0));
}

#[test]
#[serial(counters)]
fn every_dtype_zeros_and_every_deleter_runs_once() {
    let live = devtensor_live_tensors();
    let tensors: Vec<(DType, Managed)> = DType::ALL
        .iter()
        .map(|&d| (d, make(true, &[3, 5], d.to_dlpack(), CPU, ptr::null_mut())))
        .collect();
    assert_eq!(devtensor_live_tensors(), live + DType::ALL.len() as u64);
    for (d, t) in &tensors {
        assert_eq!(t.dl().dtype, d.to_dlpack(), "{d}");
        assert!(
            t.as_slice::<u8>().len() == 15 && (t.dl().data as usize).is_multiple_of(256),
            "{d}"
        );
        // SAFETY: a contiguous host tensor of 15 elements of `d`.
        let bytes = unsafe { std::slice::from_raw_parts(t.dl().data.cast::<u8>(), 15 * d.size()) };
        assert!(bytes.iter().all(|&b| b == 0), "{d} not zeroed");
    }
    drop(tensors);
    assert_eq!(devtensor_live_tensors(), live);

    // A scalar (ndim 0, NULL shape) and an empty tensor.
    let scalar = make(false, &[], F32, CPU, ptr::null_mut());
    assert_eq!((scalar.dl().ndim, scalar.as_slice::<f32>().len()), (0, 1));
    let empty = make(true, &[4, 0], F32, CPU, ptr::null_mut());
    assert_eq!(empty.as_slice::<f32>().len(), 0);
    drop((scalar, empty));
    assert_eq!(devtensor_live_tensors(), live);
}

#[test]
#[serial(counters)]
fn copies_take_byte_offsets_negative_strides_and_come_back_to_rust() {
    // A foreign 2x3 int32 block after 8 bytes of padding, read column-reversed.
    let raw: [i32; 8] = [-1, -1, 0, 1, 2, 3, 4, 5];
    let mut shape = [2i64, 3];
    let mut strides = [3i64, -1];
    let src = DLTensor {
        data: raw.as_ptr().cast_mut().cast(),
        device: CPU,
        ndim: 2,
        dtype: DType::I32.to_dlpack(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 16, // element [0][0] is raw[4]; [i][j] is raw[4 + 3i - j]
    };
    let dst = make(false, &[2, 3], DType::I32.to_dlpack(), CPU, ptr::null_mut());
    // SAFETY: both descriptors are valid for the call.
    let rc = unsafe { devtensor_copy(dst.dl(), &src, ptr::null_mut()) };
    assert_eq!(rc, DevtensorStatus::Ok, "{}", last_error());
    assert_eq!(dst.as_slice::<i32>(), &[2, 1, 0, 5, 4, 3]);

    let mut c = ptr::null_mut();
    // SAFETY: as above; `c` is writable.
    let rc = unsafe { devtensor_contiguous(&src, ptr::null_mut(), &mut c) };
    assert_eq!(rc, DevtensorStatus::Ok);
    // SAFETY: an owning tensor from devtensor, consumed once.
    let t = unsafe { devtensor::from_dlpack_versioned(c) }.unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![2, 1, 0, 5, 4, 3]);
    assert!(t.is_contiguous());

    // NULL data with elements is refused before anything is read.
    let bad = DLTensor {
        data: ptr::null_mut(),
        ..src
    };
    // SAFETY: validation fails before any element is read.
    let rc = unsafe { devtensor_copy(dst.dl(), &bad, ptr::null_mut()) };
    assert_eq!(rc, DevtensorStatus::InvalidTensor);
    assert!(
        last_error().contains("null data pointer for a tensor with 6 elements"),
        "{}",
        last_error()
    );
    // A reach below address 0, or a byte offset past the address space: the
    // descriptor is invalid (INVALID_TENSOR, as the header says), not an argument.
    let mut back = [-4i64, 1]; // element [1][0] 16 bytes below `data`
    let below_zero = DLTensor {
        data: 8 as *mut c_void,
        strides: back.as_mut_ptr(),
        byte_offset: 0,
        ..src
    };
    let far = DLTensor {
        byte_offset: u64::MAX - 4,
        ..src
    };
    for bad in [below_zero, far] {
        // SAFETY: validation fails before any element is read.
        let rc = unsafe { devtensor_copy(dst.dl(), &bad, ptr::null_mut()) };
        assert_eq!(rc, DevtensorStatus::InvalidTensor, "{}", last_error());
        assert!(last_error().contains("passes the address space"), "{}", last_error());
        let mut c = ptr::null_mut();
        // SAFETY: as above; `c` is writable and stays NULL.
        let rc = unsafe { devtensor_contiguous(&bad, ptr::null_mut(), &mut c) };
        assert_eq!(rc, DevtensorStatus::InvalidTensor);
        assert!(c.is_null());
    }
}

/// Pinned-memory descriptors of either GPU kind (a foreign producer's) are
/// host memory: copied on the host with the default stream whether or not
/// the GPU's driver is here (without it, nothing can be queued to wait for).
/// kDLCUDAHost was BACKEND_UNAVAILABLE without a CUDA driver, while
/// kDLROCMHost, whose backend is not built in, was copied.
#[test]
#[serial(counters)]
fn pinned_descriptors_of_either_kind_copy_on_the_host() {
    use devtensor::dlpack::ffi::{kDLCUDAHost, kDLROCMHost};
    let src: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut t_shape = [4i64, 3];
    let mut t_strides = [1i64, 4];
    for device_type in [kDLCUDAHost, kDLROCMHost] {
        let pinned = DLDevice {
            device_type,
            device_id: 0,
        };
        let mut dst = vec![0f32; 12];
        let src_dl = DLTensor {
            data: src.as_ptr().cast_mut().cast(),
            device: pinned,
            ndim: 2,
            dtype: F32,
            shape: t_shape.as_mut_ptr(),
            strides: t_strides.as_mut_ptr(),
            byte_offset: 0,
        };
        let dst_dl = DLTensor {
            data: dst.as_mut_ptr().cast(),
            device: CPU,
            strides: ptr::null_mut(),
            ..src_dl
        };
        // SAFETY: both describe live vectors of 12 f32s; stream NULL.
        let rc = unsafe { devtensor_copy(&dst_dl, &src_dl, ptr::null_mut()) };
        assert_eq!(rc, DevtensorStatus::Ok, "{device_type}: {}", last_error());
        let want: Vec<f32> = (0..4).flat_map(|i| (0..3).map(move |j| (j * 4 + i) as f32)).collect();
        assert_eq!(dst, want, "{device_type}");
    }
}

/// CUDA device, pinned and managed tensors made and copied on a stream of our
/// own, through the C ABI.
#[test]
#[serial(counters)]
fn cuda_tensors_on_our_own_stream() {
    if !common::gpu_or_skip("cuda_tensors_on_our_own_stream", devtensor::backend::cuda_status()) {
        return;
    }
    run_cuda();
}

#[cfg(feature = "cuda")]
fn run_cuda() {
    use devtensor::backend::cuda::stream::CudaStream;
    use devtensor::dlpack::ffi::{kDLCUDAHost, kDLCUDAManaged};
    let cuda0 = DLDevice {
        device_type: kDLCUDA,
        device_id: 0,
    };
    let stream = CudaStream::new(0).unwrap();
    let s = stream.raw() as *mut c_void;
    // SAFETY: `stream` is a live stream of GPU 0 that outlives its use here.
    let rc = unsafe { devtensor_set_stream(cuda0, s, ptr::null_mut()) };
    assert_eq!(rc, DevtensorStatus::Ok);
    let live = devtensor_live_tensors();

    // Host data → a device tensor from the allocator (the current stream) → a
    // zero-filled one, permuted → back to the host.
    let host: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut shape = [3i64, 4];
    let host_dl = DLTensor {
        data: host.as_ptr().cast_mut().cast(),
        device: CPU,
        ndim: 2,
        dtype: F32,
        shape: shape.as_mut_ptr(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    };
    let mut proto = DLTensor {
        device: cuda0,
        ..host_dl
    };
    let mut out = ptr::null_mut();
    // SAFETY: valid prototype and out pointer; no SetError.
    let rc = unsafe { devtensor_managed_tensor_allocator(&mut proto, &mut out, ptr::null_mut(), None) };
    assert_eq!(rc, 0, "{}", last_error());
    let a = Managed(out);
    // SAFETY: valid descriptors and our live stream.
    let rc = unsafe { devtensor_copy(a.dl(), &host_dl, s) };
    assert_eq!(rc, DevtensorStatus::Ok, "{}", last_error());
    let b = make(true, &[4, 3], F32, cuda0, s);
    let mut t_shape = [3i64, 4];
    let mut t_strides = [1i64, 3];
    let b_transposed = DLTensor {
        shape: t_shape.as_mut_ptr(),
        strides: t_strides.as_mut_ptr(),
        ..*b.dl()
    };
    // SAFETY: as above.
    let rc = unsafe { devtensor_copy(&b_transposed, a.dl(), s) };
    assert_eq!(rc, DevtensorStatus::Ok, "{}", last_error());
    let back = make(false, &[4, 3], F32, CPU, ptr::null_mut());
    // SAFETY: as above.
    let rc = unsafe { devtensor_copy(back.dl(), b.dl(), s) };
    assert_eq!(rc, DevtensorStatus::Ok, "{}", last_error());
    let want: Vec<f32> = (0..4).flat_map(|j| (0..3).map(move |i| (i * 4 + j) as f32)).collect();
    assert_eq!(back.as_slice::<f32>(), &want[..]);

    // Pinned and managed memory: zeroed and readable by the host on return,
    // after device work on the stream wrote them.
    for device in [
        DLDevice {
            device_type: kDLCUDAHost,
            device_id: 0,
        },
        DLDevice {
            device_type: kDLCUDAManaged,
            device_id: 0,
        },
    ] {
        let h = make(false, &[3, 4], F32, device, s);
        // SAFETY: as above.
        let rc = unsafe { devtensor_copy(h.dl(), a.dl(), s) };
        assert_eq!(rc, DevtensorStatus::Ok, "{}", last_error());
        assert_eq!(h.as_slice::<f32>(), &host[..], "{device:?}");
        let z = make(true, &[3, 4], F32, device, s);
        assert!(z.as_slice::<f32>().iter().all(|&v| v == 0.0), "{device:?}");
    }

    // A stream for the CPU, or a GPU this machine lacks, is refused.
    let mut none = ptr::null_mut();
    // SAFETY: `shape` holds 2 sizes; `none` is writable.
    unsafe {
        assert_eq!(
            devtensor_empty(shape.as_ptr(), 2, F32, CPU, s, &mut none),
            DevtensorStatus::InvalidArgument
        );
        let missing = DLDevice {
            device_type: kDLCUDA,
            device_id: 77,
        };
        assert_eq!(
            devtensor_empty(shape.as_ptr(), 2, F32, missing, ptr::null_mut(), &mut none),
            DevtensorStatus::BackendUnavailable
        );
        assert!(last_error().contains("no CUDA device 77"), "{}", last_error());
    }

    // Every deleter once; the device pool's blocks come back, and its cache goes.
    drop((a, b, back));
    assert_eq!(devtensor_live_tensors(), live);
    stream.synchronize().unwrap();
    let mut stats = DevtensorMemoryStats::default();
    // SAFETY: `stats` and `released` are writable.
    unsafe {
        assert_eq!(devtensor_memory_stats(cuda0, &mut stats), DevtensorStatus::Ok);
        assert_eq!(stats.allocated, 0, "{stats:?}");
        let mut released = 0;
        assert_eq!(devtensor_empty_cache(cuda0, &mut released), DevtensorStatus::Ok);
        assert!(released > 0);
        assert_eq!(
            devtensor_set_stream(cuda0, ptr::null_mut(), ptr::null_mut()),
            DevtensorStatus::Ok
        );
    }
}

#[cfg(not(feature = "cuda"))]
fn run_cuda() {
    unreachable!("without the cuda feature the CUDA backend is unavailable")
}
