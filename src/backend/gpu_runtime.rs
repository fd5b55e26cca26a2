//! What a GPU runtime (CUDA, HIP) provides to the copy paths, which are
//! written once over it (`tensor::device_copy`): DMA, kernel launches,
//! events, peer access; and the two ways a planned copy runs on a GPU (one DMA
//! or kernel launches, one 2-D DMA).

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::Arc;

use super::PerDevice;
use super::launch::{KERNELS, KernelCall, copy_call, split_for_32bit};
use crate::copy::plan::{CopyPlan, PlanKind};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::StreamHandle;

/// A stream of one GPU, as the copy paths pass it around.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuStream {
    /// The GPU it belongs to.
    pub ordinal: u32,
    /// The stream.
    pub handle: StreamHandle,
}

/// An event recorded on a stream (destroyed on drop).
pub trait GpuEvent: Send {
    /// Blocks the host until the work the event captured is done.
    fn synchronize(&self) -> Result<()>;
}

/// What a GPU runtime provides to the shared copy paths.
pub trait GpuRuntime: Send + Sync {
    /// `Some(Some(i))` for device or managed memory of GPU `i`, `Some(None)`
    /// for its pinned host memory (reachable from every GPU), `None` otherwise.
    fn locate(&self, device: Device) -> Option<Option<u32>>;
    /// Device memory of GPU `ordinal`.
    fn device_memory(&self, ordinal: u32) -> Device;
    /// Pinned host memory.
    fn pinned_host(&self) -> Device;
    /// The stream devtensor's copies and fills on GPU `ordinal` run on in the
    /// calling thread: its current stream, else the default one.
    fn work_stream(&self, ordinal: u32) -> GpuStream;
    /// Blocks the host until the stream's work is done.
    fn synchronize(&self, stream: &GpuStream) -> Result<()>;

    /// Enqueues a copy of `bytes` between unified addresses.
    ///
    /// # Safety
    ///
    /// Both ranges are device-accessible and stay alive until the work is done.
    unsafe fn memcpy(&self, ordinal: u32, dst: u64, src: u64, bytes: usize, stream: &GpuStream) -> Result<()>;

    /// Enqueues a pitched 2-D copy of `height` rows of `width` bytes; `Ok(false)`
    /// when the runtime cannot do this geometry with DMA.
    ///
    /// # Safety
    ///
    /// As [`GpuRuntime::memcpy`], for every row.
    #[allow(clippy::too_many_arguments)]
    unsafe fn memcpy_2d(
        &self,
        ordinal: u32,
        dst: u64,
        dst_pitch: usize,
        src: u64,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: &GpuStream,
    ) -> Result<bool>;

    /// The kernel module for GPU `ordinal`'s architecture (a cubin or a code
    /// object), compiled at run time or read from the caches.
    fn kernel_image(&self, ordinal: u32) -> Result<Arc<Vec<u8>>>;

    /// Loads `image` on GPU `ordinal`; the module handle.
    ///
    /// # Safety
    ///
    /// `image` is a complete module for that GPU's architecture.
    unsafe fn load_module(&self, ordinal: u32, image: &[u8]) -> Result<usize>;

    /// The function `name` of a loaded module.
    ///
    /// # Safety
    ///
    /// `module` came from [`GpuRuntime::load_module`] and is loaded.
    unsafe fn module_function(&self, ordinal: u32, module: usize, name: &CStr) -> Result<usize>;

    /// Unloads a module nothing refers to.
    ///
    /// # Safety
    ///
    /// `module` came from [`GpuRuntime::load_module`] and none of its
    /// functions is used afterwards.
    unsafe fn unload_module(&self, ordinal: u32, module: usize);

    /// The kernel `name` of the manifest on GPU `ordinal`, its module loaded
    /// once per GPU (and every kernel of the manifest resolved then).
    fn kernel(&self, ordinal: u32, name: &str) -> Result<usize> {
        static MODULES: PerDevice<Arc<HashMap<&'static str, usize>>> = PerDevice::new();
        let load = || -> Result<Arc<HashMap<&'static str, usize>>> {
            let image = self.kernel_image(ordinal)?;
            // SAFETY: the image was built for this GPU's architecture; the module
            // stays loaded for the life of the process.
            let module = unsafe { self.load_module(ordinal, &image)? };
            let resolve = |k: &'static str| -> Result<(&'static str, usize)> {
                let cname = CString::new(k).map_err(|_| Error::Internal("a kernel name with a NUL byte"))?;
                // SAFETY: `module` is loaded.
                Ok((k, unsafe { self.module_function(ordinal, module, &cname)? }))
            };
            let table: Result<HashMap<_, _>> = KERNELS.iter().map(|&k| resolve(k)).collect();
            if table.is_err() {
                // SAFETY: loaded above and not shared: nothing refers to it.
                unsafe { self.unload_module(ordinal, module) };
            }
            Ok(Arc::new(table?))
        };
        let table = MODULES.get_or_try_init(self.device_memory(ordinal), load)?;
        table
            .get(name)
            .copied()
            .ok_or_else(|| Error::MissingKernel(name.to_owned()))
    }

    /// Launches a kernel of the manifest with `params` (pointers to each argument).
    ///
    /// # Safety
    ///
    /// `params` match the kernel's parameters in order and every pointer
    /// argument addresses device-accessible memory large enough for the launch.
    unsafe fn launch(
        &self,
        ordinal: u32,
        call: &KernelCall,
        params: &mut [*mut c_void],
        stream: &GpuStream,
    ) -> Result<()>;

    /// Records the current end of `stream`'s work in a new event.
    fn record(&self, stream: &GpuStream) -> Result<Box<dyn GpuEvent>>;
    /// Work enqueued on `producer` so far happens before work later enqueued on
    /// `consumer` (an event, waited on by the device; the streams may belong to
    /// different GPUs).
    fn handoff(&self, producer: &GpuStream, consumer: &GpuStream) -> Result<()>;

    /// Makes GPU `peer`'s memory accessible to kernels and copies running on
    /// GPU `ordinal`; `Ok(false)` where the devices cannot. Called once per
    /// ordered pair: the copy paths remember the answer.
    fn try_enable_peer_access(&self, ordinal: u32, peer: u32) -> Result<bool>;

    /// Enqueues a copy of `bytes` contiguous bytes from device memory of GPU
    /// `src_ordinal` to device memory of GPU `dst_ordinal` on `stream`.
    ///
    /// # Safety
    ///
    /// Both ranges are live device memory of their GPUs until the work is done.
    unsafe fn peer_copy(
        &self,
        dst_ordinal: u32,
        dst: u64,
        src_ordinal: u32,
        src: u64,
        bytes: usize,
        stream: &GpuStream,
    ) -> Result<()>;
}

/// Runs a planned copy between two device-accessible addresses.
///
/// # Safety
///
/// `dst` / `src` are device-accessible addresses of element `[0, ..]` of the
/// views the plan was made from, valid for the plan's spans, and not freed
/// before the work on `stream` completes.
pub unsafe fn run_plan(rt: &dyn GpuRuntime, plan: &CopyPlan, dst: u64, src: u64, stream: &GpuStream) -> Result<()> {
    let dst_base = dst.wrapping_add_signed(plan.dst_offset as i64);
    let src_base = src.wrapping_add_signed(plan.src_offset as i64);
    let ordinal = stream.ordinal;
    match plan.kind {
        PlanKind::Empty => Ok(()),
        // SAFETY: both ranges are valid device-accessible memory (caller's contract).
        PlanKind::Memcpy => unsafe { rt.memcpy(ordinal, dst_base, src_base, plan.bytes(), stream) },
        _ => {
            // Past 2^31 elements (or offsets): one launch per 32-bit piece.
            for piece in split_for_32bit(plan) {
                let mut src_base = src.wrapping_add_signed(piece.src_offset as i64);
                let mut dst_base = dst.wrapping_add_signed(piece.dst_offset as i64);
                let mut call = copy_call(&piece, dst_base, src_base)?;
                let mut params = [
                    (&raw mut src_base).cast::<c_void>(),
                    (&raw mut dst_base).cast(),
                    call.args_ptr(),
                ];
                // SAFETY: every copy kernel takes `(const u8* src, u8* dst, Args)`, and
                // every index it forms lies inside the piece's part of the plan's spans.
                unsafe { rt.launch(ordinal, &call, &mut params, stream)? };
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
pub unsafe fn try_memcpy_2d(
    rt: &dyn GpuRuntime,
    plan: &CopyPlan,
    dst: u64,
    src: u64,
    stream: &GpuStream,
) -> Result<bool> {
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
        rt.memcpy_2d(
            stream.ordinal,
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
