"""CUDA interop: torch, cupy and jax on a CUDA device, including stream handoff with a
slow producer. Every test here carries the `gpu` marker: conftest skips them with a
visible reason when no CUDA device is present (or fails them with DEVTENSOR_REQUIRE_GPU=1).
"""

import ctypes
import gc
import warnings

import pytest

import devtensor

pytestmark = pytest.mark.gpu

np = pytest.importorskip("numpy")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import torch
    except ImportError:  # the whole module is skipped by conftest without torch
        torch = None

SLEEP_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on current GPUs


def cupy_or_skip():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy sees no CUDA device")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"cupy cannot use CUDA: {e}")
    return cp


def jax_gpu_or_skip():
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("jax has no CUDA backend here (install jax[cuda12])")
    return jax


def host(x):
    """Values of a torch CUDA tensor on the host, after a full sync."""
    torch.cuda.synchronize()
    return x.cpu()


def devtensor_stream(dlp, device_id=0):
    """devtensor's current CUDA stream handle (through its exchange API); 0 is the legacy default stream."""
    api = dlp.exchange_api(devtensor.Tensor)
    out = ctypes.c_void_p()
    assert dlp.WORK_STREAM(api.current_work_stream)(2, device_id, ctypes.byref(out)) == 0
    return out.value or 0


def torch_view_of_stream(handle):
    """A torch stream object for devtensor's stream, to enqueue slow work on it."""
    return torch.cuda.ExternalStream(handle) if handle else torch.cuda.default_stream()


def side_stream():
    """A torch stream that does not synchronise implicitly with the legacy default stream."""
    s = torch.cuda.Stream()  # torch creates its streams with cudaStreamNonBlocking
    assert s.cuda_stream not in (0, 1, 2)
    return s


# --------------------------------------------------------------------------------------
# Allocation and zero-copy handoff
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cuda", "cuda:0", (2, 0)])
def test_empty_cuda_to_torch_zero_copy(device):
    t = devtensor.empty((4, 5), device=device)
    assert t.device == "cuda:0"
    assert t.__dlpack_device__() == (2, 0)
    x = torch.from_dlpack(t)
    assert x.device == torch.device("cuda", 0)
    assert x.data_ptr() == t.data_ptr
    assert x.shape == (4, 5) and x.stride() == (5, 1)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64"])
def test_zeros_ones_full_on_cuda(dtype):
    tdt = getattr(torch, dtype)
    z = torch.from_dlpack(devtensor.zeros((3, 7), dtype=dtype, device="cuda"))
    o = torch.from_dlpack(devtensor.ones((3, 7), dtype=dtype, device="cuda"))
    f = torch.from_dlpack(devtensor.full((3, 7), True if dtype == "bool" else 3, dtype=dtype, device="cuda"))
    assert torch.equal(host(z), torch.zeros(3, 7, dtype=tdt))
    assert torch.equal(host(o), torch.ones(3, 7, dtype=tdt))
    assert torch.equal(host(f), torch.full((3, 7), True if dtype == "bool" else 3, dtype=tdt))


def test_from_torch_cuda_zero_copy():
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = devtensor.from_dlpack(x)
    assert t.device == "cuda:0"
    assert t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t.transpose(0, 1))
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(host(y), host(x).t())


def test_writes_visible_both_ways_cuda():
    t = devtensor.zeros((2, 3), device="cuda")
    x = torch.from_dlpack(t)
    x[1, 1] = 4.0
    torch.cuda.synchronize()
    u = devtensor.from_dlpack(x)
    u[0].fill_(2.0)
    assert torch.equal(host(x), torch.tensor([[2.0, 2.0, 2.0], [0.0, 4.0, 0.0]]))


@pytest.mark.parametrize(
    "make",
    [lambda t: t.transpose(0, 1), lambda t: t[1:, ::2], lambda t: t[2], lambda t: t[None, :, 1:]],
    ids=["T", "step", "row", "newaxis"],
)
def test_cuda_views(make):
    x = torch.arange(30, dtype=torch.float32, device="cuda").reshape(5, 6)
    t = devtensor.from_dlpack(x)
    v = make(t)
    y = torch.from_dlpack(v)
    assert y.data_ptr() == v.data_ptr
    assert torch.equal(host(y), make(host(x)))
    c = v.contiguous()
    assert c.is_contiguous()
    assert torch.equal(host(torch.from_dlpack(c)), make(host(x)).contiguous())
    assert torch.equal(host(torch.from_dlpack(v.clone())), make(host(x)))


def test_cuda_copy_from_host_and_device():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = devtensor.empty((3, 4), device="cuda")
    t.copy_(a)  # host -> device
    assert torch.equal(host(torch.from_dlpack(t)), torch.from_numpy(a))
    u = devtensor.zeros((3, 4), device="cuda")
    u.copy_(t)  # device -> device
    assert torch.equal(host(torch.from_dlpack(u)), torch.from_numpy(a))
    h = devtensor.zeros((3, 4))
    h.copy_(u)  # device -> host
    np.testing.assert_array_equal(np.from_dlpack(h), a)


def test_to_and_from_cpu():
    t = devtensor.full((2, 2), 5.0).to("cuda")
    assert t.device == "cuda:0"
    back = t.to("cpu")
    assert back.device == "cpu"
    np.testing.assert_array_equal(np.from_dlpack(back), np.full((2, 2), 5.0, dtype=np.float32))


# --------------------------------------------------------------------------------------
# Producer rules on CUDA (§a 19-23)
# --------------------------------------------------------------------------------------


def test_torch_stream_handle_is_taken_as_the_consumer_stream(dlp):
    # The plain stream values (None, 1, 2, -1, 0, "1") and the dl_device / copy rules are
    # tested in test_cuda.py, which runs wherever a CUDA device is (the emulated one too).
    t = devtensor.zeros(4, device="cuda")
    s = torch.cuda.Stream()
    cap = t.__dlpack__(stream=s.cuda_stream, max_version=(1, 3))
    assert dlp.read(cap)["device"] == (2, 0)


def test_cuda_deleters(live):
    t = devtensor.zeros(16, device="cuda")
    n0 = live()
    for _ in range(200):
        x = torch.from_dlpack(t)
        u = devtensor.from_dlpack(x)
        del x, u
    assert live() == n0


# --------------------------------------------------------------------------------------
# Stream handoff with a slow producer (§a 20, 27)
# --------------------------------------------------------------------------------------


def test_torch_slow_producer_devtensor_consumer():
    """torch writes after a long sleep on its current (side) stream; devtensor imports while
    that work is in flight and copies the data: the copy must see the written values."""
    n = 1 << 22
    x = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    side = side_stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(7.0)
        t = devtensor.from_dlpack(x)  # must order devtensor's stream after `side`
        c = t.clone()  # runs on devtensor's stream
    y = torch.from_dlpack(c)
    assert host(y).eq(7.0).all(), "devtensor read torch's data before torch's producer stream finished"


def test_devtensor_slow_producer_torch_consumer(dlp):
    """Slow work on devtensor's current stream, then torch consumes on another stream:
    torch's stream must wait (event + cudaStreamWaitEvent), not read stale data."""
    n = 1 << 22
    t = devtensor.zeros(n, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch_view_of_stream(devtensor_stream(dlp))):
        torch.cuda._sleep(SLEEP_CYCLES)  # delays everything devtensor enqueues next
    t.fill_(5.0)  # on devtensor's stream, after the sleep
    consumer = side_stream()
    with torch.cuda.stream(consumer):
        x = torch.from_dlpack(t)  # torch passes stream=consumer.cuda_stream
        total = x.sum()
    consumer.synchronize()
    assert total.item() == 5.0 * n, "torch read devtensor's data before devtensor's stream finished"


def test_explicit_stream_argument_orders_work(dlp):
    t = devtensor.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch_view_of_stream(devtensor_stream(dlp))):
        torch.cuda._sleep(SLEEP_CYCLES)
    t.fill_(1.0)
    s = side_stream()
    cap = t.__dlpack__(stream=s.cuda_stream, max_version=(1, 3))
    x = torch.utils.dlpack.from_dlpack(cap)
    with torch.cuda.stream(s):
        total = x.sum()
    s.synchronize()
    assert total.item() == float(1 << 20)


def test_export_does_not_block_host(dlp):
    import time

    t = devtensor.zeros(16, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch_view_of_stream(devtensor_stream(dlp))):
        torch.cuda._sleep(SLEEP_CYCLES * 5)  # ~0.5 s
    s = side_stream()
    t0 = time.perf_counter()
    cap = t.__dlpack__(stream=s.cuda_stream, max_version=(1, 3))
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    del cap
    assert dt < 0.2, f"__dlpack__(stream=...) blocked the host for {dt:.3f} s"


class _DunderOnly:
    """Hides torch's exchange API: devtensor must go through __dlpack__(stream=...)."""

    def __init__(self, x):
        self.__dlpack__ = x.__dlpack__
        self.__dlpack_device__ = x.__dlpack_device__


def test_dunder_path_device_import_waits_for_producer_stream():
    """As test_torch_slow_producer_devtensor_consumer (which takes torch's exchange API),
    through the `__dlpack__` path: our consumer passes its stream and torch orders it."""
    n = 1 << 22
    x = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    side = side_stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(2.0)
        u = devtensor.from_dlpack(_DunderOnly(x))
        c = u.clone()
    assert host(torch.from_dlpack(c)).eq(2.0).all()


# --------------------------------------------------------------------------------------
# Pinned and managed memory (§b)
# --------------------------------------------------------------------------------------


def test_cuda_host_memory():
    t = devtensor.full(6, 2.0, device="cuda_host")
    assert t.__dlpack_device__() == (3, 0)
    a = np.from_dlpack(t)  # numpy accepts kDLCUDAHost
    assert a.ctypes.data == t.data_ptr
    np.testing.assert_array_equal(a, np.full(6, 2.0, dtype=np.float32))


def test_cuda_managed_memory():
    t = devtensor.full(6, 4.0, device="cuda_managed")
    assert t.__dlpack_device__() == (13, 0)
    a = np.from_dlpack(t)  # numpy accepts kDLCUDAManaged after a full sync
    np.testing.assert_array_equal(a, np.full(6, 4.0, dtype=np.float32))


# --------------------------------------------------------------------------------------
# cupy and jax
# --------------------------------------------------------------------------------------


def test_cupy_round_trip():
    cp = cupy_or_skip()
    t = devtensor.full((3, 4), 1.5, device="cuda")
    c = cp.from_dlpack(t)
    assert c.data.ptr == t.data_ptr
    assert float(c.sum()) == 18.0
    c[0, 0] = 10.0
    u = devtensor.from_dlpack(c)
    assert u.data_ptr == t.data_ptr
    assert torch.from_dlpack(u)[0, 0].item() == 10.0
    d = cp.arange(20, dtype=cp.int32).reshape(4, 5)[:, ::2]
    v = devtensor.from_dlpack(d)
    assert v.data_ptr == d.data.ptr
    assert v.strides == (5, 2)
    assert cp.array_equal(cp.from_dlpack(v.contiguous()), d)


def test_cupy_stream_handoff():
    cp = cupy_or_skip()
    n = 1 << 22
    x = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    side = side_stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(3.0)
        t = devtensor.from_dlpack(x)
        c = t.clone()
    with cp.cuda.Stream(non_blocking=True) as s:
        arr = cp.from_dlpack(c)  # cupy passes its stream
        total = float(arr.sum())
        s.synchronize()
    assert total == 3.0 * n


def test_jax_cuda_round_trip():
    jax = jax_gpu_or_skip()
    import jax.numpy as jnp

    t = devtensor.full((4, 4), 2.0, device="cuda")
    j = jnp.from_dlpack(t)
    assert float(j.sum()) == 32.0
    u = devtensor.from_dlpack(jnp.arange(8.0, device=jax.devices("gpu")[0]))
    assert u.device.startswith("cuda")
    np.testing.assert_array_equal(host(torch.from_dlpack(u)).numpy(), np.arange(8.0, dtype=np.float32))


# --------------------------------------------------------------------------------------
# Several GPUs
# --------------------------------------------------------------------------------------


def test_second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    t = devtensor.full(4, 1.0, device="cuda:1")
    assert t.__dlpack_device__() == (2, 1)
    x = torch.from_dlpack(t)
    assert x.device == torch.device("cuda", 1)
    y = torch.arange(4.0, device="cuda:1")
    with torch.cuda.device(0):
        u = devtensor.from_dlpack(y)  # the consumer must make device 1 current for torch
    assert u.device == "cuda:1"
    assert u.data_ptr == y.data_ptr()
