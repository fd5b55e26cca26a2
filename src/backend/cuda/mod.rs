//! The CUDA backend (driver API through cudarc, loaded at run time).

mod probe;

pub(crate) use probe::probe;
