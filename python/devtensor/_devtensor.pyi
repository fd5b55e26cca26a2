# Hand-written stub for the PyO3 extension module `devtensor._devtensor`.
# Checked against the built module by `python -m mypy.stubtest devtensor._devtensor`.
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, ClassVar, Optional, SupportsComplex, SupportsFloat, SupportsIndex, Union, final

from typing_extensions import CapsuleType

if sys.version_info >= (3, 10):
    from types import EllipsisType
else:
    EllipsisType = Any

# An int, or a sequence of non-negative ints.
_ShapeLike = Union[SupportsIndex, Sequence[SupportsIndex]]
# A dtype name ("float32", "bfloat16", "float8_e4m3fn", ...), a numpy dtype or
# scalar type (numpy.float32, numpy.dtype("int8")), or a torch dtype.
_DTypeLike = Union[str, object]
# "cpu", "cuda", "cuda:N", "cuda_host", "cuda_managed:N", "rocm:N", "rocm_host",
# a (device_type, device_id) pair as __dlpack_device__ returns, or a torch.device.
_DeviceLike = Union[str, tuple[int, int], object]
# A fill value: a Python or NumPy scalar, or a 0-d NumPy array or torch tensor
# (taken as the scalar it holds).
_Scalar = Union[bool, int, float, complex, SupportsIndex, SupportsFloat, SupportsComplex]
# One item of a basic index.
_IndexItem = Union[SupportsIndex, slice, EllipsisType, None]
_Index = Union[_IndexItem, tuple[_IndexItem, ...]]

__all__ = [
    "__version__",
    "DLPACK_VERSION",
    "Tensor",
    "empty",
    "zeros",
    "ones",
    "full",
    "from_dlpack",
    "memory_stats",
    "empty_cache",
    "EnvAlloc",
    "env_alloc",
    "current_env_alloc",
    "_env_alloc_var",
    "_live_exports",
    "_live_cpu_allocations",
    "_drain_deleters",
]

__version__: str
# The DLPack (major, minor) version this build speaks.
DLPACK_VERSION: tuple[int, int]

@final
class Tensor:
    """An n-dimensional view of CPU or GPU memory that speaks DLPack."""

    # The static DLPackExchangeAPI v1.3 table, as a "dlpack_exchange_api" PyCapsule.
    __dlpack_c_exchange_api__: ClassVar[CapsuleType]

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides, in elements."""
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def ndim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def data_ptr(self) -> int:
        """Address of element [0, 0, ...]."""
    @property
    def read_only(self) -> bool: ...
    def is_contiguous(self) -> bool: ...
    def __len__(self) -> int: ...
    def __repr__(self) -> str: ...
    def __getitem__(self, key: _Index, /) -> Tensor: ...
    def permute(self, *dims: Union[SupportsIndex, Sequence[SupportsIndex]]) -> Tensor: ...
    def transpose(self, dim0: SupportsIndex, dim1: SupportsIndex) -> Tensor: ...
    def reshape(self, *shape: Union[SupportsIndex, Sequence[SupportsIndex]]) -> Tensor: ...
    def contiguous(self) -> Tensor: ...
    def clone(self) -> Tensor: ...
    def copy_(self, src: object) -> Tensor: ...
    def fill_(self, value: _Scalar) -> Tensor: ...
    def to(self, device: _DeviceLike) -> Tensor: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

# dtype=None means "float32" and device=None means "cpu".
def empty(shape: _ShapeLike, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor: ...
def zeros(shape: _ShapeLike, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor: ...
def ones(shape: _ShapeLike, dtype: Optional[_DTypeLike] = None, device: Optional[_DeviceLike] = None) -> Tensor: ...

# dtype=None infers bool, int64, float32 or complex64 from fill_value (as torch does).
def full(
    shape: _ShapeLike,
    fill_value: _Scalar,
    dtype: Optional[_DTypeLike] = None,
    device: Optional[_DeviceLike] = None,
) -> Tensor: ...
def from_dlpack(x: object, *, device: Optional[_DeviceLike] = None, copy: Optional[bool] = None) -> Tensor: ...

def memory_stats(device: Optional[_DeviceLike] = None) -> dict[str, int]:
    """The allocator pool's figures for `device` (default "cpu"): allocated_bytes,
    reserved_bytes, peak_allocated_bytes, peak_reserved_bytes, active_blocks, segments,
    alloc_count, segment_allocs, oom_count."""

def empty_cache(device: Optional[_DeviceLike] = None) -> int:
    """Returns cached free memory of `device` (default "cpu") to the system; the bytes released."""

@final
class EnvAlloc:
    """`with devtensor.env_alloc(torch): ...`: outputs of kernel libraries built on
    devtensor's Rust API come from that framework's allocator (its DLPack C exchange
    API's managed_tensor_allocator) in this thread / async context."""

    @property
    def framework(self) -> Optional[type]:
        """The framework's tensor type, or None for devtensor's own allocator."""
    def __enter__(self) -> Optional[type]: ...
    def __exit__(
        self,
        *_exc: Union[Optional[type[BaseException]], Optional[BaseException], Optional[TracebackType]],
    ) -> bool: ...

def env_alloc(framework: Optional[object]) -> EnvAlloc:
    """A context manager selecting `framework`'s allocator (a tensor type such as
    torch.Tensor, a tensor, or a module such as torch; None: devtensor's own) for
    kernel-library outputs. TypeError when it has no DLPack C exchange API."""

def current_env_alloc() -> Optional[type]:
    """The tensor type whose allocator env_alloc selected here, or None."""

# The ContextVar behind env_alloc, read by every extension built on devtensor.
_env_alloc_var: ContextVar[Optional[type]]

# Test hooks.
def _live_exports() -> int:
    """Exported DLPack tensors whose deleter has not run yet."""

def _live_cpu_allocations() -> int:
    """Live CPU allocations made by devtensor."""

def _drain_deleters() -> int:
    """Runs the deleters of imported tensors still waiting for device work; the number run."""
