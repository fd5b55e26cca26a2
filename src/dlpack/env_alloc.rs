//! [`EnvAlloc`]: memory from the framework that called us, through the
//! `managed_tensor_allocator` of its DLPack exchange API (TVM-FFI's "env
//! allocator"). Inside torch that is `torch.empty`: torch's caching allocator
//! on torch's current stream, so a kernel library's outputs count in
//! `torch.cuda.memory_stats` and are reused by torch like its own.

use std::ffi::{CStr, c_char, c_void};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::alloc::{AllocStats, Allocation, Counters, NDAlloc};
use crate::device::Device;
use crate::dlpack::ffi::{
    DLDataType, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLPackExchangeAPI, DLTensor, kDLUInt,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout;
use crate::stream::StreamHandle;
use crate::tensor::Tensor;

/// A framework's allocator for one device, from its `DLPackExchangeAPI`.
///
/// Two ways to use it:
/// - [`EnvAlloc::empty`]: a tensor exactly as the framework would make it
///   (`torch.empty(shape, dtype=..., device=...)`), wrapped without a copy; the
///   framework's deleter runs exactly once, when the last view drops.
/// - as an [`NDAlloc`] (`Tensor::empty_in(Arc::new(env), ..)`, or under a
///   [`CachingAlloc`](crate::alloc::CachingAlloc)): raw bytes, asked for as a 1-D
///   `uint8` tensor. Where the framework's block is less aligned than asked
///   (torch aligns CPU memory to 64 bytes, devtensor asks 256), the request is
///   made again `align - 1` bytes larger and the pointer rounded up.
///
/// Memory is ordered on the framework's current stream for the device at the
/// time of the call ([`EnvAlloc::current_stream`]); the `stream` argument of
/// [`NDAlloc::allocate`] cannot change that. Errors the framework reports
/// through `SetError` become [`Error::ForeignAlloc`] with its kind and message.
///
/// ```
/// use std::sync::Arc;
/// use devtensor::dlpack::EnvAlloc;
/// use devtensor::{DType, Device, Tensor};
///
/// // Any table will do; in a kernel library it comes from the calling
/// // framework (`devtensor::python::Framework::env_alloc`).
/// /// # Safety
/// /// `api` behaves as the DLPack header specifies (see [`EnvAlloc::new`]).
/// unsafe fn outputs(api: &'static devtensor::dlpack::ffi::DLPackExchangeAPI) -> devtensor::Result<()> {
///     // SAFETY: the caller's contract.
///     let env = unsafe { EnvAlloc::new(api, Device::Cpu)? };
///     let a = env.empty(&[4, 4], DType::F32)?; // the framework's own tensor
///     let b = Tensor::empty_in(Arc::new(env), &[16], DType::U8)?; // its bytes
///     assert_eq!((a.nbytes(), b.nbytes()), (64, 16));
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct EnvAlloc {
    api: ApiRef,
    device: Device,
    counters: Arc<Counters>,
}

/// The table: a static struct that lives as long as the process (DLPack
/// header), holding only function pointers and an immutable chain.
#[derive(Clone, Copy)]
struct ApiRef(&'static DLPackExchangeAPI);
// SAFETY: the table is immutable; the allocator and `current_work_stream` entry
// points may be called from any thread without the GIL (DLPack header).
unsafe impl Send for ApiRef {}
// SAFETY: as above.
unsafe impl Sync for ApiRef {}

impl fmt::Debug for EnvAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvAlloc")
            .field("api", &(self.api.0 as *const DLPackExchangeAPI))
            .field("device", &self.device)
            .finish()
    }
}

/// Collects the one `SetError` call of a failed allocation.
#[derive(Default)]
struct ErrorSlot {
    kind: Option<String>,
    message: Option<String>,
}

unsafe extern "C" fn set_error(ctx: *mut c_void, kind: *const c_char, message: *const c_char) {
    // No panic may unwind into the framework's C code.
    let _ = std::panic::catch_unwind(|| {
        let read = |p: *const c_char| {
            // SAFETY: the framework passes NUL-terminated strings valid for the call.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: `ctx` is the `ErrorSlot` `call_allocator` passed, alive for the call.
        if let Some(slot) = unsafe { ctx.cast::<ErrorSlot>().as_mut() } {
            slot.kind = read(kind);
            slot.message = read(message);
        }
    });
}

impl EnvAlloc {
    /// The allocator of `api` for `device`. `Err` when the table is not a
    /// DLPack 1.x exchange API or has no allocator.
    ///
    /// # Safety
    ///
    /// The table's entry points must behave as the DLPack header specifies:
    /// `managed_tensor_allocator` (and `current_work_stream`, where present)
    /// callable from any thread, and on success it must have written an owned,
    /// valid `DLManagedTensorVersioned` whose deleter frees it. The checks here
    /// (shape, dtype, device, size of what comes back) cannot catch a function
    /// that writes nothing or a dangling pointer.
    pub unsafe fn new(api: &'static DLPackExchangeAPI, device: Device) -> Result<EnvAlloc> {
        if api.header.version.major != 1 || api.managed_tensor_allocator.is_none() {
            return Err(Error::ForeignAlloc {
                kind: "ValueError".to_owned(),
                message: format!(
                    "the DLPack exchange API (version {}.{}) has no usable managed_tensor_allocator",
                    api.header.version.major, api.header.version.minor
                ),
            });
        }
        Ok(EnvAlloc {
            api: ApiRef(api),
            device,
            counters: Arc::new(Counters::new()),
        })
    }

    /// As [`EnvAlloc::new`], from a raw table pointer (a
    /// `"dlpack_exchange_api"` capsule's pointer).
    ///
    /// # Safety
    ///
    /// `api` must be null or point to a `DLPackExchangeAPI` that is never
    /// written and lives for the rest of the process (the DLPack header's
    /// rule for these tables), and that behaves as [`EnvAlloc::new`] requires.
    pub unsafe fn from_raw(api: *const DLPackExchangeAPI, device: Device) -> Result<EnvAlloc> {
        // SAFETY: the caller's contract.
        match unsafe { api.as_ref() } {
            // SAFETY: the caller's contract.
            Some(api) => unsafe { EnvAlloc::new(api, device) },
            None => Err(Error::ForeignAlloc {
                kind: "ValueError".to_owned(),
                message: "null DLPack exchange API".to_owned(),
            }),
        }
    }

    /// The table this allocator calls.
    pub fn api(&self) -> &'static DLPackExchangeAPI {
        self.api.0
    }

    /// The framework's current stream for the device, on which its memory is
    /// ordered: `None` for host memory (the function is not asked: torch
    /// without a GPU crashes in it), the legacy default stream (1) for a NULL
    /// answer on CUDA, the null stream (0) on ROCm.
    pub fn current_stream(&self) -> Result<Option<StreamHandle>> {
        current_work_stream(self.api.0, self.device)
    }

    /// Calls the framework's allocator for `prototype`; an owned tensor.
    fn call_allocator(&self, prototype: &mut DLTensor) -> Result<NonNull<DLManagedTensorVersioned>> {
        let alloc = self.api.0.managed_tensor_allocator.ok_or_else(|| Error::ForeignAlloc {
            kind: "ValueError".to_owned(),
            message: "no managed_tensor_allocator".to_owned(),
        })?;
        let mut slot = ErrorSlot::default();
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: `prototype` is a valid DLTensor whose shape array outlives the
        // call; `out` and `slot` are valid for the call; `set_error` matches the
        // SetError signature and only touches `slot`.
        let rc = unsafe { alloc(prototype, &mut out, (&raw mut slot).cast::<c_void>(), Some(set_error)) };
        match NonNull::new(out) {
            Some(m) if rc == 0 => Ok(m),
            Some(m) => {
                // A non-zero return yet a tensor: ours to free, once.
                // SAFETY: the framework handed over an owned managed tensor.
                unsafe { release(m) };
                Err(foreign_error(slot, rc))
            }
            None => Err(foreign_error(slot, rc)),
        }
    }

    fn prototype(&self, shape: &mut [i64], dtype: DLDataType) -> DLTensor {
        DLTensor {
            data: std::ptr::null_mut(),
            device: self.device.to_dlpack(),
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    /// A C-contiguous tensor made by the framework, as `torch.empty` would
    /// make it, wrapped without a copy; the framework's deleter runs exactly
    /// once, when the last view (or export) of it drops. `Err` when the
    /// framework refuses (its message), or answers with another shape, dtype,
    /// device or a non-contiguous layout (its tensor is freed first).
    pub fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        layout::check_ndim(shape.len())?;
        layout::nbytes(shape, dtype.size())?;
        let mut dims: Vec<i64> = shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| Error::Overflow { what: "shape" }))
            .collect::<Result<_>>()?;
        let mut proto = self.prototype(&mut dims, dtype.to_dlpack());
        let m = self.call_allocator(&mut proto)?;
        // SAFETY: an owned managed tensor from the framework; the import checks
        // every field and calls its deleter exactly once on every path.
        let t = unsafe { crate::dlpack::from_dlpack_versioned(m.as_ptr()) }?;
        if t.shape() != shape
            || t.dtype() != dtype
            || t.device() != self.device
            || !t.is_contiguous()
            || t.is_read_only()
        {
            return Err(Error::ForeignAlloc {
                kind: "ValueError".to_owned(),
                message: format!(
                    "asked for a writable contiguous {dtype} tensor of shape {shape:?} on {}, the allocator made {t:?} (read-only: {})",
                    self.device,
                    t.is_read_only()
                ),
            });
        }
        Ok(t)
    }

    /// One uint8 block of `bytes` from the framework, and its data address.
    fn bytes(&self, bytes: usize) -> Result<(NonNull<DLManagedTensorVersioned>, usize)> {
        let mut dims = [i64::try_from(bytes).map_err(|_| Error::Overflow {
            what: "allocation size",
        })?];
        let u8_type = DLDataType {
            code: kDLUInt,
            bits: 8,
            lanes: 1,
        };
        let mut proto = self.prototype(&mut dims, u8_type);
        let m = self.call_allocator(&mut proto)?;
        let check = || -> Result<usize> {
            // SAFETY: an owned managed tensor from the framework: its version
            // is readable, the rest (`flags` too) only with the 1.x layout.
            let major = unsafe { (*m.as_ptr()).version.major };
            if major != 1 {
                return Err(crate::DLPackError::UnsupportedVersion { major }.into());
            }
            // SAFETY: major version 1: the 1.x layout.
            let (flags, dl) = unsafe { ((*m.as_ptr()).flags, (*m.as_ptr()).dl_tensor) };
            let device = Device::from_dlpack(dl.device)?;
            if device != self.device {
                return Err(Error::DeviceMismatch {
                    expected: self.device,
                    got: device,
                });
            }
            // The block is written through the returned address: it must be
            // the `bytes` writable bytes asked for, whatever the framework's
            // allocator answered (a smaller or read-only tensor would be
            // overrun).
            // SAFETY: a 1.x descriptor from the framework: `shape` (and
            // `strides` when not NULL) hold `ndim` values.
            let (len, stride) = unsafe {
                match (dl.ndim, dl.shape.is_null()) {
                    (1, false) => (*dl.shape, if dl.strides.is_null() { 1 } else { *dl.strides }),
                    _ => (-1, 1),
                }
            };
            let dense =
                dl.dtype == u8_type && i64::try_from(bytes).is_ok_and(|b| b == len) && (stride == 1 || len == 1);
            if !dense || flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0 {
                return Err(Error::ForeignAlloc {
                    kind: "ValueError".to_owned(),
                    message: format!(
                        "asked for {bytes} writable uint8 bytes, the allocator made ndim {}, dtype {:?}, first size {len}, stride {stride}, flags {flags:#x}",
                        dl.ndim, dl.dtype
                    ),
                });
            }
            let addr = (dl.data as usize)
                .checked_add(usize::try_from(dl.byte_offset).map_err(|_| Error::Overflow { what: "byte_offset" })?)
                .ok_or(Error::Overflow { what: "byte_offset" })?;
            if addr == 0 {
                return Err(crate::DLPackError::NullData(bytes).into());
            }
            addr.checked_add(bytes).ok_or(Error::Overflow { what: "block end" })?;
            Ok(addr)
        };
        match check() {
            Ok(addr) => Ok((m, addr)),
            Err(e) => {
                // SAFETY: owned, not yet released.
                unsafe { release(m) };
                Err(e)
            }
        }
    }
}

/// Calls a managed tensor's deleter (once: the caller gives up the pointer).
///
/// # Safety
///
/// `m` is an owned managed tensor whose deleter has not run.
unsafe fn release(m: NonNull<DLManagedTensorVersioned>) {
    // SAFETY: the caller's contract.
    unsafe {
        if let Some(del) = (*m.as_ptr()).deleter {
            del(m.as_ptr());
        }
    }
}

fn foreign_error(slot: ErrorSlot, rc: i32) -> Error {
    Error::ForeignAlloc {
        kind: slot.kind.unwrap_or_else(|| "RuntimeError".to_owned()),
        message: slot
            .message
            .unwrap_or_else(|| format!("the allocator returned {rc} without a tensor")),
    }
}

/// `api.current_work_stream` for a GPU `device` (`None` for host memory).
pub(crate) fn current_work_stream(api: &DLPackExchangeAPI, device: Device) -> Result<Option<StreamHandle>> {
    let default = match device {
        Device::Cuda(_) | Device::CudaManaged(_) => StreamHandle::CUDA_LEGACY,
        Device::Rocm(_) => StreamHandle::ROCM_DEFAULT,
        _ => return Ok(None),
    };
    let Some(get) = api.current_work_stream else {
        return Ok(Some(default));
    };
    let dl = device.to_dlpack();
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the function takes plain integers.
    let rc = unsafe { get(dl.device_type, dl.device_id, &mut raw) };
    if rc != 0 {
        return Err(Error::ForeignAlloc {
            kind: "RuntimeError".to_owned(),
            message: format!("current_work_stream({device}) failed with {rc}"),
        });
    }
    Ok(Some(if raw.is_null() {
        default
    } else {
        // SAFETY: the framework's current stream of this device, live while
        // its work may use the memory (the exchange API's contract).
        unsafe { StreamHandle::from_raw(raw as usize) }
    }))
}

// SAFETY: `allocate` returns `ptr` inside a block of at least `size` bytes past
// it that the framework owns until `deallocate` calls its deleter (the token is
// the managed tensor), aligned to `align` (rounded up inside a larger block
// when the framework's was not); zero-size requests get a dangling aligned
// pointer that is never freed.
unsafe impl NDAlloc for EnvAlloc {
    fn device(&self) -> Device {
        self.device
    }

    fn allocate(&self, size: usize, align: usize, _stream: Option<StreamHandle>) -> Result<Allocation> {
        let align = align.max(1);
        if !align.is_power_of_two() {
            return Err(Error::InvalidArgument {
                op: "EnvAlloc::allocate",
                reason: "alignment must be a power of two".into(),
            });
        }
        if size == 0 {
            let ptr = NonNull::new(align as *mut u8).ok_or(Error::Overflow { what: "alignment" })?;
            return Ok(Allocation {
                ptr,
                size,
                align,
                token: 0,
            });
        }
        let (mut m, mut addr) = self.bytes(size)?;
        if addr % align != 0 {
            // Less aligned than asked: again, with room to round up.
            // SAFETY: owned and not yet released.
            unsafe { release(m) };
            let padded = size.checked_add(align - 1).ok_or(Error::Overflow {
                what: "allocation size",
            })?;
            (m, addr) = self.bytes(padded)?;
            // `bytes` checked `addr + padded` (the block's end) lies in the
            // address space, so this cannot overflow it.
            addr = addr.next_multiple_of(align);
        }
        self.counters.on_alloc(size);
        Ok(Allocation {
            // SAFETY: `addr` is non-zero (checked in `bytes`) and only rounded up.
            ptr: unsafe { NonNull::new_unchecked(addr as *mut u8) },
            size,
            align,
            token: m.as_ptr() as usize,
        })
    }

    unsafe fn deallocate(&self, a: Allocation, _stream: Option<StreamHandle>) {
        if let Some(m) = NonNull::new(a.token as *mut DLManagedTensorVersioned) {
            // SAFETY: the token is the owned managed tensor `allocate` kept;
            // the caller frees each allocation once.
            unsafe { release(m) };
            self.counters.on_free(a.size);
        }
    }

    fn stats(&self) -> AllocStats {
        self.counters.stats()
    }
}

#[cfg(test)]
mod tests {
    //! A C framework's allocator, as a foreign library would write it: 64-byte
    //! aligned host blocks and a counting deleter, or a refusal through SetError.

    use super::*;
    use crate::dlpack::ffi::{DLPackExchangeAPIHeader, DLPackManagedTensorAllocator, DLPackSetError, DLPackVersion};
    use std::alloc::Layout;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static MADE: AtomicUsize = AtomicUsize::new(0);
    static FREED: AtomicUsize = AtomicUsize::new(0);

    #[repr(C)]
    struct Block {
        managed: DLManagedTensorVersioned,
        shape: Vec<i64>,
        strides: Vec<i64>,
        layout: Layout,
    }

    unsafe extern "C" fn delete(m: *mut DLManagedTensorVersioned) {
        // SAFETY: `m` is the first field of a boxed Block made by `alloc`.
        let b = unsafe { Box::from_raw(m.cast::<Block>()) };
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(b.managed.dl_tensor.data.cast(), b.layout) };
        FREED.fetch_add(1, Ordering::SeqCst);
    }

    unsafe extern "C" fn alloc(
        proto: *mut DLTensor,
        out: *mut *mut DLManagedTensorVersioned,
        ctx: *mut c_void,
        set: DLPackSetError,
    ) -> i32 {
        // SAFETY: the caller's prototype is readable, its shape `ndim` long.
        let (p, shape) = unsafe {
            let p = *proto;
            let shape: Vec<i64> = std::slice::from_raw_parts(p.shape, p.ndim as usize).to_vec();
            (p, shape)
        };
        let bytes = shape.iter().product::<i64>() as usize * (p.dtype.bits as usize / 8);
        if bytes > 1 << 30 {
            let set = set.unwrap();
            // SAFETY: static C strings.
            unsafe { set(ctx, c"MemoryError".as_ptr(), c"test framework: out of memory".as_ptr()) };
            return -1;
        }
        let layout = Layout::from_size_align(bytes.max(1) + 64, 256).unwrap();
        // SAFETY: non-zero size. The data starts 64 bytes in: never 256-aligned.
        let data = unsafe { std::alloc::alloc(layout) };
        let mut strides = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let mut b = Box::new(Block {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 3 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete),
                flags: 0,
                // Always host memory, whatever was asked: a wrong answer to refuse.
                dl_tensor: DLTensor {
                    data: data.cast(),
                    byte_offset: 64,
                    device: Device::Cpu.to_dlpack(),
                    ..p
                },
            },
            shape,
            strides,
            layout,
        });
        b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
        b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
        MADE.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `out` is valid; the Box's first field is the managed struct.
        unsafe { *out = Box::into_raw(b).cast() };
        0
    }

    /// How [`alloc_lying`] answers: 1 with 16 bytes whatever was asked, 2
    /// with the bytes asked flagged read-only, 3 with them at a stride of 2.
    static LIE: AtomicUsize = AtomicUsize::new(0);

    /// [`alloc`] with a wrong answer of the kind [`LIE`] names.
    unsafe extern "C" fn alloc_lying(
        proto: *mut DLTensor,
        out: *mut *mut DLManagedTensorVersioned,
        ctx: *mut c_void,
        set: DLPackSetError,
    ) -> i32 {
        let lie = LIE.load(Ordering::SeqCst);
        let mut sixteen = 16i64;
        // SAFETY: the caller's prototype, readable for the call (its shape is
        // replaced below by one that lives as long).
        let mut p = unsafe { *proto };
        if lie == 1 {
            p.shape = &mut sixteen;
        }
        // SAFETY: forwarded, with a valid prototype.
        let rc = unsafe { alloc(&mut p, out, ctx, set) };
        // SAFETY: `alloc` succeeded: `*out` is its Block, whose strides
        // array holds `ndim` values.
        unsafe {
            match lie {
                2 => (**out).flags |= DLPACK_FLAG_BITMASK_READ_ONLY,
                3 => *(**out).dl_tensor.strides = 2,
                _ => {}
            }
        }
        rc
    }

    /// A table offering only an allocator, as a framework's would.
    const fn table(alloc: DLPackManagedTensorAllocator) -> ApiTable {
        ApiTable(DLPackExchangeAPI {
            header: DLPackExchangeAPIHeader {
                version: DLPackVersion { major: 1, minor: 3 },
                prev_api: std::ptr::null_mut(),
            },
            managed_tensor_allocator: alloc,
            managed_tensor_from_py_object_no_sync: None,
            managed_tensor_to_py_object_no_sync: None,
            dltensor_from_py_object_no_sync: None,
            current_work_stream: None,
        })
    }
    static API: ApiTable = table(Some(alloc));
    static LYING_API: ApiTable = table(Some(alloc_lying));
    struct ApiTable(DLPackExchangeAPI);
    // SAFETY: immutable function pointers.
    unsafe impl Sync for ApiTable {}

    #[test]
    #[serial_test::serial(env_alloc)]
    fn every_block_is_aligned_and_freed_once() {
        let (made, freed) = (MADE.load(Ordering::SeqCst), FREED.load(Ordering::SeqCst));
        // SAFETY: the test table keeps the header's contract.
        let env = unsafe { EnvAlloc::new(&API.0, Device::Cpu) }.unwrap();
        {
            let t = Tensor::empty_in(Arc::new(env.clone()), &[3, 5], DType::F32).unwrap();
            assert_eq!(t.data_ptr() as usize % 256, 0);
            t.fill(2.5f32).unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.5; 15]);
            assert_eq!(env.stats().live_allocations, 1);
            let typed = env.empty(&[2, 7], DType::I64).unwrap();
            assert_eq!((typed.shape(), typed.dtype()), (&[2usize, 7][..], DType::I64));
            typed.fill(-1i64).unwrap();
            assert_eq!(typed.to_vec::<i64>().unwrap(), vec![-1; 14]);
            let empty = env.empty(&[0, 3], DType::F32).unwrap();
            assert_eq!(empty.numel(), 0);
        }
        assert_eq!(env.stats().live_allocations, 0);
        let made = MADE.load(Ordering::SeqCst) - made;
        assert!(made >= 3, "{made}");
        assert_eq!(
            FREED.load(Ordering::SeqCst) - freed,
            made,
            "every block freed exactly once"
        );
        assert_eq!(env.current_stream().unwrap(), None);
    }

    #[test]
    #[serial_test::serial(env_alloc)]
    fn set_error_becomes_foreign_alloc_and_nothing_leaks() {
        let (made, freed) = (MADE.load(Ordering::SeqCst), FREED.load(Ordering::SeqCst));
        // SAFETY: the test table keeps the header's contract.
        let env = unsafe { EnvAlloc::new(&API.0, Device::Cpu) }.unwrap();
        let check = |e: Error| match e {
            Error::ForeignAlloc { kind, message } => {
                assert_eq!(kind, "MemoryError");
                assert_eq!(message, "test framework: out of memory");
            }
            other => panic!("{other:?}"),
        };
        check(env.empty(&[1 << 29], DType::F32).unwrap_err());
        check(Tensor::empty_in(Arc::new(env.clone()), &[1 << 31], DType::U8).unwrap_err());
        // Wrong device: the framework's block is freed before the error returns.
        // SAFETY: as above.
        let gpu = unsafe { EnvAlloc::new(&API.0, Device::CudaHost) }.unwrap();
        let cpu_answer = gpu.allocate(64, 256, None).unwrap_err();
        assert!(matches!(cpu_answer, Error::DeviceMismatch { .. }), "{cpu_answer:?}");
        assert_eq!(MADE.load(Ordering::SeqCst) - made, FREED.load(Ordering::SeqCst) - freed);
    }

    #[test]
    #[serial_test::serial(env_alloc)]
    fn a_block_smaller_read_only_or_strided_is_refused_and_freed() {
        // Before the check, a 16-byte answer to 4096 bytes was taken as 4096
        // (valgrind: an invalid write past the block in `fill`).
        let (made, freed) = (MADE.load(Ordering::SeqCst), FREED.load(Ordering::SeqCst));
        // SAFETY: its allocator writes a valid tensor, only not the one asked for.
        let env = unsafe { EnvAlloc::new(&LYING_API.0, Device::Cpu) }.unwrap();
        for lie in 1..=3 {
            LIE.store(lie, Ordering::SeqCst);
            match Tensor::empty_in(Arc::new(env.clone()), &[4096], DType::U8) {
                Err(Error::ForeignAlloc { kind, message }) => {
                    assert_eq!(kind, "ValueError", "lie {lie}");
                    assert!(
                        message.contains("asked for 4096 writable uint8 bytes"),
                        "lie {lie}: {message}"
                    );
                }
                other => panic!("lie {lie}: {other:?}"),
            }
        }
        // `empty`, a typed tensor: a read-only one is refused too.
        LIE.store(2, Ordering::SeqCst);
        match env.empty(&[64], DType::U8) {
            Err(Error::ForeignAlloc { kind, message }) => {
                assert_eq!(kind, "ValueError");
                assert!(message.contains("read-only: true"), "{message}");
            }
            other => panic!("read-only empty: {other:?}"),
        }
        LIE.store(0, Ordering::SeqCst);
        let t = Tensor::empty_in(Arc::new(env.clone()), &[4096], DType::U8).unwrap();
        t.fill(7u8).unwrap();
        drop(t);
        assert_eq!(env.stats().live_allocations, 0);
        let made = MADE.load(Ordering::SeqCst) - made;
        assert!(made >= 4, "{made}");
        assert_eq!(
            FREED.load(Ordering::SeqCst) - freed,
            made,
            "every block freed exactly once"
        );
    }
}
