//! Host memory for `kDLCPU` tensors.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use super::{AllocStats, Allocation, Counters, NDAlloc, huge_pages, mapped_blocks, small_blocks};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::StreamHandle;

/// Alignment of every CPU allocation (DLPack's recommended 256 bytes).
pub const CPU_ALIGNMENT: usize = 256;

/// Blocks of 8 MiB and more are each their own mapping on Linux, aligned to
/// 2 MiB and advised to use transparent huge pages ([`huge_pages`]), and kept
/// for reuse when freed ([`mapped_blocks`]). glibc maps every block above its
/// largest mmap threshold (32 MiB on 64-bit) fresh, and below it reuses a
/// freed block only while its threshold and the top of its heap allow, which
/// other allocations between two of ours upset: in a loop of NumPy, torch and
/// devtensor calls, each allocating and freeing 16 MiB, every one of ours was
/// page-faulted in again.
pub(super) const MAPPED_MIN: usize = 8 << 20;

/// Mappings from here on are whole huge pages (at most 1/16 more than the
/// block); smaller ones whole 64 KiB, huge pages only where whole ones fit.
/// Off Linux, blocks this large are still 2 MiB-aligned.
pub(super) const HUGE_PAGE_MIN: usize = 32 << 20;
pub(super) const HUGE_PAGE: usize = 2 << 20;

/// Set in the token of a mapped block taken from [`mapped_blocks`] (the
/// token is the mapping's length, a multiple of a page, so the low bit is free).
const REUSED: usize = 1;

/// The alignment every `malloc` on a 64-bit target gives, and the extra bytes a
/// padded block needs to reach [`CPU_ALIGNMENT`] from it.
const MALLOC_ALIGNMENT: usize = 16;
const PAD: usize = CPU_ALIGNMENT - MALLOC_ALIGNMENT;

/// Process-wide counters: the CPU allocator is stateless, so its accounting
/// is global; blocks that pass through a thread's small-block cache are
/// counted there, and only their bytes here ([`small_blocks`]).
static COUNTERS: Counters = Counters::new();

/// The most bytes live and kept for reuse together (`memory_stats`'
/// `peak_reserved_bytes`): it stays when the kept blocks are released.
static PEAK_RESERVED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator at 256-byte alignment, with live-allocation accounting.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuAlloc;

impl CpuAlloc {
    /// The one shared instance.
    pub fn shared() -> Arc<dyn NDAlloc> {
        static SHARED: OnceLock<Arc<dyn NDAlloc>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(CpuAlloc)).clone()
    }

    /// Unmaps the freed large blocks kept for reuse (`mapped_blocks`); the
    /// bytes released.
    pub fn empty_cache() -> usize {
        mapped_blocks::release_all()
    }

    /// Bytes of freed large blocks kept for reuse.
    pub fn cached_bytes() -> usize {
        mapped_blocks::cached_bytes()
    }

    /// The most bytes live and kept for reuse at once, since the process began.
    pub fn peak_reserved() -> usize {
        PEAK_RESERVED.load(Ordering::Relaxed)
    }

    fn layout(size: usize, align: usize) -> Result<Layout> {
        let align = if size >= HUGE_PAGE_MIN {
            align.max(HUGE_PAGE)
        } else {
            align.max(CPU_ALIGNMENT)
        };
        Layout::from_size_align(size, align).map_err(|_| Error::Overflow {
            what: "allocation size",
        })
    }

    /// For blocks below [`MAPPED_MIN`] that need no more than [`CPU_ALIGNMENT`]:
    /// a plain, 16-byte aligned layout [`PAD`] bytes longer, whose start is moved
    /// up to the next 256-byte boundary by hand. glibc's `posix_memalign` splits
    /// off and frees a leading and a trailing fragment on every call, and those
    /// fragments make the next free consolidate the heap: about a third of the
    /// time of a small `devtensor.empty()`. Freed ones of up to 256 KiB are kept
    /// for reuse by the thread ([`small_blocks`]).
    fn padded_layout(size: usize, align: usize) -> Result<Option<Layout>> {
        if size >= MAPPED_MIN || align > CPU_ALIGNMENT {
            return Ok(None);
        }
        // Sizes rounded up to 64 bytes, so that nearby sizes share cached blocks.
        let Some(padded) = size.next_multiple_of(64).checked_add(PAD) else {
            return Err(Error::Overflow {
                what: "allocation size",
            });
        };
        Layout::from_size_align(padded, MALLOC_ALIGNMENT)
            .map(Some)
            .map_err(|_| Error::Overflow {
                what: "allocation size",
            })
    }

    /// [`NDAlloc::allocate`]; `reuse`: a block of its own mapping may be a
    /// kept one ([`mapped_blocks`]).
    #[inline(always)]
    fn allocate_block(&self, size: usize, align: usize, reuse: bool) -> Result<Allocation> {
        if size == 0 {
            let layout = Self::layout(size, align)?;
            // A dangling, aligned, non-null address: never dereferenced or freed.
            let ptr = NonNull::new(layout.align() as *mut u8).ok_or(Error::Overflow { what: "alignment" })?;
            return Ok(Allocation {
                ptr,
                size,
                align,
                token: 0,
            });
        }
        let oom = || Error::OutOfMemory {
            device: Device::Cpu,
            requested: size,
            reserved: 0,
            allocated: 0,
            largest_free: 0,
        };
        // `cached`: a block from the thread's cache, which counted it.
        let (ptr, token, cached) = if let Some(padded) = Self::padded_layout(size, align)? {
            let (raw, cached) = match small_blocks::take(padded) {
                Some(raw) => (raw, true),
                // SAFETY: `padded` has a non-zero size.
                None => (unsafe { std::alloc::alloc(padded) }, false),
            };
            if raw.is_null() {
                return Err(oom());
            }
            let offset = (CPU_ALIGNMENT - raw as usize % CPU_ALIGNMENT) % CPU_ALIGNMENT;
            // SAFETY: `raw` is at least 16-byte aligned, so `offset` ≤ PAD and
            // `raw + offset .. + size` lies inside the `size + PAD` bytes allocated.
            (unsafe { raw.add(offset) }, offset, cached)
        } else if let Some(len) = huge_pages::mapped_len(size, align) {
            mapped_blocks::check_config()?;
            // The token: the mapping's length, and whether it was used before.
            match reuse.then(|| mapped_blocks::take(len)).flatten() {
                Some((p, len)) => (p, len | REUSED, false),
                // Refused: the kept blocks go back to the system first.
                None => match huge_pages::map(len) {
                    Some(p) => (p, len, false),
                    None if mapped_blocks::release_all() > 0 => {
                        (huge_pages::map(len).unwrap_or(std::ptr::null_mut()), len, false)
                    }
                    None => (std::ptr::null_mut(), len, false),
                },
            }
        } else {
            let layout = Self::layout(size, align)?;
            // SAFETY: `layout` has a non-zero size.
            let ptr = unsafe { std::alloc::alloc(layout) };
            #[cfg(target_os = "linux")]
            if size >= HUGE_PAGE_MIN && !ptr.is_null() {
                // SAFETY: `ptr` is the 2 MiB-aligned start of a fresh allocation of
                // `size` bytes; MADV_HUGEPAGE is advice only and leaves contents alone.
                unsafe { libc::madvise(ptr.cast(), size, libc::MADV_HUGEPAGE) };
            }
            (ptr, 0, false)
        };
        let ptr = NonNull::new(ptr).ok_or_else(oom)?;
        if cached {
            COUNTERS.on_alloc_bytes(size);
        } else {
            COUNTERS.on_alloc(size);
        }
        // Reserved (live + kept) only grows here: a freed block moves from
        // one to the other, and a kept one reused the other way.
        let reserved = COUNTERS.live_bytes() + mapped_blocks::cached_bytes();
        if reserved > PEAK_RESERVED.load(Ordering::Relaxed) {
            PEAK_RESERVED.fetch_max(reserved, Ordering::Relaxed);
        }
        Ok(Allocation {
            ptr,
            size,
            align,
            token,
        })
    }
}

// SAFETY: `allocate` returns memory from the global allocator with a layout of
// at least `align` alignment and `size` bytes, or an anonymous mapping (fresh,
// or kept after a free and handed out once) of at least `size` bytes at a
// 2 MiB boundary, owned by the caller until `deallocate`; zero-size requests
// get a dangling aligned pointer never freed.
unsafe impl NDAlloc for CpuAlloc {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn allocate(&self, size: usize, align: usize, _stream: Option<StreamHandle>) -> Result<Allocation> {
        self.allocate_block(size, align, true)
    }

    /// A fresh mapping, never a kept one, for a block of its own: it reads as
    /// zeros with no page touched.
    fn allocate_for_zeros(&self, size: usize, align: usize, _stream: Option<StreamHandle>) -> Result<Allocation> {
        self.allocate_block(size, align, false)
    }

    unsafe fn deallocate(&self, a: Allocation, _stream: Option<StreamHandle>) {
        if a.size == 0 {
            return;
        }
        match (
            Self::padded_layout(a.size, a.align),
            huge_pages::mapped_len(a.size, a.align),
        ) {
            (Ok(Some(padded)), _) => {
                // SAFETY: the caller passes an allocation from `allocate`, which took
                // this same padded layout and advanced its start by `token` bytes.
                let raw = unsafe { a.ptr.as_ptr().sub(a.token) };
                if small_blocks::keep(raw, padded) {
                    COUNTERS.on_free_bytes(a.size); // counted by the thread's cache
                    return;
                }
                // SAFETY: as above; not kept, so freed once, here.
                unsafe { std::alloc::dealloc(raw, padded) };
            }
            (Ok(None), Some(_)) => {
                let len = a.token & !REUSED;
                if !mapped_blocks::keep(a.ptr.as_ptr(), len) {
                    // SAFETY: the caller passes an allocation from `allocate`, which
                    // mapped (or took from the cache) these `len` bytes for it (the
                    // same sizes choose the same way), not kept: unmapped once, here.
                    unsafe { huge_pages::unmap(a.ptr.as_ptr(), len) };
                }
            }
            (Ok(None), None) => {
                let Ok(layout) = Self::layout(a.size, a.align) else {
                    return; // unreachable: the same layout was valid at allocation.
                };
                // SAFETY: the caller passes an allocation from `allocate`, so `layout`
                // is the layout it was allocated with.
                unsafe { std::alloc::dealloc(a.ptr.as_ptr(), layout) };
            }
            (Err(_), _) => return, // unreachable: the same sizes were valid at allocation.
        }
        COUNTERS.on_free(a.size);
    }

    fn zero_filled(&self, a: &Allocation) -> bool {
        // A fresh block of its own mapping: zero pages until written.
        huge_pages::mapped_len(a.size, a.align).is_some() && a.token & REUSED == 0
    }

    fn stats(&self) -> AllocStats {
        let (taken, kept) = small_blocks::counts();
        COUNTERS.with_counts(taken, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // Other tests of the group read the process-wide counters this moves.
    #[serial_test::serial(cpu_alloc_counters)]
    fn a_freed_256_kib_block_is_taken_again_from_the_threads_cache() {
        // A 256 × 256 f32 tensor's block, on a thread of its own (an empty cache).
        std::thread::spawn(|| {
            let a = CpuAlloc;
            let size = 256 * 256 * 4;
            let p = a.allocate(size, 16, None).unwrap();
            let first = p.ptr;
            // SAFETY: `p` came from `allocate(size, 16)` above and is freed once.
            unsafe { a.deallocate(p, None) };
            let taken = small_blocks::taken_here();
            let q = a.allocate(size, 16, None).unwrap();
            assert_eq!(small_blocks::taken_here(), taken + 1, "the block came from the cache");
            assert_eq!(q.ptr, first);
            // SAFETY: as above.
            unsafe { a.deallocate(q, None) };
        })
        .join()
        .unwrap();
    }

    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn allocations_are_aligned_and_counted() {
        let a = CpuAlloc;
        let before = a.stats();
        let p = a.allocate(1000, 16, None).unwrap();
        assert_eq!(p.ptr.as_ptr() as usize % CPU_ALIGNMENT, 0);
        let mid = a.stats();
        assert_eq!(mid.live_allocations, before.live_allocations + 1);
        assert_eq!(mid.live_bytes, before.live_bytes + 1000);
        assert!(mid.peak_bytes >= mid.live_bytes);
        // SAFETY: `p` came from `allocate(1000, 16)` above and is freed once.
        unsafe { a.deallocate(p, None) };
        assert_eq!(a.stats().live_allocations, before.live_allocations);
        assert_eq!(a.stats().live_bytes, before.live_bytes);
    }

    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn blocks_a_threads_cache_counted_stay_counted_after_it_exits() {
        let a = CpuAlloc;
        let before = a.stats();
        // On another thread: a block freed into its cache and handed out
        // again (both counted by that thread), alive past the thread's exit.
        let kept = std::thread::spawn(move || {
            let first = a.allocate(1000, 16, None).unwrap();
            // SAFETY: `first` came from `allocate` and is freed once.
            unsafe { a.deallocate(first, None) };
            let again = a.allocate(1000, 16, None).unwrap();
            assert_eq!(again.ptr, first.ptr, "the thread's cache handed the block back");
            again
        })
        .join()
        .unwrap();
        let mid = a.stats();
        assert_eq!(mid.live_allocations, before.live_allocations + 1);
        assert_eq!(mid.total_allocations, before.total_allocations + 2);
        assert_eq!(mid.live_bytes, before.live_bytes + 1000);
        // Freed on this thread, into its cache.
        // SAFETY: `kept` came from `allocate` on the other thread and is freed once.
        unsafe { a.deallocate(kept, None) };
        let after = a.stats();
        assert_eq!(after.live_allocations, before.live_allocations);
        assert_eq!(after.live_bytes, before.live_bytes);
        assert_eq!(after.total_allocations, before.total_allocations + 2);
    }

    #[test]
    #[serial_test::serial(cpu_alloc_counters)]
    fn large_blocks_are_reused_and_read_as_zeros_only_when_fresh() {
        let a = CpuAlloc;
        let linux = cfg!(target_os = "linux");
        for size in [MAPPED_MIN + 12_345, HUGE_PAGE_MIN + 12_345] {
            // The blocks freed so far, by address, with what was written last.
            let mut freed = std::collections::HashMap::new();
            let mut reused = 0;
            // Tests running beside take and free large blocks too, and the
            // cache is skipped while one of them holds it: a block may be
            // another's, or a fresh mapping at an address just unmapped, and
            // with two of ours kept the older comes back first. So the block's
            // state is read from `zero_filled`, and rounds go on until one of
            // ours came back once with its contents.
            for round in 0..16u8 {
                let p = a.allocate(size, 64, None).unwrap();
                let at = p.ptr.as_ptr() as usize;
                assert!(at.is_multiple_of(HUGE_PAGE) || !linux && size < HUGE_PAGE_MIN, "{size}");
                // SAFETY: `p` holds `size` bytes, used only here, then freed once.
                unsafe {
                    let s = std::slice::from_raw_parts_mut(p.ptr.as_ptr(), size);
                    if a.zero_filled(&p) {
                        assert!(s.iter().step_by(4096).all(|&b| b == 0), "{size} round {round}");
                        assert_eq!(s[size - 1], 0);
                    } else if linux && freed.get(&at) == Some(&s[size - 1]) {
                        reused += 1;
                    }
                    s.fill(round + 1);
                    freed.insert(at, round + 1);
                    a.deallocate(p, None);
                }
                if reused > 0 || !linux && round == 2 {
                    break;
                }
            }
            assert!(!linux || reused > 0, "{size}: no block was reused");
            // The blocks freed are kept (filled); one for zeros is fresh all
            // the same, and reads as zeros.
            let z = a.allocate_for_zeros(size, 64, None).unwrap();
            assert_eq!(a.zero_filled(&z), linux);
            // SAFETY: `z` holds `size` bytes, read here only, then freed once.
            unsafe {
                let s = std::slice::from_raw_parts(z.ptr.as_ptr(), size);
                assert!(!linux || s.iter().step_by(4096).all(|&b| b == 0), "{size}");
                a.deallocate(z, None);
            }
        }
        let small = a.allocate(4096, 64, None).unwrap();
        assert!(!a.zero_filled(&small));
        // SAFETY: from `allocate` above, freed once.
        unsafe { a.deallocate(small, None) };
    }

    #[test]
    fn zero_size_and_huge_requests() {
        let a = CpuAlloc;
        let p = a.allocate(0, 64, None).unwrap();
        assert_eq!(p.ptr.as_ptr() as usize % CPU_ALIGNMENT, 0);
        // SAFETY: a zero-size pointer from `allocate` is a no-op to free.
        unsafe { a.deallocate(p, None) };
        assert!(matches!(
            a.allocate(usize::MAX - 10, 64, None),
            Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            a.allocate(isize::MAX as usize / 2, 64, None),
            Err(Error::OutOfMemory { .. })
        ));
    }
}
