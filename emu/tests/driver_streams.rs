//! Streams, events and the race detector: legacy default stream vs blocking
//! and non-blocking streams (stream-sync-behavior), event record / wait /
//! query / elapsed time (group__CUDA__EVENT), races caught independently of
//! timing and correct programs left alone (also under the random delays of
//! DEVTENSOR_EMU_SEED); destroyed streams whose work goes on (waited for by
//! cuCtxSynchronize, cuMemFree and the legacy stream); races on pinned and
//! managed memory accessed by device work.

mod driver_support;

use std::ffi::c_void;
use std::ptr::null_mut;

use devtensor_emu::driver::context::*;
use devtensor_emu::driver::event::*;
use devtensor_emu::driver::launch::*;
use devtensor_emu::driver::memory::*;
use devtensor_emu::driver::module::*;
use devtensor_emu::driver::stream::*;
use devtensor_emu::driver::*;
use driver_support::{child, in_child, setup};

/// `out[i] = in[i] + 1` for i < n.
const INC_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64

.visible .entry inc_u32(
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
	add.s32 	%r7, %r6, 1;
	add.s64 	%rd7, %rd3, %rd5;
	st.global.u32 	[%rd7], %r7;
$L__BB0_2:
	ret;
}
";

const N: u32 = 4096;

struct Fx {
    f: Handle,
    a: u64,
    b: u64,
    c: u64,
}

fn fixture() -> Fx {
    setup();
    let text = std::ffi::CString::new(INC_PTX).unwrap();
    // SAFETY: valid PTX, out-pointers and buffers.
    unsafe {
        let mut m = null_mut();
        assert_eq!(
            cuModuleLoadData(&mut m, text.as_ptr().cast()),
            CUDA_SUCCESS,
            "{:?}",
            last_error_message()
        );
        let mut f = null_mut();
        assert_eq!(cuModuleGetFunction(&mut f, m, c"inc_u32".as_ptr()), CUDA_SUCCESS);
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        for p in [&mut a, &mut b, &mut c] {
            assert_eq!(cuMemAlloc_v2(p, 4 * N as usize), CUDA_SUCCESS);
        }
        let src: Vec<u32> = (0..N).collect();
        assert_eq!(cuMemcpyHtoD_v2(a, src.as_ptr().cast(), 4 * N as usize), CUDA_SUCCESS);
        // From pageable memory the copy may still be on its way to `a` when it
        // returns (api-sync-behavior): wait for it before non-blocking streams read `a`.
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        Fx { f, a, b, c }
    }
}

fn inc(f: Handle, out: u64, inp: u64, stream: Handle) {
    let (mut o, mut i, mut n) = (out, inp, N);
    let mut params: [*mut c_void; 3] = [(&raw mut o).cast(), (&raw mut i).cast(), (&raw mut n).cast()];
    // SAFETY: three parameters, each pointing to a value of its size.
    let rc = unsafe { cuLaunchKernel(f, N / 128, 1, 1, 128, 1, 1, 0, stream, params.as_mut_ptr(), null_mut()) };
    assert_eq!(rc, CUDA_SUCCESS);
}

fn read(p: u64) -> Vec<u32> {
    let mut out = vec![0u32; N as usize];
    // SAFETY: `out` holds N u32.
    let rc = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 4 * N as usize) };
    assert_eq!(rc, CUDA_SUCCESS, "{:?}", last_error_message());
    out
}

fn stream(flags: u32) -> Handle {
    setup();
    let mut s = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cuStreamCreate(&mut s, flags) }, CUDA_SUCCESS);
    s
}

/// Producer on `s1`, consumer on `s2`, with or without an event between them.
fn producer_consumer(s1: Handle, s2: Handle, with_event: bool) {
    let fx = fixture();
    inc(fx.f, fx.b, fx.a, s1);
    if with_event {
        let mut e = null_mut();
        // SAFETY: valid handles.
        unsafe {
            assert_eq!(cuEventCreate(&mut e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
            assert_eq!(cuEventRecord(e, s1), CUDA_SUCCESS);
            assert_eq!(cuStreamWaitEvent(s2, e, 0), CUDA_SUCCESS);
            // The wait captured the record: destroying the event right away is fine.
            assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
        }
    }
    inc(fx.f, fx.c, fx.b, s2);
    // SAFETY: valid handles.
    unsafe {
        assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS, "{:?}", last_error_message());
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS, "{:?}", last_error_message());
    }
    let want: Vec<u32> = (0..N).map(|i| i + 2).collect();
    assert_eq!(read(fx.c), want);
}

/// Runs this binary's test `name` in a child process once per emulator seed;
/// asserts each child exited successfully and returns `(seed, stderr)` pairs.
fn run_seeds(name: &str, seeds: &[&'static str]) -> Vec<(&'static str, String)> {
    seeds
        .iter()
        .map(|&seed| {
            let (st, err) = child(name, &[("DEVTENSOR_EMU_SEED", seed)]);
            assert!(st.success(), "seed {seed}: {err}");
            (seed, err)
        })
        .collect()
}

#[test]
fn event_orders_non_blocking_streams() {
    if !in_child() {
        for (seed, err) in run_seeds("event_orders_non_blocking_streams", &["0", "7", "12345"]) {
            assert!(!err.contains("race"), "seed {seed}: {err}");
        }
        return;
    }
    producer_consumer(stream(1), stream(1), true);
}

#[test]
fn race_without_event_is_caught() {
    if !in_child() {
        for (seed, err) in run_seeds("race_without_event_is_caught", &["0", "3"]) {
            assert!(
                err.contains("data race") && err.contains("inc_u32"),
                "seed {seed}: {err}"
            );
        }
        return;
    }
    let fx = fixture();
    let (s1, s2) = (stream(1), stream(1));
    inc(fx.f, fx.b, fx.a, s1);
    inc(fx.f, fx.c, fx.b, s2);
    // SAFETY: valid handles.
    unsafe {
        cuStreamSynchronize(s1);
        cuStreamSynchronize(s2);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED);
    }
}

/// api-sync-behavior (<https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html>),
/// Memcpy. Synchronous forms: "For transfers from pageable host memory to device memory, a
/// stream sync is performed before the copy is initiated. The function will return once the
/// pageable buffer has been copied to the staging memory for DMA transfer to device memory, but
/// the DMA to final destination may not have completed. For transfers from pinned host memory to
/// device memory, the function is synchronous with respect to the host. For transfers from device
/// to either pageable or pinned host memory, the function returns only once the copy has
/// completed." Asynchronous forms: "For transfers between device memory and pageable host memory,
/// the function might be synchronous with respect to host."
///
/// So a pageable copy's return orders nothing on the device: work on a non-blocking stream that
/// touches the copy's device range (or, for the async form, what the copy's stream did before
/// it) without an event or a synchronisation races with it. The pinned and device → host
/// synchronous copies, and a cuStreamSynchronize after the async one, do order it.
#[test]
fn pageable_copies_do_not_order_later_work() {
    const CASES: [(&str, bool); 6] = [
        ("async_htod", true),
        ("async_dtoh", true),
        ("sync_htod", true),
        ("sync_htod_pinned", false),
        ("sync_dtoh", false),
        ("async_htod_synchronized", false),
    ];
    if !in_child() {
        for (case, race) in CASES {
            let (st, err) = child("pageable_copies_do_not_order_later_work", &[("EMU_CASE", case)]);
            assert!(st.success(), "{case}: {err}");
            assert_eq!(err.contains("data race"), race, "{case}: {err}");
        }
        return;
    }
    let case = std::env::var("EMU_CASE").unwrap();
    let race = CASES.iter().find(|c| c.0 == case).unwrap().1;
    let fx = fixture();
    let (s1, s2) = (stream(1), stream(1));
    let bytes = 4 * N as usize;
    let mut host: Vec<u32> = (0..N).collect();
    // SAFETY: valid handles; `host` and the pinned buffer hold N u32.
    unsafe {
        match case.as_str() {
            "async_htod" | "async_htod_synchronized" => {
                assert_eq!(
                    cuMemcpyHtoDAsync_v2(fx.b, host.as_ptr().cast(), bytes, s1),
                    CUDA_SUCCESS
                );
                if case == "async_htod_synchronized" {
                    assert_eq!(cuStreamSynchronize(s1), CUDA_SUCCESS);
                }
                inc(fx.f, fx.c, fx.b, s2);
            }
            "async_dtoh" => {
                inc(fx.f, fx.b, fx.a, s1);
                assert_eq!(
                    cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), fx.b, bytes, s1),
                    CUDA_SUCCESS
                );
                inc(fx.f, fx.b, fx.a, s2);
            }
            "sync_htod" => {
                assert_eq!(cuMemcpyHtoD_v2(fx.b, host.as_ptr().cast(), bytes), CUDA_SUCCESS);
                inc(fx.f, fx.c, fx.b, s2);
            }
            "sync_htod_pinned" => {
                let mut p = null_mut();
                assert_eq!(cuMemHostAlloc(&mut p, bytes, 0), CUDA_SUCCESS);
                std::ptr::copy_nonoverlapping(host.as_ptr(), p.cast::<u32>(), N as usize);
                assert_eq!(cuMemcpyHtoD_v2(fx.b, p, bytes), CUDA_SUCCESS);
                inc(fx.f, fx.c, fx.b, s2);
            }
            "sync_dtoh" => {
                inc(fx.f, fx.b, fx.a, null_mut());
                assert_eq!(cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), fx.b, bytes), CUDA_SUCCESS);
                inc(fx.f, fx.b, fx.a, s2);
            }
            _ => unreachable!(),
        }
        let want = if race { CUDA_ERROR_LAUNCH_FAILED } else { CUDA_SUCCESS };
        assert_eq!(cuCtxSynchronize(), want, "{case}: {:?}", last_error_message());
    }
}

#[test]
fn legacy_stream_orders_blocking_streams() {
    if !in_child() {
        let (st, err) = child("legacy_stream_orders_blocking_streams", &[("DEVTENSOR_EMU_SEED", "11")]);
        assert!(st.success(), "{err}");
        assert!(!err.contains("race"), "{err}");
        return;
    }
    // Blocking stream → legacy: implicit synchronisation.
    producer_consumer(stream(0), null_mut(), false);
    // Legacy → blocking stream.
    producer_consumer(CU_STREAM_LEGACY as Handle, stream(0), false);
    // Per-thread default stream ↔ legacy.
    producer_consumer(CU_STREAM_PER_THREAD as Handle, null_mut(), false);
    // Same stream.
    let s = stream(1);
    producer_consumer(s, s, false);
}

#[test]
fn legacy_stream_does_not_order_non_blocking_streams() {
    if !in_child() {
        let (st, err) = child("legacy_stream_does_not_order_non_blocking_streams", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("data race"), "{err}");
        return;
    }
    let fx = fixture();
    let s = stream(CU_STREAM_NON_BLOCKING);
    inc(fx.f, fx.b, fx.a, s);
    inc(fx.f, fx.c, fx.b, null_mut());
    // SAFETY: valid handles.
    unsafe {
        cuStreamSynchronize(s);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED);
    }
}

#[test]
fn use_after_async_free_in_unordered_stream() {
    if !in_child() {
        let (st, err) = child("use_after_async_free_in_unordered_stream", &[]);
        assert!(st.success(), "{err}");
        // Either a race with the stream-ordered allocation/free, or (if the
        // free ran first) a read of freed memory.
        assert!(
            err.contains("data race") || err.contains("freed by cuMemFreeAsync"),
            "{err}"
        );
        return;
    }
    let fx = fixture();
    let (s1, s2) = (stream(1), stream(1));
    // SAFETY: valid handles and out-pointers.
    unsafe {
        let mut d = 0u64;
        assert_eq!(cuMemAllocAsync(&mut d, 4 * N as usize, s1), CUDA_SUCCESS);
        inc(fx.f, d, fx.a, s1);
        assert_eq!(cuMemFreeAsync(d, s1), CUDA_SUCCESS);
        inc(fx.f, fx.c, d, s2);
        cuStreamSynchronize(s1);
        cuStreamSynchronize(s2);
        let rc = cuCtxSynchronize();
        assert!(
            rc == CUDA_ERROR_LAUNCH_FAILED || rc == CUDA_ERROR_ILLEGAL_ADDRESS,
            "{rc}"
        );
    }
}

#[test]
fn host_sync_orders_later_work() {
    // Synchronising the producer's stream on the host orders everything the
    // host enqueues afterwards: no race.
    let fx = fixture();
    let (s1, s2) = (stream(1), stream(1));
    inc(fx.f, fx.b, fx.a, s1);
    // SAFETY: valid handles.
    unsafe { assert_eq!(cuStreamSynchronize(s1), CUDA_SUCCESS) };
    inc(fx.f, fx.c, fx.b, s2);
    // SAFETY: valid handles.
    unsafe { assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS, "{:?}", last_error_message()) };
    assert_eq!(read(fx.c), (0..N).map(|i| i + 2).collect::<Vec<_>>());
}

#[test]
fn events() {
    setup();
    let s = stream(1);
    // SAFETY: valid handles and out-pointers.
    unsafe {
        let (mut a, mut b, mut nt) = (null_mut(), null_mut(), null_mut());
        assert_eq!(cuEventCreate(&mut a, 0), CUDA_SUCCESS);
        assert_eq!(cuEventCreate(&mut b, 0), CUDA_SUCCESS);
        assert_eq!(cuEventCreate(&mut nt, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        let mut ms = -1f32;
        // group__CUDA__EVENT: never recorded → CUDA_SUCCESS from cuEventQuery,
        // CUDA_ERROR_INVALID_HANDLE from cuEventElapsedTime.
        assert_eq!(cuEventQuery(a), CUDA_SUCCESS);
        assert_eq!(cuEventSynchronize(a), CUDA_SUCCESS);
        assert_eq!(cuEventElapsedTime_v2(&mut ms, a, b), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventRecord(a, s), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(nt, s), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, s), CUDA_SUCCESS);
        assert_eq!(cuEventSynchronize(b), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(a), CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(s), CUDA_SUCCESS);
        assert_eq!(cuEventElapsedTime_v2(&mut ms, a, b), CUDA_SUCCESS);
        assert!(ms >= 0.0);
        assert_eq!(cuEventElapsedTime(&mut ms, a, b), CUDA_SUCCESS);
        assert_eq!(
            cuEventElapsedTime_v2(&mut ms, a, nt),
            CUDA_ERROR_INVALID_HANDLE,
            "DISABLE_TIMING"
        );
        assert_eq!(cuEventElapsedTime_v2(null_mut(), a, b), CUDA_ERROR_INVALID_VALUE);
        // An event of device 1 cannot be recorded on a stream of device 0.
        let mut c1 = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxPushCurrent_v2(c1), CUDA_SUCCESS);
        let mut e1 = null_mut();
        assert_eq!(cuEventCreate(&mut e1, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxPopCurrent_v2(null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(e1, s), CUDA_ERROR_INVALID_HANDLE);
        // Destroying an event with a pending record is allowed.
        assert_eq!(cuEventRecord(a, s), CUDA_SUCCESS);
        assert_eq!(cuEventDestroy_v2(a), CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
}

#[test]
fn many_streams_stress() {
    // Copies through a chain of streams joined by events, with random delays.
    if !in_child() {
        let (st, err) = child("many_streams_stress", &[("DEVTENSOR_EMU_SEED", "99")]);
        assert!(st.success(), "{err}");
        return;
    }
    let fx = fixture();
    let streams: Vec<Handle> = (0..6).map(|_| stream(1)).collect();
    let bufs = [fx.a, fx.b, fx.c];
    for (i, &s) in streams.iter().enumerate() {
        if i > 0 {
            let mut e = null_mut();
            // SAFETY: valid handles.
            unsafe {
                assert_eq!(cuEventCreate(&mut e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
                assert_eq!(cuEventRecord(e, streams[i - 1]), CUDA_SUCCESS);
                assert_eq!(cuStreamWaitEvent(s, e, 0), CUDA_SUCCESS);
                assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
            }
        }
        inc(fx.f, bufs[(i + 1) % 3], bufs[i % 3], s);
    }
    // SAFETY: valid handles.
    unsafe { assert_eq!(cuStreamSynchronize(*streams.last().unwrap()), CUDA_SUCCESS) };
    // 6 increments along a → b → c → a → b → c → a.
    assert_eq!(read(fx.a), (0..N).map(|i| i + 6).collect::<Vec<_>>());
    let _ = CU_MEMORYTYPE_DEVICE;
}

// ---------------------------------------------------------------------------
// Destroyed streams keep draining and are waited for.
//
// group__CUDA__STREAM, cuStreamDestroy_v2: "In case the device is still doing
// work in the stream hStream when cuStreamDestroy() is called, the function
// will return immediately and the resources associated with hStream will be
// released automatically once the device has completed all work in hStream."
// group__CUDA__CTX, cuCtxSynchronize: "Blocks until the current context has
// completed all preceding requested tasks" — including those of streams
// destroyed since.

/// Checks `got[i] == i + add`, naming the first mismatch (not the whole buffer).
fn expect_plus(got: &[u32], add: u32) {
    assert_eq!(got.len(), N as usize);
    if let Some(i) = (0..N).find(|&i| got[i as usize] != i + add) {
        panic!("element {i} is {:#x}, expected {}", got[i as usize], i + add);
    }
}

/// A pinned buffer of N u32 (device-accessible host memory the test can read
/// without a driver call, so a wait that did not happen shows in the data).
fn pinned() -> *mut u32 {
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cuMemHostAlloc(&mut p, 4 * N as usize, 0) }, CUDA_SUCCESS);
    p.cast()
}

/// Queues enough work on `s` (a chain of increments a → b → a → … ending in
/// `out`) that it is still busy when the stream is destroyed.
fn busy_chain(fx: &Fx, s: Handle, out: u64) {
    for _ in 0..3 {
        inc(fx.f, fx.b, fx.a, s);
        inc(fx.f, fx.a, fx.b, s);
    }
    inc(fx.f, out, fx.a, s);
}

#[test]
fn ctx_synchronize_waits_for_destroyed_stream() {
    if !in_child() {
        for (seed, err) in run_seeds("ctx_synchronize_waits_for_destroyed_stream", &["0", "5", "77"]) {
            assert!(!err.contains("race"), "seed {seed}: {err}");
        }
        return;
    }
    let fx = fixture();
    let p = pinned();
    let s = stream(CU_STREAM_NON_BLOCKING);
    busy_chain(&fx, s, p as u64);
    // SAFETY: valid handles.
    unsafe {
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS, "{:?}", last_error_message());
        // The host sees the destroyed stream's results without another call...
        let got = std::slice::from_raw_parts(p, N as usize).to_vec();
        expect_plus(&got, 7);
    }
    // ...and work enqueued after cuCtxSynchronize on an unrelated non-blocking
    // stream happens-after it (no race reported).
    let s2 = stream(CU_STREAM_NON_BLOCKING);
    inc(fx.f, fx.c, fx.a, s2);
    // SAFETY: valid handles.
    unsafe { assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS, "{:?}", last_error_message()) };
    expect_plus(&read(fx.c), 7);
}

#[test]
fn ctx_synchronize_orders_drained_destroyed_stream() {
    // The destroyed stream has finished (and been released) before
    // cuCtxSynchronize: the host still happens-after its work.
    if !in_child() {
        let (st, err) = child("ctx_synchronize_orders_drained_destroyed_stream", &[]);
        assert!(st.success(), "{err}");
        assert!(!err.contains("race"), "{err}");
        return;
    }
    let fx = fixture();
    let s = stream(CU_STREAM_NON_BLOCKING);
    inc(fx.f, fx.b, fx.a, s);
    // SAFETY: valid handle.
    assert_eq!(unsafe { cuStreamDestroy_v2(s) }, CUDA_SUCCESS);
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: plain call.
    assert_eq!(unsafe { cuCtxSynchronize() }, CUDA_SUCCESS);
    let s2 = stream(CU_STREAM_NON_BLOCKING);
    inc(fx.f, fx.c, fx.b, s2);
    // SAFETY: valid handle.
    unsafe { assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS, "{:?}", last_error_message()) };
    expect_plus(&read(fx.c), 2);
}

#[test]
fn mem_free_waits_for_destroyed_stream() {
    // group__CUDA__MEM / api-sync-behavior: cuMemFree synchronises with the
    // device; work still queued on a destroyed stream is device work.
    if !in_child() {
        for (seed, err) in run_seeds("mem_free_waits_for_destroyed_stream", &["0", "9"]) {
            assert!(!err.contains("race") && !err.contains("freed"), "seed {seed}: {err}");
        }
        return;
    }
    let fx = fixture();
    let s = stream(CU_STREAM_NON_BLOCKING);
    busy_chain(&fx, s, fx.c);
    // SAFETY: valid handles.
    unsafe {
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(fx.b), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS, "{:?}", last_error_message());
    }
    expect_plus(&read(fx.c), 7);
}

/// cuMemFree_v2 (group__CUDA__MEM): "This API will not perform any implicit
/// synchronization when the pointer was allocated with cuMemAllocAsync or
/// cuMemAllocFromPoolAsync. Callers must ensure that all accesses to these
/// pointer have completed before invoking cuMemFree." A kernel still using pool
/// memory freed so is a use after free; after a cuStreamSynchronize it is not.
#[test]
fn mem_free_of_pool_memory_does_not_synchronize() {
    if !in_child() {
        for (case, race) in [("unsynchronized", true), ("synchronized", false)] {
            let (st, err) = child("mem_free_of_pool_memory_does_not_synchronize", &[("EMU_CASE", case)]);
            assert!(st.success(), "{case}: {err}");
            assert_eq!(err.contains("use after free"), race, "{case}: {err}");
        }
        return;
    }
    let synchronized = std::env::var("EMU_CASE").unwrap() == "synchronized";
    let fx = fixture();
    let s = stream(CU_STREAM_NON_BLOCKING);
    // SAFETY: valid handles and out-pointer.
    unsafe {
        let mut p = 0u64;
        assert_eq!(cuMemAllocAsync(&mut p, 4 * N as usize, s), CUDA_SUCCESS);
        inc(fx.f, p, fx.a, s);
        if synchronized {
            assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        }
        assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
        let want = if synchronized {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_LAUNCH_FAILED
        };
        assert_eq!(cuCtxSynchronize(), want, "{:?}", last_error_message());
    }
}

#[test]
fn legacy_stream_waits_for_destroyed_blocking_stream() {
    // stream-sync-behavior: "the legacy stream first waits on all blocking
    // streams" — a destroyed blocking stream still doing work is one of them.
    if !in_child() {
        for (seed, err) in run_seeds("legacy_stream_waits_for_destroyed_blocking_stream", &["0", "13"]) {
            assert!(!err.contains("race"), "seed {seed}: {err}");
        }
        return;
    }
    let fx = fixture();
    let s = stream(0);
    busy_chain(&fx, s, fx.b);
    // SAFETY: valid handle.
    assert_eq!(unsafe { cuStreamDestroy_v2(s) }, CUDA_SUCCESS);
    inc(fx.f, fx.c, fx.b, null_mut());
    // SAFETY: plain call (NULL: the legacy default stream).
    let rc = unsafe { cuStreamSynchronize(null_mut()) };
    assert_eq!(rc, CUDA_SUCCESS, "{:?}", last_error_message());
    expect_plus(&read(fx.c), 8);
}

#[test]
fn legacy_stream_does_not_wait_for_destroyed_non_blocking_stream() {
    // A non-blocking stream stays unordered with the legacy stream after its destruction.
    if !in_child() {
        let (st, err) = child("legacy_stream_does_not_wait_for_destroyed_non_blocking_stream", &[]);
        assert!(st.success(), "{err}");
        assert!(err.contains("data race"), "{err}");
        return;
    }
    let fx = fixture();
    let s = stream(CU_STREAM_NON_BLOCKING);
    inc(fx.f, fx.b, fx.a, s);
    // SAFETY: valid handle.
    assert_eq!(unsafe { cuStreamDestroy_v2(s) }, CUDA_SUCCESS);
    inc(fx.f, fx.c, fx.b, null_mut());
    // SAFETY: plain call.
    assert_eq!(unsafe { cuCtxSynchronize() }, CUDA_ERROR_LAUNCH_FAILED);
}

// ---------------------------------------------------------------------------
// Pinned and managed memory accessed by device work is race-checked like
// device memory (group__CUDA__MEM, cuMemHostAlloc: "Since the memory can be
// accessed directly by the device ..."; cuMemAllocManaged with
// CU_MEM_ATTACH_GLOBAL: "this memory is accessible from any stream on any device").

/// A managed buffer of N u32 initialised to 0..N.
fn managed() -> u64 {
    let mut d = 0u64;
    // SAFETY: valid out-pointer; the memory is host-accessible.
    unsafe {
        assert_eq!(cuMemAllocManaged(&mut d, 4 * N as usize, 1), CUDA_SUCCESS);
        let src: Vec<u32> = (0..N).collect();
        assert_eq!(cuMemcpyHtoD_v2(d, src.as_ptr().cast(), 4 * N as usize), CUDA_SUCCESS);
    }
    d
}

#[test]
fn managed_memset_and_kernel_race() {
    if !in_child() {
        for (seed, err) in run_seeds("managed_memset_and_kernel_race", &["0", "21"]) {
            assert!(
                err.contains("data race") && err.contains("managed allocation") && err.contains("cuMemsetD32Async"),
                "seed {seed}: {err}"
            );
        }
        return;
    }
    let fx = fixture();
    let m = managed();
    let (s1, s2) = (stream(CU_STREAM_NON_BLOCKING), stream(CU_STREAM_NON_BLOCKING));
    // SAFETY: valid handles; the range lies in the allocation.
    unsafe { assert_eq!(cuMemsetD32Async(m, 0, N as usize, s1), CUDA_SUCCESS) };
    inc(fx.f, m, fx.a, s2);
    // SAFETY: plain calls.
    unsafe {
        cuStreamSynchronize(s1);
        cuStreamSynchronize(s2);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED);
    }
}

#[test]
fn pinned_kernel_and_async_copy_race() {
    if !in_child() {
        for (seed, err) in run_seeds("pinned_kernel_and_async_copy_race", &["0", "4"]) {
            assert!(
                err.contains("data race") && err.contains("pinned host allocation") && err.contains("inc_u32"),
                "seed {seed}: {err}"
            );
        }
        return;
    }
    let fx = fixture();
    let p = pinned();
    let (s1, s2) = (stream(CU_STREAM_NON_BLOCKING), stream(CU_STREAM_NON_BLOCKING));
    // A kernel writes the pinned buffer on s1, an async copy reads it on s2.
    inc(fx.f, p as u64, fx.a, s1);
    // SAFETY: valid handles; both ranges lie in their allocations.
    unsafe {
        assert_eq!(cuMemcpyHtoDAsync_v2(fx.c, p.cast(), 4 * N as usize, s2), CUDA_SUCCESS);
        cuStreamSynchronize(s1);
        cuStreamSynchronize(s2);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED);
    }
}

#[test]
fn managed_kernels_race_and_event_orders_them() {
    if !in_child() {
        let (st, err) = child("managed_kernels_race_and_event_orders_them", &[("EMU_ORDERED", "1")]);
        assert!(st.success(), "{err}");
        assert!(!err.contains("race"), "{err}");
        let (st, err) = child("managed_kernels_race_and_event_orders_them", &[]);
        assert!(st.success(), "{err}");
        assert!(
            err.contains("data race") && err.contains("managed allocation") && err.contains("inc_u32"),
            "{err}"
        );
        return;
    }
    let ordered = std::env::var_os("EMU_ORDERED").is_some();
    let fx = fixture();
    let (m1, m2) = (managed(), managed());
    let (s1, s2) = (stream(CU_STREAM_NON_BLOCKING), stream(CU_STREAM_NON_BLOCKING));
    inc(fx.f, m1, fx.a, s1);
    if ordered {
        let mut e = null_mut();
        // SAFETY: valid handles.
        unsafe {
            assert_eq!(cuEventCreate(&mut e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
            assert_eq!(cuEventRecord(e, s1), CUDA_SUCCESS);
            assert_eq!(cuStreamWaitEvent(s2, e, 0), CUDA_SUCCESS);
            assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
        }
    }
    // Reads what s1 writes.
    inc(fx.f, m2, m1, s2);
    // SAFETY: plain calls.
    unsafe {
        cuStreamSynchronize(s1);
        cuStreamSynchronize(s2);
        let rc = cuCtxSynchronize();
        if ordered {
            assert_eq!(rc, CUDA_SUCCESS, "{:?}", last_error_message());
            // Host reads of managed memory after the synchronisation.
            let got = std::slice::from_raw_parts(m2 as *const u32, N as usize).to_vec();
            expect_plus(&got, 2);
        } else {
            assert_eq!(rc, CUDA_ERROR_LAUNCH_FAILED);
        }
    }
}
