//! The HIP runtime calls devtensor makes, declared here with an integer
//! status: hip-sys binds `hipError_t` as a Rust enum, and a runtime newer than
//! its bindings may return a value the enum lacks (undefined behaviour). hip-sys
//! still provides the link to `amdhip64` and the device-properties layout.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipDeviceProp_t` as laid out by HIP 5 (`hipDeviceProp_tR0000`), the
/// layout the unversioned `hipGetDeviceProperties` symbol fills on HIP 5 and 6.
pub use hip_sys::hiprt::hipDeviceProp_t as DeviceProp;

/// `hipError_t`, kept as the integer the runtime returned.
pub type Status = c_int;
pub type Stream = *mut c_void;
pub type Event = *mut c_void;
pub type Module = *mut c_void;
pub type Function = *mut c_void;

pub const SUCCESS: Status = 0;
/// `hipErrorOutOfMemory` (also spelled `hipErrorMemoryAllocation`).
pub const ERROR_OUT_OF_MEMORY: Status = 2;
pub const ERROR_NO_DEVICE: Status = 100;
pub const ERROR_INSUFFICIENT_DRIVER: Status = 35;
pub const ERROR_NOT_READY: Status = 600;
/// `hipErrorPeerAccessAlreadyEnabled`.
pub const ERROR_PEER_ACCESS_ALREADY_ENABLED: Status = 704;

/// `hipMemcpyDefault`: direction inferred from unified addresses.
pub const MEMCPY_DEFAULT: c_int = 4;
/// `hipStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipHostMallocPortable`: pinned memory visible to every device.
pub const HOST_MALLOC_PORTABLE: c_uint = 1;
/// `hipMemAttachGlobal`.
pub const MEM_ATTACH_GLOBAL: c_uint = 1;

#[link(name = "amdhip64", kind = "dylib")]
unsafe extern "C" {
    pub fn hipGetDeviceCount(count: *mut c_int) -> Status;
    pub fn hipRuntimeGetVersion(version: *mut c_int) -> Status;
    pub fn hipDriverGetVersion(version: *mut c_int) -> Status;
    pub fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> Status;
    pub fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> Status;
    pub fn hipGetDeviceProperties(prop: *mut DeviceProp, device: c_int) -> Status;
    pub fn hipGetErrorName(status: Status) -> *const c_char;
    pub fn hipGetErrorString(status: Status) -> *const c_char;
    pub fn hipSetDevice(device: c_int) -> Status;
    pub fn hipGetDevice(device: *mut c_int) -> Status;

    pub fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
    pub fn hipFree(ptr: *mut c_void) -> Status;
    pub fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;
    pub fn hipHostFree(ptr: *mut c_void) -> Status;
    pub fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;

    pub fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Stream) -> Status;
    pub fn hipMemcpy2DAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: c_int,
        stream: Stream,
    ) -> Status;
    pub fn hipDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> Status;
    pub fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> Status;
    pub fn hipMemcpyPeerAsync(
        dst: *mut c_void,
        dst_device: c_int,
        src: *const c_void,
        src_device: c_int,
        size: usize,
        stream: Stream,
    ) -> Status;

    pub fn hipStreamCreateWithFlags(stream: *mut Stream, flags: c_uint) -> Status;
    pub fn hipStreamSynchronize(stream: Stream) -> Status;
    pub fn hipStreamQuery(stream: Stream) -> Status;
    pub fn hipDeviceSynchronize() -> Status;
    pub fn hipStreamWaitEvent(stream: Stream, event: Event, flags: c_uint) -> Status;

    pub fn hipEventCreateWithFlags(event: *mut Event, flags: c_uint) -> Status;
    pub fn hipEventRecord(event: Event, stream: Stream) -> Status;
    pub fn hipEventSynchronize(event: Event) -> Status;
    pub fn hipEventQuery(event: Event) -> Status;
    pub fn hipEventElapsedTime(ms: *mut f32, start: Event, stop: Event) -> Status;
    pub fn hipEventDestroy(event: Event) -> Status;

    pub fn hipModuleLoadData(module: *mut Module, image: *const c_void) -> Status;
    pub fn hipModuleUnload(module: Module) -> Status;
    pub fn hipModuleGetFunction(function: *mut Function, module: Module, name: *const c_char) -> Status;
    pub fn hipModuleLaunchKernel(
        f: Function,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: Stream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Status;
}
