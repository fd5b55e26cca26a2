"""devtensor: CPU/GPU tensors described with DLPack and handed to any framework without copying.

    >>> import devtensor, numpy as np
    >>> t = devtensor.zeros((2, 3), dtype="float32")
    >>> a = np.from_dlpack(t)          # zero-copy
    >>> u = devtensor.from_dlpack(a)   # and back
"""

from ._devtensor import (
    DLPACK_VERSION,
    EnvAlloc,
    Tensor,
    __version__,
    empty,
    current_env_alloc,
    empty_cache,
    env_alloc,
    from_dlpack,
    full,
    memory_stats,
    ones,
    zeros,
)

__all__ = [
    "DLPACK_VERSION",
    "EnvAlloc",
    "Tensor",
    "__version__",
    "empty",
    "current_env_alloc",
    "empty_cache",
    "env_alloc",
    "from_dlpack",
    "full",
    "memory_stats",
    "ones",
    "zeros",
]
