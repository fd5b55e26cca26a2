//! GPU tests on CUDA: the shared suite plus CUDA-only stream and peer tests.
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
    managed: |i| Some(Device::CudaManaged(i))
}

use devtensor::backend::cuda::copy::copy_on_stream;
use devtensor::backend::cuda::stream::{CudaStream, handoff};

/// Enqueues `src → dst` on `stream`.
fn copy_on(stream: &CudaStream, dst: &Tensor, src: &Tensor) {
    copy_on_stream(dst, src, stream).unwrap();
}

#[test]
fn stream_handoff_orders_a_slow_producer_before_the_consumer() {
    if !ready("stream_handoff_orders_a_slow_producer_before_the_consumer") {
        return;
    }
    let producer = CudaStream::new(0).unwrap();
    let consumer = CudaStream::new(0).unwrap();
    let n = 1 << 26; // 256 MiB of u32: each pass takes milliseconds
    let big = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
    let scratch = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
    let expected = Tensor::from_slice(&(0..n as u32).collect::<Vec<_>>(), &[n])
        .unwrap()
        .to(dev(0))
        .unwrap();
    // A deliberately slow producer: many large transposing passes, then the real write.
    for _ in 0..20 {
        copy_on(
            &producer,
            &scratch.reshape(&[8192, -1]).unwrap(),
            &big.reshape(&[-1, 8192]).unwrap().transpose(0, 1).unwrap(),
        );
    }
    copy_on(&producer, &big, &expected);
    // The DLPack rule: event on the producer, wait on the consumer, no host block.
    handoff(&producer, &consumer).unwrap();
    let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
    copy_on(&consumer, &out, &big);
    consumer.synchronize().unwrap();
    producer.synchronize().unwrap();
    let got = out.slice(0, Some(-1000), None, 1).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(got, ((n - 1000) as u32..n as u32).collect::<Vec<_>>());
}

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

#[test]
fn peer_copies_between_gpus() {
    if !ready("peer_copies_between_gpus") {
        return;
    }
    if devtensor::backend::cuda_status().devices.len() < 2 {
        println!("SKIP peer_copies_between_gpus: one CUDA device");
        return;
    }
    let src = arange_u32(1 << 20).reshape(&[1024, 1024]).unwrap();
    let a = src.to(dev(0)).unwrap();
    let b = Tensor::zeros(&[1024, 1024], DType::U32, dev(1)).unwrap();
    b.copy_from(&a.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(
        b.to_vec::<u32>().unwrap(),
        src.transpose(0, 1).unwrap().to_vec::<u32>().unwrap()
    );
}
