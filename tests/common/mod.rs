//! Shared helpers of the integration tests.
#![allow(dead_code)]

use devtensor::backend::BackendStatus;

/// True when the backend can run; otherwise prints a visible `SKIP` line and
/// returns false — or panics when `DEVTENSOR_REQUIRE_GPU=1` (GPU runners).
pub fn gpu_or_skip(test: &str, status: &BackendStatus) -> bool {
    if status.is_available() {
        return true;
    }
    let reason = status.unavailable_reason();
    // A CUDA runner sets DEVTENSOR_REQUIRE_GPU=1, a ROCm runner
    // DEVTENSOR_REQUIRE_ROCM=1: each makes its own backend's skips failures.
    let var = match status.backend {
        devtensor::device::Backend::Rocm => "DEVTENSOR_REQUIRE_ROCM",
        _ => "DEVTENSOR_REQUIRE_GPU",
    };
    if std::env::var(var).as_deref() == Ok("1") {
        panic!("{test}: {var}=1 but no {} device: {reason}", status.backend);
    }
    println!("SKIP {test}: no {} device ({reason})", status.backend);
    false
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// True when the backend's devices are the emulated driver's (emu/): their
/// names end in "(emulated)". Tests use it only to size work, never to skip.
pub fn emulated(status: &BackendStatus) -> bool {
    status.devices.iter().any(|d| d.name.ends_with("(emulated)"))
}
