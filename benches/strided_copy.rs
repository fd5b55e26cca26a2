//! Criterion benchmark of the CPU strided-copy engine over the pattern matrix
//! (`cpu_matrix` of `src/cli/patterns.rs`, shared with `devtensor bench`),
//! plus a memcpy baseline of the same byte counts. Throughput is read + write bytes (`2 × numel × elem_size`),
//! so criterion's GB/s compare directly with `devtensor bench` and the peer
//! scripts.
//!
//! `DEVTENSOR_BENCH_QUICK=1` runs the smaller matrix; a criterion filter
//! (`cargo bench --bench strided_copy -- transpose`) selects patterns.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use devtensor::copy::copy_strided;

// The binary's module, not the library's API: included here as source. Its unit
// tests run with the binary's; a checked bench keeps their imports, not the tests.
#[path = "../src/cli/patterns.rs"]
#[allow(dead_code, unused_imports, reason = "the bench uses part of the binary's module")]
mod patterns;

use patterns::{Pattern, cpu_matrix, quick_matrix};

fn matrix() -> Vec<Pattern> {
    if std::env::var_os("DEVTENSOR_BENCH_QUICK").is_some() {
        quick_matrix()
    } else {
        cpu_matrix()
    }
}

fn strided(c: &mut Criterion) {
    let mut g = c.benchmark_group("strided_copy");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for p in matrix() {
        let mut prep = p.prepare();
        g.throughput(Throughput::Bytes(p.bytes_moved()));
        g.bench_function(&p.name, |b| {
            b.iter(|| {
                prep.run().expect("pattern copy");
                black_box(prep.dst().as_ptr());
            })
        });
    }
    g.finish();
}

fn memcpy_baseline(c: &mut Criterion) {
    let mut g = c.benchmark_group("memcpy");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut sizes: Vec<usize> = matrix().iter().map(|p| p.numel() * p.elem_size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for bytes in sizes {
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        g.throughput(Throughput::Bytes(2 * bytes as u64));
        g.bench_function(format!("{bytes}B"), |b| {
            b.iter(|| {
                // SAFETY: both buffers hold `bytes` bytes and do not overlap.
                unsafe { copy_strided(dst.as_mut_ptr(), &[1], src.as_ptr(), &[1], &[bytes], 1) }.expect("memcpy");
                black_box(dst.as_ptr());
            })
        });
    }
    g.finish();
}

criterion_group!(benches, strided, memcpy_baseline);
criterion_main!(benches);
