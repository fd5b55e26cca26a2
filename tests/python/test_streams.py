"""CUDA streams and events from Python, as torch.cuda names them: Stream / ExternalStream,
Event, current_stream / default_stream / set_stream, the `stream(s)` context manager
(thread-local, nests, restored on exit; copies, fills and allocations use it), wait_stream
/ wait_event, record_stream, synchronize, is_available / device_count / current_device /
set_device. Tests marked `cuda` run on the emulated driver in CI, whose race detector
fails any GPU access that is not ordered after the one it depends on; the others check
the answers on a machine without a GPU.
"""

import threading

import pytest

import devtensor

np = pytest.importorskip("numpy")

cuda = pytest.mark.cuda
no_gpu = pytest.mark.skipif(devtensor.is_available(), reason="SKIP: a CUDA device is present (this checks the answers without one)")


def host(t):
    return np.from_dlpack(t.cpu())


# --------------------------------------------------------------------------------------
# Without a GPU, and the CPU
# --------------------------------------------------------------------------------------

@no_gpu
def test_without_a_gpu_nothing_is_available():
    assert devtensor.is_available() is False
    assert devtensor.device_count() == 0
    for call in (devtensor.Stream, devtensor.current_stream, devtensor.default_stream,
                 devtensor.current_device, devtensor.synchronize):
        with pytest.raises(RuntimeError):
            call()
    with pytest.raises(RuntimeError):
        devtensor.Stream("cuda:0", handle=1)
    e = devtensor.Event()
    assert e.query() is True, "an event never recorded has nothing pending"
    with pytest.raises(RuntimeError):
        e.record()


def test_the_cpu_has_no_streams():
    for call in (devtensor.Stream, devtensor.current_stream, devtensor.default_stream, devtensor.synchronize):
        with pytest.raises(ValueError, match="CPU has none"):
            call("cpu")
    with pytest.raises(ValueError):
        devtensor.set_device("cpu")


def test_elapsed_time_needs_timing_events():
    a, b = devtensor.Event(), devtensor.Event()
    with pytest.raises(RuntimeError, match="enable_timing"):
        a.elapsed_time(b)
    a, b = devtensor.Event(enable_timing=True), devtensor.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="recorded"):
        a.elapsed_time(b)
    assert a.cuda_event == 0


def test_stream_context_of_none_does_nothing():
    with devtensor.stream(None) as s:
        assert s is None


# --------------------------------------------------------------------------------------
# With a GPU (or the emulated driver)
# --------------------------------------------------------------------------------------

@cuda
def test_is_available_and_device_count():
    assert devtensor.is_available() is True
    assert devtensor.device_count() >= 1
    devtensor.set_device(0)
    assert devtensor.current_device() == 0
    assert isinstance(devtensor.current_device(), int)
    devtensor.set_device(-1)  # a no-op, as in torch
    assert devtensor.current_device() == 0
    with pytest.raises((ValueError, RuntimeError)):
        devtensor.set_device(devtensor.device_count() + 5)


@cuda
def test_new_stream_and_wrapping_its_handle():
    s = devtensor.Stream()
    assert s.device == "cuda:0"
    assert s.cuda_stream == s.handle and s.cuda_stream > 2
    assert s.__cuda_stream__() == (0, s.cuda_stream)
    assert s.query() is True
    s.synchronize()
    w = devtensor.Stream("cuda:0", handle=s.cuda_stream)
    assert w == s and hash(w) == hash(s)
    assert devtensor.ExternalStream(s.cuda_stream) == s
    assert devtensor.Stream() != s
    assert len({s, w, devtensor.ExternalStream(s.cuda_stream, device=0)}) == 1
    del w  # a wrapper never destroys the stream it wraps
    assert s.query() is True
    assert "cuda_stream=0x" in repr(s)


@cuda
def test_default_and_current_streams():
    d = devtensor.default_stream()
    assert d.cuda_stream == 1, "the legacy default stream, as DLPack spells it"
    assert devtensor.current_stream() == d
    assert devtensor.Stream(handle=0) == d, "torch's null stream is the same stream"
    assert devtensor.current_stream(0) == devtensor.current_stream("cuda:0") == devtensor.current_stream("cuda")


@cuda
def test_stream_context_is_thread_local_nests_and_restores():
    s1, s2 = devtensor.Stream(), devtensor.Stream()
    seen = {}

    def other_thread():
        seen["other"] = devtensor.current_stream()

    with devtensor.stream(s1) as entered:
        assert entered == s1
        assert devtensor.current_stream() == s1
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        with devtensor.stream(s2):
            assert devtensor.current_stream() == s2
        assert devtensor.current_stream() == s1
        with pytest.raises(KeyError):
            with devtensor.stream(s2):
                raise KeyError("restored on an exception too")
        assert devtensor.current_stream() == s1
    assert devtensor.current_stream() == devtensor.default_stream()
    assert seen["other"] == devtensor.default_stream()


@cuda
def test_set_stream():
    s = devtensor.Stream()
    devtensor.set_stream(s)
    try:
        assert devtensor.current_stream() == s
    finally:
        devtensor.set_stream(devtensor.default_stream())
    assert devtensor.current_stream().cuda_stream == 1


@cuda
def test_set_stream_of_another_gpu_makes_that_gpu_current_as_torch_does():
    # torch.cuda.set_stream sets the device to the stream's before setting the stream.
    if devtensor.device_count() < 2:
        pytest.skip(f"SKIP: needs two CUDA devices, found {devtensor.device_count()}")
    devtensor.set_device(0)
    s1 = devtensor.Stream("cuda:1")
    try:
        devtensor.set_stream(s1)
        assert devtensor.current_device() == 1
        assert devtensor.current_stream() == s1, "the current stream of the current device"
        assert devtensor.current_stream(0) == devtensor.default_stream(0), "device 0 keeps its own"
        t = devtensor.full((4,), 5.0, device="cuda")  # "cuda" is the current device: cuda:1, on s1
        assert t.device == "cuda:1"
        assert t.__cuda_array_interface__["stream"] == s1.cuda_stream
        devtensor.set_stream(devtensor.default_stream(0))
        assert devtensor.current_device() == 0, "back to device 0 with its default stream"
        assert devtensor.current_stream(1) == s1, "device 1 keeps its current stream"
        devtensor.set_stream(None)
        assert devtensor.current_device() == 0, "None does nothing"
        assert t.tolist() == [5.0] * 4
    finally:
        devtensor.set_stream(devtensor.default_stream(1))
        devtensor.set_device(0)
    assert devtensor.current_stream(1) == devtensor.default_stream(1)


@cuda
def test_allocations_inside_the_context_use_the_stream_pool():
    s = devtensor.Stream()
    with devtensor.stream(s):
        a = devtensor.empty((1024,), device="cuda")
        ptr = a.data_ptr
        del a
        again = devtensor.empty((1024,), device="cuda")
        assert again.data_ptr == ptr, "a block freed on s is reused on s"
        del again
    outside = devtensor.empty((1024,), device="cuda")
    assert outside.data_ptr != ptr, "the default stream's pool does not take a block of s"


@cuda
def test_work_inside_the_context_runs_on_the_stream_and_wait_stream_orders_it():
    s = devtensor.Stream()
    src = devtensor.from_dlpack(np.arange(64, dtype=np.float32)).to("cuda")
    with devtensor.stream(s):
        s.wait_stream(devtensor.default_stream())  # src was written on the default stream
        x = devtensor.full((8, 8), 3.0, device="cuda")  # allocated and filled on s
        y = src.reshape(8, 8).transpose(0, 1).contiguous()  # a kernel on s
        x.copy_(y)
        assert x.__cuda_array_interface__["stream"] == s.cuda_stream
        inside = host(x)  # a device-to-host copy on s: ordered after the kernel
    np.testing.assert_array_equal(inside, np.arange(64, dtype=np.float32).reshape(8, 8).T)
    # The default stream must wait for s before it touches x (the emulator fails otherwise).
    devtensor.current_stream().wait_stream(s)
    x.fill_(1.0)
    np.testing.assert_array_equal(host(x), np.ones((8, 8), np.float32))


@cuda
def test_events_order_streams_and_time_them():
    s = devtensor.Stream()
    start, end = devtensor.Event(enable_timing=True), devtensor.Event(enable_timing=True)
    assert start.query() is True
    with devtensor.stream(s):
        start.record()
        x = devtensor.full((256,), 2.0, dtype="float64", device="cuda")
        end.record(s)
    done = s.record_event()
    assert isinstance(done, devtensor.Event)
    devtensor.current_stream().wait_event(done)
    np.testing.assert_array_equal(host(x), np.full(256, 2.0))
    end.synchronize()
    assert end.query() is True and end.cuda_event != 0
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 0.0
    again = s.record_event(devtensor.Event())
    again.wait()  # the current stream waits
    again.synchronize()
    assert again.query()


@cuda
def test_wrapping_an_external_stream_for_work():
    owner = devtensor.Stream()  # stands for another library's stream
    ext = devtensor.ExternalStream(owner.cuda_stream)
    with devtensor.stream(ext):
        t = devtensor.full((4,), 7, dtype="int32", device="cuda")
    ext.synchronize()
    devtensor.current_stream().wait_stream(ext)
    assert t.tolist() == [7, 7, 7, 7]
    devtensor.synchronize()
    devtensor.synchronize(0)


@cuda
def test_record_stream():
    s = devtensor.Stream()
    t = devtensor.zeros((16,), device="cuda")
    s.wait_stream(devtensor.current_stream())
    assert t.record_stream(s) is None
    del t
    s.synchronize()
    with pytest.raises(ValueError):
        devtensor.zeros((2,)).record_stream(s)


@cuda
def test_stream_context_switches_the_current_device_as_torch_does():
    if devtensor.device_count() < 2:
        pytest.skip(f"SKIP: needs two CUDA devices, found {devtensor.device_count()}")
    devtensor.set_device(0)
    s1 = devtensor.Stream(1)
    assert s1.device == "cuda:1" and devtensor.Stream("cuda:1") != s1
    with devtensor.stream(s1):
        assert devtensor.current_device() == 1
        assert devtensor.current_stream() == s1, "the current stream of the current device"
        assert devtensor.current_stream(0) == devtensor.default_stream(0), "device 0 keeps its own"
        t = devtensor.full((4,), 3.0, device="cuda")  # "cuda" is the current device: cuda:1, on s1
        assert t.device == "cuda:1"
        assert t.__cuda_array_interface__["stream"] == s1.cuda_stream
    assert devtensor.current_device() == 0
    assert devtensor.current_stream(1) == devtensor.default_stream(1)
    devtensor.current_stream(1).wait_stream(s1)
    assert t.tolist() == [3.0] * 4
    e = s1.record_event()
    with pytest.raises(ValueError, match="cuda:1"):
        e.record(devtensor.default_stream(0))
    with pytest.raises(ValueError):
        devtensor.zeros((2,), device="cuda:0").record_stream(s1)
