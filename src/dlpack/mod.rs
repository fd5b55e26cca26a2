//! DLPack: the C ABI, export of devtensor tensors and validated import of foreign ones.

pub mod env_alloc;
pub mod export;
pub mod ffi;
pub mod import;
mod managed;

pub use crate::backend::deferred::{drain_deleters, pending_deleters};
pub use env_alloc::EnvAlloc;
pub use export::{ExportOptions, live_exports};
pub use import::{from_dlpack_legacy, from_dlpack_versioned};
pub use managed::{DeleterStruct, ManagedTensor};

#[cfg(test)]
mod abi_check;
