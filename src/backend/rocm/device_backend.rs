//! The ROCm [`DeviceBackend`]: HIP devices, pools, copies and streams.

use std::sync::Arc;

use super::stream::RocmStream;
use super::{alloc, context, stream};
use crate::alloc::{MemoryStats, NDAlloc};
use crate::backend::device_backend::{BoundDevice, DeviceBackend};
use crate::backend::gpu_runtime::GpuRuntime;
use crate::backend::{BackendStatus, rocm_status};
use crate::device::{Backend, Device};
use crate::error::Result;
use crate::stream::StreamHandle;

/// ROCm, through HIP (hip-sys) and hiprtc.
#[derive(Debug)]
pub struct RocmBackend;

impl DeviceBackend for RocmBackend {
    fn kind(&self) -> Backend {
        Backend::Rocm
    }

    fn status(&self) -> &'static BackendStatus {
        rocm_status()
    }

    fn current_ordinal(&self) -> Result<u32> {
        Ok(context::current_device()?.unwrap_or(0))
    }

    fn allocator(&self, device: Device) -> Result<Arc<dyn NDAlloc>> {
        alloc::shared(device)
    }

    fn pool_stats(&self, device: Device) -> Result<Option<MemoryStats>> {
        Ok(alloc::pool(device)?.map(|p| p.memory_stats()))
    }

    fn empty_cache(&self, device: Device) -> Result<usize> {
        Ok(alloc::pool(device)?.map_or(0, |p| p.empty_cache()))
    }

    fn gpu(&self) -> Option<&dyn GpuRuntime> {
        Some(self)
    }

    fn default_stream(&self) -> Option<StreamHandle> {
        Some(StreamHandle::ROCM_DEFAULT)
    }

    unsafe fn stream_from_dlpack(&self, ordinal: u32, value: Option<i64>) -> Result<Option<StreamHandle>> {
        // SAFETY: forwarded from the caller.
        Ok(unsafe { RocmStream::from_dlpack(ordinal, value) }?.map(|s| s.handle()))
    }

    fn synchronize_streams(&self, ordinal: u32, streams: &[StreamHandle]) -> Result<()> {
        stream::synchronize_streams(ordinal, streams)
    }

    fn bind(&self, ordinal: u32) -> Result<BoundDevice> {
        Ok(BoundDevice::new(context::device(ordinal)?.bind()?))
    }
}
