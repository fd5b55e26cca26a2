"""A tensor's values from Python: repr (checked against torch's for the same values),
tolist for every dtype (float8 and bfloat16 against ml_dtypes), .cpu(), .numpy(),
NumPy 2's __array__(dtype, copy), the array interface (v3) both ways, and torch
reading devtensor host memory through NumPy."""

import array
import ctypes
import gc
import math
import sys

import pytest

import devtensor

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")


def flatten(v):
    return [w for item in v for w in flatten(item)] if isinstance(v, list) else [v]


def dt(x):
    """A devtensor view of a torch or NumPy CPU tensor (zero-copy)."""
    return devtensor.from_dlpack(x)


# --------------------------------------------------------------------------------------
# repr, against torch's on the same values
# --------------------------------------------------------------------------------------

REPR_CASES = {
    "int-mode floats": lambda: torch.tensor([[0.0, 1.0], [2.0, 3.0]]),
    "fractions": lambda: torch.tensor([0.5, -1.25, 3.14159, 100.0]),
    "sci small": lambda: torch.tensor([1e-5, 1.0, 2.5]),
    "sci large": lambda: torch.tensor([1e9, 1.0]),
    "int-mode sci": lambda: torch.tensor([1.0, 100000.0]),
    "non-finite": lambda: torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5, 0.0]),
    "non-finite int-mode": lambda: torch.tensor([float("nan"), 2.0, -float("inf")]),
    "all zeros": lambda: torch.zeros(2, 3),
    "negative zero": lambda: torch.tensor([-0.0, 1.0]),
    "wrapped line": lambda: torch.arange(40.0) / 3,
    "3-d": lambda: torch.arange(24.0).reshape(2, 3, 4) - 5,
    "summarized 1-d": lambda: torch.arange(2000.0),
    "summarized 2-d": lambda: torch.arange(40 * 50, dtype=torch.float64).reshape(40, 50) / 7,
    "summarized 3-d ints": lambda: torch.arange(11 * 12 * 13).reshape(11, 12, 13),
    "0-d": lambda: torch.tensor(3.5),
    "0-d int": lambda: torch.tensor(-7),
    "float64": lambda: torch.tensor([1.0, 2.5], dtype=torch.float64),
    "float16": lambda: torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float16),
    "bfloat16": lambda: torch.tensor([0.1, 1.5, -2.0], dtype=torch.bfloat16),
    "float8_e4m3fn": lambda: torch.tensor([0.5, 1.0, -448.0], dtype=torch.float8_e4m3fn),
    "float8_e5m2": lambda: torch.tensor([0.25, 3.0, 57344.0], dtype=torch.float8_e5m2),
    "int8": lambda: torch.tensor([-128, 0, 127], dtype=torch.int8),
    "uint8": lambda: torch.tensor([0, 255, 7], dtype=torch.uint8),
    "int16": lambda: torch.tensor([-3, 300], dtype=torch.int16),
    "int32": lambda: torch.tensor([[1, -20], [300, 4000]], dtype=torch.int32),
    "int64": lambda: torch.tensor([2**40, -1]),
    "bool": lambda: torch.tensor([True, False, True]),
    "complex64": lambda: torch.tensor([1 + 2j, -3.5 - 0.25j, 0j]),
    "complex128": lambda: torch.tensor([1e-6 + 1j, 2 - 0j], dtype=torch.complex128),
    "empty 1-d": lambda: torch.zeros(0),
    "empty 2-d int": lambda: torch.zeros(0, 3, dtype=torch.int32),
    "empty 2-d float": lambda: torch.zeros(2, 0),
}


@pytest.mark.parametrize("make", REPR_CASES.values(), ids=REPR_CASES.keys())
def test_repr_matches_torch(make):
    x = make()
    assert repr(dt(x)) == repr(x).replace("torch.", "")


def test_repr_of_views_matches_torch():
    a = np.arange(30, dtype=np.float32).reshape(5, 6) / 4
    t = dt(a)
    for v, ref in ((t.transpose(0, 1), a.T), (t[::2, ::-3], a[::2, ::-3]), (t[1], a[1])):
        assert repr(v) == repr(torch.from_numpy(np.ascontiguousarray(ref)))


def test_repr_shows_the_values_of_a_small_tensor():
    t = devtensor.full((2, 2), 1.5, dtype="float16")
    assert repr(t) == "tensor([[1.5000, 1.5000],\n        [1.5000, 1.5000]], dtype=float16)"


# --------------------------------------------------------------------------------------
# tolist
# --------------------------------------------------------------------------------------

def test_tolist_gives_python_scalars_like_torch():
    cases = [
        torch.tensor([[1.5, -2.0], [0.25, 3.0]]),
        torch.tensor([True, False]),
        torch.tensor([-(2**63), 2**63 - 1]),
        torch.tensor([1 + 2j, -0.5j], dtype=torch.complex128),
        torch.tensor([0.1, 65504.0], dtype=torch.float16),
        torch.tensor([0.1, 3.0e38], dtype=torch.bfloat16),
        torch.tensor(7, dtype=torch.int16),
        torch.arange(24).reshape(2, 3, 4).flip(1)[:, :, 1::2],
    ]
    for x in cases:
        got = dt(x).tolist()
        assert got == x.tolist()
        assert [type(v) for v in flatten(got)] == [type(v) for v in flatten(x.tolist())]


@pytest.mark.parametrize(
    "dtype",
    ["uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "uint8", "float32", "float64", "complex64"],
)
def test_tolist_matches_numpy(dtype):
    a = (np.arange(12) * 37 % 23).astype(dtype).reshape(3, 4)
    if dtype.startswith("uint"):
        a[0, 0] = np.iinfo(dtype).max
    got = dt(a).tolist()
    assert got == a.tolist()
    assert type(got[0][0]) is type(a.tolist()[0][0])


FLOAT8 = [
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]


@pytest.mark.parametrize("name", FLOAT8 + ["bfloat16"])
def test_tolist_decodes_every_encoding_as_ml_dtypes(name):
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"SKIP: this ml_dtypes has no {name}")
    kind = getattr(ml_dtypes, name)
    size = np.dtype(kind).itemsize
    raw = np.arange(256, dtype=np.uint8) if size == 1 else np.arange(0, 65536, 97, dtype=np.uint16)
    t = devtensor.empty(raw.shape, dtype=name)
    ctypes.memmove(t.data_ptr, raw.ctypes.data, raw.nbytes)
    got = t.tolist()
    with np.errstate(invalid="ignore"):
        want = raw.view(kind).astype(np.float64).tolist()
    assert all(type(v) is float for v in got)
    for g, w, r in zip(got, want, raw.tolist()):
        assert (math.isnan(g) and math.isnan(w)) or g == w, f"{name} {r:#x}: {g} != {w}"
    # NumPy sees the same values through .numpy()
    np.testing.assert_array_equal(t.numpy().view(raw.dtype), raw)
    assert t.numpy().dtype == np.dtype(kind)


def test_tolist_of_complex32_and_0d():
    c = devtensor.full((2,), 1 - 2j, dtype="complex32")
    assert c.tolist() == [1 - 2j, 1 - 2j] and type(c.tolist()[0]) is complex
    assert devtensor.full((), 3, dtype="int8").tolist() == 3
    assert devtensor.zeros((0, 2)).tolist() == []


# --------------------------------------------------------------------------------------
# cpu, numpy, __array__ (NumPy 2 semantics), __array_interface__
# --------------------------------------------------------------------------------------

def test_cpu_returns_the_cpu_tensor_itself():
    t = devtensor.zeros((2, 2))
    assert t.cpu() is t


def test_numpy_is_zero_copy_and_writes_through():
    t = devtensor.zeros((3, 4), dtype="float32")
    a = t.numpy()
    assert a.ctypes.data == t.data_ptr and a.shape == (3, 4) and a.dtype == np.float32
    a[1, 2] = 5.0
    assert t.tolist()[1][2] == 5.0


def test_asarray_copy_false_shares_memory_and_copy_true_does_not():
    t = devtensor.from_dlpack(np.arange(6, dtype=np.int32).reshape(2, 3))
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr
    b = np.asarray(t, copy=False)
    assert b.ctypes.data == t.data_ptr
    c = np.array(t, copy=True)
    assert c.ctypes.data != t.data_ptr
    np.testing.assert_array_equal(c, a)
    assert sys.getrefcount(t) >= 3, "the arrays keep the tensor alive through their base"


def test_array_dtype_conversion_copies_unless_copy_false():
    t = devtensor.full((2, 2), 1.5, dtype="float32")
    a = np.asarray(t, dtype=np.float64)
    assert a.dtype == np.float64 and a.ctypes.data != t.data_ptr
    np.testing.assert_array_equal(a, np.full((2, 2), 1.5))
    with pytest.raises(ValueError, match="copy"):
        t.__array__(np.float64, copy=False)
    same = t.__array__(np.float32, copy=False)
    assert same.ctypes.data == t.data_ptr


def test_numpy_of_strided_views():
    a = np.arange(5 * 7, dtype=np.float64).reshape(5, 7)
    t = dt(a)
    for v, ref in ((t[::2, ::-3], a[::2, ::-3]), (t.transpose(0, 1), a.T), (t[3], a[3])):
        n = v.numpy()
        np.testing.assert_array_equal(n, ref)
        assert np.shares_memory(n, a)
        ai = v.__array_interface__
        assert ai["strides"] == (None if v.is_contiguous() else tuple(s * 8 for s in v.strides))


def test_array_interface_fields():
    t = devtensor.zeros((2, 3), dtype="int16")
    ai = t.__array_interface__
    assert ai["shape"] == (2, 3)
    assert ai["typestr"] == "<i2"
    assert ai["descr"] == [("", "<i2")]
    assert ai["data"] == (t.data_ptr, False)
    assert ai["strides"] is None
    assert ai["version"] == 3
    assert devtensor.zeros((1,), dtype="bool").__array_interface__["typestr"] == "|b1"


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_numpy_asarray_gives_ml_dtypes_types_not_raw_bytes(dtype):
    # NumPy reads __array_interface__ before __array__: it made these void
    # arrays ("|V2"); without one for them it takes __array__, as numpy() does.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = devtensor.full((2, 3), 2.0, dtype=dtype)
    with pytest.raises(AttributeError, match=dtype):
        t.__array_interface__
    a = np.asarray(t)
    assert a.dtype == getattr(ml_dtypes, dtype)
    assert a.ctypes.data == t.data_ptr  # still no copy
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float32), np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(np.array(t).astype(np.float32), np.full((2, 3), 2.0, np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_ml_dtypes_arrays_import_back_through_their_array_interface(dtype):
    # NumPy's __dlpack__ refuses these dtypes (BufferError); their array interface
    # describes them as raw bytes ("<V2"), which the array's dtype names.
    kind = getattr(ml_dtypes, dtype)
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(kind)
    with pytest.raises(BufferError):
        a.__dlpack__()
    t = devtensor.from_dlpack(a)
    assert t.dtype == dtype and t.shape == (3, 4) and t.data_ptr == a.ctypes.data
    np.testing.assert_array_equal(t.tolist(), a.astype(np.float64))  # NaN == NaN here
    v = devtensor.from_dlpack(a[::2, ::-1])  # strided views keep their strides
    np.testing.assert_array_equal(v.tolist(), a[::2, ::-1].astype(np.float64))
    assert devtensor.from_dlpack(a, copy=True).data_ptr != a.ctypes.data
    a.flags.writeable = False
    assert devtensor.from_dlpack(a).read_only
    # And the round trip through .numpy(), into a tensor with copy_.
    back = devtensor.empty((3, 4), dtype=dtype).copy_(devtensor.from_dlpack(a).numpy())
    np.testing.assert_array_equal(back.tolist(), t.tolist())
    # Raw bytes no dtype names stay refused.
    raw = type("Raw", (), {"__array_interface__": dict(np.zeros(2, "V2").__array_interface__)})()
    with pytest.raises(BufferError, match="typestr"):
        devtensor.from_dlpack(raw)
    # The other byte order ('>V2'): refused, as NumPy refuses '>f2'; its
    # bytes were read unswapped (1.0 read as -5.8e-39).
    if kind(0).nbytes > 1:
        swapped = a.byteswap().view(a.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))
        with pytest.raises(BufferError, match="byte order"):
            devtensor.from_dlpack(swapped)


def test_read_only_tensors_give_read_only_arrays():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = devtensor.from_dlpack(a)
    assert t.read_only
    assert t.__array_interface__["data"] == (a.ctypes.data, True)
    n = np.asarray(t)
    assert not n.flags.writeable
    with pytest.raises(ValueError):
        n[0] = 1.0


def test_complex32_has_no_numpy_type():
    with pytest.raises(TypeError, match="complex32"):
        devtensor.zeros((2,), dtype="complex32").numpy()
    with pytest.raises(TypeError, match="complex32"):
        np.asarray(devtensor.zeros((2,), dtype="complex32"))


def test_torch_reads_devtensor_host_memory_through_numpy():
    t = devtensor.full((2, 3), 2.5, dtype="float32")
    x = torch.from_numpy(np.asarray(t))
    assert x.data_ptr() == t.data_ptr
    x[0, 0] = -1.0
    assert t.tolist()[0][0] == -1.0
    assert torch.as_tensor(t).tolist() == t.tolist()


class ArrayInterfaceOnly:
    """An object that only speaks NumPy's array interface (no DLPack)."""

    def __init__(self, interface, owner=None):
        self.__array_interface__ = interface
        self.owner = owner


def test_from_dlpack_imports_an_array_interface_only_object_zero_copy():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1::2]  # a strided torch CPU tensor
    obj = ArrayInterfaceOnly(x.numpy().__array_interface__, owner=x)
    before = sys.getrefcount(obj)
    t = devtensor.from_dlpack(obj)
    assert t.data_ptr == x.data_ptr()
    assert t.shape == (3, 2) and t.strides == (4, 2)
    assert t.tolist() == x.tolist()
    assert sys.getrefcount(obj) == before + 1, "the tensor keeps the object alive"
    del t
    assert sys.getrefcount(obj) == before


def test_array_interface_import_rejects_what_a_tensor_cannot_describe():
    a = np.arange(8, dtype=np.int32)
    ai = dict(a.__array_interface__)
    with pytest.raises(BufferError, match="mask"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, mask=a), owner=a))
    with pytest.raises(BufferError, match="multiple"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(3,), strides=(6,)), owner=a))
    with pytest.raises(BufferError, match="byte order"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, typestr=">i4"), owner=a))
    with pytest.raises(BufferError, match="typestr"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, typestr="|V4"), owner=a))
    # More elements than 64 bits count: the product wrapped (a panic with
    # overflow checks) before the import's own checks.
    with pytest.raises(BufferError, match="64 bits"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(2**62, 2**62), strides=(0, 0)), owner=a))
    with pytest.raises(TypeError, match="neither DLPack"):
        devtensor.from_dlpack(object())


def test_array_interface_data_may_be_a_buffer_object():
    # NumPy's array interface lets `data` be an object with the buffer
    # protocol (Pillow's images give `bytes`); the tensor views its bytes.
    values = np.arange(12, dtype=np.float32)
    frozen = ArrayInterfaceOnly({"version": 3, "shape": (3, 4), "typestr": "<f4", "data": values.tobytes()})
    t = devtensor.from_dlpack(frozen)
    assert t.shape == (3, 4) and t.tolist() == values.reshape(3, 4).tolist()
    with pytest.raises(BufferError, match="read-only"):
        t.fill_(1)  # bytes are immutable
    # A bytearray: writable, shared, and held (it cannot be resized while the tensor lives).
    raw = bytearray(values.tobytes())
    ai = {"version": 3, "shape": (2, 3), "typestr": "<f4", "data": raw, "strides": (24, 4), "offset": 8}
    t = devtensor.from_dlpack(ArrayInterfaceOnly(ai))
    assert t.tolist() == [[2, 3, 4], [8, 9, 10]]
    t.fill_(-1)
    assert np.frombuffer(raw, dtype=np.float32).tolist() == [0, 1, -1, -1, -1, 5, 6, 7, -1, -1, -1, 11]
    with pytest.raises(BufferError):
        raw.extend(b"1234")
    del ai, t
    gc.collect()
    raw.extend(b"1234")  # the export ended with the tensor
    # memoryview and array.array exporters; a tensor outlives its exporter.
    arr = array.array("h", range(6))
    t = devtensor.from_dlpack(ArrayInterfaceOnly({"version": 3, "shape": (6,), "typestr": "<i2", "data": memoryview(arr)}))
    assert t.tolist() == list(range(6))
    t = devtensor.from_dlpack(ArrayInterfaceOnly({"version": 3, "shape": (2, 3), "typestr": "<i2", "data": arr}))
    del arr
    gc.collect()
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]


class BytesWithInterface(bytearray):
    """Bytes whose array interface has no `data`: the object's own buffer holds the array."""

    @property
    def __array_interface__(self):
        return {"version": 3, "shape": (2, 2), "typestr": "|u1"}


def test_array_interface_without_data_views_the_objects_own_buffer():
    b = BytesWithInterface(b"\x01\x02\x03\x04")
    t = devtensor.from_dlpack(b)
    assert t.dtype == "uint8" and t.tolist() == [[1, 2], [3, 4]]
    t[1].fill_(9)
    assert bytes(b) == b"\x01\x02\x09\x09", "zero-copy: the tensor writes the bytearray"


def test_array_interface_buffer_data_is_checked():
    ai = {"version": 3, "typestr": "<f4"}
    with pytest.raises(ValueError, match="too few"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(5,), data=bytes(16))))
    with pytest.raises(ValueError, match="too few"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(4,), data=bytes(16), offset=4)))
    with pytest.raises(ValueError, match="too few"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(2, 2), strides=(-8, 4), data=bytes(16))))
    # The same rows from the second on: inside the buffer.
    flipped = ArrayInterfaceOnly(dict(ai, shape=(2, 2), strides=(-8, 4), data=np.arange(4, dtype="<f4").tobytes(), offset=8))
    assert devtensor.from_dlpack(flipped).tolist() == [[2, 3], [0, 1]]
    with pytest.raises(ValueError, match="before the buffer"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(1,), data=bytes(16), offset=-4)))
    with pytest.raises(TypeError, match="'offset' must be an int"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(1,), data=bytes(16), offset=4.0)))
    # No data and no buffer of its own.
    with pytest.raises(ValueError, match="no \"data\" entry"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(1,))))
    # Neither a pointer tuple nor a buffer.
    with pytest.raises(TypeError, match="buffer protocol"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(1,), data=3.5)))
    # A buffer that is not C-contiguous.
    strided = memoryview(bytearray(32)).cast("f")[::2]
    with pytest.raises(BufferError, match="contiguous"):
        devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(4,), data=strided)))
    # An empty array needs no byte of its buffer.
    assert devtensor.from_dlpack(ArrayInterfaceOnly(dict(ai, shape=(0, 3), data=b""))).shape == (0, 3)


def test_repr_falls_back_to_the_metadata_when_values_cannot_be_read(monkeypatch):
    import devtensor._format

    def unreadable(t):
        raise RuntimeError("device gone")

    monkeypatch.setattr(devtensor._format, "tensor_repr", unreadable)
    r = repr(devtensor.zeros((2, 3), dtype="int16"))
    assert r == "devtensor.Tensor(shape=(2, 3), dtype=int16, device=cpu) <values unavailable: RuntimeError: device gone>"
