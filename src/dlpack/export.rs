//! Tensor → DLPack: owned `DLManagedTensorVersioned` / legacy `DLManagedTensor`.
//!
//! One heap block holds the managed struct, the shape and stride arrays and a
//! reference to the storage (which keeps the memory alive); `manager_ctx`
//! points at the block and the deleter frees it exactly once.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};
use super::managed::{DeleterStruct, ManagedTensor};
use crate::error::{Error, Result};
use crate::tensor::{Storage, Tensor};

static LIVE_EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// Exported tensors whose deleter has not run yet (process-wide; for leak tests).
pub fn live_exports() -> usize {
    LIVE_EXPORTS.load(Ordering::Relaxed)
}

/// Options for an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportOptions {
    /// DLPack minor version to announce (clamped to the one implemented).
    pub minor_version: u32,
    /// Set `IS_COPIED`: the tensor was copied for this export.
    pub is_copied: bool,
    /// Describe host-accessible memory (pinned, managed) as `kDLCPU`, for a
    /// consumer that asked for `dl_device=(kDLCPU, 0)`. Ignored for memory the
    /// host cannot read.
    pub as_host: bool,
    /// The consumer's stream (`__dlpack__(stream=S)`). The caller orders the
    /// producer's work before it (the DLPack handoff). When it is a stream
    /// devtensor made (never destroyed: `crate::stream::own`), it is recorded on
    /// the storage ([`Storage::record_stream`]): when the export's deleter drops
    /// the last reference, the pool does not hand the memory to other work
    /// before what the consumer queued there is done. Another consumer's stream
    /// is not recorded: its owner may destroy it before releasing the export
    /// (CuPy's streams go when collected, maybe before the arrays imported on
    /// them), and touching a destroyed stream crashes a real driver. Such a
    /// consumer finishes or orders its work before it releases the export, as
    /// with torch's and CuPy's own exports. The default streams need not be
    /// given: our pool reuses memory on the legacy / null stream, which waits
    /// for them.
    pub stream: Option<crate::stream::StreamHandle>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            minor_version: DLPACK_MINOR_VERSION,
            is_copied: false,
            as_host: false,
            stream: None,
        }
    }
}

/// The heap block behind one export. `#[repr(C)]` with the managed struct first,
/// so a pointer to the block is a pointer to the struct.
#[repr(C)]
struct Exported<M> {
    managed: M,
    /// The shape, then the strides. Inline up to 6 dims: the block is boxed and
    /// never moves, so pointers into inline storage stay valid.
    dims: Dims,
    /// Keeps the memory alive until the deleter runs (the view's shape, strides
    /// and offset are all in `managed`).
    _storage: Arc<Storage>,
}

fn describe(t: &Tensor, as_host: bool, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    let device = if as_host && t.device().is_host_accessible() {
        crate::Device::Cpu
    } else {
        t.device()
    };
    DLTensor {
        // The view offset goes into `data`, `byte_offset` stays 0: older
        // consumers (torch before 2.x) ignored `byte_offset`.
        data: t.data_ptr().cast::<c_void>(),
        device: device.to_dlpack(),
        ndim: t.ndim() as i32,
        dtype: t.dtype().to_dlpack(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

/// The two managed structs, as far as an export fills them in.
trait Managed {
    fn set(&mut self, dl_tensor: DLTensor, manager_ctx: *mut c_void);
}

impl Managed for DLManagedTensorVersioned {
    fn set(&mut self, dl_tensor: DLTensor, manager_ctx: *mut c_void) {
        self.dl_tensor = dl_tensor;
        self.manager_ctx = manager_ctx;
    }
}

impl Managed for DLManagedTensor {
    fn set(&mut self, dl_tensor: DLTensor, manager_ctx: *mut c_void) {
        self.dl_tensor = dl_tensor;
        self.manager_ctx = manager_ctx;
    }
}

/// Shape then strides of an export: inline up to [`INLINE_DIMS`] dims (no
/// second allocation for the common case), on the heap beyond.
enum Dims {
    Inline([i64; 2 * INLINE_DIMS]),
    Heap(Box<[i64]>),
}

const INLINE_DIMS: usize = 6;

impl Dims {
    fn of(t: &Tensor) -> Dims {
        // usize/isize → i64 is lossless on every 64-bit target DLPack runs on.
        let n = t.ndim();
        let fill = |out: &mut [i64]| {
            let (shape, strides) = out.split_at_mut(n);
            for (o, &d) in shape.iter_mut().zip(t.shape()) {
                *o = d as i64;
            }
            for (o, &s) in strides.iter_mut().zip(t.strides()) {
                *o = s as i64;
            }
        };
        if n <= INLINE_DIMS {
            let mut a = [0; 2 * INLINE_DIMS];
            fill(&mut a[..2 * n]);
            Dims::Inline(a)
        } else {
            let mut v = vec![0; 2 * n].into_boxed_slice();
            fill(&mut v);
            Dims::Heap(v)
        }
    }

    fn as_mut_slice(&mut self) -> &mut [i64] {
        match self {
            Dims::Inline(a) => a,
            Dims::Heap(v) => v,
        }
    }
}

/// Boxes `managed` with the storage and the dims, then points the struct's
/// descriptor and `manager_ctx` into the block.
fn export<M: Managed + DeleterStruct>(t: &Tensor, managed: M, opts: ExportOptions) -> ManagedTensor<M> {
    if let Some(s) = opts.stream.filter(|&s| crate::stream::own::is_own(s)) {
        t.storage().record_stream(s);
    }
    let as_host = opts.as_host;
    let n = t.ndim();
    let raw = Box::into_raw(Box::new(Exported {
        managed,
        dims: Dims::of(t),
        _storage: Arc::clone(t.storage()),
    }));
    // SAFETY: `raw` is a fresh, unique pointer to a heap block that never
    // moves until the deleter frees it, so pointers into its dims (inline or
    // heap) stay valid for the export's life.
    unsafe {
        let b = &mut *raw;
        let (shape, rest) = b.dims.as_mut_slice().split_at_mut(n);
        let dl = describe(t, as_host, shape, &mut rest[..n]);
        b.managed.set(dl, raw.cast::<c_void>());
    }
    LIVE_EXPORTS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: a live struct (the block starts with it) whose deleter has not run.
    unsafe { ManagedTensor::from_raw(NonNull::new_unchecked(raw.cast::<M>())) }
}

impl Tensor {
    /// Exports as a `DLManagedTensorVersioned` (DLPack ≥ 1.0). READ_ONLY is set
    /// for read-only tensors. Dropping the result runs its deleter; hand it to
    /// a consumer with [`ManagedTensor::into_raw`].
    pub fn to_dlpack_versioned(&self, opts: ExportOptions) -> ManagedTensor<DLManagedTensorVersioned> {
        let mut flags = 0;
        if self.is_read_only() {
            flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
        }
        if opts.is_copied {
            flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
        }
        let managed = DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR_VERSION,
                minor: opts.minor_version.min(DLPACK_MINOR_VERSION),
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor: describe(self, false, &mut [], &mut []),
        };
        export(self, managed, opts)
    }

    /// Exports as a legacy `DLManagedTensor` (the `"dltensor"` capsule kind).
    /// A read-only tensor cannot be described by the legacy struct: `Err(ReadOnly)`.
    pub fn to_dlpack_legacy(&self) -> Result<ManagedTensor<DLManagedTensor>> {
        self.to_dlpack_legacy_with(ExportOptions::default())
    }

    /// As [`Tensor::to_dlpack_legacy`]; of `opts` only `as_host` and `stream`
    /// apply (the legacy struct has no version or flags).
    pub fn to_dlpack_legacy_with(&self, opts: ExportOptions) -> Result<ManagedTensor<DLManagedTensor>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let managed = DLManagedTensor {
            dl_tensor: describe(self, false, &mut [], &mut []),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        Ok(export(self, managed, opts))
    }
}

/// The storage behind `managed` when it is one of this copy of devtensor's
/// own versioned exports (our deleter, and `manager_ctx` pointing at the
/// struct itself, as [`export`] leaves them), which a re-import then shares:
/// the same lock and stream records, no foreign owner. `None` for any other
/// producer's, another copy of devtensor's included.
///
/// # Safety
///
/// `managed` points to a readable struct whose deleter has not run.
pub(super) unsafe fn own_storage_versioned(managed: *mut DLManagedTensorVersioned) -> Option<Arc<Storage>> {
    type Deleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);
    // SAFETY: readable, by the caller's contract.
    let (deleter, ctx) = unsafe { ((*managed).deleter, (*managed).manager_ctx) };
    let ours = deleter.is_some_and(|d| std::ptr::fn_addr_eq(d, delete_versioned as Deleter));
    // SAFETY: forwarded.
    unsafe { storage_if_ours(managed, ours && ctx == managed.cast::<c_void>()) }
}

/// As [`own_storage_versioned`], for the legacy struct.
///
/// # Safety
///
/// As [`own_storage_versioned`].
pub(super) unsafe fn own_storage_legacy(managed: *mut DLManagedTensor) -> Option<Arc<Storage>> {
    type Deleter = unsafe extern "C" fn(*mut DLManagedTensor);
    // SAFETY: readable, by the caller's contract.
    let (deleter, ctx) = unsafe { ((*managed).deleter, (*managed).manager_ctx) };
    let ours = deleter.is_some_and(|d| std::ptr::fn_addr_eq(d, delete_legacy as Deleter));
    // SAFETY: forwarded.
    unsafe { storage_if_ours(managed, ours && ctx == managed.cast::<c_void>()) }
}

/// # Safety
///
/// With `ours`, `managed` is the start of a live `Exported<M>` block: only
/// [`export`] pairs our deleter with a `manager_ctx` that points at the struct.
unsafe fn storage_if_ours<M>(managed: *mut M, ours: bool) -> Option<Arc<Storage>> {
    // SAFETY: the caller's contract.
    ours.then(|| Arc::clone(unsafe { &(*managed.cast::<Exported<M>>())._storage }))
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: the DLPack contract: the deleter is called once with the pointer we
    // handed out, which is the start of a Box<Exported<DLManagedTensorVersioned>>.
    let export = unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensorVersioned>>()) };
    drop_without_unwinding(export);
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for the legacy block.
    let export = unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensor>>()) };
    drop_without_unwinding(export);
}

/// Drops an export inside its `extern "C"` deleter. Dropping the last view
/// frees the memory through its allocator, which may be the caller's own
/// [`NDAlloc`](crate::NDAlloc); a panic there must not reach the C caller (since Rust 1.81
/// it would abort the process): it is reported on stderr by the panic hook,
/// and the export counts as freed, its memory kept by the allocator that failed.
fn drop_without_unwinding<M>(export: Box<Exported<M>>) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(export))) {
        std::mem::forget(payload); // its own Drop could panic too
    }
    LIVE_EXPORTS.fetch_sub(1, Ordering::Relaxed);
}
