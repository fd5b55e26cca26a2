//! Stream handles as DLPack passes them.
//!
//! On CUDA a stream is a `CUstream`; DLPack spells the legacy default stream as
//! 1 and the per-thread default stream as 2. The CPU has no streams.

/// A raw device stream handle (`CUstream` / `hipStream_t` as an integer).
/// devtensor never destroys a handle it did not create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub usize);

impl StreamHandle {
    /// CUDA's legacy default stream (`cudaStreamLegacy`, DLPack value 1).
    pub const CUDA_LEGACY: StreamHandle = StreamHandle(1);
    /// CUDA's per-thread default stream (`cudaStreamPerThread`, DLPack value 2).
    pub const CUDA_PER_THREAD: StreamHandle = StreamHandle(2);
    /// HIP's null (default) stream (DLPack value 0 or `None` on ROCm).
    pub const ROCM_DEFAULT: StreamHandle = StreamHandle(0);
}

/// A raw device event handle (`CUevent` / `hipEvent_t` as an integer), owned
/// by the allocator that recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(pub usize);
