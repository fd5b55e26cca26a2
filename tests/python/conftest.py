"""Shared fixtures for the devtensor Python suite.

* An autouse leak check: every test must leave `_live_exports()` (exported DLPack
  tensors whose deleter has not run) and `_live_cpu_allocations()` where it found
  them, after a `gc.collect()`. Opt out with `@pytest.mark.no_leak_check`.
* The `gpu` / `rocm` markers: skipped with a visible reason when no such device
  is present, or failed instead when `DEVTENSOR_REQUIRE_GPU=1` / `DEVTENSOR_REQUIRE_ROCM=1`.
* `dlp`: ctypes helpers that read DLPack capsules and exchange-API tables, and
  craft capsules by hand (to test our consumer against odd producers).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

import pytest

import devtensor

_dt = devtensor._devtensor

# --------------------------------------------------------------------------------------
# Markers: gpu / rocm device detection
# --------------------------------------------------------------------------------------

def _flag(name):
    return os.environ.get(name, "") not in ("", "0")


# Fail instead of skip when the device is missing (GPU CI runners set these).
_REQUIRE = {
    "gpu": ("DEVTENSOR_REQUIRE_GPU", _flag("DEVTENSOR_REQUIRE_GPU")),
    "cuda": ("DEVTENSOR_REQUIRE_GPU", _flag("DEVTENSOR_REQUIRE_GPU")),
    "rocm": ("DEVTENSOR_REQUIRE_ROCM", _flag("DEVTENSOR_REQUIRE_ROCM"))}


def pytest_configure(config):
    config.addinivalue_line("markers", "no_leak_check: skip the autouse DLPack export / allocation leak check")


def _cuda_status():
    """(available, reason) for the `gpu` marker: a CUDA device that torch sees."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
        return False, f"no CUDA device: torch is not importable ({type(e).__name__}: {e})"
    try:
        if getattr(torch.version, "hip", None):
            return False, "no CUDA device: this torch is a ROCm build"
        if not torch.cuda.is_available():
            return False, "no CUDA device: torch.cuda.is_available() is False"
    except Exception as e:  # noqa: BLE001
        return False, f"no CUDA device: torch.cuda failed ({type(e).__name__}: {e})"
    return True, ""


def _devtensor_cuda_status():
    """(available, reason) for the `cuda` marker: a CUDA device devtensor itself can use
    (a real GPU, or the emulated driver of emu/ in CI); no torch or cupy needed."""
    import devtensor

    try:
        devtensor.empty((1,), device="cuda:0")
    except Exception as e:  # noqa: BLE001 - the reason is what the skip prints
        return False, f"no CUDA device for devtensor ({type(e).__name__}: {e})"
    return True, ""


def _rocm_status():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return False, f"no AMD GPU: torch is not importable ({type(e).__name__}: {e})"
    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return False, "no AMD GPU: needs a ROCm build of torch and a visible device"
    return True, ""


_MUST_FAIL = {}


def pytest_collection_modifyitems(config, items):
    checks = {"gpu": _cuda_status, "cuda": _devtensor_cuda_status, "rocm": _rocm_status}
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
            env, required = _REQUIRE[name]
            if required:
                _MUST_FAIL[item.nodeid] = f"{env}=1 but {reason}"
            else:
                item.add_marker(pytest.mark.skip(reason=f"SKIP {name}: {reason} (set {env}=1 to fail)"))


def pytest_runtest_setup(item):
    reason = _MUST_FAIL.get(item.nodeid)
    if reason is not None:
        pytest.fail(reason, pytrace=False)


# --------------------------------------------------------------------------------------
# Leak checks
# --------------------------------------------------------------------------------------


def _counter(name):
    fn = getattr(_dt, name, None)
    return fn if callable(fn) else None


_live_exports = _counter("_live_exports")
_live_cpu_allocations = _counter("_live_cpu_allocations")


def live_exports():
    """Exported DLPack tensors whose deleter has not run (None if not exposed)."""
    gc.collect()
    return _live_exports() if _live_exports else None


def _counts(collect=True):
    if collect:
        gc.collect()
    return (
        _live_exports() if _live_exports else None,
        _live_cpu_allocations() if _live_cpu_allocations else None,
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item._devtensor_call_failed = not rep.passed  # failed, or xfailed: a traceback holds locals


@pytest.fixture(autouse=True)
def _leak_check(request):
    """Counts may only go down across a test (a failure's traceback held earlier objects)."""
    if request.node.get_closest_marker("no_leak_check") or (_live_exports is None and _live_cpu_allocations is None):
        yield
        return
    before = _counts(collect=False)  # gc.collect() costs ~0.1 s once torch is loaded: only when needed
    yield
    if getattr(request.node, "_devtensor_call_failed", False):
        return  # the traceback keeps the test's locals alive
    after = _counts(collect=False)
    for _ in range(4):  # give consumers that free lazily (jax) a few chances
        if all(a is None or a <= b for a, b in zip(after, before)):
            return
        after = _counts()
    names = ("DLPack exports (_live_exports)", "CPU allocations (_live_cpu_allocations)")
    for name, b, a in zip(names, before, after):
        assert a is None or a <= b, f"{name} leaked: {b} -> {a}"


@pytest.fixture
def live():
    """The `_live_exports` counter (skips the test if the module does not expose it)."""
    if _live_exports is None:
        pytest.skip("devtensor._devtensor._live_exports is not exposed")
    return live_exports


# --------------------------------------------------------------------------------------
# DLPack through ctypes
# --------------------------------------------------------------------------------------

kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLVulkan = 1, 2, 3, 4, 7
kDLCUDAManaged, kDLROCM, kDLROCMHost = 13, 10, 11

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2

# (code, bits) for every dtype name devtensor knows.
DLPACK_DTYPES = {
    "bool": (6, 8),
    "int8": (0, 8),
    "int16": (0, 16),
    "int32": (0, 32),
    "int64": (0, 64),
    "uint8": (1, 8),
    "uint16": (1, 16),
    "uint32": (1, 32),
    "uint64": (1, 64),
    "float16": (2, 16),
    "float32": (2, 32),
    "float64": (2, 64),
    "bfloat16": (4, 16),
    "complex32": (5, 32),
    "complex64": (5, 64),
    "complex128": (5, 128),
    "float8_e3m4": (7, 8),
    "float8_e4m3": (8, 8),
    "float8_e4m3b11fnuz": (9, 8),
    "float8_e4m3fn": (10, 8),
    "float8_e4m3fnuz": (11, 8),
    "float8_e5m2": (12, 8),
    "float8_e5m2fnuz": (13, 8),
    "float8_e8m0fnu": (14, 8),
}
FLOAT8_NAMES = [n for n in DLPACK_DTYPES if n.startswith("float8")]
# The dtypes NumPy itself has (no bfloat16, complex32 or float8 without ml_dtypes).
NUMPY_DTYPES = [n for n in DLPACK_DTYPES if n != "bfloat16" and n != "complex32" and not n.startswith("float8")]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOCATOR = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, SET_ERROR
)
# The *_py_object_* entry points are called with the GIL held (PYFUNCTYPE keeps it, and
# raises the Python exception they set on failure); the others may run without it.
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))
WORK_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_New.restype = ctypes.py_object

# Capsule names must outlive the capsules that point at them: keep them here forever.
_NAMES = {
    n: ctypes.create_string_buffer(n)
    for n in (b"dltensor", b"dltensor_versioned", b"used_dltensor", b"used_dltensor_versioned")
}


class _Crafted:
    """A hand-made DLPack export with a counting deleter (kept alive by the helper)."""

    def __init__(self, helper, versioned, keep):
        self.helper = helper
        self.versioned = versioned
        self.keep = keep
        self.deleted = 0


class DLPack:
    """ctypes views of capsules, plus hand-crafted producers."""

    DLDevice = DLDevice
    DLDataType = DLDataType
    DLTensor = DLTensor
    DLManagedTensor = DLManagedTensor
    DLManagedTensorVersioned = DLManagedTensorVersioned
    DLPackExchangeAPI = DLPackExchangeAPI
    ALLOCATOR = ALLOCATOR
    FROM_PY = FROM_PY
    TO_PY = TO_PY
    DLTENSOR_FROM_PY = DLTENSOR_FROM_PY
    WORK_STREAM = WORK_STREAM
    SET_ERROR = SET_ERROR
    DELETER = DELETER
    FLAG_READ_ONLY = FLAG_READ_ONLY
    FLAG_IS_COPIED = FLAG_IS_COPIED
    DTYPES = DLPACK_DTYPES

    def __init__(self):
        self._alive = []  # crafted structs, buffers and callbacks: never freed during the session

    # ---- capsules ------------------------------------------------------------------
    @staticmethod
    def is_capsule(obj):
        return type(obj).__name__ == "PyCapsule"

    @staticmethod
    def name(cap):
        n = _api.PyCapsule_GetName(cap)
        return None if n is None else n.decode()

    @staticmethod
    def is_valid(cap, name):
        return _api.PyCapsule_IsValid(cap, name.encode()) == 1

    @staticmethod
    def pointer(cap, name):
        return _api.PyCapsule_GetPointer(cap, name.encode())

    @staticmethod
    def _tensor_info(t):
        ndim = t.ndim
        shape = tuple(t.shape[i] for i in range(ndim)) if ndim and t.shape else ()
        strides = None if not t.strides else tuple(t.strides[i] for i in range(ndim))
        return {
            "data": t.data or 0,
            "device": (t.device.device_type, t.device.device_id),
            "ndim": ndim,
            "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            "shape": shape,
            "strides": strides,
            "byte_offset": t.byte_offset,
        }

    def read(self, cap):
        """Reads an unconsumed capsule (legacy or versioned) without consuming it."""
        if self.is_valid(cap, "dltensor_versioned"):
            m = DLManagedTensorVersioned.from_address(self.pointer(cap, "dltensor_versioned"))
            info = self._tensor_info(m.dl_tensor)
            info.update(
                kind="dltensor_versioned",
                version=(m.version.major, m.version.minor),
                flags=m.flags,
                deleter=m.deleter,
                manager_ctx=m.manager_ctx,
            )
            return info
        if self.is_valid(cap, "dltensor"):
            m = DLManagedTensor.from_address(self.pointer(cap, "dltensor"))
            info = self._tensor_info(m.dl_tensor)
            info.update(kind="dltensor", version=None, flags=None, deleter=m.deleter, manager_ctx=m.manager_ctx)
            return info
        raise AssertionError(f"not an unconsumed DLPack capsule: {self.name(cap)!r}")

    def consume_by_hand(self, cap):
        """Consumes a capsule as a C consumer would: rename it to used_*, then call the deleter."""
        kind = self.name(cap)
        assert kind in ("dltensor", "dltensor_versioned"), kind
        ptr = self.pointer(cap, kind)
        assert _api.PyCapsule_SetName(cap, ctypes.cast(_NAMES[b"used_" + kind.encode()], ctypes.c_char_p)) == 0
        struct = DLManagedTensorVersioned if kind == "dltensor_versioned" else DLManagedTensor
        m = struct.from_address(ptr)
        if m.deleter:
            DELETER(m.deleter)(ptr)

    # ---- exchange API --------------------------------------------------------------
    def exchange_api(self, tp):
        cap = tp.__dlpack_c_exchange_api__
        assert self.is_valid(cap, "dlpack_exchange_api"), self.name(cap)
        return DLPackExchangeAPI.from_address(self.pointer(cap, "dlpack_exchange_api"))

    # ---- crafted producers ---------------------------------------------------------
    def craft(
        self,
        *,
        data,
        shape,
        strides,
        dtype=(2, 32, 1),
        device=(kDLCPU, 0),
        byte_offset=0,
        versioned=True,
        version=(1, 3),
        flags=0,
        keep=None,
        null_shape=False,
        null_strides=False,
    ):
        """A DLPack capsule around `data` (an address) with a counting deleter.

        Returns (capsule, record); `record.deleted` counts deleter calls.
        """
        ndim = len(shape)
        shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
        strides_arr = (ctypes.c_int64 * max(ndim, 1))(*(strides if strides is not None else [0] * ndim))
        if versioned:
            m = DLManagedTensorVersioned()
            m.version.major, m.version.minor = version
            m.flags = flags
        else:
            m = DLManagedTensor()
        dl = m.dl_tensor
        dl.data = data
        dl.device.device_type, dl.device.device_id = device
        dl.ndim = ndim
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = dtype
        dl.shape = None if null_shape else ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        dl.strides = None if (null_strides or strides is None) else ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
        dl.byte_offset = byte_offset
        rec = _Crafted(self, versioned, keep)

        def deleter(_ptr, rec=rec):
            rec.deleted += 1

        cb = DELETER(deleter)
        m.deleter = ctypes.cast(cb, ctypes.c_void_p).value
        self._alive.append((m, shape_arr, strides_arr, cb, keep))
        kind = b"dltensor_versioned" if versioned else b"dltensor"
        cap = _api.PyCapsule_New(ctypes.addressof(m), ctypes.cast(_NAMES[kind], ctypes.c_char_p), None)
        return cap, rec


@pytest.fixture(scope="session")
def dlp():
    return DLPack()


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def refcount(obj):
    gc.collect()
    return sys.getrefcount(obj)


@pytest.fixture
def rc():
    return refcount


# Pairs of views of one 64 × 64 buffer, (destination, source), written alike
# for NumPy arrays and devtensor tensors: byte ranges that overlap while the
# elements do not (copied in place), and elements that do (through a copy).
VIEW_PAIRS = {
    "even columns from odd": lambda x: (x[:, 0::2], x[:, 1::2]),
    "left halves from right": lambda x: (x[:, :32], x[:, 32:]),
    "one channel from another": lambda x: (x.reshape(-1, 4)[:, 2], x.reshape(-1, 4)[:, 0]),
    "even columns from odd, transposed": lambda x: (x[:32, 0::2], x[:32, 1::2].transpose(1, 0)),
    "shift by one": lambda x: (x.reshape(-1)[1:], x.reshape(-1)[:-1]),
    "reverse": lambda x: (x, x[::-1]),
    "transpose": lambda x: (x, x.transpose(1, 0)),
}


def copied_between_views(pair):
    """NumPy's result of VIEW_PAIRS[pair] on a float32 arange buffer."""
    import numpy as np

    want = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    np.copyto(*VIEW_PAIRS[pair](want))
    return want
