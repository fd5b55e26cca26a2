"""Round trips with apache-tvm-ffi (CPU). tvm_ffi.from_dlpack reads our type's
`__dlpack_c_exchange_api__` first, and otherwise calls `__dlpack__()` with no arguments."""

import gc

import pytest

import devtensor

np = pytest.importorskip("numpy")
tvm_ffi = pytest.importorskip("tvm_ffi")

# tvm_ffi 0.1.x has no name for DLPack complex (code 5) and refuses it.
TVM_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e8m0fnu",
]


class NoExchange:
    """Hides our exchange API so that tvm_ffi must call `__dlpack__`."""

    def __init__(self, t):
        self.t = t
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def ptr(v):
    p = v.data_ptr
    return p() if callable(p) else p


def iota(shape, dtype="float32"):
    t = devtensor.empty(shape, dtype=dtype)
    ref = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    np.from_dlpack(t)[...] = ref
    return t, ref


@pytest.mark.parametrize("path", ["exchange", "dunder"])
@pytest.mark.parametrize("name", TVM_DTYPES)
def test_to_tvm_every_dtype(name, path):
    t = devtensor.zeros((3, 4), dtype=name)
    src = t if path == "exchange" else NoExchange(t)
    v = tvm_ffi.from_dlpack(src)
    assert str(v.dtype) == name
    assert tuple(v.shape) == (3, 4)
    assert tuple(v.strides) == (4, 1)
    assert ptr(v) == t.data_ptr
    assert str(v.device).startswith("cpu")
    if path == "dunder":
        assert src.calls == [{}]  # tvm_ffi passes nothing: a legacy capsule


@pytest.mark.parametrize(
    "make",
    [lambda t: t.transpose(0, 1), lambda t: t[1:, ::2], lambda t: t[::-1], lambda t: t[2], lambda t: t[None]],
    ids=["T", "step", "flip", "row", "newaxis"],
)
@pytest.mark.parametrize("path", ["exchange", "dunder"])
def test_views_to_tvm(make, path):
    t, ref = iota((4, 6))
    v = make(t)
    w = tvm_ffi.from_dlpack(v if path == "exchange" else NoExchange(v))
    assert tuple(w.shape) == v.shape
    assert tuple(w.strides) == v.strides
    assert ptr(w) == v.data_ptr
    # ... and back out to NumPy through tvm_ffi's own producer.
    np.testing.assert_array_equal(np.from_dlpack(w), make(_Np(ref)))


class _Np:
    def __init__(self, a):
        self.a = a

    def transpose(self, d0, d1):
        return np.swapaxes(self.a, d0, d1)

    def __getitem__(self, k):
        return self.a[k]


def test_round_trip_back_to_devtensor():
    t, ref = iota((3, 5), "int32")
    v = tvm_ffi.from_dlpack(t)
    u = devtensor.from_dlpack(v)
    assert u.data_ptr == t.data_ptr
    assert u.shape == (3, 5) and u.dtype == "int32"
    u[1].fill_(-1)
    assert (np.from_dlpack(t)[1] == -1).all()


def test_tvm_to_devtensor_from_numpy_source():
    a = np.arange(10, dtype=np.float32)
    v = tvm_ffi.from_dlpack(a)
    t = devtensor.from_dlpack(v)
    assert t.data_ptr == a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_0d_and_empty():
    v = tvm_ffi.from_dlpack(devtensor.full((), 2.0))
    assert tuple(v.shape) == ()
    e = tvm_ffi.from_dlpack(devtensor.zeros((0, 4)))
    assert tuple(e.shape) == (0, 4)
    u = devtensor.from_dlpack(e)
    assert u.shape == (0, 4)


def test_require_contiguous():
    t = devtensor.zeros((3, 4))
    with pytest.raises(Exception):  # noqa: B017 - tvm_ffi's own error type
        tvm_ffi.from_dlpack(t.transpose(0, 1), require_contiguous=True)
    assert tuple(tvm_ffi.from_dlpack(t, require_contiguous=True).shape) == (3, 4)


def test_complex_refused_cleanly():
    # tvm_ffi 0.1 cannot name complex dtypes; the export must still be released (leak check).
    t = devtensor.zeros(3, dtype="complex64")
    try:
        tvm_ffi.from_dlpack(t)
    except (ValueError, TypeError, RuntimeError):
        pass


def test_tvm_keeps_memory_alive():
    t = devtensor.full(1000, 3.0)
    v = tvm_ffi.from_dlpack(t)
    p = t.data_ptr
    del t
    gc.collect()
    devtensor.full(1000, 9.0)
    assert ptr(v) == p
    assert (np.from_dlpack(v) == 3.0).all()


def test_deleters_and_refcounts(rc, live):
    t = devtensor.zeros(8)
    r0, n0 = rc(t), live()
    for path in ("exchange", "dunder"):
        v = tvm_ffi.from_dlpack(t if path == "exchange" else NoExchange(t))
        assert live() == n0 + 1
        del v
        assert live() == n0
        assert rc(t) == r0
    for _ in range(500):
        tvm_ffi.from_dlpack(t)
    assert live() == n0
