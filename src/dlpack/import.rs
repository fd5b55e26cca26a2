//! DLPack → Tensor: validated, zero-copy import of foreign tensors.
//!
//! The descriptor is untrusted; only the deleter is trusted. Every field is
//! checked before use, and the producer's deleter runs exactly once on every
//! path: when validation fails (before the error is returned), or when the
//! last view of the imported tensor is dropped and the device work queued on
//! it has finished (`deferred`).

use std::ptr::NonNull;
use std::sync::Arc;

use super::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLTensor};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{DLPackError, Error, Result};
use crate::layout::{self, MAX_NDIM, Shape, Strides};
use crate::tensor::{Storage, Tensor};

/// Owns a foreign managed tensor and calls its deleter exactly once, on drop.
pub(crate) enum ForeignOwner {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

// SAFETY: the owner only carries the producer's pointer to its deleter, which
// the DLPack spec allows to be called from any thread; nothing else is read.
unsafe impl Send for ForeignOwner {}

impl Drop for ForeignOwner {
    fn drop(&mut self) {
        // SAFETY: the pointer was handed to us with ownership by `from_dlpack_*`,
        // whose caller promised a valid struct whose deleter may be called once;
        // this Drop is the only place that calls it.
        unsafe {
            match *self {
                ForeignOwner::Versioned(p) => {
                    if let Some(del) = (*p.as_ptr()).deleter {
                        del(p.as_ptr());
                    }
                }
                ForeignOwner::Legacy(p) => {
                    if let Some(del) = (*p.as_ptr()).deleter {
                        del(p.as_ptr());
                    }
                }
            }
        }
    }
}

/// Imports an owned `DLManagedTensorVersioned`, taking ownership.
///
/// # Safety
///
/// `managed` must be null or point to a `DLManagedTensorVersioned` whose
/// `version` and `deleter` fields can be read, and whose deleter (if any) may
/// be called exactly once from any thread and does not unwind. If the
/// descriptor validates, `dl_tensor.data + byte_offset` must address the
/// memory it describes, valid until the deleter runs. Ownership passes to this
/// function on every path, errors included.
///
/// The returned tensor's reads and writes are serialized only with those of
/// its own views (its storage's lock): not with another owner's of the same
/// memory, such as the producer's (a torch tensor). Writing through one while
/// another reads or writes the same bytes from another thread is a data race
/// the caller must rule out, as with any memory two libraries share. One of
/// this devtensor's own exports whose descriptor names its tensor's device
/// comes back as a view of that tensor's storage (its struct freed at once),
/// so that lock covers both (one exported `as_host`, pinned or managed memory
/// described as the CPU's, stays a separate CPU tensor); a descriptor of ours
/// changed to reach past that storage is refused.
pub unsafe fn from_dlpack_versioned(managed: *mut DLManagedTensorVersioned) -> Result<Tensor> {
    let Some(ptr) = NonNull::new(managed) else {
        return Err(DLPackError::NullTensor.into());
    };
    let owner = ForeignOwner::Versioned(ptr);
    // SAFETY: the caller guarantees `version` is readable.
    let version = unsafe { (*managed).version };
    if version.major != 1 {
        // Read nothing else, `flags` neither: another major may have another
        // layout, or a shorter struct.
        drop(owner);
        return Err(DLPackError::UnsupportedVersion { major: version.major }.into());
    }
    // SAFETY: major version 1, so the struct has the 1.x layout.
    let (flags, dl) = unsafe { ((*managed).flags, (*managed).dl_tensor) };
    // SAFETY: a readable 1.x struct whose deleter has not run.
    let own = unsafe { super::export::own_storage_versioned(managed) };
    // SAFETY: forwarded from the caller's contract.
    unsafe { import(dl, owner, flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0, own) }
}

/// Imports an owned legacy `DLManagedTensor`, taking ownership.
///
/// # Safety
///
/// As [`from_dlpack_versioned`], for the legacy struct (no version field).
pub unsafe fn from_dlpack_legacy(managed: *mut DLManagedTensor) -> Result<Tensor> {
    let Some(ptr) = NonNull::new(managed) else {
        return Err(DLPackError::NullTensor.into());
    };
    let owner = ForeignOwner::Legacy(ptr);
    // SAFETY: the caller guarantees a readable struct.
    let dl = unsafe { (*managed).dl_tensor };
    // SAFETY: readable, its deleter not run.
    let own = unsafe { super::export::own_storage_legacy(managed) };
    // SAFETY: forwarded from the caller's contract.
    unsafe { import(dl, owner, false, own) }
}

/// Validates `dl` and wraps it; `owner` is dropped (deleter called) on error.
/// `own`: the storage of one of our own exports, which the tensor shares
/// where `dl` describes a view of it on its device (the export is then freed
/// at once).
///
/// # Safety
///
/// `dl.shape` / `dl.strides`, when non-null, point to `dl.ndim` readable
/// `i64`s; the data is as described in [`from_dlpack_versioned`].
unsafe fn import(dl: DLTensor, owner: ForeignOwner, read_only: bool, own: Option<Arc<Storage>>) -> Result<Tensor> {
    // On any `?` below `owner` is dropped, calling the deleter once.
    let ndim = usize::try_from(dl.ndim)
        .ok()
        .filter(|&n| n <= MAX_NDIM)
        .ok_or(DLPackError::BadNdim(dl.ndim))?;
    let device = Device::from_dlpack(dl.device)?;
    let dtype = DType::from_dlpack(dl.dtype)?;
    if ndim > 0 && dl.shape.is_null() {
        return Err(DLPackError::NullShape.into());
    }
    let mut shape = Shape::with_capacity(ndim);
    for d in 0..ndim {
        // SAFETY: non-null (checked) and `ndim` long by the caller's contract.
        let size = unsafe { *dl.shape.add(d) };
        shape.push(usize::try_from(size).map_err(|_| DLPackError::NegativeSize { dim: d, size })?);
    }
    let strides: Strides = if dl.strides.is_null() || ndim == 0 {
        // NULL strides mean C-contiguous (allowed before DLPack 1.2).
        layout::contiguous_strides(&shape)?
    } else {
        let mut s = Strides::with_capacity(ndim);
        for d in 0..ndim {
            // SAFETY: non-null and `ndim` long by the caller's contract.
            let v = unsafe { *dl.strides.add(d) };
            s.push(isize::try_from(v).map_err(|_| DLPackError::BadExtent("stride"))?);
        }
        s
    };
    let elem = dtype.size();
    // A size or reach past the address space is the descriptor's fault: an
    // invalid tensor (BufferError in Python, INVALID_TENSOR in C), not a bad
    // argument.
    let extent = |e| match e {
        Error::Overflow { what } => Error::from(DLPackError::BadExtent(what)),
        e => e,
    };
    let numel = layout::numel(&shape).map_err(extent)?;
    layout::nbytes(&shape, elem).map_err(extent)?;
    let byte_range = layout::byte_range(&shape, &strides, elem).map_err(extent)?;
    let base = (dl.data as usize)
        .checked_add(usize::try_from(dl.byte_offset).map_err(|_| DLPackError::BadExtent("byte_offset"))?)
        .ok_or(DLPackError::BadExtent("byte_offset"))?;
    let (storage_start, len, offset) = match byte_range {
        None => (base, 0, 0),
        Some((lo, hi)) => {
            if dl.data.is_null() {
                return Err(DLPackError::NullData(numel).into());
            }
            let start = base
                .checked_add_signed(lo)
                .ok_or(DLPackError::BadExtent("view extent"))?;
            base.checked_add_signed(hi)
                .ok_or(DLPackError::BadExtent("view extent"))?;
            // `hi - lo` may pass `isize::MAX` (strides of both signs near it);
            // no storage is that long.
            let len = hi.checked_sub(lo).ok_or(DLPackError::BadExtent("view extent"))?;
            (start, len as usize, lo.unsigned_abs())
        }
    };
    if let Some(storage) = own.filter(|s| s.device() == device) {
        // Our own export: a view of its storage, or a descriptor changed to
        // reach past it, which nothing else could be trusted to own.
        let offset = view_offset(&storage, base, byte_range)
            .ok_or(DLPackError::BadExtent("view outside the exported tensor's memory"))?;
        drop(owner); // our deleter: frees the export, not the memory the tensor shares
        return Ok(Tensor::from_parts(storage, dtype, shape, strides, offset, read_only));
    }
    // An empty tensor may have NULL data: give the storage a dangling, aligned address.
    let ptr = NonNull::new(storage_start as *mut u8).unwrap_or(NonNull::<u128>::dangling().cast());
    let storage = Arc::new(Storage::foreign(ptr, len, device, Box::new(owner)));
    Ok(Tensor::from_parts(storage, dtype, shape, strides, offset, read_only))
}

/// The offset in `storage` of a view whose element 0 is at `base` and whose
/// elements span `range` bytes around it, where every one lies in the storage.
fn view_offset(storage: &Storage, base: usize, range: Option<(isize, isize)>) -> Option<usize> {
    let offset = base.checked_sub(storage.as_ptr() as usize)?;
    layout::range_fits(offset, range, storage.len()).then_some(offset)
}
