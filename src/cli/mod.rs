//! Sub-commands of the `devtensor` binary.

pub mod bench;
pub mod info;
pub mod kernels;
