//! Gathers of every `S`-th element (`S` of 2 to 8) of 1 or 2 bytes, and of
//! every 2nd of 4 bytes, into a contiguous row with SSSE3 byte shuffles: the
//! general kernel's 1-D gathers of 1- and 2-byte elements where the CPU lacks
//! [`split512`](super::split512)'s AVX-512 VBMI, its L1 tiles' row gathers
//! wherever it has AVX2. Each 16 bytes of output
//! take the `S` vectors of source that hold their elements, one `pshufb` each
//! picking its elements into place, ORed together. The scalar loop moves an
//! element a load and a store; this moves 16 bytes in `S` loads, `S`
//! shuffles and a store.

use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128};

/// The `pshufb` masks of a gather of every `S`-th `E`-byte element: `M[m]`
/// picks, from the `m`-th 16 bytes of `16·S` bytes of source, the bytes of
/// the 16 bytes of output that lie there (0x80 zeroes the others).
struct Masks<const S: usize, const E: usize>;

impl<const S: usize, const E: usize> Masks<S, E> {
    const M: [[u8; 16]; S] = {
        let mut m = [[0x80u8; 16]; S];
        let mut j = 0;
        while j < 16 {
            // Output byte `j` is byte `j % E` of element `j / E`, which starts
            // `(j / E)·S·E` bytes into the source.
            let p = j / E * S * E + j % E;
            m[p / 16][j] = (p % 16) as u8;
            j += 1;
        }
        m
    };
}

/// The whole blocks of a gather of every `s`-th `e`-byte element (`s` of 2
/// to 8 with `e` of 1 or 2, `s` of 2 with `e` of 4) by [`gather`]: the first
/// of `n` elements, reading no further than element `readable - 1`'s end;
/// the elements it wrote, the rest being the caller's. Out of line, so that its callers, inlined
/// everywhere, stay small.
///
/// # Safety
///
/// As [`gather`] (the pairs of `e` and `s` above; others write nothing).
#[inline(never)]
pub(super) unsafe fn whole_blocks(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    readable: usize,
    e: usize,
    s: usize,
) -> usize {
    macro_rules! shuffled {
        ($($s:literal)*) => {
            match (e, s) {
                $((1, $s) => gather::<$s, 1>(dst, src, n, readable),
                (2, $s) => gather::<$s, 2>(dst, src, n, readable),)*
                (4, 2) => gather::<2, 4>(dst, src, n, readable),
                _ => 0,
            }
        };
    }
    // SAFETY: forwarded.
    unsafe { shuffled!(2 3 4 5 6 7 8) }
}

/// `dst[i] = src[i·S]` for the first elements of `n` (`E`-byte elements),
/// in whole blocks of `16 / E`; returns how many it wrote. A block reads the
/// `16·S` source bytes from its first element on, so it stops at the last
/// block whose reads end by the end of element `readable - 1` (`readable ≥
/// n`: a row the caller gathers in parts reads on into the next part's
/// elements): the rest (up to `S` blocks where `readable == n`) is the
/// caller's, element by element.
///
/// # Safety
///
/// The CPU has SSSE3; bytes `0 .. n·E` of `dst` writable, bytes `i·S·E ..
/// i·S·E + E` of `src` readable for `i < readable`. The bytes between them
/// are read too: those of a row's span, from its first element to its last
/// one's end, are readable wherever its elements are, as no gap of under 16
/// bytes holds a whole page. No byte past the span is read.
#[target_feature(enable = "ssse3")]
unsafe fn gather<const S: usize, const E: usize>(dst: *mut u8, src: *const u8, n: usize, readable: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // The source's readable bytes: through the end of element readable − 1.
    debug_assert!(readable >= n);
    let end = (readable - 1) * S * E + E;
    let blocks = (end / (16 * S)).min(n * E / 16);
    // SAFETY: the masks are 16-byte arrays, read unaligned.
    let masks: [__m128i; S] = std::array::from_fn(|m| unsafe { _mm_loadu_si128(Masks::<S, E>::M[m].as_ptr().cast()) });
    for b in 0..blocks {
        // SAFETY: block `b` reads source bytes `16·S·b .. 16·S·(b + 1) ≤ end`
        // and writes destination bytes `16·b .. 16·(b + 1) ≤ n·E` (`blocks ≤
        // n·E / 16`).
        unsafe {
            let s = src.add(16 * S * b);
            let mut acc = _mm_shuffle_epi8(_mm_loadu_si128(s.cast()), masks[0]);
            for (m, mask) in masks.iter().enumerate().skip(1) {
                acc = _mm_or_si128(acc, _mm_shuffle_epi8(_mm_loadu_si128(s.add(16 * m).cast()), *mask));
            }
            _mm_storeu_si128(dst.add(16 * b).cast(), acc);
        }
    }
    blocks * 16 / E
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stride and element size against the plain loop, rows of every
    /// length from none to a few blocks, readable to their last element or
    /// a block's worth further: whole blocks only, none past the output's
    /// end, and every block whose reads end by the readable end taken. (That
    /// no read passes the readable end is `copy_props`'s
    /// `every_sth_element_read_no_further_than_the_source` and
    /// `strided_row_tiles_read_no_further_than_the_source`.)
    #[test]
    fn shuffled_gathers_match_the_plain_loop() {
        if !std::is_x86_feature_detected!("ssse3") {
            println!("SKIP shuffled gathers: the CPU has no SSSE3");
            return;
        }
        fn check<const S: usize, const E: usize>() {
            for (n, more) in [0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 257]
                .into_iter()
                .flat_map(|n| [(n, 0), (n, 16 / E)])
            {
                let readable = n + if n == 0 { 0 } else { more };
                let len = if readable == 0 { 0 } else { (readable - 1) * S * E + E };
                let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let mut got = vec![0u8; n * E];
                // SAFETY: SSSE3 checked above; `src` ends at element
                // `readable - 1`'s end and `got` holds `n` elements.
                let done = unsafe { gather::<S, E>(got.as_mut_ptr(), src.as_ptr(), n, readable) };
                assert!(done <= n && done % (16 / E) == 0, "S {S} E {E} n {n}: {done} done");
                let whole = (len / (16 * S)).min(n * E / 16) * 16 / E;
                assert_eq!(done, whole, "S {S} E {E} n {n} readable {readable}");
                if more > 0 {
                    assert_eq!(done, n / (16 / E) * (16 / E), "S {S} E {E} n {n}: reading on");
                }
                for i in 0..done {
                    assert_eq!(
                        got[i * E..(i + 1) * E],
                        src[i * S * E..i * S * E + E],
                        "S {S} E {E} n {n} i {i}"
                    );
                }
                assert!(
                    got[done * E..].iter().all(|&b| b == 0),
                    "S {S} E {E} n {n}: wrote past {done}"
                );
            }
        }
        check::<2, 1>();
        check::<3, 1>();
        check::<4, 1>();
        check::<5, 1>();
        check::<6, 1>();
        check::<7, 1>();
        check::<8, 1>();
        check::<2, 2>();
        check::<3, 2>();
        check::<4, 2>();
        check::<5, 2>();
        check::<6, 2>();
        check::<7, 2>();
        check::<8, 2>();
        check::<2, 4>();
    }
}
