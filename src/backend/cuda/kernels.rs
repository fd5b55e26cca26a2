//! The embedded kernel source, compiled once per (source, options, NVRTC
//! version, arch) with NVRTC and cached in memory and on disk.
//!
//! Disk cache: `DEVTENSOR_KERNEL_CACHE`, else `$XDG_CACHE_HOME/devtensor/kernels`,
//! else `~/.cache/devtensor/kernels`. Each entry stores the SHA-256 of its
//! payload in front of it and is written to a temporary file, then renamed, so
//! a torn or corrupted entry is detected and rebuilt.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

use super::nvrtc::{self, Output};
use crate::error::Result;

/// The one translation unit shared by NVRTC and hiprtc.
pub const SOURCE: &str = include_str!("../../../kernels/strided_copy.cu");
/// Its name in compiler logs.
pub const SOURCE_NAME: &str = "strided_copy.cu";

/// Every kernel the source must define (checked against the PTX by `kernels --check`).
pub const KERNELS: &[&str] = &[
    "copy_strided_e1",
    "copy_strided_e2",
    "copy_strided_e4",
    "copy_strided_e8",
    "copy_strided_e16",
    "copy_strided64_e1",
    "copy_strided64_e2",
    "copy_strided64_e4",
    "copy_strided64_e8",
    "copy_strided64_e16",
    "fill_e1",
    "fill_e2",
    "fill_e4",
    "fill_e8",
    "fill_e16",
    "copy_contig_v16",
    "transpose_tiled_e1",
    "transpose_tiled_e2",
    "transpose_tiled_e4",
    "transpose_tiled_e8",
];

/// NVRTC options for a target (`sm_90` → cubin, `compute_90` → PTX).
pub fn options(target: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={target}"),
        "--std=c++17".to_owned(),
        "-default-device".to_owned(),
    ]
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DEVTENSOR_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("devtensor").join("kernels"))
}

fn key(target: &str, nvrtc_version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    for part in [
        SOURCE,
        &options(target).join(" "),
        &format!("{nvrtc_version:?}"),
        target,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn read_cached(path: &std::path::Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let (digest, payload) = bytes.split_at_checked(32)?;
    (Sha256::digest(payload).as_slice() == digest).then(|| payload.to_vec())
}

fn write_cached(path: &std::path::Path, payload: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return; // a read-only home: compile every run, still correct
    }
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        std::process::id(),
        path.file_name().map_or("x".into(), |f| f.to_string_lossy())
    ));
    let mut data = Sha256::digest(payload).to_vec();
    data.extend_from_slice(payload);
    if std::fs::write(&tmp, data).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Where a compiled module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled by NVRTC just now.
    Compiled,
    /// Read from the disk cache.
    Disk,
    /// Already in this process.
    Memory,
}

/// The compiled module for `target` (`sm_90` → cubin, `compute_90` → PTX).
pub fn module(target: &str) -> Result<(Arc<Vec<u8>>, Origin)> {
    static MEMORY: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    let memory = MEMORY.get_or_init(Default::default);
    if let Some(m) = memory.lock().unwrap_or_else(|p| p.into_inner()).get(target) {
        return Ok((m.clone(), Origin::Memory));
    }
    let (version, _) = nvrtc::version()?;
    let path = cache_dir().map(|d| {
        d.join(format!(
            "{}.{}",
            key(target, version),
            if target.starts_with("sm_") { "cubin" } else { "ptx" }
        ))
    });
    let (payload, origin) = match path.as_deref().and_then(read_cached) {
        Some(p) => (p, Origin::Disk),
        None => {
            let out = if target.starts_with("sm_") {
                Output::Cubin
            } else {
                Output::Ptx
            };
            let p = nvrtc::compile(SOURCE_NAME, SOURCE, &options(target), out)?;
            if let Some(path) = &path {
                write_cached(path, &p);
            }
            (p, Origin::Compiled)
        }
    };
    let payload = Arc::new(payload);
    memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(target.to_owned(), payload.clone());
    Ok((payload, origin))
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
