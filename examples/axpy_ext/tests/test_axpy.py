"""axpy_ext: a kernel library on devtensor's Rust/PyO3 API, called with real producers."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import axpy_ext
import devtensor


def _torch_cpu_allocations(prof):
    """Bytes torch's CPU allocator handed out (positive) and took back (negative)."""
    return [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage]


# ----- CPU: any producer in, devtensor or the caller's type out ---------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_in_devtensor_out(dtype):
    x = np.arange(12, dtype=dtype).reshape(3, 4)
    y = np.full((3, 4), 0.5, dtype=dtype)
    out = axpy_ext.axpy(2.0, x, y)
    assert type(out) is devtensor.Tensor
    assert out.dtype == np.dtype(dtype).name and out.shape == (3, 4)
    np.testing.assert_array_equal(np.from_dlpack(out), 2 * x + y)


def test_strided_views_and_no_copy_of_the_inputs():
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    x, y = base[::2, ::-3], base[1::2, 1::3]  # negative and non-unit strides
    out = axpy_ext.axpy(-1.5, x, y)
    np.testing.assert_allclose(np.from_dlpack(out), -1.5 * x + y)
    assert (base == np.arange(48, dtype=np.float32).reshape(6, 8)).all()  # inputs untouched


def test_torch_in_torch_out_when_asked():
    x = torch.linspace(-1, 1, 10, dtype=torch.float64)
    y = torch.arange(10, dtype=torch.float64)
    back = axpy_ext.axpy(3.0, x, y, to_caller=True)
    assert type(back) is torch.Tensor
    torch.testing.assert_close(back, 3.0 * x + y)
    plain = axpy_ext.axpy(3.0, x, y)
    assert type(plain) is devtensor.Tensor
    # The devtensor.Tensor and a torch view of it share memory.
    assert torch.from_dlpack(plain).data_ptr() == plain.data_ptr


def test_torch_goes_through_the_exchange_api_not_dunder_dlpack(monkeypatch):
    # torch.Tensor's own __dlpack__ made to fail: the table torch.Tensor holds
    # beside it is what serves the import. (A subclass that overrides __dlpack__
    # is asked through its override instead, as NumPy asks.)
    def no_dunder(self, *args, **kwargs):
        raise AssertionError("__dlpack__ called: the C exchange API was not used")

    x, y = torch.ones(4), torch.ones(4)
    monkeypatch.setattr(torch.Tensor, "__dlpack__", no_dunder)
    np.testing.assert_array_equal(np.from_dlpack(axpy_ext.axpy(2.0, x, y)), np.full(4, 3.0, np.float32))


def test_jax_arrays():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    with jax.default_device(jax.devices("cpu")[0]):  # JAX's default is a GPU where it sees one
        x = jnp.arange(5, dtype=jnp.float32)
        out = axpy_ext.axpy(2.0, x, jnp.ones(5, dtype=jnp.float32))
    np.testing.assert_array_equal(np.from_dlpack(out), 2 * np.arange(5, dtype=np.float32) + 1)


def test_numpy_has_no_exchange_api_so_to_caller_gives_devtensor():
    out = axpy_ext.axpy(1.0, np.ones(3, np.float32), np.ones(3, np.float32), to_caller=True)
    assert type(out) is devtensor.Tensor


def test_devtensor_in_and_every_export_freed():
    x, y = devtensor.full((64,), 2.0, dtype="float32"), devtensor.ones((64,))
    out = axpy_ext.axpy(0.25, x, y)
    assert np.from_dlpack(out).tolist() == [1.5] * 64
    # The output is an export of the extension's own devtensor copy until it drops.
    assert axpy_ext._live_exports() >= 1
    del out
    gc.collect()
    assert axpy_ext._live_exports() == 0


def test_errors_are_python_exceptions():
    with pytest.raises(ValueError, match="differ in shape"):
        axpy_ext.axpy(1.0, np.ones(3, np.float32), np.ones(4, np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        axpy_ext.axpy(1.0, np.ones(3, np.int32), np.ones(3, np.int32))
    with pytest.raises(TypeError):
        axpy_ext.axpy(1.0, [1.0, 2.0], np.ones(2, np.float32))
    lazy = torch.ones(3, dtype=torch.float32)._neg_view()
    with pytest.raises(BufferError, match="negative"):
        axpy_ext.axpy(1.0, lazy, torch.ones(3))


class _Sub(torch.Tensor):
    """A tensor subclass from outside torch: torch's exchange API serves it through the MRO."""


@pytest.mark.parametrize("kind", ["conj", "neg"])
def test_lazy_views_of_tensor_subclasses_are_refused(kind):
    if kind == "conj":
        lazy = torch.ones(3, dtype=torch.complex64).conj().as_subclass(_Sub)
    else:
        lazy = torch.ones(3, dtype=torch.float32)._neg_view().as_subclass(_Sub)
    with pytest.raises(BufferError):
        axpy_ext.axpy(1.0, lazy, torch.ones(3, dtype=lazy.dtype))


# ----- allocation where the caller keeps its memory ----------------------------------------------


def test_caller_alloc_comes_from_torchs_allocator_and_is_freed_once():
    x = torch.arange(300, dtype=torch.float32).reshape(30, 10)
    y = torch.ones(30, 10)
    nbytes = x.numel() * x.element_size()
    expected = 2 * x + y
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = axpy_ext.axpy(2.0, x, y, caller_alloc=True, to_caller=True)
        same = torch.equal(out, expected)
        del out
        gc.collect()
    assert same
    events = _torch_cpu_allocations(prof)
    assert nbytes in events, f"torch never allocated the {nbytes}-byte output: {events}"
    assert -nbytes in events, f"the torch-allocated output was never freed: {events}"
    assert events.count(nbytes) == events.count(-nbytes) == 1, events


def test_without_caller_alloc_torch_allocates_nothing():
    x, y = torch.ones(300), torch.ones(300)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = axpy_ext.axpy(2.0, x, y, to_caller=True)
        del out
        gc.collect()
    assert 300 * 4 not in _torch_cpu_allocations(prof)
    assert axpy_ext.axpy(2.0, x, y, to_caller=True).sum().item() == 900.0


def test_env_alloc_scope_makes_torch_allocate_for_numpy_inputs():
    x, y = np.ones(250, np.float32), np.ones(250, np.float32)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with devtensor.env_alloc(torch):
            assert devtensor.current_env_alloc() is torch.Tensor
            out = axpy_ext.axpy(4.0, x, y)
        assert devtensor.current_env_alloc() is None
        after = axpy_ext.axpy(4.0, x, y)  # outside the scope: devtensor's allocator
        assert type(out) is devtensor.Tensor
        np.testing.assert_array_equal(np.from_dlpack(out), np.full(250, 5.0, np.float32))
        np.testing.assert_array_equal(np.from_dlpack(after), np.full(250, 5.0, np.float32))
        del out, after
        gc.collect()
    events = _torch_cpu_allocations(prof)
    assert events.count(1000) == 1 and events.count(-1000) == 1, events


def test_torch_allocator_errors_keep_torchs_message():
    # A 256 TiB broadcast (stride 0) input: the output cannot be allocated, not even where
    # the kernel overcommits memory (4 TiB was granted there, then the writes were killed).
    huge = np.broadcast_to(np.float32(1), (1 << 46,))
    with devtensor.env_alloc(torch), pytest.raises(MemoryError, match="DefaultCPUAllocator"):
        axpy_ext.axpy(1.0, huge, huge)
    with pytest.raises(MemoryError):  # devtensor's own allocator: its own message
        axpy_ext.axpy(1.0, huge, huge)


def test_env_alloc_rejects_what_has_no_exchange_api():
    with pytest.raises(TypeError, match="exchange API"):
        devtensor.env_alloc(np.ndarray)
    with pytest.raises(TypeError, match="exchange API"):
        devtensor.env_alloc(np)


# ----- CUDA: devtensor tensors on the (emulated) GPU ---------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_kernel_on_devtensor_tensors(dtype):
    n = 1000
    x = devtensor.from_dlpack(np.arange(n, dtype=dtype)).to("cuda:0")
    y = devtensor.full((n,), 2.0, dtype=dtype, device="cuda:0")
    out = axpy_ext.axpy(3.0, x, y)
    assert type(out) is devtensor.Tensor and out.device == "cuda:0"
    np.testing.assert_array_equal(np.from_dlpack(out.to("cpu")), 3.0 * np.arange(n, dtype=dtype) + 2.0)


@pytest.mark.cuda
def test_cuda_outputs_from_the_devtensor_package_allocator():
    x = devtensor.ones((4096,), device="cuda:0")
    before = devtensor.memory_stats("cuda:0")["alloc_count"]
    own = axpy_ext.axpy(1.0, x, x)  # the extension's own copy of devtensor allocates
    assert devtensor.memory_stats("cuda:0")["alloc_count"] == before
    caller = axpy_ext.axpy(1.0, x, x, caller_alloc=True)  # the caller (the devtensor package) allocates
    assert devtensor.memory_stats("cuda:0")["alloc_count"] == before + 1
    with devtensor.env_alloc(devtensor.Tensor):
        scoped = axpy_ext.axpy(1.0, x, x)
    assert devtensor.memory_stats("cuda:0")["alloc_count"] == before + 2
    for t in (own, caller, scoped):
        assert np.from_dlpack(t.to("cpu")).tolist() == [2.0] * 4096


class _DunderOnly:
    """A GPU producer without a C exchange API (as CuPy or JAX): only the Python protocol."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.cuda
def test_cuda_producer_without_exchange_api():
    x = devtensor.full((512,), 3.0, dtype="float32", device="cuda:0")
    y = devtensor.ones((512,), device="cuda:0")
    out = axpy_ext.axpy(-1.0, _DunderOnly(x), _DunderOnly(y), to_caller=True)
    assert type(out) is devtensor.Tensor  # the producer has no exchange API to return into
    del x, y  # the producers' deleters wait for the kernel (recorded on the stream it ran on)
    assert np.from_dlpack(out.to("cpu")).tolist() == [-2.0] * 512


@pytest.mark.cuda
def test_cuda_rejects_views_it_cannot_run_on():
    x = devtensor.ones((8, 8), device="cuda:0")
    with pytest.raises(ValueError, match="contiguous"):
        axpy_ext.axpy(1.0, x.transpose(0, 1), x.transpose(0, 1))


# ----- torch on a real GPU (an NVIDIA runner; torch's CUDA runtime cannot use the emulator) -------


@pytest.mark.gpu
def test_torch_cuda_output_on_torchs_stream_from_torchs_allocator():
    x = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    y = torch.ones_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        before = torch.cuda.memory_allocated()
        out = axpy_ext.axpy(2.0, x, y, caller_alloc=True, to_caller=True)
        assert torch.cuda.memory_allocated() == before + x.numel() * 4
        expected = 2 * x + y  # on the same stream: ordered after the kernel
        torch.testing.assert_close(out, expected)
    torch.cuda.synchronize()
