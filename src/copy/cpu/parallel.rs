//! The parallel loop: [`par_for`] splits a flat index space across the copy
//! pool (whose threads, a copy done, watch for the next one a while before
//! they sleep: [`Handoff`]), and [`for_each_segment`] walks one task's piece
//! of it row by row.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::caches::l2_bytes;
use crate::copy::plan::{INLINE_DIMS, PlanDim};

/// Below this many bytes a copy runs on the calling thread: two of torch's
/// grains (`parallel_for` gives a thread at least 32768 elements). With a
/// sleeping caller ([`FINISH_SPIN`]) splitting cost about a MiB of copying
/// and this was 1 MiB (256 KiB row flips had run at 0.4× NumPy's speed on two
/// threads); with a spinning one, 512 KiB copies on two cores, two runs each,
/// GB/s, one thread → two: clone 73–91 → 128–138, row flip 73 → 123–130
/// (torch 122–134); 256 KiB row flip 94–99 → 104 (torch 100–103).
pub(super) const PAR_MIN_BYTES: usize = 256 << 10;
/// How many bytes of memcpy a byte of [`par_for_slow`]'s kernels counts as:
/// at a quarter of memcpy's speed or less, their copies of 64 KiB take as
/// long as a clone of 256 KiB, and split from there; from 128 KiB on (on
/// two cores with 512 KiB of L2) their pieces are handed out as they go
/// ([`balanced`]), not in static shares.
/// Zen 2 VM, two cores, Python, into a new output, the best of three
/// processes, speed-up over one thread (torch splits from 32768 elements):
/// 33 × 35 × 37 × 4 u8 permuted 3201 (171 KiB) 1.92×, 9 × 10 × 11 × 12 × 13
/// u8 14032 1.92×, 31 × 29 × 27 × 2 f32 3201 1.76×, 0321 1.60–1.65×, 1320
/// 1.64×, u16 3201 (97 KiB) 1.75×, 17 × 19 × 23 × 2 f64 3210 1.53×, 40 × 30
/// × 40 f32 210 1.30×, 224² × 4 u8 201 1.32×, 200² f32 1.22×; 128² f32 and
/// 20 × 30 × 40 f32 0.98–1.01×. Counted 8 times, 128² f32 lost (0.79×); in
/// static shares of 32 KiB or more instead, 31 × 29 × 27 × 2 f32 0321 gained
/// nothing (1.01×).
pub(super) const SLOW_KERNEL_COST: usize = 4;
/// Pixels a task of the channel kernels takes ([`super::channels`],
/// [`super::split512`]): 16 Ki, a multiple of the 16 or 64 a step takes.
pub(super) const PIXELS_A_TASK: usize = 16 << 10;
/// Target bytes per task of the balanced schedule.
const PAR_CHUNK_BYTES: usize = 1 << 20;
/// Fewest bytes worth a worker of their own in the static schedule (torch's
/// `parallel_for` gives each thread at least 32768 elements, 128 KiB of f32).
const PAR_SHARE_MIN_BYTES: usize = 128 << 10;

/// How long the calling thread, its own share done, spins for the pool's
/// before it sleeps (as OpenMP's threads spin at a barrier). A sleeping
/// caller waits for a wake-up, and on a VM that costs about as much as
/// copying a MiB: two cores, two runs each, GB/s, sleeping → spinning: 1 MiB
/// clone 120–138 → 148–152, 1 MiB row flip 64–66 → 140–142 (one thread: 75),
/// 2 MiB of 4 KiB rows 92–95 → 137–138, 4 MiB clone 125–129 → 168. Also how
/// long it leaves a static share to its pool thread before taking it itself.
const FINISH_SPIN: Duration = Duration::from_micros(200);

/// How long a pool thread, its part of a copy done, watches for the next
/// copy before it goes back to rayon to sleep ([`Handoff`]), as OpenMP's
/// threads spin between parallel regions. Waking a sleeping thread costs
/// tens of µs on a VM, much of a copy of a MiB or less: one thread started
/// that late on a copy called back to back ran it at 0.7× torch's speed.
/// Python, two cores, from NumPy arrays, both builds in one process (µs),
/// sleeping → watching (torch): 9 × 10 × 11 × 12 × 13 f64 permuted 14032
/// 100 → 72 (73), 61 × 67 × 59 × 3 u8 1023 32.4 → 27.3 (26.6), 64 × 64 ×
/// 64 × 4 f32 2103 258 → 196 (780), 16 columns of an 8192² f32 matrix 65.0
/// → 38.5 (44.1); 4096² f32 transposed 3649 → 3048. Copies alternated call
/// by call with torch's: 0.93–1.04× the time a pair.
const HANDOFF_SPIN: Duration = Duration::from_micros(100);

/// What the parallel loop did, counted since the process started
/// ([`pool_stats`]): how a benchmark on a machine nobody can watch tells why
/// a copy ran slow (its pool late, backed off, or moved).
#[derive(Clone, Copy)]
pub(super) enum Event {
    /// Copies split across the pool.
    Split,
    /// Copies kept on the calling thread by a back-off ([`Backoff`]).
    KeptSerial,
    /// Back-offs begun.
    BackedOff,
    /// Copies no pool thread joined before they were over.
    PoolMissed,
    /// Copies where the caller ran a share its pool thread had not started
    /// within the grace ([`static_shares`]).
    ShareTakenOver,
    /// Copies the handoff could not post (its lock was busy).
    PostMissed,
    /// Times the pool's threads were moved off a caller's CPU
    /// ([`super::placement`]).
    PoolMoved,
    /// Split copies one pool thread or more joined, and the nanoseconds from
    /// the handout to the first one's start and to the last one's, summed
    /// over them.
    PoolStarted,
    PoolStartNs,
    PoolLastStartNs,
    /// Pool threads that joined split copies while they were open, summed.
    PoolJoins,
}

const EVENTS: [(Event, &str); 11] = [
    (Event::Split, "split"),
    (Event::KeptSerial, "kept_serial"),
    (Event::BackedOff, "backed_off"),
    (Event::PoolMissed, "pool_missed"),
    (Event::ShareTakenOver, "share_taken_over"),
    (Event::PostMissed, "post_missed"),
    (Event::PoolMoved, "pool_moved"),
    (Event::PoolStarted, "pool_started"),
    (Event::PoolStartNs, "pool_start_ns"),
    (Event::PoolLastStartNs, "pool_last_start_ns"),
    (Event::PoolJoins, "pool_joins"),
];

// Every event has its name, at its own index (`count` indexes by the event).
const _: () = {
    let mut i = 0;
    while i < EVENTS.len() {
        assert!(EVENTS[i].0 as usize == i);
        i += 1;
    }
    assert!(Event::PoolJoins as usize + 1 == EVENTS.len());
};

static COUNTS: [AtomicU64; EVENTS.len()] = [const { AtomicU64::new(0) }; EVENTS.len()];

/// Adds `n` to `event`'s count.
pub(super) fn count(event: Event, n: u64) {
    COUNTS[event as usize].fetch_add(n, Ordering::Relaxed);
}

/// The CPU copy pool's counts since the process started, by name: copies
/// split (`split`), kept on the calling thread by a back-off after late pools
/// (`kept_serial`, `backed_off`: back-offs begun), that no pool thread joined
/// (`pool_missed`), whose caller ran a share its thread had not started
/// (`share_taken_over`), that the handoff to watching threads missed
/// (`post_missed`); moves of the pool off a caller's CPU (`pool_moved`); the
/// split copies a pool thread joined with the nanoseconds to the first and
/// the last one's start, summed (`pool_started`, `pool_start_ns`,
/// `pool_last_start_ns`); pool threads that joined copies still open
/// (`pool_joins`). For benchmarks: differences over a run tell why its
/// copies ran as they did.
pub fn pool_stats() -> Vec<(&'static str, u64)> {
    EVENTS
        .iter()
        .map(|&(e, name)| (name, COUNTS[e as usize].load(Ordering::Relaxed)))
        .collect()
}

/// How long a pool thread done with its part of a copy watches for that
/// copy to close at most, before its [`HANDOFF_SPIN`] begins anyway
/// ([`Handoff::watch`]): OpenMP's threads spin at a barrier for
/// milliseconds.
const OPEN_WATCH_CAP: Duration = Duration::from_millis(2);

/// Spins until `done()` holds or `cap` has passed.
fn spin_until(done: impl Fn() -> bool, cap: Duration) {
    let start = Instant::now();
    while !done() && start.elapsed() < cap {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}

/// A raw pointer that may cross to rayon's threads.
#[derive(Clone, Copy)]
pub(super) struct Shared<P>(pub(super) P);

// SAFETY: the executor hands each task a disjoint set of destination elements
// (chunks of a partition of the flat index space) and only reads the source,
// which nothing writes during the copy (the caller's contract).
unsafe impl<P> Send for Shared<P> {}
// SAFETY: see `Send`; the wrapped pointer is only copied out, never mutated.
unsafe impl<P> Sync for Shared<P> {}

impl<P: Copy> Shared<P> {
    /// Returns the pointer (a method, so closures capture the whole `Shared`).
    #[inline(always)]
    pub(super) fn get(self) -> P {
        self.0
    }
}

/// [`par_for`] for kernels that cost several times a memcpy a byte
/// (transposes' tiles, gathers, pixel shuffles): under 1 MiB their bytes
/// count [`SLOW_KERNEL_COST`] times, for the split and for the schedule.
/// Larger copies are split as before: a 16 MiB transpose would be counted in
/// pieces of a quarter of the size.
pub(super) fn par_for_slow(total: usize, bytes: usize, f: impl Fn(usize, usize) + Sync) {
    par_for(total, slow_counted(bytes), f);
}

/// Threads [`par_for_slow`] splits a copy of `bytes` over: 1 where it runs
/// on the calling thread alone. Not the back-off's: tile sizes taken from
/// this should not flip with it.
pub(super) fn slow_workers(bytes: usize) -> usize {
    split_pool(slow_counted(bytes)).map_or(1, |(_, workers)| workers)
}

/// The copy pool and its workers (the calling thread among them) where a
/// copy of `bytes` is worth splitting, the conditions that hold for every
/// call of one copy; [`par_for`] adds those of the moment. Small copies
/// never touch rayon (whose first use spawns the pool).
fn split_pool(bytes: usize) -> Option<(&'static rayon::ThreadPool, usize)> {
    if bytes < PAR_MIN_BYTES {
        return None;
    }
    // Our own pool, made again in a fork()ed child (crate::fork); its threads
    // and this one are the workers.
    crate::fork::copy_pool().filter(|&(_, workers)| workers >= 2)
}

/// The bytes [`par_for_slow`] counts for a copy of `bytes`.
fn slow_counted(bytes: usize) -> usize {
    if bytes < PAR_MIN_BYTES * SLOW_KERNEL_COST {
        bytes * SLOW_KERNEL_COST
    } else {
        bytes
    }
}

/// Runs `f(lo, hi)` over a partition of `0..total`, in parallel when `bytes` is
/// large enough. A copy kept on one thread is one call, `f(0, total)`; a
/// split one is only calls over parts, so `f` can tell which it is in.
pub(super) fn par_for(total: usize, bytes: usize, f: impl Fn(usize, usize) + Sync) {
    // No copy touches rayon while the pool is backed off.
    let split = if total < 2 || SERIAL.get() {
        None
    } else if COPY_BACKOFF.active(clock_ns) {
        if bytes >= PAR_MIN_BYTES {
            count(Event::KeptSerial, 1);
        }
        None
    } else {
        split_pool(bytes)
    };
    let Some((pool, workers)) = split else {
        f(0, total);
        return;
    };
    count(Event::Split, 1);
    // Either way the calling thread copies a share itself (as OpenMP's master
    // thread does) instead of sleeping until the pool is done: one thread
    // wake-up fewer before work starts, and no more busy threads than cores
    // (4 MiB row flips on two cores, one run: 0.81× torch's speed with a pool
    // of two beside the caller, 0.97× with one).
    match static_share_count(total, bytes, workers, l2_bytes()) {
        Some(shares) => static_shares(pool, shares, total, FINISH_SPIN, &f),
        None => balanced(pool, workers, total, bytes, &f),
    }
}

/// Copies run on the calling thread alone for a while after the pool was
/// late to three in a row: its threads then wait behind others for the cores (another
/// library's threads spinning after their own parallel loop, as OpenMP's do
/// for milliseconds), and waking them only queues one more thread there, in
/// front of the caller too. 16 MiB of 4 KiB rows copied alternately by
/// devtensor and torch, call by call, two cores, median GB/s: in a third of
/// the runs both fell to 3–4 (torch 8) without the back-off; with it, nine
/// runs of nine at 21–26 (torch 42–57; alone, either copy runs at 56–62).
struct Backoff {
    /// A [`clock_ns`] time until which copies stay serial (0: none).
    until: AtomicU64,
    /// Late pools in a row, up to [`LATE_STREAK_MAX`].
    late_streak: AtomicUsize,
}

/// The one copies follow (every job feeds it, a test's pool of its own too).
static COPY_BACKOFF: Backoff = Backoff::new();

thread_local! {
    /// Set while [`serially`] runs.
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every copy it makes on the calling thread (see
/// `copy_strided`'s views whose elements interleave).
pub(super) fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.set(self.0);
        }
    }
    let _restore = Restore(SERIAL.replace(true));
    f()
}

/// Late pools in a row that make a back-off: one late start can be a pool
/// thread whose core the VM had put to sleep (the best single 1 MiB clone
/// fell from 167 to 124 GB/s when each late start backed off: the first copy
/// after a back-off found the pool asleep again, and late).
const LATE_STREAK_MAX: usize = 3;

/// A pool that starts this long after a copy was handed out is late; with
/// static shares, one that has not started when the caller's grace for them
/// is over (1 MiB of rows alternated with torch's copy, median GB/s, two runs
/// each: 8.6 when only this limit applied, the caller's 200 µs of grace spent
/// on every call; 52 with both; torch 59–68).
const POOL_LATE: Duration = Duration::from_millis(1);
/// How long copies stay on the calling thread after that.
const BACKOFF: Duration = Duration::from_millis(20);

/// Nanoseconds since the first call in the process: times that fit an atomic.
pub(super) fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Backoff {
    const fn new() -> Self {
        Backoff {
            until: AtomicU64::new(0),
            late_streak: AtomicUsize::new(0),
        }
    }

    /// Whether copies stay serial at `now()` (a [`clock_ns`] time, read only
    /// after a back-off).
    fn active(&self, now: impl FnOnce() -> u64) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        until != 0 && now() < until
    }

    /// Records how long the pool took to start on a copy that ended at `now`
    /// (`None`: it had not started when the copy was over, `waited` after it
    /// was handed out), late from `late` on.
    fn observe(&self, now: u64, start: Option<Duration>, waited: Duration, late: Duration) {
        if start.unwrap_or(waited) < late {
            self.late_streak.store(0, Ordering::Relaxed);
        } else if self.late_streak.fetch_add(1, Ordering::Relaxed) + 1 >= LATE_STREAK_MAX {
            self.late_streak.store(0, Ordering::Relaxed);
            self.until.store(now + BACKOFF.as_nanos() as u64, Ordering::Relaxed);
            count(Event::BackedOff, 1);
        }
    }
}

/// The number of shares when a copy of `bytes` over `0..total` runs in
/// [`static_shares`] (each share, read and written, fits in `l2` bytes, a
/// worker's part of its L2), `None` when it runs [`balanced`].
fn static_share_count(total: usize, bytes: usize, workers: usize, l2: usize) -> Option<usize> {
    let shares = workers.min(bytes / PAR_SHARE_MIN_BYTES).min(total).max(1);
    (bytes.saturating_mul(2) / shares <= l2).then_some(shares)
}

/// Where each worker's share of a copy (read and written) fits in its core's
/// L2: worker k gets the k-th of equal shares (OpenMP's `schedule(static)`,
/// which torch's `parallel_for` uses), so a copy repeated on the same buffers
/// finds its share in the cache of the core that copied it last time;
/// [`balanced`] hands the pieces out anew on every call, and each core then
/// reads what others wrote. 16-core Xeon (L2 2 MiB a core), GB/s, two
/// alternated runs each, work stealing → static: 4 MiB row flips 158/179 →
/// 398/514 (torch 382–530), 1 MiB clone 102/104 → 270/269 (torch 186–231), 64
/// columns of an 8192² f32 matrix 90/92 → 155/265 (torch 180–203). Larger
/// copies lose the affinity anyway, and static shares lost there: a 4096² f32
/// transpose ran at 48/44 GB/s balanced, 26/30 static. A share whose thread
/// has not started within `grace` of the caller finishing its own is taken
/// by the caller ([`Job`]).
fn static_shares<F: Fn(usize, usize) + Sync + ?Sized>(
    pool: &rayon::ThreadPool,
    shares: usize,
    total: usize,
    grace: Duration,
    f: &F,
) {
    let bounds = (0..=shares).map(|k| ((total as u128 * k as u128) / shares as u128) as usize);
    // Pool thread i prefers share i + 1, on every call.
    Job::run(pool, bounds.collect(), true, grace, f);
}

/// The calling thread takes one worker's share, then pieces of about
/// [`PAR_CHUNK_BYTES`] of the rest, as every pool thread does once it starts.
fn balanced<F: Fn(usize, usize) + Sync + ?Sized>(
    pool: &rayon::ThreadPool,
    workers: usize,
    total: usize,
    bytes: usize,
    f: &F,
) {
    let own = total / workers;
    let rest = total - own;
    let n = (bytes / PAR_CHUNK_BYTES).clamp(workers, workers * 64).min(rest).max(1);
    let split = move |c: usize| own + ((rest as u128 * c as u128) / n as u128) as usize;
    let bounds = std::iter::once(0).chain((0..=n).map(split));
    Job::run(pool, bounds.collect(), false, Duration::ZERO, f);
}

/// The caller's loop body with its lifetime erased, so that pool threads
/// may hold it in a job that outlives the call ([`Job`] says when they may
/// call it).
#[derive(Clone, Copy)]
struct Body(*const (dyn Fn(usize, usize) + Sync + 'static));

// SAFETY: the closure is `Sync`, and a `Body` is only dereferenced under
// `Job`'s protocol, while the caller's frame that owns the closure is alive.
unsafe impl Send for Body {}
// SAFETY: as `Send`.
unsafe impl Sync for Body {}

/// One parallel loop: its ranges (`bounds[k] .. bounds[k + 1]`), each run
/// once by whichever thread claims it first. The caller runs range 0, then
/// claims what no pool thread has, so it never waits for a thread that has
/// not started (one that waits behind other threads for a core, [`Backoff`]):
/// only for ranges other threads are running.
/// Pool threads join through a broadcast that may run after the call has
/// returned: they count themselves in `active` before they look at `closed`,
/// and the caller sets `closed` before it waits for `active` to drop to zero,
/// so a pool thread calls the body only while the caller waits for it
/// (sequentially consistent order: one of the two sees the other's write).
struct Job {
    body: Body,
    bounds: Vec<usize>,
    claimed: Box<[AtomicBool]>,
    /// Where the search for an unclaimed range goes on.
    next: AtomicUsize,
    /// Ranges run (or panicked).
    done: AtomicUsize,
    /// Pool threads inside the job.
    active: AtomicUsize,
    /// When the job was handed out, and nanoseconds after that until the
    /// first pool thread started on it (`u64::MAX`: none yet).
    handed: Instant,
    first: AtomicU64,
    /// Nanoseconds after the handout until the last pool thread that joined
    /// the job while open started, and how many did.
    last: AtomicU64,
    joins: AtomicUsize,
    closed: AtomicBool,
    /// Pool thread i runs range i + 1 only (`Job::run`'s `preferred`).
    preferred: bool,
    /// The first panic of the body, resumed on the caller's thread.
    panic: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Job {
    /// Runs `f` over every range of `bounds` on the calling thread and the
    /// pool's; with `preferred`, pool thread i first claims range i + 1, and
    /// the caller leaves those to their threads for `grace` after its own.
    fn run<F: Fn(usize, usize) + Sync + ?Sized>(
        pool: &rayon::ThreadPool,
        bounds: Vec<usize>,
        preferred: bool,
        grace: Duration,
        f: &F,
    ) {
        let n = bounds.len() - 1;
        if n == 1 {
            f(bounds[0], bounds[1]);
            return;
        }
        let body: &(dyn Fn(usize, usize) + Sync) = &|lo, hi| f(lo, hi);
        // SAFETY: a lifetime transmute of a reference to a trait object; the
        // pointer is used under the protocol above only, while `f` lives.
        let body = Body(unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static (dyn Fn(usize, usize) + Sync)>(body)
        });
        let job = std::sync::Arc::new(Job {
            body,
            bounds,
            claimed: (0..n).map(|k| AtomicBool::new(k == 0)).collect(),
            next: AtomicUsize::new(1),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            handed: Instant::now(),
            first: AtomicU64::new(u64::MAX),
            last: AtomicU64::new(0),
            joins: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            preferred,
            panic: std::sync::Mutex::new(None),
        });
        let pool_id = pool as *const rayon::ThreadPool as usize;
        // Threads still watching after their last copy join through the
        // handoff; the broadcast wakes the others (and runs on the watching
        // ones later, finding the job done).
        Handoff::post(pool_id, &job);
        let shared = job.clone();
        pool.spawn_broadcast(move |ctx| {
            // Not after a job already over: a thread that joined jobs through
            // the handoff finds their broadcasts queued behind it.
            if shared.join(ctx.index()) {
                Handoff::watch(pool_id, ctx.index(), shared.clone());
            }
        });
        job.run_range(0);
        if preferred {
            spin_until(|| job.done.load(Ordering::Acquire) == n, grace);
        }
        // With preferred ranges, one the caller claims here is a pool
        // thread's that had not started within the grace.
        let mut took_late = false;
        while let Some(k) = job.claim() {
            took_late |= preferred;
            job.run_range(k);
        }
        // Only ranges running on other threads are left.
        wait_until(|| job.done.load(Ordering::Acquire) == n);
        job.closed.store(true, Ordering::SeqCst);
        Handoff::withdraw(&job);
        let first = job.first.load(Ordering::Relaxed);
        let late = if preferred { grace.min(POOL_LATE) } else { POOL_LATE };
        let start = (first != u64::MAX).then(|| Duration::from_nanos(first));
        match start {
            Some(t) => {
                count(Event::PoolStarted, 1);
                count(Event::PoolStartNs, t.as_nanos() as u64);
                count(Event::PoolLastStartNs, job.last.load(Ordering::Relaxed));
                count(Event::PoolJoins, job.joins.load(Ordering::Relaxed) as u64);
            }
            None => count(Event::PoolMissed, 1),
        }
        if took_late {
            count(Event::ShareTakenOver, 1);
        }
        if start.is_none() || took_late {
            // Perhaps queued behind this thread on its CPU ([`super::placement`]):
            // with many pool threads, the others start and only the one that
            // shares the caller's CPU is late, copy after copy.
            super::placement::keep_pool_off_caller_cpu();
        }
        COPY_BACKOFF.observe(clock_ns(), start, job.handed.elapsed(), late);
        wait_until(|| job.active.load(Ordering::SeqCst) == 0);
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
    }

    /// A pool thread (`index` in its pool) joins: it runs what it may claim,
    /// unless the caller has closed the job. Whether it was still open.
    fn join(&self, index: usize) -> bool {
        self.active.fetch_add(1, Ordering::SeqCst);
        let late = self.handed.elapsed().as_nanos() as u64;
        let _ = self
            .first
            .compare_exchange(u64::MAX, late, Ordering::Relaxed, Ordering::Relaxed);
        let open = !self.closed.load(Ordering::SeqCst);
        if open {
            self.last.fetch_max(late, Ordering::Relaxed);
            self.joins.fetch_add(1, Ordering::Relaxed);
            // With preferred ranges a pool thread runs its own only (another
            // thread's is its cache's); late ones are the caller's to take.
            let (mine, n) = (index + 1, self.claimed.len());
            if !self.preferred {
                while let Some(k) = self.claim() {
                    self.run_range(k);
                }
            } else if mine < n && !self.claimed[mine].swap(true, Ordering::AcqRel) {
                self.run_range(mine);
            }
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        open
    }

    /// Claims a range no thread has yet, if any is left.
    fn claim(&self) -> Option<usize> {
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            if k >= self.claimed.len() {
                return None;
            }
            if !self.claimed[k].swap(true, Ordering::AcqRel) {
                return Some(k);
            }
        }
    }

    /// Runs claimed range `k`, keeping a panic for the caller.
    fn run_range(&self, k: usize) {
        let (lo, hi) = (self.bounds[k], self.bounds[k + 1]);
        // SAFETY: the caller of `Job::run` is alive: this thread claimed `k`
        // while `closed` was false and is counted in `active` (or is the
        // caller itself), and the caller waits for both.
        let body = unsafe { &*self.body.0 };
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(lo, hi))) {
            self.panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(payload);
        }
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// The latest job handed out, where pool threads that have just finished
/// one look for the next ([`HANDOFF_SPIN`]) instead of waiting to be woken.
/// Locks are only tried, never waited for: a lock held by a thread that a
/// `fork()` left behind (the child has none of the parent's threads) turns
/// the handoff off in that child instead of hanging it, and copies still
/// reach its fresh pool's threads through the broadcast.
struct Handoff;

/// The job, and the address of the pool it was handed to (a thread joins
/// only its own pool's).
static POSTED: std::sync::Mutex<Option<(usize, std::sync::Arc<Job>)>> = std::sync::Mutex::new(None);
/// Jobs posted so far (written with the lock held, after the job).
static POSTS: AtomicU64 = AtomicU64::new(0);
/// Jobs pool threads have joined through the handoff, by pool.
#[cfg(test)]
static HANDED_OFF: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

impl Handoff {
    /// Makes `job` the one watching threads of pool `pool_id` join.
    fn post(pool_id: usize, job: &std::sync::Arc<Job>) {
        if let Ok(mut slot) = POSTED.try_lock() {
            *slot = Some((pool_id, job.clone()));
            POSTS.fetch_add(1, Ordering::SeqCst);
        } else {
            count(Event::PostMissed, 1);
        }
    }

    /// Drops `job` from the handoff, if it is still there.
    fn withdraw(job: &std::sync::Arc<Job>) {
        if let Ok(mut slot) = POSTED.try_lock()
            && slot.as_ref().is_some_and(|(_, j)| std::sync::Arc::ptr_eq(j, job))
        {
            *slot = None;
        }
    }

    /// Pool thread `index` of pool `pool_id`, done with job `last`, joins
    /// each later job of its pool posted within [`HANDOFF_SPIN`] of the last
    /// one it joined closing (the slot only ever moves on to newer jobs).
    ///
    /// The watch counts from the job's close, not from the end of this
    /// thread's part of it (for [`OPEN_WATCH_CAP`] at most): else one late
    /// thread, which keeps a copy open past the watch, sends every other
    /// thread to sleep, the next copy wakes them one by one, one of them is
    /// late again, and copies stay that slow. 16-core Xeon VM, Python, a
    /// 4 MiB 2-D flip split in 16 shares: the last pool thread starting
    /// 216 µs after the handout on average, 38 GB/s (torch 426), for as long
    /// as that pattern ran.
    fn watch(pool_id: usize, index: usize, mut last: std::sync::Arc<Job>) {
        // Posts looked at (none yet): the slot is locked again only after another.
        let mut looked = None;
        let mut joined = Instant::now();
        let mut since = joined;
        loop {
            let now = Instant::now();
            if !last.closed.load(Ordering::Relaxed) && now - joined < OPEN_WATCH_CAP {
                since = now;
            } else if now - since >= HANDOFF_SPIN {
                return;
            }
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if looked == Some(POSTS.load(Ordering::SeqCst)) {
                continue;
            }
            let Ok(slot) = POSTED.try_lock() else { continue };
            looked = Some(POSTS.load(Ordering::SeqCst));
            let job = match slot.as_ref() {
                Some((p, job)) if *p == pool_id && !std::sync::Arc::ptr_eq(job, &last) => job.clone(),
                _ => continue,
            };
            drop(slot);
            #[cfg(test)]
            HANDED_OFF.lock().unwrap_or_else(|e| e.into_inner()).push(pool_id);
            let _ = job.join(index);
            last = job;
            joined = Instant::now();
            since = joined;
        }
    }
}

/// Waits for `done()`: spins for [`FINISH_SPIN`], then sleeps in short steps
/// (leaving the core to the threads it waits for).
fn wait_until(done: impl Fn() -> bool) {
    spin_until(&done, FINISH_SPIN);
    while !done() {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Walks the flat index range `[w0, w1)` of `outer × inner_len`
/// (`flat = row · inner_len + i`, `outer[0]` the fastest outer dim) and calls
/// `f(dst_off, src_off, i0, count)` once per piece of a row, with the byte
/// offsets of the row's element 0. One div/mod per call, none per row.
#[inline(always)]
pub(super) fn for_each_segment(
    outer: &[PlanDim],
    inner_len: usize,
    w0: usize,
    w1: usize,
    mut f: impl FnMut(isize, isize, usize, usize),
) {
    if w0 >= w1 || inner_len == 0 {
        return;
    }
    let mut idx: SmallVec<[usize; INLINE_DIMS]> = SmallVec::from_elem(0, outer.len());
    let (mut so, mut dof) = (0isize, 0isize);
    let mut r = w0 / inner_len;
    let mut i0 = w0 % inner_len;
    for (k, d) in outer.iter().enumerate() {
        let c = r % d.len;
        r /= d.len;
        idx[k] = c;
        so += c as isize * d.src;
        dof += c as isize * d.dst;
    }
    let mut left = w1 - w0;
    loop {
        let n = (inner_len - i0).min(left);
        f(dof, so, i0, n);
        left -= n;
        if left == 0 {
            return;
        }
        i0 = 0;
        for (k, d) in outer.iter().enumerate() {
            idx[k] += 1;
            so += d.src;
            dof += d.dst;
            if idx[k] < d.len {
                break;
            }
            idx[k] = 0;
            so -= d.len as isize * d.src;
            dof -= d.len as isize * d.dst;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::channel;
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    use super::{
        BACKOFF, Backoff, COPY_BACKOFF, FINISH_SPIN, HANDED_OFF, LATE_STREAK_MAX, PAR_MIN_BYTES, POOL_LATE,
        SLOW_KERNEL_COST, balanced, slow_counted, spin_until, static_share_count, static_shares,
    };

    /// Which thread visited each index of `0..total`, once per index.
    fn visits(total: usize, run: impl FnOnce(&(dyn Fn(usize, usize) + Sync))) -> Vec<ThreadId> {
        let seen: Mutex<Vec<Vec<ThreadId>>> = Mutex::new(vec![Vec::new(); total]);
        run(&|lo, hi| {
            let me = std::thread::current().id();
            let mut seen = seen.lock().unwrap();
            for v in &mut seen[lo..hi] {
                v.push(me);
            }
        });
        let seen = seen.into_inner().unwrap();
        for (i, v) in seen.iter().enumerate() {
            assert_eq!(v.len(), 1, "index {i} of {total} visited {} times", v.len());
        }
        seen.into_iter().map(|v| v[0]).collect()
    }

    #[test]
    fn both_schedules_visit_every_index_once_and_static_shares_keep_their_thread() {
        let workers = 4;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers - 1)
            .build()
            .unwrap();
        for total in [2, 3, 7, 64, 1000, 12345] {
            let shares = workers.min(total);
            // A grace no pool thread misses: every share runs on its thread.
            let grace = Duration::from_secs(10);
            let first = visits(total, |f| static_shares(&pool, shares, total, grace, f));
            let again = visits(total, |f| static_shares(&pool, shares, total, grace, f));
            // The same index on the same thread, call after call: the affinity
            // the static schedule exists for.
            assert_eq!(first, again, "total {total}");
            let threads: std::collections::HashSet<_> = first.iter().collect();
            assert_eq!(threads.len(), shares, "total {total}");
            for bytes in [1 << 20, 4 << 20, 64 << 20] {
                visits(total, |f| balanced(&pool, workers, total, bytes, f));
            }
        }
    }

    /// Pins the calling thread to its first CPU and `pool`'s threads to the
    /// others (on Linux, with at least two); the caller's CPUs come back on
    /// drop. Threads the caller starts meanwhile inherit its one CPU: the
    /// copy pool must not be first made then.
    struct PinnedApart {
        /// The caller's CPUs before (none: nothing was pinned).
        #[cfg(target_os = "linux")]
        caller: Vec<usize>,
    }

    impl PinnedApart {
        fn new(pool: &rayon::ThreadPool) -> Self {
            #[cfg(target_os = "linux")]
            {
                use super::super::placement::{cpu_list, pin};
                let mine = cpu_list(0);
                if mine.len() < 2 {
                    return Self { caller: Vec::new() };
                }
                // The guard first: it restores the caller should a pin fail.
                let guard = Self { caller: mine.clone() };
                pin(&mine[..1]);
                pool.broadcast(|_| pin(&mine[1..]));
                guard
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = pool;
                Self {}
            }
        }
    }

    impl Drop for PinnedApart {
        fn drop(&mut self) {
            #[cfg(target_os = "linux")]
            if !self.caller.is_empty() {
                super::super::placement::pin(&self.caller);
            }
        }
    }

    #[test]
    fn a_pool_thread_that_has_just_copied_joins_the_next_copy_of_its_own_pool_without_a_wake_up() {
        let [a, b] = [0, 1].map(|_| rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap());
        let thread_of = |p: &rayon::ThreadPool| p.install(|| std::thread::current().id());
        let (ta, tb) = (thread_of(&a), thread_of(&b));
        // The caller and `a`'s thread on CPUs of their own where there are
        // two: sharing one (as a loaded machine may leave them, for seconds),
        // one never runs while the other watches.
        let _pinned = PinnedApart::new(&a);
        // Back-to-back copies on one pool: its thread, still watching after
        // one, joins the next through the handoff (not every time, should
        // the machine hold a thread off its core past the watch: for up to
        // 10 s of copies, until one is).
        let handed_off_to = |p: &rayon::ThreadPool| {
            let id = p as *const rayon::ThreadPool as usize;
            HANDED_OFF.lock().unwrap().iter().filter(|&&q| q == id).count()
        };
        let t = Instant::now();
        while handed_off_to(&a) == 0 && t.elapsed() < Duration::from_secs(10) {
            let by = visits(64, |f| static_shares(&a, 2, 64, Duration::from_secs(10), f));
            assert!(by[32..].iter().all(|&t| t == ta));
        }
        assert!(handed_off_to(&a) > 0, "no copy was handed off");
        // Another pool's copy right after one of `a`: `a`'s watching thread
        // leaves it alone, and each share stays on its own pool's thread.
        for _ in 0..50 {
            visits(64, |f| static_shares(&a, 2, 64, Duration::from_secs(10), f));
            let by = visits(64, |f| static_shares(&b, 2, 64, Duration::from_secs(10), f));
            assert!(
                by[32..].iter().all(|&t| t == tb),
                "pool b's share ran on another thread"
            );
        }
    }

    #[test]
    fn a_pool_thread_keeps_watching_while_the_copy_it_joined_is_open() {
        // The caller's share takes 1 ms, its pool thread's none: the thread,
        // done long before the copy closes, still joins the next copy through
        // the handoff (its watch counts from the close). Ten copies of that,
        // in up to 10 s of copies, should the machine hold the thread off its
        // core at times (a thread that watched only 100 µs from the end of
        // its part was handed one in thousands: one woken a ms late).
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let _pinned = PinnedApart::new(&pool);
        let id = &pool as *const rayon::ThreadPool as usize;
        let handed_off = || HANDED_OFF.lock().unwrap().iter().filter(|&&q| q == id).count();
        let slow_caller = |lo: usize, _hi: usize| {
            if lo == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let t = Instant::now();
        while handed_off() < 10 && t.elapsed() < Duration::from_secs(10) {
            static_shares(&pool, 2, 64, Duration::from_secs(10), &slow_caller);
        }
        assert!(
            handed_off() >= 10,
            "{} copies after a slow one handed off",
            handed_off()
        );
    }

    #[test]
    fn the_caller_spins_until_the_pool_is_done_and_no_longer_than_its_cap() {
        // Done already: no wait.
        let asked = std::cell::Cell::new(0);
        spin_until(
            || {
                asked.set(asked.get() + 1);
                true
            },
            FINISH_SPIN,
        );
        assert_eq!(asked.get(), 1);
        // Never done: it gives up after the cap (and not long after).
        let t = Instant::now();
        spin_until(|| false, FINISH_SPIN);
        assert!(t.elapsed() >= FINISH_SPIN && t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    #[serial_test::serial(copy_backoff)]
    fn the_caller_takes_the_ranges_of_a_pool_thread_that_has_not_started() {
        // The pool's only thread is busy (as when another library's threads
        // hold the cores) until the copies are over, or for 10 s at most.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (release, blocked) = channel::<()>();
        let (started, running) = channel::<()>();
        pool.spawn(move || {
            started.send(()).unwrap();
            let _ = blocked.recv_timeout(Duration::from_secs(10));
        });
        running.recv().unwrap();
        let me = std::thread::current().id();
        let moves = super::super::placement::tests::KEEP_OFF_CALLS.load(Ordering::Relaxed);
        for total in [2, 3, 1000] {
            let t = Instant::now();
            let by = visits(total, |f| static_shares(&pool, 2, total, Duration::from_millis(1), f));
            assert!(by.iter().all(|&t| t == me), "static, total {total}");
            let by = visits(total, |f| balanced(&pool, 2, total, 64 << 20, f));
            assert!(by.iter().all(|&t| t == me), "balanced, total {total}");
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        // Each copy the pool missed asked to keep it off this thread's CPU.
        let missed = super::super::placement::tests::KEEP_OFF_CALLS.load(Ordering::Relaxed) - moves;
        assert!(missed >= 6, "{missed} of 6 missed copies moved the pool");
        release.send(()).unwrap();
        // The pool runs its late broadcasts, which find the jobs closed, and
        // stays usable.
        let by = visits(1000, |f| static_shares(&pool, 2, 1000, Duration::from_secs(10), f));
        assert!(by.iter().any(|&t| t != me));
    }

    #[test]
    #[serial_test::serial(copy_backoff)]
    fn a_share_whose_pool_thread_is_late_moves_the_pool_though_others_started() {
        // Pool thread 1 is busy (as one queued behind the caller on its CPU),
        // pool thread 0 free: with many threads, some always start, and only
        // the one that shares the caller's CPU misses its share.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (release, blocked) = channel::<()>();
        let blocked = Mutex::new(blocked);
        let (started, running) = channel::<()>();
        let started = Mutex::new(started);
        pool.spawn_broadcast(move |ctx| {
            if ctx.index() == 1 {
                started.lock().unwrap().send(()).unwrap();
                let _ = blocked.lock().unwrap().recv_timeout(Duration::from_secs(10));
            }
        });
        running.recv().unwrap();
        let me = std::thread::current().id();
        let moves = super::super::placement::tests::KEEP_OFF_CALLS.load(Ordering::Relaxed);
        // A long grace, so that thread 0 starts on its share within it.
        let by = visits(3000, |f| static_shares(&pool, 3, 3000, Duration::from_millis(500), f));
        release.send(()).unwrap();
        assert!(by[1000..2000].iter().all(|&t| t != me), "pool thread 0 ran its share");
        assert!(
            by[2000..].iter().all(|&t| t == me),
            "the caller took the late thread's share"
        );
        let moved = super::super::placement::tests::KEEP_OFF_CALLS.load(Ordering::Relaxed) - moves;
        assert!(moved >= 1, "the late share did not move the pool");
    }

    #[test]
    fn a_late_pool_sends_copies_to_the_caller_alone_for_a_while() {
        // A back-off of its own, on a clock of its own: the copy pool's is
        // fed by every copy the tests beside make.
        let b = Backoff::new();
        let ms = |n: u64| n * 1_000_000;
        let late = |now: u64, start, waited, limit| {
            for k in 0..LATE_STREAK_MAX as u64 {
                assert!(!b.active(|| now + k));
                b.observe(now + k, start, waited, limit);
            }
        };
        // Started 50 µs after it was handed out, in a copy of 5 ms: on time.
        b.observe(
            ms(1),
            Some(Duration::from_micros(50)),
            Duration::from_millis(5),
            POOL_LATE,
        );
        assert!(!b.active(|| ms(1)));
        // Not started within a copy that took 0.5 ms: not late either.
        b.observe(ms(2), None, Duration::from_micros(500), POOL_LATE);
        assert!(!b.active(|| ms(2)));
        // Late, then on time: no back-off; late three times in a row: back-off
        // for BACKOFF from the third.
        b.observe(ms(3), Some(POOL_LATE), POOL_LATE, POOL_LATE);
        b.observe(ms(4), Some(POOL_LATE), POOL_LATE, POOL_LATE);
        b.observe(ms(5), Some(Duration::ZERO), POOL_LATE, POOL_LATE);
        assert!(!b.active(|| ms(5)));
        late(ms(6), Some(POOL_LATE), POOL_LATE, POOL_LATE);
        let end = ms(6) + 2 + BACKOFF.as_nanos() as u64;
        assert!(b.active(|| ms(6) + 2) && b.active(|| end - 1));
        assert!(!b.active(|| end));
        // Not started within the grace of static shares, three times.
        late(end + ms(1), None, FINISH_SPIN, FINISH_SPIN);
        assert!(b.active(|| end + ms(1) + 2));
    }

    /// The calls `par_for` makes for a copy of `total` indices and `bytes`.
    fn calls(total: usize, bytes: usize) -> Vec<(usize, usize)> {
        let seen = Mutex::new(Vec::new());
        super::par_for(total, bytes, |lo, hi| seen.lock().unwrap().push((lo, hi)));
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        seen
    }

    #[test]
    #[serial_test::serial(copy_backoff)]
    fn a_copy_kept_on_one_thread_is_one_whole_call_and_a_split_one_only_parts() {
        // The contract the transposes' tile order relies on: every call of a
        // copy can tell whether the copy was split.
        let (total, big) = (1000, 64 << 20);
        assert_eq!(calls(total, super::PAR_MIN_BYTES - 1), [(0, total)]);
        // Within `serially`, large copies run on the calling thread, and the
        // mode ends with it.
        assert_eq!(super::serially(|| calls(total, big)), [(0, total)]);
        assert!(!super::SERIAL.get());
        // Backed off: large copies run serially too, and are counted so.
        let counted = |name: &str| super::pool_stats().into_iter().find(|&(n, _)| n == name).unwrap().1;
        let kept = counted("kept_serial");
        COPY_BACKOFF.until.store(u64::MAX, Ordering::SeqCst);
        assert_eq!(calls(total, big), [(0, total)]);
        COPY_BACKOFF.until.store(0, Ordering::SeqCst);
        assert!(counted("kept_serial") > kept);
        // Split where there is a pool of two or more (unless other tests' copies
        // have just made it back off), and then the parts tile the range.
        let splits = counted("split");
        let split = calls(total, big);
        if split.len() > 1 {
            assert!(counted("split") > splits);
            assert!(split.iter().all(|&(lo, hi)| hi - lo < total), "{split:?}");
            assert!(split.windows(2).all(|w| w[0].1 == w[1].0), "{split:?}");
            assert_eq!((split[0].0, split[split.len() - 1].1), (0, total));
        } else {
            assert_eq!(split, [(0, total)]);
        }
        COPY_BACKOFF.until.store(0, Ordering::SeqCst);
        COPY_BACKOFF.late_streak.store(0, Ordering::SeqCst);
    }

    #[test]
    fn a_panic_in_the_body_reaches_the_caller_after_every_range_has_ended() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            balanced(&pool, 4, 1000, 64 << 20, &|lo: usize, _hi: usize| {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert!(lo != 0, "the first range panics");
            })
        }));
        let payload = r.unwrap_err();
        let msg = payload.downcast_ref::<&str>().copied().unwrap_or_default();
        assert!(msg.contains("the first range panics"), "{msg}");
        // Every other range ran too: the caller returned after all of them.
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst) > 4);
    }

    #[test]
    fn slow_kernels_split_from_a_quarter_of_the_bytes_under_a_mib() {
        let kib = 1 << 10;
        // A quarter of the threshold counts as all of it, a byte less does not.
        assert_eq!(slow_counted(PAR_MIN_BYTES / SLOW_KERNEL_COST), PAR_MIN_BYTES);
        assert!(slow_counted(PAR_MIN_BYTES / SLOW_KERNEL_COST - 1) < PAR_MIN_BYTES);
        assert_eq!(slow_counted(171 * kib), 684 * kib);
        // From 1 MiB on, bytes are bytes: large copies keep their pieces.
        assert_eq!(
            slow_counted(PAR_MIN_BYTES * SLOW_KERNEL_COST),
            PAR_MIN_BYTES * SLOW_KERNEL_COST
        );
        assert_eq!(slow_counted(64 << 20), 64 << 20);
    }

    #[test]
    fn static_shares_where_each_fits_in_a_workers_l2() {
        let mib = 1 << 20;
        // 16 workers, 2 MiB of L2 each: 4 MiB in 16 shares of 512 KiB read and
        // written; 1 MiB in 8 (128 KiB each at least); 64 MiB does not fit.
        assert_eq!(static_share_count(1 << 20, 4 * mib, 16, 2 * mib), Some(16));
        assert_eq!(static_share_count(1 << 20, mib, 16, 2 * mib), Some(8));
        assert_eq!(static_share_count(1 << 20, 64 * mib, 16, 2 * mib), None);
        // Two pieces of 8 MiB each cannot stay in a 2 MiB L2, however many workers.
        assert_eq!(static_share_count(2, 16 * mib, 16, 2 * mib), None);
        // Two workers, 1 MiB of L2 each.
        assert_eq!(static_share_count(1000, mib, 2, mib), Some(2));
        assert_eq!(static_share_count(1000, 2 * mib, 2, mib), None);
    }
}
