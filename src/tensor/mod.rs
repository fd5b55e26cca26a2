//! [`Tensor`]: shared storage + dtype + shape + strides + byte offset.
//!
//! Views (slice, select, permute, expand, flip, reshape when strides allow)
//! share storage and move no data; `contiguous`, `copy_from` and `fill` run the
//! strided copy engine.

mod access;
mod device_copy;
mod storage;

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use storage::AllocRef;
pub use storage::Storage;

use crate::alloc::NDAlloc;
use crate::backend::for_device;
use crate::backend::gpu_runtime::{GpuRuntime, GpuStream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Shape, Strides};
use crate::stream::StreamHandle;

/// A Rust scalar type that maps to one [`DType`]. Sealed: `to_vec`,
/// `from_slice` and `fill` move an element's bytes as `T`, which is sound only
/// for plain scalars of exactly the dtype's size (a reference or a larger
/// struct claiming `U8` would read or write out of bounds).
///
/// ```compile_fail
/// struct Big([u8; 64]);
/// impl devtensor::Element for Big {
///     const DTYPE: devtensor::DType = devtensor::DType::U8;
/// }
/// ```
pub trait Element: sealed::Scalar + Copy + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
}

mod sealed {
    /// Implemented for the element types below only.
    pub trait Scalar {}
}

macro_rules! elements {
    ($($t:ty => $d:ident),*) => { $(
        impl sealed::Scalar for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )* };
}
elements!(bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
          u32 => U32, u64 => U64, f32 => F32, f64 => F64);

/// An n-dimensional strided view of a [`Storage`].
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Shape,
    strides: Strides,
    /// Bytes from the storage start to element `[0, 0, ..]`.
    offset: usize,
    read_only: bool,
}

impl Clone for Tensor {
    /// Another view of the same storage. By hand: `SmallVec`'s own `clone`
    /// pushes element by element, and a view's Python object pays for it.
    fn clone(&self) -> Tensor {
        Tensor {
            storage: Arc::clone(&self.storage),
            dtype: self.dtype,
            shape: Shape::from_slice(&self.shape),
            strides: Strides::from_slice(&self.strides),
            offset: self.offset,
            read_only: self.read_only,
        }
    }
}

impl Tensor {
    // ----- construction -------------------------------------------------------------

    /// Uninitialised tensor on `device`, C-contiguous, from the device's default allocator.
    pub fn empty(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::empty_with(AllocRef::for_device(device)?, shape, dtype, false)
    }

    /// Uninitialised C-contiguous tensor from a given allocator.
    pub fn empty_in(alloc: Arc<dyn NDAlloc>, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::empty_with(alloc.into(), shape, dtype, false)
    }

    /// [`Tensor::empty_in`]; `for_zeros`: the tensor is about to be
    /// zero-filled ([`Storage::new_for_zeros`]).
    #[inline(always)]
    fn empty_with(alloc: AllocRef, shape: &[usize], dtype: DType, for_zeros: bool) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        let bytes = layout::nbytes(shape, dtype.size())?;
        // Device memory is ordered on the thread's current stream of its GPU
        // (`torch.cuda.stream(s)`), when one is set; the default stream otherwise.
        let stream = match alloc.device() {
            d @ Device::Cuda(_) => crate::stream::current_stream(d),
            _ => None,
        };
        let storage = if for_zeros {
            Storage::new_for_zeros(alloc, bytes, stream)?
        } else {
            Storage::new_in(alloc, bytes, stream)?
        };
        let storage = Arc::new(storage);
        Ok(Tensor {
            storage,
            dtype,
            shape: Shape::from_slice(shape),
            strides: layout::contiguous_strides(shape)?,
            offset: 0,
            read_only: false,
        })
    }

    /// Zero-filled tensor.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_bytes(shape, dtype, device, &vec![0u8; dtype.size()])
    }

    /// A new tensor with every element's bytes `value` (`dtype.size()` bytes).
    /// Zero bytes into memory that already reads as zeros (a fresh mapping of
    /// a large CPU block, which zeros take rather than a freed block kept for
    /// reuse) are not written: the pages stay unfaulted until used, as
    /// NumPy's `zeros` leaves them (4096² f32: 4 ms → µs).
    pub fn full_bytes(shape: &[usize], dtype: DType, device: Device, value: &[u8]) -> Result<Tensor> {
        let zeros = value.iter().all(|&b| b == 0) && value.len() == dtype.size();
        let t = Tensor::empty_with(AllocRef::for_device(device)?, shape, dtype, zeros)?;
        if !(zeros && t.storage.fresh_zeros()) {
            t.fill_bytes_impl(value, false)?;
        }
        Ok(t)
    }

    /// Tensor filled with `value`.
    pub fn full<T: Element>(shape: &[usize], value: T, device: Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, T::DTYPE, device)?;
        t.fill(value)?;
        Ok(t)
    }

    /// CPU tensor holding a copy of `data`, C-contiguous with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        if layout::numel(shape)? != data.len() {
            return Err(Error::ShapeMismatch {
                op: "from_slice",
                expected: shape.to_vec(),
                got: vec![data.len()],
            });
        }
        let t = Tensor::empty(shape, T::DTYPE, Device::Cpu)?;
        // SAFETY: `t` is a fresh contiguous allocation of exactly `size_of_val(data)`
        // bytes that nothing else references; `data` is a valid slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), t.data_ptr(), std::mem::size_of_val(data));
        }
        Ok(t)
    }

    /// Assembles a tensor from parts (used by DLPack import). The caller has
    /// checked that every element lies inside `storage`.
    pub(crate) fn from_parts(
        storage: Arc<Storage>,
        dtype: DType,
        shape: Shape,
        strides: Strides,
        offset: usize,
        read_only: bool,
    ) -> Tensor {
        Tensor {
            storage,
            dtype,
            shape,
            strides,
            offset,
            read_only,
        }
    }

    // ----- metadata -----------------------------------------------------------------

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Sizes.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements. Zero when a dimension is, whatever the others: the
    /// product of an empty view's sizes, reordered (`transpose`), may overflow
    /// before it reaches the zero.
    pub fn numel(&self) -> usize {
        if self.shape.contains(&0) {
            0
        } else {
            self.shape.iter().product()
        }
    }

    /// Bytes of element data (`numel * itemsize`), not of the storage. Never
    /// overflows: every way to a tensor checks it ([`layout::nbytes`]), the
    /// broadcast views of [`expand`](Self::expand) and
    /// [`as_strided`](Self::as_strided) included.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// Bytes from the storage start to element `[0, 0, ..]`.
    pub fn byte_offset(&self) -> usize {
        self.offset
    }

    /// The shared storage.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Address of element `[0, 0, ..]`.
    pub fn data_ptr(&self) -> *mut u8 {
        self.storage.as_ptr().wrapping_add(self.offset)
    }

    /// True when writes are refused (an imported READ_ONLY DLPack tensor and its views).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// True when C-contiguous (size-1 dims ignored, empty tensors contiguous).
    pub fn is_contiguous(&self) -> bool {
        layout::is_contiguous(&self.shape, &self.strides)
    }

    // ----- views --------------------------------------------------------------------

    fn with_layout(&self, shape: Shape, strides: Strides, offset: usize) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape,
            strides,
            offset,
            read_only: self.read_only,
        }
    }

    /// Moves the view's start by `elems` elements of stride `stride` (may be
    /// negative). A view of no element addresses no memory: its start stays
    /// (an imported empty view's negative stride would step before its
    /// storage's first byte, and `empty((2**62, 0))[-1]` past `isize`).
    fn shifted(&self, elems: usize, stride: isize) -> Result<usize> {
        if self.shape.contains(&0) {
            return Ok(self.offset);
        }
        let ovf = || Error::Overflow { what: "view offset" };
        let delta = (elems as isize)
            .checked_mul(stride)
            .and_then(|x| x.checked_mul(self.dtype.size() as isize))
            .ok_or_else(ovf)?;
        self.offset.checked_add_signed(delta).ok_or_else(ovf)
    }

    /// `self[.., start:stop:step, ..]` along `dim`, with Python's rules
    /// (negative indices count from the end, a negative step walks backwards).
    pub fn slice(&self, dim: isize, start: Option<isize>, stop: Option<isize>, step: isize) -> Result<Tensor> {
        let d = layout::normalize_dim(dim, self.ndim())?;
        let (first, len) = layout::slice_indices(self.shape[d], start, stop, step)?;
        let offset = if len == 0 {
            self.offset
        } else {
            self.shifted(first, self.strides[d])?
        };
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape[d] = len;
        // A kept element or none: the stride steps nothing, and a huge step
        // (`[::2**62]` of a matrix's rows) leaves it as it is where the
        // product overflows.
        strides[d] = self.strides[d]
            .checked_mul(step)
            .or((len <= 1).then_some(self.strides[d]))
            .ok_or(Error::Overflow { what: "slice stride" })?;
        Ok(self.with_layout(shape, strides, offset))
    }

    /// `self[.., index, ..]`: drops dimension `dim`.
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let d = layout::normalize_dim(dim, self.ndim())?;
        let size = self.shape[d];
        let i = if index < 0 { index + size as isize } else { index };
        if !(0..size as isize).contains(&i) {
            return Err(Error::IndexOutOfRange { index, dim: d, size });
        }
        let offset = self.shifted(i as usize, self.strides[d])?;
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape.remove(d);
        strides.remove(d);
        Ok(self.with_layout(shape, strides, offset))
    }

    /// Reorders dimensions: result dim `i` is input dim `dims[i]`.
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        if dims.len() != self.ndim() {
            return Err(Error::InvalidLayout("permute needs one entry per dimension"));
        }
        let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, dims.len());
        let mut shape = Shape::new();
        let mut strides = Strides::new();
        for &dim in dims {
            let d = layout::normalize_dim(dim, self.ndim())?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::InvalidLayout("permute dimensions repeat"));
            }
            shape.push(self.shape[d]);
            strides.push(self.strides[d]);
        }
        Ok(self.with_layout(shape, strides, self.offset))
    }

    /// A view with explicit `shape`, `strides` (elements) and `offset`
    /// (elements from the start of the storage), as torch's `as_strided`;
    /// `Err` when any element would fall outside the storage.
    pub fn as_strided(&self, shape: &[usize], strides: &[isize], offset: usize) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        let e = self.dtype.size();
        layout::nbytes(shape, e)?;
        let start = offset.checked_mul(e).ok_or(Error::Overflow { what: "view offset" })?;
        let range = layout::byte_range(shape, strides, e)?;
        if !layout::range_fits(start, range, self.storage.len()) {
            return Err(Error::InvalidLayout(if range.is_some() {
                "as_strided view reaches outside the storage"
            } else {
                "as_strided offset is outside the storage"
            }));
        }
        Ok(self.with_layout(shape.into(), strides.into(), start))
    }

    /// Inserts a size-1 dimension at `dim` (`-ndim-1 ..= ndim`).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        layout::check_ndim(self.ndim() + 1)?;
        let d = layout::normalize_dim(dim, self.ndim() + 1)?;
        // The stride of a size-1 dim is never used to address; pick torch's choice.
        let stride = if d < self.ndim() {
            (self.shape[d] as isize).saturating_mul(self.strides[d])
        } else {
            1
        };
        let mut t = self.clone();
        t.shape.insert(d, 1);
        t.strides.insert(d, stride);
        Ok(t)
    }

    /// Swaps two dimensions.
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<Tensor> {
        let a = layout::normalize_dim(dim0, self.ndim())?;
        let b = layout::normalize_dim(dim1, self.ndim())?;
        let mut t = self.clone();
        t.shape.swap(a, b);
        t.strides.swap(a, b);
        Ok(t)
    }

    /// Reverses the order of elements along each of `dims` (negative strides, no copy).
    pub fn flip(&self, dims: &[isize]) -> Result<Tensor> {
        let mut t = self.clone();
        for &dim in dims {
            let d = layout::normalize_dim(dim, self.ndim())?;
            if t.shape[d] > 1 {
                t.offset = t.shifted(t.shape[d] - 1, t.strides[d])?;
            }
            // A size-0 or size-1 dim's stride addresses nothing and may be any
            // value (an imported `i64::MIN`): negated modulo 2^64.
            t.strides[d] = if t.shape[d] > 1 {
                t.strides[d]
                    .checked_neg()
                    .ok_or(Error::Overflow { what: "flipped stride" })?
            } else {
                t.strides[d].wrapping_neg()
            };
        }
        Ok(t)
    }

    /// Broadcasts to `shape` (stride 0 on expanded dims; `-1` keeps a size;
    /// new leading dims allowed), as torch's `expand`.
    pub fn expand(&self, shape: &[isize]) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        if shape.len() < self.ndim() {
            return Err(Error::InvalidLayout("expand cannot remove dimensions"));
        }
        let lead = shape.len() - self.ndim();
        let mut out_shape = Shape::new();
        let mut out_strides = Strides::new();
        for (i, &want) in shape.iter().enumerate() {
            let (have, stride) = if i < lead {
                (1, 0)
            } else {
                (self.shape[i - lead], self.strides[i - lead])
            };
            let size = match want {
                -1 if i >= lead => have,
                w if w < 0 => return Err(Error::InvalidLayout("expand sizes must be non-negative or -1")),
                w => w as usize,
            };
            if size == have {
                out_shape.push(size);
                out_strides.push(if have == 1 { 0 } else { stride });
            } else if have == 1 {
                out_shape.push(size);
                out_strides.push(0);
            } else {
                return Err(Error::ShapeMismatch {
                    op: "expand",
                    expected: self.shape.to_vec(),
                    got: shape.iter().map(|&s| s.max(0) as usize).collect(),
                });
            }
        }
        layout::nbytes(&out_shape, self.dtype.size())?;
        Ok(self.with_layout(out_shape, out_strides, self.offset))
    }

    /// A view with `shape` (one `-1` inferred) when the strides allow it, else
    /// `Err(InvalidLayout)` (torch's `view`).
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        let new_shape = layout::infer_shape(shape, self.numel())?;
        let strides = layout::view_strides(&self.shape, &self.strides, &new_shape).ok_or(Error::InvalidLayout(
            "view is not possible with these strides: use reshape",
        ))?;
        Ok(self.with_layout(new_shape, strides, self.offset))
    }

    /// A view with `shape` when possible, otherwise a contiguous copy (torch's `reshape`).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        let numel = self.numel();
        let new_shape = layout::infer_shape(shape, numel)?;
        if numel == 0 {
            // No element to address: a view whatever the layout, as torch's
            // `computeStride` gives for empty tensors.
            let strides = layout::contiguous_strides(&new_shape)?;
            return Ok(self.with_layout(new_shape, strides, self.offset));
        }
        match layout::view_strides(&self.shape, &self.strides, &new_shape) {
            Some(strides) => Ok(self.with_layout(new_shape, strides, self.offset)),
            None => {
                let mut c = self.contiguous_copy()?;
                c.strides = layout::contiguous_strides(&new_shape)?;
                c.shape = new_shape;
                Ok(c)
            }
        }
    }

    // ----- data movement ------------------------------------------------------------

    /// `self` when already C-contiguous, else a C-contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            Ok(self.clone())
        } else {
            self.contiguous_copy()
        }
    }

    /// A fresh, writable, C-contiguous copy on the same device.
    pub fn contiguous_copy(&self) -> Result<Tensor> {
        let out = Tensor::empty(&self.shape, self.dtype, self.device())?;
        // A fresh, writable tensor of the same shape and dtype: no checks.
        out.copy_matching(self, false)?;
        Ok(out)
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only { Err(Error::ReadOnly) } else { Ok(()) }
    }

    /// Copies `src` into `self` element by element (bitwise). Shapes and dtypes
    /// must match; any layouts work, including overlapping source and destination.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        self.copy_from_impl(src, true)
    }

    /// [`copy_from`](Self::copy_from); `lock_dst: false` for a destination
    /// no other tensor can reach yet (a fresh allocation), which then needs
    /// no lock: small copies pay for every atomic operation.
    fn copy_from_impl(&self, src: &Tensor, lock_dst: bool) -> Result<()> {
        self.check_writable()?;
        if self.shape != src.shape {
            return Err(Error::ShapeMismatch {
                op: "copy_from",
                expected: self.shape.to_vec(),
                got: src.shape.to_vec(),
            });
        }
        if self.dtype != src.dtype {
            return Err(Error::DTypeMismatch {
                op: "copy_from",
                expected: self.dtype,
                got: src.dtype,
            });
        }
        self.copy_matching(src, lock_dst)
    }

    /// [`copy_from_impl`](Self::copy_from_impl) once `self` is known to be
    /// writable and of `src`'s shape and dtype.
    fn copy_matching(&self, src: &Tensor, lock_dst: bool) -> Result<()> {
        let _access = access::lock(lock_dst.then_some(&*self.storage), Some(&src.storage));
        if !(self.device().is_host_accessible() && src.device().is_host_accessible()) {
            return copy_on_device(self, src);
        }
        self.wait_for_host_access()?;
        src.wait_for_host_access()?;
        // SAFETY: both views lie inside their storages (every view constructor
        // keeps them in bounds), both are host-accessible, `self` is writable,
        // no other safe call touches either storage while `_access` holds them
        // (see `access`; an unlocked destination is reachable from no other
        // tensor), and the engine copies through a temporary when the ranges
        // overlap.
        unsafe {
            crate::copy::copy_strided(
                self.data_ptr(),
                &self.strides,
                src.data_ptr(),
                &src.strides,
                &self.shape,
                self.dtype.size(),
            )
        }
    }

    /// Enqueues a copy of `src` into `self` on `stream`, a stream of the GPU
    /// both tensors live on (device or managed memory), without waiting: the
    /// host may not read the result before the stream's work is done. Both
    /// storages record the stream, so their memory is not reused elsewhere
    /// before that work is done.
    pub fn copy_from_on_stream(&self, src: &Tensor, stream: StreamHandle) -> Result<()> {
        let Some(ordinal) = self.device().ordinal() else {
            return Err(Error::UnsupportedDevice {
                op: "copy on a stream",
                device: self.device(),
            });
        };
        let stream = GpuStream {
            ordinal,
            handle: stream,
        };
        let _access = access::lock(Some(&self.storage), Some(&src.storage));
        device_copy::copy_on_stream(gpu_of(self.device(), "copy on a stream")?, self, src, &stream)
    }

    /// This tensor on `device`: itself when already there, else a C-contiguous copy.
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let out = Tensor::empty(&self.shape, self.dtype, device)?;
        out.copy_from(self)?;
        Ok(out)
    }

    /// Writes the raw element `value` (`itemsize` bytes) to every element.
    pub fn fill_bytes(&self, value: &[u8]) -> Result<()> {
        self.fill_bytes_impl(value, true)
    }

    /// [`fill_bytes`](Self::fill_bytes); `lock: false` for a tensor no other
    /// one can reach yet (a fresh allocation), which then needs no lock
    /// (`zeros((1024,))` pays for every atomic operation).
    fn fill_bytes_impl(&self, value: &[u8], lock: bool) -> Result<()> {
        self.check_writable()?;
        if value.len() != self.dtype.size() {
            return Err(Error::InvalidArgument {
                op: "fill",
                reason: "the value's size differs from the element size".into(),
            });
        }
        let _access = lock.then(|| access::lock(Some(&self.storage), None));
        // A dim of stride 0 (an `expand`ed view) names one element however
        // long: filled once, as torch's `fill_` fills it, where a copy into it
        // is refused (its elements would get different values). Other
        // self-overlapping views stay refused.
        let once;
        let target = if self.shape.iter().zip(&self.strides).any(|(&n, &s)| s == 0 && n > 1) {
            let shape: Shape = self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| if s == 0 { n.min(1) } else { n })
                .collect();
            once = Tensor { shape, ..self.clone() };
            &once
        } else {
            self
        };
        if !target.device().is_host_accessible() {
            return fill_on_device(target, value);
        }
        target.wait_for_host_access()?;
        // SAFETY: the view lies inside its storage (`target` reaches a subset
        // of `self`'s elements), is host-accessible and writable, and no other
        // safe call touches the storage while `_access` holds it (or, unlocked,
        // while it is fresh: nothing else reaches it).
        unsafe { crate::copy::fill_strided(target.data_ptr(), &target.strides, &target.shape, value) }
    }

    /// Writes `value` to every element; its type must match the dtype.
    pub fn fill<T: Element>(&self, value: T) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "fill",
                expected: self.dtype,
                got: T::DTYPE,
            });
        }
        // SAFETY: `T` is a plain scalar (Element is only implemented for them), so
        // its bytes may be read.
        let bytes = unsafe { std::slice::from_raw_parts((&raw const value).cast::<u8>(), size_of::<T>()) };
        self.fill_bytes(bytes)
    }

    /// Waits, where the host is about to touch this tensor's memory in
    /// place, for the GPU work that may still use it: every stream recorded
    /// on a managed storage (a consumer's writes on its own stream included),
    /// as the host reads of the Python package do. Other memory is not
    /// waited for: devtensor's own work on host-visible memory is done when
    /// its calls return, pinned memory is host memory whose host reads do
    /// not wait for streams (as torch's do not), and device memory is not
    /// touched by the host.
    pub fn wait_for_host_access(&self) -> Result<()> {
        match self.device() {
            d @ Device::CudaManaged(i) => for_device(d).synchronize_streams(i, &self.storage.streams()),
            _ => Ok(()),
        }
    }

    /// The elements in C order, copied out.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: self.dtype,
                got: T::DTYPE,
            });
        }
        if !self.device().is_host_accessible() {
            return self.to(Device::Cpu)?.to_vec();
        }
        let n = self.numel();
        let mut out: Vec<T> = host_buffer(n, self.dtype.size())?;
        // SAFETY: `out` has capacity for the `n` elements of `T` (the dtype's
        // size: `Element` is sealed to the dtypes' own types); after the copy
        // all of them are initialised, bools normalised to 0 / 1 first
        // (foreign bool bytes may be any value).
        unsafe {
            self.copy_out(out.as_mut_ptr().cast::<u8>())?;
            if self.dtype == DType::Bool {
                let bytes = std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), n);
                bytes.iter_mut().for_each(|b| *b = u8::from(*b != 0));
            }
            out.set_len(n);
        }
        Ok(out)
    }

    /// The elements' bytes in C order, copied out (as [`to_vec`](Self::to_vec)
    /// for any dtype; the Python package's pickles).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if !self.device().is_host_accessible() {
            return self.to(Device::Cpu)?.to_bytes();
        }
        let n = self.nbytes();
        let mut out: Vec<u8> = host_buffer(n, 1)?;
        // SAFETY: `out` has capacity for the view's `n` bytes; after the copy
        // all of them are initialised.
        unsafe {
            self.copy_out(out.as_mut_ptr())?;
            out.set_len(n);
        }
        Ok(out)
    }

    /// CPU tensor of `shape` and `dtype` holding a copy of `data`, its
    /// elements' bytes in C order ([`to_bytes`](Self::to_bytes)'s).
    pub fn from_bytes(data: &[u8], shape: &[usize], dtype: DType) -> Result<Tensor> {
        let want = layout::nbytes(shape, dtype.size())?;
        if data.len() != want {
            return Err(Error::ShapeMismatch {
                op: "from_bytes",
                expected: vec![want],
                got: vec![data.len()],
            });
        }
        let t = Tensor::empty(shape, dtype, Device::Cpu)?;
        // SAFETY: `t` is a fresh contiguous allocation of exactly `data.len()`
        // bytes that nothing else references.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), t.data_ptr(), data.len()) };
        Ok(t)
    }

    /// Copies this host-accessible view's elements, C-contiguously, to `dst`,
    /// under the storage's access lock and after the work host reads wait for.
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of [`nbytes`](Self::nbytes) bytes and
    /// overlaps no storage.
    unsafe fn copy_out(&self, dst: *mut u8) -> Result<()> {
        let strides = layout::contiguous_strides(&self.shape)?;
        let _access = access::lock(None, Some(&self.storage));
        self.wait_for_host_access()?;
        // SAFETY: `dst` holds the view's bytes (the caller's contract); the
        // source view lies inside its storage and is host-accessible, and no
        // safe call writes it while `_access` holds it.
        unsafe {
            crate::copy::copy_strided(
                dst,
                &strides,
                self.data_ptr(),
                &self.strides,
                &self.shape,
                self.dtype.size(),
            )
        }
    }
}

/// An empty vector with room for `n` items of `size` bytes; OutOfMemory (not
/// an abort) where the host cannot give it: a huge broadcast view.
fn host_buffer<T>(n: usize, size: usize) -> Result<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        device: Device::Cpu,
        requested: n.saturating_mul(size),
        reserved: 0,
        allocated: 0,
        largest_free: 0,
    })?;
    Ok(out)
}

/// Notes on `t`'s storage that the stream its backend's copies and fills run
/// on (the thread's current stream, else the default one; the host is not
/// synchronised for device memory) may use it: a foreign owner's deleter then
/// waits for that work instead of running while a copy still reads (see
/// `Storage::record_default_stream`). Host-accessible memory needs nothing:
/// the backend synchronises before returning.
fn note_work_stream(t: &Tensor) {
    let device = t.device();
    if device.is_host_accessible() {
        return;
    }
    let Some(stream) = for_device(device).work_stream(device) else {
        return;
    };
    if crate::stream::current_stream(device) == Some(stream) {
        t.storage.record_stream(stream); // a current stream: recorded as any other
    } else {
        t.storage.record_default_stream(stream);
    }
}

/// The GPU runtime of `device`'s backend; `Err` for memory no GPU runtime
/// of this build serves.
fn gpu_of(device: Device, op: &'static str) -> Result<&'static dyn GpuRuntime> {
    let backend = for_device(device);
    match backend.gpu() {
        Some(rt) => Ok(rt),
        None if backend.status().is_available() => Err(Error::UnsupportedDevice { op, device }),
        None => Err(backend.unavailable()),
    }
}

/// A copy where at least one side is not host memory: on the GPU runtime of
/// that side (the destination's when both are devices).
fn copy_on_device(dst: &Tensor, src: &Tensor) -> Result<()> {
    note_work_stream(dst);
    note_work_stream(src);
    let device = if dst.device() == Device::Cpu {
        src.device()
    } else {
        dst.device()
    };
    device_copy::copy_tensor(gpu_of(device, "copy")?, dst, src)
}

/// A fill of device memory, on its GPU runtime.
fn fill_on_device(dst: &Tensor, value: &[u8]) -> Result<()> {
    note_work_stream(dst);
    device_copy::fill_tensor(gpu_of(dst.device(), "fill")?, dst, value)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape.as_slice())
            .field("strides", &self.strides.as_slice())
            .field("offset", &self.offset)
            .field("device", &self.device())
            .field("read_only", &self.read_only)
            .finish()
    }
}
