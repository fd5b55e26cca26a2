//! Events (group__CUDA__EVENT:
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>).
//!
//! An event holds its latest record: the stream, the operation the record
//! enqueued, that operation's clock, and the time the stream reached it.

use std::ffi::c_uint;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::context::{self, Context};
use super::stream::{self, Stream, Wait};
use super::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY, CUresult, Handle, Registry, Result, api,
    code, entry, err, lock, null_arg, out, used_after_destroy,
};

/// `CU_EVENT_BLOCKING_SYNC`, `CU_EVENT_DISABLE_TIMING`, `CU_EVENT_INTERPROCESS`.
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub const CU_EVENT_INTERPROCESS: c_uint = 4;

/// One record of an event.
#[derive(Clone)]
pub struct Record {
    pub wait: Wait,
    /// When the stream reached the record (set by the stream's worker).
    pub time: Arc<Mutex<Option<Instant>>>,
}

/// An event.
pub struct Event {
    pub ctx: &'static Context,
    pub flags: c_uint,
    record: Mutex<Option<Record>>,
}

impl Event {
    /// The latest record, as a wait (None: never recorded).
    pub fn captured(&self) -> Option<Wait> {
        lock(&self.record).as_ref().map(|r| r.wait.clone())
    }

    fn record(&self) -> Option<Record> {
        lock(&self.record).clone()
    }
}

pub(crate) static EVENTS: Registry<Event> = Registry::new(0xE7);

/// The event behind a handle (`CUDA_ERROR_INVALID_HANDLE` for unknown ones).
/// An event used after `cuEventDestroy` stops the process (see `used_after_destroy`).
pub fn from_handle(h: Handle) -> Result<Arc<Event>> {
    EVENTS.get(h).map_or_else(
        || {
            if EVENTS.was_removed(h) {
                used_after_destroy("event", "cuEventDestroy", h);
            }
            err(CUDA_ERROR_INVALID_HANDLE, format!("{h:p} is not a live event"))
        },
        Ok,
    )
}

/// `cuEventCreate`: flags CU_EVENT_DEFAULT, CU_EVENT_BLOCKING_SYNC,
/// CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS ("CU_EVENT_DISABLE_TIMING
/// must be set as well" with INTERPROCESS); others: `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// `ph` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    api("cuEventCreate", || {
        if ph.is_null() {
            return null_arg("phEvent");
        }
        if flags & !(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS) != 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("unknown flags {flags:#x}"));
        }
        if flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0 {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                "CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING",
            );
        }
        let ctx = context::current_ok()?;
        let h = EVENTS.insert(Arc::new(Event {
            ctx,
            flags,
            record: Mutex::new(None),
        }));
        // SAFETY: forwarded.
        unsafe { out(ph, "phEvent", h) }
    })
}

fn record(call: &'static str, ev: Handle, h: Handle) -> Result<()> {
    let e = from_handle(ev)?;
    let s: Arc<Stream> = stream::resolve(h)?;
    if !std::ptr::eq(e.ctx, s.ctx) {
        return err(
            CUDA_ERROR_INVALID_HANDLE,
            format!(
                "{call}: the event is of device {} and the stream of device {}",
                e.ctx.device, s.ctx.device
            ),
        );
    }
    let time = Arc::new(Mutex::new(None));
    let t = time.clone();
    let ticket = s.enqueue(
        call,
        None,
        Vec::new(),
        Box::new(move || {
            *lock(&t) = Some(Instant::now());
            Ok(Vec::new())
        }),
    );
    *lock(&e.record) = Some(Record {
        wait: Wait {
            stream: s,
            seq: ticket.seq,
            clock: ticket.clock,
        },
        time,
    });
    Ok(())
}

/// `cuEventRecord`: "Captures in hEvent the contents of hStream at the time of
/// this call ... hEvent and hStream must be from the same context otherwise
/// CUDA_ERROR_INVALID_HANDLE is returned."
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(ev: Handle, h: Handle) -> CUresult {
    api("cuEventRecord", || record("cuEventRecord", ev, h))
}

/// `cuEventRecordWithFlags`: flags CU_EVENT_RECORD_DEFAULT (0) or _EXTERNAL (1).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags(ev: Handle, h: Handle, flags: c_uint) -> CUresult {
    entry("cuEventRecordWithFlags", true, 11010, || {
        if flags > 1 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("unknown flags {flags:#x}"));
        }
        record("cuEventRecordWithFlags", ev, h)
    })
}

/// `cuEventQuery`: "Returns CUDA_SUCCESS if all captured work has been
/// completed, or CUDA_ERROR_NOT_READY if any captured work is incomplete ...
/// If cuEventRecord() has not been called on this event, the function returns CUDA_SUCCESS."
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(ev: Handle) -> CUresult {
    api("cuEventQuery", || {
        let e = from_handle(ev)?;
        e.ctx.check()?;
        match e.captured() {
            Some(w) if !w.stream.is_done(w.seq) => code(CUDA_ERROR_NOT_READY),
            Some(w) => {
                super::race::host_join(&w.clock);
                e.ctx.check()
            }
            None => Ok(()),
        }
    })
}

/// `cuEventSynchronize`: "Waits until the completion of all work currently
/// captured in hEvent ... If cuEventRecord() has not been called on hEvent,
/// CUDA_SUCCESS is returned immediately."
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(ev: Handle) -> CUresult {
    api("cuEventSynchronize", || {
        let e = from_handle(ev)?;
        if let Some(w) = e.captured() {
            w.stream.wait_done(w.seq);
            super::race::host_join(&w.clock);
        }
        e.ctx.check()
    })
}

fn elapsed(ms: *mut f32, start: Handle, end: Handle) -> Result<()> {
    if ms.is_null() {
        return null_arg("pMilliseconds");
    }
    let (a, b) = (from_handle(start)?, from_handle(end)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return err(
            CUDA_ERROR_INVALID_HANDLE,
            "an event was created with CU_EVENT_DISABLE_TIMING",
        );
    }
    let (Some(ra), Some(rb)) = (a.record(), b.record()) else {
        return err(
            CUDA_ERROR_INVALID_HANDLE,
            "cuEventRecord() has not been called on both events",
        );
    };
    if !ra.wait.stream.is_done(ra.wait.seq) || !rb.wait.stream.is_done(rb.wait.seq) {
        return code(CUDA_ERROR_NOT_READY);
    }
    let (Some(ta), Some(tb)) = (*lock(&ra.time), *lock(&rb.time)) else {
        // Completed without running (the context has a sticky error).
        a.ctx.check()?;
        return code(CUDA_ERROR_NOT_READY);
    };
    let v = if tb >= ta {
        (tb - ta).as_secs_f64() * 1e3
    } else {
        -((ta - tb).as_secs_f64() * 1e3)
    };
    // SAFETY: checked non-null; valid per the caller's contract.
    unsafe { out(ms, "pMilliseconds", v as f32) }
}

/// `cuEventElapsedTime`: "Computes the elapsed time between two events (in
/// milliseconds with a resolution of around 0.5 microseconds) ... If
/// cuEventRecord() has not been called on either event then
/// CUDA_ERROR_INVALID_HANDLE is returned. If cuEventRecord() has been called
/// on both events but one or both of them has not yet been completed ...
/// CUDA_ERROR_NOT_READY is returned. If either event was created with the
/// CU_EVENT_DISABLE_TIMING flag, then this function will return CUDA_ERROR_INVALID_HANDLE."
///
/// # Safety
///
/// `ms` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    api("cuEventElapsedTime", || elapsed(ms, start, end))
}

/// `cuEventElapsedTime_v2` (driver 12.8+; `CUDA_ERROR_NOT_SUPPORTED` on an
/// older emulated driver: cudarc declares it from its cuda-12080 bindings on).
///
/// # Safety
///
/// `ms` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    entry("cuEventElapsedTime_v2", true, 12080, || elapsed(ms, start, end))
}

/// `cuEventDestroy_v2`: "In case hEvent has been recorded but has not yet been
/// completed when cuEventDestroy() is called, the function will return
/// immediately and the resources associated with hEvent will be released
/// automatically once the device has completed hEvent." Waits already
/// enqueued keep their captured record.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: Handle) -> CUresult {
    api("cuEventDestroy_v2", || {
        EVENTS.remove(ev).map(|_| ()).map_or_else(
            || {
                if EVENTS.was_removed(ev) {
                    used_after_destroy("event", "cuEventDestroy", ev);
                }
                err(CUDA_ERROR_INVALID_HANDLE, format!("{ev:p} is not a live event"))
            },
            Ok,
        )
    })
}
