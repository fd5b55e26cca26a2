//! The strided-copy benchmark matrix (research notes §c, sized for a CPU):
//! shared by `devtensor bench` and `benches/strided_copy.rs` (which includes
//! this file with `#[path]`), so it uses only the library's public API.
//!
//! Every [`Pattern`] is a view of a source buffer (`src_alloc_elems` elements
//! of `elem_size` bytes) described by `shape`, `src_strides` and `src_offset`
//! in elements — everything needed to rebuild the same view in NumPy
//! (`np.lib.stride_tricks.as_strided`) or torch (`torch.as_strided`) — copied
//! into a C-contiguous destination. GB/s count read + write bytes
//! (`2 × numel × elem_size`). Full-size sources are 16–64 MiB, past the
//! last-level cache of most machines; [`quick_matrix`] is the same matrix at
//! ~1/16 of the size for smoke runs.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use devtensor::alloc::Allocation;
use devtensor::copy::copy_strided;
use devtensor::{CpuAlloc, NDAlloc, Result};

/// One benchmark case: a strided view of a source buffer, copied into a
/// contiguous destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// Short unique name, e.g. `transpose2d_f32_4096x4096`.
    pub name: String,
    /// Element size in bytes.
    pub elem_size: usize,
    /// Size of the source buffer, in elements.
    pub src_alloc_elems: usize,
    /// Logical shape of the view (and of the contiguous destination).
    pub shape: Vec<usize>,
    /// Strides of the view, in elements.
    pub src_strides: Vec<isize>,
    /// Offset of the view's element `[0, …, 0]` in the buffer, in elements.
    pub src_offset: usize,
}

fn dense(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as isize;
    }
    s
}

fn dims(shape: &[usize]) -> String {
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
}

impl Pattern {
    /// The view `src.permute(perm)` of a dense `src_shape` tensor
    /// (`view.shape[i] = src_shape[perm[i]]`).
    pub fn permute(name: impl Into<String>, elem_size: usize, src_shape: &[usize], perm: &[usize]) -> Self {
        let d = dense(src_shape);
        Self {
            name: name.into(),
            elem_size,
            src_alloc_elems: src_shape.iter().product(),
            shape: perm.iter().map(|&p| src_shape[p]).collect(),
            src_strides: perm.iter().map(|&p| d[p]).collect(),
            src_offset: 0,
        }
    }

    /// The view `x[:, :k]` of a dense `[m, n]` matrix.
    pub fn sliced_rows(name: impl Into<String>, elem_size: usize, m: usize, n: usize, k: usize) -> Self {
        Self {
            name: name.into(),
            elem_size,
            src_alloc_elems: m * n,
            shape: vec![m, k],
            src_strides: vec![n as isize, 1],
            src_offset: 0,
        }
    }

    /// Number of elements copied.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes read plus bytes written by one copy: `2 × numel × elem_size`.
    pub fn bytes_moved(&self) -> u64 {
        2 * (self.numel() * self.elem_size) as u64
    }

    /// Allocates the source (filled with a byte pattern) and a contiguous
    /// destination.
    pub fn prepare(&self) -> Prepared {
        let e = self.elem_size;
        let src = HostBuf::filled(self.src_alloc_elems * e, |i| (i.wrapping_mul(131) >> 3) as u8 ^ i as u8);
        Prepared {
            pattern: self.clone(),
            src,
            dst: HostBuf::filled(self.numel() * e, |_| 0),
            dst_strides: dense(&self.shape),
        }
    }

    /// One JSON object for this pattern and its measurements.
    pub fn to_json(&self, copy: &Measurement, memcpy: &Measurement) -> String {
        let mut s = String::from("{\"name\":\"");
        for c in self.name.chars() {
            match c {
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(s, "\\u{:04x}", c as u32);
                }
                c => s.push(c),
            }
        }
        let list = |v: &mut String, xs: &[String]| {
            v.push('[');
            v.push_str(&xs.join(","));
            v.push(']');
        };
        let _ = write!(s, "\",\"elem_size\":{},\"shape\":", self.elem_size);
        list(&mut s, &self.shape.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        s.push_str(",\"src_strides\":");
        list(
            &mut s,
            &self.src_strides.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        );
        let _ = write!(
            s,
            ",\"src_offset\":{},\"src_alloc_elems\":{},\"bytes_moved\":{},\"gbps\":{:.3},\"memcpy_gbps\":{:.3},\"ns\":{:.1},\"median_ns\":{:.1}}}",
            self.src_offset,
            self.src_alloc_elems,
            self.bytes_moved(),
            copy.gbps,
            memcpy.gbps,
            copy.ns_per_iter,
            copy.median_ns,
        );
        s
    }
}

/// Host memory as the library allocates it for CPU tensors ([`CpuAlloc`]:
/// 256-byte aligned, transparent huge pages from 8 MiB), so that patterns
/// and memcpy run on the memory users' tensors have.
#[derive(Debug)]
pub struct HostBuf(Allocation);

impl HostBuf {
    /// `len` bytes, byte `i` set to `f(i)`.
    ///
    /// # Panics
    ///
    /// When the host is out of memory (a benchmark cannot go on).
    pub fn filled(len: usize, f: impl Fn(usize) -> u8) -> HostBuf {
        let a = CpuAlloc
            .allocate(len, devtensor::alloc::CPU_ALIGNMENT, None)
            .unwrap_or_else(|e| panic!("benchmark buffer of {len} bytes: {e}"));
        let buf = HostBuf(a);
        for i in 0..len {
            // SAFETY: `i < len`, the allocation's size; writes initialise it.
            unsafe { buf.0.ptr.as_ptr().add(i).write(f(i)) };
        }
        buf
    }
}

impl std::ops::Deref for HostBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the allocation holds `size` bytes, all initialised by `filled`.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.size) }
    }
}

impl std::ops::DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr.as_ptr(), self.0.size) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `CpuAlloc` and freed once, here.
        unsafe { CpuAlloc.deallocate(self.0, None) }
    }
}

/// A pattern with its buffers allocated.
#[derive(Debug)]
pub struct Prepared {
    pattern: Pattern,
    src: HostBuf,
    dst: HostBuf,
    dst_strides: Vec<isize>,
}

impl Prepared {
    /// The pattern.
    pub fn pattern(&self) -> &Pattern {
        &self.pattern
    }

    /// The destination after the last [`run`](Self::run).
    pub fn dst(&self) -> &[u8] {
        &self.dst
    }

    /// One `copy_strided` of the view into the contiguous destination.
    pub fn run(&mut self) -> Result<()> {
        let p = &self.pattern;
        // SAFETY: `src` holds `src_alloc_elems` elements and every pattern's view
        // (offset + strides) lies inside it (checked by `patterns_fit` in the
        // tests); `dst` holds the `numel` contiguous elements.
        unsafe {
            copy_strided(
                self.dst.as_mut_ptr(),
                &self.dst_strides,
                self.src.as_ptr().add(p.src_offset * p.elem_size),
                &p.src_strides,
                &p.shape,
                p.elem_size,
            )
        }
    }

    /// Checks the destination against a naive per-element copy.
    pub fn verify(&self) -> bool {
        let p = &self.pattern;
        let e = p.elem_size;
        if p.shape.contains(&0) {
            return true;
        }
        let mut idx = vec![0usize; p.shape.len()];
        let mut out = 0usize;
        loop {
            let off: isize = idx.iter().zip(&p.src_strides).map(|(&i, &s)| i as isize * s).sum();
            let s = (p.src_offset as isize + off) as usize * e;
            if self.src[s..s + e] != self.dst[out..out + e] {
                return false;
            }
            out += e;
            let mut k = p.shape.len();
            loop {
                if k == 0 {
                    return true;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < p.shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
}

/// Timing of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measurement {
    /// Read + write GB/s (10⁹ bytes) at the best batch.
    pub gbps: f64,
    /// Nanoseconds per operation, best batch.
    pub ns_per_iter: f64,
    /// Nanoseconds per operation, median batch.
    pub median_ns: f64,
    /// Operations timed (warm-up excluded).
    pub iters: u64,
}

/// Batches of calls of one timed operation, each call moving `bytes_moved`
/// bytes: sized after a warm-up to ~2 ms, and timed one at a time, so that
/// two operations can take turns ([`measure_pattern`]).
struct Batches<F> {
    f: F,
    bytes_moved: u64,
    per_batch: u64,
    /// Nanoseconds per call of each batch timed so far.
    times: Vec<f64>,
}

impl<F: FnMut() -> Result<()>> Batches<F> {
    /// Warms `f` up for 20 ms (pages in the buffers, spins up the thread
    /// pool) and sizes its batches from the fastest call.
    fn warm(bytes_moved: u64, mut f: F) -> Result<Self> {
        let t = Instant::now();
        f()?;
        let mut one = t.elapsed();
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(20) {
            let t = Instant::now();
            f()?;
            one = one.min(t.elapsed());
        }
        let per_batch = (Duration::from_millis(2).as_nanos() / one.as_nanos().max(1)).clamp(1, 1 << 20) as u64;
        Ok(Batches {
            f,
            bytes_moved,
            per_batch,
            times: Vec::new(),
        })
    }

    /// Times one more batch.
    fn batch(&mut self) -> Result<()> {
        let t = Instant::now();
        for _ in 0..self.per_batch {
            (self.f)()?;
        }
        self.times.push(t.elapsed().as_nanos() as f64 / self.per_batch as f64);
        Ok(())
    }

    /// The best and the median batch.
    fn measurement(mut self) -> Measurement {
        self.times.sort_by(f64::total_cmp);
        let best = self.times[0];
        Measurement {
            gbps: self.bytes_moved as f64 / best,
            ns_per_iter: best,
            median_ns: self.times[self.times.len() / 2],
            iters: self.per_batch * self.times.len() as u64,
        }
    }
}

/// A pattern's copy, ready to time.
fn pattern_copy(p: &Pattern) -> impl FnMut() -> Result<()> {
    let mut prep = p.prepare();
    move || {
        let r = prep.run();
        black_box(prep.dst.as_ptr());
        r
    }
}

/// A contiguous copy of `bytes` bytes through the same engine (the parallel
/// memcpy path), ready to time: the ceiling for every pattern of that size.
fn memcpy_copy(bytes: usize) -> impl FnMut() -> Result<()> {
    let src = HostBuf::filled(bytes, |i| i as u8);
    let mut dst = HostBuf::filled(bytes, |_| 0);
    move || {
        // SAFETY: both buffers hold `bytes` bytes.
        let r = unsafe { copy_strided(dst.as_mut_ptr(), &[1], src.as_ptr(), &[1], &[bytes], 1) };
        black_box(dst.as_ptr());
        r
    }
}

/// A pattern with its copy and same-size memcpy timings.
#[derive(Clone, Debug)]
pub struct PatternResult {
    /// The pattern.
    pub pattern: Pattern,
    /// The strided copy.
    pub copy: Measurement,
    /// A contiguous copy of the same byte count.
    pub memcpy: Measurement,
}

impl PatternResult {
    /// Copy throughput as a percentage of the memcpy baseline.
    pub fn memcpy_pct(&self) -> f64 {
        100.0 * self.copy.gbps / self.memcpy.gbps
    }

    /// One JSON object: `{name, elem_size, shape, src_strides, src_offset,
    /// src_alloc_elems, bytes_moved, gbps, memcpy_gbps, ns, median_ns}`.
    pub fn to_json(&self) -> String {
        self.pattern.to_json(&self.copy, &self.memcpy)
    }
}

/// Measures a pattern and the memcpy baseline of its size, their batches
/// taking turns for `2 × min_time`: a VM's memory bandwidth drifts over
/// seconds (a Zen 2 VM's memcpy ran at 40 GB/s, then 56, then 77, a pattern
/// apart), and timed one after the other the two saw different machines.
pub fn measure_pattern(p: &Pattern, min_time: Duration) -> Result<PatternResult> {
    let mut copy = Batches::warm(p.bytes_moved(), pattern_copy(p))?;
    let bytes = p.numel() * p.elem_size;
    let mut memcpy = Batches::warm(2 * bytes as u64, memcpy_copy(bytes))?;
    let start = Instant::now();
    while copy.times.len() < 3 || start.elapsed() < 2 * min_time {
        copy.batch()?;
        memcpy.batch()?;
    }
    Ok(PatternResult {
        pattern: p.clone(),
        copy: copy.measurement(),
        memcpy: memcpy.measurement(),
    })
}

/// The full CPU matrix (sources of 16–64 MiB).
pub fn cpu_matrix() -> Vec<Pattern> {
    matrix(1)
}

/// The same matrix with every large dimension divided by ~4 (sources of
/// 1–4 MiB, mostly cache-resident): a smoke run.
pub fn quick_matrix() -> Vec<Pattern> {
    matrix(4)
}

fn matrix(q: usize) -> Vec<Pattern> {
    let mut v = Vec::new();
    let p = Pattern::permute;
    let n4k = 4096 / q;
    // 1. Contiguous.
    let cn = (16 << 20) / (q * q);
    v.push(p(format!("contiguous_f32_{cn}"), 4, &[cn], &[0]));
    // 2. 2-D transposes.
    for (e, ty, m, n) in [
        (4, "f32", n4k, n4k),
        (1, "u8", 2 * n4k, 2 * n4k),
        (2, "f16", n4k, n4k),
        (8, "f64", n4k / 2, n4k),
    ] {
        v.push(p(format!("transpose2d_{ty}_{m}x{n}"), e, &[m, n], &[1, 0]));
    }
    v.push(p(
        format!("transpose2d_e3_{}x{}", n4k, n4k / 2),
        3,
        &[n4k, n4k / 2],
        &[1, 0],
    ));
    v.push(p(
        format!("transpose2d_f32_{}x{}", n4k + 1, n4k - 1),
        4,
        &[n4k + 1, n4k - 1],
        &[1, 0],
    ));
    // Odd widths whose rows do not come back to the same cache sets every
    // few rows as 4095's (16380 bytes apart) do.
    let (m, n) = (3000 / q, (5001 / q) | 1);
    v.push(p(format!("transpose2d_f32_{m}x{n}"), 4, &[m, n], &[1, 0]));
    // The same, read from a wider matrix (`x[:, :n].T`, an image with a row
    // pitch): rows no longer a multiple of 4 KiB apart, so they spread over the
    // cache sets. Beside the power-of-two ones above, they show what that
    // aliasing costs.
    for (e, ty, n, pitch) in [
        (1usize, "u8", 2 * n4k, 2 * n4k + 64),
        (2, "f16", n4k, n4k + 32),
        (4, "f32", n4k, n4k + 16),
    ] {
        v.push(Pattern {
            name: format!("pitched_transpose2d_{ty}_{n}x{n}_pitch{pitch}"),
            elem_size: e,
            src_alloc_elems: n * pitch,
            shape: vec![n, n],
            src_strides: vec![1, pitch as isize],
            src_offset: 0,
        });
    }
    // Transposes of strided views: every other column (`x[:, ::2].T`) and the
    // real parts of a complex128 matrix, unit-stride along neither dim.
    for (e, ty, name) in [
        (4usize, "f32", "strided_transpose2d"),
        (8, "f64", "real_parts_transposed"),
    ] {
        let n = n4k / 2;
        v.push(Pattern {
            name: format!("{name}_{ty}_{n}x{n}_step2"),
            elem_size: e,
            src_alloc_elems: 2 * n * n,
            shape: vec![n, n],
            src_strides: vec![2, 2 * n as isize],
            src_offset: 0,
        });
    }
    // 3. Batched last-two transposes.
    v.push(p(
        format!("batched_transpose_f32_{}x512x512", 32 / (q * q)),
        4,
        &[32 / (q * q), 512, 512],
        &[0, 2, 1],
    ));
    v.push(p(
        format!("batched_transpose_f16_{}x4096x128", 16 / (q * q)),
        2,
        &[16 / (q * q), 4096, 128],
        &[0, 2, 1],
    ));
    // 4. Attention permute [B,S,H,D] -> [B,H,S,D].
    for d in [64, 128] {
        let b = 8 / q;
        let s = 2048 / q;
        let shape = [b, s, 16, d];
        v.push(p(
            format!("attention_permute_f16_{}", dims(&shape)),
            2,
            &shape,
            &[0, 2, 1, 3],
        ));
    }
    // 5. NCHW <-> NHWC.
    let nb = 16 / (q * q);
    v.push(p(
        format!("nchw_to_nhwc_f32_{nb}x256x56x56"),
        4,
        &[nb, 256, 56, 56],
        &[0, 2, 3, 1],
    ));
    v.push(p(
        format!("nhwc_to_nchw_f32_{nb}x56x56x256"),
        4,
        &[nb, 56, 56, 256],
        &[0, 3, 1, 2],
    ));
    let ib = 64 / (q * q);
    v.push(p(
        format!("nchw_to_nhwc_f32_{ib}x3x224x224"),
        4,
        &[ib, 3, 224, 224],
        &[0, 2, 3, 1],
    ));
    v.push(p(
        format!("nhwc_to_nchw_f32_{ib}x224x224x3"),
        4,
        &[ib, 224, 224, 3],
        &[0, 3, 1, 2],
    ));
    let ub = 4 * ib;
    v.push(p(
        format!("nhwc_to_nchw_u8_{ub}x224x224x3"),
        1,
        &[ub, 224, 224, 3],
        &[0, 3, 1, 2],
    ));
    v.push(p(
        format!("nchw_to_nhwc_u8_{ub}x3x224x224"),
        1,
        &[ub, 3, 224, 224],
        &[0, 2, 3, 1],
    ));
    // 6. 3-D / 4-D / 5-D permutations.
    let c = 256 / q;
    for perm in [[2, 1, 0], [2, 0, 1], [1, 0, 2]] {
        let name = format!("permute3d_{}{}{}_f32_{c}x{c}x{c}", perm[0], perm[1], perm[2]);
        v.push(p(name, 4, &[c, c, c], &perm));
    }
    let f = 64 / q;
    for perm in [[1, 2, 0, 3], [3, 0, 2, 1]] {
        let name = format!(
            "permute4d_{}{}{}{}_f32_{f}x{f}x{f}x{f}",
            perm[0], perm[1], perm[2], perm[3]
        );
        v.push(p(name, 4, &[f, f, f, f], &perm));
    }
    let g = 32 / q;
    v.push(p(
        format!("permute5d_43210_f32_{g}x{g}x{g}x{g}x16"),
        4,
        &[g, g, g, g, 16],
        &[4, 3, 2, 1, 0],
    ));
    v.push(p(
        format!("permute5d_03142_f16_{g}x{g}x{g}x{g}x32"),
        2,
        &[g, g, g, g, 32],
        &[0, 3, 1, 4, 2],
    ));
    // 7. Sliced rows x[:, :k] of f32, row bytes 4/12/64/100/4096.
    for k in [1usize, 3, 16, 25, 1024] {
        let n = 2 * k;
        let m = (8 << 20) / (n * q * q);
        v.push(Pattern::sliced_rows(
            format!("sliced_rows_{}B_f32_{m}x{n}", 4 * k),
            4,
            m,
            n,
            k,
        ));
    }
    // 8. Broadcasts.
    v.push(Pattern {
        name: format!("broadcast_row_f32_{n4k}x{n4k}"),
        elem_size: 4,
        src_alloc_elems: n4k,
        shape: vec![n4k, n4k],
        src_strides: vec![0, 1],
        src_offset: 0,
    });
    v.push(Pattern {
        name: format!("broadcast_col_f32_{n4k}x{n4k}"),
        elem_size: 4,
        src_alloc_elems: n4k,
        shape: vec![n4k, n4k],
        src_strides: vec![1, 0],
        src_offset: 0,
    });
    v.push(Pattern {
        name: format!("broadcast_scalar_f32_{n4k}x{n4k}"),
        elem_size: 4,
        src_alloc_elems: 1,
        shape: vec![n4k, n4k],
        src_strides: vec![0, 0],
        src_offset: 0,
    });
    // 9. Negative strides.
    let nn = n4k as isize;
    v.push(Pattern {
        name: format!("flip_inner_f32_{n4k}x{n4k}"),
        elem_size: 4,
        src_alloc_elems: n4k * n4k,
        shape: vec![n4k, n4k],
        src_strides: vec![nn, -1],
        src_offset: n4k - 1,
    });
    v.push(Pattern {
        name: format!("flip_outer_f32_{n4k}x{n4k}"),
        elem_size: 4,
        src_alloc_elems: n4k * n4k,
        shape: vec![n4k, n4k],
        src_strides: vec![-nn, 1],
        src_offset: (n4k - 1) * n4k,
    });
    // 10. Views starting at element 1 (odd byte address for u8).
    let big = (64 << 20) / (q * q);
    v.push(Pattern {
        name: format!("offset1_contiguous_u8_{}", big - 1),
        elem_size: 1,
        src_alloc_elems: big,
        shape: vec![big - 1],
        src_strides: vec![1],
        src_offset: 1,
    });
    v.push(Pattern {
        name: format!("offset1_transpose2d_f32_{n4k}x{}", n4k - 1),
        elem_size: 4,
        src_alloc_elems: n4k * n4k,
        shape: vec![n4k - 1, n4k],
        src_strides: vec![1, nn],
        src_offset: 1,
    });
    // 11. Tiny: 64 B, 4 KiB, 64 KiB transposes.
    for s in [4usize, 32, 128] {
        v.push(p(format!("tiny_transpose_f32_{s}x{s}"), 4, &[s, s], &[1, 0]));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_fit_and_names_unique() {
        for m in [cpu_matrix(), quick_matrix()] {
            let mut names: Vec<&str> = m.iter().map(|p| p.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), m.len());
            for p in &m {
                assert_eq!(p.shape.len(), p.src_strides.len(), "{}", p.name);
                let (mut lo, mut hi) = (p.src_offset as isize, p.src_offset as isize);
                for (&n, &s) in p.shape.iter().zip(&p.src_strides) {
                    let ext = (n as isize - 1) * s;
                    if ext < 0 { lo += ext } else { hi += ext }
                }
                assert!(
                    lo >= 0 && (hi as usize) < p.src_alloc_elems,
                    "{} does not fit its buffer",
                    p.name
                );
                assert!(p.numel() > 0, "{}", p.name);
            }
        }
    }

    #[test]
    fn quick_patterns_copy_correctly() {
        for p in quick_matrix() {
            if p.src_alloc_elems * p.elem_size > (4 << 20) {
                continue; // keep the debug test fast
            }
            let mut prep = p.prepare();
            prep.run().unwrap();
            assert!(prep.verify(), "{}", p.name);
        }
        let p = &quick_matrix()[0];
        let r = measure_pattern(
            &Pattern {
                shape: vec![64],
                src_alloc_elems: 64,
                ..p.clone()
            },
            Duration::ZERO,
        )
        .unwrap();
        let j = r.to_json();
        assert!(
            j.starts_with("{\"name\":\"contiguous_f32_") && j.contains("\"shape\":[64]"),
            "{j}"
        );
        assert!(r.copy.gbps > 0.0 && r.memcpy_pct() > 0.0);
    }
}
