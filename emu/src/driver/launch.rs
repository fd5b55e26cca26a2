//! Kernel launches and function attributes (group__CUDA__EXEC:
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html>).
//!
//! `cuLaunchKernel` checks the launch against the device's limits, copies the
//! parameters at call time (the caller may reuse its buffers as soon as the
//! call returns), and enqueues the kernel on the stream; the stream's worker
//! runs it with the PTX interpreter. A fault becomes the context's sticky
//! error: CUDA_ERROR_ILLEGAL_ADDRESS (700) for out-of-bounds, freed,
//! unallocated, pageable-host and peer accesses, CUDA_ERROR_MISALIGNED_ADDRESS
//! (716), CUDA_ERROR_ILLEGAL_INSTRUCTION (715), CUDA_ERROR_LAUNCH_FAILED (719)
//! for sanitizer findings with no driver code of their own (shared-memory
//! races, divergent barriers, non-coherent reads of written memory).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use super::device::{
    MAX_BLOCK, MAX_GRID, MAX_THREADS_PER_BLOCK, REGS_PER_BLOCK, SHARED_PER_BLOCK, SHARED_PER_BLOCK_OPTIN,
};
use super::memory::KernelMemory;
use super::module::{Function, function};
use super::race::Access;
use super::report::{self, LaunchInfo};
use super::stream;
use super::{
    CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_MISALIGNED_ADDRESS, CUresult, Handle,
    Result, api, err, null_arg, out,
};
use crate::ptx::{self, FaultKind};

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE` (as pointers).
pub const CU_LAUNCH_PARAM_END: usize = 0;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// `CUfunction_attribute` values used here.
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
pub const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: c_int = 9;

static LAUNCH_ID: AtomicU64 = AtomicU64::new(1);

/// The driver code of a kernel fault.
pub fn fault_code(kind: FaultKind) -> CUresult {
    #[allow(unreachable_patterns)]
    match kind {
        FaultKind::OutOfBounds
        | FaultKind::Freed
        | FaultKind::Unallocated
        | FaultKind::PageableHost
        | FaultKind::NoPeerAccess
        | FaultKind::SharedOutOfBounds => CUDA_ERROR_ILLEGAL_ADDRESS,
        FaultKind::Misaligned => CUDA_ERROR_MISALIGNED_ADDRESS,
        FaultKind::IllegalInstruction => CUDA_ERROR_ILLEGAL_INSTRUCTION,
        FaultKind::SharedRace | FaultKind::DivergentBarrier | FaultKind::NcReadOfWritten => CUDA_ERROR_LAUNCH_FAILED,
        _ => CUDA_ERROR_LAUNCH_FAILED,
    }
}

/// Registers a block of `threads` threads needs at `regs` per thread:
/// allocated per warp in units of 256 (the H100's register allocation granularity).
fn block_registers(regs: u32, threads: u32) -> u64 {
    let per_warp = (u64::from(regs) * 32).div_ceil(256) * 256;
    per_warp * u64::from(threads.div_ceil(32))
}

/// Checks a launch configuration (the limits of group__CUDA__EXEC's cuLaunchKernel
/// and the device attributes).
fn check_config(f: &Function, grid: [u32; 3], block: [u32; 3], dynamic_shared: u32) -> Result<()> {
    let name = &f.name;
    if grid.contains(&0) || block.contains(&0) {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("kernel `{name}`: grid {grid:?} / block {block:?} has a zero dimension"),
        );
    }
    for i in 0..3 {
        if block[i] > MAX_BLOCK[i] {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "kernel `{name}`: block dimension {} = {} exceeds {}",
                    ["x", "y", "z"][i],
                    block[i],
                    MAX_BLOCK[i]
                ),
            );
        }
        if grid[i] > MAX_GRID[i] {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "kernel `{name}`: grid dimension {} = {} exceeds {}",
                    ["x", "y", "z"][i],
                    grid[i],
                    MAX_GRID[i]
                ),
            );
        }
    }
    let threads = block[0] * block[1] * block[2];
    if threads > MAX_THREADS_PER_BLOCK {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("kernel `{name}`: {threads} threads per block exceed {MAX_THREADS_PER_BLOCK}"),
        );
    }
    if let Some(max) = f.max_threads
        && threads > max
    {
        return err(
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            format!("kernel `{name}`: {threads} threads per block exceed its __launch_bounds__ of {max}"),
        );
    }
    let max_dyn = f.max_dynamic_shared.load(Ordering::Acquire).max(0) as u64;
    let total = u64::from(f.shared_bytes) + u64::from(dynamic_shared);
    if u64::from(dynamic_shared) > max_dyn || total > u64::from(SHARED_PER_BLOCK_OPTIN) {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "kernel `{name}`: {} bytes of static + {dynamic_shared} of dynamic shared memory exceed the limit \
                 ({} bytes; above {SHARED_PER_BLOCK} needs cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), \
                 up to {SHARED_PER_BLOCK_OPTIN})",
                f.shared_bytes,
                u64::from(f.shared_bytes) + max_dyn
            ),
        );
    }
    let regs = block_registers(f.regs, threads);
    if regs > u64::from(REGS_PER_BLOCK) {
        return err(
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            format!(
                "kernel `{name}`: {} registers per thread × {threads} threads need {regs} registers, more than the {REGS_PER_BLOCK} per block",
                f.regs
            ),
        );
    }
    Ok(())
}

/// Copies the parameters into a buffer laid out per the PTX's `.param` list.
///
/// # Safety
///
/// `params`/`extra` as documented for cuLaunchKernel.
unsafe fn copy_params(f: &Function, params: *mut *mut c_void, extra: *mut *mut c_void) -> Result<Vec<u8>> {
    let k = f.kernel();
    let mut buf = vec![0u8; k.param_bytes];
    if !params.is_null() && !extra.is_null() {
        return err(CUDA_ERROR_INVALID_VALUE, "kernelParams and extra are both non-NULL");
    }
    if !params.is_null() {
        for (i, p) in k.params.iter().enumerate() {
            // SAFETY: kernelParams holds one pointer per kernel parameter.
            let src = unsafe { *params.add(i) };
            if src.is_null() {
                return err(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("kernel `{}`: kernelParams[{i}] (`{}`) is NULL", f.name, p.name),
                );
            }
            // SAFETY: each kernelParams[i] points to the value of parameter i, `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), buf.as_mut_ptr().add(p.offset), p.size) };
        }
        return Ok(buf);
    }
    if !extra.is_null() {
        let (mut ptr, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
        let mut i = 0;
        loop {
            // SAFETY: `extra` is a CU_LAUNCH_PARAM_END-terminated list of key/value pairs.
            let key = unsafe { *extra.add(i) } as usize;
            match key {
                CU_LAUNCH_PARAM_END => break,
                CU_LAUNCH_PARAM_BUFFER_POINTER => {
                    // SAFETY: as above; the value follows its key.
                    ptr = unsafe { *extra.add(i + 1) }.cast::<u8>();
                }
                CU_LAUNCH_PARAM_BUFFER_SIZE => {
                    // SAFETY: as above; the value points to a size_t.
                    size = Some(unsafe { (*extra.add(i + 1)).cast::<usize>().read_unaligned() });
                }
                other => return err(CUDA_ERROR_INVALID_VALUE, format!("unknown `extra` key {other:#x}")),
            }
            i += 2;
        }
        let (false, Some(size)) = (ptr.is_null(), size) else {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                "`extra` needs both CU_LAUNCH_PARAM_BUFFER_POINTER and CU_LAUNCH_PARAM_BUFFER_SIZE",
            );
        };
        if size < k.param_bytes {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "kernel `{}`: the parameter buffer has {size} bytes, the kernel takes {}",
                    f.name, k.param_bytes
                ),
            );
        }
        // SAFETY: the buffer holds `size` ≥ param_bytes bytes.
        unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), k.param_bytes) };
        return Ok(buf);
    }
    if !k.params.is_empty() {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "kernel `{}` takes {} parameters and both kernelParams and extra are NULL",
                f.name,
                k.params.len()
            ),
        );
    }
    Ok(buf)
}

/// `cuLaunchKernel`: "Invokes the kernel f on a gridDimX x gridDimY x gridDimZ
/// grid of blocks. Each block contains blockDimX x blockDimY x blockDimZ
/// threads. sharedMemBytes sets the amount of dynamic shared memory ...
/// Kernel parameters to f can be specified in one of two ways: 1) via
/// kernelParams ... 2) via extra (CU_LAUNCH_PARAM_BUFFER_POINTER,
/// CU_LAUNCH_PARAM_BUFFER_SIZE) ... Calling cuLaunchKernel() invalidates the
/// persistent function state set through the deprecated cuParam* APIs."
/// Returns CUDA_ERROR_INVALID_VALUE for bad dimensions, shared memory or
/// parameters, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES when the block needs more
/// registers than the SM has, CUDA_ERROR_INVALID_HANDLE for a bad function or stream.
///
/// # Safety
///
/// `params`/`extra` as the Driver API documents them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    h: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    api("cuLaunchKernel", || {
        let func = function(f)?;
        let s = stream::resolve(h)?;
        if func.module.device != s.ctx.device {
            return err(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "kernel `{}` was loaded on device {} and launched on {}",
                    func.name,
                    func.module.device,
                    s.describe()
                ),
            );
        }
        let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
        check_config(&func, grid, block, shared_mem_bytes)?;
        if shared_mem_bytes > 0 {
            return err(
                super::CUDA_ERROR_NOT_SUPPORTED,
                format!("kernel `{}`: dynamic shared memory is not emulated yet", func.name),
            );
        }
        // SAFETY: forwarded from the caller.
        let buf = unsafe { copy_params(&func, params, extra) }?;
        let ctx = s.ctx;
        let stream_name = s.describe();
        let name = func.name.clone();
        let work: stream::Work = Box::new(move || {
            let memory = KernelMemory {
                device: ctx.device,
                peers: ctx.peers(),
                launch_id: LAUNCH_ID.fetch_add(1, Ordering::Relaxed),
            };
            let launch = ptx::Launch {
                grid,
                block,
                params: &buf,
                memory: &memory,
                threads: crate::config::get().threads,
            };
            let info = LaunchInfo {
                kernel: &func.name,
                device: ctx.device,
                grid,
                block,
                stream: &stream_name,
                regs: func.regs,
                shared_bytes: func.shared_bytes,
            };
            match ptx::run(func.kernel(), &launch) {
                Ok(stats) => {
                    report::record(&info, &stats);
                    Ok(stats
                        .footprint
                        .iter()
                        .map(|a| Access {
                            lo: a.lo,
                            hi: a.hi,
                            write: a.write,
                        })
                        .collect())
                }
                Err(e) => {
                    let code = fault_code(e.kind);
                    let cname =
                        super::error_strings(code).map_or("?".into(), |(n, _)| n.to_string_lossy().into_owned());
                    let msg = format!(
                        "kernel `{}` <<<({},{},{}), ({},{},{})>>> on {stream_name}: {:?}: {}",
                        func.name, grid[0], grid[1], grid[2], block[0], block[1], block[2], e.kind, e.message
                    );
                    report::record_error(&info, code, &cname, &msg);
                    Err((code, msg))
                }
            }
        });
        s.enqueue("cuLaunchKernel", Some(name), Vec::new(), work);
        Ok(())
    })
}

/// `cuFuncSetAttribute`: MAX_DYNAMIC_SHARED_SIZE_BYTES (up to the opt-in
/// limit less the static size) and PREFERRED_SHARED_MEMORY_CARVEOUT (-1..=100);
/// other attributes are read-only (`CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(f: Handle, attrib: c_int, value: c_int) -> CUresult {
    api("cuFuncSetAttribute", || {
        let func = function(f)?;
        match attrib {
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                let max = SHARED_PER_BLOCK_OPTIN as c_int - func.shared_bytes as c_int;
                if !(0..=max).contains(&value) {
                    return err(
                        CUDA_ERROR_INVALID_VALUE,
                        format!(
                            "kernel `{}`: MAX_DYNAMIC_SHARED_SIZE_BYTES {value} is outside 0..={max}",
                            func.name
                        ),
                    );
                }
                func.max_dynamic_shared.store(value, Ordering::Release);
            }
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => {
                if !(-1..=100).contains(&value) {
                    return err(
                        CUDA_ERROR_INVALID_VALUE,
                        format!("carveout {value} is outside -1..=100"),
                    );
                }
                func.carveout.store(value, Ordering::Release);
            }
            _ => {
                return err(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("function attribute {attrib} cannot be set"),
                );
            }
        }
        Ok(())
    })
}

/// `cuFuncGetAttribute`.
///
/// # Safety
///
/// `pi` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, f: Handle) -> CUresult {
    api("cuFuncGetAttribute", || {
        if pi.is_null() {
            return null_arg("pi");
        }
        let func = function(f)?;
        let v = match attrib {
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => {
                let mut t = MAX_THREADS_PER_BLOCK;
                while t > 32 && block_registers(func.regs, t) > u64::from(REGS_PER_BLOCK) {
                    t -= 32;
                }
                t.min(func.max_threads.unwrap_or(u32::MAX)) as c_int
            }
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => func.shared_bytes as c_int,
            2 | 3 => 0, // CONST_SIZE_BYTES, LOCAL_SIZE_BYTES
            CU_FUNC_ATTRIBUTE_NUM_REGS => func.regs as c_int,
            5 | 6 => super::device::ARCH as c_int, // PTX_VERSION, BINARY_VERSION
            7 => 0,                                // CACHE_MODE_CA
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => func.max_dynamic_shared.load(Ordering::Acquire),
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => func.carveout.load(Ordering::Acquire),
            10..=15 => 0, // cluster attributes
            _ => return err(CUDA_ERROR_INVALID_VALUE, format!("unknown function attribute {attrib}")),
        };
        // SAFETY: checked non-null; valid per the caller's contract.
        unsafe { out(pi, "pi", v) }
    })
}
