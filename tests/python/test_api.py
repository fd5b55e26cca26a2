"""The Python API (issue 4 item 2): creation, dtypes, devices, properties, views, copies."""

import ctypes
import gc
import inspect
import os
import subprocess
import sys
import time

import pytest

import devtensor
from conftest import DLPACK_DTYPES, FLOAT8_NAMES, NUMPY_DTYPES

np = pytest.importorskip("numpy")

ALL_DTYPES = list(DLPACK_DTYPES)
ITEMSIZE = {name: bits // 8 for name, (_code, bits) in DLPACK_DTYPES.items()}

# One element of value 1 in each dtype, as raw little-endian bytes.
ONE_BYTES = {n: np.ones(1, dtype=n).tobytes() for n in NUMPY_DTYPES}
ONE_BYTES.update(
    {
        "bfloat16": (0x3F80).to_bytes(2, "little"),
        "complex32": np.array([1, 0], dtype=np.float16).tobytes(),
        # Checked against ml_dtypes 0.6.
        "float8_e3m4": bytes([0x30]),
        "float8_e4m3": bytes([0x38]),
        "float8_e4m3b11fnuz": bytes([0x58]),
        "float8_e4m3fn": bytes([0x38]),
        "float8_e4m3fnuz": bytes([0x40]),
        "float8_e5m2": bytes([0x3C]),
        "float8_e5m2fnuz": bytes([0x40]),
        "float8_e8m0fnu": bytes([0x7F]),
    }
)
GPU_DEVICES = ["cuda", "cuda:0", "cuda_host", "cuda_managed:0", "rocm:0", "rocm_host", (2, 0), (3, 0), (13, 0), (10, 0)]


def raw(t):
    """The bytes of a C-contiguous CPU tensor."""
    assert t.is_contiguous()
    if t.nbytes == 0:
        return b""
    return ctypes.string_at(t.data_ptr, t.nbytes)


def arr(t):
    """A NumPy view of a CPU tensor (zero-copy)."""
    return np.from_dlpack(t)


def iota(shape, dtype="float32"):
    """A devtensor tensor holding 0, 1, 2, ... in C order, and a NumPy copy of it."""
    t = devtensor.empty(shape, dtype=dtype)
    ref = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=dtype).reshape(shape)
    arr(t)[...] = ref
    return t, ref


def _cuda_present():
    """A CUDA device torch or devtensor itself can use (the emulated driver counts)."""
    try:
        devtensor.empty((1,), device="cuda:0")
        return True
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# --------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------


def test_module_exports():
    for name in ["Tensor", "empty", "zeros", "ones", "full", "from_dlpack", "__version__"]:
        assert hasattr(devtensor, name), name
        assert name in devtensor.__all__
    assert isinstance(devtensor.__version__, str) and devtensor.__version__
    assert devtensor.Tensor.__module__ in ("devtensor._devtensor", "devtensor")
    assert tuple(devtensor.DLPACK_VERSION) >= (1, 3)


def test_tensor_has_no_public_constructor_or_subclassing():
    with pytest.raises(TypeError):
        devtensor.Tensor()


# --------------------------------------------------------------------------------------
# Creation and dtypes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_empty_every_dtype(dtype):
    t = devtensor.empty((2, 3), dtype=dtype)
    assert t.dtype == dtype
    assert t.shape == (2, 3)
    assert t.strides == (3, 1)
    assert t.ndim == 2
    assert t.itemsize == ITEMSIZE[dtype]
    assert t.nbytes == 6 * ITEMSIZE[dtype]
    assert t.device == "cpu"
    assert t.read_only is False
    assert t.is_contiguous()
    assert t.data_ptr != 0


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_zeros_every_dtype(dtype):
    # Zero bytes, also for float8_e8m0fnu (no zero: 2^-127), as numpy.zeros and torch.zeros.
    t = devtensor.zeros((3, 5), dtype=dtype)
    assert t.dtype == dtype
    assert raw(t) == bytes(15 * ITEMSIZE[dtype])
    if dtype == "float8_e8m0fnu":
        torch = pytest.importorskip("torch")
        want = bytes(torch.zeros(15, dtype=torch.float8_e8m0fnu).view(torch.uint8).tolist())
        assert raw(t) == want


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != "float8_e8m0fnu"])
def test_zeros_holds_what_full_with_zero_holds(dtype):
    # zeros() converts no Python object; it must still hold what full(0) rounds 0 to
    # (not float8_e8m0fnu, whose full(0) is ml_dtypes' NaN, its zeros torch's 2^-127).
    assert raw(devtensor.zeros(4, dtype=dtype)) == raw(devtensor.full(4, 0, dtype=dtype))


@pytest.mark.parametrize("dtype", ["float32", "uint8", "float8_e8m0fnu"])
def test_large_zeros_read_as_zeros_where_a_freed_block_held_data(dtype):
    # Blocks of 32 MiB and more are fresh mappings whose zero pages zeros()
    # leaves unwritten; one freed after holding ones must not show through.
    n = (48 << 20) // ITEMSIZE[dtype]
    for _ in range(3):
        t = devtensor.full(n, 1, dtype=dtype)
        del t
        z = devtensor.zeros(n, dtype=dtype)
        assert raw(z) == bytes(n * ITEMSIZE[dtype])
        z.fill_(1)  # and writable, as any tensor
        assert raw(z[-1:]) == ONE_BYTES[dtype]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_ones_every_dtype(dtype):
    t = devtensor.ones(7, dtype=dtype)
    assert t.shape == (7,)
    assert raw(t) == ONE_BYTES[dtype] * 7


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_full_numpy_dtypes(dtype):
    value = True if dtype == "bool" else 5
    t = devtensor.full((2, 2), value, dtype=dtype)
    np.testing.assert_array_equal(arr(t), np.full((2, 2), value, dtype=dtype))


@pytest.mark.parametrize(
    "value, dtype",
    [(True, "bool"), (3, "int64"), (1.5, "float32"), (1 + 2j, "complex64"), (-7, "int64"), (0.0, "float32")],
)
def test_full_infers_dtype_like_torch(value, dtype):
    t = devtensor.full(4, value)
    assert t.dtype == dtype
    np.testing.assert_array_equal(arr(t), np.full(4, value, dtype=dtype))


def test_full_values():
    np.testing.assert_array_equal(arr(devtensor.full((2, 3), -2.25, dtype="float64")), np.full((2, 3), -2.25))
    np.testing.assert_array_equal(arr(devtensor.full(3, 2 - 1j, dtype="complex128")), np.full(3, 2 - 1j))
    np.testing.assert_array_equal(arr(devtensor.full(3, 255, dtype="uint8")), np.full(3, 255, dtype=np.uint8))
    np.testing.assert_array_equal(
        arr(devtensor.full(2, 2**63 - 1, dtype="int64")), np.full(2, 2**63 - 1, dtype=np.int64)
    )
    np.testing.assert_array_equal(
        arr(devtensor.full(2, 2**64 - 1, dtype="uint64")), np.full(2, 2**64 - 1, dtype=np.uint64)
    )
    assert raw(devtensor.full(2, 2.5, dtype="bfloat16")) == (0x4020).to_bytes(2, "little") * 2


def test_full_bad_values():
    with pytest.raises(OverflowError):
        devtensor.full(2, 256, dtype="uint8")
    with pytest.raises(OverflowError):
        devtensor.full(2, -1, dtype="uint32")
    with pytest.raises(ValueError):
        devtensor.full(2, 1.5, dtype="int32")
    with pytest.raises(TypeError):
        devtensor.full(2, "abc")
    with pytest.raises(TypeError):
        devtensor.full(2, None)


@pytest.mark.parametrize(
    "np_dtype, name",
    [
        (np.bool_, "bool"),
        (np.int8, "int8"),
        (np.int16, "int16"),
        (np.int32, "int32"),
        (np.int64, "int64"),
        (np.uint8, "uint8"),
        (np.uint16, "uint16"),
        (np.uint32, "uint32"),
        (np.uint64, "uint64"),
        (np.float16, "float16"),
        (np.float32, "float32"),
        (np.float64, "float64"),
        (np.complex64, "complex64"),
        (np.complex128, "complex128"),
    ],
)
def test_numpy_dtypes_accepted(np_dtype, name):
    assert devtensor.empty(2, dtype=np_dtype).dtype == name  # scalar type
    assert devtensor.zeros(2, dtype=np.dtype(np_dtype)).dtype == name  # dtype object
    assert devtensor.ones(2, np.dtype(np_dtype)).dtype == name  # positional


def test_ml_dtypes_numpy_dtypes_accepted():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert devtensor.empty(2, dtype=np.dtype(ml_dtypes.bfloat16)).dtype == "bfloat16"
    for name in FLOAT8_NAMES:
        if hasattr(ml_dtypes, name):
            assert devtensor.empty(2, dtype=np.dtype(getattr(ml_dtypes, name))).dtype == name


def test_torch_dtypes_accepted():
    torch = pytest.importorskip("torch")
    assert devtensor.empty(2, dtype=torch.bfloat16).dtype == "bfloat16"
    assert devtensor.empty(2, dtype=torch.float8_e4m3fn).dtype == "float8_e4m3fn"
    assert devtensor.empty(2, dtype=torch.bool).dtype == "bool"
    assert devtensor.empty(2, dtype=torch.complex64).dtype == "complex64"


def test_dtype_objects_parse_the_same_every_time():
    # Parsed dtype objects are remembered by identity: repeated and interleaved
    # uses must keep giving each object its own dtype.
    torch = pytest.importorskip("torch")
    objects = [
        (torch.float16, "float16"),
        (np.dtype("int8"), "int8"),
        (np.float64, "float64"),
        (torch.int64, "int64"),
        (np.dtype("complex64"), "complex64"),
    ]
    for _ in range(3):
        for obj, name in objects:
            assert devtensor.empty(1, dtype=obj).dtype == name
            assert devtensor.full(1, 1, dtype=obj).dtype == name
    with pytest.raises(TypeError):
        devtensor.empty(1, dtype=torch.float32.__class__)  # the type, not a dtype


def test_default_dtype_and_device():
    t = devtensor.empty(3)
    assert (t.dtype, t.device) == ("float32", "cpu")
    assert devtensor.zeros(3).dtype == "float32"
    assert devtensor.ones(3).dtype == "float32"


@pytest.mark.parametrize("make, extra", [(devtensor.empty, ()), (devtensor.zeros, ()), (devtensor.ones, ()), (devtensor.full, (2,))])
def test_constructors_take_arguments_by_position_and_keyword(make, extra):
    name = make.__name__
    params = ["shape", *(["fill_value"] if extra else []), "dtype", "device"]
    assert list(inspect.signature(make).parameters) == params
    values = dict(zip(params, [(2, 3), *extra, "int16", "cpu"]))
    by_position = make(*values.values())
    # Keywords in any order, and built at run time (not interned at a call site).
    by_keyword = make(**dict(reversed(values.items())))
    by_runtime_keyword = make(**{"".join(k): v for k, v in values.items()})
    for t in (by_position, by_keyword, by_runtime_keyword):
        assert (t.shape, t.dtype, t.device) == ((2, 3), "int16", "cpu")
    assert make((2,), *extra, dtype=None, device=None).dtype == ("int64" if extra else "float32")
    with pytest.raises(TypeError, match=rf"{name}\(\) got multiple values for argument 'dtype'"):
        make((2,), *extra, "int16", dtype="int16")
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'dtyp'"):
        make((2,), *extra, dtyp="int16")
    with pytest.raises(TypeError, match=rf"{name}\(\) takes from {1 + len(extra)} to {len(params)} positional arguments but {len(params) + 1} were given"):
        make((2,), *extra, "int16", "cpu", None)
    with pytest.raises(TypeError, match=rf"{name}\(\) missing 1 required positional argument: 'shape'"):
        make(dtype="int16")
    if extra:
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'fill_value'"):
            make((2,), dtype="int16")
    # A bad value raises what its conversion raises.
    with pytest.raises(TypeError, match="shape must be an int or a sequence of ints"):
        make("abc", *extra)
    with pytest.raises(ValueError):
        make((-1,), *extra)


@pytest.mark.parametrize("dtype", ["float33", "int", "floaty", "", "torch.float33", 123, object()])
def test_bad_dtype_is_type_error(dtype):
    if dtype == "int":  # an accepted alias (int32), like torch.int
        assert devtensor.empty(1, dtype=dtype).dtype == "int32"
        return
    with pytest.raises(TypeError):
        devtensor.empty(2, dtype=dtype)


@pytest.mark.parametrize("shape, expect", [(5, (5,)), ((), ()), ([], ()), ((2, 3), (2, 3)), ([4, 0, 2], (4, 0, 2))])
def test_shape_forms(shape, expect):
    t = devtensor.empty(shape)
    assert t.shape == expect
    assert t.ndim == len(expect)


def test_shape_numpy_ints():
    t = devtensor.zeros((np.int64(2), np.int32(3)))
    assert t.shape == (2, 3)
    assert devtensor.zeros(np.int64(4)).shape == (4,)  # any __index__ object, like numpy/torch


def test_view_ops_take_numpy_ints():
    t = devtensor.zeros((3, 4))
    assert t.permute(np.int64(1), 0).shape == (4, 3)
    assert t.transpose(np.int64(0), np.int64(1)).shape == (4, 3)
    assert t.reshape(np.int64(12)).shape == (12,)
    assert t.reshape(np.int64(2), 6).shape == (2, 6)
    assert t[np.int64(1) : np.int64(3)].shape == (2, 4)


@pytest.mark.parametrize("shape", [-1, (2, -3), [-1]])
def test_negative_size_is_value_error(shape):
    with pytest.raises(ValueError):
        devtensor.empty(shape)
    with pytest.raises(ValueError):
        devtensor.zeros(shape)


@pytest.mark.parametrize("shape", ["abc", 1.5, (2, 1.5), (2, None)])
def test_bad_shape_type(shape):
    with pytest.raises(TypeError):
        devtensor.empty(shape)


def test_huge_shape_errors_cleanly():
    with pytest.raises((ValueError, MemoryError, OverflowError)):
        devtensor.empty((2**40, 2**40))
    with pytest.raises((ValueError, MemoryError, OverflowError)):
        devtensor.empty(2**62, dtype="float64")
    # A dimension past 64 bits is NumPy's ValueError, a NumPy uint64 too (it
    # fell through to the sequence path: TypeError "must be a sequence").
    for dim in (2**64, np.uint64(2**64 - 1), [2**64]):
        with pytest.raises(ValueError, match="too large"):
            devtensor.zeros(dim)
    # One below -2**63 is negative, not "too large".
    for dim in (-(2**64), [3, -(2**70)]):
        with pytest.raises(ValueError, match="negative dimension"):
            devtensor.zeros(dim)


# --------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", (1, 0)])
def test_cpu_device_forms(device):
    t = devtensor.zeros(3, device=device)
    assert t.device == "cpu"
    assert t.__dlpack_device__() == (1, 0)


def test_torch_device_object_accepted():
    torch = pytest.importorskip("torch")
    assert devtensor.empty(2, device=torch.device("cpu")).device == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cpu:1", "cuda:x", "cuda:-1", "", "CPU0", "tpu:0", (7, 0), (1, -1), (99, 0)])
def test_bad_device_is_value_error(device):
    with pytest.raises(ValueError):
        devtensor.empty(2, device=device)


@pytest.mark.skipif(_cuda_present(), reason="a CUDA device is present: see test_gpu.py")
@pytest.mark.parametrize("device", GPU_DEVICES)
def test_gpu_device_without_backend_is_runtime_error(device):
    with pytest.raises(RuntimeError):
        devtensor.empty(2, device=device)
    with pytest.raises(RuntimeError):
        devtensor.zeros(2, device=device)


@pytest.mark.skipif(_cuda_present(), reason="a CUDA device is present: see test_gpu.py")
def test_to_gpu_without_backend_is_runtime_error():
    t = devtensor.zeros(3)
    with pytest.raises(RuntimeError):
        t.to("cuda")


def test_to_cpu_is_identity():
    t = devtensor.ones(3)
    assert t.to("cpu") is t or t.to("cpu").data_ptr == t.data_ptr
    assert t.to((1, 0)).data_ptr == t.data_ptr
    with pytest.raises(ValueError):
        t.to("nowhere")


# --------------------------------------------------------------------------------------
# Properties, repr, len
# --------------------------------------------------------------------------------------


def test_properties_0d():
    t = devtensor.full((), 3.5)
    assert t.shape == ()
    assert t.strides == ()
    assert t.ndim == 0
    assert t.nbytes == 4
    assert t.is_contiguous()
    assert arr(t)[()] == 3.5
    with pytest.raises(TypeError):
        len(t)


def test_properties_empty():
    t = devtensor.empty((3, 0, 2), dtype="int16")
    assert t.shape == (3, 0, 2)
    assert t.nbytes == 0
    assert t.itemsize == 2
    assert t.is_contiguous()
    assert len(t) == 3
    assert devtensor.zeros(0).nbytes == 0


def test_properties_types():
    t = devtensor.empty((2, 3))
    assert type(t.shape) is tuple and all(type(x) is int for x in t.shape)
    assert type(t.strides) is tuple and all(type(x) is int for x in t.strides)
    assert type(t.data_ptr) is int
    assert type(t.ndim) is int and type(t.nbytes) is int and type(t.itemsize) is int
    assert type(t.dtype) is str and type(t.device) is str
    assert type(t.read_only) is bool


def test_properties_are_read_only():
    t = devtensor.empty(2)
    for name, value in [("shape", (3,)), ("dtype", "int8"), ("device", "cpu"), ("data_ptr", 0), ("read_only", True)]:
        with pytest.raises(AttributeError):
            setattr(t, name, value)


def test_repr():
    # The values, as torch prints them (test_values.py compares with torch itself).
    assert repr(devtensor.zeros((2, 3), dtype="int16")) == "tensor([[0, 0, 0],\n        [0, 0, 0]], dtype=int16)"
    assert repr(devtensor.zeros(4)) == "tensor([0., 0., 0., 0.])"
    assert repr(devtensor.zeros(())) == "tensor(0.)"
    assert repr(devtensor.zeros(1, dtype="bfloat16")) == "tensor([0.], dtype=bfloat16)"
    assert repr(devtensor.zeros((0, 2))) == "tensor([], size=(0, 2))"


def test_data_ptr_alignment():
    # Not required by DLPack (§a.9), but JAX copies unaligned CPU buffers: we allocate aligned.
    for dtype in ["uint8", "float32", "complex128"]:
        assert devtensor.empty(17, dtype=dtype).data_ptr % 64 == 0


# --------------------------------------------------------------------------------------
# Indexing: views like NumPy's
# --------------------------------------------------------------------------------------

INDEX_KEYS = [
    0,
    -1,
    2,
    (1, 2),
    (-1, -2, 3),
    slice(None),
    slice(1, 3),
    slice(None, None, 2),
    slice(None, None, -1),
    slice(3, 0, -2),
    slice(-2, None),
    slice(None, -1, 3),
    slice(10, 20),  # empty, clipped
    slice(2, 2),  # empty
    (slice(None), 1),
    (slice(None), slice(None, None, -1), slice(1, None, 2)),
    (Ellipsis, 0),
    (Ellipsis, slice(None, None, -2)),
    (0, Ellipsis),
    (Ellipsis,),
    Ellipsis,
    None,
    (None, 0),
    (slice(None), None, 1),
    (Ellipsis, None),
    (1, None, Ellipsis, None, -1),
    (slice(None, None, -1), slice(None, None, -1), slice(None, None, -1)),
    (0, 0, 0),
    (),
]


def _key_id(k):
    return repr(k).replace(" ", "")


@pytest.mark.parametrize("key", INDEX_KEYS, ids=_key_id)
def test_getitem_matches_numpy(key):
    t, ref = iota((4, 5, 6))
    v = t[key]
    # A trailing `...` makes NumPy return a 0-d view rather than a scalar for all-int keys.
    k = key if isinstance(key, tuple) else (key,)
    expect = ref[k if Ellipsis in k else k + (Ellipsis,)]
    assert isinstance(v, devtensor.Tensor)
    assert v.shape == expect.shape
    # Strides in elements; a dimension of size 0 or 1 may have any stride.
    got = [s for s, n in zip(v.strides, v.shape) if n > 1]
    want = [s // ref.itemsize for s, n in zip(expect.strides, expect.shape) if n > 1]
    assert got == want
    if expect.size:
        # A view into the same buffer, at the same offset NumPy would use.
        assert v.data_ptr - t.data_ptr == expect.ctypes.data - ref.ctypes.data
        np.testing.assert_array_equal(arr(v), expect)


def test_getitem_is_a_view_writes_visible():
    t, ref = iota((3, 4))
    v = t[1:, ::-2]
    arr(v)[...] = -1
    ref[1:, ::-2] = -1
    np.testing.assert_array_equal(arr(t), ref)
    del v
    gc.collect()


def test_getitem_keeps_base_alive():
    t, ref = iota((100,))
    v = t[10:20]
    del t
    gc.collect()
    np.testing.assert_array_equal(arr(v), ref[10:20])


def test_getitem_numpy_int_index():
    t, ref = iota((4, 3))
    np.testing.assert_array_equal(arr(t[np.int64(2)]), ref[2])


@pytest.mark.parametrize("key", [3, -4, (0, 3), (0, -4), (1, 2, 3)])
def test_getitem_out_of_range(key):
    t = devtensor.zeros((3, 3))
    with pytest.raises(IndexError):
        t[key]


@pytest.mark.parametrize(
    "key, axis, size",
    [((0, 4), 1, 4), ((0, 0, 5), 2, 5), ((1, slice(None), -6), 2, 5), ((None, 0, None, 4), 1, 4), ((..., 5), 2, 5)],
)
def test_getitem_out_of_range_names_the_tensors_axis(key, axis, size):
    # The axis of the tensor indexed, as NumPy's "out of bounds for axis 1"
    # says, not of the view left after earlier integer indices.
    t = devtensor.zeros((3, 4, 5))
    with pytest.raises(IndexError, match=rf"dimension {axis} of size {size}\b"):
        t[key]


@pytest.mark.parametrize("key", [1.5, "a", (Ellipsis, Ellipsis), [0, 1], True])
def test_getitem_bad_keys(key):
    t = devtensor.zeros((3, 3))
    with pytest.raises(IndexError):
        t[key]


def test_getitem_zero_step():
    with pytest.raises(ValueError):
        devtensor.zeros(3)[::0]


def test_getitem_0d():
    t = devtensor.full((), 2.0)
    assert t[()].shape == ()
    assert t[...].shape == ()
    assert t[None].shape == (1,)
    with pytest.raises(IndexError):
        t[0]


@pytest.mark.parametrize(
    "key",
    [
        slice(0, 2**70),
        slice(-(2**70), None),
        slice(None, -(2**70), -1),
        slice(2**70, None, -1),
        slice(None, None, 2**70),
        slice(None, None, -(2**70)),
        slice(np.int64(1), np.uint64(2**63 + 5)),
        (slice(None, None, 2**62), slice(1, None)),
        (slice(None, None, -(2**70)), Ellipsis),
    ],
)
def test_getitem_clamps_bounds_past_int64_as_python_does(key):
    # Lists, NumPy and torch clamp slice bounds (and steps) of any size; they
    # raised OverflowError here (and a huge step over rows, whose stride times
    # the step overflows, "size overflow while computing slice stride").
    for t, ref in (iota((5,)), iota((3, 4))):
        if isinstance(key, tuple) and ref.ndim < 2:
            continue
        np.testing.assert_array_equal(arr(t[key]), ref[key])


def test_getitem_slice_bounds_take_index_objects_as_lists_do():
    class Big:
        def __index__(self):
            return 2**70

    class Broken:
        def __index__(self):
            raise ValueError("no index today")

    t, ref = iota((5,))
    np.testing.assert_array_equal(arr(t[: Big()]), ref[: Big()])
    with pytest.raises(ValueError, match="no index today"):
        t[: Broken()]
    with pytest.raises(TypeError, match="slice indices"):
        t[:1.5]


def test_iteration_and_python_scalars_follow_numpy():
    t, ref = iota((3, 2))
    rows = list(t)
    assert len(rows) == 3 and all(r.shape == (2,) and r.data_ptr == t.data_ptr + 8 * i for i, r in enumerate(rows))
    assert [r.tolist() for r in t] == ref.tolist()
    zero_d = devtensor.full((), 5.0)
    with pytest.raises(TypeError, match="0-d"):
        list(zero_d)  # was [] (Python's fallback through __getitem__)
    with pytest.raises(TypeError):
        iter(zero_d)
    # reversed(): the rows last first, as views (Python refused it before).
    back = list(reversed(t))
    assert [r.tolist() for r in back] == ref[::-1].tolist()
    assert [r.data_ptr for r in back] == [r.data_ptr for r in rows][::-1]
    assert list(reversed(devtensor.empty((0, 4)))) == []
    with pytest.raises(TypeError, match="0-d"):
        reversed(zero_d)
    assert (float(zero_d), int(zero_d), complex(zero_d)) == (5.0, 5, 5 + 0j)
    assert int(devtensor.full((1, 1), -2.7)) == -2
    assert float(devtensor.full((1,), 3, dtype="int16")) == 3.0
    with pytest.raises(TypeError):
        float(devtensor.full((), 1 + 2j, dtype="complex64"))  # as float(1+2j)
    assert complex(devtensor.full((), 1 + 2j, dtype="complex64")) == 1 + 2j
    # bool(): the one element's truth (bool(zeros(1)) was True, from len()).
    assert not devtensor.zeros(1)
    assert devtensor.ones((1, 1, 1), dtype="bool")
    assert not devtensor.zeros((), dtype="float16")
    for many in (devtensor.zeros(2), devtensor.zeros((0,))):
        with pytest.raises(ValueError, match="ambiguous"):
            bool(many)
        with pytest.raises(TypeError):
            float(many)


# --------------------------------------------------------------------------------------
# permute / transpose / reshape / contiguous / clone
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (-1, 0, 1)])
def test_permute(dims):
    t, ref = iota((2, 3, 4))
    for v in (t.permute(*dims), t.permute(dims), t.permute(list(dims))):
        expect = ref.transpose(dims)
        assert v.shape == expect.shape
        assert v.strides == tuple(s // 4 for s in expect.strides)
        assert v.data_ptr == t.data_ptr
        np.testing.assert_array_equal(arr(v), expect)


@pytest.mark.parametrize("dims", [(0, 0, 1), (0, 1), (0, 1, 3), (0, 1, 2, 3)])
def test_permute_bad(dims):
    with pytest.raises((ValueError, IndexError)):
        devtensor.zeros((2, 3, 4)).permute(*dims)


@pytest.mark.parametrize("d0, d1", [(0, 1), (1, 0), (0, 2), (-1, 0), (1, 1)])
def test_transpose(d0, d1):
    t, ref = iota((2, 3, 4))
    v = t.transpose(d0, d1)
    expect = np.swapaxes(ref, d0, d1)
    assert v.shape == expect.shape
    assert v.strides == tuple(s // 4 for s in expect.strides)
    assert v.data_ptr == t.data_ptr
    assert v.is_contiguous() == (d0 % 3 == d1 % 3)
    np.testing.assert_array_equal(arr(v), expect)


def test_transpose_out_of_range():
    with pytest.raises((IndexError, ValueError)):
        devtensor.zeros((2, 3)).transpose(0, 2)


@pytest.mark.parametrize("shape", [(24,), (4, 6), (2, 3, 4), (-1,), (2, -1), (1, 24, 1), (3, 2, -1)])
def test_reshape_contiguous_is_view(shape):
    t, ref = iota((2, 3, 4))
    for v in (t.reshape(*shape), t.reshape(shape)):
        expect = ref.reshape(shape)
        assert v.shape == expect.shape
        assert v.data_ptr == t.data_ptr
        assert v.is_contiguous()
        np.testing.assert_array_equal(arr(v), expect)


def test_reshape_noncontiguous_copies():
    t, ref = iota((3, 4))
    tt = t.transpose(0, 1)
    v = tt.reshape(-1)
    expect = ref.T.reshape(-1)
    assert v.shape == (12,)
    assert v.data_ptr != t.data_ptr
    np.testing.assert_array_equal(arr(v), expect)
    arr(v)[0] = 99  # a copy: the source is unchanged
    assert arr(t)[0, 0] == 0


def test_reshape_noncontiguous_view_when_possible():
    t, ref = iota((3, 4))
    tt = t.transpose(0, 1)  # (4, 3), strides (1, 4)
    v = tt.reshape(4, 1, 3)
    np.testing.assert_array_equal(arr(v), ref.T.reshape(4, 1, 3))


@pytest.mark.parametrize("shape", [(5,), (5, -1), (-1, -1), (7, 4)])
def test_reshape_bad(shape):
    with pytest.raises(ValueError):
        devtensor.zeros((3, 4)).reshape(*shape)


def test_reshape_empty_and_0d():
    assert devtensor.zeros((0, 3)).reshape(3, 0).shape == (3, 0)
    assert devtensor.full((), 1.0).reshape(1, 1).shape == (1, 1)
    assert devtensor.full((1, 1), 1.0).reshape(()).shape == ()


def test_contiguous_of_contiguous_is_same_memory():
    t = devtensor.zeros((3, 4))
    assert t.contiguous().data_ptr == t.data_ptr


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.transpose(0, 1),
        lambda t: t[:, ::2],
        lambda t: t[::-1],
        lambda t: t[::-2, 1::3],
        lambda t: t.permute(1, 0)[1:, ::-1],
    ],
    ids=["T", "stride2", "flip", "flip2-step3", "permute-flip"],
)
@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64", "complex128", "bfloat16"])
def test_contiguous_copies_views(make, dtype):
    t = devtensor.empty((6, 7), dtype=dtype)
    # Fill with distinct bytes so any misplaced element shows.
    n = t.nbytes
    ctypes.memmove(t.data_ptr, bytes((i * 7 + 3) % 251 for i in range(n)), n)
    v = make(t)
    c = v.contiguous()
    assert c.is_contiguous()
    assert c.shape == v.shape
    assert c.dtype == dtype
    assert c.data_ptr != t.data_ptr
    # Compare against NumPy applied to the same bytes.
    base = np.frombuffer(raw(t), dtype=np.uint8).reshape(6, 7, t.itemsize)
    expect = np.ascontiguousarray(make(_NpProxy(base)))
    assert raw(c) == expect.tobytes()


class _NpProxy:
    """Applies the same view ops to a NumPy (..., itemsize) byte array."""

    def __init__(self, a):
        self.a = a

    def transpose(self, d0, d1):
        return np.swapaxes(self.a, d0, d1)

    def permute(self, *dims):
        return _NpProxy(self.a.transpose(*dims, self.a.ndim - 1))

    def __getitem__(self, key):
        return self.a[key]


def test_clone_is_a_new_buffer():
    t, ref = iota((3, 4))
    c = t.clone()
    assert c.data_ptr != t.data_ptr
    assert c.shape == t.shape and c.dtype == t.dtype
    np.testing.assert_array_equal(arr(c), ref)
    arr(c)[...] = 0
    np.testing.assert_array_equal(arr(t), ref)


def test_clone_of_view_is_contiguous():
    t, ref = iota((3, 4))
    c = t[:, ::-1].clone()
    assert c.is_contiguous()
    np.testing.assert_array_equal(arr(c), ref[:, ::-1])


def test_clone_0d_and_empty():
    assert devtensor.full((), 5.0).clone().shape == ()
    assert devtensor.zeros((0, 4)).clone().shape == (0, 4)


# --------------------------------------------------------------------------------------
# copy_ / fill_
# --------------------------------------------------------------------------------------


def test_copy_from_tensor():
    src, ref = iota((3, 4))
    dst = devtensor.zeros((3, 4))
    assert dst.copy_(src) is dst
    np.testing.assert_array_equal(arr(dst), ref)
    assert dst.data_ptr != src.data_ptr


def test_copy_between_views():
    src, ref = iota((4, 3))
    dst = devtensor.zeros((3, 4))
    dst.copy_(src.transpose(0, 1))
    np.testing.assert_array_equal(arr(dst), ref.T)
    dst2 = devtensor.zeros((4, 3))
    dst2.transpose(0, 1).copy_(dst)  # strided destination
    np.testing.assert_array_equal(arr(dst2), ref)
    dst3 = devtensor.zeros((4, 3))
    dst3[::-1].copy_(src)  # negative-stride destination
    np.testing.assert_array_equal(arr(dst3), ref[::-1])


def test_copy_from_numpy():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    dst = devtensor.zeros((3, 4), dtype="float64")
    dst.copy_(a)
    np.testing.assert_array_equal(arr(dst), a)
    dst.copy_(a[::-1])  # a negative-stride producer
    np.testing.assert_array_equal(arr(dst), a[::-1])
    dst2 = devtensor.zeros((4, 3), dtype="float64")
    dst2.copy_(a.T)
    np.testing.assert_array_equal(arr(dst2), a.T)
    assert a[0, 1] == 1  # source untouched


def test_copy_mismatches():
    dst = devtensor.zeros((3, 4))
    with pytest.raises(ValueError):
        dst.copy_(devtensor.zeros((4, 3)))
    with pytest.raises((TypeError, ValueError)):
        dst.copy_(devtensor.zeros((3, 4), dtype="int32"))
    with pytest.raises(TypeError):
        dst.copy_(object())


def test_copy_broadcasts_the_source_as_numpy_and_torch():
    # np.copyto and torch's copy_ repeat a source of fewer or length-1 dims.
    for dst_shape, src in [
        ((3,), np.float32(1.5)),
        ((2, 3), np.arange(3, dtype=np.float32)),
        ((2, 3), np.arange(2, dtype=np.float32).reshape(2, 1)),
        ((4, 2, 3), np.arange(6, dtype=np.float32).reshape(1, 2, 3)),
        ((0, 3), np.arange(3, dtype=np.float32)),
    ]:
        want = np.zeros(dst_shape, dtype=np.float32)
        np.copyto(want, src)
        dst = devtensor.zeros(dst_shape)
        assert dst.copy_(src) is dst
        np.testing.assert_array_equal(arr(dst), want)
    strided = devtensor.zeros((3, 4))[:, ::2]
    strided.copy_(devtensor.full((2,), 7.0))
    assert strided.tolist() == [[7.0, 7.0]] * 3
    for dst_shape, src_shape in [((3,), (2,)), ((3,), (1, 3)), ((2, 3), (2,))]:
        with pytest.raises(ValueError, match="broadcast"):
            devtensor.zeros(dst_shape).copy_(np.zeros(src_shape, dtype=np.float32))


def test_copy_into_read_only_fails():
    a = np.zeros(4, dtype=np.float32)
    a.flags.writeable = False
    t = devtensor.from_dlpack(a)
    assert t.read_only
    with pytest.raises((BufferError, ValueError)):
        t.copy_(devtensor.ones(4))
    with pytest.raises((BufferError, ValueError)):
        t.fill_(1.0)
    assert not a.any()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_fill(dtype):
    t = devtensor.empty((2, 5), dtype=dtype)
    value = True if dtype == "bool" else 3
    assert t.fill_(value) is t
    np.testing.assert_array_equal(arr(t), np.full((2, 5), value, dtype=dtype))


def test_fill_view_only():
    t = devtensor.zeros((3, 4), dtype="int32")
    t[:, 1::2].fill_(7)
    expect = np.zeros((3, 4), dtype=np.int32)
    expect[:, 1::2] = 7
    np.testing.assert_array_equal(arr(t), expect)
    t[::-1, 0].fill_(-1)
    expect[:, 0] = -1
    np.testing.assert_array_equal(arr(t), expect)


def test_fill_complex_and_float():
    t = devtensor.zeros(3, dtype="complex64")
    t.fill_(1 - 2j)
    np.testing.assert_array_equal(arr(t), np.full(3, 1 - 2j, dtype=np.complex64))
    t = devtensor.zeros(3, dtype="float16")
    t.fill_(0.5)
    np.testing.assert_array_equal(arr(t), np.full(3, 0.5, dtype=np.float16))


def test_fill_bad_values():
    with pytest.raises(OverflowError):
        devtensor.zeros(3, dtype="int8").fill_(200)
    with pytest.raises(ValueError):
        devtensor.zeros(3, dtype="int8").fill_(0.5)
    with pytest.raises(TypeError):
        devtensor.zeros(3).fill_("x")


def test_fill_empty_and_0d():
    devtensor.zeros((0, 3)).fill_(1.0)
    t = devtensor.zeros(())
    t.fill_(4.0)
    assert arr(t)[()] == 4.0


# --------------------------------------------------------------------------------------
# Allocator statistics
# --------------------------------------------------------------------------------------

STAT_KEYS = {
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "active_blocks",
    "segments",
    "alloc_count",
    "segment_allocs",
    "oom_count",
}


@pytest.mark.parametrize("device", [None, "cpu", (1, 0)])
def test_memory_stats_cpu(device):
    s = devtensor.memory_stats() if device is None else devtensor.memory_stats(device)
    assert isinstance(s, dict)
    assert STAT_KEYS <= set(s)
    assert all(type(v) is int and v >= 0 for v in s.values())
    assert s["peak_allocated_bytes"] >= s["allocated_bytes"]
    assert s["peak_reserved_bytes"] >= s["reserved_bytes"]


def test_empty_cache_cpu():
    assert devtensor.empty_cache() >= 0
    assert devtensor.empty_cache("cpu") >= 0


LARGE = 16 << 20  # above the CPU allocator's smallest block of its own mapping (8 MiB)


def _cached_cpu_bytes():
    s = devtensor.memory_stats("cpu")
    return s["reserved_bytes"] - s["allocated_bytes"]


def test_cpu_keeps_freed_large_blocks_until_empty_cache():
    devtensor.empty_cache("cpu")
    assert _cached_cpu_bytes() == 0
    a = devtensor.full((LARGE // 4,), 7.0, dtype="float32")
    del a
    gc.collect()
    assert _cached_cpu_bytes() >= LARGE
    # zeros() leaves the kept block (full of sevens) alone: a fresh mapping
    # reads as zeros without a byte written.
    z = devtensor.zeros((LARGE // 4,), dtype="float32")
    assert _cached_cpu_bytes() >= LARGE
    assert not np.from_dlpack(z).any()
    # empty() takes it back, as it was.
    e = devtensor.empty((LARGE // 4,), dtype="float32")
    assert _cached_cpu_bytes() < LARGE
    assert np.from_dlpack(e)[-1] == 7.0
    del z, e
    gc.collect()
    assert devtensor.empty_cache("cpu") >= 2 * LARGE
    assert _cached_cpu_bytes() == 0


def test_cpu_cache_unmaps_idle_blocks_by_itself():
    devtensor.empty_cache("cpu")
    a = devtensor.empty((LARGE,), dtype="uint8")
    del a
    gc.collect()
    assert _cached_cpu_bytes() >= LARGE
    # Nothing allocates or frees from here: the cache's own thread unmaps the
    # block after 2 s idle.
    deadline = time.monotonic() + 20
    while _cached_cpu_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cached_cpu_bytes() == 0


def _run_with_alloc_conf(conf, lines):
    """Runs `lines` of Python in a fresh interpreter (the cache's bound is read
    once per process) with DEVTENSOR_ALLOC_CONF=`conf`; its stdout."""
    env = dict(os.environ, DEVTENSOR_ALLOC_CONF=conf)
    code = "\n".join(["import devtensor, gc", *lines])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cpu_cache_mb_zero_keeps_nothing():
    out = _run_with_alloc_conf(
        "cpu_cache_mb:0",
        [
            f"a = devtensor.empty(({LARGE},), dtype='uint8'); del a; gc.collect()",
            "s = devtensor.memory_stats('cpu')",
            "print(s['reserved_bytes'] - s['allocated_bytes'], devtensor.empty_cache('cpu'))",
        ],
    )
    assert out.split() == ["0", "0"]


def test_cpu_cache_mb_malformed_is_a_value_error_for_large_blocks():
    out = _run_with_alloc_conf(
        "cpu_cache_mb:lots",
        [
            "assert devtensor.empty((1024,)).shape == (1024,)",
            "try:",
            f"    devtensor.empty(({LARGE},), dtype='uint8')",
            "except ValueError as e:",
            "    print(e)",
        ],
    )
    assert "DEVTENSOR_ALLOC_CONF" in out, out


def test_memory_stats_bad_device():
    with pytest.raises(ValueError):
        devtensor.memory_stats("gpu")


@pytest.mark.skipif(_cuda_present(), reason="a CUDA device is present: see test_gpu.py")
def test_memory_stats_cuda_without_backend():
    with pytest.raises(RuntimeError):
        devtensor.memory_stats("cuda")


# --------------------------------------------------------------------------------------
# Scalar encodings for the narrow float types, against ml_dtypes (JAX's dependency)
# --------------------------------------------------------------------------------------

NARROW_VALUES = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1 / 3,
    2.5,
    3.75,
    -7.0,
    0.013671875,  # subnormal in several float8 formats
    0.001,
    1e-7,
    17.0,
    240.0,
    448.0,
    449.0,
    464.0,  # rounds past e4m3fn's max
    57344.0,  # e5m2 max
    1e6,  # overflow
    -1e6,
    float("inf"),
    float("-inf"),
    float("nan"),
]


@pytest.mark.parametrize("name", FLOAT8_NAMES + ["bfloat16", "float16"])
def test_narrow_float_scalars_match_ml_dtypes(name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_type = np.float16 if name == "float16" else getattr(ml_dtypes, name, None)
    if np_type is None:
        pytest.skip(f"ml_dtypes has no {name}")
    uint = np.uint16 if name in ("bfloat16", "float16") else np.uint8
    for v in NARROW_VALUES:
        with np.errstate(all="ignore"):
            want = np.array([v], dtype=np.float64).astype(np_type).view(uint)[0]
        want_is_nan = bool(np.isnan(np.array([want], dtype=uint).view(np_type)[0].astype(np.float64)))
        try:
            t = devtensor.full(1, v, dtype=name)
        except (ValueError, OverflowError):
            # Refusing a value the format cannot hold (NaN/inf/overflow) is acceptable.
            assert want_is_nan or not np.isfinite(v) or abs(v) > 1e4, (name, v)
            continue
        got = np.frombuffer(raw(t), dtype=uint)[0]
        if want_is_nan:
            got_val = np.array([got], dtype=uint).view(np_type)[0].astype(np.float64)
            assert np.isnan(got_val), (name, v, hex(got), hex(want))
        else:
            assert got == want, (name, v, hex(got), hex(want))


def test_host_device_tuples_need_id_zero():
    assert devtensor.empty(2, device=(1, 0)).device == "cpu"
    with pytest.raises(ValueError):
        devtensor.empty(2, device=(1, 1))
    with pytest.raises(ValueError):
        devtensor.empty(2, device="cpu:1")


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint16", "int64", "float16", "bfloat16", "float32", "complex128", "float8_e4m3fn"]
)
def test_tensors_pickle_and_deepcopy_with_their_values(dtype):
    import copy
    import pickle

    base = devtensor.from_dlpack(np.arange(24, dtype=np.uint8).reshape(2, 3, 4) % 2).to("cpu")
    t = devtensor.zeros((2, 3, 4), dtype=dtype)
    t.copy_(devtensor.full((2, 3, 4), 1, dtype=dtype))
    for view in (t, t.permute(2, 0, 1)[::-1, :, 1:], t[0, 1], t[:, :0], t[1, 2, 3]):
        for back in (pickle.loads(pickle.dumps(view, protocol=p)) for p in (2, pickle.HIGHEST_PROTOCOL)):
            assert (back.shape, back.dtype, back.device) == (view.shape, view.dtype, view.device)
            assert back.is_contiguous() and not back.read_only
            assert back.tolist() == view.tolist()
            assert back.data_ptr != view.data_ptr or view.nbytes == 0
        c = copy.deepcopy(view)
        assert c.tolist() == view.tolist() and (c.data_ptr != view.data_ptr or view.nbytes == 0)
    assert base.shape == (2, 3, 4)


def test_pickles_cross_processes_and_refuse_forged_sizes():
    import multiprocessing
    import pickle

    t = devtensor.from_dlpack(np.arange(12.0).reshape(3, 4)).transpose(0, 1)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        back = pool.apply(pickle.loads, (pickle.dumps(t),))
    assert back.tolist() == t.tolist()
    fn, args = t.__reduce__()
    with pytest.raises(ValueError):
        fn(args[0][:-1], *args[1:])  # bytes one short of the shape
