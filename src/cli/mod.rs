//! Sub-commands of the `devtensor` binary.

pub mod bench;
pub mod bench_emulated;
pub mod info;
pub mod kernels;
// Shared with benches/strided_copy.rs; some helpers only the bench and the tests use.
#[allow(dead_code, reason = "the bench uses the rest of the module")]
pub mod patterns;
