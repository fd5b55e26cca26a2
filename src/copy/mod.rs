//! Strided copies: one planner, one executor per backend.
//!
//! [`plan`] normalises a copy (drop size-1 dims, flip negative destination
//! strides, sort by destination stride, coalesce, widen elements) and
//! classifies it into a [`plan::PlanKind`]; it touches no memory, so the GPU
//! backends reuse it. [`cpu`] runs plans on host memory with memcpy, row,
//! blocked-transpose, general and fill kernels, in parallel with rayon.
//!
//! ```
//! use devtensor::copy::copy_strided;
//!
//! // Transpose a 2 × 3 matrix of f32 into a contiguous 3 × 2 one.
//! let src: Vec<f32> = vec![1., 2., 3., 4., 5., 6.];
//! let mut dst = vec![0f32; 6];
//! // SAFETY: both buffers hold the 6 elements the layouts address.
//! unsafe {
//!     copy_strided(dst.as_mut_ptr().cast(), &[2, 1], src.as_ptr().cast(), &[1, 3], &[3, 2], 4).unwrap();
//! }
//! assert_eq!(dst, [1., 4., 2., 5., 3., 6.]);
//! ```

pub mod cpu;
pub mod plan;

pub use cpu::{copy_strided, fill_strided, pool_stats, set_avx2_allowed, set_avx512_allowed, set_stream_threshold};
pub use plan::{CopyPlan, PlanDim, PlanKind, PlanOptions, plan_copy, plan_fill};
