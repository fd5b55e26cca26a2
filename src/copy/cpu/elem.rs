//! The element types the kernels move (`u8/u16/u32/u64/u128`, `[u8; N]`),
//! their unaligned loads and stores, and each type's register micro-transpose.

/// Reads a `T` at `p`, unaligned.
///
/// # Safety
///
/// `p` is readable for `size_of::<T>()` bytes.
#[inline(always)]
pub(super) unsafe fn ld<T: Copy>(p: *const u8) -> T {
    // SAFETY: the caller guarantees `p` is readable for `size_of::<T>()` bytes.
    unsafe { p.cast::<T>().read_unaligned() }
}

/// Writes `v` at `p`, unaligned.
///
/// # Safety
///
/// `p` is writable for `size_of::<T>()` bytes.
#[inline(always)]
pub(super) unsafe fn st<T: Copy>(p: *mut u8, v: T) {
    // SAFETY: the caller guarantees `p` is writable for `size_of::<T>()` bytes.
    unsafe { p.cast::<T>().write_unaligned(v) }
}

use super::blocks::{self, Base};

/// An element type the kernels move: a power-of-two integer or a byte array.
pub(super) trait Elem: Copy + Send + Sync + 'static {
    /// Edge of the baseline register micro tile.
    const MICRO: usize;

    /// Transposes one `MICRO × MICRO` block:
    /// `dst[i·E + j·db] = src[i·sa + j·E]` for `i, j < MICRO`. `NT`: streaming
    /// stores where the type has vector rows (16-byte aligned destination rows).
    ///
    /// # Safety
    ///
    /// Every address formed is readable (source) or writable (destination);
    /// with `NT`, every destination row is 16-byte aligned.
    #[inline(always)]
    unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
        let e = size_of::<Self>();
        // SAFETY: forwarded; indices stay below MICRO.
        unsafe {
            for j in 0..Self::MICRO {
                let dr = dst.offset(j as isize * db);
                let sc = src.add(j * e);
                for i in 0..Self::MICRO {
                    st(dr.add(i * e), ld::<Self>(sc.offset(i as isize * sa)));
                }
            }
        }
    }

    /// Edge of the micro tile [`micro_tiles`](Self::micro_tiles) uses, with
    /// the AVX2 kernels (`avx2`: the CPU has AVX2, decided once per copy) or
    /// without.
    #[inline(always)]
    fn micro_len(avx2: bool) -> usize {
        let _ = avx2;
        Self::MICRO
    }

    /// Transposes an `fi × fj` block (multiples of [`micro_len`](Self::micro_len)
    /// with the same `avx2`) with that micro tile ([`blocks::tiles`]).
    ///
    /// # Safety
    ///
    /// As [`blocks::tiles`]; with `avx2`, the CPU has AVX2.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro_tiles(
        avx2: bool,
        dst: *mut u8,
        src: *const u8,
        fi: usize,
        fj: usize,
        sa: isize,
        db: isize,
        nt: bool,
        lines: bool,
    ) {
        let _ = avx2;
        // SAFETY: forwarded.
        unsafe { blocks::tiles::<Base<Self>>(dst, src, fi, fj, sa, db, nt, lines) }
    }
}

macro_rules! scalar_elem {
    ($($t:ty => $micro:expr;)*) => {
        $(impl Elem for $t {
            const MICRO: usize = $micro;
        })*
    };
}

scalar_elem! {
    [u8; 5] => 4;
    [u8; 6] => 4;
    [u8; 7] => 4;
    [u8; 9] => 4;
    [u8; 10] => 4;
    [u8; 11] => 4;
    [u8; 12] => 4;
    [u8; 13] => 4;
    [u8; 14] => 4;
    [u8; 15] => 4;
    u128 => 4;
}

#[cfg(not(target_arch = "x86_64"))]
scalar_elem! {
    [u8; 3] => 4;
    u8 => 8;
    u16 => 8;
    u32 => 8;
    u64 => 4;
}

#[cfg(target_arch = "x86_64")]
mod sse {
    //! SSE2 (x86-64 baseline) register transposes: a `16/E × 16/E` block of
    //! `E`-byte elements in `log2(16/E)` rounds of interleaves.
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128, _mm_stream_si128, _mm_unpackhi_epi8,
        _mm_unpackhi_epi16, _mm_unpackhi_epi32, _mm_unpackhi_epi64, _mm_unpacklo_epi8, _mm_unpacklo_epi16,
        _mm_unpacklo_epi32, _mm_unpacklo_epi64,
    };

    use super::super::avx2;
    use super::super::blocks::{self, Base};
    use super::Elem;

    /// [`Elem::micro_len`] and [`Elem::micro_tiles`] through the AVX2 kernel when it runs.
    macro_rules! with_avx2 {
        ($kernel:ident) => {
            #[inline(always)]
            fn micro_len(avx2: bool) -> usize {
                if avx2 {
                    <avx2::$kernel as blocks::Kernel>::M
                } else {
                    Self::MICRO
                }
            }
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn micro_tiles(
                avx2: bool,
                dst: *mut u8,
                src: *const u8,
                fi: usize,
                fj: usize,
                sa: isize,
                db: isize,
                nt: bool,
                lines: bool,
            ) {
                // SAFETY: forwarded; `avx2` only where the CPU has AVX2.
                unsafe {
                    if avx2 {
                        avx2::tiles::<avx2::$kernel>(dst, src, fi, fj, sa, db, nt, lines)
                    } else {
                        blocks::tiles::<Base<Self>>(dst, src, fi, fj, sa, db, nt, lines)
                    }
                }
            }
        };
    }

    /// Loads `N` rows, runs `rounds` perfect shuffles, stores `N` rows.
    ///
    /// # Safety
    ///
    /// `src + i·sa` readable and `dst + j·db` writable for 16 bytes, `i, j < N`.
    #[inline(always)]
    unsafe fn transpose<const N: usize, const NT: bool>(
        dst: *mut u8,
        src: *const u8,
        sa: isize,
        db: isize,
        lo: impl Fn(__m128i, __m128i) -> __m128i,
        hi: impl Fn(__m128i, __m128i) -> __m128i,
    ) {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        let zero = unsafe { _mm_setzero_si128() };
        let mut r = [zero; N];
        for (i, row) in r.iter_mut().enumerate() {
            // SAFETY: forwarded from the caller.
            *row = unsafe { _mm_loadu_si128(src.offset(i as isize * sa).cast()) };
        }
        let h = N / 2;
        let mut rounds = N.trailing_zeros();
        while rounds > 0 {
            let mut t = [zero; N];
            for k in 0..h {
                t[2 * k] = lo(r[k], r[k + h]);
                t[2 * k + 1] = hi(r[k], r[k + h]);
            }
            r = t;
            rounds -= 1;
        }
        for (j, row) in r.iter().enumerate() {
            // SAFETY: forwarded from the caller (16-byte aligned rows with `NT`).
            unsafe {
                let d = dst.offset(j as isize * db).cast();
                if NT {
                    _mm_stream_si128(d, *row);
                } else {
                    _mm_storeu_si128(d, *row);
                }
            }
        }
    }

    /// Three-byte elements have no SSE2 kernel (the scalar 4×4 tile), only an
    /// AVX2 one.
    impl Elem for [u8; 3] {
        const MICRO: usize = 4;
        with_avx2!(E3);
    }
    /// A power-of-two element's SSE2 kernel: an `n`-row network of the
    /// unpacks of its width.
    macro_rules! sse2_elem {
        ($t:ty, $n:literal, $avx2:ident, $lo:ident, $hi:ident) => {
            impl Elem for $t {
                const MICRO: usize = $n;
                with_avx2!($avx2);
                #[inline(always)]
                unsafe fn micro<const NT: bool>(dst: *mut u8, src: *const u8, sa: isize, db: isize) {
                    // SAFETY: forwarded.
                    unsafe { transpose::<$n, NT>(dst, src, sa, db, |a, b| $lo(a, b), |a, b| $hi(a, b)) }
                }
            }
        };
    }
    sse2_elem!(u8, 16, U8, _mm_unpacklo_epi8, _mm_unpackhi_epi8);
    sse2_elem!(u16, 8, U16, _mm_unpacklo_epi16, _mm_unpackhi_epi16);
    sse2_elem!(u32, 4, U32, _mm_unpacklo_epi32, _mm_unpackhi_epi32);
    sse2_elem!(u64, 2, U64, _mm_unpacklo_epi64, _mm_unpackhi_epi64);
}
