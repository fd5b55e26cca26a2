"""Our `__dlpack__` / `__dlpack_device__` / `__dlpack_c_exchange_api__` (research §a items 1-25, 30-36),
inspected through ctypes, with no consumer library involved."""

import ctypes
import gc
import inspect
import sys
import threading

import pytest

import devtensor
from conftest import DLPACK_DTYPES, FLAG_IS_COPIED, FLAG_READ_ONLY

np = pytest.importorskip("numpy")


def readonly_tensor(shape=(3, 4)):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    a.flags.writeable = False
    t = devtensor.from_dlpack(a)
    assert t.read_only
    return t, a


# --------------------------------------------------------------------------------------
# Capsule kinds and versions (§a 1, 2, 17)
# --------------------------------------------------------------------------------------


def test_default_is_legacy_capsule(dlp):
    t = devtensor.zeros((2, 3))
    cap = t.__dlpack__()
    assert dlp.is_capsule(cap)
    assert dlp.name(cap) == "dltensor"
    assert dlp.is_valid(cap, "dltensor")
    info = dlp.read(cap)
    assert info["kind"] == "dltensor"
    assert info["data"] + info["byte_offset"] == t.data_ptr
    assert info["shape"] == (2, 3)
    assert info["strides"] == (3, 1)
    assert info["device"] == (1, 0)
    assert info["dtype"] == (2, 32, 1)
    assert info["deleter"]


@pytest.mark.parametrize("max_version, minor", [((1, 0), 0), ((1, 1), 1), ((1, 3), 3), ((1, 99), 3), ((2, 0), 3)])
def test_versioned_capsule(dlp, max_version, minor):
    t = devtensor.zeros((2, 3))
    cap = t.__dlpack__(max_version=max_version)
    assert dlp.name(cap) == "dltensor_versioned"
    info = dlp.read(cap)
    assert info["version"][0] == 1
    if max_version[0] == 1:
        assert info["version"][1] == minor
    assert info["flags"] == 0
    assert info["data"] + info["byte_offset"] == t.data_ptr
    assert info["shape"] == (2, 3)
    assert info["strides"] == (3, 1)


@pytest.mark.parametrize("max_version", [(0, 8), (0, 0), None])
def test_old_max_version_gives_legacy(dlp, max_version):
    cap = devtensor.zeros(3).__dlpack__(max_version=max_version)
    assert dlp.name(cap) == "dltensor"


@pytest.mark.parametrize("max_version", ["1.0", (1,), 5, (1, 2, 3), (-1, 0), (True, False), [1, 3], (1.0, 3)])
def test_bad_max_version_is_not_type_error(max_version):
    # §a 18: TypeError means "old producer" to consumers; bad values are BufferError/ValueError.
    with pytest.raises((BufferError, ValueError)):
        devtensor.zeros(3).__dlpack__(max_version=max_version)


def test_keywords_only():
    t = devtensor.zeros(3)
    with pytest.raises(TypeError, match="positional"):
        t.__dlpack__(None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        t.__dlpack__(bogus=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        t.__dlpack__(max_version=(1, 0), bogus=1)


def test_keyword_forms(dlp):
    # __dlpack__ parses its own keywords (a C method): names built at run time
    # (not interned), a ** dict, the unbound descriptor, and its signature.
    t = devtensor.zeros(3)
    name = "".join(["max_", "version"])
    assert dlp.name(t.__dlpack__(**{name: (1, 0)})) == "dltensor_versioned"
    kwargs = {"stream": None, "max_version": (1, 3), "dl_device": (1, 0), "copy": False}
    assert dlp.name(t.__dlpack__(**kwargs)) == "dltensor_versioned"
    assert dlp.name(devtensor.Tensor.__dlpack__(t, max_version=(1, 0))) == "dltensor_versioned"
    assert dlp.name(devtensor.Tensor.__dlpack__(t)) == "dltensor"
    with pytest.raises(TypeError):
        devtensor.Tensor.__dlpack__(np.zeros(3))  # not a devtensor.Tensor
    sig = inspect.signature(devtensor.Tensor.__dlpack__)
    assert list(sig.parameters) == ["self", "stream", "max_version", "dl_device", "copy"]
    assert all(p.default is None for n, p in sig.parameters.items() if n != "self")


@pytest.mark.parametrize("dtype", list(DLPACK_DTYPES))
def test_dtype_codes(dlp, dtype):
    code, bits = DLPACK_DTYPES[dtype]
    t = devtensor.empty(4, dtype=dtype)
    for kw in ({}, {"max_version": (1, 3)}):
        info = dlp.read(t.__dlpack__(**kw))
        assert info["dtype"] == (code, bits, 1)


# --------------------------------------------------------------------------------------
# Layout: strides, views, 0-d, empty (§a 6, 7, 8)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t,
        lambda t: t.transpose(0, 1),
        lambda t: t[1:, ::2],
        lambda t: t[::-1],
        lambda t: t[:, ::-3],
        lambda t: t[2],
        lambda t: t[None, :, 1],
    ],
    ids=["base", "T", "slice", "flip", "flip3", "row", "newaxis"],
)
@pytest.mark.parametrize("versioned", [False, True])
def test_views_export_layout(dlp, make, versioned):
    t = make(devtensor.zeros((5, 6), dtype="int16"))
    cap = t.__dlpack__(max_version=(1, 3) if versioned else None)
    info = dlp.read(cap)
    assert info["ndim"] == t.ndim
    assert info["shape"] == t.shape
    assert info["strides"] == t.strides  # in elements, never NULL for ndim > 0
    assert info["data"] + info["byte_offset"] == t.data_ptr


def test_0d_export(dlp):
    t = devtensor.full((), 2.0)
    info = dlp.read(t.__dlpack__(max_version=(1, 3)))
    assert info["ndim"] == 0
    assert info["shape"] == ()
    assert info["data"] + info["byte_offset"] == t.data_ptr


def test_empty_export(dlp):
    t = devtensor.zeros((0, 3))
    info = dlp.read(t.__dlpack__(max_version=(1, 3)))
    assert info["shape"] == (0, 3)
    assert info["strides"] is not None


def test_byte_offset_zero(dlp):
    # §a 8: byte_offset=0, the view offset in `data` (old torch ignored byte_offset).
    t = devtensor.zeros((4, 4))[1:, 2:]
    for kw in ({}, {"max_version": (1, 3)}):
        info = dlp.read(t.__dlpack__(**kw))
        assert info["byte_offset"] == 0
        assert info["data"] == t.data_ptr


# --------------------------------------------------------------------------------------
# stream (§a 19, 21)
# --------------------------------------------------------------------------------------


def test_stream_none_ok_on_cpu(dlp):
    assert dlp.name(devtensor.zeros(3).__dlpack__(stream=None)) == "dltensor"


@pytest.mark.parametrize("stream", [0, 1, 2, 3, 12345678])
def test_stream_int_rejected_on_cpu(stream):
    # NumPy raises ValueError; the spec leaves the exact type open. It must not be silently accepted.
    t = devtensor.zeros(3)
    with pytest.raises((ValueError, BufferError)):
        t.__dlpack__(stream=stream)
    with pytest.raises((ValueError, BufferError)):
        t.__dlpack__(stream=stream, max_version=(1, 3))


@pytest.mark.parametrize("stream", ["1", 1.5, object()])
def test_stream_non_int(stream):
    with pytest.raises((TypeError, ValueError, BufferError)):
        devtensor.zeros(3).__dlpack__(stream=stream)


# --------------------------------------------------------------------------------------
# dl_device and copy (§a 4, 22, 23)
# --------------------------------------------------------------------------------------


def _ro(info):
    return bool(info["flags"] & FLAG_READ_ONLY)


def _copied(info):
    return bool(info["flags"] & FLAG_IS_COPIED)


@pytest.mark.parametrize("dl_device", [None, (1, 0)])
@pytest.mark.parametrize("copy", [None, False])
def test_dl_device_own_device_no_copy(dlp, dl_device, copy):
    t = devtensor.zeros((3, 4))
    info = dlp.read(t.__dlpack__(max_version=(1, 3), dl_device=dl_device, copy=copy))
    assert info["data"] == t.data_ptr
    assert not _copied(info)
    assert info["device"] == (1, 0)


@pytest.mark.parametrize("dl_device", [(2, 0), (3, 0), (10, 0), (13, 0), (7, 0), (1, 5)])
@pytest.mark.parametrize("copy", [None, True, False])
def test_dl_device_other_device_is_buffer_error(dl_device, copy):
    with pytest.raises(BufferError):
        devtensor.zeros(3).__dlpack__(max_version=(1, 3), dl_device=dl_device, copy=copy)


@pytest.mark.parametrize("dl_device", ["cpu", (1,), 1, (True, False), (1.0, 0)])
def test_dl_device_malformed(dl_device):
    with pytest.raises((BufferError, ValueError)):
        devtensor.zeros(3).__dlpack__(max_version=(1, 3), dl_device=dl_device)


@pytest.mark.parametrize("copy", ["yes", "False", 0, 1, 1.0, [True]])
def test_copy_must_be_a_bool_or_none(copy):
    # The array API's `copy: Optional[bool]`: "False" was truthy, so it copied.
    with pytest.raises(ValueError, match="copy must be True, False or None"):
        devtensor.zeros(3).__dlpack__(max_version=(1, 3), copy=copy)


def test_copy_takes_numpy_bools(dlp):
    # numpy.from_dlpack and torch pass their caller's `copy` on unchanged.
    import numpy as np

    t = devtensor.zeros(3)
    copied = dlp.read(t.__dlpack__(max_version=(1, 3), copy=np.True_))
    assert copied["flags"] & FLAG_IS_COPIED and copied["data"] + copied["byte_offset"] != t.data_ptr
    shared = dlp.read(t.__dlpack__(max_version=(1, 3), copy=np.False_))
    assert not shared["flags"] & FLAG_IS_COPIED and shared["data"] + shared["byte_offset"] == t.data_ptr
    assert np.from_dlpack(t, copy=np.True_).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("view", ["base", "T", "flip"])
def test_copy_true_copies_and_flags(dlp, view):
    t, ref = _iota((3, 4))
    v = {"base": t, "T": t.transpose(0, 1), "flip": t[::-1]}[view]
    cap = v.__dlpack__(max_version=(1, 3), copy=True)
    info = dlp.read(cap)
    assert _copied(info)
    assert not _ro(info)
    assert info["data"] != t.data_ptr
    assert info["shape"] == v.shape
    # Read the copy back through our own consumer and compare values.
    w = devtensor.from_dlpack(cap)
    expect = {"base": ref, "T": ref.T, "flip": ref[::-1]}[view]
    np.testing.assert_array_equal(np.from_dlpack(w), expect)


def test_copy_true_with_dl_device_cpu(dlp):
    t = devtensor.zeros(3)
    info = dlp.read(t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=True))
    assert _copied(info)
    assert info["data"] != t.data_ptr


def test_copy_true_legacy_still_copies(dlp):
    # No flags in a legacy capsule, but the data must still be a copy.
    t = devtensor.zeros(3)
    info = dlp.read(t.__dlpack__(copy=True))
    assert info["kind"] == "dltensor"
    assert info["data"] != t.data_ptr


def test_copy_false_never_copies(dlp):
    t = devtensor.zeros((3, 4)).transpose(0, 1)
    info = dlp.read(t.__dlpack__(max_version=(1, 3), copy=False))
    assert info["data"] == t.data_ptr
    assert not _copied(info)


# --------------------------------------------------------------------------------------
# Read-only (§a 4, 5)
# --------------------------------------------------------------------------------------


def test_read_only_legacy_export_is_buffer_error():
    t, _ = readonly_tensor()
    with pytest.raises(BufferError):
        t.__dlpack__()
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(0, 8))


def test_read_only_versioned_export_has_flag(dlp):
    t, a = readonly_tensor()
    info = dlp.read(t.__dlpack__(max_version=(1, 3)))
    assert _ro(info)
    assert not _copied(info)
    assert info["data"] == a.ctypes.data


def test_read_only_views_stay_read_only(dlp):
    t, _ = readonly_tensor()
    for v in (t[1:], t.transpose(0, 1), t.reshape(-1), t[None]):
        assert v.read_only
        assert _ro(dlp.read(v.__dlpack__(max_version=(1, 3))))


def test_read_only_copy_is_writable(dlp):
    t, _ = readonly_tensor()
    c = t.clone()
    assert not c.read_only
    assert not t.contiguous().read_only or t.contiguous().data_ptr == t.data_ptr
    info = dlp.read(t.__dlpack__(max_version=(1, 3), copy=True))
    assert _copied(info) and not _ro(info)
    # A legacy export of a fresh copy is fine.
    assert dlp.name(t.__dlpack__(copy=True)) == "dltensor"


# --------------------------------------------------------------------------------------
# __dlpack_device__ (§a 16, 25)
# --------------------------------------------------------------------------------------


def test_dlpack_device(dlp):
    t = devtensor.zeros(3)
    dev = t.__dlpack_device__()
    assert dev == (1, 0)
    assert isinstance(dev, tuple) and len(dev) == 2
    assert int(dev[0]) == 1 and int(dev[1]) == 0
    for kw in ({}, {"max_version": (1, 3)}):
        assert dlp.read(t.__dlpack__(**kw))["device"] == tuple(int(x) for x in dev)


# --------------------------------------------------------------------------------------
# Ownership: deleters, refcounts, unconsumed capsules (§a 12-15)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [False, True])
def test_unconsumed_capsule_is_freed(live, rc, versioned):
    t = devtensor.zeros(1000)
    n0, r0 = live(), rc(t)
    cap = t.__dlpack__(max_version=(1, 3) if versioned else None)
    assert live() == n0 + 1
    assert rc(t) >= r0  # the capsule may hold the owner or only the buffer
    del cap
    assert live() == n0
    assert rc(t) == r0


@pytest.mark.parametrize("versioned", [False, True])
def test_many_unconsumed_capsules(live, versioned):
    t = devtensor.zeros(16)
    n0 = live()
    for _ in range(10000):
        t.__dlpack__(max_version=(1, 3) if versioned else None)
    assert live() == n0


@pytest.mark.parametrize("versioned", [False, True])
def test_capsule_keeps_data_alive(dlp, versioned):
    t = devtensor.full(64, 7.0)
    cap = t.__dlpack__(max_version=(1, 3) if versioned else None)
    ptr = t.data_ptr
    del t
    gc.collect()
    devtensor.full(64, 1.0)  # reuse freed memory if we were wrong
    info = dlp.read(cap)
    assert info["data"] == ptr
    assert (ctypes.c_float * 64).from_address(ptr)[63] == 7.0
    w = devtensor.from_dlpack(cap)
    assert np.from_dlpack(w)[0] == 7.0


@pytest.mark.parametrize("versioned", [False, True])
def test_consumed_by_hand_deleter_runs_once(dlp, live, versioned):
    t = devtensor.zeros(8)
    n0 = live()
    cap = t.__dlpack__(max_version=(1, 3) if versioned else None)
    assert live() == n0 + 1
    dlp.consume_by_hand(cap)  # renames to used_* and calls the deleter
    assert live() == n0
    assert dlp.name(cap).startswith("used_")
    del cap  # the destructor must leave a used_* capsule alone (no double free)
    assert live() == n0


def test_deleter_on_another_thread(dlp, live):
    # §a 12: a deleter can run on any thread, without the GIL held by the caller.
    t = devtensor.zeros(8)
    n0 = live()
    cap = t.__dlpack__(max_version=(1, 3))
    ptr = dlp.pointer(cap, "dltensor_versioned")
    m = dlp.DLManagedTensorVersioned.from_address(ptr)
    name = ctypes.create_string_buffer(b"used_dltensor_versioned")
    ctypes.pythonapi.PyCapsule_SetName(cap, ctypes.cast(name, ctypes.c_char_p))
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(m.deleter)
    # A ctypes foreign call releases the GIL while the deleter runs.
    th = threading.Thread(target=deleter, args=(ptr,))
    th.start()
    th.join()
    assert live() == n0
    del cap
    gc.collect()
    del name


def test_capsule_after_tensor_dropped_then_consumed(live):
    t = devtensor.ones(5)
    n0 = live()
    cap = t.__dlpack__()
    del t
    gc.collect()
    w = devtensor.from_dlpack(cap)
    assert np.from_dlpack(w).sum() == 5
    del w
    assert live() == n0


def test_refcount_after_exports(rc):
    t = devtensor.zeros(4)
    r0 = rc(t)
    for kw in ({}, {"max_version": (1, 3)}, {"max_version": (1, 3), "copy": True}):
        cap = t.__dlpack__(**kw)
        del cap
        assert rc(t) == r0


# --------------------------------------------------------------------------------------
# __dlpack_c_exchange_api__ (§a 30-36)
# --------------------------------------------------------------------------------------


def test_exchange_api_capsule(dlp):
    cap = devtensor.Tensor.__dlpack_c_exchange_api__
    assert dlp.is_capsule(cap)
    assert dlp.name(cap) == "dlpack_exchange_api"
    assert dlp.is_valid(cap, "dlpack_exchange_api")
    # Same table through an instance and on every access.
    assert dlp.pointer(devtensor.zeros(1).__dlpack_c_exchange_api__, "dlpack_exchange_api") == dlp.pointer(
        cap, "dlpack_exchange_api"
    )
    assert type(devtensor.zeros(1)).__dlpack_c_exchange_api__ is not None


def test_exchange_api_header(dlp):
    api = dlp.exchange_api(devtensor.Tensor)
    ptr = dlp.pointer(devtensor.Tensor.__dlpack_c_exchange_api__, "dlpack_exchange_api")
    major, minor = (ctypes.c_uint32 * 2).from_address(ptr)
    assert (major, minor) == (1, 3)
    assert (api.version.major, api.version.minor) == (1, 3)
    assert not api.prev_api
    assert api.managed_tensor_allocator
    assert api.managed_tensor_from_py_object_no_sync
    assert api.managed_tensor_to_py_object_no_sync
    assert api.current_work_stream


def test_exchange_from_py_object(dlp, live):
    api = dlp.exchange_api(devtensor.Tensor)
    from_py = dlp.FROM_PY(api.managed_tensor_from_py_object_no_sync)
    t = devtensor.zeros((3, 4)).transpose(0, 1)
    n0 = live()
    out = ctypes.c_void_p()
    assert from_py(id(t), ctypes.byref(out)) == 0
    m = dlp.DLManagedTensorVersioned.from_address(out.value)
    assert m.version.major == 1
    assert m.dl_tensor.data + m.dl_tensor.byte_offset == t.data_ptr
    assert tuple(m.dl_tensor.shape[i] for i in range(2)) == (4, 3)
    assert tuple(m.dl_tensor.strides[i] for i in range(2)) == (1, 4)
    assert live() == n0 + 1
    dlp.DELETER(m.deleter)(out.value)
    assert live() == n0


def test_exchange_from_py_object_wrong_type(dlp):
    api = dlp.exchange_api(devtensor.Tensor)
    from_py = dlp.FROM_PY(api.managed_tensor_from_py_object_no_sync)
    out = ctypes.c_void_p()
    x = [1, 2, 3]
    # It must fail with a Python exception set (PYFUNCTYPE raises it), not crash.
    with pytest.raises((TypeError, BufferError, ValueError)):
        from_py(id(x), ctypes.byref(out))
    assert not out.value


def test_exchange_dltensor_from_py_object(dlp):
    api = dlp.exchange_api(devtensor.Tensor)
    if not api.dltensor_from_py_object_no_sync:
        pytest.skip("dltensor_from_py_object_no_sync is NULL (optional)")
    f = dlp.DLTENSOR_FROM_PY(api.dltensor_from_py_object_no_sync)
    t = devtensor.zeros((2, 5), dtype="int8")[:, 1:]
    out = dlp.DLTensor()
    assert f(id(t), ctypes.byref(out)) == 0
    assert out.data + out.byte_offset == t.data_ptr
    assert out.ndim == 2
    assert (out.dtype.code, out.dtype.bits, out.dtype.lanes) == (0, 8, 1)
    assert (out.shape[0], out.shape[1]) == (2, 4)
    assert (out.strides[0], out.strides[1]) == (5, 1)


def test_exchange_current_work_stream_cpu(dlp):
    api = dlp.exchange_api(devtensor.Tensor)
    f = dlp.WORK_STREAM(api.current_work_stream)
    out = ctypes.c_void_p(12345)
    assert f(1, 0, ctypes.byref(out)) == 0
    assert not out.value  # NULL for CPU


def test_exchange_allocator_and_to_py_object(dlp, live):
    api = dlp.exchange_api(devtensor.Tensor)
    alloc = dlp.ALLOCATOR(api.managed_tensor_allocator)
    to_py = dlp.TO_PY(api.managed_tensor_to_py_object_no_sync)
    errors = []
    set_error = dlp.SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    shape = (ctypes.c_int64 * 2)(3, 5)
    proto = dlp.DLTensor()
    proto.ndim = 2
    proto.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 0, 32, 1
    proto.device.device_type, proto.device.device_id = 1, 0
    out = ctypes.c_void_p()
    assert alloc(ctypes.byref(proto), ctypes.byref(out), None, set_error) == 0, errors
    assert out.value
    m = dlp.DLManagedTensorVersioned.from_address(out.value)
    assert (m.dl_tensor.shape[0], m.dl_tensor.shape[1]) == (3, 5)
    assert (m.dl_tensor.strides[0], m.dl_tensor.strides[1]) == (5, 1)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits) == (0, 32)
    assert m.dl_tensor.data
    # Hand it to to_py_object, which steals it and returns a new devtensor.Tensor.
    obj_ptr = ctypes.c_void_p()
    assert to_py(out.value, ctypes.byref(obj_ptr)) == 0
    obj = ctypes.cast(obj_ptr, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(obj))  # we received a new reference
    assert isinstance(obj, devtensor.Tensor)
    assert obj.shape == (3, 5) and obj.dtype == "int32"
    np.from_dlpack(obj)[...] = 7
    assert np.from_dlpack(obj).sum() == 105
    del obj
    gc.collect()
    assert not errors


@pytest.mark.parametrize(
    "code_bits_lanes, device",
    [((0, 32, 1), (7, 0)), ((99, 8, 1), (1, 0)), ((2, 32, 4), (1, 0))],
    ids=["vulkan", "bad-code", "lanes4"],
)
def test_exchange_allocator_errors_are_reported(dlp, code_bits_lanes, device):
    api = dlp.exchange_api(devtensor.Tensor)
    alloc = dlp.ALLOCATOR(api.managed_tensor_allocator)
    errors = []
    set_error = dlp.SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    shape = (ctypes.c_int64 * 1)(4)
    proto = dlp.DLTensor()
    proto.ndim = 1
    proto.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = code_bits_lanes
    proto.device.device_type, proto.device.device_id = device
    out = ctypes.c_void_p()
    assert alloc(ctypes.byref(proto), ctypes.byref(out), None, set_error) == -1
    assert len(errors) == 1, errors  # SetError exactly once
    assert errors[0][0] and errors[0][1]


def _iota(shape, dtype="float32"):
    t = devtensor.empty(shape, dtype=dtype)
    ref = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    np.from_dlpack(t)[...] = ref
    return t, ref


def test_capsule_type_is_pycapsule():
    cap = devtensor.zeros(1).__dlpack__()
    assert type(cap).__name__ == "PyCapsule"
    assert sys.getrefcount(cap) >= 2


# --------------------------------------------------------------------------------------
# Interpreter shutdown and threads (§a 12; numpy#22507, pytorch#88082)
# --------------------------------------------------------------------------------------

_SHUTDOWN_SCRIPT = r"""
import gc, sys, threading
import numpy as np
import devtensor

t = devtensor.full((64,), 3.0)
KEEP = [
    np.from_dlpack(t),                                  # numpy holds our export
    t.__dlpack__(),                                     # unconsumed legacy capsule
    t.__dlpack__(max_version=(1, 3)),                   # unconsumed versioned capsule
    devtensor.from_dlpack(np.arange(8.0)),              # we hold numpy's export
    t[::2],
]
try:
    import torch
    KEEP += [torch.from_dlpack(t), devtensor.from_dlpack(torch.ones(4))]
except ImportError:
    pass
# A reference cycle so that some of these die in the final collection.
class Cycle:
    pass
c = Cycle(); c.self = c; c.keep = list(KEEP)
# A daemon thread still using the objects while the interpreter exits.
def spin():
    while True:
        np.from_dlpack(t)
threading.Thread(target=spin, daemon=True).start()
print("ok", flush=True)
"""


@pytest.mark.no_leak_check
def test_exports_alive_at_interpreter_exit():
    import subprocess

    r = subprocess.run([sys.executable, "-c", _SHUTDOWN_SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout
    assert "Fatal Python error" not in r.stderr
    assert "Exception ignored" not in r.stderr, r.stderr


def test_threads_export_and_import(live):
    n0 = live()
    t = devtensor.zeros(1024)
    errors = []

    def work():
        try:
            for _ in range(300):
                a = np.from_dlpack(t)
                u = devtensor.from_dlpack(a)
                cap = u.__dlpack__(max_version=(1, 3))
                w = devtensor.from_dlpack(cap)
                del a, u, cap, w
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert live() == n0
