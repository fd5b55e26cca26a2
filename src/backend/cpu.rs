//! The CPU [`DeviceBackend`]: host memory, always there; the copy engine
//! (`crate::copy`) runs on the calling thread and rayon's pool, so there are
//! no streams to order and no GPU runtime.

use std::sync::{Arc, OnceLock};

use super::{BackendStatus, DeviceBackend, DeviceInfo, unpooled_stats};
use crate::alloc::{CpuAlloc, MemoryStats, NDAlloc};
use crate::device::{Backend, Device};
use crate::error::{Error, Result};

/// The host.
#[derive(Debug)]
pub(super) struct CpuBackend;

impl DeviceBackend for CpuBackend {
    fn kind(&self) -> Backend {
        Backend::Cpu
    }

    fn status(&self) -> &'static BackendStatus {
        static STATUS: OnceLock<BackendStatus> = OnceLock::new();
        STATUS.get_or_init(cpu_status)
    }

    fn current_ordinal(&self) -> Result<u32> {
        Ok(0)
    }

    fn allocator(&self, device: Device) -> Result<Arc<dyn NDAlloc>> {
        match device {
            Device::Cpu => Ok(CpuAlloc::shared()),
            other => Err(Error::UnsupportedDevice {
                op: "CPU allocation",
                device: other,
            }),
        }
    }

    /// The allocator's figures, with the freed large blocks it keeps for
    /// reuse counted as reserved (`peak_reserved`: the most live and kept
    /// bytes together, which `empty_cache` does not lower).
    fn pool_stats(&self, device: Device) -> Result<Option<MemoryStats>> {
        let mut s = unpooled_stats(self.allocator(device)?.stats());
        s.reserved += CpuAlloc::cached_bytes();
        s.peak_reserved = s.peak_reserved.max(s.reserved).max(CpuAlloc::peak_reserved());
        Ok(Some(s))
    }

    fn empty_cache(&self, device: Device) -> Result<usize> {
        self.allocator(device)?;
        Ok(CpuAlloc::empty_cache())
    }
}

/// The CPU as `devtensor info` reports it.
pub fn cpu_status() -> BackendStatus {
    let threads = rayon::current_num_threads();
    BackendStatus {
        backend: Backend::Cpu,
        versions: vec![("rayon threads", threads.to_string())],
        devices: vec![DeviceInfo {
            ordinal: 0,
            name: format!(
                "host ({} logical cores)",
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
            arch: std::env::consts::ARCH.to_owned(),
            total_memory: 0,
        }],
        unavailable: None,
    }
}
