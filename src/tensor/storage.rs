//! [`Storage`]: a block of device or host memory shared by every view of it,
//! and who frees it: one of our allocators (ordered on the streams that used
//! it) or a DLPack producer's deleter (run once that work is done).

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::access::AccessLock;
use crate::alloc::{Allocation, NDAlloc};
use crate::backend::deferred::ForeignOwner;
use crate::device::Device;
use crate::error::Result;
use crate::stream::StreamHandle;

/// The allocator of a [`Storage`]: the process's CPU allocator by a plain
/// reference (small CPU tensors pay for every atomic operation, and an `Arc`'s
/// count costs two), any other one shared.
pub(crate) enum AllocRef {
    Static(&'static dyn NDAlloc),
    Shared(Arc<dyn NDAlloc>),
}

impl AllocRef {
    /// The default allocator of `device` ([`default_allocator`](crate::backend::default_allocator)).
    pub(crate) fn for_device(device: Device) -> Result<AllocRef> {
        match device {
            Device::Cpu => Ok(AllocRef::Static(&crate::alloc::CpuAlloc)),
            _ => crate::backend::default_allocator(device).map(AllocRef::Shared),
        }
    }
}

impl std::ops::Deref for AllocRef {
    type Target = dyn NDAlloc;

    fn deref(&self) -> &(dyn NDAlloc + 'static) {
        match self {
            AllocRef::Static(a) => *a,
            AllocRef::Shared(a) => &**a,
        }
    }
}

impl From<Arc<dyn NDAlloc>> for AllocRef {
    fn from(a: Arc<dyn NDAlloc>) -> AllocRef {
        AllocRef::Shared(a)
    }
}

/// Who frees a [`Storage`]'s bytes.
pub(crate) enum Owner {
    /// Memory from one of our allocators.
    Alloc {
        /// The allocator that made it.
        alloc: AllocRef,
        /// What it handed out.
        allocation: Allocation,
        /// The stream it was allocated on.
        stream: Option<StreamHandle>,
        /// Other streams the memory was used on (`record_stream`).
        used_on: Mutex<SmallVec<[StreamHandle; 2]>>,
    },
    /// Memory owned by a DLPack producer; dropping the guard calls its deleter
    /// once: at once, or, when device work queued on `used_on` streams may
    /// still use the memory, once that work is done (`backend::deferred`).
    Foreign {
        /// The producer's deleter; taken by `Drop`.
        guard: Option<ForeignOwner>,
        /// Streams device work touching the memory was queued on.
        used_on: Mutex<SmallVec<[StreamHandle; 2]>>,
    },
}

/// A block of device or host memory shared by every view of it.
pub struct Storage {
    ptr: NonNull<u8>,
    len: usize,
    device: Device,
    owner: Owner,
    /// Held by every safe call that reads or writes the bytes (`access`).
    access: AccessLock,
}

// SAFETY: Storage is an owning handle to raw memory: the pointer is only
// dereferenced through Tensor methods that check read-only and device
// accessibility, and freeing (allocator or DLPack deleter) is thread-agnostic
// by the NDAlloc contract and the DLPack spec ("the deleter can be called from
// any thread").
unsafe impl Send for Storage {}
// SAFETY: shared references only expose the pointer value and metadata.
unsafe impl Sync for Storage {}

impl Storage {
    /// Allocates `size` bytes with `alloc`, ordered on `stream`.
    #[inline]
    pub fn new(alloc: Arc<dyn NDAlloc>, size: usize, stream: Option<StreamHandle>) -> Result<Storage> {
        Storage::allocate(alloc.into(), size, stream, false)
    }

    /// [`Storage::new`] with an [`AllocRef`].
    #[inline]
    pub(crate) fn new_in(alloc: AllocRef, size: usize, stream: Option<StreamHandle>) -> Result<Storage> {
        Storage::allocate(alloc, size, stream, false)
    }

    /// Allocates `size` bytes about to be zero-filled ([`NDAlloc::allocate_for_zeros`]).
    pub(crate) fn new_for_zeros(alloc: AllocRef, size: usize, stream: Option<StreamHandle>) -> Result<Storage> {
        Storage::allocate(alloc, size, stream, true)
    }

    #[inline(always)]
    fn allocate(alloc: AllocRef, size: usize, stream: Option<StreamHandle>, for_zeros: bool) -> Result<Storage> {
        // Foreign deleters whose device work has finished run now (a cheap
        // atomic load when none wait); not while this thread holds a storage
        // locked (a staged copy's temporaries): a deleter may wait for the
        // Python GIL, whose holder may wait for that lock.
        if crate::backend::deferred::waiting() && !super::access::holds_any() {
            crate::backend::deferred::poll();
        }
        let align = crate::alloc::CPU_ALIGNMENT;
        let allocation = if for_zeros {
            alloc.allocate_for_zeros(size, align, stream)?
        } else {
            alloc.allocate(size, align, stream)?
        };
        let device = alloc.device();
        Ok(Storage {
            ptr: allocation.ptr,
            len: size,
            device,
            owner: Owner::Alloc {
                alloc,
                allocation,
                stream,
                used_on: Mutex::new(SmallVec::new()),
            },
            access: AccessLock::default(),
        })
    }

    /// Whether the memory, fresh from its allocator and not yet written, reads
    /// as zeros ([`NDAlloc::zero_filled`]).
    pub(crate) fn fresh_zeros(&self) -> bool {
        match &self.owner {
            Owner::Alloc { alloc, allocation, .. } => alloc.zero_filled(allocation),
            Owner::Foreign { .. } => false,
        }
    }

    /// Marks the memory as used on `stream` as well (torch's `record_stream`):
    /// a stream-aware pool will not reuse it elsewhere before that work is done,
    /// and a foreign (DLPack-imported) owner's deleter waits for that work.
    /// `stream` must stay a live stream of the storage's device until the
    /// storage is freed (devtensor's own streams always do: they are never
    /// destroyed). A real driver may crash on a destroyed one; where the driver
    /// reports it instead (`CUDA_ERROR_INVALID_HANDLE`), the free falls back to a
    /// device synchronize.
    pub fn record_stream(&self, stream: StreamHandle) {
        let used_on = match &self.owner {
            Owner::Alloc {
                stream: own, used_on, ..
            } if *own != Some(stream) => used_on,
            Owner::Foreign { used_on, .. } => used_on,
            Owner::Alloc { .. } => return,
        };
        let mut used = used_on.lock().unwrap_or_else(|p| p.into_inner());
        if !used.contains(&stream) {
            used.push(stream);
        }
    }

    /// Notes that work queued on `stream`, the device's default stream (the
    /// one blocking copies and fills run on), may still use the memory. Memory
    /// our pool allocated on the default stream needs nothing (the pool reuses
    /// it on that stream, in order); foreign memory and memory allocated on
    /// another stream record it.
    pub(crate) fn record_default_stream(&self, stream: StreamHandle) {
        match &self.owner {
            Owner::Alloc { stream: None, .. } => {}
            _ => self.record_stream(stream),
        }
    }

    /// The streams work on this memory may be queued on: the one it was
    /// allocated on and those recorded.
    pub fn streams(&self) -> SmallVec<[StreamHandle; 2]> {
        let (own, used_on) = match &self.owner {
            Owner::Alloc { stream, used_on, .. } => (*stream, used_on),
            Owner::Foreign { used_on, .. } => (None, used_on),
        };
        let mut all: SmallVec<[StreamHandle; 2]> = own.into_iter().collect();
        all.extend(used_on.lock().unwrap_or_else(|p| p.into_inner()).iter().copied());
        all
    }

    /// Wraps foreign memory (DLPack import).
    pub(crate) fn foreign(ptr: NonNull<u8>, len: usize, device: Device, owner: ForeignOwner) -> Storage {
        Storage {
            ptr,
            len,
            device,
            owner: Owner::Foreign {
                guard: Some(owner),
                used_on: Mutex::new(SmallVec::new()),
            },
            access: AccessLock::default(),
        }
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte storage.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the bytes live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The lock safe calls hold while they touch the bytes.
    pub(super) fn access_lock(&self) -> &AccessLock {
        &self.access
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        match &mut self.owner {
            Owner::Alloc {
                alloc,
                allocation,
                stream,
                used_on,
            } => {
                let used = used_on.get_mut().unwrap_or_else(|p| p.into_inner());
                // SAFETY: `allocation` came from `alloc.allocate` in `Storage::new`
                // and this is the only place that frees it.
                unsafe {
                    if used.is_empty() {
                        alloc.deallocate(*allocation, *stream)
                    } else {
                        alloc.deallocate_after(*allocation, *stream, used)
                    }
                }
            }
            Owner::Foreign { guard, used_on } => {
                let used = std::mem::take(used_on.get_mut().unwrap_or_else(|p| p.into_inner()));
                if let Some(guard) = guard.take() {
                    // The guard's own Drop calls the deleter: now, or once the
                    // device work recorded on `used` is done.
                    crate::backend::deferred::release_after(self.device, &used, guard);
                }
            }
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}
