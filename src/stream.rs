//! Stream handles as DLPack passes them.
//!
//! On CUDA a stream is a `CUstream`; DLPack spells the legacy default stream as
//! 1 and the per-thread default stream as 2. The CPU has no streams.

/// A device stream handle (`CUstream` / `hipStream_t` as an integer), as
/// allocators record it and DLPack passes it. Safe code gets one only from a
/// live stream (the stream types' `handle()`), from the constants below, or
/// through [`StreamHandle::from_raw`], whose caller vouches for the value: a
/// function taking a `StreamHandle` may hand it to the driver. devtensor
/// never destroys a handle it did not create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(usize);

impl StreamHandle {
    /// CUDA's legacy default stream (`cudaStreamLegacy`, DLPack value 1).
    pub const CUDA_LEGACY: StreamHandle = StreamHandle(1);
    /// CUDA's per-thread default stream (`cudaStreamPerThread`, DLPack value 2).
    pub const CUDA_PER_THREAD: StreamHandle = StreamHandle(2);
    /// HIP's null (default) stream (DLPack value 0 or `None` on ROCm).
    pub const ROCM_DEFAULT: StreamHandle = StreamHandle(0);

    /// Wraps a raw stream value.
    ///
    /// # Safety
    ///
    /// `raw` is a stream of the device it will be used with (or one of that
    /// backend's default-stream values), and stays alive as long as the
    /// handle, or anything it is recorded in, is used.
    pub const unsafe fn from_raw(raw: usize) -> StreamHandle {
        StreamHandle(raw)
    }

    /// The raw value (`CUstream` / `hipStream_t` as an integer).
    pub const fn as_raw(self) -> usize {
        self.0
    }
}

/// A device event handle (`CUevent` / `hipEvent_t` as an integer), owned by
/// the allocator that recorded it ([`NDAlloc::record_event`](crate::NDAlloc::record_event)),
/// which alone makes one in safe code and releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(usize);

impl EventHandle {
    /// Wraps a raw event value.
    ///
    /// # Safety
    ///
    /// `raw` is an event the calling allocator created, not yet destroyed; the
    /// allocator releasing the handle destroys it, once.
    pub const unsafe fn from_raw(raw: usize) -> EventHandle {
        EventHandle(raw)
    }

    /// The raw value (`CUevent` / `hipEvent_t` as an integer).
    pub const fn as_raw(self) -> usize {
        self.0
    }
}

/// The streams devtensor creates are never destroyed, only reused: memory
/// records the streams it was used on and, when freed, records an event on
/// each (torch's `record_stream`), maybe long after the stream's owner let it
/// go. A destroyed stream's handle dangles, and a real driver crashes on it
/// (SIGSEGV in the free's event record, seen on an H100 with driver 580), so a
/// dropped stream goes back to this list for the next new stream of its GPU,
/// as torch's streams come from a pool that lives as long as the process.
/// (Without a GPU backend nothing creates streams, and the list stays empty.)
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) mod own {
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex};

    use crate::device::Device;
    use crate::error::Result;

    #[derive(Default)]
    struct Own {
        /// Every stream created: handles that stay valid.
        all: HashSet<usize>,
        /// Those no live stream value holds, ready for reuse.
        free: Vec<(Device, usize)>,
    }

    static OWN: LazyLock<Mutex<Own>> = LazyLock::new(Default::default);

    fn with<R>(f: impl FnOnce(&mut Own) -> R) -> R {
        f(&mut OWN.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A stream of `gpu` dropped earlier whose work is done (`idle`), so that a
    /// new stream starts with nothing queued as a created one does; else a new
    /// one from `create` (called without the list locked), noted as ours.
    pub(crate) fn reuse_or_create(
        gpu: Device,
        idle: impl Fn(usize) -> bool,
        create: impl FnOnce() -> Result<usize>,
    ) -> Result<usize> {
        let reused = with(|o| {
            let i = o.free.iter().position(|&(d, raw)| d == gpu && idle(raw))?;
            Some(o.free.swap_remove(i).1)
        });
        if let Some(raw) = reused {
            return Ok(raw);
        }
        let raw = create()?;
        with(|o| o.all.insert(raw));
        Ok(raw)
    }

    /// Takes back a stream whose owner dropped it.
    pub(crate) fn dropped(gpu: Device, raw: usize) {
        with(|o| o.free.push((gpu, raw)));
    }

    /// True for a stream devtensor created (on any GPU: handles are unique in
    /// a process): it stays valid for the process's life, so memory may record it.
    pub(crate) fn is_own(stream: super::StreamHandle) -> bool {
        with(|o| o.all.contains(&stream.as_raw()))
    }
}

/// The calling thread's current stream per GPU (torch's `torch.cuda.stream(s)`):
/// devtensor's copies, fills and allocations on that GPU run on it. Unset: the
/// device's default stream.
mod current {
    use std::cell::RefCell;

    use smallvec::SmallVec;

    use super::StreamHandle;
    use crate::device::Device;

    thread_local! {
        static CURRENT: RefCell<SmallVec<[(Device, StreamHandle); 2]>> = RefCell::new(SmallVec::new());
    }

    /// The GPU a device's streams belong to (managed memory is its GPU's);
    /// `None` for host memory, which has no streams.
    fn key(device: Device) -> Option<Device> {
        match device {
            Device::Cuda(i) | Device::CudaManaged(i) => Some(Device::Cuda(i)),
            Device::Rocm(i) => Some(Device::Rocm(i)),
            Device::Cpu | Device::CudaHost | Device::RocmHost => None,
        }
    }

    /// The stream the calling thread made current for `device`'s GPU, if any.
    pub fn current_stream(device: Device) -> Option<StreamHandle> {
        let key = key(device)?;
        CURRENT.with_borrow(|c| c.iter().find(|(d, _)| *d == key).map(|&(_, s)| s))
    }

    /// Makes `stream` the calling thread's current stream for `device`'s GPU
    /// (`None`: back to the default stream); returns the previous one. The
    /// stream must stay alive while it is current. A no-op for host memory.
    pub fn set_current_stream(device: Device, stream: Option<StreamHandle>) -> Option<StreamHandle> {
        let key = key(device)?;
        CURRENT.with_borrow_mut(|c| {
            let prev = c.iter().position(|(d, _)| *d == key).map(|i| c.remove(i).1);
            if let Some(s) = stream {
                c.push((key, s));
            }
            prev
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn current_stream_is_per_thread_and_per_gpu() {
            // SAFETY: only recorded and compared, never handed to a driver.
            let s = unsafe { StreamHandle::from_raw(0x1234) };
            assert_eq!(current_stream(Device::Cuda(0)), None);
            assert_eq!(set_current_stream(Device::Cuda(0), Some(s)), None);
            assert_eq!(current_stream(Device::Cuda(0)), Some(s));
            assert_eq!(
                current_stream(Device::CudaManaged(0)),
                Some(s),
                "managed memory is its GPU's"
            );
            assert_eq!(current_stream(Device::Cuda(1)), None);
            assert_eq!(current_stream(Device::Cpu), None);
            assert_eq!(
                set_current_stream(Device::Cpu, Some(s)),
                None,
                "host memory has no streams"
            );
            std::thread::spawn(|| assert_eq!(current_stream(Device::Cuda(0)), None))
                .join()
                .unwrap();
            assert_eq!(set_current_stream(Device::Cuda(0), None), Some(s));
            assert_eq!(current_stream(Device::Cuda(0)), None);
        }
    }
}

pub use current::{current_stream, set_current_stream};
