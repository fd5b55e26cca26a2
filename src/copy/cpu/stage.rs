//! The staging buffer: scratch for a gathered run or a transposed tile.

/// Bytes of the on-stack staging buffer (a gathered run, a small tile).
pub(super) const STAGE: usize = 16 << 10;

/// A 64-byte aligned, uninitialised staging buffer.
#[repr(C, align(64))]
struct Stage(std::mem::MaybeUninit<[u8; STAGE]>);

thread_local! {
    /// Per-thread staging area for tiles larger than [`STAGE`], kept between calls.
    static BIG_STAGE: std::cell::RefCell<Vec<u128>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with an uninitialised scratch buffer of at least `bytes` bytes
/// (16-byte aligned): on the stack up to [`STAGE`], else a per-thread buffer.
#[inline(always)]
pub(super) fn with_stage<R>(bytes: usize, f: impl FnOnce(*mut u8) -> R) -> R {
    if bytes <= STAGE {
        let mut stage = Stage(std::mem::MaybeUninit::uninit());
        return f(stage.0.as_mut_ptr().cast());
    }
    let words = bytes.div_ceil(16);
    let mut f = Some(f);
    let r = BIG_STAGE.try_with(|cell| {
        let mut v = cell.try_borrow_mut().ok()?;
        v.reserve(words); // len stays 0: capacity ≥ words
        let f = f.take()?;
        Some(f(v.as_mut_ptr().cast()))
    });
    match (r, f) {
        (Ok(Some(r)), _) => r,
        // Re-entered or torn down thread-local: a fresh buffer.
        (_, Some(f)) => {
            let mut v: Vec<u128> = Vec::with_capacity(words);
            f(v.as_mut_ptr().cast())
        }
        (_, None) => unreachable!("the closure ran but produced no value"),
    }
}
