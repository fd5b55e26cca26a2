//! The C ABI (feature `capi`): kernel libraries written in C or C++ allocate
//! tensors through devtensor's caching pool as DLPack
//! `DLManagedTensorVersioned*`, on their own streams, copy between any two
//! described tensors, and read the pool's figures. `include/devtensor.h` is
//! generated from these files by cbindgen (`tests/capi_header.rs` checks it
//! is current) and takes the DLPack types from the real `dlpack/dlpack.h`.
//!
//! Every entry point returns a status (`DevtensorStatus`, 0 on success; the
//! allocator returns 0/-1 as `DLPackManagedTensorAllocator` must), checks each
//! pointer argument, runs its body under `catch_unwind` (no panic crosses the
//! boundary) and leaves a message for `devtensor_last_error()` on failure.

pub mod pool;
pub mod status;
pub mod streams;
pub mod tensors;

pub use pool::{DevtensorMemoryStats, devtensor_empty_cache, devtensor_live_tensors, devtensor_memory_stats};
pub use status::{DevtensorStatus, devtensor_last_error, devtensor_status_name};
pub use streams::{devtensor_get_stream, devtensor_set_stream};
pub use tensors::{
    devtensor_contiguous, devtensor_copy, devtensor_copy_managed, devtensor_empty, devtensor_managed_tensor_allocator,
    devtensor_zeros,
};
