//! CUDA memory behaviour that pool figures show: pinned staging of host↔device
//! copies (issue 12 item 2), the stream-ordered allocator's own pool (item 9)
//! and peer copies (item 12). A process of their own, one test at a time, so no
//! other test's allocations move the figures. Without a device every test
//! prints `SKIP` and passes, unless `DEVTENSOR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use cudarc::driver::sys;
use devtensor::backend::cuda::alloc::{CudaAlloc, CudaMemory, pool};
use devtensor::backend::cuda::stream::{CudaStream, handoff};
use devtensor::backend::memory_stats;
use devtensor::{DType, Device, Tensor};
use serial_test::serial;

fn ready(test: &str) -> bool {
    common::gpu_or_skip(test, devtensor::backend::cuda_status())
}

fn arange_u32(n: usize) -> Tensor {
    Tensor::from_slice(&(0..n as u32).collect::<Vec<_>>(), &[n]).unwrap()
}

/// The default bound of pinned staging memory (`staging_mb`, 16 MiB).
const STAGING_BOUND: usize = 16 << 20;

fn pinned() -> devtensor::alloc::MemoryStats {
    memory_stats(Device::CudaHost).unwrap()
}

#[test]
#[serial(memory)]
fn host_device_copies_pin_at_most_the_staging_bound() {
    if !ready("host_device_copies_pin_at_most_the_staging_bound") {
        return;
    }
    // 36 MiB of u32, more than twice the bound: a full-size pinned staging
    // tensor shows as that much pinned memory reserved (and kept cached).
    let (m, n) = (2304usize, 4096usize);
    let host = arange_u32(m * n).reshape(&[m as isize, n as isize]).unwrap();
    let want_t = host
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<u32>()
        .unwrap();
    let before = pinned();

    // Contiguous pageable memory: one DMA each way, nothing pinned.
    let g = host.to(Device::Cuda(0)).unwrap();
    assert_eq!(g.to_vec::<u32>().unwrap(), host.to_vec::<u32>().unwrap());
    assert_eq!(
        pinned().peak_reserved,
        before.peak_reserved,
        "contiguous copies pinned memory"
    );

    // A strided host view to the device, and a strided device view to the host.
    let gt = Tensor::empty(&[n, m], DType::U32, Device::Cuda(0)).unwrap();
    gt.copy_from(&host.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(gt.to_vec::<u32>().unwrap(), want_t, "strided h2d");
    let back = g.transpose(0, 1).unwrap().to(Device::Cpu).unwrap();
    assert_eq!(back.to_vec::<u32>().unwrap(), want_t, "strided d2h");
    // Device into a strided host view (a column block of a wider matrix).
    let wide = Tensor::zeros(&[m, n + 8], DType::U32, Device::Cpu).unwrap();
    let cols = wide.slice(1, Some(4), Some(4 + n as isize), 1).unwrap();
    cols.copy_from(&g).unwrap();
    assert_eq!(
        cols.to_vec::<u32>().unwrap(),
        host.to_vec::<u32>().unwrap(),
        "d2h into columns"
    );
    let edge = wide.slice(1, Some(0), Some(4), 1).unwrap().to_vec::<u32>().unwrap();
    assert!(edge.iter().all(|&x| x == 0), "d2h wrote outside its columns");

    let after = pinned();
    let grown = after.peak_reserved - before.peak_reserved;
    assert!(
        grown <= STAGING_BOUND,
        "host↔device copies of {} MiB pinned {} MiB (bound {} MiB)",
        (m * n * 4) >> 20,
        grown >> 20,
        STAGING_BOUND >> 20
    );
    // The staging memory is reused, not allocated again.
    gt.copy_from(&host.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(
        pinned().segment_allocs,
        after.segment_allocs,
        "staging memory allocated again"
    );
}

/// The release threshold of GPU 0's default memory pool (the one CuPy, JAX and
/// `cudaMallocAsync` share).
fn default_pool_threshold() -> u64 {
    let mut dev: sys::CUdevice = 0;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut value = 0u64;
    // SAFETY: the probe initialised the driver; every out-pointer is valid, and
    // RELEASE_THRESHOLD is a cuuint64_t.
    unsafe {
        assert_eq!(sys::cuDeviceGet(&mut dev, 0), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(
            sys::cuDeviceGetDefaultMemPool(&mut pool, dev),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&raw mut value).cast(),
            ),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    value
}

#[test]
#[serial(memory)]
fn async_allocator_keeps_to_its_own_pool_and_waits_for_recorded_streams() {
    if !ready("async_allocator_keeps_to_its_own_pool_and_waits_for_recorded_streams") {
        return;
    }
    let threshold = default_pool_threshold();
    let alloc = Arc::new(CudaAlloc::new(0, CudaMemory::DeviceAsync).unwrap());
    assert_eq!(
        default_pool_threshold(),
        threshold,
        "the device's default memory pool was reconfigured"
    );
    // A block read on a side stream is freed (cuMemFreeAsync, on the stream it
    // was allocated on) while that read may still be queued: the free must wait
    // for it. The emulated driver's race detector reports a free unordered with
    // the read as a use after free whatever the timing; a GPU may reuse the
    // memory under the read.
    let side = CudaStream::new(0).unwrap();
    let n = 1 << 16;
    for round in 0..4u32 {
        let out = Tensor::zeros(&[n], DType::U32, Device::Cuda(0)).unwrap();
        let tmp = Tensor::empty_in(alloc.clone(), &[n], DType::U32).unwrap();
        tmp.fill(round).unwrap();
        handoff(&CudaStream::default_stream(0), &side).unwrap(); // the fills before the read
        out.copy_from_on_stream(&tmp.flip(&[0]).unwrap(), side.handle())
            .unwrap();
        drop(tmp);
        side.synchronize().unwrap();
        assert_eq!(out.to_vec::<u32>().unwrap(), vec![round; n], "round {round}");
    }
}

#[test]
#[serial(memory)]
fn peer_copies_use_peer_access_without_staging() {
    if !ready("peer_copies_use_peer_access_without_staging") {
        return;
    }
    if devtensor::backend::cuda_status().devices.len() < 2 {
        println!("SKIP peer_copies_use_peer_access_without_staging: one CUDA device");
        return;
    }
    let host = arange_u32(1 << 20).reshape(&[1024, 1024]).unwrap();
    let src = host.to(Device::Cuda(0)).unwrap();
    let dst = Tensor::zeros(&[1024, 1024], DType::U32, Device::Cuda(1)).unwrap();
    let dst2 = Tensor::zeros(&[1024, 1024], DType::U32, Device::Cuda(1)).unwrap();
    let (p0, p1) = (
        pool(Device::Cuda(0)).unwrap().unwrap(),
        pool(Device::Cuda(1)).unwrap().unwrap(),
    );
    p0.reset_peak_stats();
    p1.reset_peak_stats();
    let (a0, a1) = (p0.memory_stats().allocated, p1.memory_stats().allocated);
    let pinned_before = pinned().peak_reserved;
    // A transposed and a contiguous copy from GPU 0 to GPU 1.
    dst.copy_from(&src.transpose(0, 1).unwrap()).unwrap();
    dst2.copy_from(&src).unwrap();
    let (s0, s1) = (p0.memory_stats(), p1.memory_stats());
    assert_eq!(
        (s0.peak_allocated - a0, s1.peak_allocated - a1),
        (0, 0),
        "staging tensors on the GPUs"
    );
    assert_eq!(pinned().peak_reserved, pinned_before, "pinned staging");
    assert_eq!(
        dst.to_vec::<u32>().unwrap(),
        host.transpose(0, 1).unwrap().to_vec::<u32>().unwrap()
    );
    assert_eq!(dst2.to_vec::<u32>().unwrap(), host.to_vec::<u32>().unwrap());
    // Peer access is on: enabling it again says so.
    let mut devs: [sys::CUdevice; 2] = [0, 0];
    let mut ctxs: [sys::CUcontext; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: the driver is initialised, both devices exist; the retained
    // primary contexts are released again, and the pushed one popped.
    unsafe {
        for i in 0..2 {
            assert_eq!(sys::cuDeviceGet(&mut devs[i], i as i32), sys::CUresult::CUDA_SUCCESS);
            assert_eq!(
                sys::cuDevicePrimaryCtxRetain(&mut ctxs[i], devs[i]),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        assert_eq!(sys::cuCtxPushCurrent_v2(ctxs[1]), sys::CUresult::CUDA_SUCCESS);
        let rc = sys::cuCtxEnablePeerAccess(ctxs[0], 0);
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped);
        for d in devs {
            sys::cuDevicePrimaryCtxRelease_v2(d);
        }
        assert_eq!(
            rc,
            sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
            "GPU 1 had no peer access to GPU 0"
        );
    }
}
