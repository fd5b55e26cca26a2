//! The one error type of the crate.
//!
//! Variants are the same under every feature set: backend errors are converted
//! into them, never `#[from]`-ed behind a `cfg`. Out-of-memory is its own variant
//! so a pool can reclaim and retry.

use crate::device::{Backend, Device};
use crate::dtype::DType;

/// Everything that can go wrong in devtensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend cannot be used on this machine or in this build.
    #[error("{backend} unavailable: {reason}")]
    BackendUnavailable {
        /// Which backend.
        backend: Backend,
        /// Why, and what fixes it.
        reason: String,
    },
    /// An allocation failed for lack of memory (after a caching pool freed
    /// what it could). Pool figures are 0 for allocators without a pool.
    #[error(
        "out of memory on {device}: requested {requested} bytes \
         (pool: {reserved} bytes reserved, {allocated} allocated, largest free block {largest_free})"
    )]
    OutOfMemory {
        /// The device that ran out.
        device: Device,
        /// Bytes asked for.
        requested: usize,
        /// Bytes the pool holds from the device.
        reserved: usize,
        /// Bytes of the pool handed out.
        allocated: usize,
        /// The largest free block in the pool.
        largest_free: usize,
    },
    /// A driver or runtime call returned an error code.
    #[error("{backend} call {call} failed with code {code}: {message}")]
    Driver {
        /// Which backend.
        backend: Backend,
        /// The failing API call.
        call: &'static str,
        /// The raw error code.
        code: i64,
        /// The driver's description.
        message: String,
    },
    /// Shape, stride or offset arithmetic overflowed `isize`/`usize`.
    #[error("size overflow while computing {what}")]
    Overflow {
        /// What was being computed.
        what: &'static str,
    },
    /// Two shapes that must agree do not.
    #[error("{op}: shape mismatch: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The operation that compared them (`copy`, `expand`, ...).
        op: &'static str,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// Two dtypes that must agree do not.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        /// The operation that compared them (`copy`, `fill`, ...).
        op: &'static str,
        /// The dtype required.
        expected: DType,
        /// The dtype given.
        got: DType,
    },
    /// A dimension index outside `-ndim..ndim`.
    #[error("dimension {dim} out of range for a tensor with {ndim} dimensions")]
    DimOutOfRange {
        /// The dimension asked for.
        dim: isize,
        /// The tensor's number of dimensions.
        ndim: usize,
    },
    /// More dimensions than a tensor may have ([`MAX_NDIM`](crate::layout::MAX_NDIM),
    /// the DLPack import limit too, so every tensor can be exchanged).
    #[error("{ndim} dimensions requested, but a tensor has at most {max}")]
    TooManyDimensions {
        /// The number of dimensions asked for.
        ndim: usize,
        /// The limit.
        max: usize,
    },
    /// A fork()ed child touched GPU state inherited from its parent, which the
    /// driver does not carry across fork (as torch: "cannot re-initialize CUDA
    /// in a forked subprocess").
    #[error(
        "cannot re-initialize {backend} in a forked subprocess: the parent initialized it before fork(); \
         use the 'spawn' or 'forkserver' start method, or touch {backend} only after forking"
    )]
    ForkedChild {
        /// The backend the parent had initialized.
        backend: Backend,
    },
    /// An index outside `-size..size`.
    #[error("index {index} out of range for dimension {dim} of size {size}")]
    IndexOutOfRange {
        /// The index asked for.
        index: isize,
        /// The dimension indexed.
        dim: usize,
        /// Its size.
        size: usize,
    },
    /// A layout request that cannot be satisfied (bad permutation, zero step,
    /// incompatible reshape, unsupported broadcast, ...).
    #[error("invalid layout: {0}")]
    InvalidLayout(&'static str),
    /// A configuration variable that cannot be used as it is set.
    #[error("{var}: {reason}")]
    Config {
        /// The environment variable (`DEVTENSOR_ALLOC_CONF`, ...).
        var: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// An argument outside what the operation accepts (not a layout: an
    /// alignment, a stream value, a string with a NUL, a null pointer, ...).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A kernel the loaded module does not define, or no kernel for a request.
    #[error("no kernel {0}")]
    MissingKernel(String),
    /// A broken internal invariant: a bug in devtensor, never the caller's input.
    #[error("internal error (a devtensor bug, please report it): {0}")]
    Internal(&'static str),
    /// The destination of a write refers to the same element more than once
    /// (a zero or overlapping stride).
    #[error("destination overlaps itself (a stride of 0 or overlapping strides): cannot write to it")]
    OverlappingDestination,
    /// A write to a read-only tensor (for example an imported READ_ONLY DLPack tensor).
    #[error("tensor is read-only")]
    ReadOnly,
    /// Two tensors that must live on the same device do not.
    #[error("device mismatch: expected {expected}, got {got}")]
    DeviceMismatch {
        /// The device required.
        expected: Device,
        /// The device given.
        got: Device,
    },
    /// The operation is not supported on this device.
    #[error("{op} is not supported on {device}")]
    UnsupportedDevice {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
    },
    /// A DLPack data type devtensor cannot represent.
    #[error("unsupported DLPack dtype: code {code}, bits {bits}, lanes {lanes}")]
    UnsupportedDType {
        /// `DLDataType::code`.
        code: u8,
        /// `DLDataType::bits`.
        bits: u8,
        /// `DLDataType::lanes`.
        lanes: u16,
    },
    /// A scalar that cannot be stored in the dtype (out of range, not an integer).
    #[error("cannot store the value in {dtype}: {reason}")]
    InvalidScalar {
        /// The target dtype.
        dtype: DType,
        /// Why.
        reason: &'static str,
    },
    /// An unknown dtype name.
    #[error("unknown dtype name {0:?}")]
    UnknownDTypeName(String),
    /// An unknown or malformed device string.
    #[error("cannot parse device {0:?} (expected cpu, cuda[:N], cuda_host, cuda_managed[:N], rocm[:N], rocm_host)")]
    UnknownDevice(String),
    /// An imported DLPack tensor failed validation.
    #[error("invalid DLPack tensor: {0}")]
    DLPack(#[from] DLPackError),
    /// A framework's allocator (the `managed_tensor_allocator` of its DLPack
    /// exchange API, see [`EnvAlloc`](crate::dlpack::EnvAlloc)) refused, with
    /// the error kind and message it passed to `SetError`.
    #[error("the framework's allocator failed ({kind}): {message}")]
    ForeignAlloc {
        /// The kind the framework named (`"MemoryError"`, `"ValueError"`, ...).
        kind: String,
        /// The framework's message.
        message: String,
    },
    /// A kernel failed to compile; the compiler log is attached.
    #[error("compiling kernel {kernel} for {arch} failed:\n{log}")]
    KernelCompile {
        /// The kernel (or module) name.
        kernel: String,
        /// The target architecture (sm_90, gfx942, ...).
        arch: String,
        /// The compiler's log.
        log: String,
    },
}

/// Why an imported DLPack tensor was rejected. The producer's deleter has
/// already been called when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DLPackError {
    /// Null `DLManagedTensor*`.
    #[error("null managed tensor pointer")]
    NullTensor,
    /// `version.major` is not 1.
    #[error("unsupported DLPack major version {major} (this build speaks 1)")]
    UnsupportedVersion {
        /// The producer's major version.
        major: u32,
    },
    /// `ndim` negative or above the supported maximum.
    #[error("ndim {0} out of range")]
    BadNdim(i32),
    /// `shape` is null while `ndim > 0`.
    #[error("null shape with ndim > 0")]
    NullShape,
    /// A negative dimension size.
    #[error("negative size {size} in dimension {dim}")]
    NegativeSize {
        /// The dimension.
        dim: usize,
        /// Its size.
        size: i64,
    },
    /// `data` is null while the tensor has elements.
    #[error("null data pointer for a tensor with {0} elements")]
    NullData(usize),
    /// A device type devtensor does not handle.
    #[error("unsupported device type {0}")]
    UnsupportedDevice(i32),
    /// A negative device id.
    #[error("invalid device id {0}")]
    BadDeviceId(i32),
    /// A stride, the byte offset or the view's reach past the address space:
    /// no memory the descriptor could name.
    #[error("the tensor's {0} passes the address space")]
    BadExtent(&'static str),
}

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
