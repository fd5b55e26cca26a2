//! The ROCm backend: the HIP runtime through hip-sys (linked at build time,
//! every call bound with an integer status), hiprtc loaded at run time.

pub mod alloc;
pub mod context;
pub mod copy;
pub mod device_backend;
mod ffi;
pub mod hiprtc;
pub mod kernels;
mod probe;
pub mod stream;

pub(crate) use probe::probe;
