//! GPU copies: planned on the host by the shared planner, then one memcpy or
//! one kernel launch; host↔device copies stage through a contiguous buffer and
//! permute on the GPU.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;

use super::context::{Gpu, check, device};
use super::kernels;
use super::stream::CudaStream;
use crate::copy::plan::{BaseAddrs, CopyPlan, PlanKind, PlanOptions, plan_copy, plan_fill};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Dims a kernel takes after coalescing (`DT_MAX_DIMS` in the kernel source).
pub const MAX_DIMS: usize = 16;
const BLOCK: u32 = 256;
const ILP: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DivMagic {
    mul: u32,
    shift: u32,
    div: u32,
}

/// Granlund–Montgomery magic for division by `d` of dividends below 2^31.
fn magic(d: u32) -> DivMagic {
    let d = d.max(1);
    let shift = 32 - (d - 1).leading_zeros(); // ceil(log2(d))
    let mul = (((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1) as u32;
    DivMagic { mul, shift, div: d }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct StridedArgs {
    numel: u32,
    ndim: i32,
    size: [DivMagic; MAX_DIMS],
    src_stride: [i32; MAX_DIMS],
    dst_stride: [i32; MAX_DIMS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct StridedArgs64 {
    numel: u64,
    ndim: i32,
    size: [u64; MAX_DIMS],
    src_stride: [i64; MAX_DIMS],
    dst_stride: [i64; MAX_DIMS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TransposeArgs {
    n_src_fast: u32,
    n_dst_fast: u32,
    src_stride_df: i32,
    dst_stride_sf: i32,
    tiles_sf: u32,
    tiles_df: u32,
    batch: StridedArgs,
}

/// (len, src stride, dst stride) in units of the plan's element size.
fn unit_dims(plan: &CopyPlan) -> Vec<(usize, i64, i64)> {
    let e = plan.elem_size as isize;
    plan.dims
        .iter()
        .map(|d| (d.len, (d.src / e) as i64, (d.dst / e) as i64))
        .collect()
}

/// True when every element and offset fits the 32-bit kernels.
fn fits_i32(numel: usize, dims: &[(usize, i64, i64)]) -> bool {
    let reach = |f: fn(&(usize, i64, i64)) -> i64| -> i128 {
        dims.iter().map(|d| (d.0 as i128 - 1) * i128::from(f(d)).abs()).sum()
    };
    numel <= i32::MAX as usize && reach(|d| d.1) <= i32::MAX as i128 && reach(|d| d.2) <= i32::MAX as i128
}

fn strided_args(numel: usize, dims: &[(usize, i64, i64)]) -> StridedArgs {
    let mut a = StridedArgs {
        numel: numel as u32,
        ndim: dims.len() as i32,
        size: [DivMagic::default(); MAX_DIMS],
        src_stride: [0; MAX_DIMS],
        dst_stride: [0; MAX_DIMS],
    };
    for (i, &(len, s, d)) in dims.iter().enumerate() {
        a.size[i] = magic(len as u32);
        a.src_stride[i] = s as i32;
        a.dst_stride[i] = d as i32;
    }
    a
}

struct Module {
    funcs: HashMap<&'static str, usize>,
}

/// The kernel `name` on `gpu`, loading the module (cubin for the GPU's arch) once.
fn function(gpu: &Gpu, name: &'static str) -> Result<sys::CUfunction> {
    static MODULES: OnceLock<Mutex<HashMap<u32, Module>>> = OnceLock::new();
    let mut modules = MODULES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let module = match modules.entry(gpu.ordinal) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(load_module(gpu)?),
    };
    let f = module
        .funcs
        .get(name)
        .copied()
        .ok_or(Error::InvalidLayout("unknown kernel"))?;
    Ok(f as sys::CUfunction)
}

/// Loads the cubin for `gpu`'s arch and resolves every kernel of the manifest.
fn load_module(gpu: &Gpu) -> Result<Module> {
    let (cubin, _) = kernels::module(&gpu.arch)?;
    gpu.bind()?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `cubin` is a complete cubin image for this GPU's arch, alive
    // for the call; the module stays loaded for the life of the process.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast())
    })?;
    let mut funcs = HashMap::new();
    for &k in kernels::KERNELS {
        let cname = std::ffi::CString::new(k).map_err(|_| Error::InvalidLayout("kernel name"))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` is loaded; `cname` is a valid C string.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, module, cname.as_ptr())
        })?;
        funcs.insert(k, f as usize);
    }
    Ok(Module { funcs })
}

/// Launches `name` with the given by-value arguments.
///
/// # Safety
///
/// `params` must point at values whose types match the kernel's parameters in
/// order, and every pointer argument must address device-accessible memory
/// large enough for the launch.
unsafe fn launch(
    gpu: &Gpu,
    name: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    stream: &CudaStream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let f = function(gpu, name)?;
    gpu.bind()?;
    // SAFETY: forwarded from the caller; grid and block sizes are within limits.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

fn suffix(elem: usize) -> Result<&'static str> {
    Ok(match elem {
        1 => "e1",
        2 => "e2",
        4 => "e4",
        8 => "e8",
        16 => "e16",
        _ => return Err(Error::InvalidLayout("GPU kernels move 1, 2, 4, 8 or 16-byte elements")),
    })
}

fn kernel_name(prefix: &str, elem: usize) -> Result<&'static str> {
    let want = format!("{prefix}_{}", suffix(elem)?);
    kernels::KERNELS
        .iter()
        .copied()
        .find(|k| *k == want)
        .ok_or(Error::InvalidLayout("no such kernel"))
}

/// Runs a planned copy between two device-accessible addresses on `gpu`.
///
/// # Safety
///
/// `dst` / `src` are device-accessible addresses of element `[0, ..]` of the
/// views the plan was made from, valid for the plan's spans, and not freed
/// before the work on `stream` completes.
pub unsafe fn run_plan(gpu: &Gpu, plan: &CopyPlan, dst: u64, src: u64, stream: &CudaStream) -> Result<()> {
    let mut dst_base = dst.wrapping_add_signed(plan.dst_offset as i64);
    let mut src_base = src.wrapping_add_signed(plan.src_offset as i64);
    if plan.kind == PlanKind::Empty {
        return Ok(());
    }
    if plan.kind == PlanKind::Memcpy {
        gpu.bind()?;
        // SAFETY: both ranges are valid device-accessible memory (UVA) of `bytes`.
        return check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dst_base, src_base, plan.bytes(), stream.raw())
        });
    }
    let dims = unit_dims(plan);
    if dims.len() > MAX_DIMS {
        return Err(Error::InvalidLayout("more than 16 dimensions remain after coalescing"));
    }
    if let PlanKind::Transpose { src_fast } = plan.kind
        && plan.elem_size <= 8
        && fits_i32(plan.numel, &dims)
    {
        let (df, sf) = (dims[0], dims[src_fast]);
        let batch: Vec<_> = dims
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 0 && *i != src_fast)
            .map(|(_, d)| *d)
            .collect();
        let batches: usize = batch.iter().map(|d| d.0).product();
        let tiles_sf = sf.0.div_ceil(32) as u32;
        let tiles_df = df.0.div_ceil(32) as u32;
        let blocks = u64::from(tiles_sf) * u64::from(tiles_df) * batches as u64;
        if blocks <= i32::MAX as u64 {
            let mut args = TransposeArgs {
                n_src_fast: sf.0 as u32,
                n_dst_fast: df.0 as u32,
                src_stride_df: df.1 as i32,
                dst_stride_sf: sf.2 as i32,
                tiles_sf,
                tiles_df,
                batch: strided_args(batches, &batch),
            };
            let mut params = [
                (&raw mut src_base).cast::<c_void>(),
                (&raw mut dst_base).cast(),
                (&raw mut args).cast(),
            ];
            // SAFETY: params match `transpose_tiled_eE(const u8*, u8*, TransposeArgs)`;
            // the tile loops stay inside the plan's extents.
            return unsafe {
                launch(
                    gpu,
                    kernel_name("transpose_tiled", plan.elem_size)?,
                    (blocks as u32, 1, 1),
                    (32, 8, 1),
                    stream,
                    &mut params,
                )
            };
        }
    }
    if fits_i32(plan.numel, &dims) {
        let mut args = strided_args(plan.numel, &dims);
        let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK * ILP)) as u32;
        let mut params = [
            (&raw mut src_base).cast::<c_void>(),
            (&raw mut dst_base).cast(),
            (&raw mut args).cast(),
        ];
        // SAFETY: params match `copy_strided_eE(const u8*, u8*, StridedArgs)`; every
        // index the kernel forms lies inside the plan's spans.
        unsafe {
            launch(
                gpu,
                kernel_name("copy_strided", plan.elem_size)?,
                (blocks.max(1), 1, 1),
                (BLOCK, 1, 1),
                stream,
                &mut params,
            )
        }
    } else {
        let mut args = StridedArgs64 {
            numel: plan.numel as u64,
            ndim: dims.len() as i32,
            size: [0; MAX_DIMS],
            src_stride: [0; MAX_DIMS],
            dst_stride: [0; MAX_DIMS],
        };
        for (i, &(len, s, d)) in dims.iter().enumerate() {
            args.size[i] = len as u64;
            args.src_stride[i] = s;
            args.dst_stride[i] = d;
        }
        let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK)).min(1 << 20) as u32;
        let mut params = [
            (&raw mut src_base).cast::<c_void>(),
            (&raw mut dst_base).cast(),
            (&raw mut args).cast(),
        ];
        // SAFETY: params match `copy_strided64_eE(const u8*, u8*, StridedArgs64)`.
        unsafe {
            launch(
                gpu,
                kernel_name("copy_strided64", plan.elem_size)?,
                (blocks.max(1), 1, 1),
                (BLOCK, 1, 1),
                stream,
                &mut params,
            )
        }
    }
}

/// One strided outer dim over contiguous rows: a single 2-D DMA copy
/// (`cuMemcpy2DAsync` on unified addresses). `Ok(false)` when the plan is not
/// of that shape.
///
/// # Safety
///
/// As [`run_plan`].
unsafe fn try_memcpy_2d(gpu: &Gpu, plan: &CopyPlan, dst: u64, src: u64, stream: &CudaStream) -> Result<bool> {
    if plan.kind != PlanKind::Rows || plan.dims.len() != 2 {
        return Ok(false);
    }
    let (row, outer) = (plan.dims[0], plan.dims[1]);
    let width = row.len * plan.elem_size;
    if outer.src < width as isize || outer.dst < width as isize {
        return Ok(false); // negative or overlapping pitches: the kernel handles those
    }
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        srcHost: std::ptr::null(),
        srcDevice: src.wrapping_add_signed(plan.src_offset as i64),
        srcArray: std::ptr::null_mut(),
        srcPitch: outer.src as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.wrapping_add_signed(plan.dst_offset as i64),
        dstArray: std::ptr::null_mut(),
        dstPitch: outer.dst as usize,
        WidthInBytes: width,
        Height: outer.len,
    };
    gpu.bind()?;
    // SAFETY: both pitched regions lie inside the plan's spans (caller's contract).
    check("cuMemcpy2DAsync", unsafe {
        sys::cuMemcpy2DAsync_v2(&copy, stream.raw())
    })?;
    Ok(true)
}

/// GPU and device-accessibility of a tensor: `Some(ordinal)` for device,
/// managed and pinned memory (pinned memory is reachable from every GPU).
fn gpu_of(d: Device) -> Option<Option<u32>> {
    match d {
        Device::Cuda(i) | Device::CudaManaged(i) => Some(Some(i)),
        Device::CudaHost => Some(None),
        _ => None,
    }
}

fn plan_for(dst: &Tensor, src: &Tensor, opts: PlanOptions) -> Result<CopyPlan> {
    plan_copy(
        dst.shape(),
        dst.strides(),
        src.strides(),
        dst.dtype().size(),
        BaseAddrs {
            dst: dst.data_ptr() as usize,
            src: src.data_ptr() as usize,
        },
        opts,
    )
}

/// Enqueues `src → dst` on `stream` without synchronising. Both tensors must
/// be device or managed memory of `stream`'s GPU. Their storages record the
/// stream, so the pool does not reuse them elsewhere before this work is done.
pub fn copy_on_stream(dst: &Tensor, src: &Tensor, stream: &CudaStream) -> Result<()> {
    if dst.is_read_only() {
        return Err(Error::ReadOnly);
    }
    if dst.shape() != src.shape() {
        return Err(Error::ShapeMismatch {
            expected: dst.shape().to_vec(),
            got: src.shape().to_vec(),
        });
    }
    if dst.dtype() != src.dtype() {
        return Err(Error::DTypeMismatch {
            expected: dst.dtype(),
            got: src.dtype(),
        });
    }
    let ordinal = stream.ordinal();
    for d in [dst.device(), src.device()] {
        if !matches!(d, Device::Cuda(i) | Device::CudaManaged(i) if i == ordinal) {
            return Err(Error::DeviceMismatch {
                expected: Device::Cuda(ordinal),
                got: d,
            });
        }
    }
    let plan = plan_for(dst, src, PlanOptions::GPU)?;
    let handle = crate::stream::StreamHandle(stream.raw() as usize);
    dst.storage().record_stream(handle);
    src.storage().record_stream(handle);
    // SAFETY: both views lie inside live device storages of this GPU, and the
    // recorded stream keeps their memory from reuse until the work is done.
    unsafe {
        run_plan(
            device(ordinal)?,
            &plan,
            dst.data_ptr() as u64,
            src.data_ptr() as u64,
            stream,
        )
    }
}

/// Copies between tensors of which at least one lives on a CUDA device, on the
/// legacy default stream of the GPU involved. Copies that touch host-visible
/// memory synchronise before returning, so the host may read the result.
pub fn copy_tensor(dst: &Tensor, src: &Tensor) -> Result<()> {
    let (dg, sg) = (gpu_of(dst.device()), gpu_of(src.device()));
    match (dg, sg) {
        // Both reachable from one GPU through unified addressing.
        (Some(d), Some(s)) if d.is_none() || s.is_none() || d == s => {
            let ordinal = d.or(s).unwrap_or(0);
            let gpu = device(ordinal)?;
            let stream = CudaStream::legacy(ordinal);
            let plan = plan_for(dst, src, PlanOptions::GPU)?;
            let pinned = [dst.device(), src.device()].contains(&Device::CudaHost);
            let (dp, sp) = (dst.data_ptr() as u64, src.data_ptr() as u64);
            // The views lie inside live storages that outlive the synchronisation
            // at the end; pinned and managed memory are device-accessible through
            // unified addressing: the contract of `run_plan` and `try_memcpy_2d`.
            let done = match plan.kind {
                PlanKind::Empty => true,
                // One DMA, or one kernel on device / managed memory.
                PlanKind::Memcpy => {
                    // SAFETY: see above.
                    unsafe { run_plan(gpu, &plan, dp, sp, &stream)? };
                    true
                }
                _ if !pinned => {
                    // SAFETY: see above.
                    unsafe { run_plan(gpu, &plan, dp, sp, &stream)? };
                    true
                }
                // Pinned memory: a 2-D DMA when the rows are contiguous.
                // SAFETY: see above.
                _ => unsafe { try_memcpy_2d(gpu, &plan, dp, sp, &stream)? },
            };
            if !done {
                // A permutation across PCIe: DMA a contiguous copy, permute on the GPU.
                return if src.device() == Device::CudaHost {
                    let packed = src.contiguous()?; // CPU engine, pinned → pinned
                    let staged = Tensor::empty(src.shape(), src.dtype(), Device::Cuda(ordinal))?;
                    copy_tensor(&staged, &packed)?;
                    copy_tensor(dst, &staged)
                } else {
                    let packed = src.contiguous()?; // GPU kernel
                    let staged = Tensor::empty(dst.shape(), dst.dtype(), Device::CudaHost)?;
                    copy_tensor(&staged, &packed)?;
                    dst.copy_from(&staged) // CPU engine scatter
                };
            }
            if dst.device().is_host_accessible() || src.device().is_host_accessible() {
                stream.synchronize()?;
            }
            Ok(())
        }
        // Peer: gather contiguous on the source GPU, copy across, scatter.
        (Some(d), Some(s)) => {
            let (Some(d), Some(s)) = (d, s) else {
                return Err(Error::InvalidLayout("peer copy between two GPUs needs two ordinals"));
            };
            let src_c = src.contiguous()?;
            let staged = Tensor::empty(dst.shape(), dst.dtype(), Device::Cuda(d))?;
            let (dgpu, sgpu) = (device(d)?, device(s)?);
            sgpu.bind()?;
            // SAFETY: both buffers hold `nbytes` contiguous bytes on their GPUs.
            check("cuMemcpyPeer", unsafe {
                sys::cuMemcpyPeer(
                    staged.data_ptr() as u64,
                    dgpu.ctx,
                    src_c.data_ptr() as u64,
                    sgpu.ctx,
                    src_c.nbytes(),
                )
            })?;
            copy_tensor(dst, &staged)
        }
        // Host (pageable) → device.
        (Some(_), None) => {
            let staged = Tensor::empty(src.shape(), src.dtype(), Device::CudaHost)?;
            staged.copy_from(src)?; // parallel CPU gather into pinned memory
            copy_tensor(dst, &staged)
        }
        // Device → host (pageable).
        (None, Some(_)) => {
            let staged = Tensor::empty(dst.shape(), dst.dtype(), Device::CudaHost)?;
            copy_tensor(&staged, src)?; // GPU permute into pinned memory, synchronised
            dst.copy_from(&staged)
        }
        (None, None) => Err(Error::UnsupportedDevice {
            op: "GPU copy between host tensors",
            device: dst.device(),
        }),
    }
}

/// Fills a CUDA tensor with one raw element value.
pub fn fill_tensor(dst: &Tensor, value: &[u8]) -> Result<()> {
    let Some(g) = gpu_of(dst.device()) else {
        return Err(Error::UnsupportedDevice {
            op: "GPU fill",
            device: dst.device(),
        });
    };
    let ordinal = g.unwrap_or(0);
    let gpu = device(ordinal)?;
    let stream = CudaStream::legacy(ordinal);
    let plan = plan_fill(
        dst.shape(),
        dst.strides(),
        value.len(),
        dst.data_ptr() as usize,
        PlanOptions::GPU,
    )?;
    if plan.kind == PlanKind::Empty {
        return Ok(());
    }
    let dims = unit_dims(&plan);
    if dims.len() > MAX_DIMS || !fits_i32(plan.numel, &dims) {
        // Rare: fill through a broadcast host tensor and the general copy path.
        let src = Tensor::empty(&[1], dst.dtype(), Device::Cpu)?;
        src.fill_bytes(value)?;
        let shape: Vec<isize> = dst.shape().iter().map(|&d| d as isize).collect();
        let b = src.reshape(&vec![1; shape.len()])?.expand(&shape)?;
        return copy_tensor(dst, &b);
    }
    // The plan may have widened the element: repeat the value to fill it.
    let mut wide = [0u8; 16];
    for (i, b) in wide.iter_mut().take(plan.elem_size).enumerate() {
        *b = value[i % value.len()];
    }
    let mut args = strided_args(plan.numel, &dims);
    let mut base = (dst.data_ptr() as u64).wrapping_add_signed(plan.dst_offset as i64);
    let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK)).min(1 << 16) as u32;
    let mut params = [
        (&raw mut base).cast::<c_void>(),
        wide.as_mut_ptr().cast(),
        (&raw mut args).cast(),
    ];
    // SAFETY: params match `fill_eE(u8*, T, StridedArgs)` (the value is read as
    // `elem_size` bytes from `wide`); every index lies inside the view.
    unsafe {
        launch(
            gpu,
            kernel_name("fill", plan.elem_size)?,
            (blocks.max(1), 1, 1),
            (BLOCK, 1, 1),
            &stream,
            &mut params,
        )?
    };
    if dst.device().is_host_accessible() {
        stream.synchronize()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_division_is_exact_below_2_pow_31() {
        let divisors = [1u32, 2, 3, 7, 10, 16, 255, 1000, 65_537, (1 << 31) - 1, 1 << 30];
        let dividends = [0u32, 1, 2, 5, 99, 1 << 20, 123_456_789, (1 << 31) - 1];
        for d in divisors {
            let m = magic(d);
            for n in dividends {
                let q = ((u64::from(n) * u64::from(m.mul)) >> 32) as u32;
                let q = (q + n) >> m.shift;
                assert_eq!(q, n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn kernel_argument_structs_match_the_c_layout() {
        // StridedArgs: u32 + i32 + 16*12 + 16*4 + 16*4.
        assert_eq!(std::mem::size_of::<StridedArgs>(), 8 + 16 * 12 + 16 * 4 * 2);
        // StridedArgs64: u64, i32 (+4 pad), 3 arrays of 16 eight-byte values.
        assert_eq!(std::mem::size_of::<StridedArgs64>(), 16 + 16 * 8 * 3);
        assert_eq!(std::mem::offset_of!(TransposeArgs, batch), 24);
    }

    #[test]
    fn thirty_two_bit_bounds() {
        assert!(fits_i32(100, &[(10, 1, 1), (10, 10, 10)]));
        assert!(!fits_i32(1 << 31, &[(1 << 31, 1, 1)]));
        assert!(!fits_i32(4, &[(2, 1 << 31, 1), (2, 1, 2)]));
    }
}
