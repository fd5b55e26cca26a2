//! The driver's entry points: initialisation, device model, contexts, error
//! codes for bad arguments, error strings, cuGetProcAddress, struct layouts.
//! Expected values come from the CUDA Driver API reference (cited per test).

mod driver_support;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::offset_of;
use std::ptr::null_mut;

use devtensor_emu::driver::context::*;
use devtensor_emu::driver::device::*;
use devtensor_emu::driver::event::*;
use devtensor_emu::driver::memory::*;
use devtensor_emu::driver::module::*;
use devtensor_emu::driver::stream::*;
use devtensor_emu::driver::*;
use driver_support::{child, in_child, setup};

#[test]
fn not_initialized_before_cuinit() {
    // group__CUDA__INITIALIZE: "If cuInit() has not been called, any function
    // from the driver API will return CUDA_ERROR_NOT_INITIALIZED."
    if !in_child() {
        let (st, err) = child("not_initialized_before_cuinit", &[]);
        assert!(st.success(), "{err}");
        return;
    }
    // SAFETY: valid out-pointers.
    unsafe {
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), CUDA_ERROR_NOT_INITIALIZED);
        let mut p = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut p, 16), CUDA_ERROR_NOT_INITIALIZED);
        // cuDriverGetVersion works before cuInit.
        let mut v = 0;
        assert_eq!(cuDriverGetVersion(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 13000);
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        assert_eq!(cuDeviceGetCount(&mut n), CUDA_SUCCESS);
        assert_eq!(n, 2);
    }
}

#[test]
fn device_model() {
    setup();
    // SAFETY: valid buffers and out-pointers.
    unsafe {
        let mut name = [0 as c_char; 128];
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 128, 0), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "NVIDIA H100 80GB HBM3 (emulated)"
        );
        let attr = |a: c_int| {
            let mut v = -7;
            assert_eq!(cuDeviceGetAttribute(&mut v, a, 0), CUDA_SUCCESS, "attribute {a}");
            v
        };
        assert_eq!((attr(75), attr(76)), (9, 0)); // compute capability
        assert_eq!(attr(16), 132); // SMs
        assert_eq!(attr(10), 32); // warp
        assert_eq!(attr(1), 1024);
        assert_eq!((attr(2), attr(3), attr(4)), (1024, 1024, 64));
        assert_eq!((attr(5), attr(6), attr(7)), (i32::MAX, 65535, 65535));
        assert_eq!(attr(8), 48 << 10);
        assert_eq!(attr(97), 227 << 10);
        assert_eq!(attr(12), 65536);
        assert_eq!(attr(41), 1); // unified addressing
        assert_eq!(attr(88), 0); // pageable memory access
        assert_eq!(attr(83), 1); // managed
        assert_eq!(attr(89), 1); // concurrent managed
        assert_eq!(attr(11), i32::MAX); // max pitch
        assert_eq!(attr(115), 1); // memory pools
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 9999, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 7), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cuDeviceGetAttribute(null_mut(), 75, 0), CUDA_ERROR_INVALID_VALUE);
        let mut bytes = 0usize;
        assert_eq!(cuDeviceTotalMem_v2(&mut bytes, 1), CUDA_SUCCESS);
        assert_eq!(bytes, 80 << 30);
        let mut d = 0;
        assert_eq!(cuDeviceGet(&mut d, 2), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cuDeviceGet(&mut d, 1), CUDA_SUCCESS);
        assert_eq!(d, 1);
        let mut can = 0;
        assert_eq!(cuDeviceCanAccessPeer(&mut can, 0, 1), CUDA_SUCCESS);
        assert_eq!(can, 1);
        let mut bus = [0 as c_char; 32];
        assert_eq!(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, 1), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap().len(), 16);
    }
}

#[test]
fn contexts() {
    setup();
    // SAFETY: valid out-pointers.
    unsafe {
        let mut c0 = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c0, 0), CUDA_SUCCESS);
        let mut again = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut again, 0), CUDA_SUCCESS);
        assert_eq!(c0, again, "a device has one primary context");
        let mut cur = null_mut();
        assert_eq!(cuCtxGetCurrent(&mut cur), CUDA_SUCCESS);
        assert_eq!(cur, c0);
        let mut c1 = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxPushCurrent_v2(c1), CUDA_SUCCESS);
        let mut dev = -1;
        assert_eq!(cuCtxGetDevice(&mut dev), CUDA_SUCCESS);
        assert_eq!(dev, 1);
        let mut popped = null_mut();
        assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
        assert_eq!(popped, c1);
        assert_eq!(cuCtxGetDevice(&mut dev), CUDA_SUCCESS);
        assert_eq!(dev, 0);
        assert_eq!(cuCtxSetCurrent(0x1234 as Handle), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        assert_eq!(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);
        assert_eq!(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    }
    // A thread with no current context.
    std::thread::spawn(|| {
        // SAFETY: valid out-pointers.
        unsafe {
            let mut cur = 1 as Handle;
            assert_eq!(cuCtxGetCurrent(&mut cur), CUDA_SUCCESS);
            assert!(cur.is_null(), "no context: *pctx = NULL");
            let mut dev = 0;
            assert_eq!(cuCtxGetDevice(&mut dev), CUDA_ERROR_INVALID_CONTEXT);
            let mut p = 0u64;
            assert_eq!(cuMemAlloc_v2(&mut p, 64), CUDA_ERROR_INVALID_CONTEXT);
            let mut s = null_mut();
            assert_eq!(cuStreamCreate(&mut s, 0), CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuStreamSynchronize(null_mut()), CUDA_ERROR_INVALID_CONTEXT);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn bad_arguments() {
    setup();
    // SAFETY: deliberately bad arguments the driver must refuse without touching them.
    unsafe {
        assert_eq!(cuMemAlloc_v2(null_mut(), 16), CUDA_ERROR_INVALID_VALUE);
        let mut p = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut p, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemFree_v2(0xdead_0000), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuStreamCreate(null_mut(), 0), CUDA_ERROR_INVALID_VALUE);
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 0x10), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        // (A destroyed stream used again stops the process: the next test.)
        assert_eq!(cuStreamSynchronize(0x4242_0000 as Handle), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(null_mut()), CUDA_ERROR_INVALID_HANDLE);
        let mut e = null_mut();
        assert_eq!(cuEventCreate(&mut e, 0x40), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuEventCreate(&mut e, 0), CUDA_SUCCESS);
        assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
        // (A destroyed event used again stops the process: the next test.)
        assert_eq!(cuEventQuery(0x4242_0000 as Handle), CUDA_ERROR_INVALID_HANDLE);
        let mut m = null_mut();
        assert_eq!(cuModuleLoadData(&mut m, null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuModuleLoadData(&mut m, c"garbage".as_ptr().cast()),
            CUDA_ERROR_INVALID_IMAGE
        );
        let bad_ptx = c".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { frobnicate.u32 %r1; }\n";
        assert_eq!(
            cuModuleLoadData(&mut m, bad_ptx.as_ptr().cast()),
            CUDA_ERROR_INVALID_PTX
        );
        assert!(
            last_error_message().unwrap().contains("line"),
            "{:?}",
            last_error_message()
        );
        let mut f = null_mut();
        assert_eq!(
            cuModuleGetFunction(&mut f, 0x77 as Handle, c"k".as_ptr()),
            CUDA_ERROR_INVALID_HANDLE
        );
        let mut pool = null_mut();
        assert_eq!(cuDeviceGetDefaultMemPool(&mut pool, 5), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(
            cuMemPoolSetAttribute(0x99 as Handle, 4, (&mut 0u64 as *mut u64).cast()),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
}

/// A stream or event used after its destroy call stops the process with a
/// message: a real driver follows the dangling handle (SIGSEGV on an H100,
/// driver 580), so answering CUDA_ERROR_INVALID_HANDLE would hide a crash. A
/// handle the driver never issued is still only an error (the test before).
#[test]
fn a_destroyed_stream_or_event_used_again_stops_the_process() {
    if in_child() {
        setup();
        let call = std::env::var("EMU_DESTROYED_CALL").unwrap();
        // SAFETY: a deliberate use of a destroyed stream; the process must stop.
        unsafe {
            let mut s = null_mut();
            assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
            assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
            let rc = match call.as_str() {
                "synchronize" => cuStreamSynchronize(s),
                "record" => {
                    let mut e = null_mut();
                    assert_eq!(cuEventCreate(&mut e, 0), CUDA_SUCCESS);
                    cuEventRecord(e, s)
                }
                "destroy" => cuStreamDestroy_v2(s),
                event_call => {
                    let mut e = null_mut();
                    assert_eq!(cuEventCreate(&mut e, 0), CUDA_SUCCESS);
                    assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
                    match event_call {
                        "event_query" => cuEventQuery(e),
                        "event_wait" => cuStreamWaitEvent(null_mut(), e, 0),
                        _ => cuEventDestroy_v2(e),
                    }
                }
            };
            println!("the call returned {rc}");
        }
        return;
    }
    for call in [
        "synchronize",
        "record",
        "destroy",
        "event_query",
        "event_wait",
        "event_destroy",
    ] {
        let (status, stderr) = child(
            "a_destroyed_stream_or_event_used_again_stops_the_process",
            &[("EMU_DESTROYED_CALL", call)],
        );
        assert!(!status.success(), "{call}: the process went on ({status:?})\n{stderr}");
        let destroy = if call.starts_with("event") {
            "cuEventDestroy"
        } else {
            "cuStreamDestroy"
        };
        assert!(
            stderr.contains(&format!("used after {destroy}")),
            "{call}: no message\n{stderr}"
        );
    }
}

#[test]
fn error_strings() {
    // group__CUDA__ERROR: static strings; unknown codes → CUDA_ERROR_INVALID_VALUE, *pStr = NULL.
    // SAFETY: valid out-pointers.
    unsafe {
        let mut s: *const c_char = null_mut();
        assert_eq!(cuGetErrorName(700, &mut s), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(cuGetErrorString(2, &mut s), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "out of memory");
        assert_eq!(cuGetErrorName(12345, &mut s), CUDA_ERROR_INVALID_VALUE);
        assert!(s.is_null());
    }
}

#[test]
fn proc_address() {
    setup();
    // SAFETY: valid out-pointers; the returned pointer is called with its real signature.
    unsafe {
        let mut p: *mut c_void = null_mut();
        let mut status = -1;
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut p, 12080, 0, &mut status),
            CUDA_SUCCESS
        );
        assert_eq!(status, 0);
        assert_eq!(p, cuMemAlloc_v2 as *mut c_void);
        assert_eq!(
            cuGetProcAddress_v2(c"cuEventElapsedTime".as_ptr(), &mut p, 12080, 0, &mut status),
            CUDA_SUCCESS
        );
        assert_eq!(p, devtensor_emu::driver::event::cuEventElapsedTime_v2 as *mut c_void);
        assert_eq!(
            cuGetProcAddress_v2(c"cuEventElapsedTime".as_ptr(), &mut p, 12000, 0, &mut status),
            CUDA_SUCCESS
        );
        assert_eq!(p, devtensor_emu::driver::event::cuEventElapsedTime as *mut c_void);
        assert_eq!(
            cuGetProcAddress_v2(c"cuNoSuchThing".as_ptr(), &mut p, 12080, 0, &mut status),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(status, 1);
        assert!(p.is_null());
        let f: unsafe extern "C" fn(*mut c_int) -> CUresult = {
            assert_eq!(
                cuGetProcAddress_v2(c"cuDriverGetVersion".as_ptr(), &mut p, 12080, 0, null_mut()),
                CUDA_SUCCESS
            );
            std::mem::transmute(p)
        };
        let mut v = 0;
        assert_eq!(f(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 13000);
    }
}

#[test]
fn old_driver_refuses_newer_functions() {
    // cuEventElapsedTime_v2 appeared with driver 12.8 (cudarc's cuda-12080 bindings).
    if !in_child() {
        let (st, err) = child(
            "old_driver_refuses_newer_functions",
            &[("DEVTENSOR_EMU_DRIVER_VERSION", "12040")],
        );
        assert!(st.success(), "{err}");
        return;
    }
    setup();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        let mut v = 0;
        assert_eq!(cuDriverGetVersion(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 12040);
        let (mut a, mut b) = (null_mut(), null_mut());
        assert_eq!(cuEventCreate(&mut a, 0), CUDA_SUCCESS);
        assert_eq!(cuEventCreate(&mut b, 0), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(a, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventSynchronize(b), CUDA_SUCCESS);
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime_v2(&mut ms, a, b), CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(cuEventElapsedTime(&mut ms, a, b), CUDA_SUCCESS);
    }
}

#[test]
fn memcpy2d_layout() {
    // CUDA_MEMCPY2D as cuda.h declares it (LP64): size_t/pointers 8 bytes,
    // CUmemorytype a 4-byte enum padded to 8.
    assert_eq!(std::mem::size_of::<CudaMemcpy2D>(), 128);
    assert_eq!(offset_of!(CudaMemcpy2D, src_x_in_bytes), 0);
    assert_eq!(offset_of!(CudaMemcpy2D, src_y), 8);
    assert_eq!(offset_of!(CudaMemcpy2D, src_memory_type), 16);
    assert_eq!(offset_of!(CudaMemcpy2D, src_host), 24);
    assert_eq!(offset_of!(CudaMemcpy2D, src_device), 32);
    assert_eq!(offset_of!(CudaMemcpy2D, src_array), 40);
    assert_eq!(offset_of!(CudaMemcpy2D, src_pitch), 48);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_x_in_bytes), 56);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_y), 64);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_memory_type), 72);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_host), 80);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_device), 88);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_array), 96);
    assert_eq!(offset_of!(CudaMemcpy2D, dst_pitch), 104);
    assert_eq!(offset_of!(CudaMemcpy2D, width_in_bytes), 112);
    assert_eq!(offset_of!(CudaMemcpy2D, height), 120);
    // CUmemPoolProps: 88 bytes (4+4+8+8+8+2+1+53).
    assert_eq!(std::mem::size_of::<CUmemPoolProps>(), 88);
}

fn memcpy2d(dst: u64, dst_pitch: usize, src: u64, src_pitch: usize, w: usize, h: usize) -> CudaMemcpy2D {
    CudaMemcpy2D {
        src_x_in_bytes: 0,
        src_y: 0,
        src_memory_type: CU_MEMORYTYPE_UNIFIED,
        src_host: std::ptr::null(),
        src_device: src,
        src_array: null_mut(),
        src_pitch,
        dst_x_in_bytes: 0,
        dst_y: 0,
        dst_memory_type: CU_MEMORYTYPE_UNIFIED,
        dst_host: null_mut(),
        dst_device: dst,
        dst_array: null_mut(),
        dst_pitch,
        width_in_bytes: w,
        height: h,
    }
}

#[test]
fn memcpy2d_checks_and_copies() {
    setup();
    // SAFETY: buffers sized for the regions copied.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut a, 64 * 16), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 16 * 16), CUDA_SUCCESS);
        let src: Vec<u8> = (0..64 * 16).map(|i| i as u8).collect();
        assert_eq!(cuMemcpyHtoD_v2(a, src.as_ptr().cast(), src.len()), CUDA_SUCCESS);
        // Column block: 16 rows of 16 bytes from pitch 64 into pitch 16.
        let c = memcpy2d(b, 16, a + 8, 64, 16, 16);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_SUCCESS);
        let mut out = vec![0u8; 256];
        assert_eq!(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), b, 256), CUDA_SUCCESS);
        for r in 0..16 {
            assert_eq!(&out[r * 16..r * 16 + 16], &src[r * 64 + 8..r * 64 + 24]);
        }
        // WidthInBytes > pitch.
        let c = memcpy2d(b, 8, a, 64, 16, 2);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_ERROR_INVALID_VALUE);
        // Pitch above CU_DEVICE_ATTRIBUTE_MAX_PITCH.
        let c = memcpy2d(b, 1 << 31, a, 64, 16, 1);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_ERROR_INVALID_VALUE);
        // Rows past the end of the destination.
        let c = memcpy2d(b, 16, a, 64, 16, 17);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert!(last_error_message().unwrap().contains("past the end"));
        assert_eq!(
            cuMemcpy2DAsync_v2(std::ptr::null(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn cubin_checks() {
    // A cubin for another architecture: CUDA_ERROR_NO_BINARY_FOR_GPU; an sm_90
    // cubin whose PTX the NVRTC shim never recorded: CUDA_ERROR_INVALID_IMAGE
    // with a message saying so.
    if !in_child() {
        let dir = std::env::temp_dir().join(format!("emu-empty-ptx-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (st, err) = child("cubin_checks", &[("DEVTENSOR_EMU_PTX_CACHE", dir.to_str().unwrap())]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(st.success(), "{err}");
        assert!(err.contains("sm_80") && err.contains("no PTX recorded"), "{err}");
        return;
    }
    setup();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cubin");
    let sm80 = std::fs::read(fixtures.join("misc_nvrtc13_sm80.cubin")).unwrap();
    let sm90 = std::fs::read(fixtures.join("misc_nvrtc13_sm90.cubin")).unwrap();
    // SAFETY: complete cubin images, valid out-pointers.
    unsafe {
        let mut m = null_mut();
        assert_eq!(
            cuModuleLoadData(&mut m, sm80.as_ptr().cast()),
            CUDA_ERROR_NO_BINARY_FOR_GPU
        );
        assert_eq!(cuModuleLoadData(&mut m, sm90.as_ptr().cast()), CUDA_ERROR_INVALID_IMAGE);
    }
}
