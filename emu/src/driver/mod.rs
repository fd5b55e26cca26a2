//! The CUDA driver half of the emulator: `CUresult` codes, the handle
//! registries, the wrapper every exported `cu*` function runs its body in
//! (initialisation check, argument errors with a message on stderr, panics
//! turned into `CUDA_ERROR_UNKNOWN`), sticky errors, and `cuGetProcAddress`.
//!
//! The exported functions live next to the state they act on:
//! device.rs (cuInit, cuDevice*), context.rs (cuCtx*, primary contexts),
//! memory.rs (cuMem*, cuPointerGetAttribute, memory pools), stream.rs
//! (cuStream*), event.rs (cuEvent*), module.rs (cuModule*), launch.rs
//! (cuLaunchKernel, cuFunc*), this file (cuGetErrorName/String, cuGetProcAddress).
//!
//! Behaviour follows NVIDIA's CUDA Driver API reference,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/>; each function cites its page.

pub mod context;
pub mod device;
pub mod event;
pub mod launch;
pub mod memory;
pub mod module;
pub mod race;
pub mod report;
pub mod stream;

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// `CUresult` (cuda.h `cudaError_enum`; values from the Driver API's "Data types" page).
pub type CUresult = u32;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr`: a device virtual address.
pub type CUdeviceptr = u64;
/// Opaque handles (`CUcontext`, `CUstream`, `CUevent`, `CUmodule`, `CUfunction`, `CUmemoryPool`).
pub type Handle = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const CUDA_ERROR_ILLEGAL_INSTRUCTION: CUresult = 715;
pub const CUDA_ERROR_MISALIGNED_ADDRESS: CUresult = 716;
pub const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// A failed call: the code and, where there is more to say than the code's
/// name, a message (printed once to stderr as `devtensor-emu: <call>: <message>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: CUresult,
    pub message: Option<String>,
}

/// What the bodies of the exported functions return.
pub type Result<T> = std::result::Result<T, Error>;

/// An error with a message.
pub fn err<T>(code: CUresult, message: impl Into<String>) -> Result<T> {
    Err(Error {
        code,
        message: Some(message.into()),
    })
}

/// An error whose code says it all (no message printed).
pub fn code<T>(code: CUresult) -> Result<T> {
    Err(Error { code, message: None })
}

/// `CUDA_ERROR_INVALID_VALUE` for a null pointer argument.
pub fn null_arg<T>(name: &str) -> Result<T> {
    err(CUDA_ERROR_INVALID_VALUE, format!("`{name}` is NULL"))
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static LAST_MESSAGE: Mutex<Option<String>> = Mutex::new(None);
thread_local! {
    /// The message of this thread's last failed call, `None` when it printed
    /// none: a call's own error, which another thread's printed since cannot
    /// replace.
    static OWN_LAST_MESSAGE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Locks a mutex, ignoring poisoning (bodies run under `catch_unwind`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Prints an error message to stderr and keeps it for [`last_error_message`].
pub(crate) fn report_message(call: &str, message: &str) {
    // Many messages already begin with the call that made them.
    let line = match message.strip_prefix(call).and_then(|m| m.strip_prefix(": ")) {
        Some(_) => message.to_owned(),
        None => format!("{call}: {message}"),
    };
    eprintln!("devtensor-emu: {line}");
    let _ = OWN_LAST_MESSAGE.try_with(|own| *own.borrow_mut() = Some(line.clone()));
    *lock(&LAST_MESSAGE) = Some(line);
}

/// The message of this thread's last failed call, else (it printed none, as a
/// call returning a fault found and printed on a stream's own thread) the last
/// printed on any thread; for tests.
pub fn last_error_message() -> Option<String> {
    OWN_LAST_MESSAGE
        .try_with(|own| own.borrow().clone())
        .ok()
        .flatten()
        .or_else(|| lock(&LAST_MESSAGE).clone())
}

/// Whether `cuInit` succeeded.
pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

pub(crate) fn set_initialized() {
    INITIALIZED.store(true, Ordering::Release);
}

/// Runs the body of an exported function: refuses with
/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (unless `needs_init` is false),
/// with `CUDA_ERROR_NOT_SUPPORTED` when the configured driver is older than
/// `since`, prints error messages, and never lets a panic unwind into C.
pub(crate) fn entry(call: &'static str, needs_init: bool, since: i32, body: impl FnOnce() -> Result<()>) -> CUresult {
    let run = || -> Result<()> {
        let version = crate::config::get().driver_version;
        if since > version {
            return err(
                CUDA_ERROR_NOT_SUPPORTED,
                format!(
                    "introduced in driver {since}; the emulated driver is {version} (DEVTENSOR_EMU_DRIVER_VERSION)"
                ),
            );
        }
        if needs_init && !initialized() {
            return code(CUDA_ERROR_NOT_INITIALIZED);
        }
        race::api_enter();
        let r = body();
        race::api_exit();
        r
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => {
            match &e.message {
                Some(m) => report_message(call, m),
                None => {
                    let _ = OWN_LAST_MESSAGE.try_with(|own| own.borrow_mut().take());
                }
            }
            e.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            report_message(call, &format!("internal error (panic): {what}"));
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// [`entry`] for a function present in every driver the emulator models.
pub(crate) fn api(call: &'static str, body: impl FnOnce() -> Result<()>) -> CUresult {
    entry(call, true, 0, body)
}

/// Writes `value` through an out-pointer, refusing NULL.
///
/// # Safety
///
/// `ptr` must be NULL or valid for writing a `T`.
pub(crate) unsafe fn out<T>(ptr: *mut T, name: &str, value: T) -> Result<()> {
    if ptr.is_null() {
        return null_arg(name);
    }
    // SAFETY: non-null and valid for writes per the caller's contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// A call on a stream or event after its destroy call: the handle is a pointer
/// the real driver follows into freed memory (the Driver API defines nothing
/// for it; on an H100 with driver 580, recording an event on a destroyed
/// stream crashed the process with SIGSEGV). The emulator stops the process
/// too, but says why, as compute-sanitizer would.
pub(crate) fn used_after_destroy(kind: &str, destroy: &str, h: Handle) -> ! {
    eprintln!(
        "devtensor-emu: {kind} {h:p} used after {destroy}: a real driver follows the dangling \
         handle (SIGSEGV on an H100, driver 580); aborting"
    );
    std::process::abort()
}

/// A table of live objects behind opaque handles. Handles are `tag << 40 | id`
/// (never dereferenced by anyone but us: the CUDA handle types are opaque), so
/// a destroyed or foreign handle is recognised and answered with
/// `CUDA_ERROR_INVALID_HANDLE` instead of being followed.
pub(crate) struct Registry<T> {
    tag: usize,
    next: AtomicUsize,
    map: Mutex<Option<HashMap<usize, Arc<T>>>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new(tag: usize) -> Registry<T> {
        Registry {
            tag,
            next: AtomicUsize::new(1),
            map: Mutex::new(None),
        }
    }

    pub(crate) fn insert(&self, value: Arc<T>) -> Handle {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let h = (self.tag << 40) | (id << 4);
        lock(&self.map).get_or_insert_with(HashMap::new).insert(h, value);
        h as Handle
    }

    pub(crate) fn get(&self, h: Handle) -> Option<Arc<T>> {
        lock(&self.map).as_ref()?.get(&(h as usize)).cloned()
    }

    pub(crate) fn remove(&self, h: Handle) -> Option<Arc<T>> {
        lock(&self.map).as_mut()?.remove(&(h as usize))
    }

    /// True for a handle this registry issued and has since removed (a
    /// destroyed object's): ids are never reused, so it cannot be a live one.
    pub(crate) fn was_removed(&self, h: Handle) -> bool {
        let h = h as usize;
        let id = (h >> 4) & ((1 << 36) - 1);
        h >> 40 == self.tag
            && h & 0xf == 0
            && id != 0
            && id < self.next.load(Ordering::Relaxed)
            && lock(&self.map).as_ref().is_none_or(|m| !m.contains_key(&h))
    }

    /// The handle of a registered object (NULL if it is not registered).
    pub(crate) fn handle_of(&self, v: &Arc<T>) -> Handle {
        lock(&self.map)
            .as_ref()
            .and_then(|m| m.iter().find(|(_, o)| Arc::ptr_eq(o, v)).map(|(&h, _)| h as Handle))
            .unwrap_or(std::ptr::null_mut())
    }
}

/// The name and description of a `CUresult` (as cuda.h documents them).
pub fn error_strings(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        4 => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        34 => (c"CUDA_ERROR_STUB_LIBRARY", c"CUDA driver is a stub library"),
        100 => (c"CUDA_ERROR_NO_DEVICE", c"no CUDA-capable device is detected"),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        200 => (c"CUDA_ERROR_INVALID_IMAGE", c"device kernel image is invalid"),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        202 => (c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT", c"context already current"),
        209 => (
            c"CUDA_ERROR_NO_BINARY_FOR_GPU",
            c"no kernel image is available for execution on the device",
        ),
        217 => (
            c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            c"peer access is not supported between these two devices",
        ),
        218 => (c"CUDA_ERROR_INVALID_PTX", c"a PTX JIT compilation failed"),
        222 => (
            c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            c"the provided PTX was compiled with an unsupported toolchain.",
        ),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        401 => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation cannot be performed in the present state",
        ),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        600 => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        700 => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        701 => (
            c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            c"too many resources requested for launch",
        ),
        702 => (c"CUDA_ERROR_LAUNCH_TIMEOUT", c"the launch timed out and was terminated"),
        704 => (
            c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
            c"peer access is already enabled",
        ),
        705 => (
            c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            c"peer access has not been enabled",
        ),
        708 => (
            c"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
            c"cannot set while device is active in this process",
        ),
        709 => (c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed"),
        710 => (c"CUDA_ERROR_ASSERT", c"device-side assert triggered"),
        715 => (
            c"CUDA_ERROR_ILLEGAL_INSTRUCTION",
            c"an illegal instruction was encountered",
        ),
        716 => (c"CUDA_ERROR_MISALIGNED_ADDRESS", c"misaligned address"),
        717 => (
            c"CUDA_ERROR_INVALID_ADDRESS_SPACE",
            c"operation not supported on global/shared address space",
        ),
        718 => (c"CUDA_ERROR_INVALID_PC", c"invalid program counter"),
        719 => (c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
        800 => (c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

/// `cuGetErrorName`: the enum name of `error` as a static string.
/// group__CUDA__ERROR: "Sets *pStr to the address of a NULL-terminated string
/// representation of the name of the enum error code error. If the error code
/// is not recognized, CUDA_ERROR_INVALID_VALUE will be returned and *pStr will be set to NULL."
///
/// # Safety
///
/// `pstr` must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", false, 0, || {
        let s = error_strings(error).map_or(std::ptr::null(), |(n, _)| n.as_ptr());
        // SAFETY: forwarded from the caller.
        unsafe { out(pstr, "pStr", s) }?;
        if s.is_null() {
            code(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(())
        }
    })
}

/// `cuGetErrorString`: the description of `error` as a static string
/// (group__CUDA__ERROR; unknown codes: `CUDA_ERROR_INVALID_VALUE`, `*pStr = NULL`).
///
/// # Safety
///
/// `pstr` must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", false, 0, || {
        let s = error_strings(error).map_or(std::ptr::null(), |(_, d)| d.as_ptr());
        // SAFETY: forwarded from the caller.
        unsafe { out(pstr, "pStr", s) }?;
        if s.is_null() {
            code(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(())
        }
    })
}

/// One entry of the `cuGetProcAddress` table: the base name (as the caller
/// asks for it), the exported symbol, the CUDA version that introduced this
/// ABI version, and the function.
struct Proc {
    name: &'static str,
    since: i32,
    ptr: *mut c_void,
}

macro_rules! procs {
    ($( $name:literal => $f:path, $since:expr; )*) => {
        fn proc_table() -> Vec<Proc> {
            vec![$( Proc { name: $name, since: $since, ptr: $f as *mut c_void } ),*]
        }
    };
}

procs! {
    "cuInit" => device::cuInit, 2000;
    "cuDriverGetVersion" => device::cuDriverGetVersion, 2020;
    "cuDeviceGetCount" => device::cuDeviceGetCount, 2000;
    "cuDeviceGet" => device::cuDeviceGet, 2000;
    "cuDeviceGetName" => device::cuDeviceGetName, 2000;
    "cuDeviceGetAttribute" => device::cuDeviceGetAttribute, 2000;
    "cuDeviceTotalMem" => device::cuDeviceTotalMem_v2, 3020;
    "cuDeviceGetUuid" => device::cuDeviceGetUuid, 9020;
    "cuDeviceGetUuid" => device::cuDeviceGetUuid_v2, 11040;
    "cuDeviceGetPCIBusId" => device::cuDeviceGetPCIBusId, 4010;
    "cuDeviceCanAccessPeer" => device::cuDeviceCanAccessPeer, 4000;
    "cuGetErrorName" => cuGetErrorName, 6000;
    "cuGetErrorString" => cuGetErrorString, 6000;
    "cuGetProcAddress" => cuGetProcAddress_v2, 12000;
    "cuDevicePrimaryCtxRetain" => context::cuDevicePrimaryCtxRetain, 7000;
    "cuDevicePrimaryCtxGetState" => context::cuDevicePrimaryCtxGetState, 7000;
    "cuDevicePrimaryCtxRelease" => context::cuDevicePrimaryCtxRelease_v2, 11000;
    "cuCtxGetCurrent" => context::cuCtxGetCurrent, 4000;
    "cuCtxSetCurrent" => context::cuCtxSetCurrent, 4000;
    "cuCtxGetDevice" => context::cuCtxGetDevice, 2000;
    "cuCtxSynchronize" => context::cuCtxSynchronize, 2000;
    "cuCtxPushCurrent" => context::cuCtxPushCurrent_v2, 4000;
    "cuCtxPopCurrent" => context::cuCtxPopCurrent_v2, 4000;
    "cuCtxEnablePeerAccess" => context::cuCtxEnablePeerAccess, 4000;
    "cuCtxDisablePeerAccess" => context::cuCtxDisablePeerAccess, 4000;
    "cuMemAlloc" => memory::cuMemAlloc_v2, 3020;
    "cuMemFree" => memory::cuMemFree_v2, 3020;
    "cuMemAllocManaged" => memory::cuMemAllocManaged, 6000;
    "cuMemHostAlloc" => memory::cuMemHostAlloc, 2020;
    "cuMemFreeHost" => memory::cuMemFreeHost, 2000;
    "cuMemGetInfo" => memory::cuMemGetInfo_v2, 3020;
    "cuMemAllocAsync" => memory::cuMemAllocAsync, 11020;
    "cuMemFreeAsync" => memory::cuMemFreeAsync, 11020;
    "cuMemAllocFromPoolAsync" => memory::cuMemAllocFromPoolAsync, 11020;
    "cuDeviceGetDefaultMemPool" => memory::cuDeviceGetDefaultMemPool, 11020;
    "cuMemPoolCreate" => memory::cuMemPoolCreate, 11020;
    "cuMemPoolDestroy" => memory::cuMemPoolDestroy, 11020;
    "cuMemPoolSetAttribute" => memory::cuMemPoolSetAttribute, 11020;
    "cuMemPoolGetAttribute" => memory::cuMemPoolGetAttribute, 11020;
    "cuMemPoolTrimTo" => memory::cuMemPoolTrimTo, 11020;
    "cuPointerGetAttribute" => memory::cuPointerGetAttribute, 4000;
    "cuMemcpy" => memory::cuMemcpy, 4000;
    "cuMemcpyAsync" => memory::cuMemcpyAsync, 4000;
    "cuMemcpyHtoD" => memory::cuMemcpyHtoD_v2, 3020;
    "cuMemcpyDtoH" => memory::cuMemcpyDtoH_v2, 3020;
    "cuMemcpyDtoD" => memory::cuMemcpyDtoD_v2, 3020;
    "cuMemcpyHtoDAsync" => memory::cuMemcpyHtoDAsync_v2, 3020;
    "cuMemcpyDtoHAsync" => memory::cuMemcpyDtoHAsync_v2, 3020;
    "cuMemcpyDtoDAsync" => memory::cuMemcpyDtoDAsync_v2, 3020;
    "cuMemcpy2D" => memory::cuMemcpy2D_v2, 3020;
    "cuMemcpy2DAsync" => memory::cuMemcpy2DAsync_v2, 3020;
    "cuMemcpyPeer" => memory::cuMemcpyPeer, 4000;
    "cuMemcpyPeerAsync" => memory::cuMemcpyPeerAsync, 4000;
    "cuMemsetD8" => memory::cuMemsetD8_v2, 3020;
    "cuMemsetD16" => memory::cuMemsetD16_v2, 3020;
    "cuMemsetD32" => memory::cuMemsetD32_v2, 3020;
    "cuMemsetD8Async" => memory::cuMemsetD8Async, 3020;
    "cuMemsetD16Async" => memory::cuMemsetD16Async, 3020;
    "cuMemsetD32Async" => memory::cuMemsetD32Async, 3020;
    "cuStreamCreate" => stream::cuStreamCreate, 2000;
    "cuStreamCreateWithPriority" => stream::cuStreamCreateWithPriority, 5050;
    "cuStreamDestroy" => stream::cuStreamDestroy_v2, 4000;
    "cuStreamSynchronize" => stream::cuStreamSynchronize, 2000;
    "cuStreamQuery" => stream::cuStreamQuery, 2000;
    "cuStreamWaitEvent" => stream::cuStreamWaitEvent, 3020;
    "cuStreamGetCtx" => stream::cuStreamGetCtx, 9020;
    "cuStreamGetFlags" => stream::cuStreamGetFlags, 5050;
    "cuEventCreate" => event::cuEventCreate, 2000;
    "cuEventRecord" => event::cuEventRecord, 2000;
    "cuEventRecordWithFlags" => event::cuEventRecordWithFlags, 11010;
    "cuEventQuery" => event::cuEventQuery, 2000;
    "cuEventSynchronize" => event::cuEventSynchronize, 2000;
    "cuEventElapsedTime" => event::cuEventElapsedTime, 2000;
    "cuEventElapsedTime" => event::cuEventElapsedTime_v2, 12080;
    "cuEventDestroy" => event::cuEventDestroy_v2, 4000;
    "cuModuleLoadData" => module::cuModuleLoadData, 2000;
    "cuModuleLoadDataEx" => module::cuModuleLoadDataEx, 2010;
    "cuModuleGetFunction" => module::cuModuleGetFunction, 2000;
    "cuModuleUnload" => module::cuModuleUnload, 2000;
    "cuLaunchKernel" => launch::cuLaunchKernel, 4000;
    "cuFuncSetAttribute" => launch::cuFuncSetAttribute, 9000;
    "cuFuncGetAttribute" => launch::cuFuncGetAttribute, 2020;
}

/// `CUdriverProcAddressQueryResult` values (cuda.h).
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// `cuGetProcAddress_v2`: the address of one of our own driver functions by
/// its base name (no `_v2` suffix), picking the newest ABI version not newer
/// than `cudaVersion` (group__CUDA__DRIVER__ENTRY__POINT). Unknown names:
/// `CUDA_ERROR_NOT_FOUND` with `*symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`;
/// a name whose oldest version is newer than `cudaVersion`:
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
///
/// # Safety
///
/// `symbol` must be NULL or a NUL-terminated string; `pfn` and `symbol_status`
/// NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    _flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    entry("cuGetProcAddress_v2", false, 12000, || {
        if symbol.is_null() {
            return null_arg("symbol");
        }
        if pfn.is_null() {
            return null_arg("pfn");
        }
        // SAFETY: non-null, NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy().into_owned();
        let table = proc_table();
        let candidates: Vec<&Proc> = table.iter().filter(|p| p.name == name).collect();
        let driver = crate::config::get().driver_version;
        let best = candidates
            .iter()
            .filter(|p| p.since <= cuda_version && p.since <= driver)
            .max_by_key(|p| p.since);
        let (status, ptr, rc) = match best {
            Some(p) => (CU_GET_PROC_ADDRESS_SUCCESS, p.ptr, Ok(())),
            None if candidates.is_empty() => (
                CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                std::ptr::null_mut(),
                code(CUDA_ERROR_NOT_FOUND),
            ),
            None => (
                CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                std::ptr::null_mut(),
                code(CUDA_ERROR_NOT_FOUND),
            ),
        };
        // SAFETY: non-null, valid for writes per the contract.
        unsafe { pfn.write(ptr) };
        if !symbol_status.is_null() {
            // SAFETY: non-null, valid for writes per the contract.
            unsafe { symbol_status.write(status) };
        }
        rc
    })
}

/// `cuGetProcAddress` (CUDA 11.3 ABI, no status out-parameter).
///
/// # Safety
///
/// As [`cuGetProcAddress_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}
