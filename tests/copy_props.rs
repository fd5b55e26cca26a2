//! Property tests of the CPU strided-copy engine against a naive per-element
//! reference, plus explicit cases: overlap handling, large (parallel, blocked)
//! transposes, unaligned pointers, wide elements, errors.

use devtensor::Error;
use devtensor::copy::{copy_strided, fill_strided, set_avx2_allowed, set_avx512_allowed, set_stream_threshold};
use proptest::prelude::*;

/// Calls `f(src_off, dst_off)` (element offsets) for every index of `shape`.
fn for_each_index(shape: &[usize], src: &[isize], dst: &[isize], mut f: impl FnMut(isize, isize)) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        let so: isize = idx.iter().zip(src).map(|(&i, &s)| i as isize * s).sum();
        let d: isize = idx.iter().zip(dst).map(|(&i, &s)| i as isize * s).sum();
        f(so, d);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// The reference copy on byte buffers; offsets in bytes, strides in elements.
#[allow(clippy::too_many_arguments)]
fn reference(
    dst: &mut [u8],
    dst_off: usize,
    dst_strides: &[isize],
    src: &[u8],
    src_off: usize,
    src_strides: &[isize],
    shape: &[usize],
    e: usize,
) {
    for_each_index(shape, src_strides, dst_strides, |so, d| {
        let s = (src_off as isize + so * e as isize) as usize;
        let d = (dst_off as isize + d * e as isize) as usize;
        dst[d..d + e].copy_from_slice(&src[s..s + e]);
    });
}

/// A pseudo-random byte pattern.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[derive(Debug, Clone)]
struct DimSpec {
    len: usize,
    step: usize,
    flip: bool,
    bcast: bool,
    extra: usize,
    start: usize,
}

fn dim_spec() -> impl Strategy<Value = DimSpec> {
    (
        prop_oneof![1 => Just(0usize), 12 => 1usize..=9],
        1usize..=3,
        any::<bool>(),
        prop::bool::weighted(0.15),
        0usize..=2,
        0usize..=2,
    )
        .prop_map(|(len, step, flip, bcast, extra, start)| DimSpec {
            len,
            step,
            flip,
            bcast,
            extra,
            start: start.min(extra),
        })
}

/// A view into a parent buffer: strides in elements, offset of element [0..0]
/// in elements, parent size in elements.
#[derive(Debug, Clone)]
struct View {
    strides: Vec<isize>,
    offset: usize,
    alloc: usize,
}

/// Builds a view: each dim sliced with `step` (and flipped) out of a parent
/// whose dims are laid out densely in the order `perm` (perm[0] outermost).
fn build_view(specs: &[DimSpec], perm: &[usize], allow_bcast: bool, pad: usize) -> View {
    let n = specs.len();
    let parent: Vec<usize> = specs
        .iter()
        .map(|s| {
            if allow_bcast && s.bcast {
                1
            } else {
                s.len.saturating_sub(1) * s.step + 1 + s.extra
            }
        })
        .collect();
    let mut pstride = vec![0isize; n];
    let mut acc = 1isize;
    for &d in perm.iter().rev() {
        pstride[d] = acc;
        acc *= parent[d] as isize;
    }
    let mut strides = vec![0isize; n];
    let mut offset = pad as isize;
    for (i, s) in specs.iter().enumerate() {
        if allow_bcast && s.bcast {
            strides[i] = 0;
            continue;
        }
        let st = pstride[i] * s.step as isize;
        if s.flip {
            strides[i] = -st;
            offset += (s.start + s.len.saturating_sub(1) * s.step) as isize * pstride[i];
        } else {
            strides[i] = st;
            offset += s.start as isize * pstride[i];
        }
    }
    View {
        strides,
        offset: offset as usize,
        alloc: acc as usize + pad,
    }
}

#[derive(Debug, Clone)]
struct Case {
    e: usize,
    shape: Vec<usize>,
    src: View,
    dst: View,
    src_shift: usize,
    dst_shift: usize,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (0usize..=5)
        .prop_flat_map(|nd| {
            (
                prop::sample::select(vec![1usize, 2, 3, 4, 8, 12, 16]),
                prop::collection::vec(dim_spec(), nd),
                Just((0..nd).collect::<Vec<_>>()).prop_shuffle(),
                Just((0..nd).collect::<Vec<_>>()).prop_shuffle(),
                prop::collection::vec((1usize..=2, any::<bool>()), nd),
                0usize..4,
                any::<bool>(),
                0usize..16,
                0usize..16,
            )
        })
        .prop_map(
            |(e, specs, sperm, dperm, dmods, pad, dst_contig, src_shift, dst_shift)| {
                let shape: Vec<usize> = specs.iter().map(|s| s.len).collect();
                let src = build_view(&specs, &sperm, true, pad);
                let dspecs: Vec<DimSpec> = specs
                    .iter()
                    .zip(&dmods)
                    .map(|(s, &(step, flip))| {
                        if dst_contig {
                            DimSpec {
                                len: s.len,
                                step: 1,
                                flip: false,
                                bcast: false,
                                extra: 0,
                                start: 0,
                            }
                        } else {
                            DimSpec {
                                len: s.len,
                                step,
                                flip,
                                bcast: false,
                                extra: step - 1,
                                start: 0,
                            }
                        }
                    })
                    .collect();
                let ident: Vec<usize> = (0..shape.len()).collect();
                let dst = build_view(&dspecs, if dst_contig { &ident } else { &dperm }, false, 0);
                Case {
                    e,
                    shape,
                    src,
                    dst,
                    src_shift,
                    dst_shift,
                }
            },
        )
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let e = c.e;
    let src_buf = pattern(c.src.alloc * e + c.src_shift, 7 + c.src.alloc as u64);
    let mut got = pattern(c.dst.alloc * e + c.dst_shift, 99);
    let mut want = got.clone();
    let s_off = c.src_shift + c.src.offset * e;
    let d_off = c.dst_shift + c.dst.offset * e;
    reference(
        &mut want,
        d_off,
        &c.dst.strides,
        &src_buf,
        s_off,
        &c.src.strides,
        &c.shape,
        e,
    );
    // SAFETY: the views were built inside these buffers.
    let r = unsafe {
        copy_strided(
            got.as_mut_ptr().add(d_off),
            &c.dst.strides,
            src_buf.as_ptr().add(s_off),
            &c.src.strides,
            &c.shape,
            e,
        )
    };
    prop_assert!(r.is_ok(), "{r:?}");
    prop_assert!(got == want, "mismatch for {c:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn copy_matches_reference(c in case_strategy()) {
        run_case(&c)?;
    }

    #[test]
    fn fill_matches_reference(c in case_strategy(), v in prop::collection::vec(any::<u8>(), 16)) {
        let e = c.e;
        let value = &v[..e];
        let mut got = pattern(c.dst.alloc * e + c.dst_shift, 5);
        let mut want = got.clone();
        let d_off = c.dst_shift + c.dst.offset * e;
        let zeros = vec![0isize; c.shape.len()];
        reference(&mut want, d_off, &c.dst.strides, value, 0, &zeros, &c.shape, e);
        // SAFETY: the view was built inside this buffer.
        let r = unsafe { fill_strided(got.as_mut_ptr().add(d_off), &c.dst.strides, &c.shape, value) };
        prop_assert!(r.is_ok(), "{r:?}");
        prop_assert!(got == want, "mismatch for {c:?}");
    }
}

fn contiguous(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as isize;
    }
    s
}

/// Copies a permuted view of a dense `src_shape` tensor into a contiguous
/// buffer and checks it against the reference. `shift` misaligns both buffers.
fn check_permute(src_shape: &[usize], perm: &[usize], e: usize, shift: usize) {
    let dense = contiguous(src_shape);
    let shape: Vec<usize> = perm.iter().map(|&p| src_shape[p]).collect();
    let strides: Vec<isize> = perm.iter().map(|&p| dense[p]).collect();
    let n: usize = src_shape.iter().product();
    let src = pattern(n * e + shift, n as u64);
    let mut got = vec![0u8; n * e + shift];
    let mut want = got.clone();
    let dst_strides = contiguous(&shape);
    reference(&mut want, shift, &dst_strides, &src, shift, &strides, &shape, e);
    // SAFETY: both buffers hold the `n` elements after `shift` bytes.
    unsafe {
        copy_strided(
            got.as_mut_ptr().add(shift),
            &dst_strides,
            src.as_ptr().add(shift),
            &strides,
            &shape,
            e,
        )
        .unwrap();
    }
    assert!(
        got == want,
        "permute {src_shape:?} by {perm:?}, e = {e}, shift = {shift}"
    );
}

/// Permutes a dense `src_shape` by `perm` with the source at address ≡
/// `src_at` and the destination at address ≡ `dst_at` (mod 64), checked against
/// the reference, the bytes around the destination untouched.
fn check_permute_at(src_shape: &[usize], perm: &[usize], e: usize, src_at: usize, dst_at: usize) {
    let dense = contiguous(src_shape);
    let shape: Vec<usize> = perm.iter().map(|&p| src_shape[p]).collect();
    let strides: Vec<isize> = perm.iter().map(|&p| dense[p]).collect();
    let n: usize = src_shape.iter().product();
    let at = |v: &Vec<u8>, want: usize| (want + 64 - v.as_ptr() as usize % 64) % 64;
    let src = pattern(n * e + 64, n as u64 ^ 0x5eed);
    let so = at(&src, src_at);
    let mut got = vec![0xA5u8; n * e + 128];
    let d0 = at(&got, dst_at) + 64; // a guard line before the destination
    let mut want = got.clone();
    let dst_strides = contiguous(&shape);
    reference(&mut want, d0, &dst_strides, &src, so, &strides, &shape, e);
    // SAFETY: the source view and the destination lie inside their buffers.
    unsafe {
        copy_strided(
            got.as_mut_ptr().add(d0),
            &dst_strides,
            src.as_ptr().add(so),
            &strides,
            &shape,
            e,
        )
        .unwrap();
    }
    assert!(
        got == want,
        "permute {src_shape:?} by {perm:?}, e = {e}, source at {src_at}, destination at {dst_at} (mod 64)"
    );
}

/// The transpose kernels — AVX-512 and AVX2 (where the CPU has them) and the
/// SSE2 baseline, streamed and not — with source and destination at every kind of alignment:
/// line-aligned tiles, the narrow lead blocks before the first line, partial
/// lines cut off each row, the line buffer of streamed blocks, and operands not
/// aligned to their element (which take the staged route), and the prefetched
/// staging tiles of long runs on both sides, and short runs extended by batch
/// dims. Other tests may run
/// meanwhile with these switches flipped: every combination must be correct.
#[test]
fn transposes_every_alignment_and_kernel() {
    for (avx2, avx512) in [(true, true), (true, false), (false, false)] {
        set_avx2_allowed(avx2);
        set_avx512_allowed(avx512);
        for stream in [Some(1), Some(usize::MAX)] {
            set_stream_threshold(stream);
            for e in [1usize, 2, 3, 4, 8, 16] {
                // Destination rows of at least 4 KiB take line-aligned tiles
                // when their stride is a multiple of a line; others are staged.
                let long = 4096 / e;
                for (src_at, dst_at) in [(0, 0), (16, 16), (0, 48), (32, 4 * e % 64), (e, 0), (1, 3)] {
                    check_permute_at(&[long + 64, 40], &[1, 0], e, src_at, dst_at);
                    check_permute_at(&[long + 3, 37], &[1, 0], e, src_at, dst_at);
                    check_permute_at(&[3, long + 16, 35], &[0, 2, 1], e, src_at, dst_at);
                    check_permute_at(&[67, 131], &[1, 0], e, src_at, dst_at);
                    // Source rows of a few elements with no dim to fold:
                    // 2-byte elements in plain 8 × 8 folded tiles, partial
                    // on both sides.
                    check_permute_at(&[1003, 7], &[1, 0], e, src_at, dst_at);
                    check_permute_at(&[12, 30, 6], &[0, 2, 1], e, src_at, dst_at);
                    // Pixels of 5 to 8 channels to planes (AVX-512 VBMI
                    // permutes from up to four register pairs).
                    check_permute_at(&[2, 37, 7], &[0, 2, 1], e, src_at, dst_at);
                    check_permute_at(&[300, 8], &[1, 0], e, src_at, dst_at);
                    check_permute_at(&[3, 130, 5], &[0, 2, 1], e, src_at, dst_at);
                    // Planes of five channels: folded tiles, streamed too where
                    // a plane's row (a column's destination run) is a page.
                    check_permute_at(&[7, long + 5, 5], &[2, 0, 1], e, src_at, dst_at);
                    check_permute_at(&[5, 33, 3, 40], &[3, 1, 2, 0], e, src_at, dst_at);
                    // Tiles extended on both sides, but not walked in source
                    // order (two batch dims): a destination run of 10 slices,
                    // source runs from 37 (prime) cut into whole blocks and
                    // a shorter last one for 2- and 4-byte elements.
                    check_permute_at(&[9, 10, 37, 4], &[3, 2, 1, 0], e, src_at, dst_at);
                    // Images of three channels, pixels to planes and back (byte
                    // shuffles for elements of 1, 2, 4 and 8 bytes, streamed
                    // where the outputs are 16-byte aligned), with a partial
                    // last block.
                    check_permute_at(&[2, 37, 41, 3], &[0, 3, 1, 2], e, src_at, dst_at);
                    check_permute_at(&[2, 3, 37, 41], &[0, 2, 3, 1], e, src_at, dst_at);
                    // Destination rows a multiple of 4 KiB apart (they share L1
                    // sets): small copies take the large ones' routes, without
                    // prefetches — line tiles, and tiles extended by a batch dim
                    // (3-D and 4-D reversals); the prefetched route's below.
                    check_permute_at(&[long, 37], &[1, 0], e, src_at, dst_at);
                    // Source rows 4 KiB apart (and an element more), whose lines
                    // crowd one L1 set: strips copied to a scratch buffer
                    // first, with partial strips and columns at the ends.
                    if e <= 2 {
                        check_permute_at(&[45, long], &[1, 0], e, src_at, dst_at);
                        check_permute_at(&[40, long + 1], &[1, 0], e, src_at, dst_at);
                    }
                    check_permute_at(&[32, 128 / e, 33], &[2, 1, 0], e, src_at, dst_at);
                    check_permute_at(&[3, 32, 128 / e, 20], &[0, 3, 2, 1], e, src_at, dst_at);
                    // Source runs narrower than a micro tile, extended by a dim
                    // of a length that no block of the wanted size divides (521
                    // is prime): whole blocks, then a shorter one, staged in
                    // groups with a shorter last; small copies (not streamed)
                    // take this route too. Source runs aim at 8 KiB, at most
                    // 256 KiB over a tile's rows and at least 1 KiB: 37 rows
                    // split the dim for 8- and 16-byte elements, 256 rows (1
                    // KiB runs) for the others; 85 = 5 · 17 is taken whole.
                    check_permute_at(&[37, 521, 3], &[2, 1, 0], e, src_at, dst_at);
                    if e <= 4 {
                        check_permute_at(&[256, 521, 3], &[2, 1, 0], e, src_at, dst_at);
                    }
                    check_permute_at(&[37, 85, 3], &[2, 1, 0], e, src_at, dst_at);
                    check_permute_at(&[37, 85, 5], &[2, 1, 0], e, src_at, dst_at);
                    // Rows whose order differs on the two sides, in tiles of
                    // rows walked in destination order (small copies): AVX-512
                    // copies of 64-byte vectors, four at a time, with a last
                    // one overlapping the one before (or masked, under 64
                    // bytes), AVX2 ones of 32-byte pieces and 128-byte blocks
                    // (not streamed), or `copy_run`; rows of whole vectors too.
                    for row in [24, 40, 96, 200, 300] {
                        check_permute_at(&[3, 7, 5, row / e + 1], &[0, 2, 1, 3], e, src_at, dst_at);
                    }
                    for row in [64, 256, 320] {
                        check_permute_at(&[3, 7, 5, row / e], &[0, 2, 1, 3], e, src_at, dst_at);
                    }
                    if stream == Some(1) {
                        // Runs of at least 1 KiB on both sides, streamed: staged
                        // tiles whose next tile's source is prefetched, alone and
                        // batched (a batch slice ends a task's run of tiles).
                        let run = 1024 / e;
                        check_permute_at(&[run + 40, run + 9], &[1, 0], e, src_at, dst_at);
                        if e <= 2 && src_at == dst_at {
                            // Staged from source rows 4 KiB apart: through the scratch.
                            check_permute_at(&[run + 40, 4096 / e], &[1, 0], e, src_at, dst_at);
                            // The same rows into destination rows of whole lines:
                            // for 2-byte elements AVX2's whole-line route where a
                            // core's L2 is 2 MiB or more, else AVX-512's.
                            check_permute_at(&[run + 64, 4096 / e], &[1, 0], e, src_at, dst_at);
                        }
                        // Destination rows of two runs or more: 768-byte runs
                        // for 4-byte elements (512-byte ones where the L2 has
                        // under 16 ways), 256-byte ones for 2-byte elements
                        // from line-aligned rows (and for bytes where the L2
                        // has under 16 ways, or from rows 4 KiB apart above),
                        // 640-byte ones for bytes, 576-byte ones (whole lines)
                        // for 3-byte elements, and a shorter last one; from source rows that are
                        // line-aligned and from rows that are not (tiles of
                        // more source bytes a row for 1- and 2-byte elements).
                        check_permute_at(&[2 * run + 72, run + 64], &[1, 0], e, src_at, dst_at);
                        if matches!(e, 2 | 4 | 8) {
                            // Destination rows a whole number of lines apart
                            // (19): the AVX-512 whole-line tiles where the CPU
                            // has them, with a narrower last band, a last
                            // column narrower than a micro tile, and batched.
                            let rows = 1216 / e;
                            check_permute_at(&[rows, 512 / e + 5], &[1, 0], e, src_at, dst_at);
                            check_permute_at(&[2, rows, 256 / e + 3], &[0, 2, 1], e, src_at, dst_at);
                            // Long source rows: bands of 128 rows for 2-byte
                            // elements (32 or 16 for the others), a shorter
                            // last band, tiles the cap cuts along the rows with
                            // a last one narrower than a micro tile.
                            check_permute_at(&[320, 1100], &[1, 0], e, src_at, dst_at);
                            // Permutes whose destination runs are one or two
                            // lines: one micro tile a slice along the batch, a
                            // source run with a partial micro tile, from
                            // sources not line-aligned (no lead block).
                            let line = 64 / e;
                            check_permute_at(&[line, 3, 5, line], &[3, 1, 2, 0], e, src_at, dst_at);
                            check_permute_at(&[2, 3, line, 5, line + 3], &[0, 3, 1, 4, 2], e, src_at, dst_at);
                            check_permute_at(&[2 * line, 6, line], &[2, 1, 0], e, src_at, dst_at);
                            // Destination rows of 8 KiB and more off line
                            // boundaries (an odd number of elements long): the
                            // sheared AVX-512 tiles for 4- and 8-byte elements,
                            // each row's lines joined from two micro tiles,
                            // after a last band of under a micro tile and of
                            // a micro tile and a bit; batched.
                            let long_row = 8192 / e;
                            for len in [long_row + 3, long_row + line + 1] {
                                check_permute_at(&[len, run + 9], &[1, 0], e, src_at, dst_at);
                            }
                            check_permute_at(&[2, long_row + 5, run + 3], &[0, 2, 1], e, src_at, dst_at);
                            // Source rows 64 KiB apart, every one starting in
                            // the same L2 set: the AVX-512 tiles prefetch the
                            // next tile along the rows all the same.
                            if src_at == dst_at {
                                check_permute_at(&[64, 65536 / e], &[1, 0], e, src_at, dst_at);
                            }
                        }
                        if e == 3 {
                            // Pixels into destination rows of whole lines (a
                            // multiple of 64 pixels) from a line: the AVX-512
                            // kernel where the CPU has VBMI, from source rows of
                            // 100 pixels (a partial last micro tile); batched.
                            check_permute_at(&[384, 100], &[1, 0], e, src_at, dst_at);
                            check_permute_at(&[2, 384, 100], &[0, 2, 1], e, src_at, dst_at);
                            // Streamed from the last-level cache's size on (the
                            // threshold of the streamed runs), into destination
                            // rows of 768 pixels or more: the prefetched route's
                            // tiles of 384 × 128 pixels, partial ones each way.
                            check_permute_at(&[1000, 300], &[1, 0], e, src_at, dst_at);
                        }
                        check_permute_at(&[2 * run + 72, run + 9], &[1, 0], e, src_at, dst_at);
                        check_permute_at(&[3, run + 17, run + 1], &[0, 2, 1], e, src_at, dst_at);
                        // Short source runs (from 128 bytes) under long
                        // destination runs: tall, narrow matrices and batches.
                        check_permute_at(&[run + 40, 128 / e + 1], &[1, 0], e, src_at, dst_at);
                        check_permute_at(&[2, run + 17, 512 / e + 3], &[0, 2, 1], e, src_at, dst_at);
                        // Short runs that batch dims extend: destination runs
                        // only (4-D), both runs (5-D and 6-D, all dims
                        // reversed), and source runs only (5-D, 03142).
                        check_permute_at(&[6, 40, 12, 40], &[3, 0, 2, 1], e, src_at, dst_at);
                        check_permute_at(&[4, 12, 6, 10, 8], &[4, 3, 2, 1, 0], e, src_at, dst_at);
                        check_permute_at(&[4, 6, 3, 5, 10, 8], &[5, 4, 3, 2, 1, 0], e, src_at, dst_at);
                        check_permute_at(&[3, 6, 10, 12, 8], &[0, 3, 1, 4, 2], e, src_at, dst_at);
                        // 03142 with slices of 1 KiB or less contiguous in the
                        // destination: slices of the dim that continues them
                        // joined into one write (six or three of 1- and 2-byte
                        // elements, six of 3-byte ones, three of 4-byte ones,
                        // four of every size), and left apart (longer slices;
                        // byte slices narrower than the AVX2 micro tile).
                        check_permute_at(&[3, 6, 12, 4, 40], &[0, 3, 1, 4, 2], e, src_at, dst_at);
                        check_permute_at(&[2, 6, 8, 3, 24], &[0, 3, 1, 4, 2], e, src_at, dst_at);
                        check_permute_at(&[2, 4, 4, 3, 16], &[0, 3, 1, 4, 2], e, src_at, dst_at);
                        // Source runs narrower than a micro tile (2 and 3
                        // elements), extended: staged together.
                        check_permute_at(&[6, 40, 12, 2], &[3, 2, 1, 0], e, src_at, dst_at);
                        check_permute_at(&[5, 8, 24, 3], &[3, 2, 1, 0], e, src_at, dst_at);
                    }
                }
            }
        }
        // Past the small-copy size (2 MiB) without streaming: the line tiles with
        // ordinary stores.
        set_stream_threshold(Some(usize::MAX));
        for (e, dst_at) in [(1usize, 0usize), (2, 16), (4, 0), (8, 16)] {
            let side = ((3usize << 20) / e).isqrt();
            check_permute_at(&[side, side + 64], &[1, 0], e, 0, dst_at);
        }
        // Small ones with 1 KiB runs on both sides, destination rows 4 KiB
        // apart: the prefetched route's tiles, without the prefetches.
        for (e, at) in [(2usize, 0usize), (4, 16), (8, 0), (16, 48)] {
            check_permute_at(&[4096 / e, 1024 / e], &[1, 0], e, at, at);
        }
    }
    set_stream_threshold(None);
    set_avx2_allowed(true);
    set_avx512_allowed(true);
}

#[test]
fn large_transposes() {
    check_permute(&[1000, 1037], &[1, 0], 4, 0);
    check_permute(&[2048, 2048], &[1, 0], 1, 0);
    check_permute(&[1037, 1000], &[1, 0], 2, 0);
    check_permute(&[513, 700], &[1, 0], 8, 0);
    check_permute(&[300, 257], &[1, 0], 16, 0);
    check_permute(&[301, 259], &[1, 0], 3, 0);
    check_permute(&[200, 301], &[1, 0], 12, 0);
}

/// Streamed transposes on the AVX-512 routes whose source rows do not crowd
/// L2 sets (rows 1100 or 300 elements long), which prefetch each next tile
/// while writing one: 2-D and batched, from and to addresses off a line,
/// with every kernel set; destination rows of 1280 bytes, which start on
/// lines, and of 4- and 8-byte elements 8 KiB and one element long, which
/// do not (the sheared kernels: AVX-512's, or AVX2's for 4-byte elements
/// where the L2 has few ways).
#[test]
fn streamed_transposes_prefetching_the_next_tile() {
    with_each_kernel_and_stream(|| {
        for e in [1usize, 2, 4, 8] {
            let rows = 1280 / e;
            for (src_at, dst_at) in [(0, 0), (16, 0), (3, 40)] {
                check_permute_at(&[rows, 1100], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[3, rows, 300], &[0, 2, 1], e, src_at, dst_at);
                if e >= 4 {
                    check_permute_at(&[8192 / e + 1, 300], &[1, 0], e, src_at, dst_at);
                }
            }
        }
    });
}

/// Row copies whose rows are transposed (B × S × H × D → B × H × S × D,
/// 1203 of four dims), streamed and not, with every kernel set: rows of
/// whole lines (64 bytes to 2 KiB) into line-aligned destination rows (the
/// AVX-512 streaming loop), rows of partial lines, and destinations or
/// sources off a line.
#[test]
fn transposed_rows_of_whole_lines() {
    with_each_kernel_and_stream(|| {
        for (row, e) in [(64usize, 4usize), (128, 2), (192, 4), (256, 8), (2048, 4), (100, 4)] {
            let d = row / e;
            for (src_at, dst_at) in [(0, 0), (16, 0), (0, 40)] {
                check_permute_at(&[3, 37, 5, d], &[0, 2, 1, 3], e, src_at, dst_at);
                check_permute_at(&[6, 7, 5, d], &[1, 2, 0, 3], e, src_at, dst_at);
            }
        }
    });
}

/// 16-byte elements (complex128) in the small tiles of their own, 64
/// destination elements × 8 source elements: whole tiles, partial ones on
/// either side, one tile, several, and batches of them, from and to
/// addresses 16 bytes past a line and not.
#[test]
fn wide_element_small_tiles() {
    for (shape, perm) in [
        (&[100usize, 100][..], &[1usize, 0][..]),
        (&[150, 150], &[1, 0]),
        (&[130, 67], &[1, 0]),
        (&[30, 500], &[1, 0]),
        (&[500, 30], &[1, 0]),
        (&[64, 8], &[1, 0]),
        (&[7, 65, 9], &[0, 2, 1]),
        (&[3, 100, 100], &[2, 1, 0]),
    ] {
        for (src_at, dst_at) in [(0, 0), (16, 16), (16, 48), (32, 0)] {
            check_permute_at(shape, perm, 16, src_at, dst_at);
        }
    }
}

/// Small transposes (cache-resident, not streamed) in AVX2's micro tiles:
/// bytes wherever both sides hold a 32 × 32 tile, wider elements where every
/// operand and row starts on 32 bytes, each with partial tiles at the edges;
/// the same copies off those alignments, which keep SSE2's tiles; and staged
/// byte transposes into rows off a line (3 MB, not streamed). Every kernel
/// set, every result checked.
#[test]
fn small_and_staged_transposes_in_avx2_tiles() {
    with_each_kernel_and_stream(|| {
        for e in [1usize, 2, 4, 8] {
            // Rows of whole 32-byte blocks (192 rows of 320 bytes, 64 × 64
            // elements) and not (200 × 300, 45 × 70, 33 × 1000 elements).
            let (w, h) = (160 / e * 2, 96 / e * 2);
            for (src_at, dst_at) in [(0, 0), (32, 0), (0, 32), (16, 16), (16, 0), (0, 8)] {
                check_permute_at(&[h, w], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[64, 64], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[200, 300], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[45, 70], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[33, 1000], &[1, 0], e, src_at, dst_at);
                check_permute_at(&[8, 64, 96], &[0, 2, 1], e, src_at, dst_at);
                check_permute_at(&[5, 40, 96], &[0, 2, 1], e, src_at, dst_at);
            }
        }
        for (src_at, dst_at) in [(0, 0), (16, 16), (1, 3)] {
            check_permute_at(&[1001, 3000], &[1, 0], 1, src_at, dst_at);
        }
    });
}

/// Byte permutes that batch dims extend (the extension's tiles), from
/// operands on 32 bytes and off them (16, 8, 1 and 3 bytes): slices that
/// hold whole AVX2 micro tiles take them at any alignment (64³ and 48 × 40
/// × 36 reversed, 32⁴ permuted 3021), narrower ones (16⁵ reversed) keep
/// SSE2's. Every kernel set, streamed and not, every result checked.
#[test]
fn extended_byte_permutes_on_and_off_32_bytes() {
    with_each_kernel_and_stream(|| {
        for (src_at, dst_at) in [(0, 0), (16, 0), (8, 16), (1, 3)] {
            check_permute_at(&[64, 64, 64], &[2, 1, 0], 1, src_at, dst_at);
            check_permute_at(&[48, 40, 36], &[2, 1, 0], 1, src_at, dst_at);
            check_permute_at(&[32, 32, 32, 32], &[3, 0, 2, 1], 1, src_at, dst_at);
            check_permute_at(&[16, 16, 16, 16, 16], &[4, 3, 2, 1, 0], 1, src_at, dst_at);
        }
    });
}

/// Every permute of small 8-byte tensors whose unit-stride source side is 2
/// or 3 elements (pixels) and whose destination rows are 9 to 31 of them:
/// the general kernel's row gathers, which AVX-512's folded tiles leave them
/// to; the folded tiles and the others elsewhere (each kernel set), rows
/// off a line and off the elements' alignment.
#[test]
fn small_permutes_of_pixels_of_8_byte_elements() {
    with_each_kernel_and_stream(|| {
        for shape in [
            &[10usize, 12, 14, 3][..],
            &[13, 11, 9, 2],
            &[17, 19, 23, 2],
            &[29, 27, 3],
            &[5, 7, 9, 11, 2],
        ] {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            // Every permutation (Heap's algorithm would do; lexicographic is plainer).
            loop {
                for (src_at, dst_at) in [(0, 0), (16, 40), (8, 3)] {
                    check_permute_at(shape, &perm, 8, src_at, dst_at);
                }
                let Some(i) = (0..perm.len() - 1).rev().find(|&i| perm[i] < perm[i + 1]) else {
                    break;
                };
                let j = (i + 1..perm.len()).rev().find(|&j| perm[j] > perm[i]).unwrap();
                perm.swap(i, j);
                perm[i + 1..].reverse();
            }
        }
    });
}

/// Transposes large enough for the copy pool (256 KiB to 2 MiB, and to 4
/// MiB for 8- and 16-byte elements), whose small tiles go to the threads
/// row block by row block: partial blocks at the ends of both sides, rows
/// that start on lines and rows that do not, batches.
#[test]
fn pooled_small_tiles() {
    for (shape, perm, e) in [
        (&[600usize, 601][..], &[1usize, 0][..], 1usize),
        (&[512, 512], &[1, 0], 2),
        (&[301, 299], &[1, 0], 4),
        (&[200, 300], &[1, 0], 8),
        (&[150, 151], &[1, 0], 16),
        (&[3, 200, 300], &[0, 2, 1], 4),
        (&[64, 64, 65], &[2, 1, 0], 4),
        (&[600, 650], &[1, 0], 8),
        (&[500, 499], &[1, 0], 16),
    ] {
        for (src_at, dst_at) in [(0, 0), (16, 48)] {
            check_permute_at(shape, perm, e, src_at, dst_at);
        }
    }
}

#[test]
fn large_nd_permutes() {
    check_permute(&[16, 100, 130], &[0, 2, 1], 4, 0); // batched transpose
    check_permute(&[4, 64, 8, 32], &[0, 2, 1, 3], 2, 0); // attention permute
    check_permute(&[4, 3, 96, 97], &[0, 2, 3, 1], 4, 0); // NCHW -> NHWC, C = 3
    check_permute(&[4, 96, 97, 3], &[0, 3, 1, 2], 4, 0); // NHWC -> NCHW, C = 3
    check_permute(&[4, 40, 30, 33], &[0, 2, 3, 1], 1, 0);
    // Images of three channels, more pixels than one task piece (16 Ki).
    for e in [1, 2, 4, 8] {
        check_permute(&[3, 130, 131, 3], &[0, 3, 1, 2], e, 0);
        check_permute(&[3, 3, 130, 131], &[0, 2, 3, 1], e, 0);
    }
    check_permute(&[60, 61, 62], &[2, 1, 0], 4, 0);
    check_permute(&[60, 61, 62], &[2, 0, 1], 8, 0);
    check_permute(&[20, 21, 22, 23], &[1, 2, 0, 3], 4, 0);
    check_permute(&[10, 11, 12, 13, 14], &[4, 3, 2, 1, 0], 4, 0);
    // 1 KiB (f32) and 512-byte (f16) slices contiguous in the destination, four
    // and eight joined a write; 4 MiB, streamed where the last-level cache is 32
    // MiB or less.
    check_permute(&[8, 16, 16, 32, 16], &[0, 3, 1, 4, 2], 4, 0);
    check_permute(&[8, 32, 16, 32, 16], &[0, 3, 1, 4, 2], 2, 0);
    check_permute(&[500, 1000, 2], &[1, 0, 2], 2, 0); // widened to u32 pairs
    // Past the direct-tile limit (2 MiB): staged tiles, with a short side.
    check_permute(&[64, 3, 100, 120], &[0, 2, 3, 1], 4, 0);
    check_permute(&[64, 100, 120, 3], &[0, 3, 1, 2], 4, 0);
    check_permute(&[300, 1200], &[1, 0], 8, 0);
    // The first 2 or 3 channels of slices of 64 or more pixels: one pass over
    // the pixels, batched (f32 past the small route, f64 in it too).
    check_permute(&[512, 400, 3], &[2, 1, 0], 4, 1);
    check_permute(&[61, 67, 59, 3], &[3, 2, 0, 1], 4, 0);
    check_permute(&[128, 130, 3], &[2, 1, 0], 8, 0);
    check_permute(&[61, 67, 59, 2], &[3, 0, 2, 1], 8, 1);
}

/// Reversals of five and six dims whose tiles are extended on both sides
/// and walked in source order: power-of-two dims (rows a multiple of 4 KiB
/// apart, crowding the L2's sets: shorter destination runs, the whole tile
/// staged at once) and odd ones, streamed and not, with every kernel and
/// element size.
#[test]
fn reversals_in_source_order_tiles() {
    with_each_kernel_and_stream(|| {
        for e in [1, 2, 4, 8] {
            check_permute(&[16, 16, 8, 16, 16], &[4, 3, 2, 1, 0], e, 0);
            check_permute(&[8, 12, 5, 14, 16], &[4, 3, 2, 1, 0], e, e);
        }
        check_permute(&[8, 8, 4, 8, 8, 8], &[5, 4, 3, 2, 1, 0], 4, 0);
    });
}

/// Rows whose order differs between source and destination, in tiles of
/// rows, at every short row size that has its own fixed-size copy (8, 12,
/// 16, 24 and 32 bytes) and sizes between them, from 1-, 2-, 4- and 8-byte
/// elements, aligned and not.
#[test]
fn row_tiles_of_short_rows() {
    for e in [1usize, 2, 4, 8] {
        for row in [1usize, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40] {
            if row * e > 320 {
                continue;
            }
            for shift in [0, 3] {
                check_permute(&[5, 7, 6, row], &[2, 0, 1, 3], e, shift);
                check_permute(&[9, 31, 29, row], &[1, 2, 0, 3], e, shift);
            }
        }
    }
}

/// Row tiles of copies larger than half of any L2 (8 MiB): rows of 256 and
/// 301 bytes walked in source order, of 41 bytes (under a line) in
/// destination order; through AVX2 copies or `copy_run`, streamed and not,
/// aligned and not.
#[test]
fn row_tiles_of_large_copies() {
    with_each_kernel_and_stream(|| {
        for (rows, row) in [(200_000usize, 41usize), (32_768, 256), (28_000, 301)] {
            let a = 128;
            for (src_at, dst_at) in [(0, 0), (1, 3)] {
                check_permute_at(&[a, rows / a + 1, row], &[1, 0, 2], 1, src_at, dst_at);
            }
        }
    });
}

/// Runs `check` with each kernel set (AVX-512, AVX2 only, neither), streamed
/// and not, then restores the defaults.
fn with_each_kernel_and_stream(check: impl Fn()) {
    for (avx2, avx512) in [(true, true), (true, false), (false, false)] {
        set_avx2_allowed(avx2);
        set_avx512_allowed(avx512);
        for stream in [Some(1), Some(usize::MAX)] {
            set_stream_threshold(stream);
            check();
        }
    }
    set_stream_threshold(None);
    set_avx2_allowed(true);
    set_avx512_allowed(true);
}

/// Byte transposes into line-aligned rows on either side of half the
/// streaming size (here 4 MiB of an 8 MiB threshold), checked against the
/// reference with every kernel set, operands on and off a line. Where they
/// stream (from 1 MiB on most CPUs, later where the L2 has few ways) and the
/// CPU has AVX-512: its route below that size, above it AVX2's whole-line
/// route from rows that spread over L1 sets and the prefetched one from rows
/// that crowd them (rows 2 KiB apart). Other tests set the same switches
/// meanwhile: any route must copy right.
#[test]
fn byte_transposes_around_half_the_streaming_size() {
    for (avx2, avx512) in [(true, true), (true, false), (false, false)] {
        set_avx2_allowed(avx2);
        set_avx512_allowed(avx512);
        set_stream_threshold(Some(8 << 20));
        for (src_at, dst_at) in [(0, 0), (5, 40)] {
            check_permute_at(&[1088, 1100], &[1, 0], 1, src_at, dst_at);
            check_permute_at(&[2112, 2100], &[1, 0], 1, src_at, dst_at);
            check_permute_at(&[2048, 2048], &[1, 0], 1, src_at, dst_at);
            check_permute_at(&[3, 1024, 1536], &[0, 2, 1], 1, src_at, dst_at);
        }
    }
    set_stream_threshold(None);
    set_avx2_allowed(true);
    set_avx512_allowed(true);
}

/// Streamed 2- and 4-byte permutes whose runs are 64 to 96 elements on both
/// sides, which take AVX2's whole-line route instead of AVX-512's where the
/// L2 has few ways (a Zen 4 VM; the AVX-512 route elsewhere), and 3-byte
/// pixels and rows off line boundaries, which leave the AVX-512 routes there
/// for the prefetched one: checked against the reference with every kernel
/// set, operands on and off a line.
#[test]
fn streamed_permutes_of_short_whole_line_runs() {
    with_each_kernel_and_stream(|| {
        for (src_at, dst_at) in [(0, 0), (16, 0), (0, 8)] {
            check_permute_at(&[8, 64, 16, 64], &[3, 0, 2, 1], 4, src_at, dst_at);
            check_permute_at(&[2, 96, 8, 80], &[0, 3, 2, 1], 4, src_at, dst_at);
            check_permute_at(&[8, 64, 16, 64], &[3, 0, 2, 1], 2, src_at, dst_at);
            check_permute_at(&[64, 70, 66], &[2, 1, 0], 2, src_at, dst_at);
            check_permute_at(&[257, 255], &[1, 0], 4, src_at, dst_at);
            check_permute_at(&[128, 96], &[1, 0], 3, src_at, dst_at);
        }
    });
}

/// Transposes past the small-copy size (2 MiB) of 4- and 8-byte elements
/// with destination runs under 1 KiB (few long source rows): folded tiles
/// where the CPU has AVX-512, staged ones elsewhere; streamed and not, with
/// every kernel, aligned, off a line, and off the elements' alignment.
#[test]
fn large_transposes_of_few_long_rows() {
    with_each_kernel_and_stream(|| {
        for (src_at, dst_at) in [(0, 0), (16, 40), (1, 3)] {
            check_permute_at(&[61, 5003], &[1, 0], 8, src_at, dst_at);
            check_permute_at(&[100, 6001], &[1, 0], 4, src_at, dst_at);
            check_permute_at(&[61, 67, 59, 3], &[0, 2, 3, 1], 8, src_at, dst_at);
        }
    });
}

/// Transposes whose runs are 1 KiB or more on both sides, into line-aligned
/// destination rows, from source rows whose lines spread over L1 sets: AVX2's
/// whole-line tiles when streamed on a CPU without AVX-512 (its own route
/// where it has it), of 1-, 2- and 4-byte elements, with every kernel set,
/// streamed and not; several tiles each way and partial ones, edge rows and
/// columns, a batch dim, operands on and off a line, and source rows flipped.
#[test]
fn whole_line_tiles_from_spread_rows() {
    with_each_kernel_and_stream(|| {
        for (src_at, dst_at) in [(0, 0), (16, 40), (33, 0)] {
            check_permute_at(&[1088, 1100], &[1, 0], 1, src_at, dst_at);
            check_permute_at(&[576, 1030], &[1, 0], 2, src_at, dst_at);
            check_permute_at(&[2, 320, 300], &[0, 2, 1], 4, src_at, dst_at);
            check_permute_at(&[3, 256, 1100], &[0, 2, 1], 1, src_at, dst_at);
        }
        // Rows read bottom up: x[::-1].T of 1152 × 1040 bytes.
        for e in [1, 2, 4] {
            let (rows, cols) = (1152 / e, 1040 / e);
            let src = pattern(rows * cols * e, e as u64);
            let mut got = vec![0u8; rows * cols * e];
            let mut want = got.clone();
            let (shape, dst_strides, src_strides) = ([cols, rows], [rows as isize, 1], [1, -(cols as isize)]);
            let last = (rows - 1) * cols * e;
            reference(&mut want, 0, &dst_strides, &src, last, &src_strides, &shape, e);
            // SAFETY: the view's elements lie inside `src`, the destination's in `got`.
            unsafe {
                copy_strided(
                    got.as_mut_ptr(),
                    &dst_strides,
                    src.as_ptr().add(last),
                    &src_strides,
                    &shape,
                    e,
                )
                .unwrap();
            }
            assert!(got == want, "flipped rows, e = {e}");
        }
    });
}

/// AVX2's whole-line tiles of 4- and 2-byte elements from source rows a
/// multiple of 4 KiB apart, whose lines crowd one L1 set (the kernel reads 8
/// rows' whole lines at a time of 4-byte ones, 32 rows' half lines of 2-byte
/// ones), in their shorter tiles: 4, 8 and 12 KiB apart, a batch dim,
/// partial tiles each way, line-aligned destination rows, operands on and
/// off a line, with every kernel set, streamed and not.
#[test]
fn whole_line_tiles_from_rows_pages_apart() {
    with_each_kernel_and_stream(|| {
        for (src_at, dst_at) in [(0, 0), (16, 0), (4, 40)] {
            check_permute_at(&[336, 1024], &[1, 0], 4, src_at, dst_at);
            check_permute_at(&[2, 272, 1024], &[0, 2, 1], 4, src_at, dst_at);
            check_permute_at(&[304, 3072], &[1, 0], 4, src_at, dst_at);
            check_permute_at(&[336, 2048], &[1, 0], 2, src_at, dst_at);
            check_permute_at(&[2, 272, 4096], &[0, 2, 1], 2, src_at, dst_at);
        }
    });
}

#[test]
fn unaligned_pointers() {
    for shift in [1, 3, 5] {
        check_permute(&[300, 301], &[1, 0], 4, shift);
        check_permute(&[300, 301], &[1, 0], 8, shift);
        check_permute(&[300, 301], &[1, 0], 2, shift);
        check_permute(&[300, 301], &[1, 0], 16, shift);
        check_permute(&[700, 701], &[0, 1], 4, shift);
        check_permute(&[7, 80, 90], &[0, 2, 1], 4, shift);
    }
}

#[test]
fn wide_elements() {
    check_permute(&[30, 40], &[1, 0], 24, 0);
    check_permute(&[30, 40], &[1, 0], 32, 3);
    check_permute(&[30, 40], &[0, 1], 100, 0);
    let mut buf = vec![0u8; 5 * 7 * 20];
    let value: Vec<u8> = (0..20).collect();
    // SAFETY: 35 elements of 20 bytes.
    unsafe { fill_strided(buf.as_mut_ptr(), &[1, 5], &[5, 7], &value).unwrap() };
    assert!(buf.chunks(20).all(|c| c == value.as_slice()));
}

#[test]
fn dst_self_overlap_is_rejected() {
    let src = [0u8; 64];
    let mut dst = vec![0u8; 64];
    // SAFETY: every address used is inside the 64-byte buffers.
    unsafe {
        let r = copy_strided(dst.as_mut_ptr(), &[0, 1], src.as_ptr(), &[4, 1], &[4, 4], 4);
        assert!(matches!(r, Err(Error::OverlappingDestination)), "{r:?}");
        let r = copy_strided(dst.as_mut_ptr(), &[2, 1], src.as_ptr(), &[4, 1], &[4, 4], 2);
        assert!(matches!(r, Err(Error::OverlappingDestination)), "{r:?}");
        let r = fill_strided(dst.as_mut_ptr(), &[0], &[3], &[1, 2]);
        assert!(matches!(r, Err(Error::OverlappingDestination)), "{r:?}");
        // A single element through a zero stride is fine.
        copy_strided(dst.as_mut_ptr(), &[0], src.as_ptr(), &[0], &[1], 4).unwrap();
    }
}

/// Destinations whose rows interleave but whose elements are distinct, as
/// NumPy and torch write them: rows of every other element, each starting
/// one element past the end of the row before's first half. Copies from
/// dense, transposed and broadcast sources and fills, of 1 to 16-byte
/// elements, large enough to split across threads, with every kernel set;
/// the bytes between elements stay as they were.
#[test]
fn interleaved_destinations_of_distinct_elements_are_written() {
    let src: Vec<u32> = (1..=6).collect();
    let mut dst = vec![0u32; 8];
    // SAFETY: addresses 0 2 4 / 3 5 7 of 8 elements; the source is dense.
    unsafe {
        copy_strided(
            dst.as_mut_ptr().cast(),
            &[3, 2],
            src.as_ptr().cast(),
            &[3, 1],
            &[2, 3],
            4,
        )
        .unwrap()
    };
    assert_eq!(dst, [1, 0, 2, 4, 3, 5, 0, 6]);

    let (rows, cols) = (256usize, 1000usize);
    let shape = [rows, cols];
    let dst_strides = [2 * cols as isize - 999, 2]; // row r: 1001·r + 2·c
    let len = 1001 * (rows - 1) + 2 * (cols - 1) + 1;
    with_each_kernel_and_stream(|| {
        for e in [1, 2, 4, 8, 16] {
            let data = pattern(rows * cols * e, e as u64);
            for src_strides in [[cols as isize, 1], [1, rows as isize], [0, 1]] {
                let mut buf = pattern(len * e, 7);
                let mut want = buf.clone();
                reference(&mut want, 0, &dst_strides, &data, 0, &src_strides, &shape, e);
                // SAFETY: every element of both layouts lies inside its buffer.
                unsafe {
                    copy_strided(buf.as_mut_ptr(), &dst_strides, data.as_ptr(), &src_strides, &shape, e).unwrap()
                };
                assert!(buf == want, "e={e} src {src_strides:?}");
            }
            let mut buf = pattern(len * e, 9);
            let mut want = buf.clone();
            reference(&mut want, 0, &dst_strides, &data, 0, &[0, 0], &shape, e);
            // SAFETY: as above; the value is the first element of `data`.
            unsafe { fill_strided(buf.as_mut_ptr(), &dst_strides, &shape, &data[..e]).unwrap() };
            assert!(buf == want, "fill e={e}");
        }
    });
}

#[test]
fn errors() {
    let src = [0u8; 64];
    let mut dst = vec![0u8; 64];
    // SAFETY: nothing is accessed: each call fails validation or is empty.
    unsafe {
        let r = copy_strided(dst.as_mut_ptr(), &[1], src.as_ptr(), &[1, 1], &[4], 4);
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}");
        let r = copy_strided(dst.as_mut_ptr(), &[1, 1], src.as_ptr(), &[1], &[4], 4);
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}");
        let r = copy_strided(dst.as_mut_ptr(), &[1], src.as_ptr(), &[1], &[4], 0);
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
        let r = copy_strided(dst.as_mut_ptr(), &[1], src.as_ptr(), &[isize::MAX], &[4], 4);
        assert!(matches!(r, Err(Error::Overflow { .. })), "{r:?}");
        let r = copy_strided(dst.as_mut_ptr(), &[1, 1], src.as_ptr(), &[1, 1], &[usize::MAX, 4], 1);
        assert!(matches!(r, Err(Error::Overflow { .. })), "{r:?}");
        let r = fill_strided(dst.as_mut_ptr(), &[1], &[4], &[]);
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
        // Empty copies succeed and touch nothing.
        copy_strided(dst.as_mut_ptr(), &[1, 0], src.as_ptr(), &[0, 0], &[0, 5], 4).unwrap();
        copy_strided(dst.as_mut_ptr(), &[], src.as_ptr(), &[], &[], 4).unwrap();
    }
    assert!(dst[4..].iter().all(|&b| b == 0));
}

/// Runs an in-buffer copy and compares with the same copy from a snapshot.
fn check_overlapping(
    len: usize,
    e: usize,
    dst_off: usize,
    dst_strides: &[isize],
    src_off: usize,
    src_strides: &[isize],
    shape: &[usize],
) {
    let mut buf = pattern(len * e, 3);
    let snapshot = buf.clone();
    let mut want = buf.clone();
    reference(
        &mut want,
        dst_off * e,
        dst_strides,
        &snapshot,
        src_off * e,
        src_strides,
        shape,
        e,
    );
    // SAFETY: both views lie inside `buf`.
    unsafe {
        let p = buf.as_mut_ptr();
        copy_strided(
            p.add(dst_off * e),
            dst_strides,
            p.add(src_off * e),
            src_strides,
            shape,
            e,
        )
        .unwrap();
    }
    assert!(
        buf == want,
        "overlapping copy {shape:?} dst {dst_strides:?}@{dst_off} src {src_strides:?}@{src_off}"
    );
}

#[test]
fn overlapping_src_and_dst() {
    // Shift by one element, both directions, small and large (parallel).
    check_overlapping(1001, 4, 1, &[1], 0, &[1], &[1000]);
    check_overlapping(1001, 4, 0, &[1], 1, &[1], &[1000]);
    check_overlapping(600_001, 4, 1, &[1], 0, &[1], &[600_000]);
    check_overlapping(600_001, 2, 0, &[1], 1, &[1], &[600_000]);
    // Reverse in place.
    check_overlapping(1000, 4, 0, &[1], 999, &[-1], &[1000]);
    check_overlapping(1000, 4, 999, &[-1], 0, &[1], &[1000]);
    // In-place transpose of a square matrix, small and blocked sizes.
    check_overlapping(64 * 64, 4, 0, &[64, 1], 0, &[1, 64], &[64, 64]);
    check_overlapping(700 * 700, 8, 0, &[700, 1], 0, &[1, 700], &[700, 700]);
    // Broadcast of a row over the rows of the same buffer.
    check_overlapping(50 * 40, 4, 0, &[40, 1], 40, &[0, 1], &[50, 40]);
    // Identical layouts: a no-op.
    check_overlapping(100, 3, 0, &[10, 1], 0, &[10, 1], &[10, 10]);
    // Fill whose value aliases the destination.
    let mut buf: Vec<u8> = (0..64).collect();
    let v: Vec<u8> = buf[4..8].to_vec();
    // SAFETY: 16 elements of 4 bytes; the value is read from inside the buffer.
    unsafe {
        let p = buf.as_mut_ptr();
        fill_strided(p, &[1], &[16], std::slice::from_raw_parts(p.add(4), 4)).unwrap();
    }
    assert!(buf.chunks(4).all(|c| c == v.as_slice()));
}

#[test]
fn interleaved_views_of_one_buffer_are_copied_correctly() {
    // Byte ranges that overlap while no element does, with every kernel,
    // small and large (streamed): the engine copies them in place (the
    // decision itself is `views_may_share`'s, tested in the planner).
    with_each_kernel_and_stream(|| {
        for e in [1, 2, 4, 8, 16] {
            // Even columns from odd ones.
            check_overlapping(64 * 128, e, 0, &[128, 2], 1, &[128, 2], &[64, 64]);
            check_overlapping(1024 * 1024, e, 1, &[1024, 2], 0, &[1024, 2], &[1024, 512]);
            // The left half of each row from the right half.
            check_overlapping(512 * 1024, e, 0, &[1024, 1], 512, &[1024, 1], &[512, 512]);
            // A plane of 4-channel pixels from another.
            check_overlapping(300 * 200 * 4, e, 2, &[800, 4], 0, &[800, 4], &[300, 200]);
            // Even columns from the transpose of the odd ones.
            check_overlapping(600 * 1200, e, 0, &[1200, 2], 1, &[2, 1200], &[600, 600]);
            // Real parts from imaginary parts.
            check_overlapping(2 * 300_000, e, 0, &[2], 1, &[2], &[300_000]);
        }
    });
}

/// Copies `shape` elements of `e` bytes from `src` (at byte `so`, strides
/// `ss`) into a patterned buffer of `dst_len` bytes (at byte `dof`, strides
/// `ds`), against the reference: the elements and the bytes between them.
#[allow(clippy::too_many_arguments)]
fn check_copy(
    src: &[u8],
    so: usize,
    ss: &[isize],
    dst_len: usize,
    dof: usize,
    ds: &[isize],
    shape: &[usize],
    e: usize,
) {
    let mut got = pattern(dst_len, 0xd57);
    let mut want = got.clone();
    reference(&mut want, dof, ds, src, so, ss, shape, e);
    // SAFETY: every element of both views lies inside its buffer.
    unsafe { copy_strided(got.as_mut_ptr().add(dof), ds, src.as_ptr().add(so), ss, shape, e).unwrap() };
    assert!(
        got == want,
        "{shape:?} e = {e}: source {ss:?} at {so}, destination {ds:?} at {dof}"
    );
}

/// Transposes of strided views (`x[:, ::k].T`, a complex matrix's real parts
/// transposed), flipped, batched, into dense and strided destinations: no
/// side has a unit stride. Those whose rows crowd the cache sets go in
/// tiles (which depends on the host's L2 for most; the last cases on none).
#[test]
fn transposes_of_strided_views() {
    with_each_kernel_and_stream(|| {
        for e in [1, 2, 4, 8, 16] {
            for (rows, cols, k) in [(8, 8, 2), (37, 300, 2), (300, 37, 3), (520, 700, 2), (1030, 64, 4)] {
                let (n, pitch) = (rows * cols * k, (cols * k) as isize);
                let src = pattern(2 * n * e, (rows * k + e) as u64);
                let (shape, step) = ([cols, rows], k as isize);
                let dense = [rows as isize, 1];
                check_copy(&src, 0, &[step, pitch], n * e, 0, &dense, &shape, e);
                // x[:, ::-k].T, from the last column.
                let last = (cols - 1) * k * e;
                check_copy(&src, last, &[-step, pitch], n * e, 0, &dense, &shape, e);
                // Into every other element of wider rows.
                check_copy(
                    &src,
                    0,
                    &[step, pitch],
                    2 * n * e,
                    e,
                    &[2 * rows as isize, 2],
                    &shape,
                    e,
                );
                // Two such matrices, a batch.
                let batched = [2, cols, rows];
                check_copy(
                    &src,
                    0,
                    &[n as isize, step, pitch],
                    2 * n * e,
                    0,
                    &[(rows * cols) as isize, rows as isize, 1],
                    &batched,
                    e,
                );
            }
            // Rows 64 KiB apart crowd the sets of any L2 (and of L1): these
            // take the tiles on every host.
            let pitch = (64 << 10) / e;
            let src = pattern(64 * pitch * e, e as u64);
            let (shape, dense) = ([40, 64], [64, 1]);
            check_copy(&src, 0, &[2, pitch as isize], 40 * 64 * e, 0, &dense, &shape, e);
            check_copy(&src, 78 * e, &[-2, pitch as isize], 40 * 64 * e, 0, &dense, &shape, e);
            // One channel of 3 transposed from rows 4 KiB apart (every line of
            // a sweep in one L1 set: tiled for every element size), in tiles
            // whose both sides end ragged (77 = 2 · 32 + 13, 45 = 32 + 13),
            // into a destination one element off its start.
            let (rows, cols, pitch) = (77usize, 45usize, 4096 / e);
            let src = pattern(rows * pitch * e, 3 * e as u64);
            let (n, dense) = (rows * cols, [rows as isize, 1]);
            check_copy(&src, e, &[3, pitch as isize], (n + 1) * e, e, &dense, &[cols, rows], e);
        }
    });
}

#[test]
fn broadcast_and_fill_large() {
    // [1, N] -> [M, N] and [M, 1] -> [M, N], beyond the parallel threshold.
    let (m, n) = (600, 500);
    let src = pattern(m.max(n) * 4, 11);
    for strides in [[0isize, 1], [1, 0], [0, 0]] {
        let mut got = vec![0u8; m * n * 4];
        let mut want = got.clone();
        reference(&mut want, 0, &[n as isize, 1], &src, 0, &strides, &[m, n], 4);
        // SAFETY: the views fit both buffers.
        unsafe { copy_strided(got.as_mut_ptr(), &[n as isize, 1], src.as_ptr(), &strides, &[m, n], 4).unwrap() };
        assert!(got == want, "broadcast {strides:?}");
    }
    for e in [1usize, 2, 3, 4, 5, 8, 12, 16] {
        let value: Vec<u8> = (1..=e as u8).collect();
        let mut got = vec![0u8; 200_000 * e];
        // SAFETY: 200 000 elements.
        unsafe { fill_strided(got.as_mut_ptr(), &[1], &[200_000], &value).unwrap() };
        assert!(got.chunks(e).all(|c| c == value.as_slice()), "fill e = {e}");
        // Strided destination: every other element.
        let mut got = vec![0u8; 200_000 * e];
        // SAFETY: 100 000 elements at stride 2 fit the buffer.
        unsafe { fill_strided(got.as_mut_ptr(), &[2], &[100_000], &value).unwrap() };
        assert!(got.chunks(e).step_by(2).all(|c| c == value.as_slice()));
        assert!(got.chunks(e).skip(1).step_by(2).all(|c| c.iter().all(|&b| b == 0)));
    }
}

/// Reversed rows (`x[:, ::-1]`) of every element size and length around the
/// vector widths, at odd addresses and at element-aligned ones off a line,
/// with the AVX2 reversals (where the CPU has them) and without, streamed
/// (whole destination lines straight from the shuffles) and not.
#[test]
fn reversals_every_element_size_and_kernel() {
    let (streamed, cached) = (Some(1), Some(usize::MAX));
    for (avx2, stream) in [(true, streamed), (true, cached), (false, streamed), (false, cached)] {
        set_avx2_allowed(avx2);
        set_stream_threshold(stream);
        for e in [1usize, 2, 3, 4, 8, 16] {
            for n in [1usize, 7, 31, 32, 33, 63, 64, 65, 100, 1000] {
                for shift in [0usize, 1, 3 * e] {
                    let m = 3;
                    let src = pattern(m * n * e + shift, (n * e) as u64);
                    let mut got = vec![0u8; m * n * e + shift];
                    let mut want = got.clone();
                    let (strides, off) = ([n as isize, -1], shift + (n - 1) * e);
                    reference(&mut want, shift, &[n as isize, 1], &src, off, &strides, &[m, n], e);
                    // SAFETY: the reversed rows lie inside `src`, the destination inside `got`.
                    unsafe {
                        copy_strided(
                            got.as_mut_ptr().add(shift),
                            &[n as isize, 1],
                            src.as_ptr().add(off),
                            &strides,
                            &[m, n],
                            e,
                        )
                        .unwrap()
                    };
                    assert!(
                        got == want,
                        "reversed rows of {n}, e = {e}, shift = {shift}, avx2 = {avx2}, stream = {stream:?}"
                    );
                }
            }
        }
    }
    set_stream_threshold(None);
    set_avx2_allowed(true);
}

#[test]
fn sliced_rows_and_flips() {
    // Row sizes of every specialised short-row copy (4..128 bytes), the
    // inline-run bounds (256 bytes, 16 KiB) and past them.
    for k in [1usize, 2, 3, 4, 8, 16, 25, 32, 64, 65, 1024, 4095, 4096, 4097, 5000] {
        let (m, n) = (257, k + 7);
        let src = pattern(m * n * 4, k as u64);
        let mut got = vec![0u8; m * k * 4];
        let mut want = got.clone();
        reference(&mut want, 0, &[k as isize, 1], &src, 0, &[n as isize, 1], &[m, k], 4);
        // SAFETY: the view x[:, :k] lies inside `src`.
        unsafe {
            copy_strided(
                got.as_mut_ptr(),
                &[k as isize, 1],
                src.as_ptr(),
                &[n as isize, 1],
                &[m, k],
                4,
            )
            .unwrap()
        };
        assert!(got == want, "sliced rows k = {k}");
    }
    // Bytes rows at odd addresses on both sides.
    for k in [4usize, 63, 64, 128, 255, 257, 1000, 3001, 16_385] {
        let (m, n) = (67, 2 * k + 3);
        let src = pattern(m * n + 1, k as u64);
        let mut got = vec![0u8; m * k + 1];
        let mut want = got.clone();
        reference(&mut want, 1, &[k as isize, 1], &src, 1, &[n as isize, 1], &[m, k], 1);
        // SAFETY: the view x[:, :k] one byte in lies inside `src`, the
        // destination rows one byte in inside `got`.
        unsafe {
            copy_strided(
                got.as_mut_ptr().add(1),
                &[k as isize, 1],
                src.as_ptr().add(1),
                &[n as isize, 1],
                &[m, k],
                1,
            )
            .unwrap()
        };
        assert!(got == want, "odd-address byte rows k = {k}");
    }
    let (m, n) = (513, 600);
    let src = pattern(m * n * 2, 1);
    for (strides, off) in [
        ([n as isize, -1], n - 1),
        ([-(n as isize), 1], (m - 1) * n),
        ([-(n as isize), -1], m * n - 1),
    ] {
        let mut got = vec![0u8; m * n * 2];
        let mut want = got.clone();
        reference(&mut want, 0, &[n as isize, 1], &src, off * 2, &strides, &[m, n], 2);
        // SAFETY: the flipped view lies inside `src`.
        unsafe {
            copy_strided(
                got.as_mut_ptr(),
                &[n as isize, 1],
                src.as_ptr().add(off * 2),
                &strides,
                &[m, n],
                2,
            )
            .unwrap()
        };
        assert!(got == want, "flip {strides:?}");
    }
}

/// Short rows (32 to 64 bytes, a pointer walk; 128 and 256 bytes, AVX2's whole-row loop) and rows of
/// 257 bytes to 2 KiB (its loop over a slice's rows) of 4-byte elements: slices of a matrix whose
/// rows are a few or many row lengths apart (sparse rows keep ordinary stores where a copy
/// streams), under two outer dims that do not merge, flipped, off the elements' alignment, split
/// across threads, with each kernel, streamed and not.
#[test]
fn row_loops_of_short_and_mid_rows() {
    const E: usize = 4;
    with_each_kernel_and_stream(|| {
        // (row, source row stride), in elements: a few lengths apart or a
        // page and more.
        for (row, pitch) in [
            (8usize, 1024usize),
            (16, 20),
            (32, 50),
            (32, 2048),
            (64, 75),
            (64, 1024),
            (65, 75),
            (96, 1024),
            (250, 275),
            (250, 1000),
            (511, 2048),
        ] {
            // (planes, rows a plane): 1 × 1100 (one outer dim, past the
            // threads' split), 5 × 60 (two outer dims: planes one row more
            // apart than their rows fill; past the tiny copies' 2 KiB).
            for (planes, rows) in [(1usize, 1100usize), (5, 60)] {
                for (flip, shift) in [(false, 0usize), (false, 3), (true, 1)] {
                    let plane = (rows + 1) * pitch;
                    let src = pattern(planes * plane * E + shift, (row + pitch + rows) as u64);
                    let mut got = vec![0u8; planes * rows * row * E + shift];
                    let mut want = got.clone();
                    let shape = [planes, rows, row];
                    let (mut src_strides, mut off) = ([plane as isize, pitch as isize, 1], shift);
                    if flip {
                        src_strides[1] = -(pitch as isize);
                        off += (rows - 1) * pitch * E;
                    }
                    let dst_strides = [(rows * row) as isize, row as isize, 1];
                    reference(&mut want, shift, &dst_strides, &src, off, &src_strides, &shape, E);
                    // SAFETY: every row of the view lies inside `src` (the
                    // flipped one's first row at `off`), every destination row
                    // inside `got` past `shift`.
                    unsafe {
                        copy_strided(
                            got.as_mut_ptr().add(shift),
                            &dst_strides,
                            src.as_ptr().add(off),
                            &src_strides,
                            &shape,
                            E,
                        )
                        .unwrap()
                    };
                    assert!(
                        got == want,
                        "{planes} × {rows} rows of {row} elements, {pitch} apart, flipped {flip}, shift {shift}"
                    );
                }
            }
        }
    });
}

/// A few columns of a matrix whose rows lie a page or more apart (the gather
/// that copies each row's lanes one by one), for several element sizes and
/// at odd addresses.
#[test]
fn narrow_columns_of_wide_rows() {
    // 37 rows: copies of at most 2 KiB (the tiny path); 2100 rows: over 2 KiB
    // for every column count, the short-row walk with its prefetches.
    for (e, n) in [(4usize, 1024usize), (4, 2048), (2, 4096), (8, 600), (1, 8192)] {
        for (m, k, shift) in [37usize, 2100].into_iter().flat_map(|m| {
            let ks: &[usize] = if m < 100 { &[1, 2, 3, 4, 5, 8] } else { &[1, 3, 8] };
            ks.iter().flat_map(move |&k| [0usize, 1, 4].map(|shift| (m, k, shift)))
        }) {
            let src = pattern(m * n * e + shift, (k * e) as u64);
            let mut got = vec![0u8; m * k * e];
            let mut want = got.clone();
            let off = shift + 3 * e;
            reference(&mut want, 0, &[k as isize, 1], &src, off, &[n as isize, 1], &[m, k], e);
            // SAFETY: the view x[:, 3:3+k] lies inside `src`.
            unsafe {
                copy_strided(
                    got.as_mut_ptr(),
                    &[k as isize, 1],
                    src.as_ptr().add(off),
                    &[n as isize, 1],
                    &[m, k],
                    e,
                )
                .unwrap()
            };
            assert!(
                got == want,
                "{m} rows of {k} columns, e = {e}, row stride {n}, shift = {shift}"
            );
        }
    }
}

/// Channels of pixels of 2 to 8 elements: one (`x[:, 1]` of an `n × s`
/// matrix, a gather of every `s`-th element) and the first `k` transposed
/// to planes (`x[:, :k].T`), AVX-512 VBMI permutes where the CPU has them,
/// with a last partial vector, at odd addresses; the source ends at the
/// last element of the view.
#[test]
fn channels_of_pixels() {
    for e in [1usize, 2, 4, 8] {
        // Pixels of 2 to 8 elements (split512), and wider ones, whose first
        // few channels go one pass over the pixels (gathered a channel at a
        // time where AVX2 is off).
        for s in (2..=8usize).chain([10, 13, 20, 64]) {
            // Wider pixels: 40001 of them reach past the L2 (one pass for up
            // to 3 channels at any size).
            let ns: &[usize] = if s <= 8 { &[3001, 70001] } else { &[301, 3001, 40001] };
            for (n, shift) in ns.iter().flat_map(|&n| [0usize, 1, 5].map(|shift| (n, shift))) {
                let src = pattern((n - 1) * s * e + 2 * e + shift, (s * e) as u64);
                let mut got = vec![0u8; n * e];
                let mut want = got.clone();
                let off = shift + e;
                reference(&mut want, 0, &[1], &src, off, &[s as isize], &[n], e);
                // SAFETY: the view x[:, 1] of the `n × s` matrix at `shift` lies inside `src`.
                unsafe { copy_strided(got.as_mut_ptr(), &[1], src.as_ptr().add(off), &[s as isize], &[n], e).unwrap() };
                assert!(got == want, "channel 1 of {n} pixels of {s}, e = {e}, shift = {shift}");
                let ks = if s <= 8 { vec![2, s - 1, s] } else { vec![2, 3, 4, 5, 8] };
                for k in ks.into_iter().filter(|&k| k >= 2) {
                    let src = pattern((n - 1) * s * e + k * e + shift, (s * e + k) as u64);
                    let mut got = vec![0u8; k * n * e];
                    let mut want = got.clone();
                    let (dst_strides, src_strides) = ([n as isize, 1], [1, s as isize]);
                    reference(&mut want, 0, &dst_strides, &src, shift, &src_strides, &[k, n], e);
                    // SAFETY: the view x[:, :k].T of the `n × s` matrix at
                    // `shift` lies inside `src`, ending at its last element.
                    unsafe {
                        copy_strided(
                            got.as_mut_ptr(),
                            &dst_strides,
                            src.as_ptr().add(shift),
                            &src_strides,
                            &[k, n],
                            e,
                        )
                        .unwrap()
                    };
                    assert!(
                        got == want,
                        "channels :{k} of {n} pixels of {s}, e = {e}, shift = {shift}"
                    );
                }
            }
        }
    }
}

/// `bytes` copied to the end of a mapping whose next page is inaccessible:
/// a read past the last byte faults, where in a `Vec` it would go unseen.
#[cfg(target_os = "linux")]
struct GuardedSource {
    map: *mut libc::c_void,
    map_len: usize,
    start: *const u8,
}

#[cfg(target_os = "linux")]
impl GuardedSource {
    fn new(bytes: &[u8]) -> GuardedSource {
        const PAGE: usize = 4096;
        let data = bytes.len().div_ceil(PAGE).max(1) * PAGE;
        let map_len = data + PAGE;
        // SAFETY: a fresh private anonymous mapping; the guard page is inside
        // it; `bytes` is copied into its readable part, ending at the guard.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            let guard = map.cast::<u8>().add(data);
            assert_eq!(libc::mprotect(guard.cast(), PAGE, libc::PROT_NONE), 0, "mprotect");
            let start = guard.sub(bytes.len());
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start, bytes.len());
            GuardedSource { map, map_len, start }
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for GuardedSource {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// Pixels of 5 to 8 channels, and the first 2 to 8 of wider ones, to planes
/// (`x[:, :k].T` of an `n × s` matrix, and batches of them), from sources
/// that end at the last pixel's last channel before an inaccessible page:
/// the SSE2 and AVX steps read eight elements of each pixel (8-byte ones:
/// four where `k ≤ 4`), and the pixels whose reads would pass the end go one
/// by one. Every length from 1 to 40 (no step, a step, whole steps, a last
/// step over the one before), alone and batched past the tiny copies, with
/// every kernel switch (the AVX-512 one takes these pixels first where the
/// CPU has it).
#[cfg(target_os = "linux")]
#[test]
fn wide_pixels_to_planes_read_no_further_than_the_source() {
    with_each_kernel_and_stream(|| {
        for e in [1usize, 2, 4, 8] {
            for k in 2..=8usize {
                for s in [k, 8, 9, 12, 20].into_iter().filter(|&s| s >= k) {
                    for n in (1..=40).chain([100, 3001]) {
                        // One matrix, and enough to pass the tiny copies' 2 KiB.
                        for slices in [1, 2100 / (k * n * e) + 1] {
                            // `slices` matrices of `n × s`, the last ending at
                            // its last pixel's channel `k - 1`.
                            let len = ((slices * n - 1) * s + k) * e;
                            let bytes = pattern(len, (len * 31 + k) as u64);
                            let src = GuardedSource::new(&bytes);
                            let shape = [slices, k, n];
                            let src_strides = [(n * s) as isize, 1, s as isize];
                            let dst_strides = [(k * n) as isize, n as isize, 1];
                            let mut got = vec![0u8; slices * k * n * e];
                            let mut want = got.clone();
                            reference(&mut want, 0, &dst_strides, &bytes, 0, &src_strides, &shape, e);
                            // SAFETY: the view lies inside the guarded source,
                            // the destination is dense in `got`.
                            unsafe {
                                copy_strided(got.as_mut_ptr(), &dst_strides, src.start, &src_strides, &shape, e)
                                    .unwrap();
                            }
                            assert!(got == want, "{slices} × channels :{k} of {n} pixels of {s}, e = {e}");
                        }
                    }
                }
            }
        }
    });
}

/// One channel of pixels of 2 to 8 elements of 1 or 2 bytes (`x[:, c]`, a
/// gather of every `s`-th element, which byte shuffles take 16 bytes at a
/// time where the CPU has AVX2), from a source that ends at the last
/// element read: a shuffle's loads stop at its end (a guard page past it).
#[test]
fn every_sth_element_read_no_further_than_the_source() {
    with_each_kernel_and_stream(|| {
        for e in [1usize, 2] {
            for s in 2..=8usize {
                for n in [2100 / e + 1, 2100 / e + 17, 5000] {
                    for c in [0, s - 1] {
                        // `n` pixels of `s`, the source ending at the last one's channel `c`.
                        let len = ((n - 1) * s + c + 1) * e;
                        let bytes = pattern(len, (len * 17 + s) as u64);
                        let src = GuardedSource::new(&bytes);
                        let mut got = vec![0u8; n * e];
                        let mut want = got.clone();
                        reference(&mut want, 0, &[1], &bytes, c * e, &[s as isize], &[n], e);
                        // SAFETY: elements `c + i·s` of the guarded source for
                        // `i < n`; the destination is dense in `got`.
                        unsafe {
                            copy_strided(got.as_mut_ptr(), &[1], src.start.add(c * e), &[s as isize], &[n], e).unwrap();
                        }
                        assert!(got == want, "channel {c} of {n} pixels of {s}, e = {e}");
                    }
                }
            }
        }
    });
}

/// Transposes of every `s`-th element of rows 4 KiB apart (`x[:, c::s].T`,
/// rows that crowd L1 sets: the general kernel's tiles, through an L1
/// buffer). Rows of 1 or 2 bytes are gathered with byte shuffles that read
/// on into the next tile's elements of the row; tiles leave the buffer in
/// AVX2's micro tiles (bytes anywhere, 2- and 4-byte elements into
/// destinations whose start and rows are on 32 bytes) or element by element.
/// Tiles ragged on both sides (45 = 32 + 13, 48 = 32 + 16 (whose last 16 a
/// block would read past), 100 = 3 · 32 + 4 elements, by 77 = 2 · 32 + 13
/// rows into a destination one element off, or 80 = 2 · 32 + 16 rows into one
/// on 32 bytes), the source ending at the last element read (a guard page
/// past it); every kernel set, streamed (scalar gathers for every 7th and
/// 8th) and not.
#[cfg(target_os = "linux")]
#[test]
fn strided_row_tiles_read_no_further_than_the_source() {
    with_each_kernel_and_stream(|| {
        for e in [1usize, 2, 4, 8] {
            let pitch = 4096 / e;
            for s in 2..=8usize {
                for cols in [45usize, 48, 100] {
                    for (c, rows, aligned) in [(0, 77, false), (s - 1, 80, true)] {
                        let len = ((rows - 1) * pitch + (cols - 1) * s + c + 1) * e;
                        let bytes = pattern(len, (len * 13 + s) as u64);
                        let src = GuardedSource::new(&bytes);
                        let (shape, ss, ds) = ([cols, rows], [s as isize, pitch as isize], [rows as isize, 1]);
                        let mut got = pattern((rows * cols + 64) * e, 0x5eed);
                        let dof = if aligned { got.as_ptr().align_offset(32) } else { e };
                        let mut want = got.clone();
                        reference(&mut want, dof, &ds, &bytes, c * e, &ss, &shape, e);
                        // SAFETY: elements `c + j·s + i·pitch` of the guarded
                        // source; the destination's `cols × rows` elements
                        // from byte `dof < 32` of `got`.
                        unsafe {
                            copy_strided(got.as_mut_ptr().add(dof), &ds, src.start.add(c * e), &ss, &shape, e).unwrap();
                        }
                        assert!(
                            got == want,
                            "channel {c} of {cols} × {s}, {rows} rows, e = {e}, at {dof}"
                        );
                    }
                }
            }
        }
    });
}

/// Gathered rows of a few elements (9, from 1200 apart; 19 and 27, up to
/// 31), the odometer over blocks of them, split across threads mid-block,
/// and not split (5 × 7 × 9 × 11 × 2 permuted 14032).
#[test]
fn short_gathered_rows_in_blocks() {
    for e in [4, 8] {
        for shift in [0, 3] {
            check_permute(&[9, 100, 100, 2], &[3, 1, 2, 0], e, shift);
            check_permute(&[5, 7, 9, 11, 2], &[1, 4, 0, 3, 2], e, shift);
            check_permute(&[17, 19, 23, 2], &[3, 0, 2, 1], e, shift);
            check_permute(&[31, 29, 27, 3], &[3, 0, 2, 1], e, shift);
        }
    }
}

/// Slices of a few elements a side (`x[i, k, j] → out[j, k, i]` and other
/// 5-D permutes of them), which the general kernel's gathers take where both
/// sides are under 16 (source runs in bytes, destination runs in elements),
/// or destination runs under 32 elements of 4 bytes continued both ways,
/// and the extension at and past those bounds: every element size,
/// misaligned too.
#[test]
fn scalar_slices_take_the_gathers() {
    for e in [1, 2, 4, 8] {
        for shift in [0, 3] {
            for perm in [
                [1, 4, 0, 3, 2],
                [4, 1, 0, 3, 2],
                [0, 1, 4, 3, 2],
                [0, 3, 1, 4, 2],
                [4, 3, 2, 1, 0],
            ] {
                check_permute(&[5, 7, 9, 11, 2], &perm, e, shift);
            }
            check_permute(&[17, 19, 23, 2], &[3, 1, 2, 0], e, shift);
            for (a, b) in [
                (13, 2),
                (15, 3),
                (16, 2),
                (9, 15),
                (9, 16),
                (11, 13),
                (31, 2),
                (31, 3),
                (32, 2),
            ] {
                check_permute(&[3, 5, a, 7, b], &[1, 4, 0, 3, 2], e, shift);
                check_permute(&[3, 5, a, 7, b], &[0, 3, 1, 4, 2], e, shift);
            }
        }
    }
}

/// Pixels of two to four channels to planes and back in slices of every
/// length from 1 to 40 (the byte shuffles take 16 bytes of each channel a
/// step: slices shorter than a step, a whole number of steps, and a last
/// step over the one before), for every element size, at odd addresses, with
/// and without a batch dim (enough slices to pass the tiny copies' 2 KiB).
#[test]
fn few_channels_in_slices_of_every_length() {
    for e in [1, 2, 4, 8] {
        for k in [2, 3, 4] {
            for len in 1..=40 {
                let slices = 2100 / (k * e * len) + 1;
                for shift in [0, 3] {
                    check_permute(&[len, k], &[1, 0], e, shift);
                    check_permute(&[k, len], &[1, 0], e, shift);
                    check_permute(&[slices, len, k], &[2, 0, 1], e, shift);
                    check_permute(&[slices, k, len], &[0, 2, 1], e, shift);
                }
            }
        }
    }
}

/// The streaming-store paths (normally only for destinations past the
/// last-level cache) on small, misaligned and odd-sized cases. Other tests may
/// run meanwhile with streaming on: they must pass either way.
#[test]
fn streaming_stores() {
    set_stream_threshold(Some(1));
    for shift in [0, 1, 7] {
        check_permute(&[700, 1037], &[1, 0], 4, shift);
        check_permute(&[1100, 1000], &[1, 0], 1, shift);
        check_permute(&[300, 301], &[1, 0], 2, shift);
        check_permute(&[300, 301], &[1, 0], 3, shift);
        check_permute(&[7, 80, 90], &[0, 2, 1], 4, shift);
        check_permute(&[4, 3, 96, 97], &[0, 2, 3, 1], 4, shift);
        check_permute(&[4, 96, 97, 3], &[0, 3, 1, 2], 1, shift);
        check_permute(&[700, 701], &[0, 1], 4, shift);
        check_permute(&[50, 60, 70], &[1, 0, 2], 4, shift);
        check_permute(&[300, 301], &[1, 0], 8, shift);
        check_permute(&[100, 130], &[1, 0], 12, shift);
        check_permute(&[90, 100], &[1, 0], 16, shift);
        check_permute(&[16, 100, 130], &[0, 2, 1], 2, shift);
        // Images of three channels over more than one task piece: streaming
        // stores from each piece's first pixel, where aligned; planes a
        // multiple of 2 KiB apart with ordinary stores.
        for e in [1, 2, 4, 8] {
            check_permute(&[2, 130, 131, 3], &[0, 3, 1, 2], e, shift);
            check_permute(&[2, 3, 130, 131], &[0, 2, 3, 1], e, shift);
            check_permute(&[2, 128, 144, 3], &[0, 3, 1, 2], e, shift);
        }
    }
    for e in [1usize, 2, 3, 4, 5, 8, 12, 16] {
        for (n, stride) in [(100_001usize, 1isize), (77, 1), (3000, 1), (50_000, 2)] {
            let value: Vec<u8> = (1..=e as u8).collect();
            let mut got = vec![0u8; n * e * stride as usize + 1];
            // SAFETY: `n` elements at `stride`, one byte in.
            unsafe { fill_strided(got.as_mut_ptr().add(1), &[stride], &[n], &value).unwrap() };
            let ok = got[1..].chunks(e).enumerate().all(|(i, c)| {
                if i % stride as usize == 0 && i / (stride as usize) < n {
                    c == value.as_slice()
                } else {
                    c.iter().all(|&b| b == 0)
                }
            });
            assert!(ok && got[0] == 0, "streaming fill e = {e}, n = {n}, stride = {stride}");
        }
    }
    // [M, 1] -> [M, N] broadcast rows and a gather, streamed.
    let (m, n) = (37, 1000);
    let src = pattern(2 * m * n * 4, 5);
    for (strides, e) in [
        ([1isize, 0], 4usize),
        ([1, 0], 3),
        ([2 * n as isize, 2], 4),
        ([0, -1], 8),
    ] {
        let off = if strides[1] < 0 { (n - 1) * e } else { 0 };
        let mut got = vec![0u8; m * n * e];
        let mut want = got.clone();
        reference(&mut want, 0, &[n as isize, 1], &src, off, &strides, &[m, n], e);
        // SAFETY: the views fit both buffers.
        unsafe {
            copy_strided(
                got.as_mut_ptr(),
                &[n as isize, 1],
                src.as_ptr().add(off),
                &strides,
                &[m, n],
                e,
            )
            .unwrap()
        };
        assert!(got == want, "streamed {strides:?} e = {e}");
    }
    set_stream_threshold(None);
}

/// Copies of at most 2 KiB into a dense destination skip the plan: the
/// source gathered into a stack buffer, then written in one go.
#[test]
fn tiny_copies_every_element_size_layout_and_overlap() {
    for e in [1usize, 2, 3, 4, 5, 8, 12, 16] {
        let src = pattern(4096 * e, e as u64);
        let cases: &[(&[usize], &[isize], usize)] = &[
            (&[], &[], 7),                        // 0-d: one element
            (&[1], &[5], 3),                      // size-1 dims keep any stride
            (&[4, 4], &[1, 4], 0),                // a transpose
            (&[2, 1, 3, 2], &[-6, 9, 2, -1], 40), // negative strides, a size-1 dim
            (&[3, 5], &[0, 1], 11),               // a broadcast row
            (&[5, 3], &[2, 0], 11),               // a broadcast column
            (&[3, 4], &[8, 1], 2),                // sliced rows (dense rows)
            (&[3, 4], &[9, 2], 1),                // every other column
            // Ten dims: more outer counters than the odometer keeps on the stack.
            (&[2, 1, 2, 1, 2, 1, 2, 1, 2, 2], &[1, 7, 4, 3, 16, 5, 2, 9, 64, 32], 5),
            (&[2048 / e], &[-1], 2048 / e - 1), // the largest tiny copy, reversed
            (&[2048 / e + 1], &[-1], 2048 / e), // just above: through the plan
        ];
        for &(shape, strides, off) in cases {
            let n: usize = shape.iter().product();
            let mut got = vec![0u8; n * e + 7];
            let mut want = got.clone();
            let dense = contiguous(shape);
            reference(&mut want, 3, &dense, &src, off * e, strides, shape, e);
            // SAFETY: the source layout lies inside `src` from `off`; the dense
            // destination of `n` elements inside `got` from byte 3.
            unsafe {
                copy_strided(
                    got.as_mut_ptr().add(3),
                    &dense,
                    src.as_ptr().add(off * e),
                    strides,
                    shape,
                    e,
                )
                .unwrap();
            }
            assert!(got == want, "tiny copy {shape:?} {strides:?}@{off}, {e}-byte elements");
        }
    }
    // Source and destination in one buffer: everything is read before
    // anything is written.
    check_overlapping(17, 4, 1, &[1], 0, &[1], &[16]); // shift up by one
    check_overlapping(17, 4, 0, &[1], 1, &[1], &[16]); // shift down by one
    check_overlapping(64, 4, 0, &[1], 63, &[-1], &[64]); // reverse in place
    check_overlapping(64, 4, 0, &[8, 1], 0, &[1, 8], &[8, 8]); // in-place transpose
    check_overlapping(100, 3, 0, &[10, 1], 0, &[10, 1], &[10, 10]); // onto itself
}
