//! The caching pool over a CPU-backed raw allocator: fragmentation, OOM
//! recovery, cross-stream reuse ordering, stats balance, threads.

use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use devtensor::alloc::{AllocStats, Allocation, CachingAlloc, CpuAlloc, NDAlloc, PoolConfig};
use devtensor::stream::{EventHandle, StreamHandle};
use devtensor::{Device, Error};

const MIB: usize = 1 << 20;

/// CPU memory with a capacity (to force OOM) and fake events that log how the
/// pool orders reuse.
#[derive(Debug, Default)]
struct TestRaw {
    capacity: usize,
    used: AtomicUsize,
    next_event: AtomicUsize,
    log: Mutex<Vec<String>>,
}

impl TestRaw {
    fn new(capacity: usize) -> Self {
        TestRaw {
            capacity,
            ..Default::default()
        }
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

// SAFETY: delegates to CpuAlloc, which honours the contract; the capacity
// check only refuses requests.
unsafe impl NDAlloc for TestRaw {
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn allocate(&self, size: usize, align: usize, stream: Option<StreamHandle>) -> devtensor::Result<Allocation> {
        if self.used.fetch_add(size, Ordering::SeqCst) + size > self.capacity {
            self.used.fetch_sub(size, Ordering::SeqCst);
            return Err(Error::OutOfMemory {
                device: Device::Cpu,
                requested: size,
                reserved: 0,
                allocated: 0,
                largest_free: 0,
            });
        }
        CpuAlloc.allocate(size, align, stream)
    }
    unsafe fn deallocate(&self, a: Allocation, stream: Option<StreamHandle>) {
        self.used.fetch_sub(a.size, Ordering::SeqCst);
        // SAFETY: `a` came from CpuAlloc in `allocate`.
        unsafe { CpuAlloc.deallocate(a, stream) }
    }
    fn stats(&self) -> AllocStats {
        AllocStats::default()
    }
    fn record_event(&self, stream: StreamHandle) -> devtensor::Result<Option<EventHandle>> {
        let ev = self.next_event.fetch_add(1, Ordering::SeqCst) + 100;
        self.log
            .lock()
            .unwrap()
            .push(format!("record {ev} on {}", stream.as_raw()));
        // SAFETY: a token this test allocator made; no driver ever sees it.
        Ok(Some(unsafe { EventHandle::from_raw(ev) }))
    }
    fn wait_event(&self, stream: Option<StreamHandle>, event: EventHandle) -> devtensor::Result<()> {
        self.log.lock().unwrap().push(format!(
            "wait {} on {}",
            event.as_raw(),
            stream.map_or(0, |s| s.as_raw())
        ));
        Ok(())
    }
    fn release_event(&self, event: EventHandle) {
        self.log.lock().unwrap().push(format!("release {}", event.as_raw()));
    }
}

/// A stream token for the pool's bookkeeping (this test's allocator never
/// hands it to a driver).
fn stream(raw: usize) -> StreamHandle {
    // SAFETY: only recorded and compared by the pool and `TestRaw`.
    unsafe { StreamHandle::from_raw(raw) }
}

fn fill(a: &Allocation, byte: u8) {
    // SAFETY: the allocation is live and `size` bytes long.
    unsafe { std::ptr::write_bytes(a.ptr.as_ptr(), byte, a.size) }
}

fn check(a: &Allocation, byte: u8) -> bool {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(a.ptr.as_ptr(), a.size) }
        .iter()
        .all(|&b| b == byte)
}

#[test]
fn reuses_cached_blocks_and_balances_stats() {
    let pool = CachingAlloc::new(TestRaw::new(usize::MAX), PoolConfig::default());
    let a = pool.allocate(1000, 64, None).unwrap();
    let first = a.ptr;
    // SAFETY: `a` is live and freed once.
    unsafe { pool.deallocate(a, None) };
    let b = pool.allocate(900, 64, None).unwrap();
    assert_eq!(b.ptr, first, "the freed block is reused");
    let s = pool.memory_stats();
    assert_eq!((s.active_blocks, s.segments, s.segment_allocs), (1, 1, 1));
    assert_eq!(s.allocated, 1024);
    assert_eq!(s.reserved, 2 * MIB);
    // SAFETY: freed once.
    unsafe { pool.deallocate(b, None) };
    let s = pool.memory_stats();
    assert_eq!((s.allocated, s.active_blocks), (0, 0));
    assert_eq!(pool.empty_cache(), 2 * MIB);
    assert_eq!(pool.memory_stats().reserved, 0);
    assert_eq!(pool.raw().used.load(Ordering::SeqCst), 0);
}

#[test]
fn splitting_and_merging_bound_fragmentation() {
    let pool = CachingAlloc::new(TestRaw::new(usize::MAX), PoolConfig::default());
    // Interleaved sizes, free every other one, then ask for larger blocks: the
    // merged neighbours must serve them without new segments beyond need.
    let sizes = [512usize, 3000, 700, 64 << 10, 5000, 200_000, 1 << 20];
    let mut live: Vec<(Allocation, u8)> = Vec::new();
    for i in 0..300 {
        let a = pool.allocate(sizes[i % sizes.len()], 256, None).unwrap();
        fill(&a, i as u8);
        live.push((a, i as u8));
    }
    let mut kept = Vec::new();
    for (i, (a, tag)) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            // SAFETY: each allocation is freed once.
            unsafe { pool.deallocate(a, None) };
        } else {
            kept.push((a, tag));
        }
    }
    let reserved_before = pool.memory_stats().reserved;
    for _ in 0..50 {
        let a = pool.allocate(6000, 256, None).unwrap();
        fill(&a, 0xee);
        kept.push((a, 0xee));
    }
    assert_eq!(
        pool.memory_stats().reserved,
        reserved_before,
        "freed space was reused, no new segment"
    );
    for (a, tag) in &kept {
        assert!(check(a, *tag), "no block overlaps another");
    }
    for (a, _) in kept {
        // SAFETY: freed once.
        unsafe { pool.deallocate(a, None) };
    }
    let s = pool.memory_stats();
    assert_eq!((s.allocated, s.active_blocks), (0, 0));
    pool.empty_cache();
    assert_eq!(pool.memory_stats().segments, 0, "every segment merged back whole");
}

#[test]
fn out_of_memory_recovers_from_other_streams_then_reports() {
    let (s1, s2) = (stream(11), stream(22));
    let pool = CachingAlloc::new(TestRaw::new(24 * MIB), PoolConfig::default());
    // Stream 1 caches a whole 20 MiB large segment.
    let a = pool.allocate(5 * MIB, 256, Some(s1)).unwrap();
    // SAFETY: freed once.
    unsafe { pool.deallocate(a, Some(s1)) };
    assert_eq!(pool.memory_stats().reserved, 20 * MIB);
    // Stream 2 needs a large block: the device has only 4 MiB left, so the pool
    // takes stream 1's free segment, ordered after stream 1's work.
    let b = pool.allocate(6 * MIB, 256, Some(s2)).unwrap();
    let log = pool.raw().log();
    assert!(log.iter().any(|l| l == "record 100 on 11"), "{log:?}");
    assert!(log.iter().any(|l| l == "wait 100 on 22"), "{log:?}");
    // Beyond the device: a typed error with the pool's figures.
    let err = pool.allocate(30 * MIB, 256, Some(s1)).unwrap_err();
    match err {
        Error::OutOfMemory {
            requested,
            reserved,
            allocated,
            ..
        } => {
            assert_eq!(requested, 30 * MIB);
            assert_eq!(reserved, 20 * MIB);
            assert_eq!(allocated, 6 * MIB);
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert!(err.to_string().contains("reserved"));
    assert_eq!(pool.memory_stats().oom_count, 1);
    // SAFETY: freed once.
    unsafe { pool.deallocate(b, Some(s2)) };
    // Cached segments are released when the device is full.
    let c = pool.allocate(22 * MIB, 256, Some(s1)).unwrap();
    // SAFETY: freed once.
    unsafe { pool.deallocate(c, Some(s1)) };
}

#[test]
fn memory_used_on_another_stream_is_reused_only_after_a_device_wait() {
    let (s1, reader) = (stream(1), stream(7));
    let pool = CachingAlloc::new(TestRaw::new(usize::MAX), PoolConfig::default());
    let a = pool.allocate(4096, 256, Some(s1)).unwrap();
    let addr = a.ptr;
    // A slow reader on stream 7 used it (record_stream); freeing records an event there.
    // SAFETY: freed once.
    unsafe { pool.deallocate_after(a, Some(s1), &[reader]) };
    assert_eq!(pool.raw().log(), vec!["record 100 on 7".to_string()]);
    // Another stream's pool never sees the block.
    let other = pool.allocate(4096, 256, Some(stream(9))).unwrap();
    assert_ne!(other.ptr, addr);
    // The owner stream reuses it, waiting for the reader on the device first.
    let b = pool.allocate(4096, 256, Some(s1)).unwrap();
    assert_eq!(b.ptr, addr);
    assert_eq!(pool.raw().log(), vec!["record 100 on 7", "wait 100 on 1"]);
    // SAFETY: each freed once.
    unsafe {
        pool.deallocate(b, Some(s1));
        pool.deallocate(other, Some(stream(9)));
    }
    // The rest of the split segment still carried the event; it goes with the segment.
    pool.empty_cache();
    assert_eq!(pool.raw().log().last().map(String::as_str), Some("release 100"));
}

#[test]
fn limit_is_enforced() {
    let cfg = PoolConfig {
        limit: 4 * MIB,
        ..PoolConfig::default()
    };
    let pool = CachingAlloc::new(TestRaw::new(usize::MAX), cfg);
    let a = pool.allocate(MIB, 256, None).unwrap();
    let b = pool.allocate(MIB, 256, None).unwrap(); // fits the 2 MiB small segment with a
    assert!(matches!(
        pool.allocate(5 * MIB, 256, None),
        Err(Error::OutOfMemory { .. })
    ));
    // SAFETY: freed once.
    unsafe {
        pool.deallocate(a, None);
        pool.deallocate(b, None);
    }
    let _ = NonNull::<u8>::dangling();
}

#[test]
fn segments_are_never_smaller_than_the_request_whatever_the_config() {
    // The fields are public: small segments below `small_max` (or of 0 bytes)
    // once handed out a block shorter than the request.
    for (small_segment, large_segment) in [(MIB, 2 * MIB), (0, 0)] {
        let cfg = PoolConfig {
            small_max: 8 * MIB,
            small_segment,
            large_max: 16 * MIB,
            large_segment,
            ..PoolConfig::default()
        };
        let pool = CachingAlloc::new(TestRaw::new(usize::MAX), cfg);
        for size in [4 * MIB, 12 * MIB, 1000] {
            let a = pool.allocate(size, 256, None).unwrap();
            assert!(a.size >= size, "{size}: a block of {}", a.size);
            assert!(pool.memory_stats().reserved >= size);
            fill(&a, 7); // the whole block is the pool's to hand out
            assert!(check(&a, 7));
            // SAFETY: freed once.
            unsafe { pool.deallocate(a, None) };
        }
        pool.empty_cache();
        assert_eq!(pool.raw().used.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn eight_threads_alloc_and_free_without_leaks() {
    let iters: usize = std::env::var("DEVTENSOR_STRESS_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let pool = CachingAlloc::new(TestRaw::new(usize::MAX), PoolConfig::default());
    std::thread::scope(|scope| {
        for t in 0..8usize {
            let pool = &pool;
            scope.spawn(move || {
                let stream = if t % 2 == 0 { None } else { Some(stream(t)) };
                let mut held: Vec<Allocation> = Vec::with_capacity(16);
                let mut x = t as u64 + 1;
                for i in 0..iters {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if held.len() < 16 && (x & 1 == 0 || held.is_empty()) {
                        let a = pool.allocate(64 + (x as usize % 300_000), 256, stream).unwrap();
                        // SAFETY: a live allocation of at least one byte.
                        unsafe { *a.ptr.as_ptr() = (i % 251) as u8 };
                        held.push(a);
                    } else {
                        let a = held.swap_remove(x as usize % held.len());
                        // SAFETY: freed once, on the stream it was allocated on.
                        unsafe { pool.deallocate(a, stream) };
                    }
                }
                for a in held {
                    // SAFETY: freed once.
                    unsafe { pool.deallocate(a, stream) };
                }
            });
        }
    });
    let s = pool.memory_stats();
    assert_eq!((s.allocated, s.active_blocks), (0, 0));
    pool.empty_cache();
    assert_eq!(pool.memory_stats().reserved, 0);
    assert_eq!(
        pool.raw().used.load(Ordering::SeqCst),
        0,
        "every segment went back to the device"
    );
}
