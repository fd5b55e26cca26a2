//! GPU tests on ROCm: the shared suite plus ROCm's DLPack stream values and
//! managed memory. Without an AMD GPU every test prints `SKIP <test>: ...` and
//! passes, unless `DEVTENSOR_REQUIRE_ROCM=1` (an AMD runner).
#![cfg(feature = "rocm")]

mod common;
#[path = "gpu/suite.rs"]
mod suite;

gpu_suite! {
    status: devtensor::backend::rocm_status(),
    dev: Device::Rocm,
    host: Device::RocmHost,
    managed: |_| None::<Device>,
    stream: devtensor::backend::rocm::stream::RocmStream,
    default_stream: devtensor::backend::rocm::stream::RocmStream::default_stream,
    handoff: devtensor::backend::rocm::stream::handoff,
    synchronize_streams: devtensor::backend::rocm::stream::synchronize_streams,
    current_device: devtensor::backend::rocm::context::current_device,
}

use devtensor::backend::rocm::alloc::{RocmAlloc, RocmMemory};
use devtensor::backend::rocm::stream::RocmStream;

#[test]
fn every_rocm_entry_point_reports_itself_unavailable_without_a_device() {
    let status = devtensor::backend::rocm_status();
    if status.is_available() {
        println!("SKIP every_rocm_entry_point_reports_itself_unavailable_without_a_device: an AMD GPU is present");
        return;
    }
    let unavailable = |r: devtensor::Result<()>| matches!(r, Err(devtensor::Error::BackendUnavailable { .. }));
    assert!(unavailable(Tensor::empty(&[4], DType::F32, Device::Rocm(0)).map(drop)));
    assert!(unavailable(Tensor::empty(&[4], DType::F32, Device::RocmHost).map(drop)));
    assert!(unavailable(RocmAlloc::new(0, RocmMemory::Managed).map(drop)));
    assert!(unavailable(RocmStream::new(0).map(drop)));
    assert!(unavailable(
        devtensor::backend::rocm::stream::RocmEvent::new(0, false).map(drop)
    ));
    assert!(unavailable(devtensor::backend::memory_stats(Device::Rocm(0)).map(drop)));
    let cpu = Tensor::zeros(&[4], DType::F32, Device::Cpu).unwrap();
    assert!(unavailable(cpu.to(Device::Rocm(0)).map(drop)));
    // The probe still names the runtime it found and why it cannot be used.
    assert!(status.versions.iter().any(|(k, _)| *k == "HIP runtime"), "{status:?}");
    assert!(status.unavailable_reason().contains("no AMD GPU"), "{status:?}");
}

#[test]
fn dlpack_streams_map_to_rocm_handles() {
    // Pure mapping: no device is touched for the default-stream values.
    // SAFETY: only the default-stream values and -1 are used.
    unsafe {
        assert!(RocmStream::from_dlpack(0, None).unwrap().unwrap().raw().is_null());
        assert!(RocmStream::from_dlpack(0, Some(0)).unwrap().unwrap().raw().is_null());
        assert!(RocmStream::from_dlpack(0, Some(-1)).unwrap().is_none());
        for bad in [1, 2, -2] {
            assert!(RocmStream::from_dlpack(0, Some(bad)).is_err(), "stream {bad}");
        }
    }
}

#[test]
fn managed_memory_is_described_as_rocm_device_memory() {
    if !ready("managed_memory_is_described_as_rocm_device_memory") {
        return;
    }
    use devtensor::alloc::NDAlloc;
    let a = std::sync::Arc::new(RocmAlloc::new(0, RocmMemory::Managed).unwrap());
    assert_eq!(a.device(), Device::Rocm(0));
    let t = Tensor::empty_in(a.clone(), &[256], DType::F32).unwrap();
    t.fill(1.5f32).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.5; 256]);
    drop(t);
    assert_eq!(a.stats().live_bytes, 0);
}
