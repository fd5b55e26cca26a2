"""Issue 15, items 1-4: what a hostile test pass found.

* the exchange-API cache of `from_dlpack` must not keep producer types (and what
  their methods capture) alive;
* fill values: NumPy complex scalars, complex into real dtypes, 0-d arrays and
  tensors, and every float8 encoding against ml_dtypes over a dense sample;
* one dimension limit (64, DLPack import's) for creation, views and indexing;
* fork safety: a fork()ed child copies in parallel after its parent did, and a
  child touching CUDA state inherited from its parent gets a clear error.
"""

import ctypes
import gc
import itertools
import multiprocessing
import os
import sys
import weakref

import pytest

import devtensor
from conftest import FLOAT8_NAMES

np = pytest.importorskip("numpy")

MAX_NDIM = 64


def raw(t):
    """The bytes of a C-contiguous CPU tensor."""
    assert t.is_contiguous()
    return ctypes.string_at(t.data_ptr, t.nbytes) if t.nbytes else b""


def arr(t):
    return np.from_dlpack(t)


# --------------------------------------------------------------------------------------
# 1. The exchange-API cache holds producer types weakly and is bounded
# --------------------------------------------------------------------------------------


def _wrapper_class(payload):
    """A fresh adapter class per call whose methods capture `payload` (a NumPy array)."""

    class Wrapper:
        def __dlpack__(self, **kwargs):
            return payload.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return payload.__dlpack_device__()

    return Wrapper


def test_exchange_cache_does_not_keep_20000_wrapper_classes_alive():
    payload = np.arange(4, dtype=np.float32)
    classes = []
    for _ in range(20_000):
        cls = _wrapper_class(payload)
        t = devtensor.from_dlpack(cls())
        assert t.shape == (4,)
        classes.append(weakref.ref(cls))
        del cls, t
    gc.collect()
    alive = sum(1 for r in classes if r() is not None)
    assert alive == 0, f"{alive} of 20000 producer classes are still alive"


def test_exchange_cache_frees_an_array_captured_by_a_producer_type():
    big = np.ones(1 << 21, dtype=np.float32)  # 8 MiB
    ref = weakref.ref(big)
    cls = _wrapper_class(big)
    t = devtensor.from_dlpack(cls())
    assert t.nbytes == 8 << 20
    del t, cls, big
    gc.collect()
    assert ref() is None, "the 8 MiB array is kept alive by from_dlpack's cache"


def test_exchange_cache_still_finds_tables_after_churn():
    # Our own type has a table: it is found, and the answer stays right while
    # thousands of other types come and go.
    src = devtensor.full(3, 2.0)
    for i in range(300):
        devtensor.from_dlpack(_wrapper_class(np.zeros(1))())
        if i % 50 == 0:
            back = devtensor.from_dlpack(src)
            assert back.data_ptr == src.data_ptr


# --------------------------------------------------------------------------------------
# 2. Scalars
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, dtype",
    [
        (np.complex64(1 - 2j), "complex64"),
        (np.complex128(1 - 2j), "complex128"),
        (np.clongdouble(1 - 2j), "complex128"),
    ],
)
def test_numpy_complex_scalars_keep_their_imaginary_part(value, dtype):
    t = devtensor.full(3, value, dtype=dtype)
    np.testing.assert_array_equal(arr(t), np.full(3, 1 - 2j, dtype=dtype))
    t = devtensor.zeros(3, dtype=dtype)
    t.fill_(value)
    np.testing.assert_array_equal(arr(t), np.full(3, 1 - 2j, dtype=dtype))
    # Inferred: complex, as for a Python complex.
    assert devtensor.full(2, value).dtype == "complex64"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "uint8", "float8_e4m3fn"])
@pytest.mark.parametrize("value", [1 + 2j, np.complex64(1 + 2j), np.clongdouble(0.5j)])
def test_complex_into_real_dtype_is_type_error(dtype, value):
    with pytest.raises(TypeError, match="complex"):
        devtensor.full(2, value, dtype=dtype)
    with pytest.raises(TypeError, match="complex"):
        devtensor.zeros(2, dtype=dtype).fill_(value)


def test_complex_with_zero_imaginary_part_and_bools_as_torch():
    np.testing.assert_array_equal(arr(devtensor.full(2, 2 + 0j, dtype="float32")), [2.0, 2.0])
    np.testing.assert_array_equal(arr(devtensor.full(2, np.complex64(3), dtype="int32")), [3, 3])
    np.testing.assert_array_equal(arr(devtensor.full(2, 2j, dtype="bool")), [True, True])


@pytest.mark.parametrize(
    "value, want, inferred",
    [
        (np.array(2.5), 2.5, "float32"),
        (np.array(7), 7, "int64"),
        (np.array(True), True, "bool"),
        (np.array(1 + 1j, dtype=np.complex64), 1 + 1j, "complex64"),
        (np.float32(0.25), 0.25, "float32"),
        (np.int8(-3), -3, "int64"),
        (np.bool_(True), True, "bool"),
        (np.longdouble(1.5), 1.5, "float32"),
    ],
)
def test_0d_arrays_and_numpy_scalars_are_fill_values(value, want, inferred):
    t = devtensor.full(3, value)
    assert t.dtype == inferred
    np.testing.assert_array_equal(arr(t), np.full(3, want, dtype=inferred))
    dtype = "complex128" if isinstance(want, complex) else "float64"
    t = devtensor.zeros(3, dtype=dtype)
    assert t.fill_(value) is t
    np.testing.assert_array_equal(arr(t), np.full(3, want, dtype=dtype))


def test_0d_torch_tensors_are_fill_values():
    torch = pytest.importorskip("torch")
    t = devtensor.zeros(3, dtype="float32")
    t.fill_(torch.tensor(1.5))
    np.testing.assert_array_equal(arr(t), [1.5] * 3)
    assert devtensor.full(2, torch.tensor(3)).dtype == "int64"
    c = devtensor.full(2, torch.tensor(1 - 1j, dtype=torch.complex64), dtype="complex64")
    np.testing.assert_array_equal(arr(c), [1 - 1j] * 2)
    with pytest.raises(ValueError, match="dimensions"):
        t.fill_(torch.tensor([1.0]))


def test_0d_devtensor_tensors_are_fill_values_through_item():
    # Their own tensors as torch's: the value they hold (item()), its kind and every bit.
    big = devtensor.full((), 2**62 + 1, dtype="int64")
    assert big.item() == 2**62 + 1 and type(big.item()) is int
    assert devtensor.zeros(1, dtype="int64").fill_(big).tolist() == [2**62 + 1]
    assert devtensor.full(2, big).dtype == "int64"
    top = devtensor.full((), 2**64 - 1, dtype="uint64")
    assert devtensor.zeros(1, dtype="uint64").fill_(top).tolist() == [2**64 - 1]
    assert devtensor.full(2, devtensor.full((), True, dtype="bool")).dtype == "bool"
    c = devtensor.full((), 1 - 2j, dtype="complex64")
    assert devtensor.full(2, c).tolist() == [1 - 2j] * 2
    with pytest.raises(TypeError, match="complex"):
        devtensor.zeros(1).fill_(c)
    # item() needs exactly one element, as NumPy's.
    assert devtensor.ones((1, 1)).item() == 1.0
    with pytest.raises(ValueError, match="2 elements"):
        devtensor.ones(2).item()
    with pytest.raises(ValueError, match="dimensions"):
        devtensor.full(2, devtensor.ones(1))


def test_dimensions_out_of_range_are_value_and_index_errors():
    # NumPy's AxisError is both; torch raises IndexError: either handler catches ours.
    t = devtensor.zeros((2, 3))
    assert issubclass(devtensor.AxisError, ValueError) and issubclass(devtensor.AxisError, IndexError)
    for call in (lambda: t.transpose(0, 2), lambda: t.permute(0, 5), lambda: t.transpose(-3, 0)):
        with pytest.raises(devtensor.AxisError, match="out of range"):
            call()
        with pytest.raises(IndexError):
            call()


def test_bools_are_not_sizes_or_dimensions():
    # An int to Python, a mistake to NumPy and torch (TypeError).
    for call in (
        lambda: devtensor.zeros(True),
        lambda: devtensor.zeros((True, 2)),
        lambda: devtensor.empty([2, False]),
        lambda: devtensor.zeros((2, 3)).permute(True, False),
        lambda: devtensor.zeros((2, 3)).reshape(True, 6),
        lambda: devtensor.zeros((2, 3)).reshape((6, True)),
    ):
        with pytest.raises(TypeError, match="bool"):
            call()
    assert devtensor.zeros(np.int64(2)).shape == (2,)  # NumPy ints still are


def test_cpu_0_is_the_cpu_as_in_torch():
    torch = pytest.importorskip("torch")
    for d in ("cpu:0", torch.device("cpu", 0)):
        assert devtensor.empty(2, device=d).device == "cpu"
    with pytest.raises(ValueError):
        devtensor.empty(2, device="cpu:1")  # one CPU: no other index


def test_arrays_with_dimensions_are_not_fill_values():
    with pytest.raises(ValueError, match="dimensions"):
        devtensor.zeros(3).fill_(np.array([1.0]))
    with pytest.raises(ValueError, match="dimensions"):
        devtensor.full(3, np.ones((2, 2)))


def _dense_sample(np_type):
    """Every finite value of the format, the midpoints between neighbours and
    their nearest float32 and float64 neighbours, overflow, specials, and
    log-uniform random values, with both signs."""
    codes = np.arange(256, dtype=np.uint8).view(np_type).astype(np.float64)
    finite = np.unique(np.abs(codes[np.isfinite(codes)]))
    mids = (finite[:-1] + finite[1:]) / 2
    top = finite[-1]
    over = top * np.array([1.01, 1.03, 1.0625, 1.1, 1.125, 1.25, 1.5, 1.75, 2, 4, 1e3])
    base = np.concatenate([finite, mids, over, [top + (top - finite[-2]) / 2]])
    with np.errstate(over="ignore"):
        f32 = base.astype(np.float32)
    near = np.concatenate(
        [
            np.nextafter(f32, np.float32(np.inf)).astype(np.float64),
            np.nextafter(f32, np.float32(0)).astype(np.float64),
            np.nextafter(base, np.inf),
            np.nextafter(base, 0),
        ]
    )
    rng = np.random.default_rng(15)
    lo = np.log2(finite[finite > 0][0]) - 3
    rand = 2.0 ** rng.uniform(lo, np.log2(top) + 1, 3000)
    tiny = [1e-300, 2.0**-149, 2.0**-150, 1e-45, 2.0**-126, 2.0**-127 * 1.5]
    pos = np.concatenate([base, near, rand, tiny])
    pos = pos[np.isfinite(pos)]
    return list(np.concatenate([pos, -pos])) + [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300]


@pytest.mark.parametrize("name", FLOAT8_NAMES)
def test_every_float8_encoding_matches_ml_dtypes_densely(name):
    # A Python float is rounded through float32, as torch does (c10's float8 types
    # are built from a float) and ml_dtypes did for float64 before 0.7, which rounds
    # it directly: the reference is ml_dtypes' rounding of the float32, the same in
    # every version. Except e8m0 of float32 subnormals, where ml_dtypes 0.7 rounds
    # 0x400001 to 2^-127 and 0.6 as torch's conversion (2^-126): there, torch's.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_type = getattr(ml_dtypes, name, None)
    if np_type is None:
        pytest.skip(f"ml_dtypes has no {name}")
    mismatches = []
    sample = _dense_sample(np_type)
    assert len(sample) > 5000
    for v in sample:
        with np.errstate(all="ignore"):
            f = np.array(v, dtype=np.float64).astype(np.float32)
            if name == "float8_e8m0fnu" and 0 < f < np.finfo(np.float32).tiny:
                torch = pytest.importorskip("torch")
                want = int(torch.tensor(f).to(torch.float8_e8m0fnu).view(torch.uint8))
            else:
                want = int(f.astype(np_type).view(np.uint8))
        want_nan = bool(np.isnan(np.array(want, dtype=np.uint8).view(np_type).astype(np.float64)))
        got = raw(devtensor.full((), float(v), dtype=name))[0]
        got_nan = bool(np.isnan(np.array(got, dtype=np.uint8).view(np_type).astype(np.float64)))
        if (got_nan, want_nan) == (True, True) or got == want:
            continue
        mismatches.append((float(v), hex(got), hex(want)))
    assert not mismatches, f"{len(mismatches)} of {len(sample)} differ, e.g. (value, ours, ml_dtypes): {mismatches[:8]}"


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_half_types_round_python_floats_as_torch_does(name):
    # torch rounds a Python float to a half type through float32; so must we, on every
    # platform (half's software from_f64 ignored a double's low mantissa bits: values
    # just above a tie went to even). Ties of the format nudged by float32 and float64
    # ulps, and log-uniform random values.
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_type = ml_dtypes.bfloat16 if name == "bfloat16" else np.float16
    rng = np.random.default_rng(23)
    top = 0x7F7F if name == "bfloat16" else 0x7BFF
    codes = rng.integers(1, top, 1500).astype(np.uint16)
    lo = codes.view(np_type).astype(np.float64)
    hi = (codes + 1).view(np_type).astype(np.float64)
    mid = (lo + hi) / 2
    mid32 = mid.astype(np.float32)
    near = [
        np.nextafter(mid32, np.float32(np.inf)).astype(np.float64),
        np.nextafter(mid32, np.float32(0)).astype(np.float64),
        mid * (1 + 2.0**-40),
        mid * (1 - 2.0**-40),
    ]
    rand = 2.0 ** rng.uniform(-20, 20, 1000)
    sample = np.concatenate([mid, *near, rand])
    sample = np.concatenate([sample, -sample])
    bits = lambda t: int.from_bytes(raw(t), "little")  # noqa: E731
    mismatches = []
    for v in sample.tolist():
        want = int(torch.full((1,), v, dtype=getattr(torch, name)).view(torch.int16)[0]) & 0xFFFF
        if want & 0x7FFF == top + 1:  # inf: torch's one-element full lets it through, its fill_ raises
            with pytest.raises(OverflowError):
                devtensor.full((1,), v, dtype=name)
            continue
        got = bits(devtensor.full((1,), v, dtype=name))
        if got != want:
            mismatches.append((v, hex(got), hex(want)))
    assert not mismatches, f"{len(mismatches)} of {len(sample)} differ, e.g. (value, ours, torch): {mismatches[:8]}"


# --------------------------------------------------------------------------------------
# 3. One dimension limit: 64, the DLPack import limit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [devtensor.empty, devtensor.zeros, devtensor.ones])
def test_creation_refuses_more_than_64_dims(make):
    with pytest.raises(ValueError, match="at most 64"):
        make((1,) * (MAX_NDIM + 1))
    with pytest.raises(ValueError, match="at most 64"):
        devtensor.full((1,) * (MAX_NDIM + 1), 1.0)


def test_views_and_indexing_refuse_more_than_64_dims():
    t = devtensor.zeros((1,) * MAX_NDIM)
    back = devtensor.from_dlpack(t.__dlpack__(max_version=(1, 0)))  # the limit itself exchanges
    assert back.ndim == MAX_NDIM
    assert arr(t).ndim == MAX_NDIM
    with pytest.raises(ValueError, match="at most 64"):
        t[None]
    with pytest.raises(ValueError, match="at most 64"):
        devtensor.zeros(())[(None,) * (MAX_NDIM + 1)]
    assert devtensor.zeros(())[(None,) * MAX_NDIM].ndim == MAX_NDIM
    with pytest.raises(ValueError, match="at most 64"):
        t.reshape((1,) * (MAX_NDIM + 1))
    with pytest.raises(ValueError, match="at most 64"):
        devtensor.zeros(6).reshape((2, 3) + (1,) * (MAX_NDIM - 1))


# --------------------------------------------------------------------------------------
# 4. Fork safety
# --------------------------------------------------------------------------------------

BIG = (2048, 2048)  # 16 MiB of float32: copies run on the thread pool


def _parallel_copies_ok():
    src = devtensor.full(BIG, 1.5)
    out = src.transpose(0, 1).contiguous().clone()
    return bool((arr(out) == 1.5).all())


def test_pool_stats_count_the_parallel_copies():
    names = {"split", "kept_serial", "backed_off", "pool_missed", "share_taken_over", "post_missed",
             "pool_moved", "pool_started", "pool_start_ns", "pool_last_start_ns", "pool_joins"}
    before = devtensor._devtensor._pool_stats()
    assert set(before) == names and all(isinstance(v, int) and v >= 0 for v in before.values())
    assert _parallel_copies_ok()
    after = devtensor._devtensor._pool_stats()
    assert all(after[k] >= before[k] for k in names)
    # Two large copies: each split across the pool or kept serial by a back-off
    # (one CPU: neither, the pool is never used).
    if len(os.sched_getaffinity(0)) > 1:
        assert (after["split"] + after["kept_serial"]) - (before["split"] + before["kept_serial"]) >= 2
    # Split copies either had a pool thread join (and its start time counted) or missed the pool.
    assert after["pool_started"] + after["pool_missed"] <= after["split"]


def _child_copies(queue):
    queue.put(_parallel_copies_ok())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() of a threaded process
def test_forked_child_copies_in_parallel_after_the_parent_did():
    assert _parallel_copies_ok()  # the parent's pool threads exist now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_copies, args=(queue,))
    p.start()
    p.join(timeout=60)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail("the forked child hung in its first parallel copy")
    assert p.exitcode == 0
    assert queue.get(timeout=5) is True
    assert _parallel_copies_ok()  # and the parent's pool still works


def _child_touches_cuda(queue):
    try:
        devtensor.empty(4, device="cuda:0")
    except RuntimeError as e:
        queue.put(str(e))
    else:
        queue.put(None)
    queue.put(_parallel_copies_ok())  # the CPU still works in that child


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_forked_child_touching_inherited_cuda_gets_an_error_not_a_hang():
    # CUDA initialized in the parent: a context, an allocation, a copy.
    t = devtensor.from_dlpack(np.full(4, 1.5, dtype=np.float32)).to("cuda:0")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_touches_cuda, args=(queue,))
    p.start()
    p.join(timeout=60)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail("the forked child hung touching CUDA")
    assert p.exitcode == 0
    msg = queue.get(timeout=5)
    assert msg is not None and "forked subprocess" in msg, msg
    assert queue.get(timeout=5) is True
    np.testing.assert_array_equal(arr(t.to("cpu")), [1.5] * 4)  # the parent's CUDA is unaffected


# --------------------------------------------------------------------------------------
# 7. The Python overhead floor: what the fast paths of empty/zeros/full must not change
# (their speed is measured by bench/python_handoff.py, not here)
# --------------------------------------------------------------------------------------


class ChangingStr:
    """An object whose str() is `first` once, then `then`: a parsed-argument
    cache must not keep its first answer."""

    def __init__(self, first, then):
        self.answers = iter([first])
        self.then = then

    def __str__(self):
        return next(self.answers, self.then)


def test_device_objects_whose_str_changes_are_parsed_each_time():
    dev = ChangingStr("cpu", "no_such_device")
    assert devtensor.empty((2,), device=dev).device == "cpu"
    with pytest.raises(ValueError, match="no_such_device"):
        devtensor.empty((2,), device=dev)


def test_dtype_and_device_strings_built_at_run_time_parse_like_literals():
    for _ in range(100):  # more distinct string objects than the identity cache holds
        name = "".join(["float", "64"])
        dev = "".join(["c", "pu"])
        t = devtensor.empty((3,), dtype=name, device=dev)
        assert (t.dtype, t.device) == ("float64", "cpu")
    with pytest.raises(TypeError, match="float65"):
        devtensor.empty((3,), dtype="".join(["float", "65"]))


@pytest.mark.parametrize(
    "dtype, value",
    [("uint8", 7), ("int16", -2), ("float32", 1.5), ("float64", -0.25), ("complex64", 1 + 2j),
     ("complex128", -3 - 4j), ("bool", True), ("int64", 0x0102030405060708)],
)
@pytest.mark.parametrize("n", [0, 1, 3, 17, 100, 5000, 70000])
def test_small_and_large_contiguous_fills_hold_every_value(dtype, value, n):
    np = pytest.importorskip("numpy")
    got = np.from_dlpack(devtensor.full((n,), value, dtype=dtype))
    np.testing.assert_array_equal(got, np.full((n,), value, dtype=dtype))
    z = np.from_dlpack(devtensor.zeros((n,), dtype=dtype))
    assert not z.any()


def test_reused_small_blocks_are_aligned_and_counted():
    from devtensor._devtensor import _live_cpu_allocations

    before = _live_cpu_allocations()
    addrs = set()
    for n in [1, 16, 1000, 1024, 4096, 16384, 1024]:
        t = devtensor.empty((n,), dtype="float32")
        assert t.data_ptr % 256 == 0
        addrs.add(t.data_ptr)
        assert _live_cpu_allocations() == before + 1
        del t
        assert _live_cpu_allocations() == before
    assert len(addrs) < 7, "freed small blocks are reused"


# --------------------------------------------------------------------------------------
# 8. Argument conversion: scalar types as dtypes, shapes, what the dtype cache keeps
# --------------------------------------------------------------------------------------

# Python's scalar types and NumPy's C-named ones (whose __name__ is no dtype name:
# longlong, or names its size: intc is "int32").
SCALAR_TYPES = [float, int, complex, bool, np.longlong, np.ulonglong, np.intc, np.uintc, np.short,
                np.ushort, np.byte, np.ubyte, np.half, np.single, np.double, np.csingle, np.cdouble,
                np.intp, np.uintp, np.int_, np.uint, np.bool_]


@pytest.mark.parametrize("scalar_type", SCALAR_TYPES, ids=lambda t: t.__name__)
def test_scalar_types_are_the_dtype_numpy_gives_them(scalar_type):
    want = np.dtype(scalar_type).name  # float64 for float, int64 for int and longlong, ...
    for make in (devtensor.empty, devtensor.zeros, devtensor.ones):
        assert make(2, dtype=scalar_type).dtype == want
        assert make(2, dtype=scalar_type).dtype == want  # and again, remembered
    assert devtensor.full(2, 1, dtype=scalar_type).dtype == want
    assert devtensor.empty(2, dtype=np.dtype(scalar_type)).dtype == want


def test_python_scalar_types_are_the_dtype_torch_gives_them():
    torch = pytest.importorskip("torch")
    for scalar_type in (float, int, complex, bool):
        want = str(torch.empty(2, dtype=scalar_type).dtype).removeprefix("torch.")
        assert devtensor.empty(2, dtype=scalar_type).dtype == want
    # The names stay torch's: "float" is torch.float (float32), as "int" is torch.int.
    assert devtensor.empty(2, dtype="float").dtype == "float32"


@pytest.mark.parametrize("scalar_type", [np.longdouble, np.clongdouble, np.str_, np.object_, np.void])
def test_numpy_scalar_types_without_a_tensor_dtype_are_type_errors(scalar_type):
    with pytest.raises(TypeError):
        devtensor.empty(2, dtype=scalar_type)


def test_byte_swapped_numpy_dtypes_are_type_errors():
    # ">f4" is named "float32" too, but its bytes are not a native float32's.
    swapped = np.dtype("float32").newbyteorder()
    with pytest.raises(TypeError, match="byte order"):
        devtensor.empty(2, dtype=swapped)
    assert devtensor.empty(2, dtype=np.dtype("=f4")).dtype == "float32"
    assert devtensor.empty(2, dtype=np.dtype("u1").newbyteorder()).dtype == "uint8"  # one byte: no order


class Endless:
    """An iterator without end (as `itertools.repeat(1)`) that counts the items read;
    past 1000 it raises rather than let a reader grow a shape until memory runs out."""

    def __init__(self):
        self.read = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.read += 1
        if self.read > 1000:
            raise RuntimeError("read 1000 items of an endless shape")
        return 1


class Ones:
    """A sequence (`__len__`, `__getitem__`) of `n` ones that counts the items read."""

    def __init__(self, n):
        self.n, self.read = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.read += 1
        if self.read > 1000:
            raise RuntimeError("read 1000 items of a shape")
        return 1


@pytest.mark.parametrize("make", [devtensor.empty, devtensor.zeros, devtensor.ones, lambda s: devtensor.full(s, 1)])
def test_iterators_sets_and_mappings_are_not_shapes(make):
    # As NumPy: an iterator may have no end, a set's order is not the caller's.
    endless = Endless()
    with pytest.raises(TypeError, match="sequence of ints"):
        make(endless)
    assert endless.read == 0
    for shape in (itertools.repeat(1), iter([2, 3]), (n for n in (2, 3)), {5, 2}, frozenset([4]), {2: 3}):
        with pytest.raises(TypeError, match="sequence of ints"):
            make(shape)


def test_shapes_are_read_up_to_the_dimension_limit_only():
    long = Ones(10**9)
    with pytest.raises(ValueError, match="at most 64"):
        devtensor.empty(long)
    assert long.read == 0
    over = Ones(MAX_NDIM + 1)
    with pytest.raises(ValueError, match="at most 64"):
        devtensor.zeros(over)
    assert over.read == 0
    for shape in ([1] * 10**6, (1,) * 10**6):
        with pytest.raises(ValueError, match="at most 64"):
            devtensor.empty(shape)
    assert devtensor.empty(Ones(MAX_NDIM)).shape == (1,) * MAX_NDIM


def test_sequences_of_ints_are_shapes():
    assert devtensor.empty(Ones(3)).shape == (1, 1, 1)
    assert devtensor.empty(range(2, 5)).shape == (2, 3, 4)
    assert devtensor.zeros(np.array([2, 3])).shape == (2, 3)
    assert devtensor.zeros(np.array(4)).shape == (4,)  # 0-d: an int
    assert devtensor.full(np.array([], dtype=np.int64), 1.0).shape == ()
    with pytest.raises(TypeError):
        devtensor.empty(np.array([[2, 3]]))  # a dimension must be an int
    torch = pytest.importorskip("torch")
    assert devtensor.empty(torch.Size([2, 3])).shape == (2, 3)
    assert devtensor.empty(torch.zeros(2, 3).shape).shape == (2, 3)


class Named:
    """A dtype-like object by its `.name`, which may change."""

    def __init__(self, name):
        self.name = name


def test_dtype_objects_whose_name_or_str_changes_are_parsed_each_time():
    named = Named("float32")
    assert devtensor.empty(2, dtype=named).dtype == "float32"
    named.name = "int8"
    assert devtensor.empty(2, dtype=named).dtype == "int8"
    changing = ChangingStr("float32", "no_such_dtype")
    assert devtensor.empty(2, dtype=changing).dtype == "float32"
    with pytest.raises(TypeError, match="no_such_dtype"):
        devtensor.empty(2, dtype=changing)
    # A class made at run time can be renamed too.
    cls = type("float32", (), {})
    assert devtensor.empty(2, dtype=cls).dtype == "float32"
    cls.__name__ = "int16"
    assert devtensor.empty(2, dtype=cls).dtype == "int16"


def test_the_dtype_cache_keeps_no_object_alive():
    for make in (lambda: Named("float16"), lambda: type("float32", (), {}),
                 lambda: np.dtype("float32", metadata={"made": "per call"})):
        refs = []
        for _ in range(100):  # more than the cache holds
            obj = make()
            before = sys.getrefcount(obj)
            devtensor.empty(1, dtype=obj)
            assert sys.getrefcount(obj) == before
            try:
                refs.append(weakref.ref(obj))
            except TypeError:  # NumPy dtypes take no weak references
                pass
            del obj
        gc.collect()
        assert not any(r() is not None for r in refs)


class HugeLen:
    """A sequence claiming 2**62 items."""

    def __len__(self):
        return 2**62

    def __getitem__(self, i):
        raise IndexError(i)


@pytest.mark.parametrize("op", ["permute", "reshape"])
def test_dims_sequences_are_read_up_to_the_dimension_limit_only(op):
    # A whole sequence was read before the limit was checked: permute(range(2**70))
    # until memory ran out (then an abort), a len() of 2**62 a Rust panic
    # (capacity overflow), a long sequence to its end.
    t = devtensor.zeros((2, 3))
    f = getattr(t, op)
    with pytest.raises(OverflowError):
        f(range(2**70))  # no len() (past ssize_t): nothing is read
    for dims in (range(2**62), HugeLen(), Ones(10**9), Ones(MAX_NDIM + 1)):
        with pytest.raises(ValueError, match="at most 64"):
            f(dims)
        assert getattr(dims, "read", 0) == 0
    endless = Endless()
    with pytest.raises(TypeError):
        f(endless)
    assert endless.read == 0
    with pytest.raises(ValueError, match="at most 64"):
        f(*([1] * (MAX_NDIM + 1)))
    assert t.permute(range(1, -1, -1)).shape == (3, 2) and t.reshape(range(6, 7)).shape == (6,)


def test_empty_views_with_negative_strides_index_like_numpy():
    # An imported empty view whose stride is negative (NumPy's a[::-1, 4:]), and
    # an empty view too long to address: indexing moves no start, as NumPy's.
    a = np.zeros((3, 4))[::-1, 4:]
    t = devtensor.from_dlpack(a)
    assert t[1].shape == a[1].shape == (0,) and t[-1].shape == (0,)
    assert t[1:].shape == a[1:].shape and t[::-1].shape == a[::-1].shape
    assert [r.shape for r in t] == [r.shape for r in a]
    z = devtensor.empty((2**62, 0))
    assert z[-1].shape == (0,) and z[2**61:].shape == (2**62 - 2**61, 0)


class RaisingIndex:
    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


class FloatIndex:
    def __index__(self):
        return 1.5


def test_errors_of_index_methods_reach_the_caller_as_raised():
    # A user's __index__ that raises (KeyboardInterrupt included) is not
    # reworded into an OverflowError, IndexError or TypeError of ours; one that
    # returns a float is Python's TypeError (operator.index's) as a value.
    t = devtensor.zeros((3, 3), dtype="int32")
    calls = [
        lambda r: devtensor.full((2,), r),
        lambda r: t.fill_(r),
        lambda r: t[r],
        lambda r: t[1, r],
        lambda r: devtensor.zeros(3).__dlpack__(stream=r),
    ]
    for call in calls:
        for exc in (KeyboardInterrupt("k"), ZeroDivisionError("z")):
            with pytest.raises(type(exc)):
                call(RaisingIndex(exc))
        # An index that is no integer is NumPy's IndexError where it indexes.
        with pytest.raises(IndexError if call in calls[2:4] else TypeError):
            call(FloatIndex())
    with pytest.raises(IndexError, match="index-sized"):
        t[2**70]


def test_a_stream_past_64_bits_is_a_value_error_not_a_type_error():
    # torch, NumPy and CuPy read a TypeError of __dlpack__ as "an old producer".
    for s in (2**64, 2**70, -(2**63) - 1):
        with pytest.raises(ValueError, match="64 bits"):
            devtensor.zeros(3).__dlpack__(stream=s, max_version=(1, 0))


def test_repr_lets_keyboard_interrupt_through():
    # The values' formatter raising KeyboardInterrupt (a signal while repr
    # runs) reaches the caller; other errors still leave shape, dtype and device.
    import devtensor._format as fmt

    t = devtensor.ones((2, 2))
    real = fmt.tensor_repr
    try:
        for exc, passes in ((KeyboardInterrupt(), True), (MemoryError(), True), (RuntimeError("gone"), False)):

            def broken(_t, exc=exc):
                raise exc

            fmt.tensor_repr = broken
            if passes:
                with pytest.raises(type(exc)):
                    repr(t)
            else:
                assert "values unavailable: RuntimeError: gone" in repr(t)
    finally:
        fmt.tensor_repr = real
    assert repr(t).startswith("tensor(")


def test_failed_fast_calls_free_their_error_messages():
    # The fast-call entry points (empty, zeros, ones, full, __dlpack__) held
    # each raised message until PyO3's next attach: 200,000 failures kept 19 MiB.
    t = devtensor.zeros(3)
    for call in (lambda: devtensor.empty((-1,)), lambda: devtensor.zeros((1,), dtype="nope"),
                 lambda: t.__dlpack__(stream=5)):
        try:
            call()
        except (ValueError, TypeError, BufferError) as e:
            held = sys.getrefcount(e.args[0])  # `args` and the call's argument
        assert held == 2


def test_0d_integer_tensors_are_indices_and_in_tests_values():
    # operator.index of a 0-d integer tensor (NumPy's 0-d arrays, torch's
    # tensors): list indices, shapes; `in` compares values (it compared views
    # by identity: 0.0 in zeros(3) was False).
    i = devtensor.full((), 2, dtype="int64")
    assert [10, 11, 12][i] == 12 and devtensor.zeros(i).shape == (2,)
    assert devtensor.zeros((5,))[i].shape == ()
    for bad in (devtensor.full((), 2.0), devtensor.full((1,), 2, dtype="int64"), devtensor.full((), True)):
        with pytest.raises(TypeError):
            [1, 2, 3][bad]
    x = devtensor.from_dlpack(np.array([[1.5, 2.0], [np.nan, -3.0]]))
    assert 2 in x and 2.0 in x and -3 in x and 1.5 + 0j in x and np.float32(1.5) in x
    assert 0.0 not in x and float("nan") not in x
    assert 0.0 in devtensor.zeros(3) and 1 not in devtensor.zeros(3)
    assert True in devtensor.full((), 1, dtype="uint8")
    with pytest.raises(TypeError, match="not a str"):
        "a" in x
    with pytest.raises(TypeError, match="not a tensor"):
        x in x
    # 0-d arrays hold a number, as NumPy and torch compare them; errors name no fill.
    assert np.array(1.5) in x and np.array(7) not in x
    with pytest.raises(ValueError, match="^expected a number .* not 1 dimensions"):
        np.array([1.0]) in x
    with pytest.raises(TypeError, match="^expected a number, not <class 'object'>"):
        object() in x


def test_in_rounds_python_numbers_to_the_dtype_as_numpy_and_torch():
    # A Python number of the tensor's kind or lower is rounded to the dtype
    # before comparing (NEP 50, torch's wrapped scalars): it compared exactly,
    # and 0.1 was not found in a float32 tensor holding 0.1.
    torch = pytest.importorskip("torch")
    cases = [  # value, dtype, the tensor's elements, found (NumPy's and torch's answer)
        (0.1, "float32", [0.1, 1], True), (0.1, "float16", [0.1], True), (0.1, "bfloat16", [2, 0.1], True),
        (16777217, "float32", [16777216.0], True), (0.1 + 0.2j, "complex64", [0.1 + 0.2j], True),
        (float(2**53), "int64", [3, 2**53 + 1], True), (0.5, "int32", [0, 1], False), (2.0, "int32", [2], True),
        (True, "int32", [1], True), (1 + 0j, "int16", [1], True), (70000, "float16", [65504.0], False),
        # Ints past the dtype's range equal nothing (NumPy 2; torch wraps 300 to 44).
        (300, "uint8", [44], False), (-1, "uint8", [255], False), (2**200, "int64", [0], False),
        # Complex keys against real elements: the real part, rounded, where the imaginary one is 0.
        (0.1 + 0j, "float32", [0.1], True), (0.1 + 1j, "float32", [0.1], False), (2 + 0j, "int16", [2], True),
        # Past a float dtype's range: infinity, as both convert it.
        (70000, "float16", [float("inf")], True), (2**200, "float32", [float("inf")], True),
        (-1e300, "bfloat16", [float("-inf")], True), (1e300 + 0j, "complex64", [complex("inf")], True),
    ]
    for value, dtype, elements, found in cases:
        t = devtensor.from_dlpack(torch.tensor(elements, dtype=getattr(torch, dtype)))
        assert (value in t) == found, (value, dtype, elements)
    assert 0.1 in devtensor.full((2,), 0.1) and 16777217 in devtensor.full((1,), 16777216.0)
    assert 2**200 in devtensor.full((1,), float(2**200), dtype="float64")
    # NumPy scalars keep their own type: compared in the wider one, as NumPy does.
    assert np.float32(0.1) not in devtensor.full((2,), 0.1, dtype="float64")
    assert np.float32(0.1) in devtensor.full((2,), 0.1, dtype="float32")
    # np.float64 and np.complex128 subclass Python's float and complex, but are NumPy's own.
    assert np.float64(0.1) not in devtensor.full((2,), 0.1, dtype="float32")
    assert np.complex128(0.1 + 0.1j) not in devtensor.full((2,), 0.1 + 0.1j, dtype="complex64")
    assert 10**400 in devtensor.full((1,), float("inf"), dtype="float64")


def test_fill_takes_index_objects_refuses_overflow_and_fills_expanded_views():
    class Idx:
        def __index__(self):
            return 5

    # Objects with only __index__ (the stubs' SupportsIndex): PyO3's 128-bit
    # extraction shifted the object itself and raised a TypeError about `>>`.
    assert devtensor.full(2, Idx(), dtype="int32").tolist() == [5, 5]
    assert devtensor.zeros(2, dtype="int64").fill_(Idx()).tolist() == [5, 5]
    # A finite value past a float dtype's range: OverflowError (torch's fill_
    # raises), not inf; inf itself and values rounding to the largest are kept.
    for value, dtype in ((70000, "float16"), (1e300, "float32"), (3.5e38, "bfloat16"), (1e39 + 0j, "complex64")):
        with pytest.raises(OverflowError):
            devtensor.full(2, value, dtype=dtype)
        with pytest.raises(OverflowError):
            devtensor.zeros(2, dtype=dtype).fill_(value)
    assert devtensor.full(1, 65519.0, dtype="float16").tolist() == [65504.0]
    assert devtensor.full(1, float("inf"), dtype="float16").tolist() == [float("inf")]
    # Ints round once into float32, as torch's full.
    v = 2**60 + 2**36 + 1
    assert devtensor.full(1, v, dtype="float32").tolist() == [float(2**60 + 2**37)]
    # An expanded view (stride 0) is filled, as torch fills one; copies into it stay refused.
    torch = pytest.importorskip("torch")
    base = torch.zeros(2)
    e = devtensor.from_dlpack(base[:1].expand(3))
    e.fill_(1.5)
    assert base.tolist() == [1.5, 0.0] and e.tolist() == [1.5] * 3
    rows = torch.zeros(2, 1)
    grid = devtensor.from_dlpack(rows.expand(2, 4))
    grid.fill_(7)
    assert grid.tolist() == [[7.0] * 4] * 2 and rows.tolist() == [[7.0], [7.0]]
    with pytest.raises(ValueError, match="overlaps itself"):
        e.copy_(devtensor.zeros(3))


def test_tensors_take_weak_references():
    t = devtensor.zeros(3)
    r = weakref.ref(t)
    assert r() is t
    del t
    gc.collect()
    assert r() is None


def test_peak_reserved_never_falls():
    before = devtensor.memory_stats("cpu")["peak_reserved_bytes"]
    a = devtensor.empty((64 << 20,), dtype="uint8")
    del a
    b = devtensor.empty((128 << 20,), dtype="uint8")
    del b
    peak = devtensor.memory_stats("cpu")["peak_reserved_bytes"]
    assert peak >= max(before, 128 << 20)
    devtensor.empty_cache()
    assert devtensor.memory_stats("cpu")["peak_reserved_bytes"] >= peak
