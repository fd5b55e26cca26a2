//! devtensor's pool of dropped CUDA streams. A process of its own: memory that
//! other tests free records an event on every stream it was used on, pooled
//! ones included, and an event record is queued work until it completes
//! (`cuStreamQuery`, group__CUDA__STREAM: "all operations in the stream"), so
//! beside them a pooled stream may be busy the moment after it was handed out
//! idle. Here nothing else frees memory while a stream is asked. Without a
//! device the test prints `SKIP` and passes, unless `DEVTENSOR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]

mod common;

use devtensor::backend::cuda::stream::CudaStream;
use devtensor::{DType, Device, Tensor};

/// A new stream starts with nothing queued, as a created one does, though
/// devtensor reuses dropped streams instead of destroying them: one dropped
/// with work still queued is not handed out again until that work is done,
/// and an idle one is, so making and dropping streams makes no new driver
/// stream per call.
#[test]
fn a_new_stream_has_nothing_queued_even_when_reused() {
    let test = "a_new_stream_has_nothing_queued_even_when_reused";
    if !common::gpu_or_skip(test, devtensor::backend::cuda_status()) {
        return;
    }
    let n = 2048;
    let src = Tensor::zeros(&[n, n], DType::U32, Device::Cuda(0)).unwrap();
    let dst = Tensor::empty(&[n, n], DType::U32, Device::Cuda(0)).unwrap();
    src.to(Device::Cpu).unwrap(); // the fill done
    let busy = CudaStream::new(0).unwrap();
    let busy_raw = busy.raw() as usize;
    dst.copy_from_on_stream(&src.transpose(0, 1).unwrap(), busy.handle())
        .unwrap();
    drop(busy); // with the transpose perhaps still running
    // Handed out again only once its transpose is done (which may be by now),
    // so whichever stream comes has nothing queued.
    let fresh = CudaStream::new(0).unwrap();
    assert!(
        fresh.query().unwrap(),
        "a new stream (reused: {}) has work queued",
        fresh.raw() as usize == busy_raw
    );
    fresh.synchronize().unwrap();
    drop(fresh);
    // Two streams were ever made here, and one of them is idle: every later
    // stream is one of the two, and starts with nothing queued.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..32 {
        let s = CudaStream::new(0).unwrap();
        assert!(s.query().unwrap(), "a reused stream has work queued");
        seen.insert(s.raw() as usize);
    }
    assert!(
        seen.len() <= 2,
        "{} driver streams for 32 streams made and dropped",
        seen.len()
    );
    drop((src, dst));
}
