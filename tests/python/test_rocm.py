"""ROCm: the DLPack device and stream rules (on any machine, through a crafted
kDLROCM capsule that is never dereferenced), and interop with a ROCm build of
torch (an AMD GPU; skipped elsewhere by conftest)."""

import gc

import numpy as np
import pytest

import devtensor
from conftest import kDLROCM


def _rocm_import(dlp):
    """A devtensor tensor described as ROCm device 0 (its memory is a host buffer)."""
    keep = np.zeros(4, dtype=np.float32)
    cap, rec = dlp.craft(data=keep.ctypes.data, shape=(4,), strides=(1,), device=(kDLROCM, 0), keep=keep)
    return devtensor.from_dlpack(cap), rec


def test_rocm_imports_keep_their_device_and_reexport_it(dlp):
    t, rec = _rocm_import(dlp)
    assert t.__dlpack_device__() == (kDLROCM, 0)
    assert t.device == "rocm:0"
    info = dlp.read(t.__dlpack__(max_version=(1, 3)))
    assert info["device"] == (kDLROCM, 0)
    del t, info
    gc.collect()
    assert rec.deleted == 1


@pytest.mark.parametrize("stream", [1, 2])
def test_rocm_refuses_cuda_stream_values(dlp, stream):
    t, rec = _rocm_import(dlp)
    with pytest.raises(ValueError, match="not valid on ROCm"):
        t.__dlpack__(stream=stream)
    del t
    gc.collect()
    assert rec.deleted == 1  # the refused export took nothing


@pytest.mark.parametrize("stream", [None, 0])
def test_rocm_default_stream_values_are_accepted(dlp, stream):
    t, rec = _rocm_import(dlp)
    cap = t.__dlpack__(stream=stream, max_version=(1, 3))
    assert dlp.name(cap) == "dltensor_versioned"
    del t, cap
    gc.collect()
    assert rec.deleted == 1


@pytest.mark.rocm
def test_rocm_to_torch_zero_copy():
    torch = pytest.importorskip("torch")
    t = devtensor.full(4, 1.0, device="rocm:0")
    assert t.__dlpack_device__() == (10, 0)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr
    torch.cuda.synchronize()
    assert x.cpu().eq(1.0).all()


@pytest.mark.rocm
def test_rocm_pinned_host_is_kdlrocmhost():
    t = devtensor.full(8, 2.0, device="rocm_host")
    assert t.__dlpack_device__() == (11, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), np.full(8, 2.0, dtype=np.float32))


@pytest.mark.rocm
def test_rocm_stream_rules_on_a_device_tensor():
    t = devtensor.zeros(4, device="rocm:0")
    for bad in (1, 2):
        with pytest.raises(ValueError):
            t.__dlpack__(stream=bad)
    for ok in (None, 0):
        t.__dlpack__(stream=ok, max_version=(1, 3))
