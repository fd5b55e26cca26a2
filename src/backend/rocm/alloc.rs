//! HIP allocators behind [`NDAlloc`]: device, managed and pinned host memory.
//!
//! Device memory is pooled by devtensor's caching allocator over `hipMalloc`,
//! not `hipMallocAsync`: the stream-ordered HIP allocator has known corruption,
//! out-of-memory and hang bugs across ROCm releases.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::context::{Current, Gpu, check, check_alloc, device};
use super::ffi;
use super::stream::{RocmEvent, RocmStream};
use crate::alloc::{AllocStats, Allocation, CachingAlloc, Counters, NDAlloc, PoolConfig};
use crate::backend::PerDevice;
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
    /// the host may also read); [`RocmAlloc::memory`] tells the two apart.
    Managed,
    /// `hipHostMalloc(hipHostMallocPortable)` → kDLROCMHost.
    PinnedHost,
}

/// A HIP allocator for one GPU and one memory kind, or for portable pinned
/// host memory, which belongs to no GPU.
#[derive(Debug)]
pub struct RocmAlloc {
    /// The GPU of device and managed memory; `None` for pinned host memory,
    /// allocated on the calling thread's current device (see [`RocmAlloc::bind`]).
    gpu: Option<&'static Gpu>,
    memory: RocmMemory,
    counters: Counters,
    /// The live events `record_event` made, by handle (released by `release_event`).
    events: Mutex<HashMap<usize, RocmEvent>>,
}

impl RocmAlloc {
    /// An allocator of `memory` on GPU `ordinal`. Pinned host memory is
    /// portable, so `ordinal` is ignored for it: it is allocated on the calling
    /// thread's current device, never by switching to GPU 0.
    pub fn new(ordinal: u32, memory: RocmMemory) -> Result<RocmAlloc> {
        let gpu = if memory == RocmMemory::PinnedHost {
            let status = crate::backend::rocm_status();
            if !status.is_available() {
                return Err(Error::BackendUnavailable {
                    backend: crate::Backend::Rocm,
                    reason: status.unavailable_reason(),
                });
            }
            None
        } else {
            Some(device(ordinal)?)
        };
        Ok(RocmAlloc {
            gpu,
            memory,
            counters: Counters::new(),
            events: Mutex::new(HashMap::new()),
        })
    }

    /// Makes the right device current for work with `stream`: the GPU's own
    /// for device and managed memory; for pinned memory the device of `stream`
    /// (a stream handle > 2, `hipStreamGetDevice`), else the current one as it is.
    fn bind(&self, stream: Option<StreamHandle>) -> Result<Option<Current>> {
        if let Some(gpu) = self.gpu {
            return gpu.bind().map(Some);
        }
        if let Some(s) = stream.filter(|s| s.as_raw() > 2)
            && let Some(get) = stream_get_device()
        {
            let mut d: std::ffi::c_int = 0;
            // SAFETY: a stream recorded on our memory is live (the `record_stream`
            // contract); `d` is a valid out-pointer.
            if unsafe { get(s.as_raw() as ffi::Stream, &mut d) } == ffi::SUCCESS
                && let Ok(i) = u32::try_from(d)
            {
                return device(i)?.bind().map(Some);
            }
        }
        crate::fork::check(crate::Backend::Rocm)?;
        Ok(None)
    }

    /// The live events, locked.
    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<usize, RocmEvent>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The memory kind.
    pub fn memory(&self) -> RocmMemory {
        self.memory
    }
}

/// `hipStreamGetDevice`, looked up at run time: HIP runtimes before ROCm 5.6
/// (Debian's 5.2 among them) do not have it, and linking to it would fail there.
/// Without it, pinned memory stays with the current device.
fn stream_get_device() -> Option<unsafe extern "C" fn(ffi::Stream, *mut std::ffi::c_int) -> ffi::Status> {
    type GetDevice = unsafe extern "C" fn(ffi::Stream, *mut std::ffi::c_int) -> ffi::Status;
    static FOUND: std::sync::OnceLock<Option<GetDevice>> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        // SAFETY: a lookup in the process's global namespace (where the linked HIP
        // runtime is) by a NUL-terminated name.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"hipStreamGetDevice".as_ptr()) };
        // SAFETY: when present, the symbol is hipStreamGetDevice with this C
        // signature (hip_runtime_api.h: hipError_t (hipStream_t, int*)).
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut std::ffi::c_void, GetDevice>(p) })
    })
}

// SAFETY: every pointer comes from the HIP allocation call matching
// `self.memory`, is at least 256-byte aligned (HIP aligns device, managed and
// host allocations to 256 bytes or more) and is freed only by `deallocate`.
unsafe impl NDAlloc for RocmAlloc {
    fn device(&self) -> Device {
        match self.memory {
            RocmMemory::Device | RocmMemory::Managed => Device::Rocm(self.gpu.map_or(0, |g| g.ordinal)),
            RocmMemory::PinnedHost => Device::RocmHost,
        }
    }

    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
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
            return Err(Error::InvalidArgument {
                op: "HIP allocation",
                reason: "alignments above 256 bytes are not supported".into(),
            });
        }
        let _current = self.bind(stream)?;
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

    unsafe fn deallocate(&self, a: Allocation, stream: Option<StreamHandle>) {
        let size = a.size;
        if size == 0 {
            return;
        }
        let Ok(_current) = self.bind(stream) else {
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
        // Pinned memory: the event is made on the stream's device.
        let _current = self.bind(Some(stream))?;
        let ordinal = match self.gpu {
            Some(gpu) => gpu.ordinal,
            None => super::context::current_device()?.unwrap_or(0),
        };
        let ev = RocmEvent::new(ordinal, false)?;
        // SAFETY: `stream` is a live stream of this GPU (a StreamHandle's contract).
        ev.record(&unsafe { RocmStream::borrowed(ordinal, stream.as_raw()) })?;
        let raw = ev.raw() as usize;
        self.events().insert(raw, ev);
        // SAFETY: the event is alive in `events` until `release_event` drops it.
        Ok(Some(unsafe { EventHandle::from_raw(raw) }))
    }

    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> Result<()> {
        let _current = self.bind(stream)?;
        let stream = stream.map_or(std::ptr::null_mut(), |s| s.as_raw() as ffi::Stream);
        // SAFETY: `event` came from `record_event` and is not yet released.
        check("hipStreamWaitEvent", unsafe {
            ffi::hipStreamWaitEvent(stream, event.as_raw() as ffi::Event, 0)
        })
    }

    fn release_event(&self, event: EventHandle) {
        // Dropped outside the lock; HIP defers the release while work is pending.
        let ev = self.events().remove(&event.as_raw());
        drop(ev);
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        let events = self.events();
        match events.get(&event.as_raw()) {
            Some(ev) => ev.is_complete(),
            None => Err(Error::Internal("event_done on an event this pool did not record")),
        }
    }

    fn synchronize_device(&self) -> Result<()> {
        let _current = self.bind(None)?;
        // SAFETY: the GPU is current; waits for all its streams.
        check("hipDeviceSynchronize", unsafe { ffi::hipDeviceSynchronize() })
    }
}

/// The caching pool over device memory of a GPU, or over pinned host memory.
pub type RocmPool = CachingAlloc<RocmAlloc>;

/// The shared default allocator for a ROCm device: the caching pool over
/// `hipMalloc` / `hipHostMalloc` (unless `DEVTENSOR_ALLOC_CONF=disable:1`).
pub fn shared(device: Device) -> Result<Arc<dyn NDAlloc>> {
    static SHARED: PerDevice<Arc<dyn NDAlloc>> = PerDevice::new();
    SHARED.get_or_try_init(device, || {
        Ok(match (device, pool(device)?) {
            (_, Some(p)) => p,
            (Device::Rocm(i), None) => Arc::new(RocmAlloc::new(i, RocmMemory::Device)?),
            (Device::RocmHost, None) => Arc::new(RocmAlloc::new(0, RocmMemory::PinnedHost)?), // ordinal ignored
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
            Ok(Arc::new(CachingAlloc::new(RocmAlloc::new(ordinal, memory)?, cfg)))
        })
        .map(Some)
}
