#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod alloc;
pub mod backend;
#[cfg(feature = "capi")]
pub mod capi;
pub mod copy;
pub mod device;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod fork;
pub mod layout;
pub mod scalar;
pub mod stream;
pub mod tensor;

pub use alloc::{AllocStats, CpuAlloc, NDAlloc};
pub use device::{Backend, Device, DeviceSpec};
pub use dlpack::{from_dlpack_legacy, from_dlpack_versioned};
pub use dtype::{DType, NumberKind};
pub use error::{DLPackError, Error, Result};
pub use scalar::Scalar;
pub use stream::StreamHandle;
pub use tensor::{Element, Storage, Tensor};

#[cfg(feature = "python")]
pub mod python;
