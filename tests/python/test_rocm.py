"""ROCm interop (an AMD GPU with a ROCm build of torch); skipped elsewhere by conftest."""

import pytest

import devtensor

pytestmark = pytest.mark.rocm


def test_rocm_to_torch_zero_copy():
    torch = pytest.importorskip("torch")
    t = devtensor.full(4, 1.0, device="rocm:0")
    assert t.__dlpack_device__() == (10, 0)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr
    torch.cuda.synchronize()
    assert x.cpu().eq(1.0).all()


def test_rocm_stream_rules():
    t = devtensor.zeros(4, device="rocm:0")
    for bad in (1, 2):
        with pytest.raises((ValueError, BufferError)):
            t.__dlpack__(stream=bad)
    for ok in (None, 0):
        t.__dlpack__(stream=ok, max_version=(1, 3))
