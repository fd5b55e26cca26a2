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
    default_stream: devtensor::backend::cuda::stream::CudaStream::default_stream,
    handoff: devtensor::backend::cuda::stream::handoff,
    synchronize_streams: devtensor::backend::cuda::stream::synchronize_streams,
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
    // A freed block the caching pool keeps, and a dropped stream kept for reuse:
    // the child must be served from neither.
    drop(Tensor::empty(&[4], DType::F32, dev(0)).unwrap());
    drop(CudaStream::new(0).unwrap());
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
                && matches!(
                    CudaStream::new(0),
                    Err(devtensor::Error::ForkedChild {
                        backend: devtensor::Backend::Cuda
                    })
                )
                && devtensor::backend::cuda::context::current_device().is_err()
                && cpu.transpose(0, 1).unwrap().contiguous().is_ok()
        };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child at once; the inherited tensor is leaked, not
        // freed through the parent's context.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let status = wait_for_child(pid, "touching CUDA");
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
        let s = CudaStream::default_stream(0);
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

/// The thread's current stream (`devtensor::stream::set_current_stream`, what
/// Python's `with devtensor.stream(s)` sets): allocations are ordered on it,
/// copies and fills run on it, and other threads keep the default stream.
#[test]
fn current_stream_carries_allocations_copies_and_fills() {
    if !ready("current_stream_carries_allocations_copies_and_fills") {
        return;
    }
    use devtensor::stream::{current_stream, set_current_stream};
    let s = CudaStream::new(0).unwrap();
    let h = s.handle();
    assert_eq!(
        CudaStream::current(0).raw() as usize,
        1,
        "the legacy default stream when none is set"
    );
    assert_eq!(set_current_stream(dev(0), Some(h)), None);
    assert_eq!(CudaStream::current(0).raw(), s.raw());
    std::thread::spawn(|| assert_eq!(CudaStream::current(0).raw() as usize, 1))
        .join()
        .unwrap();
    let t = Tensor::full(&[256], 2.5f32, dev(0)).unwrap(); // allocated and filled on `s`
    assert_eq!(
        t.storage().streams().as_slice(),
        &[h],
        "allocated on the current stream"
    );
    // A device-to-host copy on `s`, synchronised: the host sees the fill's
    // values (the stream is not asked whether it is idle: beside the other
    // tests, memory they free records events on pooled streams such as `s`,
    // as tests/gpu_cuda_stream_pool.rs notes).
    let host = t.to(Device::Cpu).unwrap();
    assert_eq!(host.to_vec::<f32>().unwrap(), vec![2.5; 256]);
    assert_eq!(set_current_stream(dev(0), None), Some(h));
    assert_eq!(current_stream(dev(0)), None);
    // The default stream touches `t` next: order it after `s` first.
    devtensor::backend::cuda::stream::handoff(&s, &CudaStream::default_stream(0)).unwrap();
    t.fill(1.0f32).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 256]);
    devtensor::backend::cuda::stream::synchronize_device(0).unwrap();
}

/// `cuPointerGetAttribute` names each memory kind; host memory the driver does
/// not know is an error.
#[test]
fn pointer_device_names_memory_kinds() {
    if !ready("pointer_device_names_memory_kinds") {
        return;
    }
    use devtensor::backend::cuda::context::pointer_device;
    for d in [Device::Cuda(0), Device::CudaManaged(0), Device::CudaHost] {
        let t = Tensor::empty(&[64], DType::U8, d).unwrap();
        assert_eq!(pointer_device(t.data_ptr() as u64).unwrap(), d);
        assert_eq!(
            pointer_device(t.data_ptr() as u64 + 10).unwrap(),
            d,
            "inside an allocation too"
        );
    }
    let cpu = Tensor::empty(&[64], DType::U8, Device::Cpu).unwrap();
    assert!(pointer_device(cpu.data_ptr() as u64).is_err());
}

/// `make_current` leaves the GPU current (torch's `set_device`), and
/// `restore_context` puts the previous context back.
#[test]
fn make_current_and_restore_context() {
    if !ready("make_current_and_restore_context") {
        return;
    }
    use devtensor::backend::cuda::context::{current_context, current_device, make_current, restore_context};
    let before = current_context().unwrap().map_or(0, |c| c as usize);
    let prev = make_current(0).unwrap();
    assert_eq!(prev, before);
    assert_eq!(current_device().unwrap(), Some(0));
    // SAFETY: `prev` was current on this thread (or 0, none).
    unsafe { restore_context(prev).unwrap() };
    assert_eq!(current_context().unwrap().map_or(0, |c| c as usize), before);
}

/// A consumer that destroys its own stream before it releases an export (CuPy
/// does when the stream object is collected first): the export must not have
/// recorded that stream, or the free would record an event on a dangling
/// handle (a SIGSEGV in the driver on an H100; the emulated driver stops the
/// process with a message). Our own streams are recorded (see the suite's
/// `a_consumer_stream_dropped_before_the_release_still_orders_the_free`).
#[test]
fn a_foreign_consumer_stream_is_not_recorded_so_it_may_be_destroyed_first() {
    use cudarc::driver::sys;
    if !ready("a_foreign_consumer_stream_is_not_recorded_so_it_may_be_destroyed_first") {
        return;
    }
    let n = 1 << 12;
    let t = Tensor::full(&[n], 5u32, dev(0)).unwrap();
    let gpu = devtensor::backend::cuda::context::device(0).unwrap();
    let foreign = {
        let _current = gpu.bind().unwrap();
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; GPU 0's context is current.
        let rc = unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        s
    };
    // SAFETY: a live stream of GPU 0 while the export is made.
    let handle = unsafe { devtensor::stream::StreamHandle::from_raw(foreign as usize) };
    let dl = t
        .to_dlpack_versioned(devtensor::dlpack::ExportOptions {
            stream: Some(handle),
            ..Default::default()
        })
        .into_raw();
    assert!(
        !t.storage().streams().contains(&handle),
        "a consumer's own stream was recorded on the exported memory"
    );
    {
        let _current = gpu.bind().unwrap();
        // SAFETY: the stream made above, destroyed once, with nothing queued.
        let rc = unsafe { sys::cuStreamDestroy_v2(foreign) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    }
    drop(t);
    // SAFETY: a live export, freed once, after its consumer's stream is gone.
    unsafe { ((*dl).deleter.unwrap())(dl) };
    let again = Tensor::full(&[n], 9u32, dev(0)).unwrap();
    assert_eq!(again.to_vec::<u32>().unwrap(), vec![9; n]);
    devtensor::dlpack::drain_deleters();
}

/// A host read of managed memory waits for work a blocking stream other than
/// the legacy one queued on it: here the calling thread's per-thread default
/// stream (DLPack value 2), recorded on the storage. Synchronising the legacy
/// stream alone does not wait for it (Driver API, "Stream synchronization
/// behavior": the legacy stream's *work* waits for the blocking streams' earlier
/// work; a synchronize of the legacy stream waits for its own work only).
#[test]
fn host_reads_of_managed_memory_wait_for_the_per_thread_default_stream() {
    use cudarc::driver::sys;
    use devtensor::stream::StreamHandle;
    if !ready("host_reads_of_managed_memory_wait_for_the_per_thread_default_stream") {
        return;
    }
    let n = 1 << 16;
    let per_thread = 2usize as sys::CUstream;
    for round in 0..4 {
        let m = Tensor::zeros(&[n], DType::U32, Device::CudaManaged(0)).unwrap();
        let slow = Tensor::empty(&[1 << 22], DType::U32, dev(0)).unwrap();
        {
            let _current = devtensor::backend::cuda::context::device(0).unwrap().bind().unwrap();
            // SAFETY: live device and managed buffers of GPU 0, its context current.
            unsafe {
                assert_eq!(
                    sys::cuMemsetD32Async(slow.data_ptr() as u64, 1, 1 << 22, per_thread),
                    sys::CUresult::CUDA_SUCCESS
                );
                assert_eq!(
                    sys::cuMemsetD32Async(m.data_ptr() as u64, 7, n, per_thread),
                    sys::CUresult::CUDA_SUCCESS
                );
            }
        }
        m.storage().record_stream(StreamHandle::CUDA_PER_THREAD);
        slow.storage().record_stream(StreamHandle::CUDA_PER_THREAD);
        let v = m.to_vec::<u32>().unwrap();
        assert!(
            v.iter().all(|&x| x == 7),
            "round {round}: the host read {} stale elements",
            v.iter().filter(|&&x| x != 7).count()
        );
    }
}

/// A fork()ed child's `empty_cache` of a GPU its parent used gets the typed
/// error, as every other CUDA entry point does: the cached blocks (and the
/// events recorded on them) are the parent's driver state, which the child
/// must not call into (a real driver may hang), nor report as released.
#[cfg(target_os = "linux")]
#[test]
fn forked_child_cannot_empty_the_parents_cache() {
    if !ready("forked_child_cannot_empty_the_parents_cache") {
        return;
    }
    // A cached block with an event on it: used on a stream of ours, then freed.
    let s = CudaStream::new(0).unwrap();
    let t = Tensor::zeros(&[1 << 16], DType::U8, dev(0)).unwrap();
    t.storage().record_stream(s.handle());
    drop(t);
    // SAFETY: the child only calls devtensor, then `_exit`s without unwinding
    // into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            matches!(
                devtensor::backend::empty_cache(dev(0)),
                Err(devtensor::Error::ForkedChild {
                    backend: devtensor::Backend::Cuda
                })
            )
        })
        .unwrap_or(false);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let status = wait_for_child(pid, "in empty_cache");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's empty_cache did not return ForkedChild: status {status:#x}"
    );
    // The parent's pool is unaffected.
    devtensor::backend::empty_cache(dev(0)).unwrap();
    assert_eq!(
        Tensor::full(&[3], 4u8, dev(0)).unwrap().to_vec::<u8>().unwrap(),
        vec![4; 3]
    );
}

/// The wait status of forked child `pid`, which is killed (and the test
/// failed) if it has not ended within a minute: a hang, `what` it hung doing.
#[cfg(target_os = "linux")]
fn wait_for_child(pid: libc::pid_t, what: &str) -> libc::c_int {
    let start = std::time::Instant::now();
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return status;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            // SAFETY: our own child, which hangs.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            panic!("the forked child hung {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
