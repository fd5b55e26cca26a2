//! Allocation speed: the caching pool's alloc+free pair against the raw
//! allocator underneath, single-threaded and with 8 threads.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use devtensor::alloc::{CachingAlloc, CpuAlloc, NDAlloc, PoolConfig};
use devtensor::{DType, Device, Tensor};

fn pair(alloc: &dyn NDAlloc, size: usize) {
    let a = alloc.allocate(size, 256, None).expect("allocate");
    black_box(a.ptr);
    // SAFETY: `a` was just allocated by `alloc` and is freed once.
    unsafe { alloc.deallocate(a, None) };
}

fn single_thread(c: &mut Criterion) {
    let pool = CachingAlloc::new(CpuAlloc, PoolConfig::default());
    let mut g = c.benchmark_group("alloc_free_pair");
    for size in [4096usize, 1 << 20, 16 << 20] {
        g.bench_function(format!("pool/{size}"), |b| b.iter(|| pair(&pool, size)));
        g.bench_function(format!("raw_cpu/{size}"), |b| b.iter(|| pair(&CpuAlloc, size)));
    }
    g.finish();
    let mut g = c.benchmark_group("tensor_empty");
    let pooled: Arc<dyn NDAlloc> = Arc::new(CachingAlloc::new(CpuAlloc, PoolConfig::default()));
    g.bench_function("pool/1024x1024_f32", |b| {
        b.iter(|| black_box(Tensor::empty_in(pooled.clone(), &[1024, 1024], DType::F32).expect("empty")))
    });
    g.bench_function("raw_cpu/1024x1024_f32", |b| {
        b.iter(|| black_box(Tensor::empty(&[1024, 1024], DType::F32, Device::Cpu).expect("empty")))
    });
    g.finish();
}

fn eight_threads(c: &mut Criterion) {
    let pool = CachingAlloc::new(CpuAlloc, PoolConfig::default());
    let mut g = c.benchmark_group("alloc_free_pair_8_threads");
    const PER_THREAD: usize = 1000;
    g.throughput(criterion::Throughput::Elements((8 * PER_THREAD) as u64));
    for (name, alloc) in [("pool", &pool as &dyn NDAlloc), ("raw_cpu", &CpuAlloc)] {
        g.bench_function(format!("{name}/4096"), |b| {
            b.iter(|| {
                std::thread::scope(|s| {
                    for _ in 0..8 {
                        s.spawn(|| (0..PER_THREAD).for_each(|_| pair(alloc, 4096)));
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(std::time::Duration::from_secs(2)).sample_size(20);
    targets = single_thread, eight_threads
}
criterion_main!(benches);
