//! Kernel calls for a planned copy or fill, shared by the CUDA and ROCm
//! backends: which kernel of kernels/strided_copy.cu, its grid, its block and
//! its by-value argument struct (laid out exactly as the C struct).

use std::ffi::c_void;

use crate::copy::plan::{CopyPlan, PlanKind, PlanOptions};
use crate::error::{Error, Result};

/// Every kernel the source must define (checked against the compiled module by
/// `devtensor kernels --check`).
pub const KERNELS: &[&str] = &[
    "copy_strided_e1",
    "copy_strided_e2",
    "copy_strided_e4",
    "copy_strided_e8",
    "copy_strided_e16",
    "copy_strided64_e1",
    "copy_strided64_e2",
    "copy_strided64_e4",
    "copy_strided64_e8",
    "copy_strided64_e16",
    "copy_vec_e1",
    "copy_vec_e2",
    "copy_vec_e4",
    "copy_vec_e8",
    "fill_e1",
    "fill_e2",
    "fill_e4",
    "fill_e8",
    "fill_e16",
    "transpose_tiled_e1",
    "transpose_tiled_e2",
    "transpose_tiled_e4",
    "transpose_tiled_e8",
    "transpose_tiled_folded_e1",
    "transpose_tiled_folded_e2",
    "transpose_tiled_folded_e4",
    "transpose_tiled_folded_e8",
    "transpose_packed_folded_e1",
    "transpose_packed_folded_e2",
    "transpose_packed_e1",
    "transpose_packed_e2",
    "transpose_rgb_e1",
    "transpose_rgb_e2",
    "transpose_rgb_e4",
    "transpose_rgb_packed_e1",
];

/// Dims a kernel takes after coalescing (`DT_MAX_DIMS` in the kernel source).
pub const MAX_DIMS: usize = 16;
const BLOCK: u32 = 256;
const ILP: u32 = 4;
/// The tiled transpose's tile edge and rows per block (`DT_TILE`, `DT_TILE_ROWS`).
const TILE: u32 = 32;
const TILE_ROWS: u32 = 8;
/// Bytes a thread of `copy_vec_eE` stores at once (`DT_VEC_BYTES`) and the
/// vectors it moves (`DT_VEC_ILP`).
const VEC_BYTES: usize = 16;
const VEC_ILP: u32 = 2;
/// Most source bytes the outer dim of a vector's two-dim run may step over
/// within one vector. H200: rows of 3 f32 out of rows of 6 (24-byte steps)
/// ran at 0.91× torch's speed element by element, 1.16–1.18× in vectors;
/// 4096 × 2048 RGB pixels transposed (6 KiB steps: each byte of a vector
/// from another row) at 15.6 % of memcpy element by element, 14.0 % in
/// vectors.
const VEC_MAX_SPAN: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct DivMagic {
    mul: u32,
    shift: u32,
    div: u32,
}

/// Granlund–Montgomery magic for division by `d` of dividends below 2^31.
fn magic(d: u32) -> DivMagic {
    let d = d.max(1);
    let shift = 32 - (d - 1).leading_zeros(); // ceil(log2(d))
    let mul = (((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1) as u32;
    DivMagic { mul, shift, div: d }
}

/// `StridedArgs` of the kernel source: a 32-bit problem (element count and
/// element offsets below 2^31).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StridedArgs {
    numel: u32,
    ndim: i32,
    size: [DivMagic; MAX_DIMS],
    src_stride: [i32; MAX_DIMS],
    dst_stride: [i32; MAX_DIMS],
}

/// `StridedArgs64`: the 64-bit fallback.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StridedArgs64 {
    numel: u64,
    ndim: i32,
    size: [u64; MAX_DIMS],
    src_stride: [i64; MAX_DIMS],
    dst_stride: [i64; MAX_DIMS],
}

/// `TransposeArgs`: the tiled transpose over two fast dims and a batch
/// (`transpose_tiled_eE`, `transpose_packed_eE`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransposeArgs {
    n_src_fast: u32,
    n_dst_fast: u32,
    src_stride_df: i32,
    dst_stride_sf: i32,
    src_stride_sf: i32,
    dst_stride_df: i32,
    tiles_sf: u32,
    tiles_df: u32,
    batch: StridedArgs,
}

/// `VecArgs`: `copy_vec_eE`'s vectors along the destination's unit-stride
/// run (its innermost dim, and the next where that one continues it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VecArgs {
    inner: DivMagic,
    src_inner: i32,
    src_outer: i32,
    src_carry: i32,
    rows: StridedArgs,
}

/// `FoldedArgs`: `transpose_tiled_folded_eE` and `transpose_packed_folded_eE`,
/// whose tiles' short sides hold runs of a fold dim's consecutive indices.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FoldedArgs {
    t: TransposeArgs,
    log2_w_sf: u32,
    log2_w_df: u32,
    src_stride_fsf: i32,
    dst_stride_fsf: i32,
    src_stride_fdf: i32,
    dst_stride_fdf: i32,
}

/// The by-value struct a kernel takes last.
#[derive(Clone, Copy, Debug)]
pub enum KernelArgs {
    /// `copy_strided_eE` and `fill_eE`.
    Strided(StridedArgs),
    /// `copy_strided64_eE`.
    Strided64(StridedArgs64),
    /// `transpose_tiled_eE` and `transpose_packed_eE`.
    Transpose(TransposeArgs),
    /// `transpose_tiled_folded_eE` and `transpose_packed_folded_eE`.
    Folded(FoldedArgs),
    /// `copy_vec_eE`.
    Vector(VecArgs),
}

/// One kernel launch.
#[derive(Clone, Copy, Debug)]
pub struct KernelCall {
    /// An entry of the kernel manifest.
    pub name: &'static str,
    /// Grid size in blocks.
    pub grid: (u32, u32, u32),
    /// Block size in threads (never assumes 32 lanes: wave64 runs it too).
    pub block: (u32, u32, u32),
    /// The argument struct.
    pub args: KernelArgs,
}

impl KernelCall {
    /// A pointer to the argument struct, for the launch's parameter array.
    pub fn args_ptr(&mut self) -> *mut c_void {
        match &mut self.args {
            KernelArgs::Strided(a) => (a as *mut StridedArgs).cast(),
            KernelArgs::Strided64(a) => (a as *mut StridedArgs64).cast(),
            KernelArgs::Transpose(a) => (a as *mut TransposeArgs).cast(),
            KernelArgs::Folded(a) => (a as *mut FoldedArgs).cast(),
            KernelArgs::Vector(a) => (a as *mut VecArgs).cast(),
        }
    }
}

/// (len, src stride, dst stride) in units of the plan's element size.
fn unit_dims(plan: &CopyPlan) -> Vec<(usize, i64, i64)> {
    let e = plan.elem_size as isize;
    plan.dims
        .iter()
        .map(|d| (d.len, (d.src / e) as i64, (d.dst / e) as i64))
        .collect()
}

/// True when the element count and every element offset (not byte offset:
/// the kernels index typed pointers) fit the 32-bit kernels.
fn fits_i32(numel: usize, dims: &[(usize, i64, i64)]) -> bool {
    let reach = |f: fn(&(usize, i64, i64)) -> i64| -> i128 {
        dims.iter().map(|d| (d.0 as i128 - 1) * i128::from(f(d)).abs()).sum()
    };
    numel <= i32::MAX as usize && reach(|d| d.1) <= i32::MAX as i128 && reach(|d| d.2) <= i32::MAX as i128
}

/// The largest element count and element reach the 32-bit kernels address.
const I32_LIMIT: i128 = i32::MAX as i128;

/// Splits a plan the 32-bit kernels cannot address in one launch into pieces
/// they can, along its outermost dims (`kernels/strided_copy.cu`'s contract:
/// the host splits big problems), so tensors past 2^31 elements keep the tiled
/// and vectorised kernels. Each piece's offsets are relative to the caller's
/// pointers, as the whole plan's are. A plan that fits comes back alone.
pub fn split_for_32bit(plan: &CopyPlan) -> Vec<CopyPlan> {
    split_with_limit(plan, I32_LIMIT)
}

fn split_with_limit(plan: &CopyPlan, limit: i128) -> Vec<CopyPlan> {
    if matches!(plan.kind, PlanKind::Empty | PlanKind::Memcpy) {
        return vec![plan.clone()];
    }
    let e = plan.elem_size as isize;
    // Per dim: (len, |src|, |dst|) in elements.
    let dims: Vec<(i128, i128, i128)> = plan
        .dims
        .iter()
        .map(|d| (d.len as i128, (d.src / e).abs() as i128, (d.dst / e).abs() as i128))
        .collect();
    let numel: i128 = dims.iter().map(|d| d.0).product();
    let reach = |f: fn(&(i128, i128, i128)) -> i128| -> i128 { dims.iter().map(|d| (d.0 - 1) * f(d)).sum() };
    let (src_reach, dst_reach) = (reach(|d| d.1), reach(|d| d.2));
    if numel <= limit && src_reach <= limit && dst_reach <= limit {
        return vec![plan.clone()];
    }
    // Split the dim that reaches furthest (or, when only the count is too big,
    // the outermost): every other dim keeps its extent, so a transpose stays a
    // tiled transpose and a gather keeps its vector width.
    let longest = if src_reach > limit || dst_reach > limit {
        (0..dims.len())
            .filter(|&i| dims[i].0 > 1)
            .max_by_key(|&i| (dims[i].0 - 1) * dims[i].1.max(dims[i].2))
    } else {
        (0..dims.len()).rev().find(|&i| dims[i].0 > 1)
    };
    let Some(k) = longest else {
        return vec![plan.clone()]; // all dims 1: one element, which always fits
    };
    let (len, s, d) = dims[k];
    let (other_numel, other_src, other_dst) = (numel / len, src_reach - (len - 1) * s, dst_reach - (len - 1) * d);
    let mut chunk = limit / other_numel.max(1);
    for (other, stride) in [(other_src, s), (other_dst, d)] {
        if stride != 0 {
            chunk = chunk.min((limit - other).max(0) / stride + 1);
        }
    }
    // Always make progress; a piece still too big is split again below.
    let chunk = chunk.clamp(1, (len / 2).max(1)) as usize;
    let outer = plan.dims[k];
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < outer.len {
        let n = chunk.min(outer.len - start);
        let mut piece = plan.clone();
        piece.src_offset += start as isize * outer.src;
        piece.dst_offset += start as isize * outer.dst;
        piece.numel = plan.numel / outer.len * n;
        piece.dims[k].len = n; // a dim of 1 is harmless to the kernels
        pieces.extend(split_with_limit(&piece, limit));
        start += n;
    }
    pieces
}

fn strided_args(numel: usize, dims: &[(usize, i64, i64)]) -> StridedArgs {
    let mut a = StridedArgs {
        numel: numel as u32,
        ndim: dims.len() as i32,
        size: [DivMagic::default(); MAX_DIMS],
        src_stride: [0; MAX_DIMS],
        dst_stride: [0; MAX_DIMS],
    };
    for (i, &(len, s, d)) in dims.iter().enumerate() {
        a.size[i] = magic(len as u32);
        a.src_stride[i] = s as i32;
        a.dst_stride[i] = d as i32;
    }
    a
}

/// The manifest entry `{prefix}_eE` for an element size.
fn kernel_name(prefix: &str, elem: usize) -> Result<&'static str> {
    if !matches!(elem, 1 | 2 | 4 | 8 | 16) {
        return Err(Error::MissingKernel(format!(
            "{prefix} for {elem}-byte elements (GPU kernels move 1, 2, 4, 8 or 16 bytes)"
        )));
    }
    let want = format!("{prefix}_e{elem}");
    KERNELS
        .iter()
        .copied()
        .find(|k| *k == want)
        .ok_or(Error::MissingKernel(want))
}

/// `copy_vec_eE` for a copy of 32-bit dims whose destination has a
/// unit-stride run (its innermost dim, joined by the next where that one
/// continues it contiguously) of a whole number of vectors, in 16-byte
/// aligned rows (`dst`: the destination base's address); `None` otherwise.
fn vec_call(plan: &CopyPlan, dims: &[(usize, i64, i64)], dst: u64) -> Option<KernelCall> {
    let e = plan.elem_size;
    if !matches!(e, 1 | 2 | 4 | 8) {
        return None;
    }
    let n = VEC_BYTES / e;
    let (inner, src_inner, unit) = *dims.first()?;
    // The run: the inner dim, and the next when its destination stride is
    // the inner dim's length (NCHW -> NHWC: the channels, then the pixels),
    // unless a vector's elements would then lie far apart in the source.
    let (run, src_outer, src_carry, outer) = match dims.get(1) {
        Some(&(len, src, d))
            if d == inner as i64
                && !inner.is_multiple_of(n)
                && src.unsigned_abs() as usize * e * n.div_ceil(inner) <= VEC_MAX_SPAN =>
        {
            (inner * len, src, src - inner as i64 * src_inner, &dims[2..])
        }
        // A run of one dim never wraps inside a vector.
        _ => (inner, 0, 0, &dims[1..]),
    };
    let rows_aligned = outer.iter().all(|d| d.2 % n as i64 == 0);
    if unit != 1 || !run.is_multiple_of(n) || !dst.is_multiple_of(VEC_BYTES as u64) || !rows_aligned {
        return None;
    }
    let mut vectors = vec![(run / n, 0, n as i64)];
    vectors.extend_from_slice(outer);
    let numel = plan.numel / n;
    let blocks = (numel as u64).div_ceil(u64::from(BLOCK * VEC_ILP)) as u32;
    Some(KernelCall {
        name: kernel_name("copy_vec", e).ok()?,
        grid: (blocks.max(1), 1, 1),
        block: (BLOCK, 1, 1),
        args: KernelArgs::Vector(VecArgs {
            inner: magic(inner as u32),
            src_inner: i32::try_from(src_inner).ok()?,
            src_outer: i32::try_from(src_outer).ok()?,
            src_carry: i32::try_from(src_carry).ok()?,
            rows: strided_args(numel, &vectors),
        }),
    })
}

/// Bytes of a global-memory sector: lanes of a warp whose addresses are this
/// far apart each move a sector of their own.
const SECTOR: u64 = 32;

/// The dim the tiled transpose pairs with the destination's fast one
/// (`dims[0]`), reading along it: a dense transpose's unit-stride source dim;
/// in a gather, one along which the source is dense enough to share sectors
/// (two elements a sector or more) while the destination's fast dim is not
/// (a transpose of strided views: `x[:, ::2].T`, the real parts of a complex
/// matrix transposed), where the element kernels' lanes would each read a
/// sector of their own. Both dims at least `PlanOptions::GPU`'s tile extent:
/// flat tiles of a short dim by a long one were tried (emulator, quick bench
/// matrix): NHWC -> NCHW with 3 channels read 82 % of each sector instead of
/// 12.5 % (u8: 50 % instead of 3 %), but took 72-80 lane instructions an
/// element against the vector kernel's 17-29 (5-D permutes of 8-long dims:
/// 200 against 37), which would bind an H200's issue rate before its memory.
fn tiled_partner(plan: &CopyPlan, dims: &[(usize, i64, i64)]) -> Option<usize> {
    match plan.kind {
        PlanKind::Transpose { src_fast } => Some(src_fast),
        PlanKind::General => {
            let e = plan.elem_size as u64;
            let min = PlanOptions::GPU.transpose_min_extent;
            let shares = |stride: i64| stride != 0 && stride.unsigned_abs() * e <= SECTOR / 2;
            let &(len0, src0, dst0) = dims.first()?;
            if len0 < min || shares(src0) || src0 == 0 || !shares(dst0) {
                return None;
            }
            let (k, &(_, _, dst)) = dims
                .iter()
                .enumerate()
                .skip(1)
                .filter(|(_, d)| d.0 >= min && d.1 != 0)
                .min_by_key(|(_, d)| d.1.unsigned_abs())?;
            (shares(dims[k].1) && !shares(dst)).then_some(k)
        }
        _ => None,
    }
}

/// Whether every u32 a packed tile kernel reads or writes is whole and
/// aligned: both fast dims a multiple of `p` long, every other stride (the
/// rows' and the batch dims', in the plan's elements) a multiple of `p`, both
/// bases 4-byte aligned. `p` is the elements that fill whole words: 4 / e of
/// 1- and 2-byte elements, 4 of three-byte pixels (twelve bytes, three words).
fn whole_words(
    p: i64,
    df: (usize, i64, i64),
    sf: (usize, i64, i64),
    batch: &[(usize, i64, i64)],
    dst: u64,
    src: u64,
) -> bool {
    let whole = |x: i64| x % p == 0;
    dst.is_multiple_of(4)
        && src.is_multiple_of(4)
        && whole(df.0 as i64)
        && whole(sf.0 as i64)
        && whole(df.1)
        && whole(sf.2)
        && batch.iter().all(|b| whole(b.1) && whole(b.2))
}

/// Every dim of `dims` but those at `taken`: a tiled transpose's batch dims.
fn batch_dims(dims: &[(usize, i64, i64)], taken: &[usize]) -> Vec<(usize, i64, i64)> {
    dims.iter()
        .enumerate()
        .filter(|(i, _)| !taken.contains(i))
        .map(|(_, d)| *d)
        .collect()
}

/// A call of one of the tiled transpose kernels (`kernel_eE`, E = `e`),
/// whose blocks each move an `edge` x `edge` tile of the destination-fast dim
/// `df` by the source-fast dim `sf` of one batch; `None` past the grid's
/// i32::MAX blocks.
fn transpose_call(
    kernel: &str,
    e: usize,
    edge: usize,
    df: (usize, i64, i64),
    sf: (usize, i64, i64),
    batch: &[(usize, i64, i64)],
) -> Option<KernelCall> {
    let batches: usize = batch.iter().map(|d| d.0).product();
    let tiles_sf = sf.0.div_ceil(edge) as u32;
    let tiles_df = df.0.div_ceil(edge) as u32;
    let blocks = u64::from(tiles_sf) * u64::from(tiles_df) * batches as u64;
    if blocks > i32::MAX as u64 {
        return None;
    }
    Some(KernelCall {
        name: kernel_name(kernel, e).ok()?,
        grid: (blocks as u32, 1, 1),
        block: (TILE, TILE_ROWS, 1),
        args: KernelArgs::Transpose(TransposeArgs {
            n_src_fast: sf.0 as u32,
            n_dst_fast: df.0 as u32,
            src_stride_df: df.1 as i32,
            dst_stride_sf: sf.2 as i32,
            src_stride_sf: sf.1 as i32,
            dst_stride_df: df.2 as i32,
            tiles_sf,
            tiles_df,
            batch: strided_args(batches, batch),
        }),
    })
}

/// What a packed tile's element costs against a plain tile's, in the
/// emulator's lane instructions per element of full tiles (the transpose2d
/// bench patterns): f16 21.2 against 37.8.
const PACKED_COST: f64 = 0.56;

/// How a tile of `edge` slots a side covers the fast dims `df` and `sf`:
/// a side whose dim is at most half the edge long holds runs of W (its
/// extent rounded up to a power of two), one for each of `edge / W`
/// consecutive indices of a fold dim: a batch dim whose extent is a whole
/// number of runs, the nearest on that side (the smallest stride there).
struct Folding {
    /// Slots a side of the tile.
    edge: usize,
    /// The batch, each fold dim's extent divided by its runs a tile, its
    /// strides multiplied by them (the batch as given where nothing folds).
    batch: Vec<(usize, i64, i64)>,
    /// Per side (source-fast, destination-fast): log2 of its slots a run
    /// (log2 of the edge where it is not folded) and its fold dim's
    /// (src, dst) strides of one step.
    sides: [(u32, i64, i64); 2],
    /// The share of the tile's slots that hold an element.
    fill: f64,
}

impl Folding {
    fn new(edge: usize, df: (usize, i64, i64), sf: (usize, i64, i64), batch: &[(usize, i64, i64)]) -> Folding {
        let mut batch = batch.to_vec();
        let mut taken = Vec::new();
        let mut sides = [(edge.trailing_zeros(), 0, 0); 2];
        let mut fill = 1.0;
        for (side, n, on_src) in [(0, sf.0, true), (1, df.0, false)] {
            let w = n.next_power_of_two();
            let runs = edge / w;
            let near = |d: &(usize, i64, i64)| if on_src { d.1 } else { d.2 }.unsigned_abs();
            let fold = (n > 0 && runs >= 2)
                .then(|| {
                    (0..batch.len())
                        .filter(|k| !taken.contains(k) && batch[*k].0.is_multiple_of(runs))
                        .min_by_key(|&k| near(&batch[k]))
                })
                .flatten();
            match fold {
                Some(k) => {
                    let (len, src, dst) = batch[k];
                    batch[k] = (len / runs, src * runs as i64, dst * runs as i64);
                    sides[side] = (w.trailing_zeros(), src, dst);
                    taken.push(k);
                    fill *= n as f64 / w as f64;
                }
                None => fill *= n as f64 / (n.div_ceil(edge) * edge) as f64,
            }
        }
        Folding {
            edge,
            batch,
            sides,
            fill,
        }
    }

    fn folds(&self) -> bool {
        self.sides.iter().any(|s| s.0 != self.edge.trailing_zeros())
    }
}

/// The call of a tiled transpose kernel, `kernel_eE` or, where `folding`
/// folds a side, `kernel_folded_eE`. H200: f32 32⁴ × 16 reversed (the
/// source-fast side 16 long) moved 39.9 % of a memcpy's bytes a second in
/// plain tiles, half their lanes idle; f16 32⁵ permuted (0, 3, 1, 4, 2), both
/// fast dims 32 long, 32.4 % in packed tiles of 64 × 64, a quarter full.
fn tiled_call(
    kernel: &str,
    e: usize,
    df: (usize, i64, i64),
    sf: (usize, i64, i64),
    folding: &Folding,
) -> Option<KernelCall> {
    let edge = folding.edge;
    if !folding.folds() {
        return transpose_call(kernel, e, edge, df, sf, &folding.batch);
    }
    let call = transpose_call(&format!("{kernel}_folded"), e, edge, df, sf, &folding.batch)?;
    let KernelArgs::Transpose(t) = call.args else {
        return None;
    };
    let [(log2_w_sf, src_fsf, dst_fsf), (log2_w_df, src_fdf, dst_fdf)] = folding.sides;
    Some(KernelCall {
        args: KernelArgs::Folded(FoldedArgs {
            t,
            log2_w_sf,
            log2_w_df,
            src_stride_fsf: src_fsf as i32,
            dst_stride_fsf: dst_fsf as i32,
            src_stride_fdf: src_fdf as i32,
            dst_stride_fdf: dst_fdf as i32,
        }),
        ..call
    })
}

/// `transpose_rgb_eE` for a transpose of pixels: a run of three `e`-byte
/// elements (e of 1, 2 or 4) dense on both sides (`dims[0]`), pixels adjacent
/// in the destination along the next dim and in the source along another,
/// both at least a tile's edge long. Without it the run is three elements
/// each lane takes from another row: RGB u8 read 8.3 % of each sector.
/// Bytes whose every u32 is whole and aligned take `transpose_rgb_packed_e1`
/// (`dst`, `src`: the bases' addresses).
fn rgb_call(plan: &CopyPlan, dims: &[(usize, i64, i64)], dst: u64, src: u64) -> Option<KernelCall> {
    let min = TILE as usize;
    let (&run, &df) = (dims.first()?, dims.get(1)?);
    if !matches!(plan.elem_size, 1 | 2 | 4) || run != (3, 1, 1) || df.2 != 3 || df.0 < min {
        return None;
    }
    let k = 2 + dims[2..].iter().position(|d| d.1 == 3 && d.0 >= min)?;
    if !fits_i32(plan.numel, dims) {
        return None;
    }
    let (sf, batch) = (dims[k], batch_dims(dims, &[0, 1, k]));
    // Four pixels (their twelve bytes) to three words.
    let kernel = if plan.elem_size == 1 && whole_words(4, df, sf, &batch, dst, src) {
        "transpose_rgb_packed"
    } else {
        "transpose_rgb"
    };
    // The kernel's strides count elements of the run (T), as the dims do.
    transpose_call(kernel, plan.elem_size, TILE as usize, df, sf, &batch)
}

/// The kernel that performs a planned copy (`Memcpy` and `Empty` plans need
/// none: the caller issues a DMA or nothing). Its arguments are
/// `(src, dst, args)` with `src` / `dst` the addresses of element 0 plus the
/// plan's offsets; `dst` is that address (the vector kernel's alignment).
pub fn copy_call(plan: &CopyPlan, dst: u64, src: u64) -> Result<KernelCall> {
    let dims = unit_dims(plan);
    if dims.len() > MAX_DIMS {
        return Err(Error::Internal("more than 16 dimensions remain after coalescing"));
    }
    if let Some(call) = rgb_call(plan, &dims, dst, src) {
        return Ok(call);
    }
    if let Some(src_fast) = tiled_partner(plan, &dims)
        && plan.elem_size <= 8
        && fits_i32(plan.numel, &dims)
    {
        let (df, sf) = (dims[0], dims[src_fast]);
        let batch = batch_dims(&dims, &[0, src_fast]);
        // `transpose_packed_eE` moves 1- and 2-byte elements four bytes at a
        // time where both fast dims are unit-stride on their side and every
        // u32 is whole (P = 4 / e).
        let e = plan.elem_size;
        let packed =
            matches!(e, 1 | 2) && df.2 == 1 && sf.1 == 1 && whole_words((4 / e) as i64, df, sf, &batch, dst, src);
        // A packed tile is 32 u32s of elements on each side; it pays where
        // it leaves few more of its slots idle than a plain one.
        let plain = Folding::new(TILE as usize, df, sf, &batch);
        let wide = packed.then(|| Folding::new(4 / e * TILE as usize, df, sf, &batch));
        let call = match wide {
            Some(w) if w.fill >= PACKED_COST * plain.fill => tiled_call("transpose_packed", e, df, sf, &w),
            _ => tiled_call("transpose_tiled", e, df, sf, &plain),
        };
        if let Some(call) = call {
            return Ok(call);
        }
    }
    if fits_i32(plan.numel, &dims) {
        if let Some(call) = vec_call(plan, &dims, dst) {
            return Ok(call);
        }
        let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK * ILP)) as u32;
        return Ok(KernelCall {
            name: kernel_name("copy_strided", plan.elem_size)?,
            grid: (blocks.max(1), 1, 1),
            block: (BLOCK, 1, 1),
            args: KernelArgs::Strided(strided_args(plan.numel, &dims)),
        });
    }
    let mut args = StridedArgs64 {
        numel: plan.numel as u64,
        ndim: dims.len() as i32,
        size: [0; MAX_DIMS],
        src_stride: [0; MAX_DIMS],
        dst_stride: [0; MAX_DIMS],
    };
    for (i, &(len, s, d)) in dims.iter().enumerate() {
        args.size[i] = len as u64;
        args.src_stride[i] = s;
        args.dst_stride[i] = d;
    }
    let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK)).min(1 << 20) as u32;
    Ok(KernelCall {
        name: kernel_name("copy_strided64", plan.elem_size)?,
        grid: (blocks.max(1), 1, 1),
        block: (BLOCK, 1, 1),
        args: KernelArgs::Strided64(args),
    })
}

/// The `fill_eE` call for a planned fill and the element value widened to the
/// plan's element size, or `None` when the fill exceeds the 32-bit kernel (the
/// caller then copies from a broadcast tensor). Its arguments are
/// `(dst, value, args)`.
pub fn fill_call(plan: &CopyPlan, value: &[u8]) -> Result<Option<(KernelCall, [u8; 16])>> {
    let dims = unit_dims(plan);
    if dims.len() > MAX_DIMS || !fits_i32(plan.numel, &dims) || value.is_empty() {
        return Ok(None);
    }
    // The plan may have widened the element: repeat the value to fill it.
    let mut wide = [0u8; 16];
    for (i, b) in wide.iter_mut().take(plan.elem_size).enumerate() {
        *b = value[i % value.len()];
    }
    let blocks = (plan.numel as u64).div_ceil(u64::from(BLOCK)).min(1 << 16) as u32;
    Ok(Some((
        KernelCall {
            name: kernel_name("fill", plan.elem_size)?,
            grid: (blocks.max(1), 1, 1),
            block: (BLOCK, 1, 1),
            args: KernelArgs::Strided(strided_args(plan.numel, &dims)),
        },
        wide,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::plan::{BaseAddrs, PlanOptions, plan_copy};

    #[test]
    fn magic_division_is_exact_below_2_pow_31() {
        let divisors = [1u32, 2, 3, 7, 10, 16, 255, 1000, 65_537, (1 << 31) - 1, 1 << 30];
        let dividends = [0u32, 1, 2, 5, 99, 1 << 20, 123_456_789, (1 << 31) - 1];
        for d in divisors {
            let m = magic(d);
            for n in dividends {
                let q = ((u64::from(n) * u64::from(m.mul)) >> 32) as u32;
                let q = (q + n) >> m.shift;
                assert_eq!(q, n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn kernel_argument_structs_match_the_c_layout() {
        // VecArgs: DivMagic (12) + three i32, then StridedArgs.
        assert_eq!(std::mem::offset_of!(VecArgs, rows), 24);
        // StridedArgs: u32 + i32 + 16*12 + 16*4 + 16*4.
        assert_eq!(std::mem::size_of::<StridedArgs>(), 8 + 16 * 12 + 16 * 4 * 2);
        // StridedArgs64: u64, i32 (+4 pad), 3 arrays of 16 eight-byte values.
        assert_eq!(std::mem::size_of::<StridedArgs64>(), 16 + 16 * 8 * 3);
        assert_eq!(std::mem::offset_of!(TransposeArgs, batch), 32);
    }

    /// Every (src, dst) byte-offset pair a plan moves, in a canonical order.
    fn pairs(p: &CopyPlan) -> Vec<(isize, isize)> {
        let mut out = Vec::new();
        let mut idx = vec![0usize; p.dims.len()];
        for _ in 0..p.numel {
            let (mut s, mut d) = (p.src_offset, p.dst_offset);
            for (i, dim) in idx.iter().zip(&p.dims) {
                s += *i as isize * dim.src;
                d += *i as isize * dim.dst;
            }
            out.push((s, d));
            for (i, dim) in idx.iter_mut().zip(&p.dims) {
                *i += 1;
                if *i < dim.len {
                    break;
                }
                *i = 0;
            }
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn split_pieces_cover_the_plan_exactly_and_each_fits() {
        use crate::copy::plan::PlanDim;
        let shapes: [&[(usize, isize, isize)]; 5] = [
            &[(40, 4, 4), (30, 160, 160)],
            &[(7, 4, 4), (5, -28, 28), (9, 140, 140)],
            &[(3000, 4, 4)],
            &[(50, 0, 4), (60, 4, 200)],
            &[(33, 4, 240), (60, 132, 4), (3, 7920, 7920)],
        ];
        for (n, dims) in shapes.iter().enumerate() {
            let numel = dims.iter().map(|d| d.0).product();
            let plan = CopyPlan {
                kind: if n == 4 {
                    PlanKind::Transpose { src_fast: 1 }
                } else {
                    PlanKind::General
                },
                elem_size: 4,
                dims: dims.iter().map(|&(len, src, dst)| PlanDim { len, src, dst }).collect(),
                src_offset: 4 * 4 * 5,
                dst_offset: 0,
                numel,
                src_span: (0, 0),
                dst_span: (0, 0),
            };
            for limit in [100i128, 999, 1 << 20] {
                let pieces = split_with_limit(&plan, limit);
                let mut all: Vec<_> = pieces.iter().flat_map(pairs).collect();
                all.sort_unstable();
                assert_eq!(all, pairs(&plan), "shape {n}, limit {limit}");
                for p in &pieces {
                    let dims = unit_dims(p);
                    let reach = |f: fn(&(usize, i64, i64)) -> i64| -> i128 {
                        dims.iter().map(|d| (d.0 as i128 - 1) * i128::from(f(d)).abs()).sum()
                    };
                    assert!(
                        (p.numel as i128) <= limit && reach(|d| d.1) <= limit && reach(|d| d.2) <= limit,
                        "shape {n}, limit {limit}: a piece does not fit: {p:?}"
                    );
                }
                if limit == 1 << 20 {
                    assert_eq!(pieces.len(), 1, "a plan that fits is not split");
                }
                assert!(
                    pieces.iter().all(|p| p.kind == plan.kind),
                    "pieces keep the plan's kind"
                );
            }
        }
    }

    #[test]
    fn a_transpose_past_2_pow_31_stays_tiled_in_few_pieces() {
        // dst [2^21, 1024] f32 from its transpose: 2^31 elements, the source's
        // fast dim 2^21 elements apart in the destination's fast dim.
        let n = 1usize << 21;
        let plan = plan(&[n, 1024], &[1024, 1], &[1, n as isize], 4);
        assert!(matches!(plan.kind, PlanKind::Transpose { .. }), "{plan:?}");
        let pieces = split_for_32bit(&plan);
        assert!(pieces.len() <= 4, "{} pieces", pieces.len());
        for p in &pieces {
            assert_eq!(copy_call(p, 0, 0).unwrap().name, "transpose_tiled_e4");
        }
    }

    #[test]
    fn thirty_two_bit_bounds() {
        assert!(fits_i32(100, &[(10, 1, 1), (10, 10, 10)]));
        assert!(!fits_i32(1 << 31, &[(1 << 31, 1, 1)]));
        assert!(!fits_i32(4, &[(2, 1 << 31, 1), (2, 1, 2)]));
    }

    fn plan(shape: &[usize], dst: &[isize], src: &[isize], elem: usize) -> CopyPlan {
        plan_copy(
            shape,
            dst,
            src,
            elem,
            BaseAddrs { dst: 0, src: 1 << 40 },
            PlanOptions::GPU,
        )
        .unwrap()
    }

    #[test]
    fn short_fast_dims_fold_the_nearest_batch_dim_into_their_tiles() {
        let folded = |c: &KernelCall| match c.args {
            KernelArgs::Folded(f) => (
                f.log2_w_sf,
                f.log2_w_df,
                (f.src_stride_fsf, f.dst_stride_fsf),
                (f.src_stride_fdf, f.dst_stride_fdf),
                f.t.batch.ndim,
            ),
            other => panic!("{} takes {other:?}", c.name),
        };
        // f32 [20, 6, 4, 16] reversed: the source-fast dim 16 long takes runs
        // of the 4-long dim (source stride 16, not the 6-long one's 64),
        // halved to 2 in the batch; the destination-fast dim 20 is not folded.
        let p = plan(&[16, 4, 6, 20], &[480, 120, 20, 1], &[1, 16, 64, 384], 4);
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!(c.name, "transpose_tiled_folded_e4");
        assert_eq!(folded(&c), (4, 5, (16, 120), (0, 0), 2));
        assert_eq!(c.grid.0, 2 * 6, "1 x 1 tiles, 4 / 2 x 6 batches");
        // The same with a fold dim of odd extent: a plain tile.
        let p = plan(&[16, 5, 20], &[100, 20, 1], &[1, 16, 80], 4);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_tiled_e4");
        // f16 [2, 4, 32, 4, 32] permuted (0, 3, 1, 4, 2): both fast dims 32
        // long, a packed tile of 64 x 64 with both sides folded (two runs
        // each): the source-fast side by the dim of source stride 32, the
        // destination-fast side by the remaining dim of least destination stride.
        let p = plan(
            &[2, 4, 4, 32, 32],
            &[16384, 4096, 1024, 32, 1],
            &[16384, 32, 4096, 1, 128],
            2,
        );
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!(c.name, "transpose_packed_folded_e2");
        assert_eq!(folded(&c), (5, 5, (32, 4096), (4096, 1024), 3));
        assert_eq!(c.grid.0, 2 * 2 * 2, "2 x 4 / 2 x 4 / 2 batches of one tile");
        // Off whole u32s: the one-element kernel, whose tile the 32-long dims fill.
        assert_eq!(copy_call(&p, 0, 2).unwrap().name, "transpose_tiled_e2");
    }

    #[test]
    fn transposes_pick_the_tiled_kernel_with_whole_tiles() {
        // dst [300, 200] contiguous, src its transpose: 10 x 7 tiles of 32.
        let c = copy_call(&plan(&[300, 200], &[200, 1], &[1, 300], 4), 0, 0).unwrap();
        assert_eq!(c.name, "transpose_tiled_e4");
        assert_eq!(c.block, (32, 8, 1));
        assert_eq!(c.grid.0, 7 * 10);
    }

    #[test]
    fn byte_and_half_transposes_pack_four_bytes_where_every_u32_is_whole() {
        // u8 [256, 128] from its transpose: tiles of 128 x 128 bytes.
        let p = plan(&[256, 128], &[128, 1], &[1, 256], 1);
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!((c.name, c.block, c.grid.0), ("transpose_packed_e1", (32, 8, 1), 2));
        // u16, batched: tiles of 64 x 64 elements.
        let p = plan(&[3, 128, 192], &[192 * 128, 192, 1], &[192 * 128, 1, 128], 2);
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!((c.name, c.grid.0), ("transpose_packed_e2", 3 * 2 * 3));
        // Element by element: a base off 4 bytes, an extent or a row stride
        // not a multiple of 4 / e, a strided source, wider elements.
        let p = plan(&[256, 128], &[128, 1], &[1, 256], 1);
        assert_eq!(copy_call(&p, 0, 2).unwrap().name, "transpose_tiled_e1");
        assert_eq!(copy_call(&p, 8, 0).unwrap().name, "transpose_packed_e1");
        assert_eq!(copy_call(&p, 6, 0).unwrap().name, "transpose_tiled_e1");
        let p = plan(&[255, 128], &[128, 1], &[1, 255], 1);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_tiled_e1");
        let p = plan(&[256, 126], &[126, 1], &[1, 256], 2);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_packed_e2");
        let p = plan(&[256, 127], &[127, 1], &[1, 256], 2);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_tiled_e2");
        let p = plan(&[256, 128], &[128, 1], &[2, 512], 1);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_tiled_e1");
        let p = plan(&[256, 128], &[128, 1], &[1, 256], 4);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "transpose_tiled_e4");
    }

    #[test]
    fn transposes_of_strided_views_pick_the_tiled_kernel_on_their_dense_pair() {
        // x[:, ::2].T of a 256 x 512 f32 matrix: read along the stride-2 dim.
        let c = copy_call(&plan(&[256, 256], &[256, 1], &[2, 512], 4), 0, 0).unwrap();
        assert_eq!(c.name, "transpose_tiled_e4");
        let KernelArgs::Transpose(a) = c.args else {
            panic!("{c:?}")
        };
        assert_eq!((a.src_stride_sf, a.src_stride_df), (2, 512));
        assert_eq!((a.dst_stride_sf, a.dst_stride_df), (256, 1));
        assert_eq!((a.tiles_sf, a.tiles_df, a.batch.numel), (8, 8, 1));
        // The real parts of a complex128 matrix transposed, batched; one
        // channel of u8 pixels transposed (3 bytes apart along the rows).
        let c = copy_call(&plan(&[4, 64, 64], &[4096, 64, 1], &[16384, 2, 256], 8), 0, 0).unwrap();
        assert_eq!(c.name, "transpose_tiled_e8");
        let KernelArgs::Transpose(a) = c.args else {
            panic!("{c:?}")
        };
        assert_eq!((a.src_stride_sf, a.batch.numel), (2, 4));
        let c = copy_call(&plan(&[1920, 1080], &[1080, 1], &[3, 5760], 1), 0, 0).unwrap();
        assert_eq!(c.name, "transpose_tiled_e1");
        // Reads that already share sectors along the destination's rows, a
        // source dense along no other dim, or a partner too short to tile: not tiled.
        for (shape, src) in [([64, 256], [256, 2]), ([64, 256], [1024, 512]), ([8, 256], [1, 8])] {
            let c = copy_call(&plan(&shape, &[256, 1], &src, 4), 0, 0).unwrap();
            assert_ne!(c.name, "transpose_tiled_e4", "{shape:?} {src:?}");
        }
    }

    #[test]
    fn gathers_pick_the_strided_kernel_and_cover_every_element() {
        // A destination 2 bytes past a 16-byte boundary: no vectors.
        let c = copy_call(&plan(&[1000], &[1], &[3], 2), 2, 0).unwrap();
        assert_eq!(c.name, "copy_strided_e2");
        let threads = u64::from(c.grid.0) * u64::from(c.block.0) * u64::from(ILP);
        assert!(threads >= 1000);
    }

    #[test]
    fn unit_stride_destination_runs_pick_the_vector_kernel() {
        // Rows of 1000 u16 (125 vectors of 8) read with stride 3.
        let c = copy_call(&plan(&[1000], &[1], &[3], 2), 64, 0).unwrap();
        assert_eq!(c.name, "copy_vec_e2");
        let KernelArgs::Vector(a) = c.args else { panic!("{c:?}") };
        assert_eq!((a.inner.div, a.src_inner, a.src_outer, a.rows.numel), (1000, 3, 0, 125));
        assert_eq!((a.rows.src_stride[0], a.rows.dst_stride[0]), (0, 8));
        let threads = u64::from(c.grid.0) * u64::from(c.block.0) * u64::from(VEC_ILP);
        assert!(threads >= 125);
        // Broadcast columns (source stride 0) and flips (-1) of f32 rows.
        let c = copy_call(&plan(&[64, 256], &[256, 1], &[1, 0], 4), 0, 0).unwrap();
        assert_eq!(c.name, "copy_vec_e4");
        let c = copy_call(&plan(&[64, 256], &[256, 1], &[256, -1], 4), 0, 0).unwrap();
        assert_eq!(c.name, "copy_vec_e4");
        // NCHW -> NHWC with 3 channels: the run is the pixels' channels, the
        // inner index wrapping every 3 elements.
        let (n, ch, hw) = (2usize, 3usize, 1024usize);
        let p = plan(
            &[n, hw, ch],
            &[(hw * ch) as isize, ch as isize, 1],
            &[(ch * hw) as isize, 1, hw as isize],
            1,
        );
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!(c.name, "copy_vec_e1");
        let KernelArgs::Vector(a) = c.args else { panic!("{c:?}") };
        assert_eq!(
            (a.inner.div, a.src_inner, a.src_outer, a.src_carry),
            (3, 1024, 1, 1 - 3 * 1024)
        );
        assert_eq!(a.rows.numel as usize, n * hw * ch / 16);
        // And back: the run is the plane.
        let p = plan(
            &[n, ch, hw],
            &[(ch * hw) as isize, hw as isize, 1],
            &[(hw * ch) as isize, 1, ch as isize],
            4,
        );
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "copy_vec_e4");
        // RGB pixels transposed: the pixel kernel, tiles of pixels; with
        // pixels too few a side, the run would take a byte from another
        // source row each, so it is not joined.
        let p = plan(&[64, 32, 3], &[96, 3, 1], &[3, 192, 1], 1);
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!(c.name, "transpose_rgb_packed_e1");
        // A base or a row stride off whole u32s: a byte a lane.
        assert_eq!(copy_call(&p, 0, 1).unwrap().name, "transpose_rgb_e1");
        let odd = plan(&[64, 33, 3], &[99, 3, 1], &[3, 192, 1], 1);
        assert_eq!(copy_call(&odd, 0, 0).unwrap().name, "transpose_rgb_e1");
        let KernelArgs::Transpose(a) = c.args else {
            panic!("{c:?}")
        };
        assert_eq!(
            (
                a.n_src_fast,
                a.n_dst_fast,
                a.src_stride_df,
                a.dst_stride_sf,
                a.tiles_sf,
                a.tiles_df
            ),
            (64, 32, 192, 96, 2, 1)
        );
        assert_eq!((c.grid.0, a.batch.numel), (2, 1));
        let p = plan(&[64, 16, 3], &[48, 3, 1], &[3, 192, 1], 1);
        assert_eq!(copy_call(&p, 0, 0).unwrap().name, "copy_strided_e1");
        // A batch of f32 pixels (three runs of 4 bytes), transposed.
        let p = plan(&[5, 40, 33, 3], &[3960, 99, 3, 1], &[3960, 3, 120, 1], 4);
        let c = copy_call(&p, 0, 0).unwrap();
        assert_eq!(c.name, "transpose_rgb_e4");
        let KernelArgs::Transpose(a) = c.args else {
            panic!("{c:?}")
        };
        assert_eq!(
            (a.n_src_fast, a.n_dst_fast, a.batch.numel, c.grid.0),
            (40, 33, 5, 5 * 2 * 2)
        );
        // Not a whole number of vectors a run, rows not 16-byte aligned, or a
        // destination not aligned: element by element.
        for (shape, dst, dst_at) in [
            ([64, 250], [256, 1], 0u64),
            ([64, 256], [258, 1], 0),
            ([64, 256], [256, 1], 4),
        ] {
            let c = copy_call(&plan(&shape, &dst, &[1, 0], 4), dst_at, 0).unwrap();
            assert_eq!(c.name, "copy_strided_e4", "{shape:?} {dst:?} at {dst_at}");
        }
    }

    #[test]
    fn fills_repeat_the_value_across_a_widened_element() {
        let p = crate::copy::plan::plan_fill(&[64], &[1], 2, 0, PlanOptions::GPU).unwrap();
        let (c, wide) = fill_call(&p, &[0xab, 0xcd]).unwrap().unwrap();
        assert!(c.name.starts_with("fill_e"));
        for (i, b) in wide.iter().take(p.elem_size).enumerate() {
            assert_eq!(*b, [0xab, 0xcd][i % 2]);
        }
    }
}
