//! The shared kernel source ([`crate::backend::kernels`]) compiled with NVRTC,
//! once per (source, options, NVRTC version, arch), cached in memory and on disk.

use std::sync::Arc;

use super::nvrtc::{self, Output};
pub use crate::backend::kernels::{KERNELS, Origin, SOURCE, SOURCE_NAME};
use crate::backend::kernels::{ModuleCache, disk_cached, key};
use crate::error::Result;

/// NVRTC options for a target (`sm_90` → cubin, `compute_90` → PTX).
pub fn options(target: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={target}"),
        "--std=c++17".to_owned(),
        "-default-device".to_owned(),
    ]
}

/// The compiled module for `target` (`sm_90` → cubin, `compute_90` → PTX).
pub fn module(target: &str) -> Result<(Arc<Vec<u8>>, Origin)> {
    static MEMORY: ModuleCache = ModuleCache::new();
    MEMORY.get_or_build(target, || {
        let (version, _) = nvrtc::version()?;
        let (out, ext) = if target.starts_with("sm_") {
            (Output::Cubin, "cubin")
        } else {
            (Output::Ptx, "ptx")
        };
        let options = options(target);
        let compiler = compiler_id(version, super::probe::driver_version());
        let file = format!("{}.{ext}", key(&compiler, &options, target));
        disk_cached(&file, || nvrtc::compile(SOURCE_NAME, SOURCE, &options, out))
    })
}

/// The compiler part of a disk-cache key: NVRTC's version and the driver's,
/// since what a driver loads depends on it too (a CUDA 13 cubin needs r580+).
fn compiler_id(nvrtc: (i32, i32), driver: i32) -> String {
    format!("{nvrtc:?} driver {driver}")
}

/// What `devtensor kernels --check` reports for one architecture.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// `sm_90`, ...
    pub arch: String,
    /// NVRTC version and library path.
    pub nvrtc: ((i32, i32), String),
    /// Size of the cubin devtensor would load.
    pub cubin_bytes: usize,
    /// Kernels found as `.entry` in the PTX, in manifest order.
    pub entries: Vec<&'static str>,
    /// Manifest kernels missing from the PTX (a failed check when non-empty).
    pub missing: Vec<&'static str>,
}

/// Compiles every kernel for `arch` (`sm_XY`) with no GPU: the PTX is checked
/// for every manifest entry and the cubin is built as it would be at run time.
pub fn check(arch: &str) -> Result<CheckReport> {
    let nvrtc = nvrtc::version()?;
    let sm = arch.trim_start_matches("sm_");
    let ptx = nvrtc::compile(SOURCE_NAME, SOURCE, &options(&format!("compute_{sm}")), Output::Ptx)?;
    let ptx = String::from_utf8_lossy(&ptx);
    let (entries, missing) = KERNELS.iter().partition(|k| ptx.contains(&format!(".entry {k}(")));
    let cubin = nvrtc::compile(SOURCE_NAME, SOURCE, &options(&format!("sm_{sm}")), Output::Cubin)?;
    Ok(CheckReport {
        arch: format!("sm_{sm}"),
        nvrtc,
        cubin_bytes: cubin.len(),
        entries,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_cache_key_changes_with_the_driver_version() {
        let opts = options("sm_90");
        let with = |nvrtc, driver| key(&compiler_id(nvrtc, driver), &opts, "sm_90");
        assert_ne!(
            with((13, 0), 12040),
            with((13, 0), 13000),
            "a cubin cached under one driver must not load under another"
        );
        assert_ne!(with((12, 9), 13000), with((13, 0), 13000));
        assert_eq!(with((13, 0), 13000), with((13, 0), 13000));
    }
}
