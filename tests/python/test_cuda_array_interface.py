"""The CUDA Array Interface (v3, numba-cuda's spec) both ways, on devtensor's own CUDA
memory (the emulated driver in CI): the dict devtensor CUDA tensors expose (shape,
typestr, descr, data, strides in bytes or None, version 3, the stream their pending
work is on), and `from_dlpack`'s import of objects that have only
`__cuda_array_interface__` (Numba device arrays, PyCUDA, ...): zero-copy, the object
kept alive, read-only honoured, masks and non-element strides refused, and the
producer's stream waited for (the emulator's race detector fails the test otherwise).
"""

import sys

import pytest

import devtensor

np = pytest.importorskip("numpy")


def host(t):
    return np.from_dlpack(t.cpu())


class CudaArray:
    """A plain Python object that only speaks the CUDA Array Interface."""

    def __init__(self, interface, owner=None):
        self.__cuda_array_interface__ = interface
        self.owner = owner


def test_cpu_tensors_have_no_cuda_array_interface():
    t = devtensor.zeros((2,))
    assert not hasattr(t, "__cuda_array_interface__")


@pytest.mark.cuda
def test_the_interface_devtensor_exposes():
    t = devtensor.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)).to("cuda")
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (3, 4)
    assert cai["typestr"] == "<f4"
    assert cai["descr"] == [("", "<f4")]
    assert cai["data"] == (t.data_ptr, False)
    assert cai["strides"] is None
    assert cai["version"] == 3
    assert cai["stream"] == 1, "the legacy default stream: where devtensor's work ran"
    v = t[::2, ::-1]
    assert v.__cuda_array_interface__["strides"] == (32, -4)
    assert v.__cuda_array_interface__["data"][0] == v.data_ptr
    assert devtensor.empty((0, 3), device="cuda").__cuda_array_interface__["data"] == (0, False)
    assert devtensor.zeros((2,), dtype="bool", device="cuda").__cuda_array_interface__["typestr"] == "|b1"
    with pytest.raises(AttributeError, match="bfloat16"):
        devtensor.zeros((2,), dtype="bfloat16", device="cuda").__cuda_array_interface__
    assert not hasattr(devtensor.zeros((2,), device="cuda_host"), "__cuda_array_interface__")
    s = devtensor.Stream()
    with devtensor.stream(s):
        assert t.__cuda_array_interface__["stream"] == s.cuda_stream


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "complex32"])
def test_hasattr_is_false_for_dtypes_the_interface_cannot_describe(dtype):
    # Numba and CuPy probe with hasattr, which swallows only AttributeError: any other
    # error would crash them instead of letting them fall back to DLPack.
    t = devtensor.zeros((4,), dtype=dtype, device="cuda")
    assert hasattr(t, "__cuda_array_interface__") is False
    assert getattr(t, "__cuda_array_interface__", None) is None
    with pytest.raises(AttributeError, match=f"{dtype}.*DLPack"):
        t.__cuda_array_interface__
    assert hasattr(devtensor.zeros((4,), dtype=dtype), "__array_interface__") is False, "as the host interface"
    assert devtensor.from_dlpack(t).data_ptr == t.data_ptr, "DLPack, the fallback, still works"


@pytest.mark.cuda
def test_device_tensors_refuse_numpy_as_torch_does():
    t = devtensor.zeros((2,), device="cuda")
    with pytest.raises(TypeError, match=r"\.cpu\(\)"):
        t.numpy()
    with pytest.raises(TypeError):
        np.asarray(t)
    assert not hasattr(t, "__array_interface__")
    np.testing.assert_array_equal(t.numpy(force=True), np.zeros(2, np.float32))
    c = t.cpu()
    assert c.device == "cpu" and c is not t and c.tolist() == [0.0, 0.0]


@pytest.mark.cuda
def test_device_tensors_print_and_list_their_values():
    t = devtensor.from_dlpack(np.array([[0.0, 1.0], [2.0, 3.0]], dtype=np.float16)).to("cuda")
    assert repr(t) == "tensor([[0., 1.],\n        [2., 3.]], device='cuda:0', dtype=float16)"
    assert t.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    b = devtensor.full((3,), 1.5, dtype="bfloat16", device="cuda")
    assert b.tolist() == [1.5, 1.5, 1.5] and type(b.tolist()[0]) is float
    f8 = devtensor.full((2,), -0.5, dtype="float8_e4m3fn", device="cuda")
    assert f8.tolist() == [-0.5, -0.5]


@pytest.mark.cuda
def test_a_plain_object_pointing_at_devtensor_memory_is_imported_zero_copy():
    a = np.arange(24, dtype=np.int32).reshape(4, 6)
    t = devtensor.from_dlpack(a).to("cuda")
    obj = CudaArray(dict(t.__cuda_array_interface__), owner=t)
    before = sys.getrefcount(obj)
    u = devtensor.from_dlpack(obj)
    assert u.data_ptr == t.data_ptr
    assert u.device == "cuda:0" and u.dtype == "int32" and u.shape == (4, 6)
    assert not u.read_only
    assert sys.getrefcount(obj) == before + 1, "the tensor keeps the producer object alive"
    np.testing.assert_array_equal(host(u), a)
    del u
    # The owner goes once the device work that read it is done: at once when its event has
    # already completed, else at the next poll; draining waits for that work.
    from devtensor._devtensor import _drain_deleters

    _drain_deleters()
    assert sys.getrefcount(obj) == before


@pytest.mark.cuda
def test_round_trip_of_strided_views_and_read_only():
    a = np.arange(30, dtype=np.float64).reshape(5, 6)
    t = devtensor.from_dlpack(a).to("cuda")
    v = t[1::2, ::-2]
    u = devtensor.from_dlpack(CudaArray(v.__cuda_array_interface__, owner=v))
    assert u.data_ptr == v.data_ptr and u.strides == v.strides == (12, -2)
    np.testing.assert_array_equal(host(u), a[1::2, ::-2])
    ro = dict(t.__cuda_array_interface__, data=(t.data_ptr, True))
    r = devtensor.from_dlpack(CudaArray(ro, owner=t))
    assert r.read_only
    with pytest.raises(BufferError):
        r.fill_(0.0)
    empty = devtensor.from_dlpack(CudaArray(devtensor.empty((0,), device="cuda").__cuda_array_interface__))
    assert empty.shape == (0,) and empty.device == "cuda:0"


@pytest.mark.cuda
def test_managed_and_pinned_memory_are_recognised():
    m = devtensor.full((4,), 2, dtype="int16", device="cuda_managed:0")
    u = devtensor.from_dlpack(CudaArray(m.__cuda_array_interface__, owner=m))
    assert u.device == "cuda_managed:0" and u.tolist() == [2, 2, 2, 2]
    p = devtensor.full((3,), 5, dtype="uint8", device="cuda_host")
    cai = {"shape": (3,), "typestr": "|u1", "data": (p.data_ptr, False), "version": 3, "stream": None}
    q = devtensor.from_dlpack(CudaArray(cai, owner=p))
    assert q.device == "cuda_host" and q.tolist() == [5, 5, 5]


@pytest.mark.cuda
def test_the_import_refuses_what_it_cannot_describe():
    t = devtensor.zeros((8,), dtype="int32", device="cuda")
    cai = t.__cuda_array_interface__
    with pytest.raises(BufferError, match="mask"):
        devtensor.from_dlpack(CudaArray(dict(cai, mask=t), owner=t))
    with pytest.raises(BufferError, match="multiple"):
        devtensor.from_dlpack(CudaArray(dict(cai, shape=(2,), strides=(6,)), owner=t))
    with pytest.raises(ValueError, match="0 is disallowed"):
        devtensor.from_dlpack(CudaArray(dict(cai, stream=0), owner=t))
    with pytest.raises(BufferError, match="byte order"):
        devtensor.from_dlpack(CudaArray(dict(cai, typestr=">i4"), owner=t))
    host_memory = np.zeros(4)
    with pytest.raises(BufferError, match="not CUDA memory"):
        devtensor.from_dlpack(CudaArray(dict(cai, data=(host_memory.ctypes.data, False)), owner=host_memory))


@pytest.mark.cuda
def test_the_import_waits_for_the_producers_stream():
    s = devtensor.Stream()
    with devtensor.stream(s):
        t = devtensor.full((64, 64), 4.0, device="cuda")  # queued on s
        cai = t.__cuda_array_interface__
    assert cai["stream"] == s.cuda_stream
    # Outside the block, devtensor works on the default stream: the import makes it
    # wait for s, so the copy below is ordered after the fill (a race otherwise).
    u = devtensor.from_dlpack(CudaArray(cai, owner=t))
    np.testing.assert_array_equal(host(u), np.full((64, 64), 4.0, np.float32))
    s.synchronize()
