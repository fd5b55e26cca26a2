//! Where the copy pool's threads run: off the CPU of a caller they missed.
//!
//! Linux may put a woken pool thread on the run queue of the CPU whose thread
//! woke it (wake-affine placement, when its search for an idle CPU is cut
//! short): the caller of the copy. That thread does not sleep while it copies
//! (it takes the pool's shares itself, [`super::parallel`]), so the pool
//! thread waits behind it until its time slice ends, milliseconds, while
//! another CPU idles, and copy after copy runs on the caller alone. A copy
//! that no pool thread joined therefore keeps the pool's threads off the
//! caller's CPU ([`keep_pool_off_caller_cpu`]), within the CPUs the caller
//! may use; the next such copy on another CPU moves them off that one.
//!
//! Zen 2 VM (two vCPUs, Linux 6.18), Python, the 16 first columns of an
//! 8192² f32 matrix copied (512 KiB), 30 blocks of 50 copies, each block
//! 30 ms after the last and followed by 50 of torch's copies (67 µs), three
//! processes each: blocks whose median ran at the caller's speed alone
//! (over 100 µs) 23–26 → 1–2, mean copy 132–142 → 74–82 µs. Torch's copies
//! alternated call by call with ours are another matter: its OpenMP threads
//! spin for milliseconds after each of its copies and hold the other CPU
//! (the README's Environment section).

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Instant;

    /// The pool's threads, by the fork generation they belong to (a forked
    /// child has none of its parent's threads, and their ids may name others).
    struct Threads {
        generation: u64,
        tids: Vec<libc::pid_t>,
    }

    static THREADS: Mutex<Threads> = Mutex::new(Threads {
        generation: 0,
        tids: Vec::new(),
    });

    /// The CPU the pool's threads are kept off (`usize::MAX`: none).
    static KEPT_OFF: AtomicUsize = AtomicUsize::new(usize::MAX);

    /// When the pool's threads last moved (nanoseconds after [`epoch`] + 1; 0:
    /// never). They move at most once per [`MOVE_INTERVAL_NS`]: with callers on
    /// several CPUs whose copies miss the pool (it is busy with another's), each
    /// move would undo the last, a system call per pool thread each time.
    static MOVED: AtomicU64 = AtomicU64::new(0);
    const MOVE_INTERVAL_NS: u64 = 10_000_000;

    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    pub(crate) fn register_pool_thread() {
        let generation = crate::fork::generation();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // Tried, never waited for without end: a fork may have left the list
        // locked (threads starting together only wait for each other briefly).
        let Some(mut threads) = (0..1000).find_map(|_| {
            let threads = THREADS.try_lock().ok();
            if threads.is_none() {
                std::thread::yield_now();
            }
            threads
        }) else {
            return;
        };
        if threads.generation != generation {
            threads.generation = generation;
            threads.tids.clear();
            KEPT_OFF.store(usize::MAX, Ordering::Relaxed);
        }
        threads.tids.push(tid);
    }

    pub(crate) fn keep_pool_off_caller_cpu() {
        // SAFETY: sched_getcpu has no preconditions.
        let Ok(cpu) = usize::try_from(unsafe { libc::sched_getcpu() }) else {
            return;
        };
        if KEPT_OFF.load(Ordering::Relaxed) == cpu {
            return;
        }
        let now = epoch().elapsed().as_nanos() as u64 + 1;
        let last = MOVED.load(Ordering::Relaxed);
        if last != 0 && now - last < MOVE_INTERVAL_NS {
            return;
        }
        if MOVED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            keep_off(cpu);
        }
    }

    /// Limits every pool thread to the CPUs the calling thread may use, less
    /// `cpu`; false where that leaves none, or the threads are another fork
    /// generation's (or their list is locked: never waited for, as a fork
    /// may have left it locked).
    pub(super) fn keep_off(cpu: usize) -> bool {
        let Ok(threads) = THREADS.try_lock() else {
            return false;
        };
        if threads.generation != crate::fork::generation() || cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let size = size_of::<libc::cpu_set_t>();
        // SAFETY: an all-zero cpu_set_t is an empty set; the calls get its
        // size and a valid pointer, and CPU_CLR an index below CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut set) != 0 {
                return false;
            }
            libc::CPU_CLR(cpu, &mut set);
            if libc::CPU_COUNT(&set) == 0 {
                return false;
            }
            // A thread that has exited (its id gone) fails alone.
            for &tid in &threads.tids {
                libc::sched_setaffinity(tid, size, &set);
            }
        }
        KEPT_OFF.store(cpu, Ordering::Relaxed);
        true
    }

    /// The pool's threads of this fork generation.
    #[cfg(test)]
    pub(super) fn pool_threads() -> Vec<libc::pid_t> {
        let threads = THREADS.lock().unwrap_or_else(|p| p.into_inner());
        if threads.generation == crate::fork::generation() {
            threads.tids.clone()
        } else {
            Vec::new()
        }
    }
}

/// Notes the calling thread as one of the copy pool's (its start handler).
pub(crate) fn register_pool_thread() {
    #[cfg(target_os = "linux")]
    linux::register_pool_thread();
}

/// After a copy that no pool thread joined: keeps the pool's threads off the
/// calling thread's CPU, unless they are off it already or moved within the
/// last 10 ms.
pub(super) fn keep_pool_off_caller_cpu() {
    #[cfg(test)]
    tests::KEEP_OFF_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(target_os = "linux")]
    linux::keep_pool_off_caller_cpu();
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::AtomicUsize;

    /// Calls of [`super::keep_pool_off_caller_cpu`] (the parallel loop's tests
    /// check that a copy the pool missed makes one).
    pub(in super::super) static KEEP_OFF_CALLS: AtomicUsize = AtomicUsize::new(0);

    #[cfg(target_os = "linux")]
    #[test]
    fn the_pool_threads_are_kept_off_the_cpu_named() {
        let size = size_of::<libc::cpu_set_t>();
        let cpus = |tid: libc::pid_t| {
            // SAFETY: an all-zero cpu_set_t is an empty set; valid pointer and size.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getaffinity(tid, size, &mut set) }, 0);
            (0..libc::CPU_SETSIZE as usize)
                // SAFETY: an index below CPU_SETSIZE.
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect::<Vec<_>>()
        };
        let mine = cpus(0);
        if mine.len() < 2 {
            println!("the_pool_threads_are_kept_off_the_cpu_named: one CPU, nothing to keep off");
            return;
        }
        let (_, workers) = crate::fork::copy_pool().expect("threads can start");
        // The pool's threads note themselves as they start.
        let start = std::time::Instant::now();
        while super::linux::pool_threads().len() < workers.saturating_sub(1).max(1) {
            assert!(start.elapsed().as_secs() < 10, "the pool's threads never registered");
            std::thread::yield_now();
        }
        for &cpu in &mine[..2] {
            assert!(super::linux::keep_off(cpu));
            for tid in super::linux::pool_threads() {
                let theirs = cpus(tid);
                assert!(!theirs.contains(&cpu), "pool thread {tid} may still run on CPU {cpu}");
                assert!(
                    theirs.iter().all(|c| mine.contains(c)),
                    "pool thread {tid} got CPUs the caller has not"
                );
                assert!(!theirs.is_empty());
            }
        }
    }
}
