//! GPU tests on CUDA: the shared suite plus CUDA's DLPack stream values.
//! Without a device every test prints `SKIP <test>: ...` and passes, unless
//! `DEVTENSOR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]

mod common;
#[path = "gpu/suite.rs"]
mod suite;

gpu_suite! {
    status: devtensor::backend::cuda_status(),
    dev: Device::Cuda,
    host: Device::CudaHost,
    managed: |i| Some(Device::CudaManaged(i)),
    stream: devtensor::backend::cuda::stream::CudaStream,
    copy_on_stream: devtensor::backend::cuda::copy::copy_on_stream,
    handoff: devtensor::backend::cuda::stream::handoff,
    current_device: devtensor::backend::cuda::context::current_device,
}

use devtensor::backend::cuda::stream::CudaStream;

#[test]
fn dlpack_streams_map_to_cuda_handles() {
    if !ready("dlpack_streams_map_to_cuda_handles") {
        return;
    }
    // SAFETY: only the default-stream values and -1 are used.
    unsafe {
        assert_eq!(CudaStream::from_dlpack(0, None).unwrap().unwrap().raw() as usize, 1);
        assert_eq!(CudaStream::from_dlpack(0, Some(2)).unwrap().unwrap().raw() as usize, 2);
        assert!(CudaStream::from_dlpack(0, Some(-1)).unwrap().is_none());
        assert!(CudaStream::from_dlpack(0, Some(0)).is_err());
    }
}
