//! The staging buffer: scratch for a gathered run or a transposed tile.

/// Bytes of the on-stack staging buffer (a gathered run, a small tile).
pub(super) const STAGE: usize = 16 << 10;

/// A 64-byte aligned, uninitialised staging buffer.
#[repr(C, align(64))]
struct Stage(std::mem::MaybeUninit<[u8; STAGE]>);

/// A cache line of the big staging buffer (which is line-aligned: AVX2
/// micro tiles storing into it then never straddle two lines).
#[repr(C, align(64))]
struct Line(std::mem::MaybeUninit<[u8; 64]>);

thread_local! {
    /// Per-thread staging area for tiles larger than [`STAGE`], kept between calls.
    static BIG_STAGE: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with an uninitialised scratch buffer of at least `bytes` bytes
/// (64-byte aligned): on the stack up to [`STAGE`], else a per-thread buffer.
#[inline(always)]
pub(super) fn with_stage<R>(bytes: usize, f: impl FnOnce(*mut u8) -> R) -> R {
    if bytes <= STAGE {
        let mut stage = Stage(std::mem::MaybeUninit::uninit());
        return f(stage.0.as_mut_ptr().cast());
    }
    let lines = bytes.div_ceil(64);
    let mut f = Some(f);
    let r = BIG_STAGE.try_with(|cell| {
        let mut v = cell.try_borrow_mut().ok()?;
        v.reserve(lines); // len stays 0: capacity ≥ lines
        let f = f.take()?;
        Some(f(v.as_mut_ptr().cast()))
    });
    match (r, f) {
        (Ok(Some(r)), _) => r,
        // Re-entered or torn down thread-local: a fresh buffer.
        (_, Some(f)) => {
            let mut v: Vec<Line> = Vec::with_capacity(lines);
            f(v.as_mut_ptr().cast())
        }
        (_, None) => unreachable!("the closure ran but produced no value"),
    }
}
