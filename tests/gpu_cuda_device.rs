//! The current device (issue 12 item 5): a device named without an index
//! (`"cuda"`) is the calling thread's current GPU, and a process that uses only
//! GPU 1 (host↔device copies, pinned staging, pinned tensors) never retains
//! GPU 0's primary context. A process of its own: no test here touches GPU 0,
//! so the emulated driver's primary-context state of GPU 0 tells. Without two
//! devices every test prints `SKIP` and passes, unless `DEVTENSOR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]

mod common;

use cudarc::driver::sys;
use devtensor::{DType, Device, DeviceSpec, Tensor};

/// True with two GPUs at least. `DEVTENSOR_REQUIRE_GPU=1` asks for one GPU
/// (a real runner may have one: these tests then print `SKIP`);
/// `DEVTENSOR_REQUIRE_GPUS=2` (the emulated driver's two, in CI) for two.
fn two_gpus(test: &str) -> bool {
    if !common::gpu_or_skip(test, devtensor::backend::cuda_status()) {
        return false;
    }
    let n = devtensor::backend::cuda_status().devices.len();
    if n < 2 {
        let required = std::env::var("DEVTENSOR_REQUIRE_GPUS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok());
        assert!(
            required.is_none_or(|r| r <= n),
            "{test}: needs two CUDA devices, found {n} (DEVTENSOR_REQUIRE_GPUS={required:?})"
        );
        println!("SKIP {test}: needs two CUDA devices");
        return false;
    }
    true
}

/// Whether GPU `ordinal`'s primary context is active (retained by someone):
/// `cuDevicePrimaryCtxGetState` (group__CUDA__PRIMARY__CTX).
fn primary_active(ordinal: i32) -> bool {
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: the probe initialised the driver; valid out-pointers.
    let rc = unsafe { sys::cuDevicePrimaryCtxGetState(ordinal, &mut flags, &mut active) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    active != 0
}

/// Makes GPU `ordinal`'s primary context current on the calling thread, as
/// torch's `torch.cuda.set_device` does (retained, never released here).
fn make_current(ordinal: i32) {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the ordinal exists (two GPUs checked).
    let rc = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, ordinal) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: a retained primary context.
    assert_eq!(unsafe { sys::cuCtxSetCurrent(ctx) }, sys::CUresult::CUDA_SUCCESS);
}

fn arange(n: usize) -> Tensor {
    Tensor::from_slice(&(0..n as u32).collect::<Vec<_>>(), &[n]).unwrap()
}

#[test]
fn a_device_without_an_index_is_the_current_one() {
    if !two_gpus("a_device_without_an_index_is_the_current_one") {
        return;
    }
    // A fresh thread: nothing current yet, then GPU 1 made current.
    std::thread::spawn(|| {
        make_current(1);
        assert_eq!(
            "cuda".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Current(Device::Cuda(0))
        );
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(1));
        assert_eq!("cuda_managed".parse::<Device>().unwrap(), Device::CudaManaged(1));
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
        let t = Tensor::empty(&[4], DType::F32, "cuda".parse().unwrap()).unwrap();
        assert_eq!(t.device(), Device::Cuda(1));
        // Pinned memory filled and copied with GPU 1 current runs on GPU 1.
        let p = Tensor::full(&[64], 7u32, Device::CudaHost).unwrap();
        let d = p.to("cuda".parse().unwrap()).unwrap();
        assert_eq!(d.device(), Device::Cuda(1));
        assert_eq!(d.to(Device::Cpu).unwrap().to_vec::<u32>().unwrap(), vec![7; 64]);
    })
    .join()
    .unwrap();
    assert!(!primary_active(0), "GPU 0's primary context was retained");
}

#[test]
fn a_process_using_only_gpu_1_never_retains_gpu_0() {
    if !two_gpus("a_process_using_only_gpu_1_never_retains_gpu_0") {
        return;
    }
    // No context current on this thread: every call names GPU 1 explicitly.
    let n = 1 << 16;
    let host = arange(n);
    let dev = host.to(Device::Cuda(1)).unwrap(); // contiguous: one DMA
    let back = dev.to(Device::Cpu).unwrap();
    assert_eq!(back.to_vec::<u32>().unwrap(), host.to_vec::<u32>().unwrap());
    // Strided views both ways: staged through the pinned ring.
    let host2 = arange(n).reshape(&[256, 256]).unwrap();
    let dst = Tensor::empty(&[256, 256], DType::U32, Device::Cuda(1)).unwrap();
    dst.copy_from(&host2.permute(&[1, 0]).unwrap()).unwrap();
    let out = Tensor::empty(&[256, 256], DType::U32, Device::Cpu).unwrap();
    out.copy_from(&dst.permute(&[1, 0]).unwrap()).unwrap();
    assert_eq!(out.to_vec::<u32>().unwrap(), host2.to_vec::<u32>().unwrap());
    // A pinned tensor of our own, filled and copied both ways.
    let pinned = Tensor::empty(&[n], DType::U32, Device::CudaHost).unwrap();
    pinned.copy_from(&dev).unwrap();
    let dev2 = Tensor::empty(&[n], DType::U32, Device::Cuda(1)).unwrap();
    dev2.copy_from(&pinned).unwrap();
    assert_eq!(
        dev2.to(Device::Cpu).unwrap().to_vec::<u32>().unwrap(),
        host.to_vec::<u32>().unwrap()
    );
    drop((pinned, dev, dev2, dst));
    assert!(primary_active(1));
    assert!(
        !primary_active(0),
        "GPU 0's primary context was retained by a process using only GPU 1"
    );
}
