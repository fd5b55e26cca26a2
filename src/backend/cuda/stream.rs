//! CUDA streams and events, and the DLPack handoff rule: record an event on
//! the producer's stream and make the consumer's stream wait on it; never block
//! the host.

use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::{DriverError, sys};

use super::context::{Current, bind_context, check, current_context, device, driver};
use crate::error::{Error, Result};

/// A CUDA stream: owned (made by devtensor, back to its reuse list on drop,
/// never destroyed: see `crate::stream::own`) or borrowed (a consumer's handle,
/// or one of the default streams, never destroyed by devtensor).
#[derive(Debug)]
pub struct CudaStream {
    raw: sys::CUstream,
    ordinal: u32,
    owned: bool,
}

// SAFETY: a CUstream handle may be used from any thread (the driver serialises).
unsafe impl Send for CudaStream {}
// SAFETY: as above; the struct is immutable.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// A non-blocking stream on GPU `ordinal`: one dropped earlier, else a new
    /// one. Its handle stays valid after drop (memory may have recorded it).
    pub fn new(ordinal: u32) -> Result<CudaStream> {
        let _current = device(ordinal)?.bind()?; // a forked child's typed error, first
        let raw = crate::stream::own::reuse_or_create(
            crate::Device::Cuda(ordinal),
            // SAFETY: a stream devtensor made on this GPU, never destroyed.
            |raw| unsafe { sys::cuStreamQuery(raw as sys::CUstream) } == sys::CUresult::CUDA_SUCCESS,
            || driver("cuStreamCreate", result::stream::create(StreamKind::NonBlocking)).map(|s| s as usize),
        )?;
        Ok(CudaStream {
            raw: raw as sys::CUstream,
            ordinal,
            owned: true,
        })
    }

    /// The legacy default stream (`cudaStreamLegacy`, DLPack value 1).
    pub fn default_stream(ordinal: u32) -> CudaStream {
        CudaStream {
            raw: 1usize as sys::CUstream,
            ordinal,
            owned: false,
        }
    }

    /// The per-thread default stream (`cudaStreamPerThread`, DLPack value 2).
    pub fn per_thread(ordinal: u32) -> CudaStream {
        CudaStream {
            raw: 2usize as sys::CUstream,
            ordinal,
            owned: false,
        }
    }

    /// Wraps a stream handle owned by someone else; never destroyed here.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of GPU `ordinal`'s context (or 1 / 2) for as
    /// long as the returned value is used.
    pub unsafe fn borrowed(ordinal: u32, raw: usize) -> CudaStream {
        CudaStream {
            raw: raw as sys::CUstream,
            ordinal,
            owned: false,
        }
    }

    /// The stream a DLPack `stream` argument names on CUDA: `None` → legacy
    /// default, 1 legacy, 2 per-thread, >2 a pointer, -1 → `None` (no sync);
    /// 0 and other negatives are invalid.
    ///
    /// # Safety
    ///
    /// A value > 2 must be a live `CUstream` of GPU `ordinal`'s context.
    pub unsafe fn from_dlpack(ordinal: u32, value: Option<i64>) -> Result<Option<CudaStream>> {
        match value {
            None | Some(1) => Ok(Some(CudaStream::default_stream(ordinal))),
            Some(2) => Ok(Some(CudaStream::per_thread(ordinal))),
            Some(-1) => Ok(None),
            Some(v) if v > 2 => {
                // A stream of another GPU (the spec: "a stream on the producer's
                // device") would have our event recorded on it across contexts,
                // which a driver refuses only later, when the memory is freed:
                // the memory could be reused before the consumer's work ran.
                // SAFETY: forwarded from the caller (a live stream).
                if let Some(theirs) = unsafe { stream_device(v as usize) }?
                    && theirs != ordinal
                {
                    return Err(Error::InvalidArgument {
                        op: "a CUDA DLPack stream",
                        reason: format!(
                            "stream {v:#x} belongs to GPU {theirs}, the tensor to GPU {ordinal}: \
                             pass a stream of the producer's device"
                        ),
                    });
                }
                // SAFETY: forwarded from the caller.
                Ok(Some(unsafe { CudaStream::borrowed(ordinal, v as usize) }))
            }
            Some(_) => Err(Error::InvalidArgument {
                op: "a CUDA DLPack stream",
                reason: "0 and negative values other than -1 are not allowed".into(),
            }),
        }
    }

    /// The calling thread's current stream on GPU `ordinal`
    /// ([`crate::stream::current_stream`]), else the legacy default stream:
    /// where devtensor's copies and fills run.
    pub fn current(ordinal: u32) -> CudaStream {
        match crate::stream::current_stream(crate::Device::Cuda(ordinal)) {
            // SAFETY: a current stream is kept alive by whoever made it current
            // (`set_current_stream`'s contract).
            Some(s) => unsafe { CudaStream::borrowed(ordinal, s.as_raw()) },
            None => CudaStream::default_stream(ordinal),
        }
    }

    /// True when devtensor made this stream (it goes back to the reuse list on drop).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// True when all work queued on the stream is done; never blocks.
    pub fn query(&self) -> Result<bool> {
        let _current = device(self.ordinal)?.bind()?;
        // SAFETY: a valid stream handle of this context.
        let rc = unsafe { sys::cuStreamQuery(self.raw) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuStreamQuery", rc).map(|()| true)
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The handle allocators record and DLPack passes.
    pub fn handle(&self) -> crate::stream::StreamHandle {
        // SAFETY: a live stream of this GPU (or its default-stream value); a
        // handle recorded on memory outlives the stream only as the caller of
        // `record_stream` allows (the pool then falls back to a device sync).
        unsafe { crate::stream::StreamHandle::from_raw(self.raw as usize) }
    }

    /// The GPU it belongs to.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Blocks the host until the stream's work is done.
    pub fn synchronize(&self) -> Result<()> {
        let _current = device(self.ordinal)?.bind()?;
        // SAFETY: a valid stream handle of this context.
        driver("cuStreamSynchronize", unsafe { result::stream::synchronize(self.raw) })
    }

    /// Makes this stream wait (on the device) for everything `event` recorded.
    pub fn wait(&self, event: &CudaEvent) -> Result<()> {
        let _current = device(self.ordinal)?.bind()?;
        // SAFETY: both handles are valid.
        driver("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(self.raw, event.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.owned {
            crate::stream::own::dropped(crate::Device::Cuda(self.ordinal), self.raw as usize);
        }
    }
}

/// Blocks the host until all work queued on GPU `ordinal` (every stream) is done.
pub fn synchronize_device(ordinal: u32) -> Result<()> {
    let _current = device(ordinal)?.bind()?;
    driver("cuCtxSynchronize", result::ctx::synchronize())
}

/// A CUDA event: the one event type of the CUDA backend (the copy paths'
/// and the pools' alike), destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    raw: sys::CUevent,
    ordinal: u32,
    /// The context it was created in, current for every call on it: a GPU's
    /// primary context, or (pinned memory used by another library's stream)
    /// that stream's context.
    ctx: sys::CUcontext,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// A new event; `timing` enables `elapsed_ms`.
    pub fn new(ordinal: u32, timing: bool) -> Result<CudaEvent> {
        let gpu = device(ordinal)?;
        let _current = gpu.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let raw = driver("cuEventCreate", result::event::create(flags))?;
        Ok(CudaEvent {
            raw,
            ordinal,
            ctx: gpu.ctx,
        })
    }

    /// A new event (no timing) in the calling thread's current context, which
    /// must be a context of GPU `ordinal`: the caching pool records its pinned
    /// memory's uses on a stream of whichever context that stream belongs to.
    pub(crate) fn in_current_context(ordinal: u32) -> Result<CudaEvent> {
        let ctx = current_context()?.ok_or(Error::Internal("an event needs a current context"))?;
        let raw = driver(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
        )?;
        Ok(CudaEvent { raw, ordinal, ctx })
    }

    /// Makes the event's context current until the guard drops.
    fn bind(&self) -> Result<Current> {
        // SAFETY: a primary context is retained for the life of the process; a
        // foreign one outlives the streams of its owner, whose work this event
        // follows (the `record_stream` contract).
        unsafe { bind_context(self.ctx) }
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// The GPU it belongs to.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Records the current end of `stream`'s work.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        let _current = self.bind()?;
        // SAFETY: both handles are valid.
        driver("cuEventRecord", unsafe { result::event::record(self.raw, stream.raw) })
    }

    /// Blocks the host until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        let _current = self.bind()?;
        // SAFETY: a valid event.
        driver("cuEventSynchronize", unsafe { result::event::synchronize(self.raw) })
    }

    /// True when the recorded work is done (no blocking).
    pub fn is_complete(&self) -> Result<bool> {
        let _current = self.bind()?;
        // SAFETY: a valid event.
        match unsafe { result::event::query(self.raw) } {
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            r => driver("cuEventQuery", r).map(|()| true),
        }
    }

    /// Milliseconds between two timing events.
    pub fn elapsed_ms(&self, end: &CudaEvent) -> Result<f32> {
        let _current = self.bind()?;
        let mut ms = 0f32;
        // cuEventElapsedTime_v2 appeared with the 12.8 driver: an older one lacks the
        // symbol (cudarc would panic on the lookup), and has the original function.
        let elapsed: unsafe fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult =
            if super::probe::driver_version() >= 12080 {
                sys::cuEventElapsedTime_v2
            } else {
                sys::cuEventElapsedTime
            };
        // SAFETY: both are timing events that have completed.
        check("cuEventElapsedTime", unsafe { elapsed(&mut ms, self.raw, end.raw) })?;
        Ok(ms)
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if crate::fork::check(crate::Backend::Cuda).is_err() {
            return; // a forked child's copy of its parent's event: leaked, not a driver call
        }
        // Its context current, as for every other call on it (a failure to
        // bind leaves the destroy to the driver's own lookup).
        let _current = self.bind();
        // SAFETY: created by `new`, destroyed once; CUDA defers the release of an
        // event whose recorded work is still pending.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// Blocks the host until the work queued on GPU `ordinal`'s legacy default
/// stream and on each of `streams` (a storage's streams, see
/// `Storage::streams`) is done, so the host may read managed memory. A stream
/// that cannot be synchronised (destroyed by its owner) makes it wait for the
/// whole device instead.
pub fn synchronize_streams(ordinal: u32, streams: &[crate::stream::StreamHandle]) -> Result<()> {
    // Through an event recorded on the legacy stream, not cuStreamSynchronize of it:
    // work queued there waits for the earlier work of every blocking stream of the
    // context (each thread's per-thread default stream included; Driver API,
    // "Stream synchronization behavior"), a synchronize of it for its own work only.
    let legacy = CudaEvent::new(ordinal, false)?;
    legacy.record(&CudaStream::default_stream(ordinal))?;
    legacy.synchronize()?;
    for s in streams {
        if s.as_raw() <= 2 {
            continue; // 0 and 1 are the legacy stream; 2, any thread's, the legacy event waited for
        }
        // SAFETY: a recorded stream is a stream of this GPU's context (the
        // `record_stream` contract); a destroyed one is answered with an error.
        if unsafe { CudaStream::borrowed(ordinal, s.as_raw()) }
            .synchronize()
            .is_err()
        {
            let _current = device(ordinal)?.bind()?;
            return driver("cuCtxSynchronize", result::ctx::synchronize());
        }
    }
    Ok(())
}

/// The DLPack handoff: work enqueued on `producer` so far happens before any
/// work later enqueued on `consumer`. Nothing when they are the same stream.
pub fn handoff(producer: &CudaStream, consumer: &CudaStream) -> Result<()> {
    if producer.raw == consumer.raw && producer.ordinal == consumer.ordinal {
        return Ok(());
    }
    let ev = CudaEvent::new(producer.ordinal, false)?;
    ev.record(producer)?;
    consumer.wait(&ev)
}

/// The GPU a live stream belongs to: its context's device
/// (`cuStreamGetCtx`, then `cuCtxGetDevice` with that context current);
/// `None` when the driver cannot say (the caller's thread is left as it was).
///
/// # Safety
///
/// `raw` is a live `CUstream`.
pub unsafe fn stream_device(raw: usize) -> Result<Option<u32>> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a live stream (the caller's contract); `ctx` is a valid out-pointer.
    let rc = unsafe { sys::cuStreamGetCtx(raw as sys::CUstream, &mut ctx) };
    if rc != sys::CUresult::CUDA_SUCCESS || ctx.is_null() {
        return Ok(None);
    }
    // SAFETY: a live stream's context outlives this call.
    let _current = unsafe { bind_context(ctx) }?;
    super::context::current_device()
}
