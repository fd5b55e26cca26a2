//! Primary contexts and the per-thread current-context stack
//! (group__CUDA__PRIMARY__CTX, group__CUDA__CTX, group__CUDA__PEER__ACCESS:
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html>).
//!
//! Each device has exactly one context, its primary context, created at
//! `cuInit` and living for the whole process (its handle stays the same
//! across retain/release, as the driver's does). A context owns its streams
//! (the legacy default stream, the per-thread default streams, user streams),
//! its peer-access set and its sticky error.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;

use super::device::{device, devices};
use super::race::{self, VClock};
use super::stream::{Stream, StreamKind};
use super::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, CUdevice, CUresult, Handle, Result,
    api, code, err, lock, null_arg, out,
};

/// The user streams of a context.
///
/// group__CUDA__STREAM, cuStreamDestroy_v2
/// (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>):
/// "In case the device is still doing work in the stream hStream when
/// cuStreamDestroy() is called, the function will return immediately and the
/// resources associated with hStream will be released automatically once the
/// device has completed all work in hStream." So a destroyed stream stays in
/// `list` (its handle is gone) until its worker drained it; it is then
/// *retired*: removed, and its final clock joined into `retired` (and
/// `retired_blocking` for a blocking stream), so that a later host
/// synchronisation with the whole context (cuCtxSynchronize) or the legacy
/// stream's implicit synchronisation with blocking streams still
/// happens-after its work. List and clocks change together under one lock:
/// a snapshot sees each stream either listed or retired.
#[derive(Default)]
pub(crate) struct UserStreams {
    /// Live user streams and destroyed ones with work not yet completed.
    pub(crate) list: Vec<Arc<Stream>>,
    /// Join of the final clocks of retired streams.
    retired: VClock,
    /// Join of the final clocks of retired blocking streams.
    retired_blocking: VClock,
}

/// A (primary) context.
pub struct Context {
    pub device: u32,
    /// Primary-context retain count.
    retained: AtomicU32,
    /// The sticky error (a kernel fault or sanitizer finding): once set, every
    /// call on the context returns it, as on a GPU.
    sticky: Mutex<Option<CUresult>>,
    /// Devices whose memory this context's kernels may access (cuCtxEnablePeerAccess).
    peers: Mutex<HashSet<u32>>,
    legacy: OnceLock<Arc<Stream>>,
    per_thread: Mutex<HashMap<ThreadId, Arc<Stream>>>,
    /// User streams not yet destroyed, and destroyed ones still doing work.
    pub(crate) streams: Mutex<UserStreams>,
    /// Serialises enqueueing, so the legacy stream's implicit dependencies
    /// see a consistent set of streams.
    pub(crate) enqueue_lock: Mutex<()>,
}

impl Context {
    pub(crate) fn new_primary(device: u32) -> Context {
        Context {
            device,
            retained: AtomicU32::new(0),
            sticky: Mutex::new(None),
            peers: Mutex::new(HashSet::new()),
            legacy: OnceLock::new(),
            per_thread: Mutex::new(HashMap::new()),
            streams: Mutex::new(UserStreams::default()),
            enqueue_lock: Mutex::new(()),
        }
    }

    /// The handle of this context.
    pub fn handle(&'static self) -> Handle {
        (self as *const Context).cast_mut().cast()
    }

    /// The sticky error, if a kernel faulted.
    pub fn sticky(&self) -> Option<CUresult> {
        *lock(&self.sticky)
    }

    /// Makes `code` the context's sticky error (the first one wins) and prints
    /// `message` once.
    pub(crate) fn set_sticky(&self, code: CUresult, message: &str) {
        let mut s = lock(&self.sticky);
        if s.is_none() {
            *s = Some(code);
            drop(s);
            let name = super::error_strings(code).map_or("?".into(), |(n, _)| n.to_string_lossy());
            super::report_message(
                &format!(
                    "device {} context error {name} ({code}, sticky: every later call on this context returns it)",
                    self.device
                ),
                message,
            );
        }
    }

    /// `Err(sticky)` when the context has a sticky error.
    pub fn check(&self) -> Result<()> {
        self.sticky().map_or(Ok(()), code)
    }

    /// The legacy default stream (`CU_STREAM_LEGACY`, NULL).
    pub fn legacy(&'static self) -> Arc<Stream> {
        self.legacy
            .get_or_init(|| Stream::new(self, StreamKind::Legacy))
            .clone()
    }

    /// The calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub fn per_thread(&'static self) -> Arc<Stream> {
        let id = std::thread::current().id();
        lock(&self.per_thread)
            .entry(id)
            .or_insert_with(|| Stream::new(self, StreamKind::PerThread))
            .clone()
    }

    /// Every stream of the context that may still have work (legacy,
    /// per-thread, user streams, destroyed streams still draining) and the
    /// joined final clock of the retired (destroyed and drained) ones; with
    /// `blocking_only`, only streams that synchronise with the legacy stream.
    pub(crate) fn streams_snapshot(&'static self, blocking_only: bool) -> (Vec<Arc<Stream>>, VClock) {
        let mut v = vec![self.legacy()];
        v.extend(lock(&self.per_thread).values().cloned());
        let u = lock(&self.streams);
        v.extend(u.list.iter().filter(|s| !blocking_only || s.blocking()).cloned());
        let retired = if blocking_only {
            u.retired_blocking.clone()
        } else {
            u.retired.clone()
        };
        (v, retired)
    }

    /// Registers a new user stream.
    pub(crate) fn add_stream(&self, s: Arc<Stream>) {
        lock(&self.streams).list.push(s);
    }

    /// A destroyed stream completed all its work: it leaves the list and its
    /// final clock `last` joins the retired clocks (see [`UserStreams`]).
    pub(crate) fn retire(&self, s: &Arc<Stream>, last: &VClock) {
        let mut u = lock(&self.streams);
        u.list.retain(|o| !Arc::ptr_eq(o, s));
        u.retired.join(last);
        if s.blocking() {
            u.retired_blocking.join(last);
        }
    }

    /// Blocks the host until the device has completed all work of the
    /// context, including work queued on streams destroyed since
    /// (cuStreamDestroy_v2, group__CUDA__STREAM); the host thread then
    /// happens-after all of it.
    pub fn synchronize_host(&'static self) {
        let (streams, retired) = self.streams_snapshot(false);
        for s in streams {
            s.synchronize_host();
        }
        race::host_join(&retired);
    }

    /// Waits until the device has completed all work of the context, as
    /// [`Context::synchronize_host`], but without ordering the host after it:
    /// the emulator's own wait where the API promises no synchronisation.
    pub(crate) fn wait_idle(&'static self) {
        let (streams, _) = self.streams_snapshot(false);
        for s in streams {
            s.wait_idle();
        }
    }

    /// cuCtxSynchronize (group__CUDA__CTX,
    /// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html>):
    /// "Blocks until the current context has completed all preceding
    /// requested tasks" — those of destroyed streams included — then returns
    /// the sticky error of a failed one.
    pub fn synchronize(&'static self) -> Result<()> {
        self.synchronize_host();
        self.check()
    }

    /// Whether this context's kernels may access device `other`'s memory.
    pub fn can_access(&self, other: u32) -> bool {
        other == self.device || lock(&self.peers).contains(&other)
    }

    /// The peer devices enabled for this context.
    pub fn peers(&self) -> Vec<u32> {
        lock(&self.peers).iter().copied().collect()
    }
}

thread_local! {
    /// The calling thread's context stack (top = current).
    static STACK: RefCell<Vec<&'static Context>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context, if any.
pub fn current_opt() -> Option<&'static Context> {
    STACK.with(|s| s.borrow().last().copied())
}

/// The current context, or `CUDA_ERROR_INVALID_CONTEXT`.
pub fn current() -> Result<&'static Context> {
    current_opt().map_or_else(
        || {
            err(
                CUDA_ERROR_INVALID_CONTEXT,
                "no context is current on this thread (cuCtxSetCurrent / cuDevicePrimaryCtxRetain)",
            )
        },
        Ok,
    )
}

/// The current context, or its sticky error.
pub fn current_ok() -> Result<&'static Context> {
    let c = current()?;
    c.check()?;
    Ok(c)
}

/// The context behind a handle; NULL or foreign: `CUDA_ERROR_INVALID_CONTEXT`.
pub fn from_handle(h: Handle) -> Result<&'static Context> {
    devices()
        .iter()
        .map(|d| &d.primary)
        .find(|c| std::ptr::eq(*c as *const Context, h.cast::<Context>()))
        .map_or_else(
            || err(CUDA_ERROR_INVALID_CONTEXT, format!("{h:p} is not a context")),
            Ok,
        )
}

/// `cuDevicePrimaryCtxRetain`: "Retains the primary context on the device ...
/// Unlike cuCtxCreate() the newly created context is not pushed onto the stack."
///
/// # Safety
///
/// `pctx` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxRetain", || {
        if pctx.is_null() {
            return null_arg("pctx");
        }
        let d = device(dev)?;
        d.primary.retained.fetch_add(1, Ordering::AcqRel);
        // SAFETY: forwarded.
        unsafe { out(pctx, "pctx", d.primary.handle()) }
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: decrements the retain count;
/// `CUDA_ERROR_INVALID_CONTEXT` when it is already zero. The emulated primary
/// context keeps its state (streams, allocations) when the count reaches zero.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    super::entry("cuDevicePrimaryCtxRelease_v2", true, 11000, || {
        let d = device(dev)?;
        d.primary
            .retained
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .or_else(|_| err(CUDA_ERROR_INVALID_CONTEXT, "the primary context is not retained"))
    })
}

/// `cuDevicePrimaryCtxGetState`: "Get the state of the primary context.
/// Returns in *flags the flags for the primary context of dev, and in *active
/// whether it is active." (group__CUDA__PRIMARY__CTX:
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PRIMARY__CTX.html>).
/// The primary context is active while its retain count is above zero; the
/// emulator keeps no flags (`cuDevicePrimaryCtxSetFlags` is not emulated): 0.
///
/// # Safety
///
/// `flags` and `active` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    api("cuDevicePrimaryCtxGetState", || {
        let d = device(dev)?;
        let is_active = c_int::from(d.primary.retained.load(Ordering::Acquire) > 0);
        // SAFETY: forwarded.
        unsafe { out(flags, "flags", 0 as c_uint) }?;
        // SAFETY: forwarded.
        unsafe { out(active, "active", is_active) }
    })
}

/// `cuCtxGetCurrent`: "Returns in *pctx the CUDA context bound to the calling
/// CPU thread. If no context is bound to the calling CPU thread then *pctx is
/// set to NULL and CUDA_SUCCESS is returned."
///
/// # Safety
///
/// `pctx` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    api("cuCtxGetCurrent", || {
        let h = current_opt().map_or(std::ptr::null_mut(), |c| c.handle());
        // SAFETY: forwarded.
        unsafe { out(pctx, "pctx", h) }
    })
}

/// `cuCtxSetCurrent`: "If there exists a CUDA context stack on the calling CPU
/// thread, this will replace the top of that stack with ctx. If ctx is NULL
/// then this will be equivalent to popping the top of the calling CPU thread's
/// CUDA context stack (or a no-op if the calling CPU thread's CUDA context
/// stack is empty)."
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    api("cuCtxSetCurrent", || {
        if ctx.is_null() {
            STACK.with(|s| s.borrow_mut().pop());
            return Ok(());
        }
        let c = from_handle(ctx)?;
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            s.pop();
            s.push(c);
        });
        Ok(())
    })
}

/// `cuCtxPushCurrent_v2`: pushes `ctx` on the thread's stack.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    api("cuCtxPushCurrent_v2", || {
        let c = from_handle(ctx)?;
        STACK.with(|s| s.borrow_mut().push(c));
        Ok(())
    })
}

/// `cuCtxPopCurrent_v2`: pops the current context, returning it in `*pctx`
/// if non-NULL; `CUDA_ERROR_INVALID_CONTEXT` when the stack is empty.
///
/// # Safety
///
/// `pctx` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    api("cuCtxPopCurrent_v2", || {
        let c = STACK
            .with(|s| s.borrow_mut().pop())
            .map_or_else(|| code(CUDA_ERROR_INVALID_CONTEXT), Ok)?;
        if !pctx.is_null() {
            // SAFETY: non-null, valid per the contract.
            unsafe { pctx.write(c.handle()) };
        }
        Ok(())
    })
}

/// `cuCtxGetDevice`: the device of the current context;
/// `CUDA_ERROR_INVALID_CONTEXT` with none current.
///
/// # Safety
///
/// `dev` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    api("cuCtxGetDevice", || {
        if dev.is_null() {
            return null_arg("device");
        }
        let c = current()?;
        // SAFETY: forwarded.
        unsafe { out(dev, "device", c.device as CUdevice) }
    })
}

/// `cuCtxSynchronize`: "Blocks until the current context has completed all
/// preceding requested tasks ... returns an error if one of the preceding
/// tasks failed."
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    api("cuCtxSynchronize", || current()?.synchronize())
}

/// `cuCtxEnablePeerAccess`: lets the current context access `peer`'s memory
/// (group__CUDA__PEER__ACCESS). Flags must be 0; already enabled:
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`; a context with itself:
/// `CUDA_ERROR_INVALID_DEVICE` (cuDeviceCanAccessPeer reports 0).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) -> CUresult {
    api("cuCtxEnablePeerAccess", || {
        let c = current_ok()?;
        let p = from_handle(peer)?;
        if flags != 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("Flags must be 0, got {flags}"));
        }
        if p.device == c.device {
            return err(
                CUDA_ERROR_INVALID_DEVICE,
                "a context cannot enable peer access to itself",
            );
        }
        if !lock(&c.peers).insert(p.device) {
            return code(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

/// `cuCtxDisablePeerAccess`: `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` if it was not enabled.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> CUresult {
    api("cuCtxDisablePeerAccess", || {
        let c = current_ok()?;
        let p = from_handle(peer)?;
        if !lock(&c.peers).remove(&p.device) {
            return code(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}
