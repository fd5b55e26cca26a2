//! Sub-commands of the `devtensor` binary.

pub mod bench;
pub mod bench_emulated;
pub mod info;
pub mod kernels;
