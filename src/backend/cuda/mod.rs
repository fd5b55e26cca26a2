//! The CUDA backend (driver API through cudarc, NVRTC loaded by devtensor),
//! both loaded at run time.

pub mod alloc;
pub mod context;
pub mod copy;
pub mod device_backend;
pub mod kernels;
pub mod nvrtc;
mod probe;
pub mod stream;

pub(crate) use probe::probe;
