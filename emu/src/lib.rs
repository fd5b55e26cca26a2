//! devtensor-emu: an emulated CUDA driver for running devtensor's CUDA backend
//! without a GPU. See emu/README.md for the design and the environment.
//!
//! Written from NVIDIA's CUDA Driver API reference and the PTX ISA; it does not
//! depend on devtensor or cudarc.

pub mod config;
pub mod cubin;
pub mod driver;
pub mod nvrtc;
pub mod ptx;
