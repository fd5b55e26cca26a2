//! The ROCm side of the shared GPU copy paths (`tensor::device_copy`): DMA
//! through the HIP runtime, kernels from the hiprtc-compiled code object.

use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

use super::context::{check, device};
use super::device_backend::RocmBackend;
use super::ffi;
use super::kernels;
use super::stream::{RocmEvent, RocmStream};
use crate::backend::gpu_runtime::{GpuEvent, GpuRuntime, GpuStream};
use crate::backend::launch::KernelCall;
use crate::device::Device;
use crate::error::Result;

impl GpuRuntime for RocmBackend {
    fn locate(&self, d: Device) -> Option<Option<u32>> {
        match d {
            Device::Rocm(i) => Some(Some(i)),
            Device::RocmHost => Some(None),
            _ => None,
        }
    }

    fn device_memory(&self, ordinal: u32) -> Device {
        Device::Rocm(ordinal)
    }

    fn pinned_host(&self) -> Device {
        Device::RocmHost
    }

    fn work_stream(&self, ordinal: u32) -> GpuStream {
        GpuStream {
            ordinal,
            handle: RocmStream::default_stream(ordinal).handle(),
        }
    }

    fn synchronize(&self, stream: &GpuStream) -> Result<()> {
        stream_of(stream).synchronize()
    }

    unsafe fn memcpy(&self, ordinal: u32, dst: u64, src: u64, bytes: usize, stream: &GpuStream) -> Result<()> {
        let _current = device(ordinal)?.bind()?;
        // SAFETY: both ranges are valid device-accessible memory of `bytes`.
        check("hipMemcpyAsync", unsafe {
            ffi::hipMemcpyAsync(
                dst as *mut c_void,
                src as *const c_void,
                bytes,
                ffi::MEMCPY_DEFAULT,
                stream_of(stream).raw(),
            )
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
        // HIP's 2-D DMA misbehaves on pitches and widths that are not multiples
        // of 4 bytes: those go through the permute kernel instead.
        if !(dst_pitch.is_multiple_of(4) && src_pitch.is_multiple_of(4) && width.is_multiple_of(4)) {
            return Ok(false);
        }
        let _current = device(ordinal)?.bind()?;
        // SAFETY: both pitched regions are valid (caller's contract).
        check("hipMemcpy2DAsync", unsafe {
            ffi::hipMemcpy2DAsync(
                dst as *mut c_void,
                dst_pitch,
                src as *const c_void,
                src_pitch,
                width,
                height,
                ffi::MEMCPY_DEFAULT,
                stream_of(stream).raw(),
            )
        })?;
        Ok(true)
    }

    fn kernel_image(&self, ordinal: u32) -> Result<Arc<Vec<u8>>> {
        Ok(kernels::module(&device(ordinal)?.arch)?.0)
    }

    unsafe fn load_module(&self, ordinal: u32, image: &[u8]) -> Result<usize> {
        let _current = device(ordinal)?.bind()?;
        let mut module: ffi::Module = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object for this GPU (the caller's
        // contract), alive for the call.
        check("hipModuleLoadData", unsafe {
            ffi::hipModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Ok(module as usize)
    }

    unsafe fn module_function(&self, ordinal: u32, module: usize, name: &CStr) -> Result<usize> {
        let _current = device(ordinal)?.bind()?;
        let mut f: ffi::Function = std::ptr::null_mut();
        // SAFETY: `module` is loaded (the caller's contract); `name` is a C string.
        check("hipModuleGetFunction", unsafe {
            ffi::hipModuleGetFunction(&mut f, module as ffi::Module, name.as_ptr())
        })?;
        Ok(f as usize)
    }

    unsafe fn unload_module(&self, ordinal: u32, module: usize) {
        let _current = device(ordinal).and_then(|g| g.bind());
        // SAFETY: loaded and unused (the caller's contract).
        unsafe { ffi::hipModuleUnload(module as ffi::Module) };
    }

    unsafe fn launch(
        &self,
        ordinal: u32,
        call: &KernelCall,
        params: &mut [*mut c_void],
        stream: &GpuStream,
    ) -> Result<()> {
        let gpu = device(ordinal)?;
        let f = self.kernel(ordinal, call.name)? as ffi::Function;
        let _current = gpu.bind()?;
        // SAFETY: forwarded from the caller; grid and block sizes are within limits.
        check("hipModuleLaunchKernel", unsafe {
            ffi::hipModuleLaunchKernel(
                f,
                call.grid.0,
                call.grid.1,
                call.grid.2,
                call.block.0,
                call.block.1,
                call.block.2,
                0,
                stream_of(stream).raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn record(&self, stream: &GpuStream) -> Result<Box<dyn GpuEvent>> {
        let ev = RocmEvent::new(stream.ordinal, false)?;
        ev.record(&stream_of(stream))?;
        Ok(Box::new(ev))
    }

    fn handoff(&self, producer: &GpuStream, consumer: &GpuStream) -> Result<()> {
        super::stream::handoff(&stream_of(producer), &stream_of(consumer))
    }

    fn try_enable_peer_access(&self, ordinal: u32, peer: u32) -> Result<bool> {
        let gpu = device(ordinal)?;
        device(peer)?;
        let mut can: c_int = 0;
        // SAFETY: both ordinals were reported by the probe; `can` is a valid out-pointer.
        check("hipDeviceCanAccessPeer", unsafe {
            ffi::hipDeviceCanAccessPeer(&mut can, ordinal as c_int, peer as c_int)
        })?;
        let ok = can != 0 && {
            let _current = gpu.bind()?;
            // SAFETY: `ordinal` is current; flags must be 0. Another library on the
            // same device may have enabled it already: that is success.
            let rc = unsafe { ffi::hipDeviceEnablePeerAccess(peer as c_int, 0) };
            if rc != ffi::ERROR_PEER_ACCESS_ALREADY_ENABLED {
                check("hipDeviceEnablePeerAccess", rc)?;
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
        device(dst_ordinal)?;
        device(src_ordinal)?;
        let _current = device(stream.ordinal)?.bind()?;
        // SAFETY: both ranges are live device memory of their GPUs until the
        // stream's work is done (caller's contract); `stream` is live.
        check("hipMemcpyPeerAsync", unsafe {
            ffi::hipMemcpyPeerAsync(
                dst as *mut c_void,
                dst_ordinal as c_int,
                src as *const c_void,
                src_ordinal as c_int,
                bytes,
                stream_of(stream).raw(),
            )
        })
    }
}

/// The stream a [`GpuStream`] names, borrowed (never destroyed here).
fn stream_of(s: &GpuStream) -> RocmStream {
    // SAFETY: a StreamHandle is a live stream of its GPU (its contract).
    unsafe { RocmStream::borrowed(s.ordinal, s.handle.as_raw()) }
}

impl GpuEvent for RocmEvent {
    fn synchronize(&self) -> Result<()> {
        RocmEvent::synchronize(self)
    }
}
