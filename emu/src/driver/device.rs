//! The device model (an H100 SXM per emulated GPU), `cuInit` and the
//! `cuDevice*` queries (group__CUDA__INITIALIZE, group__CUDA__VERSION,
//! group__CUDA__DEVICE: <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html>).

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

use super::context::Context;
use super::memory::{DeviceVa, Pool};
use super::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NO_DEVICE, CUdevice, CUresult, Result, api, code,
    entry, err, null_arg, out,
};

/// Name reported by `cuDeviceGetName`.
pub const NAME: &str = "NVIDIA H100 80GB HBM3 (emulated)";
/// Compute capability 9.0.
pub const ARCH: u32 = 90;
pub const SM_COUNT: i32 = 132;
pub const WARP_SIZE: i32 = 32;
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// 48 KiB of shared memory per block without opt-in.
pub const SHARED_PER_BLOCK: u32 = 48 << 10;
/// 227 KiB per block with `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` opt-in.
pub const SHARED_PER_BLOCK_OPTIN: u32 = 227 << 10;
pub const SHARED_PER_SM: i32 = 228 << 10;
pub const REGS_PER_BLOCK: u32 = 64 << 10;
/// `CU_DEVICE_ATTRIBUTE_MAX_PITCH`: 2^31 - 1 bytes on current devices.
pub const MAX_PITCH: usize = i32::MAX as usize;

/// One emulated GPU.
pub struct Device {
    pub ordinal: u32,
    pub total_mem: u64,
    /// Its address range (visible PROT_NONE range + RW alias) and accounting.
    pub va: DeviceVa,
    /// Its primary context (created at `cuInit`, activated by retain).
    pub primary: Context,
    /// Its default memory pool (`cuDeviceGetDefaultMemPool`).
    pub default_pool: Arc<Pool>,
    pub default_pool_handle: super::Handle,
}

// SAFETY: the raw handle is an opaque integer; everything else is Sync.
unsafe impl Sync for Device {}
// SAFETY: as above.
unsafe impl Send for Device {}

static DEVICES: OnceLock<std::result::Result<Vec<Device>, String>> = OnceLock::new();

/// The devices, created by `cuInit`.
pub fn devices() -> &'static [Device] {
    match DEVICES.get() {
        Some(Ok(d)) => d,
        _ => &[],
    }
}

/// Device `ordinal`, or `CUDA_ERROR_INVALID_DEVICE`.
pub fn device(ordinal: CUdevice) -> Result<&'static Device> {
    u32::try_from(ordinal)
        .ok()
        .and_then(|o| devices().get(o as usize))
        .map_or_else(|| code(CUDA_ERROR_INVALID_DEVICE), Ok)
}

fn create_devices() -> std::result::Result<Vec<Device>, String> {
    let cfg = crate::config::get();
    (0..cfg.devices)
        .map(|ordinal| {
            let va = DeviceVa::reserve(ordinal, cfg.memory)?;
            let pool = Arc::new(Pool::new(ordinal, true));
            let default_pool_handle = super::memory::POOLS.insert(pool.clone());
            Ok(Device {
                ordinal,
                total_mem: cfg.memory,
                va,
                primary: Context::new_primary(ordinal),
                default_pool: pool,
                default_pool_handle,
            })
        })
        .collect()
}

/// `cuInit`: "Initializes the driver API and must be called before any other
/// function from the driver API ... Currently, the Flags parameter must be 0.
/// If cuInit() has not been called, any function from the driver API will
/// return CUDA_ERROR_NOT_INITIALIZED." (group__CUDA__INITIALIZE)
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    entry("cuInit", false, 0, || {
        if flags != 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("Flags must be 0, got {flags}"));
        }
        match DEVICES.get_or_init(create_devices) {
            Ok(d) if d.is_empty() => err(CUDA_ERROR_NO_DEVICE, "DEVTENSOR_EMU_DEVICES=0"),
            Ok(_) => {
                super::set_initialized();
                Ok(())
            }
            Err(e) => err(
                CUDA_ERROR_NO_DEVICE,
                format!("cannot reserve device address space: {e}"),
            ),
        }
    })
}

/// `cuDriverGetVersion`: "Returns in *driverVersion the version of CUDA
/// supported by the driver ... returns CUDA_ERROR_INVALID_VALUE if
/// driverVersion is NULL." Usable before `cuInit` (group__CUDA__VERSION).
///
/// # Safety
///
/// `version` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    entry("cuDriverGetVersion", false, 0, || {
        // SAFETY: forwarded.
        unsafe { out(version, "driverVersion", crate::config::get().driver_version) }
    })
}

/// `cuDeviceGetCount` (group__CUDA__DEVICE).
///
/// # Safety
///
/// `count` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    api("cuDeviceGetCount", || {
        // SAFETY: forwarded.
        unsafe { out(count, "count", devices().len() as c_int) }
    })
}

/// `cuDeviceGet`: `CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range.
///
/// # Safety
///
/// `dev` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    api("cuDeviceGet", || {
        if dev.is_null() {
            return null_arg("device");
        }
        let d = device(ordinal)?;
        // SAFETY: forwarded.
        unsafe { out(dev, "device", d.ordinal as CUdevice) }
    })
}

/// Copies `s` NUL-terminated into `buf` of `len` bytes (truncating).
///
/// # Safety
///
/// `buf` valid for `len` bytes of writes.
unsafe fn write_cstr(buf: *mut c_char, len: c_int, s: &str) {
    let n = (s.len()).min(len as usize - 1);
    // SAFETY: `buf` holds `len` > n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, n);
        buf.add(n).write(0);
    }
}

/// `cuDeviceGetName`: "Returns an ASCII string identifying the device dev in
/// the NULL-terminated string pointed to by name. len specifies the maximum
/// length of the string that may be returned."
///
/// # Safety
///
/// `name` must be NULL or valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetName", || {
        if name.is_null() {
            return null_arg("name");
        }
        if len <= 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("len = {len}"));
        }
        device(dev)?;
        // SAFETY: forwarded.
        unsafe { write_cstr(name, len, NAME) };
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`: bytes of memory on the device (`DEVTENSOR_EMU_MEMORY`).
///
/// # Safety
///
/// `bytes` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    api("cuDeviceTotalMem_v2", || {
        if bytes.is_null() {
            return null_arg("bytes");
        }
        let d = device(dev)?;
        // SAFETY: forwarded.
        unsafe { out(bytes, "bytes", d.total_mem as usize) }
    })
}

/// The value of a `CUdevice_attribute` for the H100 SXM model; `None` for
/// values outside the enum (cuda.h `CUdevice_attribute_enum`).
pub fn attribute(attrib: i32) -> Option<i32> {
    Some(match attrib {
        1 => MAX_THREADS_PER_BLOCK as i32,   // MAX_THREADS_PER_BLOCK
        2 => MAX_BLOCK[0] as i32,            // MAX_BLOCK_DIM_X
        3 => MAX_BLOCK[1] as i32,            // MAX_BLOCK_DIM_Y
        4 => MAX_BLOCK[2] as i32,            // MAX_BLOCK_DIM_Z
        5 => MAX_GRID[0] as i32,             // MAX_GRID_DIM_X
        6 => MAX_GRID[1] as i32,             // MAX_GRID_DIM_Y
        7 => MAX_GRID[2] as i32,             // MAX_GRID_DIM_Z
        8 => SHARED_PER_BLOCK as i32,        // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 64 << 10,                       // TOTAL_CONSTANT_MEMORY
        10 => WARP_SIZE,                     // WARP_SIZE
        11 => MAX_PITCH as i32,              // MAX_PITCH
        12 => REGS_PER_BLOCK as i32,         // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,                     // CLOCK_RATE (kHz)
        14 => 512,                           // TEXTURE_ALIGNMENT
        15 => 1,                             // GPU_OVERLAP
        16 => SM_COUNT,                      // MULTIPROCESSOR_COUNT
        17 => 0,                             // KERNEL_EXEC_TIMEOUT
        18 => 0,                             // INTEGRATED
        19 => 1,                             // CAN_MAP_HOST_MEMORY
        20 => 0,                             // COMPUTE_MODE: default
        21..=30 => 0,                        // texture/surface limits: no textures modelled
        31 => 1,                             // CONCURRENT_KERNELS
        32 => 1,                             // ECC_ENABLED
        33 => 0,                             // PCI_BUS_ID (set per device below)
        34 => 0,                             // PCI_DEVICE_ID
        35 => 0,                             // TCC_DRIVER
        36 => 2_619_000,                     // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                          // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,                      // L2_CACHE_SIZE
        39 => 2048,                          // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                             // ASYNC_ENGINE_COUNT
        41 => 1,                             // UNIFIED_ADDRESSING
        42..=49 => 0,                        // texture limits
        50 => 0,                             // PCI_DOMAIN_ID
        51 => 32,                            // TEXTURE_PITCH_ALIGNMENT
        52..=74 => 0,                        // texture/surface limits
        75 => (ARCH / 10) as i32,            // COMPUTE_CAPABILITY_MAJOR
        76 => (ARCH % 10) as i32,            // COMPUTE_CAPABILITY_MINOR
        77 => 0,                             // MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH
        78 => 1,                             // STREAM_PRIORITIES_SUPPORTED
        79 => 1,                             // GLOBAL_L1_CACHE_SUPPORTED
        80 => 1,                             // LOCAL_L1_CACHE_SUPPORTED
        81 => SHARED_PER_SM,                 // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 64 << 10,                      // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                             // MANAGED_MEMORY
        84 => 0,                             // MULTI_GPU_BOARD
        85 => 0,                             // MULTI_GPU_BOARD_GROUP_ID
        86 => 0,                             // HOST_NATIVE_ATOMIC_SUPPORTED
        87 => 2,                             // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 => 0,                             // PAGEABLE_MEMORY_ACCESS
        89 => 1,                             // CONCURRENT_MANAGED_ACCESS
        90 => 1,                             // COMPUTE_PREEMPTION_SUPPORTED
        91 => 0,                             // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        92..=94 => 0,                        // stream memory operations (v1)
        95 => 1,                             // COOPERATIVE_LAUNCH
        96 => 0,                             // COOPERATIVE_MULTI_DEVICE_LAUNCH
        97 => SHARED_PER_BLOCK_OPTIN as i32, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 => 1,                             // CAN_FLUSH_REMOTE_WRITES
        99 => 1,                             // HOST_REGISTER_SUPPORTED
        100 => 0,                            // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
        101 => 0,                            // DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
        102 => 1,                            // VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED
        103 => 1,                            // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        104 | 105 => 0,                      // Win32 handles
        106 => 32,                           // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 1,                            // GENERIC_COMPRESSION_SUPPORTED
        108 => 30 << 20,                     // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 << 20,                    // MAX_ACCESS_POLICY_WINDOW_SIZE
        110 => 1,                            // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        111 => 1024,                         // RESERVED_SHARED_MEMORY_PER_BLOCK
        112 => 1,                            // SPARSE_CUDA_ARRAY_SUPPORTED
        113 => 1,                            // READ_ONLY_HOST_REGISTER_SUPPORTED
        114 => 1,                            // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
        115 => 1,                            // MEMORY_POOLS_SUPPORTED
        116 => 0,                            // GPU_DIRECT_RDMA_SUPPORTED
        117 | 118 => 0,                      // GPU_DIRECT_RDMA flush/ordering
        119 => 1,                            // MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd
        120 => 1,                            // CLUSTER_LAUNCH
        121 => 1,                            // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
        122 | 123 => 1,                      // stream memory operations
        124 => 1,                            // DMA_BUF_SUPPORTED
        125 => 1,                            // IPC_EVENT_SUPPORTED
        126 => 4,                            // MEM_SYNC_DOMAIN_COUNT
        127 => 1,                            // TENSOR_MAP_ACCESS_SUPPORTED
        128 => 0,                            // HANDLE_TYPE_FABRIC_SUPPORTED
        129 => 0,                            // UNIFIED_FUNCTION_POINTERS
        130 => 0,                            // NUMA_CONFIG
        131 => -1,                           // NUMA_ID
        132 => 1,                            // MULTICAST_SUPPORTED
        133 => 0,                            // MPS_ENABLED
        134 => -1,                           // HOST_NUMA_ID
        135..=161 => 0,                      // newer capabilities: not modelled
        _ => return None,
    })
}

/// `cuDeviceGetAttribute`: `CUDA_ERROR_INVALID_VALUE` for an unknown attribute
/// or NULL `pi`, `CUDA_ERROR_INVALID_DEVICE` for a bad ordinal.
///
/// # Safety
///
/// `pi` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetAttribute", || {
        if pi.is_null() {
            return null_arg("pi");
        }
        let d = device(dev)?;
        let v = match attrib {
            33 => 0x18 + d.ordinal as i32 * 0x10, // PCI_BUS_ID
            34 => 0,                              // PCI_DEVICE_ID
            _ => match attribute(attrib) {
                Some(v) => v,
                None => return err(CUDA_ERROR_INVALID_VALUE, format!("unknown CUdevice_attribute {attrib}")),
            },
        };
        // SAFETY: forwarded.
        unsafe { out(pi, "pi", v) }
    })
}

/// The 16-byte UUID of a device: fixed, distinct per ordinal.
fn uuid(ordinal: u32) -> [u8; 16] {
    let mut u = *b"devtensor-emu-\0\0";
    u[14] = 0x90;
    u[15] = ordinal as u8;
    u
}

/// `cuDeviceGetUuid` (group__CUDA__DEVICE).
///
/// # Safety
///
/// `out_uuid` must be NULL or valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out_uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    api("cuDeviceGetUuid", || {
        if out_uuid.is_null() {
            return null_arg("uuid");
        }
        let d = device(dev)?;
        // SAFETY: forwarded.
        unsafe { out(out_uuid, "uuid", uuid(d.ordinal)) }
    })
}

/// `cuDeviceGetUuid_v2` (CUDA 11.4; same answer).
///
/// # Safety
///
/// As [`cuDeviceGetUuid`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out_uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", true, 11040, || {
        if out_uuid.is_null() {
            return null_arg("uuid");
        }
        let d = device(dev)?;
        // SAFETY: forwarded.
        unsafe { out(out_uuid, "uuid", uuid(d.ordinal)) }
    })
}

/// `cuDeviceGetPCIBusId`: "domain:bus:device.function" (13 characters + NUL).
///
/// # Safety
///
/// `bus_id` must be NULL or valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetPCIBusId", || {
        if bus_id.is_null() {
            return null_arg("pciBusId");
        }
        if len <= 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("len = {len}"));
        }
        let d = device(dev)?;
        let s = format!("00000000:{:02X}:00.0", 0x18 + d.ordinal * 0x10);
        // SAFETY: forwarded.
        unsafe { write_cstr(bus_id, len, &s) };
        Ok(())
    })
}

/// `cuDeviceCanAccessPeer`: every pair of distinct emulated GPUs can (NVLink
/// on an HGX board); a device with itself: 0 (group__CUDA__PEER__ACCESS).
///
/// # Safety
///
/// `can` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult {
    api("cuDeviceCanAccessPeer", || {
        if can.is_null() {
            return null_arg("canAccessPeer");
        }
        let (a, b) = (device(dev)?, device(peer)?);
        // SAFETY: forwarded.
        unsafe { out(can, "canAccessPeer", c_int::from(a.ordinal != b.ordinal)) }
    })
}

/// `cuGetExportTable`: the driver's private tables, which NVIDIA's own
/// libraries (NVRTC 12.9+/13 among them, when they find a `libcuda.so.1`
/// loaded) ask for by UUID and use without checking that the symbol exists.
/// The emulator has none: every request gets `CUDA_ERROR_NOT_FOUND` and a NULL
/// table, which those libraries handle by going on without the driver.
///
/// # Safety
///
/// `table` must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const c_void) -> CUresult {
    if !table.is_null() {
        // SAFETY: non-null and valid for writes (caller's contract).
        unsafe { *table = std::ptr::null() };
    }
    super::CUDA_ERROR_NOT_FOUND
}
