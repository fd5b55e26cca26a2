//! CUDA allocators behind [`NDAlloc`]: device (synchronous or stream-ordered),
//! managed and pinned host memory.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use cudarc::driver::{DriverError, result, sys};

use super::context::{Current, Gpu, bind_context, check_alloc, current_context, current_or_used, device, driver};
use super::stream::{CudaEvent, CudaStream};
use crate::alloc::{AllocStats, Allocation, CachingAlloc, Counters, NDAlloc, PoolConfig};
use crate::backend::PerDevice;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{EventHandle, StreamHandle};

/// Which CUDA memory an allocator hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaMemory {
    /// `cuMemAlloc`: device memory, freed synchronously.
    Device,
    /// `cuMemAllocFromPoolAsync` from a memory pool of devtensor's own
    /// (`cuMemPoolCreate`) with its release threshold raised, so freed memory
    /// stays cached there; the device's default pool, which CuPy, JAX and the
    /// runtime's `cudaMallocAsync` share, is left as it is. A free is ordered
    /// after the work of every stream recorded on the block.
    DeviceAsync,
    /// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`.
    Managed,
    /// `cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)`: pinned, visible to every
    /// context, not write-combined (host reads stay fast).
    PinnedHost,
}

/// A CUDA allocator for one GPU and one memory kind, or for portable pinned
/// host memory, which belongs to no GPU.
#[derive(Debug)]
pub struct CudaAlloc {
    /// The GPU of device and managed memory; `None` for pinned host memory,
    /// allocated in whichever context is current (see [`CudaAlloc::bind`]).
    gpu: Option<&'static Gpu>,
    /// The live events `record_event` made, by handle (released by `release_event`).
    events: Mutex<HashMap<usize, CudaEvent>>,
    memory: CudaMemory,
    counters: Counters,
    /// The `CUmemoryPool` of [`CudaMemory::DeviceAsync`] (0 otherwise),
    /// destroyed on drop.
    mempool: usize,
}

impl CudaAlloc {
    /// An allocator of `memory` on GPU `ordinal`. Pinned host memory is
    /// portable, so `ordinal` is ignored for it: it is allocated in the calling
    /// thread's current context, or else a GPU devtensor already uses
    /// ([`current_or_used`]); a process that uses only GPU 1 never retains GPU 0.
    pub fn new(ordinal: u32, memory: CudaMemory) -> Result<CudaAlloc> {
        if memory == CudaMemory::PinnedHost {
            let status = crate::backend::cuda_status();
            if !status.is_available() {
                return Err(crate::Error::BackendUnavailable {
                    backend: crate::Backend::Cuda,
                    reason: status.unavailable_reason(),
                });
            }
            return Ok(CudaAlloc {
                gpu: None,
                events: Mutex::new(HashMap::new()),
                memory,
                counters: Counters::new(),
                mempool: 0,
            });
        }
        let gpu = device(ordinal)?;
        let mut mempool = 0;
        if memory == CudaMemory::DeviceAsync {
            let _current = gpu.bind()?;
            let props = sys::CUmemPoolProps {
                allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
                handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: gpu.dev,
                },
                win32SecurityAttributes: std::ptr::null_mut(),
                maxSize: 0,
                usage: 0,
                reserved: [0; 54],
            };
            // SAFETY: `props` describes device memory of a valid device; the
            // GPU's context is current.
            let pool = driver("cuMemPoolCreate", unsafe { result::mem_pool::create(&props) })?;
            let mut threshold = u64::MAX;
            // SAFETY: RELEASE_THRESHOLD takes a cuuint64_t; `threshold` outlives the call.
            let set = driver("cuMemPoolSetAttribute", unsafe {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&raw mut threshold).cast::<c_void>(),
                )
            });
            if let Err(e) = set {
                // SAFETY: created above, nothing allocated from it.
                let _ = unsafe { result::mem_pool::destroy(pool) };
                return Err(e);
            }
            mempool = pool as usize;
        }
        Ok(CudaAlloc {
            gpu: Some(gpu),
            events: Mutex::new(HashMap::new()),
            memory,
            counters: Counters::new(),
            mempool,
        })
    }

    /// Makes the right context current for work with `stream`: the GPU's own
    /// for device and managed memory; for pinned memory the context of
    /// `stream` (a stream handle > 2), else the one already current, else
    /// that of [`current_or_used`].
    fn bind(&self, stream: Option<StreamHandle>) -> Result<Current> {
        if let Some(gpu) = self.gpu {
            return gpu.bind();
        }
        if let Some(s) = stream.filter(|s| s.as_raw() > 2) {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: a stream handle recorded on our memory is a live stream
            // (the `record_stream` contract); `ctx` is a valid out-pointer.
            let rc = unsafe { sys::cuStreamGetCtx(s.as_raw() as sys::CUstream, &mut ctx) };
            if rc == sys::CUresult::CUDA_SUCCESS && !ctx.is_null() {
                // SAFETY: the stream's context lives at least as long as the stream.
                return unsafe { bind_context(ctx) };
            }
        }
        if let Some(ctx) = current_context()? {
            // SAFETY: already current: the guard changes nothing.
            return unsafe { bind_context(ctx) };
        }
        device(current_or_used()?)?.bind()
    }

    /// The live events, locked.
    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<usize, CudaEvent>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The allocator of portable pinned host memory (`CudaAlloc::new` of
    /// [`CudaMemory::PinnedHost`]): it belongs to no GPU.
    pub fn pinned() -> Result<CudaAlloc> {
        CudaAlloc::new(0, CudaMemory::PinnedHost)
    }

    /// The memory kind.
    pub fn memory(&self) -> CudaMemory {
        self.memory
    }
}

/// An allocation through `cudarc::driver::result`, out-of-memory typed (see [`check_alloc`]).
fn allocated<T>(
    call: &'static str,
    r: std::result::Result<T, DriverError>,
    device: Device,
    requested: usize,
) -> Result<T> {
    r.map_err(|e| match check_alloc(call, e.0, device, requested) {
        Err(err) => err,
        Ok(()) => Error::Internal("cudarc reported success as an error"),
    })
}

fn raw_stream(stream: Option<StreamHandle>) -> sys::CUstream {
    stream.map_or(std::ptr::null_mut(), |s| s.as_raw() as sys::CUstream)
}

// SAFETY: every pointer comes from the CUDA allocation call matching
// `self.memory`, is at least 256-byte aligned (CUDA guarantees 256 for device,
// managed and host allocations) and is freed only by `deallocate`.
unsafe impl NDAlloc for CudaAlloc {
    fn device(&self) -> Device {
        match self.memory {
            CudaMemory::Device | CudaMemory::DeviceAsync => Device::Cuda(self.gpu.map_or(0, |g| g.ordinal)),
            CudaMemory::Managed => Device::CudaManaged(self.gpu.map_or(0, |g| g.ordinal)),
            CudaMemory::PinnedHost => Device::CudaHost,
        }
    }

    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> Result<Allocation> {
        if size == 0 {
            let ptr =
                NonNull::new(256usize.max(align) as *mut u8).ok_or(crate::Error::Overflow { what: "alignment" })?;
            return Ok(Allocation {
                ptr,
                size,
                align,
                token: 0,
            });
        }
        if align > 256 {
            return Err(crate::Error::InvalidArgument {
                op: "CUDA allocation",
                reason: "alignments above 256 bytes are not supported".into(),
            });
        }
        let _current = self.bind(stream)?;
        let dev = self.device();
        let addr: usize = match self.memory {
            CudaMemory::Device | CudaMemory::DeviceAsync | CudaMemory::Managed => {
                // SAFETY: the GPU's context is current; the pool (DeviceAsync) is
                // ours and alive, the stream the caller's live stream.
                let p = unsafe {
                    match self.memory {
                        CudaMemory::Device => allocated("cuMemAlloc", result::malloc_sync(size), dev, size)?,
                        CudaMemory::DeviceAsync => allocated(
                            "cuMemAllocFromPoolAsync",
                            result::mem_pool::alloc_async(self.mempool as sys::CUmemoryPool, size, raw_stream(stream)),
                            dev,
                            size,
                        )?,
                        _ => allocated(
                            "cuMemAllocManaged",
                            result::malloc_managed(size, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL),
                            dev,
                            size,
                        )?,
                    }
                };
                p as usize
            }
            CudaMemory::PinnedHost => {
                // SAFETY: a context is current.
                let r = unsafe { result::malloc_host(size, sys::CU_MEMHOSTALLOC_PORTABLE) };
                allocated("cuMemHostAlloc", r, dev, size)? as usize
            }
        };
        let ptr = NonNull::new(addr as *mut u8).ok_or(crate::Error::OutOfMemory {
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
        let p = a.ptr.as_ptr() as usize;
        // SAFETY: the caller passes a pointer from `allocate` of this allocator,
        // freed once, with the matching free call. Errors cannot be reported from
        // a drop; the driver only fails here when the context is already gone.
        let _ = unsafe {
            match self.memory {
                CudaMemory::Device | CudaMemory::Managed => result::free_sync(p as sys::CUdeviceptr),
                CudaMemory::DeviceAsync => result::free_async(p as sys::CUdeviceptr, raw_stream(stream)),
                CudaMemory::PinnedHost => result::free_host(p as *mut c_void),
            }
        };
        self.counters.on_free(size);
    }

    unsafe fn deallocate_after(&self, a: Allocation, stream: Option<StreamHandle>, used_on: &[StreamHandle]) {
        if self.memory == CudaMemory::DeviceAsync && a.size != 0 {
            // The free is stream-ordered on `stream` only: make it wait for the
            // work of every other stream the block was used on.
            for &s in used_on.iter().filter(|&&s| Some(s) != stream) {
                let ordered = self.record_event(s).and_then(|ev| {
                    ev.map_or(Ok(()), |ev| {
                        let r = self.wait_event(stream, ev);
                        self.release_event(ev);
                        r
                    })
                });
                if ordered.is_err() {
                    // The stream is gone (its owner destroyed it) while its work may
                    // still be queued: wait for all of the device's work instead.
                    let _ = self.synchronize_device();
                    break;
                }
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.deallocate(a, stream) }
    }

    fn stats(&self) -> AllocStats {
        self.counters.stats()
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>> {
        // Pinned memory: the event belongs to the stream's context (cuEventRecord
        // refuses an event and a stream of different contexts).
        let _current = self.bind(Some(stream))?;
        let ordinal = match self.gpu {
            Some(gpu) => gpu.ordinal,
            None => current_or_used()?,
        };
        let ev = CudaEvent::in_current_context(ordinal)?;
        // SAFETY: `stream` is a live stream of the current context (a StreamHandle's contract).
        ev.record(&unsafe { CudaStream::borrowed(ordinal, stream.as_raw()) })?;
        let raw = ev.raw() as usize;
        self.events().insert(raw, ev);
        // SAFETY: the event is alive in `events` until `release_event` drops it.
        Ok(Some(unsafe { EventHandle::from_raw(raw) }))
    }

    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> Result<()> {
        let _current = self.bind(stream)?;
        // SAFETY: `event` came from `record_event` and is not yet released.
        driver("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(
                raw_stream(stream),
                event.as_raw() as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    }

    fn release_event(&self, event: EventHandle) {
        // Dropped outside the lock: its drop binds its context and destroys it
        // (CUDA defers the release while recorded work is pending).
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
        let Some(gpu) = self.gpu else {
            // Pinned memory may have been used by any GPU's work: wait for every
            // GPU devtensor uses, and for the context current here.
            if current_context()?.is_some() {
                driver("cuCtxSynchronize", result::ctx::synchronize())?;
            }
            for gpu in super::context::used_gpus() {
                let _current = gpu.bind()?;
                driver("cuCtxSynchronize", result::ctx::synchronize())?;
            }
            return Ok(());
        };
        let _current = gpu.bind()?;
        driver("cuCtxSynchronize", result::ctx::synchronize())
    }
}

impl Drop for CudaAlloc {
    fn drop(&mut self) {
        if self.mempool != 0
            && let Some(gpu) = self.gpu
            && let Ok(_current) = gpu.bind()
        {
            // SAFETY: our own pool, destroyed once. Blocks still allocated from it
            // or frees still queued keep its resources until they are done
            // (cuMemPoolDestroy's documentation).
            let _ = unsafe { result::mem_pool::destroy(self.mempool as sys::CUmemoryPool) };
        }
    }
}

/// The caching pool over device memory of a GPU, or over pinned host memory.
pub type CudaPool = CachingAlloc<CudaAlloc>;

/// The shared default allocator for a CUDA memory kind: the caching pool for
/// device and pinned memory (unless `DEVTENSOR_ALLOC_CONF=disable:1`), raw
/// `cuMemAllocManaged` for managed memory.
pub fn shared(device: Device) -> Result<Arc<dyn NDAlloc>> {
    static SHARED: PerDevice<Arc<dyn NDAlloc>> = PerDevice::new();
    SHARED.get_or_try_init(device, || {
        Ok(match (device, pool(device)) {
            (_, Ok(Some(p))) => p,
            (Device::CudaManaged(i), _) => Arc::new(CudaAlloc::new(i, CudaMemory::Managed)?),
            (Device::Cuda(i), Ok(None)) => Arc::new(CudaAlloc::new(i, CudaMemory::Device)?),
            (Device::CudaHost, Ok(None)) => Arc::new(CudaAlloc::pinned()?),
            (_, Err(e)) => return Err(e),
            (other, _) => {
                return Err(crate::Error::UnsupportedDevice {
                    op: "CUDA allocation",
                    device: other,
                });
            }
        })
    })
}

/// The caching pool of `device` (`Cuda(i)` or `CudaHost`); `Ok(None)` when
/// pooling is disabled or the memory kind is not pooled.
pub fn pool(device: Device) -> Result<Option<Arc<CudaPool>>> {
    static POOLS: PerDevice<Arc<CudaPool>> = PerDevice::new();
    let (ordinal, memory) = match device {
        Device::Cuda(i) => (i, CudaMemory::Device),
        Device::CudaHost => (0, CudaMemory::PinnedHost), // portable: no GPU of its own
        _ => return Ok(None),
    };
    let Some(cfg) = PoolConfig::from_env()? else {
        return Ok(None);
    };
    POOLS
        .get_or_try_init(device, || {
            Ok(Arc::new(CachingAlloc::new(CudaAlloc::new(ordinal, memory)?, cfg)))
        })
        .map(Some)
}
