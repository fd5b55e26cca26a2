//! GPU copies, written once for every GPU runtime: planned on the host by the
//! shared planner, then one DMA or one kernel launch; host↔device copies
//! stage through pinned memory and permute on the GPU. A runtime (CUDA, HIP)
//! supplies the handful of calls in [`GpuRuntime`].

use std::ffi::c_void;

use super::launch::{KernelCall, copy_call, fill_call, split_for_32bit};
use crate::copy::plan::{BaseAddrs, CopyPlan, PlanKind, PlanOptions, plan_copy, plan_fill};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::StreamHandle;
use crate::tensor::Tensor;

/// What a GPU runtime provides to the shared copy paths.
pub trait GpuRuntime {
    /// Its stream type.
    type Stream;

    /// `Some(Some(i))` for device or managed memory of GPU `i`, `Some(None)`
    /// for its pinned host memory (reachable from every GPU), `None` otherwise.
    fn locate(device: Device) -> Option<Option<u32>>;
    /// Device memory of GPU `ordinal`.
    fn device_memory(ordinal: u32) -> Device;
    /// Pinned host memory.
    fn pinned_host() -> Device;
    /// The stream blocking copies run on (the legacy / null default stream).
    fn default_stream(ordinal: u32) -> Self::Stream;
    /// The stream's GPU.
    fn stream_ordinal(stream: &Self::Stream) -> u32;
    /// The stream as the handle allocators record.
    fn stream_handle(stream: &Self::Stream) -> StreamHandle;
    /// Blocks the host until the stream's work is done.
    fn synchronize(stream: &Self::Stream) -> Result<()>;

    /// Enqueues a copy of `bytes` between unified addresses.
    ///
    /// # Safety
    ///
    /// Both ranges are device-accessible and stay alive until the work is done.
    unsafe fn memcpy(ordinal: u32, dst: u64, src: u64, bytes: usize, stream: &Self::Stream) -> Result<()>;

    /// Enqueues a pitched 2-D copy of `height` rows of `width` bytes; `Ok(false)`
    /// when the runtime cannot do this geometry with DMA.
    ///
    /// # Safety
    ///
    /// As [`GpuRuntime::memcpy`], for every row.
    #[allow(clippy::too_many_arguments)]
    unsafe fn memcpy_2d(
        ordinal: u32,
        dst: u64,
        dst_pitch: usize,
        src: u64,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: &Self::Stream,
    ) -> Result<bool>;

    /// Launches a kernel of the manifest with `params` (pointers to each argument).
    ///
    /// # Safety
    ///
    /// `params` match the kernel's parameters in order and every pointer
    /// argument addresses device-accessible memory large enough for the launch.
    unsafe fn launch(ordinal: u32, call: &KernelCall, params: &mut [*mut c_void], stream: &Self::Stream) -> Result<()>;

    /// Copies `bytes` contiguous bytes from GPU `src_ordinal` to GPU `dst_ordinal`
    /// and waits for it.
    ///
    /// # Safety
    ///
    /// Both ranges are live device memory of their GPUs.
    unsafe fn peer_copy(dst_ordinal: u32, dst: u64, src_ordinal: u32, src: u64, bytes: usize) -> Result<()>;
}

/// Runs a planned copy between two device-accessible addresses.
///
/// # Safety
///
/// `dst` / `src` are device-accessible addresses of element `[0, ..]` of the
/// views the plan was made from, valid for the plan's spans, and not freed
/// before the work on `stream` completes.
pub unsafe fn run_plan<R: GpuRuntime>(plan: &CopyPlan, dst: u64, src: u64, stream: &R::Stream) -> Result<()> {
    let dst_base = dst.wrapping_add_signed(plan.dst_offset as i64);
    let src_base = src.wrapping_add_signed(plan.src_offset as i64);
    let ordinal = R::stream_ordinal(stream);
    match plan.kind {
        PlanKind::Empty => Ok(()),
        // SAFETY: both ranges are valid device-accessible memory (caller's contract).
        PlanKind::Memcpy => unsafe { R::memcpy(ordinal, dst_base, src_base, plan.bytes(), stream) },
        _ => {
            // Past 2^31 elements (or offsets): one launch per 32-bit piece.
            for piece in split_for_32bit(plan) {
                let mut call = copy_call(&piece)?;
                let mut src_base = src.wrapping_add_signed(piece.src_offset as i64);
                let mut dst_base = dst.wrapping_add_signed(piece.dst_offset as i64);
                let mut params = [
                    (&raw mut src_base).cast::<c_void>(),
                    (&raw mut dst_base).cast(),
                    call.args_ptr(),
                ];
                // SAFETY: every copy kernel takes `(const u8* src, u8* dst, Args)`, and
                // every index it forms lies inside the piece's part of the plan's spans.
                unsafe { R::launch(ordinal, &call, &mut params, stream)? };
            }
            Ok(())
        }
    }
}

/// One strided outer dim over contiguous rows: a single 2-D DMA copy.
/// `Ok(false)` when the plan is not of that shape or the runtime declines.
///
/// # Safety
///
/// As [`run_plan`].
unsafe fn try_memcpy_2d<R: GpuRuntime>(plan: &CopyPlan, dst: u64, src: u64, stream: &R::Stream) -> Result<bool> {
    if plan.kind != PlanKind::Rows || plan.dims.len() != 2 {
        return Ok(false);
    }
    let (row, outer) = (plan.dims[0], plan.dims[1]);
    let width = row.len * plan.elem_size;
    if outer.src < width as isize || outer.dst < width as isize {
        return Ok(false); // negative or overlapping pitches: the kernel handles those
    }
    // SAFETY: both pitched regions lie inside the plan's spans (caller's contract).
    unsafe {
        R::memcpy_2d(
            R::stream_ordinal(stream),
            dst.wrapping_add_signed(plan.dst_offset as i64),
            outer.dst as usize,
            src.wrapping_add_signed(plan.src_offset as i64),
            outer.src as usize,
            width,
            outer.len,
            stream,
        )
    }
}

fn plan_for(dst: &Tensor, src: &Tensor) -> Result<CopyPlan> {
    plan_copy(
        dst.shape(),
        dst.strides(),
        src.strides(),
        dst.dtype().size(),
        BaseAddrs {
            dst: dst.data_ptr() as usize,
            src: src.data_ptr() as usize,
        },
        PlanOptions::GPU,
    )
}

fn check_same_kind(dst: &Tensor, src: &Tensor) -> Result<()> {
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
    Ok(())
}

/// Enqueues `src → dst` on `stream` without synchronising. Both tensors must
/// be device or managed memory of `stream`'s GPU. Their storages record the
/// stream, so the pool does not reuse them elsewhere before this work is done.
pub fn copy_on_stream<R: GpuRuntime>(dst: &Tensor, src: &Tensor, stream: &R::Stream) -> Result<()> {
    check_same_kind(dst, src)?;
    let ordinal = R::stream_ordinal(stream);
    for d in [dst.device(), src.device()] {
        if R::locate(d) != Some(Some(ordinal)) {
            return Err(Error::DeviceMismatch {
                expected: R::device_memory(ordinal),
                got: d,
            });
        }
    }
    let plan = plan_for(dst, src)?;
    let handle = R::stream_handle(stream);
    dst.storage().record_stream(handle);
    src.storage().record_stream(handle);
    // SAFETY: both views lie inside live device storages of this GPU, and the
    // recorded stream keeps their memory from reuse until the work is done.
    unsafe { run_plan::<R>(&plan, dst.data_ptr() as u64, src.data_ptr() as u64, stream) }
}

/// Copies between tensors of which at least one lives on a GPU of runtime `R`,
/// on the default stream of the GPU involved. Copies that touch host-visible
/// memory synchronise before returning, so the host may read the result.
pub fn copy_tensor<R: GpuRuntime>(dst: &Tensor, src: &Tensor) -> Result<()> {
    check_same_kind(dst, src)?;
    match (R::locate(dst.device()), R::locate(src.device())) {
        // Both reachable from one GPU through unified addressing.
        (Some(d), Some(s)) if d.is_none() || s.is_none() || d == s => {
            let ordinal = d.or(s).unwrap_or(0);
            let stream = R::default_stream(ordinal);
            let plan = plan_for(dst, src)?;
            let pinned = [dst.device(), src.device()].contains(&R::pinned_host());
            let (dp, sp) = (dst.data_ptr() as u64, src.data_ptr() as u64);
            // The views lie inside live storages that outlive the synchronisation
            // at the end; pinned and managed memory are device-accessible through
            // unified addressing: the contract of `run_plan` and `try_memcpy_2d`.
            let done = match plan.kind {
                // One DMA, or one kernel on device / managed memory.
                PlanKind::Empty | PlanKind::Memcpy => {
                    // SAFETY: see above.
                    unsafe { run_plan::<R>(&plan, dp, sp, &stream)? };
                    true
                }
                _ if !pinned => {
                    // SAFETY: see above.
                    unsafe { run_plan::<R>(&plan, dp, sp, &stream)? };
                    true
                }
                // Pinned memory: a 2-D DMA when the rows are contiguous.
                // SAFETY: see above.
                _ => unsafe { try_memcpy_2d::<R>(&plan, dp, sp, &stream)? },
            };
            if !done {
                // A permutation across the bus: DMA a contiguous copy, permute on the GPU.
                return if src.device() == R::pinned_host() {
                    let packed = src.contiguous()?; // CPU engine, pinned → pinned
                    let staged = Tensor::empty(src.shape(), src.dtype(), R::device_memory(ordinal))?;
                    copy_tensor::<R>(&staged, &packed)?;
                    copy_tensor::<R>(dst, &staged)
                } else {
                    let packed = src.contiguous()?; // GPU kernel
                    let staged = Tensor::empty(dst.shape(), dst.dtype(), R::pinned_host())?;
                    copy_tensor::<R>(&staged, &packed)?;
                    dst.copy_from(&staged) // CPU engine scatter
                };
            }
            if dst.device().is_host_accessible() || src.device().is_host_accessible() {
                R::synchronize(&stream)?;
            }
            Ok(())
        }
        // Peer: gather contiguous on the source GPU, copy across, scatter.
        (Some(Some(d)), Some(Some(s))) => {
            let src_c = src.contiguous()?;
            let staged = Tensor::empty(dst.shape(), dst.dtype(), R::device_memory(d))?;
            // Finish the gather before the peer copy reads it, and the destination
            // GPU's earlier work before the copy (on the source GPU's stream, not
            // ordered with the destination's) writes `staged`, a block its pool
            // may have handed back while a kernel still used it.
            R::synchronize(&R::default_stream(s))?;
            R::synchronize(&R::default_stream(d))?;
            // SAFETY: both buffers hold `nbytes` contiguous bytes on their GPUs.
            unsafe { R::peer_copy(d, staged.data_ptr() as u64, s, src_c.data_ptr() as u64, src_c.nbytes())? };
            copy_tensor::<R>(dst, &staged)
        }
        (Some(_), Some(_)) => unreachable!("the first arm takes every pair with pinned memory"),
        // Another runtime's device memory: through a host tensor.
        (Some(_), None) if !src.device().is_host_accessible() => copy_tensor::<R>(dst, &src.to(Device::Cpu)?),
        (None, Some(_)) if !dst.device().is_host_accessible() => {
            let host = Tensor::empty(dst.shape(), dst.dtype(), Device::Cpu)?;
            copy_tensor::<R>(&host, src)?;
            dst.copy_from(&host)
        }
        // Host (pageable) → device.
        (Some(_), None) => {
            let staged = Tensor::empty(src.shape(), src.dtype(), R::pinned_host())?;
            staged.copy_from(src)?; // parallel CPU gather into pinned memory
            copy_tensor::<R>(dst, &staged)
        }
        // Device → host (pageable).
        (None, Some(_)) => {
            let staged = Tensor::empty(dst.shape(), dst.dtype(), R::pinned_host())?;
            copy_tensor::<R>(&staged, src)?; // GPU permute into pinned memory, synchronised
            dst.copy_from(&staged)
        }
        (None, None) => Err(Error::UnsupportedDevice {
            op: "GPU copy between host tensors",
            device: dst.device(),
        }),
    }
}

/// Fills a GPU tensor of runtime `R` with one raw element value.
pub fn fill_tensor<R: GpuRuntime>(dst: &Tensor, value: &[u8]) -> Result<()> {
    let Some(g) = R::locate(dst.device()) else {
        return Err(Error::UnsupportedDevice {
            op: "GPU fill",
            device: dst.device(),
        });
    };
    if dst.is_read_only() {
        return Err(Error::ReadOnly);
    }
    let ordinal = g.unwrap_or(0);
    let stream = R::default_stream(ordinal);
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
    let base = (dst.data_ptr() as usize).wrapping_add_signed(plan.dst_offset);
    let misaligned = plan.dims.iter().fold(base, |g, d| g | d.dst.unsigned_abs()) % plan.elem_size != 0;
    if misaligned {
        // A foreign view whose elements are not naturally aligned (DLPack's
        // byte_offset allows it): the fill kernel's element stores would fault, so
        // copy from one aligned device element, broadcast; the copy planner splits
        // the elements into aligned units.
        let one = Tensor::empty(&[1], dst.dtype(), R::device_memory(ordinal))?;
        fill_tensor::<R>(&one, value)?;
        let shape: Vec<isize> = dst.shape().iter().map(|&d| d as isize).collect();
        let src = one.reshape(&vec![1; shape.len()])?.expand(&shape)?;
        return copy_tensor::<R>(dst, &src);
    }
    // Every size runs on the device: past 2^31 elements, one launch per 32-bit piece.
    for piece in split_for_32bit(&plan) {
        let Some((mut call, mut wide)) = fill_call(&piece, value)? else {
            return Err(Error::InvalidLayout(
                "a fill value of 1 to 16 bytes over at most 16 dims",
            ));
        };
        let mut base = (dst.data_ptr() as u64).wrapping_add_signed(piece.dst_offset as i64);
        let mut params = [
            (&raw mut base).cast::<c_void>(),
            wide.as_mut_ptr().cast(),
            call.args_ptr(),
        ];
        // SAFETY: params match `fill_eE(u8*, T, StridedArgs)` (the value is read as
        // `elem_size` bytes from `wide`); every index lies inside the view.
        unsafe { R::launch(ordinal, &call, &mut params, &stream)? };
    }
    if dst.device().is_host_accessible() {
        R::synchronize(&stream)?;
    }
    Ok(())
}
