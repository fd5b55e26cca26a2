//! What survives `fork()`: the CPU copy engine's thread pool and GPU state.
//!
//! A forked child (the default start method of Python's `multiprocessing` on
//! Linux) has one thread: the parent's worker threads are gone, so a thread
//! pool made before the fork would wait forever for them, and a GPU driver
//! initialized before the fork cannot be used in the child. A
//! `pthread_atfork` child handler, registered when the first such thing is
//! made (the pool, or a usable GPU backend's probe), counts the forks between
//! the process that made each thing and the current one:
//!
//! * the copy engine runs on its own rayon pool, made per fork generation: a
//!   child makes a fresh one on its first parallel copy (or copies on the
//!   calling thread if it cannot start threads);
//! * a child that touches a GPU backend the parent had initialized gets
//!   [`Error::ForkedChild`] (as torch: "cannot re-initialize CUDA in a forked
//!   subprocess"), never a call into the inherited driver state.

use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::backend::BackendStatus;
use crate::device::Backend;
use crate::error::{Error, Result};

/// Forks between the process the handler was registered in and this one.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// `pthread_atfork` child handler: runs in the child, single-threaded, and
/// only touches an atomic (async-signal-safe).
#[cfg(target_os = "linux")]
extern "C" fn on_fork_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// Registers the fork handler (once per process; the registration is
/// inherited by children).
fn watch() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        #[cfg(target_os = "linux")]
        // SAFETY: the handler is a plain `extern "C" fn()` that lives for the
        // whole process and only updates an atomic.
        unsafe {
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

/// The current fork generation (0 in the process that registered the handler).
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::SeqCst)
}

// ----- the copy engine's pool -----------------------------------------------------------

/// A pool and the fork generation whose threads it has.
struct Pool {
    generation: u64,
    pool: rayon::ThreadPool,
    /// Threads a parallel copy runs on: the pool's and the calling thread.
    workers: usize,
}

/// The current generation's pool (leaked: one per process that copies in
/// parallel; a previous generation's pool is left alone, its threads are gone).
static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

/// The copy engine's thread pool for this process, made on first use (and
/// again in a forked child), and the workers a copy runs on (its threads and
/// the calling thread); `None` when threads cannot be started, in which case
/// the caller copies on its own thread.
pub(crate) fn copy_pool() -> Option<(&'static rayon::ThreadPool, usize)> {
    let current = POOL.load(Ordering::Acquire);
    // SAFETY: non-null pointers in `POOL` come from `Box::leak` below and are
    // never freed.
    if let Some(p) = unsafe { current.as_ref() }
        && p.generation == generation()
    {
        return Some((&p.pool, p.workers));
    }
    // Register before the threads exist, so a fork after this point is seen.
    watch();
    // The thread that calls a copy works too (`par_for`): one pool thread fewer
    // than the workers rayon would start (RAYON_NUM_THREADS, else one a core).
    let workers = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers.saturating_sub(1).max(1))
        .thread_name(|i| format!("devtensor-copy-{i}"))
        .start_handler(|_| crate::copy::cpu::placement::register_pool_thread())
        .exit_handler(|_| crate::copy::cpu::placement::unregister_pool_thread())
        .build()
        .ok()?;
    let fresh: *mut Pool = Box::leak(Box::new(Pool {
        generation: generation(),
        pool,
        workers,
    }));
    match POOL.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // SAFETY: `fresh` was just leaked and is never freed.
            Some(unsafe { (&(*fresh).pool, workers) })
        }
        Err(winner) => {
            // Another thread installed one first: use it and drop ours.
            // SAFETY: `fresh` is ours alone (the exchange failed) and came from `Box::leak`.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, pointers in `POOL` are leaked boxes.
            unsafe { winner.as_ref() }.map(|p| (&p.pool, p.workers))
        }
    }
}

// ----- GPU backends -------------------------------------------------------------------

/// Fork generation in which each backend was initialized (`u64::MAX`: not yet).
static CUDA_INIT: AtomicU64 = AtomicU64::new(u64::MAX);
static ROCM_INIT: AtomicU64 = AtomicU64::new(u64::MAX);

fn slot(backend: Backend) -> Option<&'static AtomicU64> {
    match backend {
        Backend::Cuda => Some(&CUDA_INIT),
        Backend::Rocm => Some(&ROCM_INIT),
        Backend::Cpu => None,
    }
}

/// Records a GPU backend's probe: when it found the backend usable, the
/// driver is initialized in this process from now on. Returns the status.
pub(crate) fn initialized(status: BackendStatus) -> BackendStatus {
    if status.is_available() {
        watch();
        if let Some(s) = slot(status.backend) {
            let _ = s.compare_exchange(u64::MAX, generation(), Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    status
}

/// `Err(`[`Error::ForkedChild`]`)` when this process is a `fork()`ed child (or
/// grandchild, ...) of one that had initialized `backend`: the driver state it
/// inherited cannot be used, only a fresh process can use that backend. Every
/// entry point of a GPU backend checks it first.
pub fn check(backend: Backend) -> Result<()> {
    match slot(backend).map(|s| s.load(Ordering::SeqCst)) {
        Some(g) if g != u64::MAX && g != generation() => Err(Error::ForkedChild { backend }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_made_once_per_generation() {
        let a = copy_pool().expect("threads can start").0 as *const rayon::ThreadPool;
        let b = copy_pool().expect("threads can start").0 as *const rayon::ThreadPool;
        assert_eq!(a, b);
    }

    #[test]
    fn the_cpu_is_never_poisoned() {
        let cpu = crate::backend::cpu_status();
        assert!(initialized(cpu).is_available());
        assert!(check(Backend::Cpu).is_ok());
    }
}
