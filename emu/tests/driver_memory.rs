//! Memory: poison, never-reused addresses, device pointers fault on the host,
//! range checks of copies, out of memory, pinned/managed/async memory,
//! pointer attributes, and kernels faulting on bad addresses.

mod driver_support;

use std::ffi::c_void;
use std::ptr::null_mut;

use devtensor_emu::driver::context::*;
use devtensor_emu::driver::launch::*;
use devtensor_emu::driver::memory::*;
use devtensor_emu::driver::module::*;
use devtensor_emu::driver::stream::*;
use devtensor_emu::driver::*;
use driver_support::{child, in_child, setup};

/// `out[i] = in[i]` for i < n, 4-byte elements, one thread per element.
const COPY_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64

.visible .entry copy_u32(
	.param .u64 p_out,
	.param .u64 p_in,
	.param .u32 p_n
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [p_out];
	ld.param.u64 	%rd2, [p_in];
	ld.param.u32 	%r2, [p_n];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mul.wide.u32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd4, %rd5;
	ld.global.u32 	%r6, [%rd6];
	add.s64 	%rd7, %rd3, %rd5;
	st.global.u32 	[%rd7], %r6;
$L__BB0_2:
	ret;
}
";

fn load_copy_kernel() -> Handle {
    let text = std::ffi::CString::new(COPY_PTX).unwrap();
    // SAFETY: NUL-terminated PTX; valid out-pointers.
    unsafe {
        let mut m = null_mut();
        assert_eq!(
            cuModuleLoadData(&mut m, text.as_ptr().cast()),
            CUDA_SUCCESS,
            "{:?}",
            last_error_message()
        );
        let mut f = null_mut();
        assert_eq!(cuModuleGetFunction(&mut f, m, c"copy_u32".as_ptr()), CUDA_SUCCESS);
        let mut g = null_mut();
        assert_eq!(cuModuleGetFunction(&mut g, m, c"nope".as_ptr()), CUDA_ERROR_NOT_FOUND);
        f
    }
}

/// Launches copy_u32(out, in, n) with 128-thread blocks on `stream`.
fn launch_copy(f: Handle, out: u64, inp: u64, n: u32, stream: Handle) -> CUresult {
    let (mut o, mut i, mut nn) = (out, inp, n);
    let mut params: [*mut c_void; 3] = [(&raw mut o).cast(), (&raw mut i).cast(), (&raw mut nn).cast()];
    // SAFETY: three parameters, each pointing to a value of its size.
    unsafe {
        cuLaunchKernel(
            f,
            n.div_ceil(128),
            1,
            1,
            128,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn poison_and_never_reused() {
    setup();
    // SAFETY: valid out-pointers and buffers.
    unsafe {
        let mut a = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut a, 1000), CUDA_SUCCESS);
        assert_eq!(a % 256, 0, "256-byte alignment");
        let mut buf = vec![0u8; 1000];
        assert_eq!(cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), a, 1000), CUDA_SUCCESS);
        assert!(buf.iter().all(|&b| b == POISON), "fresh memory is poisoned, not zeroed");
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE, "double free");
        assert!(last_error_message().unwrap().contains("already freed"));
        let mut b = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut b, 1000), CUDA_SUCCESS);
        assert!(b >= a + 1000, "freed addresses are never handed out again");
        // A copy from the freed block names it.
        assert_eq!(
            cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), a, 16),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(last_error_message().unwrap().contains("freed"));
        let (mut free, mut total) = (0usize, 0usize);
        assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), CUDA_SUCCESS);
        assert!(free < total);
    }
}

#[test]
fn copy_past_end_is_invalid_value() {
    setup();
    // SAFETY: valid buffers; the out-of-range copies are refused before touching memory.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut a, 100), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 200), CUDA_SUCCESS);
        assert_eq!(cuMemcpyAsync(b, a, 101, null_mut()), CUDA_ERROR_INVALID_VALUE);
        let m = last_error_message().unwrap();
        assert!(
            m.contains("cuMemcpyAsync") && m.contains("past the end") && m.contains("100 bytes"),
            "{m}"
        );
        assert_eq!(cuMemcpyAsync(b, a, 100, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD32Async(b, 7, 51, null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemsetD32Async(b, 7, 50, null_mut()), CUDA_SUCCESS);
        let mut out = [0u32; 50];
        assert_eq!(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), b, 200), CUDA_SUCCESS);
        assert!(out.iter().all(|&v| v == 7));
    }
}

/// The bytes 0, 1, 2, … of a fresh 1024-byte device allocation.
fn counting_bytes() -> u64 {
    let src: Vec<u8> = (0..1024).map(|i| i as u8).collect();
    let mut a = 0u64;
    // SAFETY: a valid out-pointer; `src` holds the 1024 bytes copied.
    unsafe {
        assert_eq!(cuMemAlloc_v2(&mut a, 1024), CUDA_SUCCESS);
        assert_eq!(cuMemcpyHtoD_v2(a, src.as_ptr().cast(), 1024), CUDA_SUCCESS);
    }
    a
}

/// The 1024 bytes at `a`.
fn read_back(a: u64) -> Vec<u8> {
    let mut out = vec![0u8; 1024];
    // SAFETY: `out` holds the 1024 bytes copied.
    let r = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), a, 1024) };
    assert_eq!(r, CUDA_SUCCESS);
    out
}

/// The last call failed with `CUDA_ERROR_INVALID_VALUE` for an overlap.
fn refused_for_overlap(r: CUresult, call: &str) {
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE, "{call}");
    let m = last_error_message().unwrap();
    assert!(m.contains(call) && m.contains("may not overlap"), "{m}");
}

/// The last error message names `at` as the first shared byte.
fn overlap_named(at: u64) {
    let m = last_error_message().unwrap();
    assert!(m.contains(&format!("overlap at {at:#x}")), "{m}");
}

/// A `CUDA_MEMCPY2D` between unified addresses.
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
fn overlapping_1d_copies_are_refused() {
    // Runtime API, cudaMemcpyAsync (and cudaMemcpy in the CUDA 4 reference):
    // "The memory areas may not overlap."
    setup();
    let a = counting_bytes();
    let before = read_back(a);
    // SAFETY: every range lies in `a`'s 1024 bytes, or in `buf` / `m` below.
    unsafe {
        refused_for_overlap(cuMemcpyAsync(a + 16, a, 32, null_mut()), "cuMemcpyAsync");
        // One shared byte is enough, in either direction.
        refused_for_overlap(cuMemcpyDtoDAsync_v2(a + 15, a, 16, null_mut()), "cuMemcpyDtoDAsync_v2");
        refused_for_overlap(cuMemcpyDtoD_v2(a, a + 15, 16), "cuMemcpyDtoD_v2");
        overlap_named(a + 15);
        // A copy onto itself overlaps entirely.
        refused_for_overlap(cuMemcpyDtoD_v2(a, a, 16), "cuMemcpyDtoD_v2");
        refused_for_overlap(cuMemcpyAsync(a + 100, a + 100, 1, null_mut()), "cuMemcpyAsync");
        // Nothing was copied, and the context still works: adjacent areas are fine.
        assert_eq!(read_back(a), before);
        assert_eq!(cuMemcpyAsync(a + 16, a, 16, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemcpyDtoD_v2(a + 512, a + 528, 16), CUDA_SUCCESS);
        let after = read_back(a);
        assert_eq!(&after[16..32], &before[0..16]);
        assert_eq!(&after[512..528], &before[528..544]);
        // Managed and pageable host memory: cuMemcpy, host to host.
        let mut m = 0u64;
        assert_eq!(cuMemAllocManaged(&mut m, 64, 1), CUDA_SUCCESS);
        std::slice::from_raw_parts_mut(m as *mut u8, 64).fill(3);
        refused_for_overlap(cuMemcpy(m + 8, m, 16), "cuMemcpy");
        assert_eq!(cuMemcpy(m + 16, m, 16), CUDA_SUCCESS);
        // Managed to managed is device to device: the host did not wait.
        assert_eq!(cuStreamSynchronize(null_mut()), CUDA_SUCCESS);
        assert!(std::slice::from_raw_parts(m as *const u8, 64).iter().all(|&b| b == 3));
        let mut buf = [7u8; 64];
        let host = buf.as_mut_ptr();
        let p = host as u64;
        refused_for_overlap(cuMemcpy(p + 63, p + 63, 1), "cuMemcpy");
        refused_for_overlap(cuMemcpy(p + 62, p + 61, 2), "cuMemcpy");
        *host = 1;
        assert_eq!(cuMemcpy(p + 63, p, 1), CUDA_SUCCESS);
        assert_eq!(*host.add(63), 1);
        assert_eq!(cuMemFree_v2(m), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
    }
}

#[test]
fn overlapping_2d_rows_are_refused() {
    // Runtime API, cudaMemcpy2D / cudaMemcpy2DAsync: "The memory areas may not overlap."
    setup();
    let a = counting_bytes();
    let before = read_back(a);
    // SAFETY: complete CUDA_MEMCPY2Ds whose rows lie in `a`'s 1024 bytes.
    unsafe {
        // Source rows [0,16) [64,80) [128,144) [192,208); destination rows 8 bytes on.
        let c = memcpy2d(a + 8, 64, a, 64, 16, 4);
        refused_for_overlap(cuMemcpy2DAsync_v2(&c, null_mut()), "cuMemcpy2DAsync_v2");
        refused_for_overlap(cuMemcpy2D_v2(&c), "cuMemcpy2D_v2");
        // Only the destination's first row meets the source's last, in one byte (207).
        let c = memcpy2d(a + 207, 64, a, 64, 16, 4);
        refused_for_overlap(cuMemcpy2DAsync_v2(&c, null_mut()), "cuMemcpy2DAsync_v2");
        overlap_named(a + 207);
        // Other pitches: destination rows [32,48) [64,80) …, the second one a source row.
        let c = memcpy2d(a + 32, 32, a, 64, 16, 4);
        refused_for_overlap(cuMemcpy2D_v2(&c), "cuMemcpy2D_v2");
        overlap_named(a + 64);
        // Onto itself.
        let c = memcpy2d(a, 64, a, 64, 16, 4);
        refused_for_overlap(cuMemcpy2DAsync_v2(&c, null_mut()), "cuMemcpy2DAsync_v2");
        assert_eq!(read_back(a), before, "nothing copied");
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
    }
}

#[test]
fn interleaved_and_adjacent_2d_rows_are_accepted() {
    // The areas are the rows copied, not the pitch-spanning boxes around them.
    setup();
    let a = counting_bytes();
    let before = read_back(a);
    // SAFETY: complete CUDA_MEMCPY2Ds whose rows lie in `a`'s 1024 bytes.
    unsafe {
        // Rows [0,16) [64,80) [128,144) [192,208) into [16,32) [80,96) [144,160) [208,224):
        // the boxes overlap, the rows touch without sharing a byte.
        let c = memcpy2d(a + 16, 64, a, 64, 16, 4);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_SUCCESS);
        // Rows [256,272) [320,336) [384,400) [448,464) into [304,320) [336,352)
        // [368,384) [400,416): two pitches whose rows interleave.
        let c = memcpy2d(a + 304, 32, a + 256, 64, 16, 4);
        assert_eq!(cuMemcpy2D_v2(&c), CUDA_SUCCESS);
        // Adjacent dense blocks: [512,640) onto [640,768).
        let c = memcpy2d(a + 640, 32, a + 512, 32, 32, 4);
        assert_eq!(cuMemcpy2DAsync_v2(&c, null_mut()), CUDA_SUCCESS);
        let after = read_back(a);
        for r in 0..4 {
            let (s, d) = (r * 64, 16 + r * 64);
            assert_eq!(&after[d..d + 16], &before[s..s + 16], "row {r}");
            let (s, d) = (256 + r * 64, 304 + r * 32);
            assert_eq!(&after[d..d + 16], &before[s..s + 16], "row {r}");
        }
        assert_eq!(&after[640..768], &before[512..640]);
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
    }
}

#[test]
fn host_dereference_of_device_pointer_faults() {
    if !in_child() {
        let (st, err) = child("host_dereference_of_device_pointer_faults", &[]);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGSEGV), "expected SIGSEGV, got {st:?}: {err}");
        return;
    }
    setup();
    let mut a = 0u64;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cuMemAlloc_v2(&mut a, 64) }, CUDA_SUCCESS);
    // SAFETY: none: this is the bug being demonstrated; the process must die here.
    let v = unsafe { std::ptr::read_volatile(a as *const u8) };
    println!("read {v}: the device pointer was readable on the host");
}

#[test]
fn out_of_memory() {
    if !in_child() {
        let (st, err) = child("out_of_memory", &[("DEVTENSOR_EMU_MEMORY", "1M")]);
        assert!(st.success(), "{err}");
        return;
    }
    setup();
    // SAFETY: valid out-pointers.
    unsafe {
        let mut a = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut a, 768 << 10), CUDA_SUCCESS);
        let mut b = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut b, 512 << 10), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 512 << 10), CUDA_SUCCESS);
    }
}

#[test]
fn pinned_managed_and_async_memory() {
    setup();
    // SAFETY: valid out-pointers; pinned/managed memory is host memory of the sizes asked.
    unsafe {
        let mut h: *mut c_void = null_mut();
        assert_eq!(cuMemHostAlloc(&mut h, 4096, 1), CUDA_SUCCESS);
        assert_eq!(*(h as *const u8), POISON);
        std::slice::from_raw_parts_mut(h.cast::<u32>(), 1024)
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as u32);
        let mut m = 0u64;
        assert_eq!(cuMemAllocManaged(&mut m, 4096, 1), CUDA_SUCCESS);
        assert_eq!(cuMemAllocManaged(&mut m, 4096, 8), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemAllocManaged(&mut m, 4096, 1), CUDA_SUCCESS);
        let mut pool = null_mut();
        assert_eq!(cuDeviceGetDefaultMemPool(&mut pool, 0), CUDA_SUCCESS);
        let mut threshold = u64::MAX;
        assert_eq!(
            cuMemPoolSetAttribute(pool, 4, (&raw mut threshold).cast()),
            CUDA_SUCCESS
        );
        let mut got = 0u64;
        assert_eq!(cuMemPoolGetAttribute(pool, 4, (&raw mut got).cast()), CUDA_SUCCESS);
        assert_eq!(got, u64::MAX);
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        let mut d = 0u64;
        assert_eq!(cuMemAllocAsync(&mut d, 4096, s), CUDA_SUCCESS);
        let mut pp: Handle = null_mut();
        assert_eq!(cuPointerGetAttribute((&raw mut pp).cast(), 17, d), CUDA_SUCCESS);
        assert_eq!(pp, pool);
        // pinned → device → managed, all in stream order.
        assert_eq!(cuMemcpyAsync(d, h as u64, 4096, s), CUDA_SUCCESS);
        assert_eq!(cuMemcpyAsync(m, d, 4096, s), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(d, s), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(d, s), CUDA_ERROR_INVALID_VALUE, "second free");
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        let got = std::slice::from_raw_parts(m as *const u32, 1024);
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as u32));
        // Pointer attributes (group__CUDA__UNIFIED).
        let mut mt = 0u32;
        assert_eq!(cuPointerGetAttribute((&raw mut mt).cast(), 2, h as u64), CUDA_SUCCESS);
        assert_eq!(mt, CU_MEMORYTYPE_HOST);
        let mut managed = 0u8;
        assert_eq!(
            cuPointerGetAttribute((&raw mut managed).cast(), 8, m + 100),
            CUDA_SUCCESS
        );
        assert_eq!(managed, 1);
        let mut start = 0u64;
        assert_eq!(
            cuPointerGetAttribute((&raw mut start).cast(), 11, m + 100),
            CUDA_SUCCESS
        );
        assert_eq!(start, m);
        let mut x = 0u64;
        let local = 5u64;
        assert_eq!(
            cuPointerGetAttribute((&raw mut x).cast(), 2, &local as *const u64 as u64),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuPointerGetAttribute((&raw mut x).cast(), 2, d),
            CUDA_ERROR_INVALID_VALUE,
            "freed"
        );
        assert_eq!(cuMemFreeHost(h), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(m), CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
}

#[test]
fn kernel_copies_and_reports() {
    setup();
    let f = load_copy_kernel();
    // SAFETY: valid buffers and handles.
    unsafe {
        let n = 1000u32;
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut a, 4 * n as usize), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 4 * n as usize), CUDA_SUCCESS);
        let src: Vec<u32> = (0..n).map(|i| i * 3).collect();
        assert_eq!(cuMemcpyHtoD_v2(a, src.as_ptr().cast(), 4 * n as usize), CUDA_SUCCESS);
        let before = devtensor_emu::driver::report::totals();
        assert_eq!(launch_copy(f, b, a, n, null_mut()), CUDA_SUCCESS);
        let mut out = vec![0u32; n as usize];
        assert_eq!(
            cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), b, 4 * n as usize),
            CUDA_SUCCESS
        );
        assert_eq!(out, src);
        let after = devtensor_emu::driver::report::totals();
        assert!(after.launches > before.launches);
        assert!(after.global_load_requests > before.global_load_requests);
        // Launch limits (group__CUDA__EXEC / device attributes).
        let (mut o, mut i, mut nn) = (b, a, n);
        let mut params: [*mut c_void; 3] = [(&raw mut o).cast(), (&raw mut i).cast(), (&raw mut nn).cast()];
        let p = params.as_mut_ptr();
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, null_mut(), p, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, null_mut(), p, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, null_mut(), p, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, null_mut(), p, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 49 << 10, null_mut(), p, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, null_mut(), null_mut(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 228 << 10),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 << 10),
            CUDA_SUCCESS
        );
        // `extra` with a packed buffer.
        let mut packed = [0u8; 20];
        packed[0..8].copy_from_slice(&b.to_ne_bytes());
        packed[8..16].copy_from_slice(&a.to_ne_bytes());
        packed[16..20].copy_from_slice(&4u32.to_ne_bytes());
        let mut size = packed.len();
        let mut extra: [*mut c_void; 5] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            packed.as_mut_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&raw mut size).cast(),
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, null_mut(), null_mut(), extra.as_mut_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
}

#[test]
fn kernel_out_of_bounds_is_sticky_illegal_address() {
    if !in_child() {
        let (st, err) = child("kernel_out_of_bounds_is_sticky_illegal_address", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("past the end"), "{err}");
        return;
    }
    setup();
    let f = load_copy_kernel();
    // SAFETY: valid buffers and handles.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut a, 4 * 100), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 4 * 200), CUDA_SUCCESS);
        // Reads 200 elements of a 100-element buffer.
        assert_eq!(
            launch_copy(f, b, a, 200, null_mut()),
            CUDA_SUCCESS,
            "launch errors are asynchronous"
        );
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        let mut c = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut c, 16), CUDA_ERROR_ILLEGAL_ADDRESS, "sticky");
        assert_eq!(cuStreamSynchronize(null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

#[test]
fn kernel_reading_freed_memory_faults() {
    if !in_child() {
        let (st, err) = child("kernel_reading_freed_memory_faults", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("freed by cuMemFree_v2"), "{err}");
        return;
    }
    setup();
    let f = load_copy_kernel();
    // SAFETY: valid buffers and handles.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut a, 4 * 64), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut b, 4 * 64), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
        assert_eq!(launch_copy(f, b, a, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

#[test]
fn kernel_peer_access_needs_enabling() {
    if !in_child() {
        let (st, err) = child("kernel_peer_access_needs_enabling", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("peer access"), "{err}");
        return;
    }
    let c0 = setup();
    let f = load_copy_kernel();
    // SAFETY: valid buffers and handles.
    unsafe {
        let mut c1 = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c1), CUDA_SUCCESS);
        let mut remote = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut remote, 256), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c0), CUDA_SUCCESS);
        let mut local = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut local, 256), CUDA_SUCCESS);
        // cuMemcpyPeer works without peer access (copy engines).
        assert_eq!(cuMemcpyPeer(local, c0, remote, c1, 256), CUDA_SUCCESS);
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
        assert_eq!(launch_copy(f, local, remote, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);
        assert_eq!(launch_copy(f, local, remote, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

/// Pool memory is not peer memory. cuMemPoolCreate (group__CUDA__MALLOC__ASYNC):
/// "By default, the pool's memory will be accessible from the device it is
/// allocated on"; CUDA Programming Guide, Stream Ordered Memory Allocator,
/// "Device Accessibility for Multi-GPU Support": "memory pool allocation
/// accessibility does not follow cudaDeviceEnablePeerAccess or
/// cuCtxEnablePeerAccess. Instead, the API cudaMemPoolSetAccess modifies what
/// devices can access allocations from a pool." A kernel of device 0 reading
/// device 1's cuMemAllocAsync block faults even with peer access enabled; the
/// copy engines (cuMemcpyPeer) still reach it.
#[test]
fn kernel_peer_access_does_not_reach_pool_memory() {
    if !in_child() {
        let (st, err) = child("kernel_peer_access_does_not_reach_pool_memory", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("cuMemPoolSetAccess"), "{err}");
        return;
    }
    let c0 = setup();
    let f = load_copy_kernel();
    // SAFETY: valid buffers and handles.
    unsafe {
        let mut c1 = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c1), CUDA_SUCCESS);
        let mut remote = 0u64;
        assert_eq!(cuMemAllocAsync(&mut remote, 256, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD32Async(remote, 3, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c0), CUDA_SUCCESS);
        let mut local = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut local, 256), CUDA_SUCCESS);
        assert_eq!(cuMemcpyPeer(local, c0, remote, c1, 256), CUDA_SUCCESS);
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
        assert_eq!(launch_copy(f, local, remote, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

/// The copies that name their sides' kinds refuse memory of the other kind
/// (`CUDA_ERROR_INVALID_VALUE`, nothing copied). group__CUDA__MEM: cuMemcpyHtoD
/// "Copies from host memory to device memory. dstDevice and srcHost are the base
/// addresses of the destination and source"; cuMemcpyDtoH "Copies from device to
/// host memory"; cuMemcpyDtoD "Copies from device memory to device memory";
/// CUDA_MEMCPY2D: "If srcMemoryType is CU_MEMORYTYPE_HOST, srcHost and srcPitch
/// specify the (host) base address ... If srcMemoryType is CU_MEMORYTYPE_DEVICE,
/// srcDevice and srcPitch specify the (device) base address". The runtime's
/// cudaMemcpy page: "Calling cudaMemcpy() with dst and src pointers that do not
/// match the direction of the copy results in an undefined behavior." A device
/// pointer is no host memory (the host faults on it), pageable memory no device
/// memory (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS is 0). Pinned memory is
/// both: group__CUDA__UNIFIED, "Automatic Mapping of Host Allocated Host Memory":
/// "The pointer value through which allocated host memory may be accessed in
/// kernels on all devices that support unified addressing is the same as the
/// pointer value through which that memory is accessed on the host" — so a
/// CU_MEMORYTYPE_DEVICE side may be pinned memory.
#[test]
fn typed_copies_refuse_memory_of_the_wrong_kind() {
    setup();
    // SAFETY: every buffer holds the 256 bytes copied; refused copies touch nothing.
    unsafe {
        let (mut d, mut d2) = (0u64, 0u64);
        assert_eq!(cuMemAlloc_v2(&mut d, 256), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut d2, 256), CUDA_SUCCESS);
        let mut pinned = null_mut();
        assert_eq!(cuMemHostAlloc(&mut pinned, 256, 0), CUDA_SUCCESS);
        let (mut h, mut h2) = (vec![7u8; 256], vec![0u8; 256]);
        let (hp, h2p) = (h.as_mut_ptr().cast::<c_void>(), h2.as_mut_ptr().cast::<c_void>());
        let s = null_mut();
        let wrong = |r: CUresult, call: &str, what: &str| {
            assert_eq!(r, CUDA_ERROR_INVALID_VALUE, "{call} {what}");
            let m = last_error_message().unwrap();
            assert!(m.contains(call) && m.contains(what), "{m}");
        };
        wrong(
            cuMemcpyHtoD_v2(d, d2 as *const c_void, 256),
            "cuMemcpyHtoD_v2",
            "is device memory",
        );
        wrong(
            cuMemcpyHtoD_v2(h2p as u64, hp, 256),
            "cuMemcpyHtoD_v2",
            "is pageable host memory",
        );
        wrong(
            cuMemcpyDtoH_v2(d2 as *mut c_void, d, 256),
            "cuMemcpyDtoH_v2",
            "is device memory",
        );
        wrong(
            cuMemcpyDtoH_v2(h2p, hp as u64, 256),
            "cuMemcpyDtoH_v2",
            "is pageable host memory",
        );
        wrong(
            cuMemcpyDtoD_v2(h2p as u64, d, 256),
            "cuMemcpyDtoD_v2",
            "is pageable host memory",
        );
        wrong(
            cuMemcpyDtoD_v2(d, hp as u64, 256),
            "cuMemcpyDtoD_v2",
            "is pageable host memory",
        );
        wrong(
            cuMemcpyHtoDAsync_v2(d, d2 as *const c_void, 256, s),
            "cuMemcpyHtoDAsync_v2",
            "is device memory",
        );
        wrong(
            cuMemcpyDtoHAsync_v2(h2p, hp as u64, 256, s),
            "cuMemcpyDtoHAsync_v2",
            "is pageable host memory",
        );
        wrong(
            cuMemcpyDtoDAsync_v2(d, hp as u64, 256, s),
            "cuMemcpyDtoDAsync_v2",
            "is pageable host memory",
        );
        let mut c = memcpy2d(d, 16, d2, 16, 16, 16);
        c.src_memory_type = CU_MEMORYTYPE_HOST;
        c.src_host = d2 as *const c_void;
        wrong(cuMemcpy2D_v2(&c), "cuMemcpy2D_v2", "is device memory");
        let mut c = memcpy2d(h2p as u64, 16, d, 16, 16, 16);
        c.dst_memory_type = CU_MEMORYTYPE_DEVICE;
        wrong(
            cuMemcpy2DAsync_v2(&c, s),
            "cuMemcpy2DAsync_v2",
            "is pageable host memory",
        );
        // Nothing was copied.
        assert!(h2.iter().all(|&b| b == 0));
        // The right kinds, pinned memory on either side, and the unified copies.
        assert_eq!(cuMemcpyHtoD_v2(d, hp, 256), CUDA_SUCCESS);
        assert_eq!(cuMemcpyDtoD_v2(pinned as u64, d, 256), CUDA_SUCCESS);
        assert_eq!(cuMemcpyHtoD_v2(d2, pinned, 256), CUDA_SUCCESS);
        let mut c = memcpy2d(d, 16, pinned as u64, 16, 16, 16);
        c.src_memory_type = CU_MEMORYTYPE_DEVICE;
        assert_eq!(cuMemcpy2D_v2(&c), CUDA_SUCCESS, "{:?}", last_error_message());
        assert_eq!(cuMemcpyAsync(h2p as u64, d2, 256, s), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        assert!(h2.iter().all(|&b| b == 7));
    }
}

/// cuMemAllocFromPoolAsync (group__CUDA__MALLOC__ASYNC): "The specified memory
/// pool may be from a device different than that of the specified hStream."
/// The block is the pool's device's memory, in the stream's order.
#[test]
fn pool_of_another_device_allocates_in_stream_order() {
    setup();
    // SAFETY: valid out-pointers and handles.
    unsafe {
        let mut props: CUmemPoolProps = std::mem::zeroed();
        props.alloc_type = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
        props.location_type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
        props.location_id = 1;
        let mut pool = null_mut();
        assert_eq!(cuMemPoolCreate(&mut pool, &props), CUDA_SUCCESS);
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        let mut d = 0u64;
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut d, 4096, pool, s),
            CUDA_SUCCESS,
            "{:?}",
            last_error_message()
        );
        let mut ordinal = -1i32;
        assert_eq!(cuPointerGetAttribute((&raw mut ordinal).cast(), 9, d), CUDA_SUCCESS);
        assert_eq!(ordinal, 1);
        let mut pp: Handle = null_mut();
        assert_eq!(cuPointerGetAttribute((&raw mut pp).cast(), 17, d), CUDA_SUCCESS);
        assert_eq!(pp, pool);
        let src = vec![5u8; 4096];
        let mut out = vec![0u8; 4096];
        assert_eq!(cuMemcpyHtoDAsync_v2(d, src.as_ptr().cast(), 4096, s), CUDA_SUCCESS);
        assert_eq!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d, 4096, s), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(d, s), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        assert_eq!(out, src);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
}
