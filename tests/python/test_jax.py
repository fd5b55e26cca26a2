"""Round trips with JAX on CPU. JAX may copy (64-bit types without x64, unaligned data),
so values are always checked and the data pointer only where JAX keeps the buffer."""

import ctypes
import gc

import pytest

import devtensor

np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

JAX_DTYPES = [
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
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
]
X64 = bool(jax.config.read("jax_enable_x64"))


@pytest.fixture(autouse=True)
def _jax_on_cpu():
    """These are the CPU round trips: where JAX also sees a GPU, it would put new arrays there."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield
WIDE = {"int64", "uint64", "float64", "complex128"}


def fill_pattern(t):
    """Writes a recognisable, valid byte pattern into a contiguous tensor of any dtype."""
    n = t.nbytes
    if t.dtype == "bool":
        raw = (np.arange(n) % 3 == 0).astype(np.uint8)
    else:
        raw = (np.arange(n) * 37 % 97).astype(np.uint8)
        if t.dtype.startswith("float8"):
            raw &= 0x3F  # finite values only
    ctypes.memmove(t.data_ptr, raw.ctypes.data, n)


def bytes_of(t):
    return ctypes.string_at(t.data_ptr, t.nbytes)


def jax_bytes(j):
    return np.asarray(j).view(np.uint8).tobytes()


@pytest.mark.parametrize("name", JAX_DTYPES)
def test_to_jax_every_dtype(name):
    t = devtensor.empty((3, 4), dtype=name)
    if name in WIDE:
        np.from_dlpack(t)[...] = np.arange(12).reshape(3, 4) * 3 - 5 * (name != "uint64")
    else:
        fill_pattern(t)
    j = jnp.from_dlpack(t)
    assert j.shape == (3, 4)
    if name in WIDE and not X64:
        # JAX canonicalises to 32 bits (a copy): compare values through NumPy.
        np.testing.assert_array_equal(np.asarray(j), np.from_dlpack(t).astype(j.dtype))
        return
    assert str(j.dtype) == name
    expect = bytes_of(t)
    assert jax_bytes(j) == expect
    if j.unsafe_buffer_pointer() == t.data_ptr:
        # Zero-copy: the buffer stays valid after our tensor is dropped.
        del t
        gc.collect()
        assert jax_bytes(j) == expect


def test_to_jax_zero_copy_float32():
    t = devtensor.ones((8, 8))
    j = jnp.from_dlpack(t)
    assert j.unsafe_buffer_pointer() == t.data_ptr  # aligned 32-bit data: no copy
    assert float(j.sum()) == 64.0


@pytest.mark.parametrize(
    "make, compact",
    [
        (lambda x: x.transpose(0, 1), True),
        (lambda x: x.permute(2, 0, 1) if x.ndim == 3 else x.transpose(0, 1), True),
        (lambda x: x[1], True),
        (lambda x: x[1:3], True),
        (lambda x: x[None], True),
        (lambda x: x[:, ::2], False),
        (lambda x: x[::-1], False),
    ],
    ids=["T", "permute", "row", "rows", "newaxis", "step", "flip"],
)
def test_views_to_jax(make, compact):
    t = devtensor.empty((4, 6))
    np.from_dlpack(t)[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = make(t)
    expect = np.from_dlpack(v).copy()
    if compact:
        j = jnp.from_dlpack(v)
        np.testing.assert_array_equal(np.asarray(j), expect)
    else:
        # JAX accepts only compact strides (transpositions); anything else must be refused
        # cleanly (and the export released: see the autouse leak check) or read correctly.
        try:
            j = jnp.from_dlpack(v)
        except (RuntimeError, BufferError, ValueError):
            return
        np.testing.assert_array_equal(np.asarray(j), expect)


def test_jax_dlpack_module_function():
    j = jax.dlpack.from_dlpack(devtensor.full(3, 2.0))
    np.testing.assert_array_equal(np.asarray(j), [2.0, 2.0, 2.0])


@pytest.mark.parametrize("copy", [None, True])
def test_jnp_asarray_and_array(copy):
    """jnp.asarray / jnp.array take a tensor (JAX's __jax_array__ hook): NumPy 2.4 refuses a
    string .dtype with a ValueError that JAX does not catch, so without the hook they raise."""
    t = devtensor.empty((3, 4))
    np.from_dlpack(t)[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    j = jnp.asarray(t, copy=copy)
    assert isinstance(j, jax.Array) and j.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(j), np.arange(12).reshape(3, 4))
    if copy is None and j.unsafe_buffer_pointer() == t.data_ptr:
        np.from_dlpack(t)[0, 0] = 7  # shared: JAX's zero-copy import of aligned CPU data
        assert float(j[0, 0]) == 7
    if copy:
        assert j.unsafe_buffer_pointer() != t.data_ptr
    np.testing.assert_array_equal(np.asarray(jnp.array(t)), np.asarray(j))


@pytest.mark.parametrize(
    "make, dense",
    [
        (lambda x: x[:, ::2], False),
        (lambda x: x[::-1], False),
        (lambda x: x[:, 1:3], False),
        (lambda x: x.transpose(0, 1), True),
        (lambda x: x[:, None], True),
        (lambda x: x[0:2], True),
        (lambda x: x[1:3, None], True),
    ],
    ids=["step", "flip", "cols", "T", "newaxis", "rows", "unaligned"],
)
def test_jnp_asarray_views(make, dense):
    """Transposes of dense layouts go to JAX as they are (shared where JAX keeps the buffer);
    layouts XLA's import refuses (steps, flips, gaps between rows) are copied first."""
    t = devtensor.empty((4, 6))
    np.from_dlpack(t)[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = make(t)
    j = jnp.asarray(v)
    np.testing.assert_array_equal(np.asarray(j), np.from_dlpack(v))
    if dense and v.data_ptr % 64 == 0:
        assert j.unsafe_buffer_pointer() == v.data_ptr  # aligned 32-bit data: JAX keeps it
    elif dense:
        assert v.data_ptr % 64 != 0  # only the unaligned case: JAX may copy it
    if not dense:
        assert j.unsafe_buffer_pointer() != v.data_ptr


def test_jnp_asarray_broadcast_0d_and_empty():
    b = devtensor.from_dlpack(np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3)))
    assert b.strides == (0, 1)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(b)), np.broadcast_to(np.arange(3), (4, 3)))
    assert float(jnp.asarray(devtensor.full((), 2.5))) == 2.5
    assert jnp.asarray(devtensor.zeros((0, 3))).shape == (0, 3)


def test_jnp_asarray_every_dtype():
    for name in JAX_DTYPES:
        t = devtensor.zeros((2, 3), dtype=name)
        j = jnp.asarray(t)
        assert j.shape == (2, 3)
        assert str(j.dtype) == name or (name in WIDE and not X64)


def test_0d_and_empty_to_jax():
    assert float(jnp.from_dlpack(devtensor.full((), 1.5))) == 1.5
    assert jnp.from_dlpack(devtensor.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("name", ["bool", "int8", "int32", "uint16", "float16", "bfloat16", "float32", "complex64"])
def test_from_jax(name):
    j = jnp.arange(12).reshape(3, 4).astype(name)
    t = devtensor.from_dlpack(j)
    assert t.dtype == name
    assert t.shape == (3, 4)
    assert t.data_ptr == j.unsafe_buffer_pointer()
    back = jnp.from_dlpack(t.contiguous())
    np.testing.assert_array_equal(np.asarray(back), np.asarray(j))


def test_from_jax_views_and_scalars():
    j = jnp.arange(12.0).reshape(3, 4).T  # JAX materialises transposes
    t = devtensor.from_dlpack(j)
    np.testing.assert_array_equal(np.from_dlpack(t), np.asarray(j))
    s = devtensor.from_dlpack(jnp.float32(3.0))
    assert s.shape == () and np.from_dlpack(s)[()] == 3.0
    e = devtensor.from_dlpack(jnp.zeros((0, 3)))
    assert e.shape == (0, 3)


def test_from_jax_outlives_jax_array():
    j = jnp.full((1000,), 4.0)
    t = devtensor.from_dlpack(j)
    del j
    gc.collect()
    jnp.full((1000,), 1.0).block_until_ready()
    assert (np.from_dlpack(t) == 4.0).all()


def test_jax_deleters(live):
    t = devtensor.ones(32)
    n0 = live()
    for _ in range(200):
        j = jnp.from_dlpack(t)
        del j
    gc.collect()
    assert live() == n0
