//! Streams: a FIFO of operations and a worker thread each
//! (group__CUDA__STREAM: <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>;
//! default-stream semantics: <https://docs.nvidia.com/cuda/cuda-driver-api/stream-sync-behavior.html>).
//!
//! stream-sync-behavior: "The legacy default stream is an implicit stream
//! which synchronizes with all other streams in the same CUcontext except for
//! non-blocking streams ... when taking an action in the legacy stream such
//! as a kernel launch or cuStreamWaitEvent(), the legacy stream first waits
//! on all blocking streams, the action is queued in the legacy stream, and
//! then all blocking streams wait on the legacy stream." And: "The per-thread
//! default stream is not a non-blocking stream and will synchronize with the
//! legacy default stream if both are used in a program."
//!
//! Each operation's dependencies (its stream's previous operation, events
//! waited for, the legacy stream's implicit ones) and its vector clock are
//! fixed when it is enqueued; the worker waits for the dependencies, then
//! (with `DEVTENSOR_EMU_SEED` ≠ 0) sleeps a seeded random time, runs it and
//! checks its memory accesses with the race detector.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::context::{self, Context};
use super::event;
use super::race::{self, Access, Epoch, Site, VClock};
use super::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_UNKNOWN, CUresult, Handle, Registry, Result, api, code, err, lock, null_arg, out, used_after_destroy,
};

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;

/// What an operation does when its stream reaches it: its memory accesses
/// (for the race detector), or an error that becomes the context's sticky error.
pub type Work = Box<dyn FnOnce() -> std::result::Result<Vec<Access>, (CUresult, String)> + Send>;

/// Which stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Legacy,
    PerThread,
    User { non_blocking: bool, priority: c_int },
}

/// A dependency captured at enqueue time: operation `seq` of `stream`.
#[derive(Clone)]
pub struct Wait {
    pub stream: Arc<Stream>,
    pub seq: u64,
    pub clock: Arc<VClock>,
}

/// What `enqueue` returns: the operation's sequence number and clock.
#[derive(Clone)]
pub struct Ticket {
    pub seq: u64,
    pub clock: Arc<VClock>,
}

struct Op {
    seq: u64,
    deps: Vec<(Arc<Stream>, u64)>,
    epoch: Epoch,
    work: Work,
}

struct State {
    queue: VecDeque<Op>,
    enqueued: u64,
    completed: u64,
    /// The clock of the last enqueued operation.
    clock: Arc<VClock>,
    destroyed: bool,
    worker: bool,
}

/// A stream.
pub struct Stream {
    pub ctx: &'static Context,
    pub kind: StreamKind,
    /// Its clock component.
    pub comp: u32,
    handle: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    rng: AtomicU64,
}

pub(crate) static STREAMS: Registry<Stream> = Registry::new(0x57);

impl Stream {
    pub(crate) fn new(ctx: &'static Context, kind: StreamKind) -> Arc<Stream> {
        let comp = race::new_component();
        let seed = crate::config::get().seed;
        Arc::new(Stream {
            ctx,
            kind,
            comp,
            handle: AtomicU64::new(match kind {
                StreamKind::Legacy => CU_STREAM_LEGACY as u64,
                StreamKind::PerThread => CU_STREAM_PER_THREAD as u64,
                StreamKind::User { .. } => 0,
            }),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                clock: Arc::new(VClock::default()),
                destroyed: false,
                worker: false,
            }),
            cv: Condvar::new(),
            rng: AtomicU64::new(seed ^ (u64::from(comp).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1),
        })
    }

    /// Whether it synchronises with the legacy default stream.
    pub fn blocking(&self) -> bool {
        !matches!(self.kind, StreamKind::User { non_blocking: true, .. })
    }

    /// The handle the application knows it by.
    pub fn handle(&self) -> Handle {
        self.handle.load(Ordering::Relaxed) as Handle
    }

    /// "stream 0x… (device 0, non-blocking)".
    pub fn describe(&self) -> String {
        match self.kind {
            StreamKind::Legacy => format!("the legacy default stream of device {}", self.ctx.device),
            StreamKind::PerThread => format!("the per-thread default stream of device {}", self.ctx.device),
            StreamKind::User { non_blocking, .. } => format!(
                "stream {:p} (device {}, {})",
                self.handle(),
                self.ctx.device,
                if non_blocking { "non-blocking" } else { "blocking" }
            ),
        }
    }

    /// The last enqueued operation: (seq, clock).
    fn last(&self) -> (u64, Arc<VClock>) {
        let s = lock(&self.state);
        (s.enqueued, s.clock.clone())
    }

    /// Enqueues `work`; it runs after the stream's previous operations, the
    /// `waits`, and the legacy stream's implicit dependencies.
    pub fn enqueue(
        self: &Arc<Self>,
        api: &'static str,
        kernel: Option<String>,
        waits: Vec<Wait>,
        work: Work,
    ) -> Ticket {
        let _g = lock(&self.ctx.enqueue_lock);
        let mut clock = race::host_clock();
        let mut deps = Vec::new();
        for w in waits {
            clock.join(&w.clock);
            if w.seq > 0 && !Arc::ptr_eq(&w.stream, self) {
                deps.push((w.stream, w.seq));
            }
        }
        let implicit: Vec<Arc<Stream>> = match self.kind {
            // stream-sync-behavior: "the legacy stream first waits on all
            // blocking streams" — destroyed blocking streams still doing work
            // included (cuStreamDestroy_v2, group__CUDA__STREAM: their work
            // goes on); those already drained are in the retired clock.
            StreamKind::Legacy => {
                let (streams, retired) = self.ctx.streams_snapshot(true);
                clock.join(&retired);
                streams
            }
            _ if self.blocking() => vec![self.ctx.legacy()],
            _ => Vec::new(),
        };
        for s in implicit {
            if Arc::ptr_eq(&s, self) {
                continue;
            }
            let (seq, c) = s.last();
            if seq > 0 {
                clock.join(&c);
                deps.push((s, seq));
            }
        }
        let mut st = lock(&self.state);
        clock.join(&st.clock);
        let time = clock.tick(self.comp);
        let clock = Arc::new(clock);
        st.clock = clock.clone();
        st.enqueued += 1;
        let seq = st.enqueued;
        let epoch = Epoch {
            comp: self.comp,
            time,
            clock: clock.clone(),
            site: Arc::new(Site {
                api,
                stream: self.describe(),
                seq,
                kernel,
            }),
        };
        st.queue.push_back(Op { seq, deps, epoch, work });
        if !st.worker {
            st.worker = true;
            let me = self.clone();
            std::thread::Builder::new()
                .name(format!("emu-stream-{}", self.comp))
                .spawn(move || me.run())
                .expect("spawning a stream worker thread");
        }
        self.cv.notify_all();
        Ticket { seq, clock }
    }

    fn delay(&self) {
        if crate::config::get().seed == 0 {
            return;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        match x % 8 {
            0..=3 => {}
            4..=6 => std::thread::yield_now(),
            _ => std::thread::sleep(Duration::from_micros((x >> 8) % 2000)),
        }
    }

    /// The worker: runs operations in order until the stream is destroyed and
    /// drained; it then retires the stream from its context
    /// (cuStreamDestroy_v2, group__CUDA__STREAM: "the resources associated
    /// with hStream will be released automatically once the device has
    /// completed all work in hStream").
    fn run(self: Arc<Self>) {
        loop {
            let next = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(op) = st.queue.pop_front() {
                        break Some(op);
                    }
                    if st.destroyed {
                        st.worker = false;
                        break None;
                    }
                    st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some(op) = next else {
                let (_, last) = self.last();
                self.ctx.retire(&self, &last);
                return;
            };
            for (s, seq) in &op.deps {
                s.wait_done(*seq);
            }
            self.delay();
            if self.ctx.sticky().is_none() {
                match catch_unwind(AssertUnwindSafe(op.work)) {
                    Ok(Ok(acc)) => {
                        if let Some(r) = race::record(&acc, &op.epoch) {
                            self.ctx.set_sticky(CUDA_ERROR_LAUNCH_FAILED, &r);
                        }
                    }
                    Ok(Err((code, msg))) => self.ctx.set_sticky(code, &msg),
                    Err(_) => self.ctx.set_sticky(
                        CUDA_ERROR_UNKNOWN,
                        &format!("internal error (panic) in {}", op.epoch.site),
                    ),
                }
            }
            let mut st = lock(&self.state);
            st.completed = op.seq;
            self.cv.notify_all();
        }
    }

    /// Blocks until operation `seq` has completed.
    pub fn wait_done(&self, seq: u64) {
        let mut st = lock(&self.state);
        while st.completed < seq {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether operation `seq` has completed.
    pub fn is_done(&self, seq: u64) -> bool {
        lock(&self.state).completed >= seq
    }

    /// Blocks the host until the operation of `t` completed; the host then
    /// happens-after it.
    pub fn wait_for(&self, t: &Ticket) {
        self.wait_done(t.seq);
        race::host_join(&t.clock);
    }

    /// Blocks until everything enqueued so far completed, without ordering
    /// the host after it (for the race detector).
    pub(crate) fn wait_idle(&self) {
        let (seq, _) = self.last();
        self.wait_done(seq);
    }

    /// Blocks the host until everything enqueued so far completed (cuStreamSynchronize).
    pub fn synchronize_host(&self) {
        let (seq, clock) = self.last();
        self.wait_done(seq);
        race::host_join(&clock);
    }

    /// A wait on the current end of this stream (for event records).
    pub fn tail(self: &Arc<Self>) -> Wait {
        let (seq, clock) = self.last();
        Wait {
            stream: self.clone(),
            seq,
            clock,
        }
    }

    /// Marks the stream destroyed: its worker drains the queue, then retires
    /// it; a stream without a worker (nothing ever enqueued) retires now.
    fn destroy(self: &Arc<Self>) {
        let idle = {
            let mut st = lock(&self.state);
            st.destroyed = true;
            self.cv.notify_all();
            !st.worker
        };
        if idle {
            let (_, last) = self.last();
            self.ctx.retire(self, &last);
        }
    }
}

/// The stream behind a handle: NULL and `CU_STREAM_LEGACY` are the legacy
/// default stream of the current context, `CU_STREAM_PER_THREAD` the calling
/// thread's per-thread default stream; others must be live streams
/// (`CUDA_ERROR_INVALID_HANDLE`). A context with a sticky error returns it.
pub fn resolve(h: Handle) -> Result<Arc<Stream>> {
    let s = match h as usize {
        0 | CU_STREAM_LEGACY => context::current_ok()?.legacy(),
        CU_STREAM_PER_THREAD => context::current_ok()?.per_thread(),
        _ => STREAMS.get(h).map_or_else(
            || {
                if STREAMS.was_removed(h) {
                    used_after_destroy("stream", "cuStreamDestroy", h);
                }
                err(CUDA_ERROR_INVALID_HANDLE, format!("{h:p} is not a live stream"))
            },
            Ok,
        )?,
    };
    s.ctx.check()?;
    Ok(s)
}

fn create(call: &'static str, ph: *mut Handle, flags: c_uint, priority: c_int) -> Result<()> {
    if ph.is_null() {
        return null_arg("phStream");
    }
    if flags & !CU_STREAM_NON_BLOCKING != 0 {
        return err(CUDA_ERROR_INVALID_VALUE, format!("{call}: unknown flags {flags:#x}"));
    }
    let ctx = context::current_ok()?;
    let s = Stream::new(
        ctx,
        StreamKind::User {
            non_blocking: flags & CU_STREAM_NON_BLOCKING != 0,
            priority: priority.clamp(-5, 0),
        },
    );
    let h = STREAMS.insert(s.clone());
    s.handle.store(h as u64, Ordering::Relaxed);
    ctx.add_stream(s);
    // SAFETY: checked non-null; valid per the caller's contract.
    unsafe { out(ph, "phStream", h) }
}

/// `cuStreamCreate`: flags CU_STREAM_DEFAULT (0) or CU_STREAM_NON_BLOCKING (1):
/// "Work running in the created stream may run concurrently with work in
/// stream 0 (the NULL stream), and the created stream should perform no
/// implicit synchronization with stream 0."
///
/// # Safety
///
/// `ph` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    api("cuStreamCreate", || create("cuStreamCreate", ph, flags, 0))
}

/// `cuStreamCreateWithPriority` (priorities are recorded, not scheduled).
///
/// # Safety
///
/// `ph` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(ph: *mut Handle, flags: c_uint, priority: c_int) -> CUresult {
    api("cuStreamCreateWithPriority", || {
        create("cuStreamCreateWithPriority", ph, flags, priority)
    })
}

/// `cuStreamDestroy_v2`: "In case the device is still doing work in the
/// stream hStream when cuStreamDestroy() is called, the function will return
/// immediately and the resources associated with hStream will be released
/// automatically once the device has completed all work in hStream."
/// The default streams cannot be destroyed (`CUDA_ERROR_INVALID_HANDLE`).
/// The handle dies now; the stream stays in its context's list, keeps
/// draining, and is waited for by cuCtxSynchronize, the legacy stream (if
/// blocking) and the other device-wide synchronisations until its worker
/// has completed its work (see `context::UserStreams`).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: Handle) -> CUresult {
    api("cuStreamDestroy_v2", || {
        if matches!(h as usize, 0 | CU_STREAM_LEGACY | CU_STREAM_PER_THREAD) {
            return err(CUDA_ERROR_INVALID_HANDLE, "the default streams cannot be destroyed");
        }
        let Some(s) = STREAMS.remove(h) else {
            if STREAMS.was_removed(h) {
                used_after_destroy("stream", "cuStreamDestroy", h);
            }
            return err(CUDA_ERROR_INVALID_HANDLE, format!("{h:p} is not a live stream"));
        };
        s.destroy();
        Ok(())
    })
}

/// `cuStreamSynchronize`: "Waits until the device has completed all operations
/// in the stream specified by hStream ... returns an error if one of the
/// preceding tasks failed" (the context's sticky error).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(h: Handle) -> CUresult {
    api("cuStreamSynchronize", || {
        let s = resolve(h)?;
        s.synchronize_host();
        s.ctx.check()
    })
}

/// `cuStreamQuery`: CUDA_SUCCESS if all operations completed,
/// CUDA_ERROR_NOT_READY if not.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(h: Handle) -> CUresult {
    api("cuStreamQuery", || {
        let s = resolve(h)?;
        let (seq, clock) = s.last();
        if s.is_done(seq) {
            race::host_join(&clock);
            s.ctx.check()
        } else {
            code(CUDA_ERROR_NOT_READY)
        }
    })
}

/// `cuStreamWaitEvent`: "Makes all future work submitted to hStream wait for
/// all work captured in hEvent ... hEvent may be from a different context or
/// device than hStream." The event's latest record is captured now (the
/// event may be destroyed right after); an event never recorded: no wait.
/// Flags: CU_EVENT_WAIT_DEFAULT (0) or CU_EVENT_WAIT_EXTERNAL (1).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(h: Handle, ev: Handle, flags: c_uint) -> CUresult {
    api("cuStreamWaitEvent", || {
        let s = resolve(h)?;
        let e = event::from_handle(ev)?;
        if flags > 1 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("unknown flags {flags:#x}"));
        }
        let waits = e.captured().into_iter().collect::<Vec<_>>();
        s.enqueue("cuStreamWaitEvent", None, waits, Box::new(|| Ok(Vec::new())));
        Ok(())
    })
}

/// `cuStreamGetCtx`: the stream's context.
///
/// # Safety
///
/// `pctx` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(h: Handle, pctx: *mut Handle) -> CUresult {
    api("cuStreamGetCtx", || {
        let s = resolve(h)?;
        // SAFETY: forwarded.
        unsafe { out(pctx, "pctx", s.ctx.handle()) }
    })
}

/// `cuStreamGetFlags`.
///
/// # Safety
///
/// `flags` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(h: Handle, flags: *mut c_uint) -> CUresult {
    api("cuStreamGetFlags", || {
        let s = resolve(h)?;
        let f = match s.kind {
            StreamKind::User { non_blocking: true, .. } => CU_STREAM_NON_BLOCKING,
            _ => 0,
        };
        // SAFETY: forwarded.
        unsafe { out(flags, "flags", f) }
    })
}
