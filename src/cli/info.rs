//! `devtensor info`: backends, library versions, devices, and why one is unavailable.

use devtensor::backend::{self, BackendStatus};

fn gib(bytes: usize) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn print_status(s: &BackendStatus) {
    let state = if s.is_available() { "available" } else { "unavailable" };
    println!("{} — {state}", s.backend);
    for (lib, version) in &s.versions {
        println!("  {lib:<14} {version}");
    }
    for d in &s.devices {
        let mem = if d.total_memory > 0 {
            format!(", {}", gib(d.total_memory))
        } else {
            String::new()
        };
        println!("  device {}: {} ({}{mem})", d.ordinal, d.name, d.arch);
    }
    if let Some(reason) = &s.unavailable {
        println!("  reason: {reason}");
    }
    let gpu = |i| match s.backend {
        devtensor::Backend::Cuda => Some(devtensor::Device::Cuda(i)),
        devtensor::Backend::Rocm => Some(devtensor::Device::Rocm(i)),
        devtensor::Backend::Cpu => None,
    };
    if s.backend != devtensor::Backend::Cpu && s.is_available() {
        let conf = std::env::var("DEVTENSOR_ALLOC_CONF").unwrap_or_else(|_| "defaults".to_owned());
        println!("  allocator: caching pool for device and pinned memory (DEVTENSOR_ALLOC_CONF: {conf})");
        for d in &s.devices {
            if let Some(dev) = gpu(d.ordinal)
                && let Ok(m) = devtensor::backend::memory_stats(dev)
            {
                println!(
                    "  pool {dev}: {} allocated, {} reserved, peak {}, {} segments",
                    m.allocated, m.reserved, m.peak_reserved, m.segments
                );
            }
        }
    }
}

pub fn run() {
    println!("devtensor {}", env!("CARGO_PKG_VERSION"));
    print_status(backend::cuda_status());
    print_status(backend::rocm_status());
    print_status(&backend::cpu_status());
}
