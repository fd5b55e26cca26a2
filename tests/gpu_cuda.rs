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
    default_stream: devtensor::backend::cuda::stream::CudaStream::legacy,
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

/// A fork()ed child of a process that initialized CUDA gets a typed error from
/// every CUDA entry point, never a call into the inherited driver state (which
/// can hang), and its CPU copies still run in parallel.
#[cfg(target_os = "linux")]
#[test]
fn forked_child_gets_a_typed_error_for_inherited_cuda() {
    if !ready("forked_child_gets_a_typed_error_for_inherited_cuda") {
        return;
    }
    // Allocations and plain copies only (no kernel): what the child inherits is
    // a driver initialized with a context, an allocation and a copy.
    let parent = Tensor::from_slice(&[1.5f32; 1000], &[1000])
        .unwrap()
        .to(dev(0))
        .unwrap();
    // A freed block the caching pool keeps: the child must not be served from it.
    drop(Tensor::empty(&[4], DType::F32, dev(0)).unwrap());
    // SAFETY: the child only calls devtensor, then `_exit`s without unwinding
    // into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let child = || {
            let forked = |r: devtensor::Result<Tensor>| {
                matches!(
                    r,
                    Err(devtensor::Error::ForkedChild {
                        backend: devtensor::Backend::Cuda
                    })
                )
            };
            let cpu = Tensor::zeros(&[2048, 2048], DType::F32, Device::Cpu).unwrap();
            forked(Tensor::empty(&[4], DType::F32, dev(0)))
                && forked(parent.to(Device::Cpu))
                && devtensor::backend::cuda::context::current_device().is_err()
                && cpu.transpose(0, 1).unwrap().contiguous().is_ok()
        };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child at once; the inherited tensor is leaked, not
        // freed through the parent's context.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let start = std::time::Instant::now();
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            // SAFETY: our own child, which hangs.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            panic!("the forked child hung touching CUDA");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    // The parent's CUDA is unaffected.
    assert_eq!(parent.to_vec::<f32>().unwrap(), vec![1.5; 1000]);
}

/// Event timing under a driver older than 12.8, which has `cuEventElapsedTime`
/// but not `cuEventElapsedTime_v2` (cudarc would panic on the missing symbol).
/// The emulated driver poses as a 12.4 driver in a child process.
#[test]
fn event_timing_works_under_a_driver_older_than_12_8() {
    const CHILD: &str = "DEVTENSOR_TEST_OLD_DRIVER_CHILD";
    if !ready("event_timing_works_under_a_driver_older_than_12_8") {
        return;
    }
    if std::env::var_os(CHILD).is_some() {
        use devtensor::backend::cuda::stream::CudaEvent;
        let s = CudaStream::legacy(0);
        let (start, end) = (CudaEvent::new(0, true).unwrap(), CudaEvent::new(0, true).unwrap());
        start.record(&s).unwrap();
        Tensor::zeros(&[1 << 12], DType::F32, dev(0)).unwrap();
        end.record(&s).unwrap();
        end.synchronize().unwrap();
        assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
        return;
    }
    if !common::emulated(devtensor::backend::cuda_status()) {
        println!(
            "SKIP event_timing_works_under_a_driver_older_than_12_8: only the emulated driver can pose as an older one"
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "event_timing_works_under_a_driver_older_than_12_8",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("DEVTENSOR_EMU_DRIVER_VERSION", "12040")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "under a 12.4 driver:\n{text}");
    assert!(text.contains("1 passed"), "{text}");
}
