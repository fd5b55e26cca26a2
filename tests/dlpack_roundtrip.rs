//! DLPack export and import: every deleter runs exactly once, on every path.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use devtensor::dlpack::ffi::*;
use devtensor::dlpack::{ExportOptions, live_exports};
use devtensor::{CpuAlloc, DLPackError, DType, Device, Error, NDAlloc, Tensor};
use serial_test::serial;

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_slice(&(0..n as i32).collect::<Vec<_>>(), shape).unwrap()
}

fn cpu_live() -> usize {
    CpuAlloc.stats().live_allocations
}

#[test]
#[serial(counters)]
fn export_describes_the_view_and_frees_once() {
    let (allocs, exports) = (cpu_live(), live_exports());
    {
        let t = arange(&[3, 4])
            .transpose(0, 1)
            .unwrap()
            .slice(0, Some(1), None, 2)
            .unwrap();
        let m = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
        assert_eq!(live_exports(), exports + 1);
        drop(t); // the export keeps the storage alive
        // SAFETY: `m` is a live export; reading its descriptor is allowed.
        unsafe {
            let m = &*m;
            assert_eq!(m.version, DLPackVersion { major: 1, minor: 3 });
            assert_eq!(m.flags, 0);
            let dl = &m.dl_tensor;
            assert_eq!((dl.ndim, dl.byte_offset), (2, 0));
            assert_eq!(
                dl.device,
                DLDevice {
                    device_type: kDLCPU,
                    device_id: 0
                }
            );
            assert_eq!(
                dl.dtype,
                DLDataType {
                    code: kDLInt,
                    bits: 32,
                    lanes: 1
                }
            );
            assert_eq!(std::slice::from_raw_parts(dl.shape, 2), &[2, 3]);
            assert_eq!(std::slice::from_raw_parts(dl.strides, 2), &[2, 4]);
            // Element [1, 2] of the view is original [2*... ]: column 3, row 2 = 11.
            let p = dl.data.cast::<i32>();
            assert_eq!(*p, 1);
            assert_eq!(*p.offset(2 + 2 * 4), 11);
            (m.deleter.unwrap())(m as *const _ as *mut _);
        }
    }
    assert_eq!(live_exports(), exports);
    assert_eq!(cpu_live(), allocs);
}

#[test]
#[serial(counters)]
fn export_describes_every_rank_inline_and_on_the_heap() {
    // 0-d, up to 6 dims (shape and strides inline in the export block) and
    // beyond (a second allocation): both versions, freed once each.
    let exports = live_exports();
    for ndim in [0usize, 1, 5, 6, 7, 12] {
        let shape: Vec<usize> = (0..ndim).map(|i| 1 + i % 3).collect();
        let t = arange(&shape);
        let t = if ndim >= 2 {
            t.transpose(0, ndim as isize - 1).unwrap()
        } else {
            t
        };
        let want_shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let want_strides: Vec<i64> = t.strides().iter().map(|&s| s as i64).collect();
        let versioned = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
        let legacy = t.to_dlpack_legacy().unwrap().into_raw();
        drop(t);
        // SAFETY: live exports; each is read, then freed once.
        unsafe {
            for dl in [&(*versioned).dl_tensor, &(*legacy).dl_tensor] {
                assert_eq!(dl.ndim as usize, ndim);
                assert_eq!(std::slice::from_raw_parts(dl.shape, ndim), &want_shape[..]);
                assert_eq!(std::slice::from_raw_parts(dl.strides, ndim), &want_strides[..]);
            }
            ((*versioned).deleter.unwrap())(versioned);
            ((*legacy).deleter.unwrap())(legacy);
        }
    }
    assert_eq!(live_exports(), exports);
}

#[test]
#[serial(counters)]
fn round_trip_is_zero_copy_both_versions() {
    let (allocs, exports) = (cpu_live(), live_exports());
    {
        let t = arange(&[2, 5]).flip(&[1]).unwrap();
        // SAFETY: a fresh export, consumed once.
        let back =
            unsafe { devtensor::from_dlpack_versioned(t.to_dlpack_versioned(ExportOptions::default()).into_raw()) }
                .unwrap();
        assert_eq!(back.data_ptr(), t.data_ptr());
        assert_eq!(back.strides(), t.strides());
        // Our own export comes back as a view of the same storage (one lock,
        // one set of stream records), its struct freed at once.
        assert!(std::sync::Arc::ptr_eq(back.storage(), t.storage()));
        assert_eq!(live_exports(), exports);
        assert_eq!(back.to_vec::<i32>().unwrap(), t.to_vec::<i32>().unwrap());
        back.select(1, 0).unwrap().fill(42i32).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap()[0], 42);
        // SAFETY: as above, legacy struct.
        let legacy = unsafe { devtensor::from_dlpack_legacy(t.to_dlpack_legacy().unwrap().into_raw()) }.unwrap();
        assert_eq!(legacy.to_vec::<i32>().unwrap(), t.to_vec::<i32>().unwrap());
        assert!(std::sync::Arc::ptr_eq(legacy.storage(), t.storage()));
        assert_eq!(live_exports(), exports);
        // A struct whose context a consumer replaced is not taken for ours:
        // a foreign import, whose deleter runs when the tensor goes.
        let m = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
        // SAFETY: a live export; its deleter frees the block from `m` itself.
        let wrapped = unsafe {
            (*m).manager_ctx = std::ptr::null_mut();
            devtensor::from_dlpack_versioned(m)
        }
        .unwrap();
        assert!(!std::sync::Arc::ptr_eq(wrapped.storage(), t.storage()));
        assert_eq!(wrapped.data_ptr(), t.data_ptr());
        assert_eq!(live_exports(), exports + 1);
        drop(wrapped);
        assert_eq!(live_exports(), exports);
        // Ours, changed to reach past the tensor's memory (one row too many),
        // or to start before it: refused, and freed once.
        for (rows, back_by) in [(3, 0), (2, 4)] {
            let m = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
            // SAFETY: a live export whose shape array holds two writable entries.
            let e = unsafe {
                *(*m).dl_tensor.shape = rows;
                (*m).dl_tensor.data = (*m).dl_tensor.data.cast::<u8>().wrapping_sub(back_by).cast();
                devtensor::from_dlpack_versioned(m)
            }
            .unwrap_err();
            assert!(matches!(e, Error::DLPack(DLPackError::BadExtent(_))), "{e:?}");
            assert_eq!(live_exports(), exports);
        }
        // An empty view of ours comes back as one too.
        let empty = t.slice(1, Some(2), Some(2), 1).unwrap();
        // SAFETY: a fresh export, consumed once.
        let back =
            unsafe { devtensor::from_dlpack_versioned(empty.to_dlpack_versioned(ExportOptions::default()).into_raw()) }
                .unwrap();
        assert_eq!(back.shape(), &[2, 0]);
        assert!(std::sync::Arc::ptr_eq(back.storage(), t.storage()));
    }
    assert_eq!(live_exports(), exports);
    assert_eq!(cpu_live(), allocs);
}

#[test]
#[serial(counters)]
fn read_only_and_copied_flags() {
    let exports = live_exports();
    let t = arange(&[4]);
    let m = t
        .to_dlpack_versioned(ExportOptions {
            is_copied: true,
            minor_version: 1,
            as_host: false,
            stream: None,
        })
        .into_raw();
    // SAFETY: `m` is live; then consumed once.
    unsafe {
        assert_eq!((*m).flags, DLPACK_FLAG_BITMASK_IS_COPIED);
        assert_eq!((*m).version.minor, 1);
        (*m).flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    // SAFETY: consumed once.
    let ro = unsafe { devtensor::from_dlpack_versioned(m) }.unwrap();
    assert!(ro.is_read_only());
    assert!(matches!(ro.fill(1i32), Err(Error::ReadOnly)));
    assert!(matches!(
        ro.slice(0, None, None, -1).unwrap().copy_from(&t),
        Err(Error::ReadOnly)
    ));
    // A read-only tensor cannot travel in the legacy struct, and re-exports as read-only.
    assert!(matches!(ro.to_dlpack_legacy(), Err(Error::ReadOnly)));
    let again = ro.to_dlpack_versioned(ExportOptions::default()).into_raw();
    // SAFETY: live export, then freed once.
    unsafe {
        assert_eq!(
            (*again).flags & DLPACK_FLAG_BITMASK_READ_ONLY,
            DLPACK_FLAG_BITMASK_READ_ONLY
        );
        ((*again).deleter.unwrap())(again);
    }
    // A contiguous copy is writable.
    let w = ro.contiguous_copy().unwrap();
    w.fill(3i32).unwrap();
    drop((ro, w));
    assert_eq!(live_exports(), exports);
}

// ----- a foreign producer with a counting deleter ------------------------------------

static DELETED: AtomicUsize = AtomicUsize::new(0);

struct Foreign {
    managed: DLManagedTensorVersioned,
    data: Vec<f32>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn foreign_deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: `manager_ctx` is the Box<Foreign> leaked by `foreign`.
    drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Foreign>()) });
    DELETED.fetch_add(1, Ordering::SeqCst);
}

/// A producer-made tensor; `edit` corrupts the descriptor to test validation.
fn foreign(
    shape: &[i64],
    strides: Option<&[i64]>,
    edit: impl FnOnce(&mut DLManagedTensorVersioned),
) -> *mut DLManagedTensorVersioned {
    let n = shape.iter().product::<i64>().max(0) as usize;
    let mut f = Box::new(Foreign {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 3 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(foreign_deleter),
            flags: 0,
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device: DLDevice {
                    device_type: kDLCPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: DLDataType {
                    code: kDLFloat,
                    bits: 32,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        data: (0..n.max(16)).map(|i| i as f32).collect(),
        shape: shape.to_vec(),
        strides: strides.map(<[i64]>::to_vec).unwrap_or_default(),
    });
    f.managed.dl_tensor.data = f.data.as_mut_ptr().cast::<c_void>();
    f.managed.dl_tensor.shape = f.shape.as_mut_ptr();
    if strides.is_some() {
        f.managed.dl_tensor.strides = f.strides.as_mut_ptr();
    }
    edit(&mut f.managed);
    let raw = Box::into_raw(f);
    // SAFETY: `raw` is a valid unique pointer.
    unsafe {
        (*raw).managed.manager_ctx = raw.cast::<c_void>();
        &raw mut (*raw).managed
    }
}

#[test]
#[serial(counters)]
fn foreign_import_honours_strides_offsets_and_frees_once() {
    let before = DELETED.load(Ordering::SeqCst);
    // NULL strides: C-contiguous.
    // SAFETY: a well-formed producer tensor, consumed once.
    let t = unsafe { devtensor::from_dlpack_versioned(foreign(&[2, 3], None, |_| {})) }.unwrap();
    assert_eq!(t.strides(), &[3, 1]);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
    let view = t.transpose(0, 1).unwrap();
    drop(t);
    assert_eq!(
        DELETED.load(Ordering::SeqCst),
        before,
        "a live view keeps the producer's memory"
    );
    drop(view);
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);

    // byte_offset and negative strides: a reversed view starting at element 5.
    let m = foreign(&[3], Some(&[-2]), |m| m.dl_tensor.byte_offset = 5 * 4);
    // SAFETY: as above.
    let t = unsafe { devtensor::from_dlpack_versioned(m) }.unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![5., 3., 1.]);
    drop(t);
    // Empty tensors may have NULL data.
    let m = foreign(&[0, 4], None, |m| m.dl_tensor.data = std::ptr::null_mut());
    // SAFETY: as above.
    let t = unsafe { devtensor::from_dlpack_versioned(m) }.unwrap();
    assert_eq!((t.numel(), t.shape()), (0, &[0usize, 4][..]));
    drop(t);
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 3);
}

#[test]
#[serial(counters)]
fn invalid_descriptors_are_rejected_and_still_freed() {
    type Edit = fn(&mut DLManagedTensorVersioned);
    type Expect = fn(&Error) -> bool;
    let cases: Vec<(&str, Edit, Expect)> = vec![
        (
            "major 2",
            |m| m.version.major = 2,
            |e| matches!(e, Error::DLPack(DLPackError::UnsupportedVersion { major: 2 })),
        ),
        (
            "ndim -1",
            |m| m.dl_tensor.ndim = -1,
            |e| matches!(e, Error::DLPack(DLPackError::BadNdim(-1))),
        ),
        (
            "ndim 1000",
            |m| m.dl_tensor.ndim = 1000,
            |e| matches!(e, Error::DLPack(DLPackError::BadNdim(1000))),
        ),
        (
            "null shape",
            |m| m.dl_tensor.shape = std::ptr::null_mut(),
            |e| matches!(e, Error::DLPack(DLPackError::NullShape)),
        ),
        (
            "negative size",
            // SAFETY: `shape` points at the producer's live 2-element array.
            |m| unsafe { *m.dl_tensor.shape = -3 },
            |e| matches!(e, Error::DLPack(DLPackError::NegativeSize { .. })),
        ),
        (
            "vulkan",
            |m| m.dl_tensor.device.device_type = kDLVulkan,
            |e| matches!(e, Error::DLPack(DLPackError::UnsupportedDevice(7))),
        ),
        (
            "negative id",
            |m| m.dl_tensor.device.device_id = -1,
            |e| matches!(e, Error::DLPack(DLPackError::BadDeviceId(-1))),
        ),
        (
            "lanes 4",
            |m| m.dl_tensor.dtype.lanes = 4,
            |e| matches!(e, Error::UnsupportedDType { lanes: 4, .. }),
        ),
        (
            "bits 24",
            |m| m.dl_tensor.dtype.bits = 24,
            |e| matches!(e, Error::UnsupportedDType { bits: 24, .. }),
        ),
        (
            "code 99",
            |m| m.dl_tensor.dtype.code = 99,
            |e| matches!(e, Error::UnsupportedDType { code: 99, .. }),
        ),
        (
            "null data",
            |m| m.dl_tensor.data = std::ptr::null_mut(),
            |e| matches!(e, Error::DLPack(DLPackError::NullData(6))),
        ),
        (
            "huge stride",
            // SAFETY: `strides` points at the producer's live 2-element array.
            |m| unsafe { *m.dl_tensor.strides = i64::MAX },
            |e| matches!(e, Error::DLPack(DLPackError::BadExtent(_))),
        ),
        (
            // 2^62 f32 elements broadcast from one: 2^64 bytes, more than any
            // tensor's `nbytes` can say (it read 0 in release).
            "2^64 bytes",
            // SAFETY: `shape` and `strides` point at the producer's live 2-element arrays.
            |m| unsafe {
                *m.dl_tensor.shape = 1 << 61;
                *m.dl_tensor.shape.add(1) = 2;
                *m.dl_tensor.strides = 0;
                *m.dl_tensor.strides.add(1) = 0;
            },
            |e| matches!(e, Error::DLPack(DLPackError::BadExtent(_))),
        ),
        (
            // Extents of both signs, each within `isize`, together 2^64 - 4
            // bytes (the address is never read: the import refuses first).
            "extent past isize::MAX",
            // SAFETY: as above.
            |m| unsafe {
                m.dl_tensor.data = (1usize << 63) as *mut c_void;
                *m.dl_tensor.strides = -(1 << 61);
                *m.dl_tensor.strides.add(1) = (1 << 60) - 1;
            },
            |e| matches!(e, Error::DLPack(DLPackError::BadExtent(_))),
        ),
    ];
    for (name, edit, expected) in cases {
        let before = DELETED.load(Ordering::SeqCst);
        // SAFETY: the descriptor may be invalid but the struct and deleter are sound.
        let err = unsafe { devtensor::from_dlpack_versioned(foreign(&[2, 3], Some(&[3, 1]), edit)) }.unwrap_err();
        assert!(expected(&err), "{name}: {err}");
        assert_eq!(
            DELETED.load(Ordering::SeqCst),
            before + 1,
            "{name}: deleter must run exactly once"
        );
    }
    // SAFETY: null is allowed and owns nothing.
    let err = unsafe { devtensor::from_dlpack_versioned(std::ptr::null_mut()) }.unwrap_err();
    assert!(matches!(err, Error::DLPack(DLPackError::NullTensor)));
}

unsafe extern "C" fn count_only(_: *mut DLManagedTensorVersioned) {
    DELETED.fetch_add(1, Ordering::SeqCst);
}

/// Another major version may have another, shorter struct: only the fields
/// DLPack keeps in place (`version`, `manager_ctx`, `deleter`) may be read.
/// Here the struct ends where a page without access begins, so reading
/// `flags` (as the import did before it checked the major) faults.
#[test]
#[cfg(target_os = "linux")]
#[serial(counters)]
fn another_major_is_refused_reading_only_its_version_and_deleter() {
    let page = 4096;
    // SAFETY: a fresh anonymous mapping of two pages, the second made
    // inaccessible; both unmapped at the end.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(
            libc::mprotect(p.cast::<u8>().add(page).cast(), page, libc::PROT_NONE),
            0
        );
        p.cast::<u8>()
    };
    let head = size_of::<DLPackVersion>() + 2 * size_of::<usize>();
    // SAFETY: the last `head` bytes of the accessible page; fields are written
    // through raw places, never a reference to the whole (partly unmapped) struct.
    let m = unsafe {
        let m = base.add(page - head).cast::<DLManagedTensorVersioned>();
        (&raw mut (*m).version).write(DLPackVersion { major: 2, minor: 0 });
        (&raw mut (*m).manager_ctx).write(std::ptr::null_mut());
        (&raw mut (*m).deleter).write(Some(count_only));
        m
    };
    let before = DELETED.load(Ordering::SeqCst);
    // SAFETY: `version` and `deleter` are readable; the deleter may run once.
    let err = unsafe { devtensor::from_dlpack_versioned(m) }.unwrap_err();
    assert!(
        matches!(err, Error::DLPack(DLPackError::UnsupportedVersion { major: 2 })),
        "{err}"
    );
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 1, "the deleter runs once");
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(base.cast(), 2 * page) }, 0);
}

#[test]
#[serial(counters)]
fn every_dtype_exports_with_its_encoding() {
    for &dt in DType::ALL {
        let t = Tensor::zeros(&[2, 2], dt, Device::Cpu).unwrap();
        let m = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
        // SAFETY: live export consumed once.
        let back = unsafe {
            assert_eq!((*m).dl_tensor.dtype, dt.to_dlpack());
            devtensor::from_dlpack_versioned(m)
        }
        .unwrap();
        assert_eq!(back.dtype(), dt);
    }
}

#[test]
#[serial(counters)] // moves live_exports() and cpu_live(), which the other tests count
fn an_export_not_handed_over_runs_its_deleter_once_on_drop() {
    let t = Tensor::zeros(&[3, 5], DType::F32, Device::Cpu).unwrap();
    let refs = std::sync::Arc::strong_count(t.storage());
    let versioned = t.to_dlpack_versioned(ExportOptions::default());
    let legacy = t.to_dlpack_legacy().unwrap();
    assert_eq!(
        std::sync::Arc::strong_count(t.storage()),
        refs + 2,
        "each export keeps the storage"
    );
    // SAFETY: live structs owned by the two values.
    unsafe {
        assert_eq!((*versioned.as_ptr()).dl_tensor.ndim, 2);
        assert_eq!((*legacy.as_ptr()).dl_tensor.ndim, 2);
    }
    drop(versioned);
    drop(legacy);
    assert_eq!(std::sync::Arc::strong_count(t.storage()), refs, "both deleters ran");
    // Handed over, the struct is the receiver's: its deleter runs when it calls it.
    let raw = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
    assert_eq!(std::sync::Arc::strong_count(t.storage()), refs + 1);
    // SAFETY: the struct was handed over by `into_raw`; its deleter is called once.
    unsafe { ((*raw).deleter.unwrap())(raw) };
    assert_eq!(std::sync::Arc::strong_count(t.storage()), refs);
}

// ----- an allocator whose free panics ---------------------------------------------------

static FREES_TRIED: AtomicUsize = AtomicUsize::new(0);

/// Hands out CPU memory and panics when asked to free it: a user's allocator
/// with a bug, reached from C through an export's deleter.
#[derive(Debug)]
struct PanickingFree;

// SAFETY: allocations are CpuAlloc's, never handed out twice; none is ever freed.
unsafe impl NDAlloc for PanickingFree {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: Option<devtensor::StreamHandle>,
    ) -> devtensor::Result<devtensor::alloc::Allocation> {
        CpuAlloc.allocate(size, align, stream)
    }

    unsafe fn deallocate(&self, _: devtensor::alloc::Allocation, _: Option<devtensor::StreamHandle>) {
        FREES_TRIED.fetch_add(1, Ordering::SeqCst);
        panic!("PanickingFree: this free fails on purpose");
    }

    fn stats(&self) -> devtensor::AllocStats {
        devtensor::AllocStats::default()
    }
}

#[test]
#[serial(counters)] // moves live_exports()
fn a_panic_in_the_free_does_not_unwind_out_of_the_deleters() {
    // Before the deleters caught it, the panic reached their `extern "C"`
    // boundary, which aborts the whole test process.
    let alloc: std::sync::Arc<dyn NDAlloc> = std::sync::Arc::new(PanickingFree);
    let live = live_exports();
    let tried = FREES_TRIED.load(Ordering::SeqCst);
    let t = Tensor::empty_in(alloc.clone(), &[4, 4], DType::F32).unwrap();
    let versioned = t.to_dlpack_versioned(ExportOptions::default()).into_raw();
    let legacy = t.to_dlpack_legacy().unwrap().into_raw();
    drop(t);
    assert_eq!(live_exports(), live + 2);
    // SAFETY: both structs were handed over by `into_raw`; each deleter is called once.
    unsafe { ((*legacy).deleter.unwrap())(legacy) };
    assert_eq!(
        FREES_TRIED.load(Ordering::SeqCst),
        tried,
        "the versioned export still holds the memory"
    );
    // SAFETY: as above.
    unsafe { ((*versioned).deleter.unwrap())(versioned) };
    assert_eq!(
        FREES_TRIED.load(Ordering::SeqCst),
        tried + 1,
        "the last deleter tried to free once"
    );
    assert_eq!(live_exports(), live, "both exports count as freed");
}
