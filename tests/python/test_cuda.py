"""devtensor's own CUDA paths from Python, with no torch or cupy: allocation, fills, copies
between host and device, views made contiguous on the device, the DLPack producer rules on
CUDA, pinned and managed memory, a second GPU. Every test carries the `cuda` marker: in CI
they run on the emulated driver (emu/, `ci/emu.sh`) with DEVTENSOR_REQUIRE_GPU=1; without a
device they skip visibly.
"""

import ctypes
import gc
import subprocess
import sys

import pytest

import devtensor
from conftest import FLAG_IS_COPIED, VIEW_PAIRS, copied_between_views

pytestmark = pytest.mark.cuda

np = pytest.importorskip("numpy")


def host(t):
    """The values of a devtensor tensor as a NumPy array (a host copy for device tensors)."""
    return np.from_dlpack(t.to("cpu"))


@pytest.mark.parametrize("device", ["cuda", "cuda:0", (2, 0)])
def test_empty_on_cuda_reports_the_device(device):
    t = devtensor.empty((4, 5), device=device)
    assert t.device == "cuda:0"
    assert t.__dlpack_device__() == (2, 0)
    assert t.strides == (5, 1)
    assert t.data_ptr % 256 == 0, "device allocations are at least 256-byte aligned"


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
)
def test_zeros_ones_full_on_cuda(dtype):
    ref = np.dtype(dtype) if dtype != "bfloat16" else None
    z = devtensor.zeros((3, 7), dtype=dtype, device="cuda")
    o = devtensor.ones((3, 7), dtype=dtype, device="cuda")
    f = devtensor.full((3, 7), True if dtype == "bool" else 3, dtype=dtype, device="cuda")
    if ref is None:  # numpy has no bfloat16: compare the host copies' bit patterns
        for x, bits in ((z, 0), (o, 0x3F80), (f, 0x4040)):
            h = x.to("cpu")
            assert h.dtype == "bfloat16"
            raw = np.frombuffer(ctypes.string_at(h.data_ptr, h.nbytes), dtype=np.uint16)
            np.testing.assert_array_equal(raw, np.full(21, bits, dtype=np.uint16))
        return
    np.testing.assert_array_equal(host(z), np.zeros((3, 7), dtype=ref))
    np.testing.assert_array_equal(host(o), np.ones((3, 7), dtype=ref))
    np.testing.assert_array_equal(host(f), np.full((3, 7), True if dtype == "bool" else 3, dtype=ref))


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.transpose(1, 0),
        lambda t: t[1:, ::2],
        lambda t: t[2],
        lambda t: t[None, :, 1:],
        lambda t: t[::-1, ::-3],
        lambda t: t.transpose(1, 0)[3:, :4],
    ],
    ids=["T", "step", "row", "newaxis", "flip", "permute-slice"],
)
def test_views_made_contiguous_on_the_device(make):
    a = np.arange(30 * 41, dtype=np.float32).reshape(30, 41)
    t = devtensor.from_dlpack(a).to("cuda")
    v = make(t)
    assert v.device == "cuda:0"
    c = v.contiguous()
    assert c.is_contiguous() and c.device == "cuda:0"
    np.testing.assert_array_equal(host(c), make(a))
    np.testing.assert_array_equal(host(v.clone()), make(a))


def test_copy_between_host_and_device_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = devtensor.empty((3, 4), device="cuda")
    t.copy_(a)  # host -> device
    u = devtensor.zeros((3, 4), device="cuda")
    u.copy_(t)  # device -> device
    h = devtensor.zeros((3, 4))
    h.copy_(u)  # device -> host
    np.testing.assert_array_equal(np.from_dlpack(h), a)
    # Strided on both sides: a transposed host view into a flipped device view.
    w = devtensor.zeros((4, 3), device="cuda")
    w[::-1].copy_(a.T)
    np.testing.assert_array_equal(host(w), a.T[::-1])
    # Broadcast sources: a host row into device rows, a device column across host rows.
    u.copy_(a[1])
    np.testing.assert_array_equal(host(u), np.broadcast_to(a[1], (3, 4)))
    h.copy_(t[:, 0:1])
    np.testing.assert_array_equal(np.from_dlpack(h), np.broadcast_to(a[:, :1], (3, 4)))


@pytest.mark.parametrize("pair", list(VIEW_PAIRS))
def test_copies_between_views_of_one_device_tensor_match_numpy(pair):
    # Interleaved views are copied in place; the emulated driver checks that
    # no kernel reads what it writes and that no DMA's areas overlap.
    t = devtensor.from_dlpack(np.arange(64 * 64, dtype=np.float32).reshape(64, 64)).to("cuda")
    dst, src = VIEW_PAIRS[pair](t)
    dst.copy_(src)
    np.testing.assert_array_equal(host(t), copied_between_views(pair))


def test_fill_of_a_strided_device_view():
    t = devtensor.zeros((101,), dtype="uint16", device="cuda")
    t[1::3].fill_(5)
    t[::-7].fill_(9)
    want = np.zeros(101, dtype=np.uint16)
    want[1::3] = 5
    want[::-7] = 9
    np.testing.assert_array_equal(host(t), want)


def test_zero_size_tensors_on_cuda():
    t = devtensor.zeros((0, 5), device="cuda")
    assert t.shape == (0, 5) and t.nbytes == 0
    assert host(t.transpose(0, 1).contiguous()).shape == (5, 0)
    t.fill_(1.0)


def test_to_and_from_cpu():
    t = devtensor.full((2, 2), 5.0).to("cuda")
    assert t.device == "cuda:0"
    back = t.to("cpu")
    assert back.device == "cpu"
    np.testing.assert_array_equal(np.from_dlpack(back), np.full((2, 2), 5.0, dtype=np.float32))


# --------------------------------------------------------------------------------------
# Producer rules on CUDA
# --------------------------------------------------------------------------------------


def test_cuda_stream_values(dlp):
    t = devtensor.zeros(4, device="cuda")
    with pytest.raises((ValueError, BufferError)):
        t.__dlpack__(stream=0)  # ambiguous on CUDA
    for stream in (None, 1, 2, -1):
        cap = t.__dlpack__(stream=stream, max_version=(1, 3))
        assert dlp.read(cap)["device"] == (2, 0)
    with pytest.raises(TypeError):
        t.__dlpack__(stream="1")


def test_dl_device_cpu_copies_to_host(dlp):
    t = devtensor.full((3, 4), 2.0, device="cuda")
    cap = t.__dlpack__(max_version=(1, 3), dl_device=(1, 0))
    info = dlp.read(cap)
    assert info["device"] == (1, 0)
    assert info["flags"] & FLAG_IS_COPIED
    h = devtensor.from_dlpack(cap)
    assert h.device == "cpu"
    np.testing.assert_array_equal(np.from_dlpack(h), np.full((3, 4), 2.0, dtype=np.float32))
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=False)


def test_numpy_gets_a_host_copy_only_when_asked():
    t = devtensor.full(5, 3.0, device="cuda")
    a = np.from_dlpack(t, device="cpu")
    np.testing.assert_array_equal(a, np.full(5, 3.0, dtype=np.float32))
    with pytest.raises((BufferError, RuntimeError, ValueError)):
        np.from_dlpack(t)  # numpy cannot read device memory


@pytest.mark.parametrize("device", ["cpu", (1, 0)])
def test_from_dlpack_of_a_device_tensor_to_cpu_copies_to_host(device):
    # As np.from_dlpack(t, device="cpu") does: our own consumer asks for the host
    # copy that __dlpack__(dl_device=(1, 0)) makes, with copy=None or True.
    t = devtensor.full((3, 4), 2.0, device="cuda")
    for copy in (None, True):
        h = devtensor.from_dlpack(t, device=device, copy=copy)
        assert h.device == "cpu" and h.shape == (3, 4) and h.dtype == "float32"
        np.testing.assert_array_equal(np.from_dlpack(h), np.full((3, 4), 2.0, dtype=np.float32))
    t.fill_(5.0)
    np.testing.assert_array_equal(np.from_dlpack(h), np.full((3, 4), 2.0, dtype=np.float32))  # a copy
    with pytest.raises(BufferError):
        devtensor.from_dlpack(t, device=device, copy=False)
    # Pinned and managed memory: the host reads it in place, no copy needed.
    for memory in ("cuda_host", "cuda_managed"):
        m = devtensor.full(4, 3.0, device=memory)
        for copy in (None, False):
            v = devtensor.from_dlpack(m, device=device, copy=copy)
            assert v.device == "cpu" and v.data_ptr == m.data_ptr
            np.testing.assert_array_equal(np.from_dlpack(v), np.full(4, 3.0, dtype=np.float32))


def _two_gpus():
    if devtensor.device_count() < 2:
        pytest.skip(f"SKIP: needs two CUDA devices, found {devtensor.device_count()}")


def test_cuda_without_an_index_keeps_meaning_the_first_gpu_used_after_asking_about_another():
    # No context current: "cuda" is the GPU this process worked on first (so a
    # process on GPU 1 never makes a context on GPU 0 for it); a query about
    # GPU 0, which retains its context, must not move it. A fresh interpreter.
    _two_gpus()
    code = """
import devtensor as dt
dt.zeros(4, device="cuda:1")
before = (dt.current_device(), dt.empty(1, device="cuda").device)
dt.memory_stats("cuda:0")
dt.synchronize(0)
after = (dt.current_device(), dt.empty(1, device="cuda").device)
print(before, after)
assert before == after == (1, "cuda:1"), (before, after)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["cuda:0", "cuda_managed"])
def test_a_consumer_stream_of_another_gpu_is_refused_at_export(kind):
    # The array API: the stream is "a stream on the producer's device". One of
    # another GPU would have our event recorded on it across contexts, which a
    # driver refuses only when the memory is freed: an error at export instead.
    _two_gpus()
    t = devtensor.ones(4, device=kind)
    other = devtensor.Stream("cuda:1")
    with pytest.raises(ValueError, match="belongs to GPU 1"):
        t.__dlpack__(stream=other.cuda_stream, max_version=(1, 3))
    own = devtensor.Stream("cuda:0")
    cap = t.__dlpack__(stream=own.cuda_stream, max_version=(1, 3))
    assert devtensor.from_dlpack(cap).data_ptr == t.data_ptr
    own.synchronize()


class _RefusesDevice:
    """A producer that exports only where its data is, refusing `dl_device` with `error`
    (NumPy raises BufferError for a GPU)."""

    def __init__(self, a, error):
        self.a, self.error = a, error

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.a.__dlpack_device__():
            raise self.error("unsupported device requested")
        return self.a.__dlpack__(max_version=max_version, copy=copy)


@pytest.mark.parametrize(
    "source, device",
    [
        ("cpu", "cuda:0"),
        ("cpu", "cuda"),
        ("cuda:0", "cuda:1"),
        ("cuda:1", "cuda:0"),
        ("cuda_host", "cuda:0"),
        ("cuda:0", "cuda_host"),
        ("cuda_managed", "cuda:0"),
        ("cuda:0", "cpu"),
    ],
)
@pytest.mark.parametrize("how", ["tensor", "capsule"])
def test_from_dlpack_to_another_device_copies_as_the_array_api_asks(source, device, how):
    # Array API from_dlpack: copy=None "must reuse the existing memory buffer if possible
    # and copy otherwise"; copy=True copies; copy=False on another device: BufferError.
    if "cuda:1" in (source, device):
        _two_gpus()
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    src = devtensor.from_dlpack(want).to(source)
    expect = devtensor.empty((1,), device=device).device  # "cuda": the current GPU
    for copy in (None, True):
        x = src if how == "tensor" else src.__dlpack__(max_version=(1, 3))
        t = devtensor.from_dlpack(x, device=device, copy=copy)
        assert t.device == expect and t.shape == (3, 4) and t.dtype == "float32"
        assert t.data_ptr != src.data_ptr, "another device's memory: a copy"
        np.testing.assert_array_equal(host(t), want)
        t.fill_(-1.0)
        np.testing.assert_array_equal(host(src), want, "the source is untouched")
    x = src if how == "tensor" else src.__dlpack__(max_version=(1, 3))
    with pytest.raises(BufferError, match="copy=False"):
        devtensor.from_dlpack(x, device=device, copy=False)


@pytest.mark.parametrize("kind", ["cuda_host", "cuda_managed"])
@pytest.mark.parametrize("how", ["tensor", "capsule"])
def test_host_readable_memory_imports_to_the_cpu_in_place(kind, how):
    # The array API's copy=None "must reuse the existing memory buffer if possible":
    # the host reads pinned and managed memory in place, from a tensor or a capsule.
    want = np.arange(6, dtype=np.float32)
    src = devtensor.from_dlpack(want).to(kind)
    make = (lambda: src) if how == "tensor" else (lambda: src.__dlpack__(max_version=(1, 3)))
    for copy in (None, False):
        t = devtensor.from_dlpack(make(), device="cpu", copy=copy)
        assert t.device == "cpu" and t.data_ptr == src.data_ptr, (copy, t.device)
        np.testing.assert_array_equal(np.from_dlpack(t), want)
    c = devtensor.from_dlpack(make(), device="cpu", copy=True)
    assert c.device == "cpu" and c.data_ptr != src.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(c), want)


class _Legacy:
    """A GPU producer older than DLPack 1.0: `__dlpack__(stream=None)` only."""

    def __init__(self, t):
        self.t, self.streams = t, []

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, *, stream=None):
        self.streams.append(stream)
        return self.t.__dlpack__(stream=stream)


def test_from_dlpack_of_a_legacy_gpu_producer_keeps_the_stream_and_copies_itself():
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    src = devtensor.from_dlpack(want).to("cuda:0")
    p = _Legacy(src)
    on_host = devtensor.from_dlpack(p, device="cpu")
    assert p.streams == [1], "the legacy call keeps the stream (the legacy default stream)"
    assert on_host.device == "cpu"
    np.testing.assert_array_equal(np.from_dlpack(on_host), want)
    copied = devtensor.from_dlpack(p, copy=True)
    assert copied.device == "cuda:0" and copied.data_ptr != src.data_ptr
    np.testing.assert_array_equal(host(copied), want)
    shared = devtensor.from_dlpack(p, device="cuda:0", copy=False)
    assert shared.data_ptr == src.data_ptr
    with pytest.raises(BufferError, match="copy=False"):
        devtensor.from_dlpack(p, device="cpu", copy=False)


def test_from_dlpack_to_another_device_copies_strided_views():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    v = devtensor.from_dlpack(a)[::2, ::-3]
    t = devtensor.from_dlpack(v, device="cuda:0")
    assert t.device == "cuda:0" and t.shape == (2, 2)
    np.testing.assert_array_equal(host(t), a[::2, ::-3])
    back = devtensor.from_dlpack(t[:, ::-1], device="cpu")
    np.testing.assert_array_equal(np.from_dlpack(back), a[::2, ::-3][:, ::-1])


@pytest.mark.parametrize(
    "producer",
    [
        pytest.param(lambda a: a, id="numpy"),
        pytest.param(lambda a: _RefusesDevice(a, BufferError), id="BufferError"),
        pytest.param(lambda a: _RefusesDevice(a, NotImplementedError), id="NotImplementedError"),
    ],
)
def test_from_dlpack_of_a_producer_that_cannot_export_on_the_device(producer):
    # NumPy refuses dl_device=(kDLCUDA, 0) with BufferError: the import takes its host
    # memory and devtensor copies it, with the same exception types as for its own tensors.
    a = np.arange(6, dtype=np.int32)
    for copy in (None, True):
        t = devtensor.from_dlpack(producer(a), device="cuda:0", copy=copy)
        assert t.device == "cuda:0" and t.dtype == "int32"
        np.testing.assert_array_equal(host(t), a)
    with pytest.raises(BufferError, match="copy=False"):
        devtensor.from_dlpack(producer(a), device="cuda:0", copy=False)
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.int32))
    same = devtensor.from_dlpack(producer(a), device="cpu", copy=True)
    assert same.device == "cpu" and same.data_ptr != a.ctypes.data, "copy=True on its device: a copy"
    assert devtensor.from_dlpack(producer(a), device="cpu").data_ptr == a.ctypes.data, "zero-copy when it can"


def test_copy_true_gives_a_new_device_buffer(dlp):
    t = devtensor.ones(8, device="cuda")
    info = dlp.read(t.__dlpack__(max_version=(1, 3), copy=True))
    assert info["flags"] & FLAG_IS_COPIED
    assert info["data"] != t.data_ptr
    assert info["device"] == (2, 0)


def test_device_round_trip_through_dlpack_runs_every_deleter(live):
    t = devtensor.zeros(16, device="cuda")
    n0 = live()
    for _ in range(200):
        u = devtensor.from_dlpack(t)
        assert u.data_ptr == t.data_ptr
        del u
    gc.collect()
    assert live() == n0


def test_pool_reuses_freed_device_blocks():
    devtensor.empty_cache("cuda")
    a = devtensor.empty((1 << 16,), device="cuda")
    ptr = a.data_ptr
    del a
    b = devtensor.empty((1 << 16,), device="cuda")
    assert b.data_ptr == ptr, "a freed block of the same size is reused from the pool"
    stats = devtensor.memory_stats("cuda")
    assert stats["allocated_bytes"] >= 1 << 18
    del b
    assert devtensor.empty_cache("cuda") >= 1 << 18


# --------------------------------------------------------------------------------------
# Pinned and managed memory, a second GPU
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


def test_tolist_of_a_managed_view_reads_through_host_memory():
    # A layout tolist cannot read in place is copied into CPU memory, as .cpu()
    # does: no managed temporary (which also waited for the GPU a second time).
    m = devtensor.full((4, 6), 3.0, device="cuda_managed")
    m[1].fill_(5.0)
    before = devtensor.memory_stats("cuda_managed")["alloc_count"]
    assert m.transpose(0, 1).tolist() == [[3.0, 5.0, 3.0, 3.0]] * 6
    assert devtensor.memory_stats("cuda_managed")["alloc_count"] == before
    assert m.tolist()[1] == [5.0] * 6  # in place


def test_second_gpu():
    try:
        t = devtensor.full(4, 1.0, device="cuda:1")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"needs two CUDA devices ({e})")
    assert t.__dlpack_device__() == (2, 1)
    u = t.to("cuda:0")
    assert u.device == "cuda:0"
    np.testing.assert_array_equal(host(u), np.ones(4, dtype=np.float32))


# --------------------------------------------------------------------------------------
# Streams of other libraries: a consumer's own stream, driven through the driver API
# --------------------------------------------------------------------------------------


class _Driver:
    """The few CUDA driver calls a consumer with its own stream makes (CuPy, torch), by
    ctypes into the driver devtensor loaded (the emulated one in CI)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        vp, u64, sz, ui = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint
        for name, args in {
            "cuInit": [ui],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(vp), ctypes.c_int],
            "cuCtxGetCurrent": [ctypes.POINTER(vp)],
            "cuCtxSetCurrent": [vp],
            "cuStreamCreate": [ctypes.POINTER(vp), ui],
            "cuStreamSynchronize": [vp],
            "cuStreamDestroy_v2": [vp],
            "cuMemcpyDtoDAsync_v2": [u64, u64, sz, vp],
            "cuMemsetD32Async": [u64, ui, sz, vp],
        }.items():
            getattr(self.lib, name).argtypes = args
        self._check("cuInit", self.lib.cuInit(0))
        ctx = vp()
        self._check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0))
        self.ctx = ctx

    def call(self, name, *args):
        prev = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(prev)))
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.ctx))
        try:
            self._check(name, getattr(self.lib, name)(*args))
        finally:
            self.lib.cuCtxSetCurrent(prev)

    @staticmethod
    def _check(name, rc):
        if rc != 0:
            raise RuntimeError(f"{name} failed with CUresult {rc}")

    def stream(self):
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        return s.value


@pytest.fixture
def consumer_stream():
    """A consumer's stream S that devtensor made (`devtensor.Stream`): never destroyed, so
    exports record it. A consumer's own streams are not recorded (see the test after next)."""
    drv = _Driver()
    stream = devtensor.Stream("cuda:0")
    s = stream.cuda_stream
    yield drv, s
    drv.call("cuStreamSynchronize", s)


def test_export_keeps_memory_from_reuse_until_the_consumer_stream_is_done(consumer_stream):
    # The consumer imports on its stream S, queues a read there, and drops the capsule (the
    # deleter runs) with the read still queued. The block goes back to the pool; the next
    # allocation of its size is written at once on our stream: it must wait for S's work,
    # or the write races the read (the emulated driver's race detector reports it).
    drv, s = consumer_stream
    n = 1 << 14
    for value in range(4):
        out = devtensor.zeros(n, dtype="uint32", device="cuda")
        t = devtensor.full(n, value, dtype="uint32", device="cuda")
        cap = t.__dlpack__(stream=s, max_version=(1, 3))
        drv.call("cuMemcpyDtoDAsync_v2", out.data_ptr, t.data_ptr, 4 * n, s)
        del cap, t
        again = devtensor.empty(n, dtype="uint32", device="cuda")
        again.fill_(7)
        drv.call("cuStreamSynchronize", s)
        np.testing.assert_array_equal(host(out), np.full(n, value, dtype=np.uint32))
        np.testing.assert_array_equal(host(again), np.full(n, 7, dtype=np.uint32))


@pytest.mark.parametrize("memory", ["cuda", "cuda_managed"])
def test_a_consumer_may_destroy_its_stream_before_releasing_an_export(memory):
    # CuPy destroys a stream when its object is collected, which may come before the arrays
    # imported on it go. Exports must not record a consumer's own stream: the free (or a host
    # read of managed memory) would then touch a destroyed handle, which crashed the process
    # on an H100 (the emulated driver stops the process too, with a message).
    drv = _Driver()
    s = drv.stream()
    n = 1 << 12
    out = devtensor.zeros(n, dtype="uint32", device="cuda")
    t = devtensor.full(n, 3, dtype="uint32", device=memory)
    cap = t.__dlpack__(stream=s, max_version=(1, 3))
    drv.call("cuMemcpyDtoDAsync_v2", out.data_ptr, t.data_ptr, 4 * n, s)
    drv.call("cuStreamSynchronize", s)  # the consumer is done, then lets its stream go
    drv.call("cuStreamDestroy_v2", s)
    if memory == "cuda_managed":
        np.testing.assert_array_equal(np.from_dlpack(t), np.full(n, 3, dtype=np.uint32))
    del cap, t  # the deleter runs after the stream is gone
    again = devtensor.full(n, 9, dtype="uint32", device=memory)
    np.testing.assert_array_equal(host(out), np.full(n, 3, dtype=np.uint32))
    np.testing.assert_array_equal(host(again), np.full(n, 9, dtype=np.uint32))


@pytest.fixture
def managed_written_by_consumer(consumer_stream):
    """A managed tensor a CUDA consumer imported on its stream S and set to 7 there, and a
    device witness S also set to 7 (queued, not waited for)."""
    drv, s = consumer_stream
    n = 1 << 12
    m = devtensor.zeros(n, dtype="uint32", device="cuda_managed")
    witness = devtensor.zeros(n, dtype="uint32", device="cuda")
    del_me = m.__dlpack__(stream=s, max_version=(1, 3))
    del del_me
    drv.call("cuMemsetD32Async", m.data_ptr, 7, n, s)
    drv.call("cuMemsetD32Async", witness.data_ptr, 7, n, s)
    return m, witness


HOST_READS = {
    "numpy": np.from_dlpack,
    "dl_device_cpu": lambda m: np.from_dlpack(m, device="cpu"),
    "tolist": lambda m: np.array(m.tolist(), dtype=np.uint32),
    "cpu": lambda m: host(m.cpu()),
    "to": lambda m: host(m.to("cpu")),
    "clone": lambda m: host(m.clone()),
    "copy_": lambda m: host(devtensor.empty(m.shape, dtype=m.dtype).copy_(m)),
}


@pytest.mark.parametrize("how", list(HOST_READS))
def test_host_reads_of_managed_memory_wait_for_every_stream(managed_written_by_consumer, how):
    # A CUDA consumer got the managed tensor on its stream S and wrote it there; then the
    # host reads it in place: NumPy's import (no stream; kDLCUDAManaged),
    # dl_device=(kDLCPU, 0), tolist, or a copy to host memory. Each must wait for S, not
    # only for our default stream (the copies did not wait at all). The
    # emulated driver race-checks device memory, not managed memory: S's work also writes
    # a device buffer, which our stream writes after the host read; the driver reports
    # that race unless the host read waited for S.
    m, witness = managed_written_by_consumer
    n = m.shape[0]
    a = HOST_READS[how](m)
    if how in ("numpy", "dl_device_cpu"):
        assert a.ctypes.data == m.data_ptr, "read in place"
    np.testing.assert_array_equal(a, np.full(n, 7, dtype=np.uint32))
    witness.fill_(1)
    m.fill_(1)
    np.testing.assert_array_equal(host(witness), np.ones(n, dtype=np.uint32))
    np.testing.assert_array_equal(host(m), np.ones(n, dtype=np.uint32))


@pytest.mark.parametrize("how", ["numpy", "tolist", "cpu"])
def test_host_reads_of_managed_memory_wait_for_a_per_thread_default_stream_consumer(how):
    # A consumer on the per-thread default stream (DLPack stream=2: torch or CuPy built for
    # it) writes the managed tensor there, behind slower work; the host read must wait for
    # it. Synchronising the legacy stream does not (only work queued on it waits for the
    # blocking streams: Driver API, "Stream synchronization behavior").
    drv = _Driver()
    n = 1 << 12
    slow = devtensor.empty(1 << 22, dtype="uint32", device="cuda")
    for _ in range(3):
        m = devtensor.zeros(n, dtype="uint32", device="cuda_managed")
        cap = m.__dlpack__(stream=2, max_version=(1, 3))
        drv.call("cuMemsetD32Async", slow.data_ptr, 1, 1 << 22, 2)
        drv.call("cuMemsetD32Async", m.data_ptr, 7, n, 2)
        del cap
        reads = {
            "numpy": np.from_dlpack,
            "tolist": lambda m: np.array(m.tolist(), dtype=np.uint32),
            "cpu": lambda m: host(m.cpu()),
        }
        np.testing.assert_array_equal(reads[how](m), np.full(n, 7, dtype=np.uint32))
    devtensor.synchronize("cuda:0")


def test_host_fills_of_managed_memory_wait_for_every_stream(managed_written_by_consumer):
    # As above, with the host writing: a fill on the host must come after S's write,
    # not be overwritten by it (nor race with the witness, as above).
    m, witness = managed_written_by_consumer
    n = m.shape[0]
    m.fill_(3)
    witness.fill_(1)
    devtensor.synchronize("cuda:0")
    np.testing.assert_array_equal(np.from_dlpack(m), np.full(n, 3, dtype=np.uint32))
    np.testing.assert_array_equal(host(witness), np.ones(n, dtype=np.uint32))


# ----- the GIL (issue 12 item 6) ---------------------------------------------------------------


def _long_device_work():
    """Queues device work that lasts a good fraction of a second (transposes on the device,
    asynchronous: nothing host-visible), after a warm-up that compiles the kernel; returns what
    keeps the work's memory alive. The emulated driver needs a few transposes of 16 Mi elements
    for that, a GPU hundreds of 64 Mi: a transpose, timed, decides which and how many."""
    import time

    def tensors(n):
        return (devtensor.zeros((n, n), dtype="uint32", device="cuda:0"),
                devtensor.empty((n, n), dtype="uint32", device="cuda:0"))

    src, dst = tensors(4096)
    dst[:8, :8].copy_(src[:8, :8].transpose(0, 1))  # compile and load the kernel first
    devtensor.synchronize("cuda:0")

    def timed():
        t0 = time.monotonic()
        dst.copy_(src.transpose(0, 1))
        devtensor.synchronize("cuda:0")
        return time.monotonic() - t0

    one = min(timed() for _ in range(3))  # the least: a host stall is not the device's time
    if one < 0.01:  # a GPU: four times the elements per transpose
        src, dst = tensors(8192)
        one *= 4
    for _ in range(max(3, min(1000, int(0.4 / one)))):
        dst.copy_(src.transpose(0, 1))  # device → device: queued, not waited for
    return src, dst


def _blocking_calls():
    small_dev = devtensor.zeros((4,), dtype="uint32", device="cuda:0")
    small_host = devtensor.empty((4,), dtype="uint32")
    pinned = devtensor.empty((4,), dtype="uint32", device="cuda_host")
    # Copies of 16 bytes between host and device: each waits for the default stream's queued work.
    return {
        "copy_d2h": lambda: small_host.copy_(small_dev),
        "copy_h2d": lambda: small_dev.copy_(small_host),
        "copy_d2pinned": lambda: pinned.copy_(small_dev),
        # .to("cpu") and synchronize() wait for the device's queued work too.
        "to_cpu": lambda: small_dev.to("cpu"),
        "synchronize": lambda: devtensor.synchronize("cuda:0"),
    }


@pytest.mark.parametrize("call", ["copy_d2h", "copy_h2d", "copy_d2pinned", "to_cpu", "synchronize"])
def test_blocking_gpu_calls_release_the_gil(call):
    """While devtensor waits for the device, another Python thread runs. The call waits for
    device work queued before it; a second thread stamps the time in a loop. Holding the GIL for
    the whole call, the stamper cannot run between the call's start and end at all (a thread only
    gives the GIL up between bytecodes): no stamp lands in the middle half of the call, whatever
    the machine's speed. Released, the stamper runs throughout. Not a timing of speed: the call
    only has to last longer than a few GIL switch intervals (5 ms), checked."""
    import threading
    import time

    fn = _blocking_calls()[call]
    fn()  # first use (allocation, kernel compile) outside the measured call
    stamps = []
    stop = threading.Event()
    started = threading.Event()

    def stamper():
        started.set()
        while not stop.is_set():
            stamps.append(time.monotonic())

    keep = _long_device_work()
    th = threading.Thread(target=stamper)
    th.start()
    started.wait()
    t0 = time.monotonic()
    fn()
    t1 = time.monotonic()
    stop.set()
    th.join()
    del keep
    span = t1 - t0
    assert span > 0.05, f"the device work took {span * 1e3:.1f} ms: too short to tell (make it larger)"
    lo, hi = t0 + span / 4, t1 - span / 4
    inside = sum(lo <= s <= hi for s in stamps)
    assert inside > 0, f"{call} held the GIL while waiting for the device for {span * 1e3:.0f} ms"


@pytest.mark.parametrize("device", ["cuda:0", "cuda_host", "cuda_managed"])
def test_device_tensors_pickle_back_onto_their_device(device):
    import pickle

    t = devtensor.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)).to(device)
    view = t.transpose(0, 1)[::-1]
    back = pickle.loads(pickle.dumps(view))
    assert (back.device, back.shape, back.dtype) == (view.device, view.shape, view.dtype)
    assert back.is_contiguous() and back.data_ptr != view.data_ptr
    np.testing.assert_array_equal(host(back), host(view))
