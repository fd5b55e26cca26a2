//! The CUDA backend (driver API through cudarc, NVRTC loaded by devtensor),
//! both loaded at run time.

pub mod kernels;
pub mod nvrtc;
mod probe;

pub(crate) use probe::probe;
