"""Zero-copy round trips with NumPy (CPU)."""

import gc
import sys

import pytest

import devtensor
from conftest import NUMPY_DTYPES, VIEW_PAIRS, copied_between_views

np = pytest.importorskip("numpy")


def sample(shape, dtype):
    n = int(np.prod(shape))
    if dtype == "bool":
        return (np.arange(n) % 3 == 0).reshape(shape)
    a = np.arange(n).astype(dtype).reshape(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * a[::-1] if a.ndim else a
    return a.astype(dtype)


def dt_from(a):
    """A devtensor tensor with a copy of `a`'s values."""
    t = devtensor.empty(a.shape, dtype=a.dtype)
    np.from_dlpack(t)[...] = a
    return t


def offset_of(a, t):
    return a.ctypes.data - t.data_ptr


# --------------------------------------------------------------------------------------
# devtensor -> numpy
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_to_numpy_every_dtype_zero_copy(dtype):
    ref = sample((3, 4), dtype)
    t = dt_from(ref)
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (3, 4)
    assert a.ctypes.data == t.data_ptr
    assert a.flags.writeable
    np.testing.assert_array_equal(a, ref)
    # Writes visible both ways.
    a[1, 2] = ref[0, 0]
    b = np.from_dlpack(t)
    assert b[1, 2] == ref[0, 0]
    devtensor.from_dlpack(b)[0].fill_(True if dtype == "bool" else 1)
    assert (a[0] == np.ones(4, dtype=dtype)).all()


VIEWS = {
    "T": lambda x: x.transpose(0, 1) if isinstance(x, devtensor.Tensor) else x.T,
    "slice": lambda x: x[1:, 1:3],
    "step": lambda x: x[::2, ::3],
    "flip-rows": lambda x: x[::-1],
    "flip-cols": lambda x: x[:, ::-1],
    "flip-both-step": lambda x: x[::-2, ::-3],
    "row": lambda x: x[2],
    "col": lambda x: x[:, 3],
    "scalar": lambda x: x[1, 1, ...],
    "newaxis": lambda x: x[:, None, 1:],
    "empty": lambda x: x[2:2],
    "empty-flip": lambda x: x[:, 5:1:1],
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dtype", ["float32", "int16", "complex128"])
def test_views_to_numpy(view, dtype):
    ref = sample((5, 6), dtype)
    t = dt_from(ref)
    make = VIEWS[view]
    v = make(t)
    expect = make(ref)
    a = np.from_dlpack(v)
    assert a.shape == expect.shape
    np.testing.assert_array_equal(a, expect)
    if a.size:
        assert a.ctypes.data == v.data_ptr
        assert offset_of(a, t) == expect.ctypes.data - ref.ctypes.data
        assert tuple(s // a.itemsize for s, n in zip(a.strides, a.shape) if n > 1) == tuple(
            s for s, n in zip(v.strides, v.shape) if n > 1
        )
        # Writes through the NumPy view land in the devtensor buffer.
        a[...] = 0
        assert not np.from_dlpack(make(t)).any()


def test_0d_to_numpy():
    t = devtensor.full((), 2.5, dtype="float64")
    a = np.from_dlpack(t)
    assert a.shape == () and a[()] == 2.5
    assert a.ctypes.data == t.data_ptr


@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0, 2)])
def test_empty_to_numpy(shape):
    a = np.from_dlpack(devtensor.empty(shape))
    assert a.shape == shape and a.size == 0


def test_numpy_keeps_tensor_memory_alive():
    t = devtensor.full(1000, 3.0)
    a = np.from_dlpack(t)
    del t
    gc.collect()
    devtensor.full(1000, 9.0)  # would reuse the buffer if it had been freed
    assert (a == 3.0).all()


def test_numpy_copy_and_device_keywords():
    t = devtensor.full((2, 3), 1.0)
    c = np.from_dlpack(t, copy=True)
    assert c.ctypes.data != t.data_ptr
    np.testing.assert_array_equal(c, np.ones((2, 3)))
    assert np.from_dlpack(t, copy=False).ctypes.data == t.data_ptr
    assert np.from_dlpack(t, device="cpu").ctypes.data == t.data_ptr


def test_numpy_read_only_import_of_read_only_tensor():
    a0 = np.arange(4.0)
    a0.flags.writeable = False
    t = devtensor.from_dlpack(a0)
    a = np.from_dlpack(t)
    assert a.ctypes.data == a0.ctypes.data
    assert not a.flags.writeable  # READ_ONLY survives the trip
    np.testing.assert_array_equal(a, a0)


def test_numpy_cannot_take_bfloat16():
    t = devtensor.zeros(3, dtype="bfloat16")
    with pytest.raises((BufferError, TypeError, ValueError, RuntimeError)):  # numpy 2.4: RuntimeError
        np.from_dlpack(t)


def test_refcount_after_numpy_import(rc, live):
    t = devtensor.zeros(10)
    r0, n0 = rc(t), live()
    x = np.from_dlpack(t)
    assert live() == n0 + 1
    del x
    assert rc(t) == r0
    assert live() == n0


def test_numpy_many_round_trips(live):
    t = devtensor.zeros(10)
    n0 = live()
    for _ in range(2000):
        np.from_dlpack(t)
    assert live() == n0


# --------------------------------------------------------------------------------------
# numpy -> devtensor
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_from_numpy_every_dtype_zero_copy(dtype):
    a = sample((4, 5), dtype)
    t = devtensor.from_dlpack(a)
    assert t.dtype == dtype
    assert t.shape == (4, 5)
    assert t.strides == (5, 1)
    assert t.data_ptr == a.ctypes.data
    assert not t.read_only
    t[0].fill_(False if dtype == "bool" else 0)
    assert not a[0].any()  # writes visible in NumPy


NP_VIEWS = {
    "T": lambda a: a.T,
    "slice": lambda a: a[1:, 2:],
    "step": lambda a: a[::2, 1::3],
    "flip": lambda a: a[::-1],
    "flip-cols": lambda a: a[:, ::-2],
    "fortran": lambda a: np.asfortranarray(a),
    "3d-swap": lambda a: a.reshape(2, 3, 6).transpose(2, 0, 1),
    "col": lambda a: a[:, 4],
    "empty": lambda a: a[:0],
}


@pytest.mark.parametrize("view", list(NP_VIEWS))
def test_from_numpy_views(view):
    base = sample((6, 6), "float64")
    a = NP_VIEWS[view](base)
    t = devtensor.from_dlpack(a)
    assert t.shape == a.shape
    if a.size:
        assert t.data_ptr == a.ctypes.data
        assert tuple(s for s, n in zip(t.strides, t.shape) if n > 1) == tuple(
            s // 8 for s, n in zip(a.strides, a.shape) if n > 1
        )
        np.testing.assert_array_equal(np.from_dlpack(t.contiguous()), a)
        np.testing.assert_array_equal(np.from_dlpack(t), a)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(5, 7, 3, 2), (3, 4, 5, 3), (2, 70, 4), (40, 3), (6, 5, 4, 3, 2)])
def test_permutes_of_narrow_unit_stride_sides_match_numpy(shape, dtype):
    """Every permutation of shapes whose unit-stride side is 2-4 elements (pixels to
    planes, pairs moved outward: the channel-split and row-gather kernels), from an
    aligned array and from one starting an element in, against NumPy's copy."""
    import itertools

    n = int(np.prod(shape))
    flat = np.arange(n + 1).astype(dtype)
    for a in (flat[:n].reshape(shape), flat[1:].reshape(shape)):
        t = devtensor.from_dlpack(a)
        for perm in itertools.permutations(range(len(shape))):
            got = np.from_dlpack(t.permute(*perm).contiguous())
            np.testing.assert_array_equal(got, a.transpose(perm), err_msg=f"{shape} {perm}")


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(33, 35, 37, 4), (9, 10, 11, 12, 13), (61, 67, 59, 3)])
def test_permutes_in_folded_tiles_match_numpy(shape, dtype):
    """Every permutation of shapes whose sides fold into wider tiles (AVX-512
    CPUs): 16 x 16 byte tiles, 8-byte elements with both sides a line or
    longer (a 33 x 5180 transpose), copies of several MiB with a side of 3,
    against NumPy's copy."""
    import itertools

    a = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    t = devtensor.from_dlpack(a)
    for perm in itertools.permutations(range(len(shape))):
        got = np.from_dlpack(t.permute(*perm).contiguous())
        np.testing.assert_array_equal(got, a.transpose(perm), err_msg=f"{shape} {perm}")


def test_from_numpy_0d():
    a = np.array(7, dtype=np.int32)
    t = devtensor.from_dlpack(a)
    assert t.shape == () and t.dtype == "int32"
    assert t.data_ptr == a.ctypes.data


def test_from_numpy_read_only():
    a = np.arange(6.0).reshape(2, 3)
    a.flags.writeable = False
    t = devtensor.from_dlpack(a)
    assert t.read_only
    assert t.data_ptr == a.ctypes.data
    with pytest.raises(BufferError):
        t.__dlpack__()  # legacy export of read-only data
    with pytest.raises((BufferError, ValueError)):
        t.fill_(1.0)
    c = t.clone()
    assert not c.read_only
    np.testing.assert_array_equal(np.from_dlpack(c), a)


def test_from_numpy_keeps_array_alive():
    a = np.full(1000, 5.0)
    r0 = sys.getrefcount(a)
    t = devtensor.from_dlpack(a)
    assert sys.getrefcount(a) > r0  # the import owns a reference through the capsule
    del a
    gc.collect()
    np.full(1000, 1.0)
    assert (np.from_dlpack(t) == 5.0).all()


def test_from_numpy_releases_array(rc):
    a = np.zeros(10)
    r0 = rc(a)
    t = devtensor.from_dlpack(a)
    v = t[1:]
    del t
    assert rc(a) > r0
    del v
    assert rc(a) == r0


def test_from_numpy_copy():
    a = np.arange(5.0)
    t = devtensor.from_dlpack(a, copy=True)
    assert t.data_ptr != a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    t.fill_(0.0)
    assert a[1] == 1.0


def test_numpy_devtensor_numpy_chain():
    a = sample((4, 6), "int32")
    t = devtensor.from_dlpack(a[:, ::-2])
    b = np.from_dlpack(t)
    assert b.ctypes.data == a[:, ::-2].ctypes.data
    np.testing.assert_array_equal(b, a[:, ::-2])
    b[0, 0] = -5
    assert a[0, -1] == -5


def test_interleaved_views_of_distinct_elements_take_writes_as_numpy():
    # Rows of every other element, three apart: 0 2 4 / 3 5 7. The rows
    # interleave, the elements are distinct, and NumPy writes such a view.
    as_strided = np.lib.stride_tricks.as_strided
    ours, theirs = np.zeros(8, np.float32), np.zeros(8, np.float32)
    view = as_strided(ours, shape=(2, 3), strides=(12, 8))
    as_strided(theirs, shape=(2, 3), strides=(12, 8))[...] = np.arange(6).reshape(2, 3)
    devtensor.from_dlpack(view).copy_(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(ours, theirs)
    assert ours.tolist() == [0, 0, 1, 3, 2, 4, 0, 5]
    devtensor.from_dlpack(view).fill_(7.5)
    assert ours.tolist() == [7.5, 0, 7.5, 7.5, 7.5, 7.5, 0, 7.5]
    # Elements that do collide (0 2 4 / 2 4 6) are still refused, untouched.
    clash = as_strided(ours, shape=(2, 3), strides=(8, 8))
    with pytest.raises(ValueError, match="overlaps itself"):
        devtensor.from_dlpack(clash).fill_(1.0)
    assert ours.tolist() == [7.5, 0, 7.5, 7.5, 7.5, 7.5, 0, 7.5]


@pytest.mark.parametrize("pair", list(VIEW_PAIRS))
def test_copies_between_views_of_one_tensor_match_numpy(pair):
    buf = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    dst, src = VIEW_PAIRS[pair](devtensor.from_dlpack(buf))
    dst.copy_(src)
    np.testing.assert_array_equal(buf, copied_between_views(pair))
