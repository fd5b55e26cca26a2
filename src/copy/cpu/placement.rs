//! Where the copy pool's threads run: off the CPU of a caller they missed.
//!
//! Linux may put a woken pool thread on the run queue of the CPU whose thread
//! woke it (wake-affine placement, when its search for an idle CPU is cut
//! short): the caller of the copy. That thread does not sleep while it copies
//! (it takes the pool's shares itself, [`super::parallel`]), so the pool
//! thread waits behind it until its time slice ends, milliseconds, while
//! another CPU idles, and copy after copy runs on the caller alone. A copy
//! that no pool thread joined, or whose caller ran a share its pool thread
//! had not started (with many threads, the others start and only the one
//! queued behind the caller is late), therefore keeps the pool's threads off
//! the caller's CPU ([`keep_pool_off_caller_cpu`]), within the CPUs they
//! started with; a later such copy on another CPU moves them off that one
//! instead.
//!
//! Zen 2 VM (two vCPUs, Linux 6.18), Python, the 16 first columns of an
//! 8192² f32 matrix copied (512 KiB), 30 blocks of 50 copies, each block
//! 30 ms after the last and followed by 50 of torch's copies (67 µs), builds
//! alternated, six to nine processes each: blocks whose median ran at the
//! caller's speed alone (over 100 µs) 11–27 of 30 → 0–1, mean copy 122–143 →
//! 80–92 µs. Torch's copies alternated call by call with ours are another
//! matter: its OpenMP threads spin for milliseconds after each of its copies
//! and hold the other CPU (the README's Environment section).

#[cfg(all(test, target_os = "linux"))]
pub(super) use linux::{cpu_list, pin};

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// The pool's live threads, by the fork generation they belong to (a
    /// forked child has none of its parent's threads, and their ids may name
    /// others), with the CPUs each started with.
    struct Threads {
        generation: u64,
        threads: Vec<(libc::pid_t, libc::cpu_set_t)>,
    }

    static THREADS: Mutex<Threads> = Mutex::new(Threads {
        generation: 0,
        threads: Vec::new(),
    });

    /// The CPU the pool's threads are kept off (`usize::MAX`: none).
    static KEPT_OFF: AtomicUsize = AtomicUsize::new(usize::MAX);

    /// When the pool's threads last moved
    /// ([`clock_ns`](super::super::parallel::clock_ns) + 1; 0: never). They
    /// move at most once per [`MOVE_INTERVAL_NS`]: with callers on several
    /// CPUs whose copies miss the pool (it is busy with another's), each move
    /// would undo the last, a system call per pool thread each time, on the
    /// copy's own time (some 100 µs for 64 threads).
    static MOVED: AtomicU64 = AtomicU64::new(0);
    const MOVE_INTERVAL_NS: u64 = 10_000_000;

    /// The list, tried rather than waited for without end: a fork taken while
    /// a thread held it leaves it locked in the child, where the pool's
    /// threads then start unlisted and are never moved.
    fn threads() -> Option<std::sync::MutexGuard<'static, Threads>> {
        (0..1000).find_map(|_| {
            let threads = THREADS.try_lock().ok();
            if threads.is_none() {
                std::thread::yield_now();
            }
            threads
        })
    }

    pub(super) fn tid() -> libc::pid_t {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
    }

    /// The CPUs thread `tid` (0: the caller) may run on, in order (for tests).
    #[cfg(test)]
    pub(in crate::copy::cpu) fn cpu_list(tid: libc::pid_t) -> Vec<usize> {
        // SAFETY: an all-zero cpu_set_t is an empty set; valid pointer and size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(rc, 0, "sched_getaffinity");
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: an index below CPU_SETSIZE.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// Limits the calling thread to `cpus` (for tests).
    #[cfg(test)]
    pub(in crate::copy::cpu) fn pin(cpus: &[usize]) {
        // SAFETY: an all-zero cpu_set_t is an empty set; the CPUs named come
        // from `cpu_list`, below CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus {
            // SAFETY: as above.
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: the call gets the set's size and a valid pointer.
        let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
        assert_eq!(rc, 0, "sched_setaffinity");
    }

    /// The calling thread's CPUs, `None` where they cannot be read.
    pub(super) fn own_cpus() -> Option<libc::cpu_set_t> {
        // SAFETY: an all-zero cpu_set_t is an empty set; the call gets its size
        // and a valid pointer.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
        }
    }

    pub(crate) fn register_pool_thread() {
        let generation = crate::fork::generation();
        let (Some(cpus), Some(mut list)) = (own_cpus(), threads()) else {
            return;
        };
        if list.generation != generation {
            list.generation = generation;
            list.threads.clear();
        }
        list.threads.push((tid(), cpus));
        // The next missed copy moves this thread too.
        KEPT_OFF.store(usize::MAX, Ordering::Relaxed);
    }

    /// Before the thread exits (its pool dropped, as the one a thread that
    /// lost the race to make the pool makes): its id may then name another.
    pub(crate) fn unregister_pool_thread() {
        let me = tid();
        if let Some(mut list) = threads() {
            list.threads.retain(|&(tid, _)| tid != me);
        }
    }

    pub(crate) fn keep_pool_off_caller_cpu() {
        // SAFETY: sched_getcpu has no preconditions.
        let Ok(cpu) = usize::try_from(unsafe { libc::sched_getcpu() }) else {
            return;
        };
        if KEPT_OFF.load(Ordering::Relaxed) == cpu {
            return;
        }
        let last = MOVED.load(Ordering::Relaxed);
        let now = super::super::parallel::clock_ns() + 1;
        if last != 0 && now.saturating_sub(last) < MOVE_INTERVAL_NS {
            return;
        }
        if MOVED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let Some(list) = threads() else {
            return;
        };
        if list.generation == crate::fork::generation() && keep_off(&list.threads, cpu) {
            KEPT_OFF.store(cpu, Ordering::Relaxed);
            super::super::parallel::count(super::super::parallel::Event::PoolMoved, 1);
        }
    }

    /// Limits each of `threads` to the CPUs it started with, less `cpu`,
    /// unless that leaves it none or `cpu` was not among them; true where
    /// any was moved. A thread that has exited fails alone.
    pub(super) fn keep_off(threads: &[(libc::pid_t, libc::cpu_set_t)], cpu: usize) -> bool {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut moved = false;
        for &(tid, mut cpus) in threads {
            // SAFETY: `cpu` is below CPU_SETSIZE; the call gets the set's
            // size and a valid pointer.
            unsafe {
                if !libc::CPU_ISSET(cpu, &cpus) {
                    continue;
                }
                libc::CPU_CLR(cpu, &mut cpus);
                if libc::CPU_COUNT(&cpus) == 0 {
                    continue;
                }
                moved |= libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &cpus) == 0;
            }
        }
        moved
    }
}

/// Notes the calling thread as one of the copy pool's (its start handler).
pub(crate) fn register_pool_thread() {
    #[cfg(target_os = "linux")]
    linux::register_pool_thread();
}

/// Forgets the calling thread, one of the copy pool's (its exit handler).
pub(crate) fn unregister_pool_thread() {
    #[cfg(target_os = "linux")]
    linux::unregister_pool_thread();
}

/// After a copy that missed the pool (or one of its threads): keeps the
/// pool's threads off the calling thread's CPU, unless they are off it
/// already or moved within the last 10 ms.
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

    /// On threads of its own (the pool's are moved by other tests' copies).
    #[cfg(target_os = "linux")]
    #[test]
    fn threads_are_kept_off_the_cpu_named_within_their_own() {
        use super::linux::{cpu_list as cpus, keep_off, own_cpus, tid};
        let mine = cpus(0);
        if mine.len() < 2 {
            println!("threads_are_kept_off_the_cpu_named_within_their_own: one CPU, nothing to keep off");
            return;
        }
        std::thread::scope(|s| {
            let (ids, got) = std::sync::mpsc::channel();
            let stops: Vec<_> = (0..2)
                .map(|_| {
                    let (stop, stopped) = std::sync::mpsc::channel::<()>();
                    let ids = ids.clone();
                    s.spawn(move || {
                        ids.send((tid(), own_cpus().unwrap())).unwrap();
                        let _ = stopped.recv();
                    });
                    stop
                })
                .collect();
            let threads: Vec<_> = (0..2).map(|_| got.recv().unwrap()).collect();
            for &cpu in &mine[..2] {
                assert!(keep_off(&threads, cpu));
                for &(tid, _) in &threads {
                    let theirs = cpus(tid);
                    assert!(!theirs.contains(&cpu), "thread {tid} may still run on CPU {cpu}");
                    // Within the CPUs it started with: the CPU named before is back.
                    assert_eq!(theirs.len(), mine.len() - 1, "thread {tid}: {theirs:?} of {mine:?}");
                }
            }
            // Threads that never had the CPU, or had only it, are not moved.
            let started_with = |cpus: libc::cpu_set_t| threads.iter().map(|&(tid, _)| (tid, cpus)).collect::<Vec<_>>();
            let mut without = threads[0].1;
            // SAFETY: an all-zero cpu_set_t is an empty set.
            let mut only: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: an index below CPU_SETSIZE.
            unsafe {
                libc::CPU_CLR(mine[0], &mut without);
                libc::CPU_SET(mine[0], &mut only);
            }
            assert!(!keep_off(&started_with(without), mine[0]));
            assert!(!keep_off(&started_with(only), mine[0]));
            drop(stops);
        });
    }
}
