"""Zero-copy round trips with PyTorch on CPU (the CUDA wheel works CPU-only).

torch 2.10+ exposes `torch.Tensor.__dlpack_c_exchange_api__`; our consumer tries it first.
"""

import gc
import warnings

import pytest

import devtensor

np = pytest.importorskip("numpy")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the CUDA wheel may warn about a missing driver
    torch = pytest.importorskip("torch")

# devtensor name -> torch dtype (every dtype both support)
TORCH_DTYPES = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
for _name in [
    "uint16",
    "uint32",
    "uint64",
    "complex32",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]:
    if hasattr(torch, _name):
        TORCH_DTYPES[_name] = getattr(torch, _name)


def random_bits(shape, dtype):
    """A torch tensor of `dtype` holding arbitrary (but valid where it matters) bit patterns."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, dtype=torch.uint8).bool()
    n = int(np.prod(shape)) if shape else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def bits(x):
    """The bytes of a torch tensor's elements in logical order."""
    x = x.contiguous()
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


class NoExchange:
    """Hides torch's exchange API so that our consumer must call `__dlpack__`."""

    def __init__(self, x):
        self.x = x
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        return self.x.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def test_torch_has_exchange_api(dlp):
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no __dlpack_c_exchange_api__")
    api = dlp.exchange_api(torch.Tensor)
    assert api.version.major == 1


# --------------------------------------------------------------------------------------
# devtensor -> torch
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_to_torch_every_dtype(name):
    src = random_bits((3, 5), TORCH_DTYPES[name])
    t = devtensor.empty((3, 5), dtype=name)
    t.copy_(src)  # through DLPack
    x = torch.from_dlpack(t)
    assert x.dtype == TORCH_DTYPES[name]
    assert x.shape == (3, 5)
    assert x.stride() == (5, 1)
    assert x.data_ptr() == t.data_ptr
    assert x.device.type == "cpu"
    assert bits(x) == bits(src)


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_from_torch_every_dtype(name):
    x = random_bits((4, 3), TORCH_DTYPES[name])
    t = devtensor.from_dlpack(x)
    assert t.dtype == name
    assert t.shape == (4, 3) and t.strides == (3, 1)
    assert t.data_ptr == x.data_ptr()
    assert bits(torch.from_dlpack(t)) == bits(x)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "bool"])
def test_from_torch_dunder_path(name):
    if name not in TORCH_DTYPES:
        pytest.skip(f"torch has no {name}")
    x = random_bits((2, 6), TORCH_DTYPES[name])
    w = NoExchange(x)
    t = devtensor.from_dlpack(w)
    assert w.calls and w.calls[0].get("max_version") == (1, 3)
    assert "stream" not in w.calls[0] or w.calls[0]["stream"] is None
    assert t.data_ptr == x.data_ptr()
    assert t.dtype == name
    assert bits(torch.from_dlpack(t)) == bits(x)


def test_writes_visible_both_ways():
    t = devtensor.zeros((3, 4))
    x = torch.from_dlpack(t)
    x[1, 2] = 5.0
    assert np.from_dlpack(t)[1, 2] == 5.0
    t[0].fill_(7.0)
    assert (x[0] == 7.0).all()

    y = torch.zeros(4, 3, dtype=torch.float64)
    u = devtensor.from_dlpack(y)
    u[:, 1].fill_(2.0)
    assert (y[:, 1] == 2.0).all()
    y[3, 0] = -1.0
    assert np.from_dlpack(u)[3, 0] == -1.0


VIEWS = {
    "T": lambda x: x.transpose(0, 1),
    "slice": lambda x: x[1:, 1:4],
    "step": lambda x: x[::2, 1::3],
    "row": lambda x: x[2],
    "col": lambda x: x[:, 3],
    "scalar": lambda x: x[1, 1],
    "newaxis": lambda x: x[None, :, 2:],
    "permute3": lambda x: x.reshape(2, 3, 6).permute(2, 0, 1),
    "empty": lambda x: x[2:2],
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_views_to_torch(view):
    t = devtensor.empty((6, 6), dtype="float32")
    np.from_dlpack(t)[...] = np.arange(36, dtype=np.float32).reshape(6, 6)
    ref = torch.arange(36, dtype=torch.float32).reshape(6, 6)
    v = VIEWS[view](t)
    x = torch.from_dlpack(v)
    expect = VIEWS[view](ref)
    assert x.shape == expect.shape
    assert torch.equal(x, expect)
    if x.numel():
        assert x.data_ptr() == v.data_ptr
        assert [s for s, n in zip(x.stride(), x.shape) if n > 1] == [s for s, n in zip(v.strides, v.shape) if n > 1]


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("path", ["exchange", "dunder"])
def test_views_from_torch(view, path):
    ref = torch.arange(36, dtype=torch.float32).reshape(6, 6)
    x = VIEWS[view](ref)
    t = devtensor.from_dlpack(x if path == "exchange" else NoExchange(x))
    assert t.shape == tuple(x.shape)
    if x.numel():
        assert t.data_ptr == x.data_ptr()
        assert [s for s, n in zip(t.strides, t.shape) if n > 1] == [s for s, n in zip(x.stride(), x.shape) if n > 1]
    np.testing.assert_array_equal(np.from_dlpack(t), x.numpy())


def test_expanded_torch_tensor_zero_strides():
    x = torch.arange(3.0).reshape(3, 1).expand(3, 4)
    t = devtensor.from_dlpack(x)
    assert t.shape == (3, 4)
    np.testing.assert_array_equal(np.from_dlpack(t.contiguous()), x.numpy())


def test_negative_strides_to_torch():
    # torch cannot represent negative strides: it must refuse (pytorch#188023 used to abort)
    # and must still release our export (checked by the autouse leak check).
    if torch.__version__ < "2.13":  # TorchVersion compares as a version
        pytest.skip(f"SKIP: torch {torch.__version__} aborts the process on negative strides "
                    "(pytorch#188023, fixed after 2.12)")
    t = devtensor.zeros((3, 4))
    with pytest.raises((RuntimeError, BufferError, ValueError)):
        torch.from_dlpack(t[::-1])
    with pytest.raises((RuntimeError, BufferError, ValueError)):
        torch.from_dlpack(t[:, ::-2])
    # A contiguous copy works.
    x = torch.from_dlpack(t[::-1].contiguous())
    assert x.shape == (3, 4)


def test_0d_and_empty():
    t = devtensor.full((), 3.0)
    x = torch.from_dlpack(t)
    assert x.shape == () and x.item() == 3.0 and x.data_ptr() == t.data_ptr
    e = torch.from_dlpack(devtensor.zeros((0, 3)))
    assert e.shape == (0, 3)
    u = devtensor.from_dlpack(torch.tensor(2.5))
    assert u.shape == () and np.from_dlpack(u)[()] == 2.5
    v = devtensor.from_dlpack(torch.zeros(4, 0))
    assert v.shape == (4, 0)


def test_torch_copy_keyword():
    t = devtensor.ones(4)
    x = torch.from_dlpack(t, copy=True)
    assert x.data_ptr() != t.data_ptr
    assert torch.equal(x, torch.ones(4))


def test_devtensor_copy_keyword_with_torch_source():
    x = torch.arange(5.0)
    t = devtensor.from_dlpack(x, copy=True)
    assert t.data_ptr != x.data_ptr()
    np.testing.assert_array_equal(np.from_dlpack(t), x.numpy())


def test_read_only_tensor_to_torch():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = devtensor.from_dlpack(a)
    # torch asks for a versioned capsule, so the READ_ONLY flag reaches it; torch may accept
    # it (with a warning) or refuse it, but must not get a legacy capsule for read-only data.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            x = torch.from_dlpack(t)
        except (BufferError, RuntimeError):
            return
    assert x.data_ptr() == a.ctypes.data
    assert torch.equal(x, torch.from_numpy(a.copy()))


def test_refcounts_and_deleters(rc, live):
    t = devtensor.zeros(8)
    r0, n0 = rc(t), live()
    x = torch.from_dlpack(t)
    assert live() == n0 + 1
    del x
    assert live() == n0
    assert rc(t) == r0

    y = torch.zeros(8)
    ry = rc(y)
    u = devtensor.from_dlpack(y)
    v = devtensor.from_dlpack(NoExchange(y))
    del u, v
    assert rc(y) == ry


def test_many_round_trips(live):
    t = devtensor.zeros(16)
    n0 = live()
    for _ in range(1000):
        x = torch.from_dlpack(t)
        u = devtensor.from_dlpack(x)
        del x, u
    assert live() == n0


def test_torch_memory_outlives_torch_tensor():
    x = torch.full((1000,), 4.0)
    t = devtensor.from_dlpack(x)
    del x
    gc.collect()
    torch.full((1000,), 1.0)
    assert (np.from_dlpack(t) == 4.0).all()


def test_devtensor_memory_outlives_devtensor():
    t = devtensor.full(1000, 6.0)
    x = torch.from_dlpack(t)
    del t
    gc.collect()
    devtensor.full(1000, 1.0)
    assert (x == 6.0).all()


def test_raw_capsules():
    t = devtensor.full(3, 2.0)
    x = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    assert x.data_ptr() == t.data_ptr
    u = devtensor.from_dlpack(torch.utils.dlpack.to_dlpack(torch.ones(3)))
    assert np.from_dlpack(u).sum() == 3.0


def test_torch_devtensor_torch_chain():
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6)[:, 1::2]
    t = devtensor.from_dlpack(x)
    y = torch.from_dlpack(t.transpose(0, 1))
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x.t())
    y[0, 0] = -1
    assert x[0, 0] == -1


def test_conjugate_view_is_not_silently_wrong():
    # torch's C exchange API ignores the conjugate bit; devtensor checks it and
    # falls back to __dlpack__, which refuses the lazy view (BufferError).
    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    with pytest.raises(BufferError):
        devtensor.from_dlpack(x)
    n = torch.tensor([1 + 2j, 3 - 4j]).conj().imag  # a negative view of a real tensor
    assert n.is_neg()
    with pytest.raises(BufferError):
        devtensor.from_dlpack(n)
    np.testing.assert_array_equal(np.from_dlpack(devtensor.from_dlpack(x.resolve_conj())), x.resolve_conj().numpy())


class _Sub(torch.Tensor):
    """A tensor subclass from outside torch: torch's exchange API serves it through the MRO."""


@pytest.mark.parametrize("kind", ["conj", "neg"])
@pytest.mark.parametrize("wrap", ["subclass", "parameter"])
def test_lazy_views_of_tensor_subclasses_are_refused(kind, wrap):
    base = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    x = base.conj() if kind == "conj" else base.real._neg_view()
    if wrap == "subclass":
        x = x.as_subclass(_Sub)
        assert not type(x).__module__.startswith("torch")
    else:
        x = torch.nn.Parameter(x, requires_grad=False)
    assert x.is_conj() if kind == "conj" else x.is_neg()
    with pytest.raises(BufferError):
        devtensor.from_dlpack(x)
    with pytest.raises(BufferError):
        devtensor.zeros(2, dtype=str(x.dtype).removeprefix("torch.")).copy_(x)
    # Resolved, the same subclass imports with its true values.
    r = x.resolve_conj() if kind == "conj" else x.resolve_neg()
    np.testing.assert_array_equal(np.from_dlpack(devtensor.from_dlpack(r)), r.detach().numpy())


def test_negative_view_of_a_complex_tensor_is_refused():
    # Complex tensors carry the negative bit too (torch._neg_view): the sign would be lost.
    x = torch._neg_view(torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64))
    assert x.is_neg() and not x.is_conj()
    for kwargs in ({}, {"copy": False}):
        with pytest.raises(BufferError):
            devtensor.from_dlpack(x, **kwargs)
    np.testing.assert_array_equal(np.from_dlpack(devtensor.from_dlpack(x.resolve_neg())), [-1 - 2j, -3 + 4j])


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_negative_view_of_an_integer_tensor_is_refused(dtype):
    # torch._neg_view works on integers too: torch reads [-1, -2, -3] (uint8: 255, 254, 253).
    x = torch._neg_view(torch.tensor([1, 2, 3], dtype=dtype))
    assert x.is_neg()
    with pytest.raises(BufferError):
        devtensor.from_dlpack(x)
    with pytest.raises(BufferError):
        devtensor.zeros(3, dtype=str(dtype).removeprefix("torch.")).copy_(x)
    assert devtensor.from_dlpack(x.resolve_neg()).tolist() == x.resolve_neg().tolist()


@pytest.mark.parametrize("kwargs", [{}, {"copy": False}, {"device": "cpu"}])
def test_tensors_that_require_grad_are_refused_on_every_path(kwargs):
    # torch's exchange API exports them, its __dlpack__ does not: a write through our
    # view would go unseen by autograd (x.exp()'s saved result zeroed: a grad of 0).
    x = torch.ones(3, requires_grad=True)
    z = x.exp()
    with pytest.raises(BufferError, match="gradient"):
        devtensor.from_dlpack(z, **kwargs)
    with pytest.raises(BufferError):
        devtensor.zeros(3).copy_(z)
    t = devtensor.from_dlpack(z.detach(), **kwargs)
    np.testing.assert_allclose(np.from_dlpack(t), np.e, rtol=1e-6)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.e, rtol=1e-6)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: torch.eye(3).to_sparse(), BufferError),
        (lambda: torch.eye(3).to_sparse_csr(), BufferError),
        # torch's __dlpack_device__ refuses it first: "Unknown device type meta".
        (lambda: torch.empty(3, device="meta"), ValueError),
    ],
)
def test_tensors_dlpack_cannot_describe_raise_what_their_dlpack_raises(make, error):
    # The exchange API's own error (RuntimeError with a C++ trace) is not passed on:
    # the import falls back to the Python protocol, whose error is torch's word, as
    # with copy=False (which never takes the exchange API).
    x = make()
    for kwargs in ({}, {"copy": False}):
        with pytest.raises(error):
            devtensor.from_dlpack(x, **kwargs)


class _Guarded(torch.Tensor):
    """A subclass that overrides __dlpack__ to refuse exports."""

    def __dlpack__(self, **kwargs):
        raise BufferError("this tensor is not to be shared")


def test_a_subclass_overriding_dlpack_is_asked_through_it():
    # Not around it through the exchange table torch.Tensor holds, as NumPy asks.
    x = torch.arange(3.0).as_subclass(_Guarded)
    with pytest.raises(BufferError, match="not to be shared"):
        devtensor.from_dlpack(x)
    with pytest.raises(BufferError, match="not to be shared"):
        np.from_dlpack(x)
    # A subclass that does not override it still imports (zero-copy), and plain
    # tensors still take the exchange table: torch's __dlpack__ is not called.
    y = torch.arange(3.0).as_subclass(_Sub)
    assert devtensor.from_dlpack(y).data_ptr == y.data_ptr()
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        z = torch.arange(3.0)
        calls = []
        original = torch.Tensor.__dlpack__

        def spy(self, *args, **kwargs):
            calls.append(kwargs)
            return original(self, *args, **kwargs)

        torch.Tensor.__dlpack__ = spy
        try:
            assert devtensor.from_dlpack(z).data_ptr == z.data_ptr()
        finally:
            torch.Tensor.__dlpack__ = original
        assert calls == []


def test_torch_empty_with_devtensor_dtype_names():
    # Names line up with torch's.
    for name, dt in TORCH_DTYPES.items():
        assert str(dt) == f"torch.{name}"
        assert devtensor.empty(1, dtype=dt).dtype == name
