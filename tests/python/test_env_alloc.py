"""devtensor.env_alloc: the scoped choice of allocator for kernel libraries built on
devtensor's Rust API (examples/axpy_ext/tests shows the allocations themselves)."""

import threading

import numpy as np
import pytest
import torch

import devtensor


def test_scopes_nest_and_restore():
    assert devtensor.current_env_alloc() is None
    with devtensor.env_alloc(torch) as fw:
        assert fw is torch.Tensor
        assert devtensor.current_env_alloc() is torch.Tensor
        with devtensor.env_alloc(None):
            assert devtensor.current_env_alloc() is None
        with devtensor.env_alloc(devtensor.zeros(1)):  # an instance names its type
            assert devtensor.current_env_alloc() is devtensor.Tensor
        assert devtensor.current_env_alloc() is torch.Tensor
    assert devtensor.current_env_alloc() is None


def test_restored_when_the_body_raises():
    with pytest.raises(KeyError), devtensor.env_alloc(torch.Tensor):
        raise KeyError("x")
    assert devtensor.current_env_alloc() is None


def test_one_object_reentered():
    scope = devtensor.env_alloc(torch)
    assert scope.framework is torch.Tensor and "torch" in repr(scope)
    with scope, scope:
        assert devtensor.current_env_alloc() is torch.Tensor
    assert devtensor.current_env_alloc() is None


def test_other_threads_are_not_affected():
    seen = []
    with devtensor.env_alloc(torch):
        t = threading.Thread(target=lambda: seen.append(devtensor.current_env_alloc()))
        t.start()
        t.join()
    assert seen == [None]


@pytest.mark.parametrize("bad", [np, np.ndarray, np.ones(2), 3, "torch"])
def test_frameworks_without_an_exchange_api_are_refused(bad):
    with pytest.raises(TypeError, match="exchange API"):
        devtensor.env_alloc(bad)
