//! Large host blocks as their own anonymous mappings, 2 MiB-aligned and
//! advised to use transparent huge pages (Linux).
//!
//! glibc maps a block above its threshold fresh on every call anyway;
//! mapping it here saves the two mapping splits an aligned `malloc` costs.
//! glibc maps 2 MiB more than asked, and the advice then covers only the
//! aligned middle: the mapping is split in three, and merged again when
//! unmapped. Linux 6.7 and later place a mapping whose length is a multiple
//! of 2 MiB on a 2 MiB boundary, so the advice covers it whole. 64 MiB
//! mapped, advised and unmapped on this VM's 6.18 kernel (3 000 calls, best
//! of five): 10.5 µs through the over-sized mapping (NumPy's `empty` pays the
//! same), 8.1 µs exactly.

use super::cpu::{HUGE_PAGE, HUGE_PAGE_MIN, MAPPED_MIN};

/// The unit of smaller mappings' lengths: a multiple of every page size
/// Linux runs with (4, 16 and 64 KiB), so that the tail past a block is never
/// a partial page, which `munmap` would refuse.
const PAGE: usize = 64 << 10;

/// Bytes mapped for a block of `size` bytes at `align`: for blocks of
/// [`MAPPED_MIN`] or more that need at most a huge page's alignment, on
/// Linux, whole huge pages from [`HUGE_PAGE_MIN`], whole [`PAGE`]s below; `None`
/// for the others (the global allocator's, which also refuses sizes past
/// `isize::MAX` as an overflow).
pub(super) fn mapped_len(size: usize, align: usize) -> Option<usize> {
    let large = (MAPPED_MIN..=isize::MAX as usize).contains(&size);
    let unit = if size >= HUGE_PAGE_MIN { HUGE_PAGE } else { PAGE };
    (cfg!(target_os = "linux") && large && align <= HUGE_PAGE)
        .then(|| size.checked_next_multiple_of(unit))
        .flatten()
}

/// Maps `len` bytes (a [`mapped_len`]) at a 2 MiB boundary, zero-filled,
/// advised to use huge pages; `None` when the system refuses.
#[cfg(target_os = "linux")]
pub(super) fn map(len: usize) -> Option<*mut u8> {
    debug_assert!(len > 0 && len.is_multiple_of(PAGE));
    let p = if len.is_multiple_of(HUGE_PAGE) {
        let p = anonymous(len)?;
        if (p as usize).is_multiple_of(HUGE_PAGE) {
            p
        } else {
            // Kernels before 6.7 place it anywhere.
            // SAFETY: `p` is the mapping of `len` bytes just made, not used.
            unsafe { libc::munmap(p.cast(), len) };
            aligned_within_wider(len)?
        }
    } else {
        // No kernel aligns other lengths.
        aligned_within_wider(len)?
    };
    // SAFETY: `p .. p + len` is the mapping made above; MADV_HUGEPAGE is advice
    // only and leaves its contents alone.
    unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
    Some(p)
}

/// A fresh private anonymous mapping of `len` bytes, wherever the kernel
/// places it.
#[cfg(target_os = "linux")]
fn anonymous(len: usize) -> Option<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast::<u8>())
}

/// `len` bytes at a 2 MiB boundary on any kernel: a huge page more is
/// mapped, and the part before the first boundary and the rest after `len`
/// are unmapped again.
#[cfg(target_os = "linux")]
fn aligned_within_wider(len: usize) -> Option<*mut u8> {
    let w = anonymous(len.checked_add(HUGE_PAGE)?)?;
    let head = (HUGE_PAGE - w as usize % HUGE_PAGE) % HUGE_PAGE;
    // SAFETY: `head < HUGE_PAGE`, so `w + head .. + len` lies inside the
    // `len + HUGE_PAGE` bytes mapped at `w`; the two ranges unmapped are the
    // rest of that mapping, page-aligned (`w` and `head` are).
    unsafe {
        let p = w.add(head);
        if head > 0 {
            libc::munmap(w.cast(), head);
        }
        libc::munmap(p.add(len).cast(), HUGE_PAGE - head);
        Some(p)
    }
}

/// No mappings off Linux ([`mapped_len`] is `None` there).
#[cfg(not(target_os = "linux"))]
pub(super) fn map(_len: usize) -> Option<*mut u8> {
    None
}

/// Unmaps a block from [`map`].
///
/// # Safety
///
/// `p` and `len` are a mapping [`map`] returned, unmapped once, not used after.
pub(super) unsafe fn unmap(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the caller's contract.
        let r = unsafe { libc::munmap(p.cast(), len) };
        debug_assert_eq!(r, 0, "munmap of a block this allocator mapped");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The placement older kernels need: aligned, and every byte of it usable.
    #[test]
    fn a_mapping_cut_from_a_wider_one_is_aligned_and_whole() {
        for len in [
            3 * HUGE_PAGE,
            3 * HUGE_PAGE + 5 * PAGE,
            3 * HUGE_PAGE,
            MAPPED_MIN + PAGE,
        ] {
            let p = aligned_within_wider(len).expect("mmap");
            assert_eq!(p as usize % HUGE_PAGE, 0);
            // SAFETY: `p` maps `len` bytes, written and read here only, then unmapped once.
            unsafe {
                let s = std::slice::from_raw_parts_mut(p, len);
                assert!(s.iter().step_by(4096).all(|&b| b == 0));
                s.fill(0xa5);
                assert_eq!((s[0], s[len - 1]), (0xa5, 0xa5));
                unmap(p, len);
            }
        }
    }

    #[test]
    fn only_large_blocks_of_at_most_huge_page_alignment_are_mapped() {
        assert_eq!(mapped_len(HUGE_PAGE_MIN, 256), Some(HUGE_PAGE_MIN));
        assert_eq!(
            mapped_len(HUGE_PAGE_MIN + 1, HUGE_PAGE),
            Some(HUGE_PAGE_MIN + HUGE_PAGE)
        );
        // Below, whole 64 KiB.
        assert_eq!(mapped_len(HUGE_PAGE_MIN - 1, 256), Some(HUGE_PAGE_MIN));
        assert_eq!(mapped_len(MAPPED_MIN + 1, 256), Some(MAPPED_MIN + PAGE));
        assert_eq!(mapped_len(MAPPED_MIN, HUGE_PAGE), Some(MAPPED_MIN));
        assert_eq!(mapped_len(MAPPED_MIN - 1, 256), None);
        assert_eq!(mapped_len(HUGE_PAGE_MIN, 2 * HUGE_PAGE), None);
        assert_eq!(mapped_len(usize::MAX - 5, 256), None);
        assert_eq!(mapped_len(isize::MAX as usize + 1, 256), None);
    }
}
