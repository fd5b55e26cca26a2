//! HIP streams and events, and the DLPack handoff rule on ROCm: record an
//! event on the producer's stream and make the consumer's stream wait on it;
//! never block the host.

use super::context::{check, device};
use super::ffi;
use crate::error::{Error, Result};

/// A HIP stream: owned (made by devtensor, back to its reuse list on drop,
/// never destroyed) or borrowed (a consumer's handle,
/// or the null default stream, never destroyed by devtensor).
#[derive(Debug)]
pub struct RocmStream {
    raw: ffi::Stream,
    ordinal: u32,
    owned: bool,
}

// SAFETY: a hipStream_t may be used from any thread (the runtime serialises).
unsafe impl Send for RocmStream {}
// SAFETY: as above; the struct is immutable.
unsafe impl Sync for RocmStream {}

impl RocmStream {
    /// A non-blocking stream on GPU `ordinal`: one dropped earlier, else a new
    /// one. Its handle stays valid after drop (memory may have recorded it;
    /// see `crate::stream::own`).
    pub fn new(ordinal: u32) -> Result<RocmStream> {
        let _current = device(ordinal)?.bind()?; // a forked child's typed error, first
        let raw = crate::stream::own::reuse_or_create(
            crate::Device::Rocm(ordinal),
            // SAFETY: a stream devtensor made on this GPU, never destroyed.
            |raw| unsafe { ffi::hipStreamQuery(raw as ffi::Stream) } == ffi::SUCCESS,
            || {
                let mut raw: ffi::Stream = std::ptr::null_mut();
                // SAFETY: valid out-pointer; the GPU is current.
                check("hipStreamCreateWithFlags", unsafe {
                    ffi::hipStreamCreateWithFlags(&mut raw, ffi::STREAM_NON_BLOCKING)
                })?;
                Ok(raw as usize)
            },
        )?;
        Ok(RocmStream {
            raw: raw as ffi::Stream,
            ordinal,
            owned: true,
        })
    }

    /// The null (default) stream of GPU `ordinal` (DLPack value `None` or 0).
    pub fn default_stream(ordinal: u32) -> RocmStream {
        RocmStream {
            raw: std::ptr::null_mut(),
            ordinal,
            owned: false,
        }
    }

    /// Wraps a stream handle owned by someone else; never destroyed here.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of GPU `ordinal` (or 0) for as long as the
    /// returned value is used.
    pub unsafe fn borrowed(ordinal: u32, raw: usize) -> RocmStream {
        RocmStream {
            raw: raw as ffi::Stream,
            ordinal,
            owned: false,
        }
    }

    /// The stream a DLPack `stream` argument names on ROCm: `None` and 0 → the
    /// default stream, >2 a pointer, -1 → `None` (no sync); 1, 2 and other
    /// negatives are invalid (they are CUDA's legacy and per-thread values).
    ///
    /// # Safety
    ///
    /// A value > 2 must be a live `hipStream_t` of GPU `ordinal`.
    pub unsafe fn from_dlpack(ordinal: u32, value: Option<i64>) -> Result<Option<RocmStream>> {
        match value {
            None | Some(0) => Ok(Some(RocmStream::default_stream(ordinal))),
            Some(-1) => Ok(None),
            Some(v) if v > 2 => {
                // SAFETY: forwarded from the caller.
                Ok(Some(unsafe { RocmStream::borrowed(ordinal, v as usize) }))
            }
            Some(_) => Err(Error::InvalidArgument {
                op: "a ROCm DLPack stream",
                reason: "1, 2 and negative values other than -1 are not allowed".into(),
            }),
        }
    }

    /// The raw handle.
    pub fn raw(&self) -> ffi::Stream {
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
        // SAFETY: a valid stream handle of this GPU.
        check("hipStreamSynchronize", unsafe { ffi::hipStreamSynchronize(self.raw) })
    }

    /// Makes this stream wait (on the device) for everything `event` recorded.
    pub fn wait(&self, event: &RocmEvent) -> Result<()> {
        let _current = device(self.ordinal)?.bind()?;
        // SAFETY: both handles are valid; flags 0 is the default wait.
        check("hipStreamWaitEvent", unsafe {
            ffi::hipStreamWaitEvent(self.raw, event.raw, 0)
        })
    }
}

impl Drop for RocmStream {
    fn drop(&mut self) {
        if self.owned {
            crate::stream::own::dropped(crate::Device::Rocm(self.ordinal), self.raw as usize);
        }
    }
}

/// A HIP event.
#[derive(Debug)]
pub struct RocmEvent {
    raw: ffi::Event,
    ordinal: u32,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for RocmEvent {}
// SAFETY: as above.
unsafe impl Sync for RocmEvent {}

impl RocmEvent {
    /// A new event; `timing` enables `elapsed_ms`.
    pub fn new(ordinal: u32, timing: bool) -> Result<RocmEvent> {
        let _current = device(ordinal)?.bind()?;
        let flags = if timing { 0 } else { ffi::EVENT_DISABLE_TIMING };
        let mut raw: ffi::Event = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the GPU is current.
        check("hipEventCreateWithFlags", unsafe {
            ffi::hipEventCreateWithFlags(&mut raw, flags)
        })?;
        Ok(RocmEvent { raw, ordinal })
    }

    /// The raw handle.
    pub fn raw(&self) -> ffi::Event {
        self.raw
    }

    /// Records the current end of `stream`'s work.
    pub fn record(&self, stream: &RocmStream) -> Result<()> {
        let _current = device(self.ordinal)?.bind()?;
        // SAFETY: both handles are valid.
        check("hipEventRecord", unsafe { ffi::hipEventRecord(self.raw, stream.raw) })
    }

    /// Blocks the host until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a valid event.
        check("hipEventSynchronize", unsafe { ffi::hipEventSynchronize(self.raw) })
    }

    /// True when the recorded work is done (no blocking).
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: a valid event.
        let rc = unsafe { ffi::hipEventQuery(self.raw) };
        if rc == ffi::ERROR_NOT_READY {
            return Ok(false);
        }
        check("hipEventQuery", rc).map(|()| true)
    }

    /// Milliseconds between two timing events.
    pub fn elapsed_ms(&self, end: &RocmEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both are timing events that have completed.
        check("hipEventElapsedTime", unsafe {
            ffi::hipEventElapsedTime(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { ffi::hipEventDestroy(self.raw) };
    }
}

/// Blocks the host until the work queued on GPU `ordinal`'s null stream and
/// on each of `streams` (a storage's streams, see `Storage::streams`) is
/// done, so the host may read host-visible memory. A stream that cannot be
/// synchronised (destroyed by its owner) makes it wait for the whole device.
pub fn synchronize_streams(ordinal: u32, streams: &[crate::stream::StreamHandle]) -> Result<()> {
    RocmStream::default_stream(ordinal).synchronize()?;
    for s in streams {
        if s.as_raw() == 0 {
            continue; // the null stream, synchronised above
        }
        // SAFETY: a recorded stream is a stream of this GPU (the `record_stream`
        // contract); a destroyed one is answered with an error.
        if unsafe { RocmStream::borrowed(ordinal, s.as_raw()) }
            .synchronize()
            .is_err()
        {
            let _current = device(ordinal)?.bind()?;
            // SAFETY: the GPU is current.
            return check("hipDeviceSynchronize", unsafe { ffi::hipDeviceSynchronize() });
        }
    }
    Ok(())
}

/// The DLPack handoff: work enqueued on `producer` so far happens before any
/// work later enqueued on `consumer`. Nothing when they are the same stream.
pub fn handoff(producer: &RocmStream, consumer: &RocmStream) -> Result<()> {
    if producer.raw == consumer.raw && producer.ordinal == consumer.ordinal {
        return Ok(());
    }
    let ev = RocmEvent::new(producer.ordinal, false)?;
    ev.record(producer)?;
    consumer.wait(&ev)
}
