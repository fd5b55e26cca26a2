"""`devtensor.from_dlpack` against hand-made producers (research §a items 3, 6-8, 15, 26, 28):
every path must call the producer's deleter exactly once."""

import ctypes
import gc

import pytest

import devtensor
from conftest import FLAG_IS_COPIED, FLAG_READ_ONLY

np = pytest.importorskip("numpy")


def buf(values, dtype=np.float32):
    a = np.ascontiguousarray(np.asarray(values, dtype=dtype))
    return a, a.ctypes.data


# --------------------------------------------------------------------------------------
# Good capsules
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [False, True])
def test_crafted_capsule_zero_copy_and_deleter_once(dlp, versioned):
    a, p = buf(np.arange(6).reshape(2, 3))
    cap, rec = dlp.craft(data=p, shape=(2, 3), strides=(3, 1), versioned=versioned, keep=a)
    t = devtensor.from_dlpack(cap)
    assert dlp.name(cap) == ("used_dltensor_versioned" if versioned else "used_dltensor")
    assert t.data_ptr == p
    assert t.shape == (2, 3) and t.strides == (3, 1) and t.dtype == "float32"
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    assert rec.deleted == 0
    v = t[1]  # a view keeps the import alive
    del t, cap
    gc.collect()
    assert rec.deleted == 0
    assert np.from_dlpack(v)[2] == 5
    del v
    gc.collect()
    assert rec.deleted == 1


def test_null_strides_are_c_contiguous(dlp):
    a, p = buf(np.arange(24).reshape(2, 3, 4))
    cap, rec = dlp.craft(data=p, shape=(2, 3, 4), strides=None, version=(1, 0), keep=a)
    t = devtensor.from_dlpack(cap)
    assert t.strides == (12, 4, 1)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    del t
    gc.collect()
    assert rec.deleted == 1


def test_0d_null_shape_and_strides(dlp):
    a, p = buf(42.0)
    cap, rec = dlp.craft(data=p, shape=(), strides=None, null_shape=True, keep=a)
    t = devtensor.from_dlpack(cap)
    assert t.shape == () and t.ndim == 0
    assert np.from_dlpack(t)[()] == 42.0
    del t
    gc.collect()
    assert rec.deleted == 1


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 0, 5)])
def test_empty_with_null_data(dlp, shape):
    # §a 7: numel == 0 may come with data == NULL; the deleter still runs.
    strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    cap, rec = dlp.craft(data=None, shape=shape, strides=strides)
    t = devtensor.from_dlpack(cap)
    assert t.shape == shape
    assert t.nbytes == 0
    assert np.from_dlpack(t).shape == shape
    del t
    gc.collect()
    assert rec.deleted == 1


def test_byte_offset_is_honoured(dlp):
    # §a 8: consumers must use data + byte_offset.
    a, p = buf(np.arange(8))
    cap, rec = dlp.craft(data=p, shape=(6,), strides=(1,), byte_offset=8, keep=a)
    t = devtensor.from_dlpack(cap)
    assert t.data_ptr == p + 8
    np.testing.assert_array_equal(np.from_dlpack(t), a[2:])
    del t
    gc.collect()
    assert rec.deleted == 1


def test_negative_strides_import(dlp):
    a, p = buf(np.arange(12).reshape(3, 4))
    last_row = p + 8 * 4
    cap, rec = dlp.craft(data=last_row, shape=(3, 4), strides=(-4, 1), keep=a)
    t = devtensor.from_dlpack(cap)
    assert t.strides == (-4, 1)
    np.testing.assert_array_equal(np.from_dlpack(t), a[::-1])
    del t
    gc.collect()
    assert rec.deleted == 1


def test_read_only_flag_imports_read_only(dlp):
    a, p = buf([1, 2, 3])
    cap, rec = dlp.craft(data=p, shape=(3,), strides=(1,), flags=FLAG_READ_ONLY, keep=a)
    t = devtensor.from_dlpack(cap)
    assert t.read_only
    with pytest.raises((BufferError, ValueError)):
        t.fill_(0)
    del t
    gc.collect()
    assert rec.deleted == 1


def test_is_copied_flag_imports(dlp):
    a, p = buf([1, 2, 3])
    cap, rec = dlp.craft(data=p, shape=(3,), strides=(1,), flags=FLAG_IS_COPIED, keep=a)
    t = devtensor.from_dlpack(cap)
    assert not t.read_only
    del t
    gc.collect()
    assert rec.deleted == 1


def test_null_deleter_is_allowed(dlp):
    # §a 12: the deleter may be NULL.
    a, p = buf([1, 2, 3])
    cap, _rec = dlp.craft(data=p, shape=(3,), strides=(1,), keep=a)
    m = dlp.DLManagedTensorVersioned.from_address(dlp.pointer(cap, "dltensor_versioned"))
    m.deleter = None
    t = devtensor.from_dlpack(cap)
    np.testing.assert_array_equal(np.from_dlpack(t), [1, 2, 3])
    del t
    gc.collect()


@pytest.mark.parametrize("minor", [0, 1, 2, 3, 7])
def test_any_minor_version_accepted(dlp, minor):
    a, p = buf([1, 2])
    cap, rec = dlp.craft(data=p, shape=(2,), strides=(1,), version=(1, minor), keep=a)
    t = devtensor.from_dlpack(cap)
    del t
    gc.collect()
    assert rec.deleted == 1


# --------------------------------------------------------------------------------------
# Bad capsules: an error, and the deleter exactly once
# --------------------------------------------------------------------------------------

BAD = {
    "major0": dict(version=(0, 9)),
    "major2": dict(version=(2, 0)),
    "lanes4": dict(dtype=(2, 32, 4)),
    "code99": dict(dtype=(99, 32, 1)),
    "bits24": dict(dtype=(2, 24, 1)),
    "bool16": dict(dtype=(6, 16, 1)),
    "vulkan": dict(device=(7, 0)),
    "opencl": dict(device=(4, 0)),
    "negative-dim": dict(shape=(3, -1), strides=(1, 1)),
    "negative-device-id": dict(device=(2, -1)),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("versioned", [False, True])
def test_bad_capsule_raises_and_deletes_once(dlp, case, versioned):
    if versioned is False and case.startswith("major"):
        pytest.skip("legacy capsules have no version")
    a, p = buf(np.arange(6))
    kw = dict(data=p, shape=(2, 3), strides=(3, 1), keep=a, versioned=versioned)
    kw.update(BAD[case])
    cap, rec = dlp.craft(**kw)
    with pytest.raises((BufferError, ValueError, RuntimeError)):
        devtensor.from_dlpack(cap)
    gc.collect()
    assert rec.deleted == 1
    assert dlp.name(cap).startswith("used_")
    del cap
    gc.collect()
    assert rec.deleted == 1


def test_major_version_mismatch_is_buffer_error(dlp):
    a, p = buf([1.0])
    cap, rec = dlp.craft(data=p, shape=(1,), strides=(1,), version=(2, 0), keep=a)
    with pytest.raises(BufferError):
        devtensor.from_dlpack(cap)
    assert rec.deleted == 1


def test_gpu_capsule_without_backend(dlp):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    except ImportError:
        pass
    a, p = buf([1.0, 2.0])
    cap, rec = dlp.craft(data=p, shape=(2,), strides=(1,), device=(2, 0), keep=a)
    # §a 28 lets a CUDA build import CUDA memory it cannot touch here; either way the
    # deleter runs exactly once.
    try:
        t = devtensor.from_dlpack(cap)
    except (BufferError, RuntimeError):
        pass
    else:
        assert t.device == "cuda:0"
        assert t.__dlpack_device__() == (2, 0)
        assert t.data_ptr == p
        assert rec.deleted == 0
        with pytest.raises((RuntimeError, BufferError, ValueError)):
            t.clone()  # needs the CUDA backend
        del t
    gc.collect()
    assert rec.deleted == 1


@pytest.mark.parametrize("versioned", [False, True])
def test_second_consumption_raises(dlp, versioned):
    a, p = buf([1.0, 2.0])
    cap, rec = dlp.craft(data=p, shape=(2,), strides=(1,), versioned=versioned, keep=a)
    t = devtensor.from_dlpack(cap)
    with pytest.raises(ValueError):
        devtensor.from_dlpack(cap)
    del t
    gc.collect()
    assert rec.deleted == 1


def test_our_capsule_consumed_twice(live):
    n0 = live()
    cap = devtensor.ones(3).__dlpack__(max_version=(1, 3))
    t = devtensor.from_dlpack(cap)
    with pytest.raises(ValueError):
        devtensor.from_dlpack(cap)
    del t, cap
    assert live() == n0


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_our_own_capsule_comes_back_as_a_view_of_the_same_storage(live, max_version):
    # Our export is recognised on import: the tensor shares the original's
    # storage (and its lock) and the exported struct is freed at once, where
    # a foreign import would hold it until the tensor goes.
    x = devtensor.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)).clone()
    n0 = live()
    cap = x[:, 1::2].__dlpack__(max_version=max_version)
    assert live() == n0 + 1
    t = devtensor.from_dlpack(cap)
    assert live() == n0
    assert t.data_ptr == x.data_ptr + 4 and t.strides == (4, 2)
    t.fill_(-1)
    assert x.tolist() == [[0, -1, 2, -1], [4, -1, 6, -1], [8, -1, 10, -1]]


def test_wrong_capsule_name_is_type_error(dlp):
    cap = ctypes.pythonapi.PyCapsule_New(ctypes.c_void_p(1), ctypes.c_char_p(None), None)
    with pytest.raises(TypeError):
        devtensor.from_dlpack(cap)
    api = devtensor.Tensor.__dlpack_c_exchange_api__
    with pytest.raises(TypeError):
        devtensor.from_dlpack(api)


@pytest.mark.parametrize("obj", [object(), 3, "abc", [1, 2, 3], None])
def test_non_producers_are_type_error(obj):
    with pytest.raises(TypeError):
        devtensor.from_dlpack(obj)


# --------------------------------------------------------------------------------------
# What our consumer asks of a Python producer (§a 26, 27)
# --------------------------------------------------------------------------------------


class Spy:
    """A DLPack producer wrapping a NumPy array that records every __dlpack__ call."""

    def __init__(self, a, new_style=True, fail_with=None):
        self.a = a
        self.calls = []
        self.new_style = new_style
        self.fail_with = fail_with

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(dict(kwargs))
        if self.fail_with is not None:
            raise self.fail_with
        if not self.new_style and set(kwargs) - {"stream"}:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.a.__dlpack__(**kwargs)


def test_consumer_asks_for_versioned_first():
    a = np.arange(6, dtype=np.float32)
    s = Spy(a)
    t = devtensor.from_dlpack(s)
    assert s.calls[0].get("max_version") == (1, 3)
    assert s.calls[0].get("stream") is None  # never a stream for CPU data
    assert len(s.calls) == 1
    assert t.data_ptr == a.ctypes.data


def test_consumer_falls_back_to_legacy_on_type_error():
    a = np.arange(6, dtype=np.float32)
    s = Spy(a, new_style=False)
    t = devtensor.from_dlpack(s)
    assert len(s.calls) == 2
    assert "max_version" in s.calls[0]
    assert "max_version" not in s.calls[1] and "dl_device" not in s.calls[1] and "copy" not in s.calls[1]
    assert t.data_ptr == a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_consumer_does_not_retry_on_buffer_error():
    s = Spy(np.zeros(3), fail_with=BufferError("nope"))
    with pytest.raises(BufferError):
        devtensor.from_dlpack(s)
    assert len(s.calls) == 1


def test_consumer_passes_copy_and_device():
    a = np.arange(4, dtype=np.float64)
    s = Spy(a)
    t = devtensor.from_dlpack(s, copy=True)
    assert s.calls[-1].get("copy") is True
    assert t.data_ptr != a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    t2 = devtensor.from_dlpack(s, device="cpu")
    assert tuple(s.calls[-1].get("dl_device")) == (1, 0)
    assert t2.data_ptr == a.ctypes.data
    t3 = devtensor.from_dlpack(s, copy=False)
    assert s.calls[-1].get("copy") is False
    assert t3.data_ptr == a.ctypes.data


def test_consumer_old_producer_with_copy_or_device_gets_the_legacy_export_adjusted():
    # A producer older than DLPack 1.0 knows neither dl_device nor copy: the legacy
    # export (zero-copy, so copy=False holds), then our own copy where copy=True asks.
    a = np.arange(5, dtype=np.float32)
    for kwargs, shares in [
        ({"copy": True}, False),
        ({"copy": False}, True),
        ({"device": "cpu"}, True),
        ({"device": "cpu", "copy": True}, False),
    ]:
        s = Spy(a, new_style=False)
        t = devtensor.from_dlpack(s, **kwargs)
        assert len(s.calls) == 2, kwargs
        assert s.calls[1] == {}, "the legacy call: no stream for host data, no new keywords"
        assert (t.data_ptr == a.ctypes.data) is shares, kwargs
        np.testing.assert_array_equal(np.from_dlpack(t), a)
    # Only TypeError means "an older protocol": other errors reach the caller.
    s = Spy(a, fail_with=ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        devtensor.from_dlpack(s, copy=True)
    assert len(s.calls) == 1


def test_producer_returning_garbage():
    class Bad:
        def __dlpack__(self, **kw):
            return 42

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError):
        devtensor.from_dlpack(Bad())


@pytest.mark.parametrize("attr", ["__dlpack__", "__cuda_array_interface__", "__array_interface__"])
def test_producer_attribute_errors_propagate(attr):
    # Only AttributeError means "not there" (as for hasattr): any other error a
    # producer's property raises is its own, and reaches the caller unchanged.
    a = np.arange(3.0)

    def broken(self):
        raise RuntimeError("the producer is broken")

    def absent(self):
        raise AttributeError(attr)

    ns = {attr: property(broken)}
    if attr == "__array_interface__":
        ns["__cuda_array_interface__"] = property(absent)
    Broken = type("Broken", (), ns)
    with pytest.raises(RuntimeError, match="the producer is broken"):
        devtensor.from_dlpack(Broken())
    with pytest.raises(RuntimeError, match="the producer is broken"):
        devtensor.zeros(3).copy_(Broken())
    # A property raising AttributeError is "not there": the next protocol is tried.
    Absent = type("Absent", (), {"__dlpack__": property(absent), "__array_interface__": a.__array_interface__})
    np.testing.assert_array_equal(np.from_dlpack(devtensor.from_dlpack(Absent())), a)


def test_array_interface_read_only_flag_may_be_an_int():
    # NumPy reads the flag's truth: (ptr, 1) / (ptr, 0) as producers write it.
    a = np.arange(4.0)
    for flag, read_only in [(1, True), (0, False), (True, True)]:
        ai = dict(a.__array_interface__, data=(a.ctypes.data, flag))
        t = devtensor.from_dlpack(type("P", (), {"__array_interface__": ai, "keep": a})())
        assert t.read_only is read_only and t.data_ptr == a.ctypes.data
        np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_a_producer_dlpack_device_error_propagates():
    # Optional for old producers (no __dlpack_device__ still imports), but an
    # error of its own reaches the caller, as torch's from_dlpack lets it.
    a = np.arange(3.0)

    class Broken:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            raise RuntimeError("no device today")

    class Old:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

    with pytest.raises(RuntimeError, match="no device today"):
        devtensor.from_dlpack(Broken())
    np.testing.assert_array_equal(np.from_dlpack(devtensor.from_dlpack(Old())), a)


def test_from_dlpack_of_tensor():
    t = devtensor.ones((2, 2))
    u = devtensor.from_dlpack(t)
    assert u.data_ptr == t.data_ptr and u.shape == t.shape
    c = devtensor.from_dlpack(t, copy=True)
    assert c.data_ptr != t.data_ptr
    assert np.from_dlpack(c).sum() == 4
    assert devtensor.from_dlpack(t, copy=False).data_ptr == t.data_ptr
    assert devtensor.from_dlpack(t, device="cpu").data_ptr == t.data_ptr
    assert devtensor.from_dlpack(t, device=(1, 0)).data_ptr == t.data_ptr


def test_from_dlpack_to_gpu_without_backend():
    # With a GPU devtensor copies to it (test_cuda.py checks that).
    if devtensor.is_available():
        pytest.skip("SKIP: a CUDA device is present (this checks the answers without one)")
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    except ImportError:
        pass
    a = np.zeros(3)
    with pytest.raises((BufferError, RuntimeError, ValueError)):
        devtensor.from_dlpack(a, device="cuda")
    with pytest.raises(BufferError):
        devtensor.from_dlpack(a, device="cuda", copy=False)


def test_from_dlpack_keyword_only():
    with pytest.raises(TypeError):
        devtensor.from_dlpack(np.zeros(2), "cpu")


# --------------------------------------------------------------------------------------
# A producer type's exchange API that we must not use (§a 30-31, research §d)
# --------------------------------------------------------------------------------------

_API_NAME = ctypes.create_string_buffer(b"dlpack_exchange_api")
_OTHER_NAME = ctypes.create_string_buffer(b"something_else")
_KEEP_TABLES = []


def _api_capsule(dlp, major, with_from_py, name=_API_NAME):
    table = dlp.DLPackExchangeAPI()
    table.version.major, table.version.minor = major, 0
    if with_from_py:
        # Points at a function that must never be called: if the consumer ignored the
        # version check, calling this would crash the test process.
        table.managed_tensor_from_py_object_no_sync = 1
    _KEEP_TABLES.append(table)
    return ctypes.pythonapi.PyCapsule_New(ctypes.addressof(table), ctypes.cast(name, ctypes.c_char_p), None)


@pytest.mark.parametrize("kind", ["int", "wrong-name", "major2", "null-from-py", "none"])
def test_unusable_exchange_api_falls_back_to_dunder(dlp, kind):
    a = np.arange(6, dtype=np.float32)
    attr = {
        "int": lambda: 12345,  # tvm-ffi <= 0.1.4 used an int; never dereference it blindly
        "wrong-name": lambda: _api_capsule(dlp, 1, True, _OTHER_NAME),
        "major2": lambda: _api_capsule(dlp, 2, True),
        "null-from-py": lambda: _api_capsule(dlp, 1, False),
        "none": lambda: None,
    }[kind]()

    class Producer(Spy):
        __dlpack_c_exchange_api__ = attr

    p = Producer(a)
    t = devtensor.from_dlpack(p)
    assert len(p.calls) == 1
    assert t.data_ptr == a.ctypes.data


@pytest.mark.parametrize("scalar", [np.float64(1.5), np.int64(-7), np.complex64(2 - 3j), np.bool_(True)])
def test_numpy_scalars_import_with_the_memory_their_interface_holds(scalar):
    # A NumPy scalar's __array_interface__ describes a temporary 0-d array held
    # only by the dict's "__ref": the import keeps the dict, so the values stay
    # the scalar's after the temporary's memory would have been reused.
    t = devtensor.from_dlpack(scalar)
    churn = [np.full((), 99 + i, dtype=scalar.dtype) for i in range(1000)]
    gc.collect()
    assert t.shape == () and t.item() == scalar.item()
    del churn
    # A dict built on each access is kept the same way.
    class Fresh:
        @property
        def __array_interface__(self):
            a = np.array([4.0, 5.0])
            return dict(a.__array_interface__, __ref=a)

    t = devtensor.from_dlpack(Fresh())
    churn = [np.full(2, 99.0) for _ in range(1000)]
    assert t.tolist() == [4.0, 5.0]
