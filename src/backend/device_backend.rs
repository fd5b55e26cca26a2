//! [`DeviceBackend`]: what every backend (the CPU, CUDA, ROCm) provides, so
//! that `tensor`, `dlpack`, `python`, `capi` and the CLI call one interface
//! and [`for_device`](super::for_device) alone decides which backend serves
//! a device.

use std::any::Any;
use std::sync::Arc;

use super::BackendStatus;
use super::gpu_runtime::{GpuRuntime, GpuStream};
use crate::alloc::{MemoryStats, NDAlloc};
use crate::device::{Backend, Device};
use crate::error::{Error, Result};
use crate::stream::StreamHandle;

/// A device made current on the calling thread until dropped (the backend's
/// context guard); not `Send`, a current device belongs to a thread.
#[must_use = "the device is current only while this guard lives"]
pub struct BoundDevice(#[allow(dead_code)] Option<Box<dyn Any>>);

impl BoundDevice {
    /// A guard that restores nothing (devices without a current-device notion).
    pub fn none() -> BoundDevice {
        BoundDevice(None)
    }

    /// Keeps `guard` (a backend's own context guard) alive.
    pub fn new(guard: impl Any) -> BoundDevice {
        BoundDevice(Some(Box::new(guard)))
    }
}

/// One backend: its probe, allocators, copies and fills, current device and
/// stream ordering. Object-safe: [`for_device`](super::for_device) hands out
/// `&'static dyn DeviceBackend`.
pub trait DeviceBackend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> Backend;

    /// What its probe found (cached after the first call).
    fn status(&self) -> &'static BackendStatus;

    /// The error every entry point of an unusable backend returns.
    fn unavailable(&self) -> Error {
        Error::BackendUnavailable {
            backend: self.kind(),
            reason: self.status().unavailable_reason(),
        }
    }

    /// The ordinal of this backend's device current on the calling thread:
    /// what a device named without an index (`"cuda"`) means. Makes nothing.
    fn current_ordinal(&self) -> Result<u32>;

    /// The allocator devtensor uses for `device` unless told otherwise.
    fn allocator(&self, device: Device) -> Result<Arc<dyn NDAlloc>>;

    /// The caching pool's figures for `device`; `None` where it has no pool.
    fn pool_stats(&self, device: Device) -> Result<Option<MemoryStats>> {
        let _ = device;
        Ok(None)
    }

    /// Returns `device`'s cached free memory to the device; the bytes released.
    fn empty_cache(&self, device: Device) -> Result<usize> {
        let _ = device;
        Ok(0)
    }

    /// The GPU runtime the copy paths run on (DMA, kernels, events, peer
    /// access); `None` for the CPU, whose copies the host engine runs, and for
    /// a backend not built in.
    fn gpu(&self) -> Option<&dyn GpuRuntime> {
        None
    }

    /// Whether the backend's driver library is missing altogether (not merely
    /// without devices, or failing): then no work of this process can be
    /// queued on its streams. False where a backend cannot tell.
    fn driver_missing(&self) -> bool {
        false
    }

    /// The backend's default stream (CUDA's legacy stream, HIP's null stream),
    /// where blocking work runs unless a current stream is set; `None` for a
    /// backend without streams.
    fn default_stream(&self) -> Option<StreamHandle> {
        None
    }

    /// The stream devtensor's copies and fills of `device` run on in this
    /// thread: the current stream when one is set, else the default stream;
    /// `None` for memory whose work the host waits for (host memory).
    fn work_stream(&self, device: Device) -> Option<StreamHandle> {
        Some(self.gpu()?.work_stream(device.ordinal()?).handle)
    }

    /// The stream a DLPack `stream` argument names for GPU `ordinal` (`None`:
    /// no synchronisation requested, `-1`); `Err` for values the spec forbids.
    ///
    /// # Safety
    ///
    /// A value that is not one of the backend's default-stream values must be
    /// a live stream of that GPU for as long as the handle is used.
    unsafe fn stream_from_dlpack(&self, ordinal: u32, value: Option<i64>) -> Result<Option<StreamHandle>> {
        let _ = (ordinal, value);
        Ok(None)
    }

    /// Work queued on `producer` so far happens before work later queued on
    /// `consumer`, both streams of GPU `ordinal` (an event recorded on one,
    /// waited on by the other; the host does not block). Nothing when they
    /// are the same stream.
    fn order_streams(&self, ordinal: u32, producer: StreamHandle, consumer: StreamHandle) -> Result<()> {
        match self.gpu() {
            Some(rt) => rt.handoff(&self.gpu_stream(ordinal, producer), &self.gpu_stream(ordinal, consumer)),
            None => Ok(()),
        }
    }

    /// Blocks the host until `stream`'s work is done.
    fn synchronize_stream(&self, ordinal: u32, stream: StreamHandle) -> Result<()> {
        match self.gpu() {
            Some(rt) => rt.synchronize(&self.gpu_stream(ordinal, stream)),
            None => Ok(()),
        }
    }

    /// `stream` of GPU `ordinal` for the runtime; a NULL handle (0, what C
    /// callers and producers pass for "the default") is the backend's
    /// default stream (CUDA's legacy stream, value 1).
    fn gpu_stream(&self, ordinal: u32, stream: StreamHandle) -> GpuStream {
        let handle = match self.default_stream() {
            Some(default) if stream.as_raw() == 0 => default,
            _ => stream,
        };
        GpuStream { ordinal, handle }
    }

    /// Blocks the host until the default stream's work and that of each of
    /// `streams` (a storage's streams) is done, so the host may read managed
    /// memory; a stream that cannot be asked makes it wait for the device.
    fn synchronize_streams(&self, ordinal: u32, streams: &[StreamHandle]) -> Result<()> {
        let _ = (ordinal, streams);
        Ok(())
    }

    /// Makes GPU `ordinal` current on the calling thread until the guard drops.
    fn bind(&self, ordinal: u32) -> Result<BoundDevice> {
        let _ = ordinal;
        Ok(BoundDevice::none())
    }

    /// The device memory at `ptr` belongs to (`__cuda_array_interface__`
    /// pointers); `Err` for memory this backend does not know.
    fn pointer_device(&self, ptr: u64) -> Result<Device> {
        let _ = ptr;
        Err(self.unavailable())
    }

    // ----- the DLPack stream handoff, written once for every backend ----------------

    /// The DLPack producer's rule: our pending work on `device`'s work stream
    /// happens before the consumer's, which named its stream as `value` in
    /// `__dlpack__(stream=...)`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBackend::stream_from_dlpack`].
    unsafe fn order_before_consumer(&self, device: Device, value: Option<i64>) -> Result<()> {
        let (Some(ordinal), Some(ours)) = (device.ordinal(), self.work_stream(device)) else {
            return Ok(());
        };
        // SAFETY: forwarded from the caller.
        match unsafe { self.stream_from_dlpack(ordinal, value) }? {
            Some(theirs) => self.order_streams(ordinal, ours, theirs),
            None => Ok(()),
        }
    }

    /// The consumer's side: the producer's pending work on `producer` happens
    /// before ours on `device`'s work stream.
    fn order_after_producer(&self, device: Device, producer: StreamHandle) -> Result<()> {
        match (device.ordinal(), self.work_stream(device)) {
            (Some(ordinal), Some(ours)) => self.order_streams(ordinal, producer, ours),
            _ => Ok(()),
        }
    }
}
