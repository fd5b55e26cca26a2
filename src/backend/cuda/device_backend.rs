//! The CUDA [`DeviceBackend`]: the driver API's devices, pools, copies and streams.

use std::sync::Arc;

use super::stream::CudaStream;
use super::{alloc, context, probe, stream};
use crate::alloc::{MemoryStats, NDAlloc};
use crate::backend::device_backend::{BoundDevice, DeviceBackend};
use crate::backend::gpu_runtime::GpuRuntime;
use crate::backend::{BackendStatus, cuda_status};
use crate::device::{Backend, Device};
use crate::error::Result;
use crate::stream::StreamHandle;

/// CUDA, through the driver API (cudarc) and NVRTC.
#[derive(Debug)]
pub struct CudaBackend;

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> Backend {
        Backend::Cuda
    }

    fn status(&self) -> &'static BackendStatus {
        cuda_status()
    }

    fn current_ordinal(&self) -> Result<u32> {
        context::current_or_used()
    }

    fn driver_missing(&self) -> bool {
        self.status().unavailable.as_deref() == Some(probe::NO_DRIVER)
    }

    fn allocator(&self, device: Device) -> Result<Arc<dyn NDAlloc>> {
        alloc::shared(device)
    }

    fn pool_stats(&self, device: Device) -> Result<Option<MemoryStats>> {
        Ok(alloc::pool(device)?.map(|p| p.memory_stats()))
    }

    fn empty_cache(&self, device: Device) -> Result<usize> {
        // A forked child's pool holds its parent's blocks and events: not the
        // child's to release (each would be a call into the inherited driver).
        crate::fork::check(Backend::Cuda)?;
        Ok(alloc::pool(device)?.map_or(0, |p| p.empty_cache()))
    }

    fn gpu(&self) -> Option<&dyn GpuRuntime> {
        Some(self)
    }

    fn default_stream(&self) -> Option<StreamHandle> {
        Some(StreamHandle::CUDA_LEGACY)
    }

    unsafe fn stream_from_dlpack(&self, ordinal: u32, value: Option<i64>) -> Result<Option<StreamHandle>> {
        // SAFETY: forwarded from the caller.
        Ok(unsafe { CudaStream::from_dlpack(ordinal, value) }?.map(|s| s.handle()))
    }

    fn synchronize_streams(&self, ordinal: u32, streams: &[StreamHandle]) -> Result<()> {
        stream::synchronize_streams(ordinal, streams)
    }

    fn bind(&self, ordinal: u32) -> Result<BoundDevice> {
        Ok(BoundDevice::new(context::device(ordinal)?.bind()?))
    }

    fn pointer_device(&self, ptr: u64) -> Result<Device> {
        context::pointer_device(ptr)
    }
}
