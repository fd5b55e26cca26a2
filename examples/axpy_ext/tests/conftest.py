"""Markers for the axpy_ext suite, as devtensor's own (tests/python/conftest.py):
`cuda` needs a CUDA device devtensor can use (the emulated driver in CI), `gpu` one
torch can use. Without one a test SKIPs visibly, or fails when DEVTENSOR_REQUIRE_GPU=1."""

from __future__ import annotations

import gc
import os

import pytest

import axpy_ext
import devtensor

_REQUIRED = os.environ.get("DEVTENSOR_REQUIRE_GPU", "") not in ("", "0")


def _devtensor_cuda():
    try:
        devtensor.empty((1,), device="cuda:0")
    except Exception as e:  # noqa: BLE001 - the reason is what the skip prints
        return False, f"no CUDA device for devtensor ({type(e).__name__}: {e})"
    return True, ""


def _torch_cuda():
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device for torch: torch.cuda.is_available() is False (torch's CUDA runtime does not use the emulated driver)"
    return True, ""


_MUST_FAIL = {}


def pytest_configure(config):
    for name in ("cuda", "gpu"):
        config.addinivalue_line("markers", f"{name}: needs a CUDA device (see conftest.py)")


def pytest_collection_modifyitems(config, items):
    checks = {"cuda": _devtensor_cuda, "gpu": _torch_cuda}
    status = {}
    for item in items:
        for name, check in checks.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in status:
                status[name] = check()
            ok, reason = status[name]
            if ok:
                continue
            if _REQUIRED and name == "cuda":
                _MUST_FAIL[item.nodeid] = f"DEVTENSOR_REQUIRE_GPU=1 but {reason}"
            else:
                item.add_marker(pytest.mark.skip(reason=f"SKIP {name}: {reason}"))


def pytest_runtest_setup(item):
    reason = _MUST_FAIL.get(item.nodeid)
    if reason is not None:
        pytest.fail(reason, pytrace=False)


@pytest.fixture(autouse=True)
def _no_leaked_exports():
    """Every DLPack export either copy of devtensor (the package, the extension's) made
    during a test is freed by its end (each deleter ran; running twice would drive a
    counter below where it started)."""
    def live():
        gc.collect()
        # GPU tensors' deleters wait for the device work that used them (devtensor's
        # deferred deleters): run them first.
        devtensor._devtensor._drain_deleters()
        axpy_ext._drain_deleters()
        devtensor._devtensor._drain_deleters()
        return (axpy_ext._live_exports(), devtensor._devtensor._live_exports())

    before = live()
    yield
    after = live()
    assert after == before, f"live exports (axpy_ext, devtensor) {before} -> {after}"
