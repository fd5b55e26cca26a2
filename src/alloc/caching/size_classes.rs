//! Size classes: requests round up to 512 B, then to 4 sub-bins per power of
//! two (waste bounded by 25 %); a block's class indexes its free list.

/// The smallest block; every block size is a multiple of it.
pub(super) const MIN_BLOCK: usize = 512;
/// Size classes: 4 per power of two from 2^9 up to 2^64.
pub(super) const NCLASS: usize = (64 - 9) * 4;

/// Rounds a request to its size class (multiple of 512 B; 4 sub-bins per power of two).
pub(super) fn round_size(n: usize) -> usize {
    if n <= MIN_BLOCK {
        return MIN_BLOCK;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let step = (p / 4).max(MIN_BLOCK);
    n.div_ceil(step).saturating_mul(step)
}

/// The class whose smallest size is the largest one ≤ `size` (size ≥ 512).
pub(super) fn class_floor(size: usize) -> usize {
    let l = (usize::BITS - 1 - size.leading_zeros()) as usize;
    let sub = (size - (1 << l)) / ((1usize << l) / 4).max(1);
    (l - 9) * 4 + sub.min(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::caching::config::MIB;

    #[test]
    fn sizes_round_to_four_sub_bins_per_power_of_two() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(4097), 5120);
        assert_eq!(round_size(5 * MIB + 1), 6 * MIB);
        for n in [1usize, 700, 3000, 123_456, 10_000_000, 1 << 33] {
            let r = round_size(n);
            assert!(r >= n && r.is_multiple_of(512), "{n}");
            assert!(r - n <= (n / 4).max(511), "waste bounded for {n}");
            // A rounded size is the smallest of its class, so every free block
            // the search finds in that class or above is big enough.
            assert!(r == MIN_BLOCK || class_floor(r - 1) < class_floor(r), "class of {r}");
        }
    }

    #[test]
    fn class_floor_is_monotonic_and_exact_on_rounded_sizes() {
        let mut last = 0;
        for k in 1..4096usize {
            let s = k * 512;
            let c = class_floor(s);
            assert!(c >= last);
            last = c;
            // A request rounded to class c finds blocks of class ≥ c only if big enough.
            let r = round_size(s);
            assert!(class_floor(r) >= class_floor(s));
        }
    }
}
