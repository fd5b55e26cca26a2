//! The DLPack v1.3 C ABI, by hand, exactly as `dlpack.h` names it.
//!
//! Device types and type codes are plain integers: a value read from a foreign
//! tensor may be one this build does not know, and a Rust enum holding an
//! unknown discriminant is undefined behaviour. When built with
//! `DEVTENSOR_DLPACK_H=/path/to/dlpack.h`, a test compares every size,
//! alignment, field offset and constant here with bindgen's reading of that header.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

/// Major version of the DLPack ABI implemented here.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// Minor version of the DLPack ABI implemented here.
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DLPackVersion {
    /// Major version; consumers reject anything but 1.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDeviceType` (a C enum, `int32_t` sized).
pub type DLDeviceType = i32;
/// CPU.
pub const kDLCPU: DLDeviceType = 1;
/// CUDA device memory.
pub const kDLCUDA: DLDeviceType = 2;
/// Pinned CUDA host memory (`cudaMallocHost`).
pub const kDLCUDAHost: DLDeviceType = 3;
/// OpenCL.
pub const kDLOpenCL: DLDeviceType = 4;
/// Vulkan.
pub const kDLVulkan: DLDeviceType = 7;
/// Metal.
pub const kDLMetal: DLDeviceType = 8;
/// Verilog simulator.
pub const kDLVPI: DLDeviceType = 9;
/// ROCm device memory.
pub const kDLROCM: DLDeviceType = 10;
/// Pinned ROCm host memory (`hipHostMalloc`).
pub const kDLROCMHost: DLDeviceType = 11;
/// Reserved extension device.
pub const kDLExtDev: DLDeviceType = 12;
/// CUDA managed (unified) memory.
pub const kDLCUDAManaged: DLDeviceType = 13;
/// oneAPI.
pub const kDLOneAPI: DLDeviceType = 14;
/// WebGPU.
pub const kDLWebGPU: DLDeviceType = 15;
/// Qualcomm Hexagon DSP.
pub const kDLHexagon: DLDeviceType = 16;
/// Microsoft MAIA.
pub const kDLMAIA: DLDeviceType = 17;
/// AWS Trainium.
pub const kDLTrn: DLDeviceType = 18;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// One of the `kDL*` device types; raw, may be unknown.
    pub device_type: DLDeviceType,
    /// Device ordinal (0 for CPU, pinned and managed memory).
    pub device_id: i32,
}

/// `DLDataTypeCode` values (stored in the `u8` `DLDataType::code`).
pub type DLDataTypeCode = u8;
/// Signed integer.
pub const kDLInt: DLDataTypeCode = 0;
/// Unsigned integer.
pub const kDLUInt: DLDataTypeCode = 1;
/// IEEE floating point.
pub const kDLFloat: DLDataTypeCode = 2;
/// Opaque handle.
pub const kDLOpaqueHandle: DLDataTypeCode = 3;
/// bfloat16.
pub const kDLBfloat: DLDataTypeCode = 4;
/// Complex (bits = total size of both parts).
pub const kDLComplex: DLDataTypeCode = 5;
/// Boolean (bits = 8).
pub const kDLBool: DLDataTypeCode = 6;
/// float8 e3m4.
pub const kDLFloat8_e3m4: DLDataTypeCode = 7;
/// float8 e4m3.
pub const kDLFloat8_e4m3: DLDataTypeCode = 8;
/// float8 e4m3b11fnuz.
pub const kDLFloat8_e4m3b11fnuz: DLDataTypeCode = 9;
/// float8 e4m3fn.
pub const kDLFloat8_e4m3fn: DLDataTypeCode = 10;
/// float8 e4m3fnuz.
pub const kDLFloat8_e4m3fnuz: DLDataTypeCode = 11;
/// float8 e5m2.
pub const kDLFloat8_e5m2: DLDataTypeCode = 12;
/// float8 e5m2fnuz.
pub const kDLFloat8_e5m2fnuz: DLDataTypeCode = 13;
/// float8 e8m0fnu.
pub const kDLFloat8_e8m0fnu: DLDataTypeCode = 14;
/// float6 e2m3fn.
pub const kDLFloat6_e2m3fn: DLDataTypeCode = 15;
/// float6 e3m2fn.
pub const kDLFloat6_e3m2fn: DLDataTypeCode = 16;
/// float4 e2m1fn.
pub const kDLFloat4_e2m1fn: DLDataTypeCode = 17;

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// A `kDL*` type code; raw, may be unknown.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a borrowed description of strided memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// Start of the allocation (the view begins at `data + byte_offset`).
    pub data: *mut c_void,
    /// Where the memory lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL means C-contiguous).
    pub strides: *mut i64,
    /// Offset in bytes from `data` to element 0.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the legacy (unversioned) owning handle.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The described memory.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct; may be NULL.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The data must not be written.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// The producer made a copy for this export.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// Sub-byte types are padded to a byte per element.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLManagedTensorVersioned`: the owning handle of DLPack 1.x.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version of this struct; read before anything else.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct; may be NULL.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The described memory.
    pub dl_tensor: DLTensor,
}

/// `SetError(error_ctx, kind, message)` passed to the allocator.
pub type DLPackSetError =
    Option<unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char)>;

/// `DLPackManagedTensorAllocator`: allocate a tensor like `prototype`; 0 on success, -1 after `SetError`.
pub type DLPackManagedTensorAllocator = Option<
    unsafe extern "C" fn(
        prototype: *mut DLTensor,
        out: *mut *mut DLManagedTensorVersioned,
        error_ctx: *mut c_void,
        set_error: DLPackSetError,
    ) -> c_int,
>;

/// `DLPackManagedTensorFromPyObjectNoSync`.
pub type DLPackManagedTensorFromPyObjectNoSync =
    Option<unsafe extern "C" fn(py_object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int>;

/// `DLPackDLTensorFromPyObjectNoSync`.
pub type DLPackDLTensorFromPyObjectNoSync =
    Option<unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int>;

/// `DLPackCurrentWorkStream`.
pub type DLPackCurrentWorkStream = Option<
    unsafe extern "C" fn(device_type: DLDeviceType, device_id: i32, out_current_stream: *mut *mut c_void) -> c_int,
>;

/// `DLPackManagedTensorToPyObjectNoSync`.
pub type DLPackManagedTensorToPyObjectNoSync =
    Option<unsafe extern "C" fn(tensor: *mut DLManagedTensorVersioned, out_py_object: *mut *mut c_void) -> c_int>;

/// `DLPackExchangeAPIHeader`.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPIHeader {
    /// Version of the table.
    pub version: DLPackVersion,
    /// An older table, or NULL.
    pub prev_api: *mut DLPackExchangeAPIHeader,
}

/// `DLPackExchangeAPI`: the `__dlpack_c_exchange_api__` function table.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPI {
    /// Version and chain.
    pub header: DLPackExchangeAPIHeader,
    /// Allocates a tensor (non-NULL).
    pub managed_tensor_allocator: DLPackManagedTensorAllocator,
    /// Python object → owning tensor (non-NULL).
    pub managed_tensor_from_py_object_no_sync: DLPackManagedTensorFromPyObjectNoSync,
    /// Owning tensor → Python object (non-NULL).
    pub managed_tensor_to_py_object_no_sync: DLPackManagedTensorToPyObjectNoSync,
    /// Python object → borrowed DLTensor (may be NULL).
    pub dltensor_from_py_object_no_sync: DLPackDLTensorFromPyObjectNoSync,
    /// The current stream for a device (non-NULL).
    pub current_work_stream: DLPackCurrentWorkStream,
}
