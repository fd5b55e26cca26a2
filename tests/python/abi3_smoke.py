"""The abi3 wheel on another CPython (3.10 and later), without numpy or torch.

ci/python_test.sh runs this under every other CPython it finds (pyenv's, the
system's) with the unpacked wheel on PYTHONPATH: one wheel must import and
export on all of them. Not a pytest module (no numpy there).
"""

import ctypes
import gc
import inspect
import sys

import devtensor

get_name = ctypes.pythonapi.PyCapsule_GetName
get_name.restype = ctypes.c_char_p
get_name.argtypes = [ctypes.py_object]

x = devtensor.full((3, 4), 2.5, dtype="float32")
assert get_name(x.__dlpack__()) == b"dltensor"
assert get_name(x.__dlpack__(max_version=(1, 3))) == b"dltensor_versioned"
# A keyword name built at run time is not interned.
assert get_name(x.__dlpack__(**{"".join(["max_", "version"]): (1, 0)})) == b"dltensor_versioned"
cap = devtensor.Tensor.__dlpack__(x, stream=None, max_version=(1, 0), dl_device=(1, 0), copy=False)
assert get_name(cap) == b"dltensor_versioned"
for text, args, kwargs in [("positional", (None,), {}), ("unexpected keyword argument 'bogus'", (), {"bogus": 1})]:
    try:
        x.__dlpack__(*args, **kwargs)
    except TypeError as e:
        assert text in str(e), e
    else:
        raise AssertionError(f"no TypeError for {args} {kwargs}")
try:
    x.__dlpack__(stream=3)
except BufferError:
    pass
else:
    raise AssertionError("a CPU tensor accepted stream=3")
assert list(inspect.signature(devtensor.Tensor.__dlpack__).parameters) == [
    "self", "stream", "max_version", "dl_device", "copy"
]

y = devtensor.from_dlpack(x)
assert y.data_ptr == x.data_ptr and y.shape == (3, 4)
z = x.permute(1, 0).contiguous()
assert z.shape == (4, 3) and z.is_contiguous()

before = devtensor._devtensor._live_exports()
for _ in range(1000):
    x.__dlpack__(max_version=(1, 0))
gc.collect()
assert devtensor._devtensor._live_exports() == before, "an unconsumed capsule leaked"
# An array interface whose data is a buffer: PyObject_GetBuffer, which the
# wheel declares itself (outside 3.10's limited API), on this CPython.
class BufferBacked:
    def __init__(self, raw):
        self.__array_interface__ = {"version": 3, "shape": (2, 2), "typestr": "<i4", "data": raw}


raw = bytearray(16)
b = devtensor.from_dlpack(BufferBacked(raw))
b.fill_(7)
assert raw == bytearray(b"\x07\x00\x00\x00" * 4) and b.tolist() == [[7, 7], [7, 7]]
del b
gc.collect()
raw.extend(b"x")  # the export ended with the tensor

print(f"abi3 smoke: CPython {sys.version.split()[0]}: ok")
