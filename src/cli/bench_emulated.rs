//! `devtensor bench` on the emulated CUDA driver (emu/): timings there mean
//! nothing, so each pattern is copied once and the emulator's per-launch
//! metrics — the figures Nsight Compute would give — are printed instead:
//! 32-byte sector efficiency of global loads and stores, shared-memory bank
//! conflicts and instructions per element.
//!
//! The emulator appends one JSON object per launch to the file named by
//! `DEVTENSOR_EMU_REPORT`; the bench reads what each pattern's copy added.

// Without the `cuda` feature only `is_emulated` is reached (it is always false then).
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// True when `device` is served by the emulated driver (its name says so).
pub fn is_emulated(device: devtensor::Device) -> bool {
    let devtensor::Device::Cuda(i) = device else {
        return false;
    };
    devtensor::backend::cuda_status()
        .devices
        .iter()
        .any(|d| d.ordinal == i && d.name.ends_with("(emulated)"))
}

/// The report file the emulator writes to, read before any CUDA call.
pub fn report_path() -> Option<PathBuf> {
    std::env::var_os("DEVTENSOR_EMU_REPORT").map(PathBuf::from)
}

/// Sums of the metrics of the launches one copy made.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub kernels: Vec<String>,
    pub lane_instructions: u64,
    pub load_sectors: u64,
    pub load_bytes: u64,
    pub store_sectors: u64,
    pub store_bytes: u64,
    pub shared_requests: u64,
    pub bank_conflicts: u64,
}

impl Metrics {
    /// Bytes the lanes asked for over bytes of the 32-byte sectors moved.
    pub fn load_efficiency(&self) -> f64 {
        ratio(self.load_bytes, self.load_sectors * 32)
    }

    pub fn store_efficiency(&self) -> f64 {
        ratio(self.store_bytes, self.store_sectors * 32)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// The unsigned number after `"key":` in a flat JSON object.
fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = line[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The string after `"key":` in a flat JSON object (no escapes: kernel names).
fn string_field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    Some(line[at..].split('"').next()?.to_owned())
}

/// Runs `f` and returns the metrics of the launches it made.
pub fn metrics_of(path: &PathBuf, f: impl FnOnce() -> devtensor::Result<()>) -> devtensor::Result<Metrics> {
    let start = std::fs::metadata(path).map_or(0, |m| m.len());
    f()?;
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        // A failed read leaves `text` empty: the pattern then shows no launches.
        let _ = file
            .seek(SeekFrom::Start(start))
            .and_then(|_| file.read_to_string(&mut text));
    }
    let mut m = Metrics::default();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        m.kernels.push(string_field(line, "kernel").unwrap_or_default());
        m.lane_instructions += field(line, "lane_instructions").unwrap_or(0);
        m.load_sectors += field(line, "global_load_sectors").unwrap_or(0);
        m.load_bytes += field(line, "global_load_bytes").unwrap_or(0);
        m.store_sectors += field(line, "global_store_sectors").unwrap_or(0);
        m.store_bytes += field(line, "global_store_bytes").unwrap_or(0);
        m.shared_requests += field(line, "shared_requests").unwrap_or(0);
        m.bank_conflicts += field(line, "shared_bank_conflicts").unwrap_or(0);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_a_report_line() {
        let line = r#"{"kernel":"copy_strided_e4","grid":[4,1,1],"global_load_sectors":128,"global_load_bytes": 4096}"#;
        assert_eq!(field(line, "global_load_sectors"), Some(128));
        assert_eq!(field(line, "global_load_bytes"), Some(4096));
        assert_eq!(field(line, "missing"), None);
        assert_eq!(string_field(line, "kernel").as_deref(), Some("copy_strided_e4"));
    }
}
