//! The CUDA side of the shared GPU copy paths (`tensor::device_copy`): DMA
//! through the driver API, kernels from the NVRTC-compiled module.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{check, device, driver};
use super::device_backend::CudaBackend;
use super::kernels;
use super::stream::{CudaEvent, CudaStream};
use crate::backend::gpu_runtime::{GpuEvent, GpuRuntime, GpuStream};
use crate::backend::launch::KernelCall;
use crate::device::Device;
use crate::error::Result;

impl GpuRuntime for CudaBackend {
    fn locate(&self, d: Device) -> Option<Option<u32>> {
        match d {
            Device::Cuda(i) | Device::CudaManaged(i) => Some(Some(i)),
            Device::CudaHost => Some(None),
            _ => None,
        }
    }

    fn device_memory(&self, ordinal: u32) -> Device {
        Device::Cuda(ordinal)
    }

    fn pinned_host(&self) -> Device {
        Device::CudaHost
    }

    fn work_stream(&self, ordinal: u32) -> GpuStream {
        GpuStream {
            ordinal,
            handle: CudaStream::current(ordinal).handle(),
        }
    }

    fn synchronize(&self, stream: &GpuStream) -> Result<()> {
        stream_of(stream).synchronize()
    }

    unsafe fn memcpy(&self, ordinal: u32, dst: u64, src: u64, bytes: usize, stream: &GpuStream) -> Result<()> {
        let _current = device(ordinal)?.bind()?;
        // SAFETY: both ranges are valid device-accessible memory (UVA) of `bytes`.
        check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dst, src, bytes, stream_of(stream).raw())
        })
    }

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
    ) -> Result<bool> {
        // Pitches past the device's limit are refused with CUDA_ERROR_INVALID_VALUE
        // (cuMemcpy2D's documentation): the caller's kernel path takes those.
        let gpu = device(ordinal)?;
        if dst_pitch > gpu.max_pitch || src_pitch > gpu.max_pitch {
            return Ok(false);
        }
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: width,
            Height: height,
        };
        let _current = gpu.bind()?;
        // SAFETY: both pitched regions are valid (caller's contract).
        check("cuMemcpy2DAsync", unsafe {
            sys::cuMemcpy2DAsync_v2(&copy, stream_of(stream).raw())
        })?;
        Ok(true)
    }

    fn kernel_image(&self, ordinal: u32) -> Result<Arc<Vec<u8>>> {
        Ok(kernels::module(&device(ordinal)?.arch)?.0)
    }

    unsafe fn load_module(&self, ordinal: u32, image: &[u8]) -> Result<usize> {
        let _current = device(ordinal)?.bind()?;
        // SAFETY: `image` is a complete cubin for this GPU (the caller's
        // contract), alive for the call.
        let module = driver("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        Ok(module as usize)
    }

    unsafe fn module_function(&self, ordinal: u32, module: usize, name: &CStr) -> Result<usize> {
        let _current = device(ordinal)?.bind()?;
        // SAFETY: `module` is loaded (the caller's contract).
        let f = driver("cuModuleGetFunction", unsafe {
            result::module::get_function(module as sys::CUmodule, name.to_owned())
        })?;
        Ok(f as usize)
    }

    unsafe fn unload_module(&self, ordinal: u32, module: usize) {
        let _current = device(ordinal).and_then(|g| g.bind());
        // SAFETY: loaded and unused (the caller's contract).
        let _ = unsafe { result::module::unload(module as sys::CUmodule) };
    }

    unsafe fn launch(
        &self,
        ordinal: u32,
        call: &KernelCall,
        params: &mut [*mut c_void],
        stream: &GpuStream,
    ) -> Result<()> {
        let gpu = device(ordinal)?;
        let f = self.kernel(ordinal, call.name)? as sys::CUfunction;
        let _current = gpu.bind()?;
        // SAFETY: forwarded from the caller; grid and block sizes are within limits.
        driver("cuLaunchKernel", unsafe {
            result::launch_kernel(f, call.grid, call.block, 0, stream_of(stream).raw(), params)
        })
    }

    fn record(&self, stream: &GpuStream) -> Result<Box<dyn GpuEvent>> {
        let ev = CudaEvent::new(stream.ordinal, false)?;
        ev.record(&stream_of(stream))?;
        Ok(Box::new(ev))
    }

    fn handoff(&self, producer: &GpuStream, consumer: &GpuStream) -> Result<()> {
        super::stream::handoff(&stream_of(producer), &stream_of(consumer))
    }

    fn try_enable_peer_access(&self, ordinal: u32, peer: u32) -> Result<bool> {
        let (gpu, other) = (device(ordinal)?, device(peer)?);
        let mut can = 0;
        // SAFETY: both are valid devices; `can` is a valid out-pointer.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, gpu.dev, other.dev)
        })?;
        let ok = can != 0 && {
            let _current = gpu.bind()?;
            // SAFETY: `ordinal`'s context is current, `other.ctx` a live primary
            // context of another device; flags must be 0. Another library sharing
            // the primary context may have enabled it already: that is success.
            let rc = unsafe { sys::cuCtxEnablePeerAccess(other.ctx, 0) };
            if rc != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                check("cuCtxEnablePeerAccess", rc)?;
            }
            true
        };
        Ok(ok)
    }

    unsafe fn peer_copy(
        &self,
        dst_ordinal: u32,
        dst: u64,
        src_ordinal: u32,
        src: u64,
        bytes: usize,
        stream: &GpuStream,
    ) -> Result<()> {
        let (dgpu, sgpu) = (device(dst_ordinal)?, device(src_ordinal)?);
        let _current = device(stream.ordinal)?.bind()?;
        // SAFETY: both ranges are live device memory of their GPUs until the
        // stream's work is done (caller's contract); `stream` is live.
        driver("cuMemcpyPeerAsync", unsafe {
            result::memcpy_peer_async(dgpu.ctx, dst, sgpu.ctx, src, bytes, stream_of(stream).raw())
        })
    }
}

/// The stream a [`GpuStream`] names, borrowed (never destroyed here).
fn stream_of(s: &GpuStream) -> CudaStream {
    // SAFETY: a StreamHandle is a live stream of its GPU (its contract).
    unsafe { CudaStream::borrowed(s.ordinal, s.handle.as_raw()) }
}

impl GpuEvent for CudaEvent {
    fn synchronize(&self) -> Result<()> {
        CudaEvent::synchronize(self)
    }
}
