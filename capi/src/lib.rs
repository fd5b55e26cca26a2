//! `libdevtensor_c.so`: devtensor's C ABI (`devtensor::capi`, declared in
//! `include/devtensor.h`) as a shared library. The `devtensor_*` functions are
//! `#[no_mangle] extern "C"` items of the devtensor crate; linking it into this
//! cdylib exports them.

pub use devtensor::capi::*;
