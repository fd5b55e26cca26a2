# Hand-written stub for the PyO3 extension module `devtensor._devtensor`.
# Checked against the built module by `python -m mypy.stubtest devtensor._devtensor`.
import sys
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, ClassVar, Literal, Optional, SupportsComplex, SupportsFloat, SupportsIndex, Union, final

from typing_extensions import CapsuleType

if sys.version_info >= (3, 10):
    from types import EllipsisType
else:
    EllipsisType = Any

# An int, or a sequence of non-negative ints.
_ShapeLike = Union[SupportsIndex, Sequence[SupportsIndex]]
# A dtype name ("float32", "bfloat16", "float8_e4m3fn", ...), a numpy dtype or
# scalar type (numpy.float32, numpy.dtype("int8")), Python's float, int, complex
# or bool (float64, int64, complex128, bool, as in NumPy and torch), or a torch dtype.
# The names "float" and "int" are torch's (torch.float, torch.int): float32 and int32.
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
    "AxisError",
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
    "_env_alloc_scopes",
    "_live_exports",
    "_live_cpu_allocations",
    "_pool_stats",
    "_drain_deleters",
    "_rebuild",
    "Stream",
    "ExternalStream",
    "Event",
    "StreamContext",
    "stream",
    "current_stream",
    "default_stream",
    "set_stream",
    "synchronize",
    "is_available",
    "device_count",
    "current_device",
    "set_device",
]

__version__: str
# The DLPack (major, minor) version this build speaks.
DLPACK_VERSION: tuple[int, int]

class AxisError(ValueError, IndexError):
    """A dimension out of range: both a ValueError and an IndexError, as NumPy's AxisError."""

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
    def __iter__(self) -> Iterator[Tensor]:
        """The views along the first dimension; TypeError for a 0-d tensor."""
    def __reversed__(self) -> Iterator[Tensor]:
        """The views along the first dimension, last first (nothing copied); TypeError for a 0-d tensor."""
    def __bool__(self) -> bool:
        """The one element's truth; ValueError for any other count."""
    def __int__(self) -> int: ...
    def __float__(self) -> float: ...
    def __complex__(self) -> complex: ...
    def __index__(self) -> int:
        """The integer of a 0-d integer tensor (list indices, shapes); TypeError for any other."""
    def __reduce__(self) -> tuple[Any, tuple[bytes, tuple[int, ...], str, str]]:
        """Pickles the values (C order), shape, dtype and device; unpickled contiguous on that device."""
    def __contains__(self, key: object, /) -> bool:
        """Whether any element equals `key`, a number, as `(t == key).any()` in NumPy: a Python
        number of the tensor's kind or lower is first rounded to its dtype; TypeError for
        anything but a number."""
    def __repr__(self) -> str:
        """The values as torch prints them: tensor([...], device='cuda:0', dtype=float16)."""
    def item(self) -> bool | int | float | complex:
        """The one element as a Python scalar (ValueError unless the tensor has exactly one)."""
    def tolist(self) -> Any:
        """Nested lists of bool / int / float / complex (a scalar for a 0-d tensor)."""
    def cpu(self) -> Tensor:
        """Itself for a CPU tensor, else a copy in pageable host memory."""
    def numpy(self, *, force: bool = False) -> Any:
        """A NumPy array sharing the memory of a host tensor; TypeError for a device
        tensor unless force=True (a host copy)."""
    def __array__(self, dtype: Optional[Any] = None, copy: Optional[bool] = None) -> Any: ...
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy's array interface (v3); host memory of NumPy's own dtypes only
        (AttributeError otherwise: bfloat16, float8 and complex32 go through __array__)."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (v3) of CUDA device or managed memory, with `stream`
        (AttributeError otherwise, and for bfloat16, float8 and complex32: use DLPack)."""
    def __jax_array__(self) -> Any:
        """The tensor as a jax.Array through DLPack (what jnp.asarray(t) calls), sharing
        its memory where JAX keeps the buffer; layouts JAX refuses (steps, flips,
        broadcasts) are copied first, even with jnp.asarray(t, copy=False)."""
    def record_stream(self, stream: Stream) -> None:
        """Marks the memory as used by work queued on `stream` (torch's record_stream)."""
    def __getitem__(self, key: _Index, /) -> Tensor: ...
    def permute(self, *dims: Union[SupportsIndex, Sequence[SupportsIndex]]) -> Tensor: ...
    def transpose(self, dim0: SupportsIndex, dim1: SupportsIndex) -> Tensor: ...
    def reshape(self, *shape: Union[SupportsIndex, Sequence[SupportsIndex]]) -> Tensor: ...
    def contiguous(self) -> Tensor: ...
    def clone(self) -> Tensor: ...
    def copy_(self, src: object) -> Tensor:
        """Copies `src` (any DLPack producer) in, broadcast to this shape as NumPy and torch do."""
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
    alloc_count, segment_allocs, oom_count. On the CPU, reserved_bytes also counts the
    freed blocks of 8 MiB and more kept for reuse."""

def empty_cache(device: Optional[_DeviceLike] = None) -> int:
    """Returns cached free memory of `device` (default "cpu") to the system; the bytes
    released. On the CPU: the freed blocks of 8 MiB and more kept for reuse (each is
    unmapped after 2 s idle anyway; `cpu_cache_mb` in DEVTENSOR_ALLOC_CONF bounds them)."""

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
# This context's innermost open env_alloc scope: (scope, the selection before it,
# the same of the scope around it), or None.
_env_alloc_scopes: ContextVar[Optional[tuple[EnvAlloc, Any, Any]]]

# Test hooks.
def _live_exports() -> int:
    """Exported DLPack tensors whose deleter has not run yet."""

def _live_cpu_allocations() -> int:
    """Live CPU allocations made by devtensor."""

def _pool_stats() -> dict[str, int]:
    """The CPU copy pool's counts since the process started (copies split, kept serial, late pools...)."""

def _drain_deleters() -> int:
    """Runs the deleters of imported tensors still waiting for device work; the number run."""

# Pickling.
def _rebuild(data: bytes, shape: _ShapeLike, dtype: _DTypeLike, device: _DeviceLike) -> Tensor:
    """A tensor from its pickle (Tensor.__reduce__): the bytes in C order, on `device`."""

# A CUDA device: None (the current GPU), an index, "cuda", "cuda:N", a torch.device.
_CudaDevice = Union[None, int, str, object]

@final
class Stream:
    """A CUDA stream: a new non-blocking one (devtensor's streams are reused after they
    are dropped, never destroyed, so memory that recorded one can always wait for it), or
    (with handle=) a wrapper of an existing CUstream that devtensor never destroys. An
    export records the consumer's stream only when it is one of devtensor's. Streams are
    CUDA's: ValueError for the CPU."""

    def __new__(cls, device: _CudaDevice = None, *, handle: Optional[int] = None) -> Stream: ...
    @property
    def cuda_stream(self) -> int:
        """The CUstream handle (1: the legacy default stream, 2: per-thread default)."""
    @property
    def handle(self) -> int: ...
    @property
    def device(self) -> str: ...
    def __cuda_stream__(self) -> tuple[int, int]: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def wait_stream(self, stream: Stream) -> None: ...
    def wait_event(self, event: Event) -> None: ...
    def record_event(self, event: Optional[Event] = None) -> Event: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def ExternalStream(stream_ptr: int, device: _CudaDevice = None) -> Stream:
    """Wraps an existing CUstream (torch.cuda.ExternalStream); never destroyed here."""

@final
class Event:
    """A CUDA event, created on the GPU of the first stream it is recorded on."""

    def __new__(cls, enable_timing: bool = False) -> Event: ...
    def record(self, stream: Optional[Stream] = None) -> None: ...
    def wait(self, stream: Optional[Stream] = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Event) -> float:
        """Milliseconds to `end`; both events need enable_timing=True."""
    @property
    def cuda_event(self) -> int: ...

@final
class StreamContext:
    """`with devtensor.stream(s):` the thread's current stream (and device) until the block ends."""

    def __new__(cls, stream: Optional[Stream]) -> StreamContext: ...
    @property
    def stream(self) -> Optional[Stream]: ...
    def __enter__(self) -> Optional[Stream]: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> Literal[False]: ...

def stream(stream: Optional[Stream]) -> StreamContext: ...
def current_stream(device: _CudaDevice = None) -> Stream: ...
def default_stream(device: _CudaDevice = None) -> Stream: ...
def set_stream(stream: Optional[Stream]) -> None:
    """Makes the stream's GPU the current device and the stream its current stream,
    for this thread (as torch.cuda.set_stream); None does nothing."""
def synchronize(device: _CudaDevice = None) -> None:
    """Waits for all work on the GPU (the GIL released)."""

def is_available() -> bool: ...
def device_count() -> int: ...
def current_device() -> int: ...
def set_device(device: Union[int, str, object]) -> None: ...
