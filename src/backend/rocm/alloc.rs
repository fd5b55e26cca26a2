//! HIP allocators behind [`NDAlloc`]: device, managed and pinned host memory.
//!
//! Device memory is pooled by devtensor's caching allocator over `hipMalloc`,
//! not `hipMallocAsync`: the stream-ordered HIP allocator has known corruption,
//! out-of-memory and hang bugs across ROCm releases.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use super::context::{Gpu, check, check_alloc, device};
use super::ffi;
use crate::alloc::{AllocStats, Allocation, CachingAlloc, Counters, NDAlloc, PerDevice, PoolConfig};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{EventHandle, StreamHandle};

/// Which HIP memory an allocator hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocmMemory {
    /// `hipMalloc` → kDLROCM.
    Device,
    /// `hipMallocManaged(hipMemAttachGlobal)` → kDLROCM: DLPack has no
    /// ROCm-managed device type, so it is described as device memory (which
    /// the host may also read); [`HipAlloc::memory`] tells the two apart.
    Managed,
    /// `hipHostMalloc(hipHostMallocPortable)` → kDLROCMHost.
    PinnedHost,
}

/// A HIP allocator for one GPU and one memory kind.
#[derive(Debug)]
pub struct HipAlloc {
    gpu: &'static Gpu,
    memory: RocmMemory,
    counters: Counters,
}

impl HipAlloc {
    /// An allocator of `memory` on GPU `ordinal` (pinned host memory is
    /// portable: the ordinal only picks the device used to allocate it).
    pub fn new(ordinal: u32, memory: RocmMemory) -> Result<HipAlloc> {
        Ok(HipAlloc {
            gpu: device(ordinal)?,
            memory,
            counters: Counters::new(),
        })
    }

    /// The memory kind.
    pub fn memory(&self) -> RocmMemory {
        self.memory
    }
}

// SAFETY: every pointer comes from the HIP allocation call matching
// `self.memory`, is at least 256-byte aligned (HIP aligns device, managed and
// host allocations to 256 bytes or more) and is freed only by `deallocate`.
unsafe impl NDAlloc for HipAlloc {
    fn device(&self) -> Device {
        match self.memory {
            RocmMemory::Device | RocmMemory::Managed => Device::Rocm(self.gpu.ordinal),
            RocmMemory::PinnedHost => Device::RocmHost,
        }
    }

    fn allocate(&self, size: usize, align: usize, _stream: Option<StreamHandle>) -> Result<Allocation> {
        if size == 0 {
            let ptr = NonNull::new(256usize.max(align) as *mut u8).ok_or(Error::Overflow { what: "alignment" })?;
            return Ok(Allocation {
                ptr,
                size,
                align,
                token: 0,
            });
        }
        if align > 256 {
            return Err(Error::InvalidLayout("HIP allocations are aligned to 256 bytes at most"));
        }
        let _current = self.gpu.bind()?;
        let dev = self.device();
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer and the GPU is current.
        let (call, rc) = unsafe {
            match self.memory {
                RocmMemory::Device => ("hipMalloc", ffi::hipMalloc(&mut p, size)),
                RocmMemory::Managed => (
                    "hipMallocManaged",
                    ffi::hipMallocManaged(&mut p, size, ffi::MEM_ATTACH_GLOBAL),
                ),
                RocmMemory::PinnedHost => (
                    "hipHostMalloc",
                    ffi::hipHostMalloc(&mut p, size, ffi::HOST_MALLOC_PORTABLE),
                ),
            }
        };
        check_alloc(call, rc, dev, size)?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::OutOfMemory {
            device: dev,
            requested: size,
            reserved: 0,
            allocated: 0,
            largest_free: 0,
        })?;
        self.counters.on_alloc(size);
        Ok(Allocation {
            ptr,
            size,
            align,
            token: 0,
        })
    }

    unsafe fn deallocate(&self, a: Allocation, _stream: Option<StreamHandle>) {
        let size = a.size;
        if size == 0 {
            return;
        }
        let Ok(_current) = self.gpu.bind() else {
            return;
        };
        let p = a.ptr.as_ptr().cast::<c_void>();
        // SAFETY: the caller passes a pointer from `allocate` of this allocator,
        // freed once, with the matching free call. Errors cannot be reported from
        // a drop; the runtime only fails here when the device is already gone.
        let _ = unsafe {
            match self.memory {
                RocmMemory::Device | RocmMemory::Managed => ffi::hipFree(p),
                RocmMemory::PinnedHost => ffi::hipHostFree(p),
            }
        };
        self.counters.on_free(size);
    }

    fn stats(&self) -> AllocStats {
        self.counters.stats()
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>> {
        let _current = self.gpu.bind()?;
        let mut ev: ffi::Event = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the GPU is current.
        check("hipEventCreateWithFlags", unsafe {
            ffi::hipEventCreateWithFlags(&mut ev, ffi::EVENT_DISABLE_TIMING)
        })?;
        // SAFETY: `ev` was just created; `stream` is a live stream of this GPU.
        if let Err(e) = check("hipEventRecord", unsafe {
            ffi::hipEventRecord(ev, stream.0 as ffi::Stream)
        }) {
            // SAFETY: destroying the event we created.
            unsafe { ffi::hipEventDestroy(ev) };
            return Err(e);
        }
        Ok(Some(EventHandle(ev as usize)))
    }

    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> Result<()> {
        let _current = self.gpu.bind()?;
        let stream = stream.map_or(std::ptr::null_mut(), |s| s.0 as ffi::Stream);
        // SAFETY: `event` came from `record_event` and is not yet released.
        check("hipStreamWaitEvent", unsafe {
            ffi::hipStreamWaitEvent(stream, event.0 as ffi::Event, 0)
        })
    }

    fn release_event(&self, event: EventHandle) {
        // SAFETY: released once; HIP defers the release while work is pending.
        let _ = unsafe { ffi::hipEventDestroy(event.0 as ffi::Event) };
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        // SAFETY: `event` came from `record_event` and is not yet released.
        let rc = unsafe { ffi::hipEventQuery(event.0 as ffi::Event) };
        if rc == ffi::ERROR_NOT_READY {
            return Ok(false);
        }
        check("hipEventQuery", rc).map(|()| true)
    }

    fn synchronize_device(&self) -> Result<()> {
        let _current = self.gpu.bind()?;
        // SAFETY: the GPU is current; waits for all its streams.
        check("hipDeviceSynchronize", unsafe { ffi::hipDeviceSynchronize() })
    }
}

/// The caching pool over device memory of a GPU, or over pinned host memory.
pub type RocmPool = CachingAlloc<HipAlloc>;

/// The shared default allocator for a ROCm device: the caching pool over
/// `hipMalloc` / `hipHostMalloc` (unless `DEVTENSOR_ALLOC_CONF=disable:1`).
pub fn shared(device: Device) -> Result<Arc<dyn NDAlloc>> {
    static SHARED: PerDevice<Arc<dyn NDAlloc>> = PerDevice::new();
    SHARED.get_or_try_init(device, || {
        Ok(match (device, pool(device)?) {
            (_, Some(p)) => p,
            (Device::Rocm(i), None) => Arc::new(HipAlloc::new(i, RocmMemory::Device)?),
            (Device::RocmHost, None) => Arc::new(HipAlloc::new(0, RocmMemory::PinnedHost)?),
            (other, None) => {
                return Err(Error::UnsupportedDevice {
                    op: "ROCm allocation",
                    device: other,
                });
            }
        })
    })
}

/// The caching pool of `device` (`Rocm(i)` or `RocmHost`); `Ok(None)` when
/// pooling is disabled or the device is not a ROCm one.
pub fn pool(device: Device) -> Result<Option<Arc<RocmPool>>> {
    static POOLS: PerDevice<Arc<RocmPool>> = PerDevice::new();
    let (ordinal, memory) = match device {
        Device::Rocm(i) => (i, RocmMemory::Device),
        Device::RocmHost => (0, RocmMemory::PinnedHost),
        _ => return Ok(None),
    };
    let Some(cfg) = PoolConfig::from_env()? else {
        return Ok(None);
    };
    POOLS
        .get_or_try_init(device, || {
            Ok(Arc::new(CachingAlloc::new(HipAlloc::new(ordinal, memory)?, cfg)))
        })
        .map(Some)
}
