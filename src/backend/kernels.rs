//! The kernel source both GPU backends compile, its manifest, and the caches
//! the compiled modules live in.
//!
//! Each backend compiles [`SOURCE`] once per (source, options, compiler, target)
//! — NVRTC for CUDA (`backend::cuda::kernels`), hiprtc for ROCm
//! (`backend::rocm::kernels`) — and keeps the result in a [`ModuleCache`] (this
//! process) and on disk.
//!
//! Disk cache: `DEVTENSOR_KERNEL_CACHE`, else `$XDG_CACHE_HOME/devtensor/kernels`,
//! else `~/.cache/devtensor/kernels`. Each entry stores the SHA-256 of its
//! payload in front of it and is written to a temporary file, then renamed, so
//! a torn or corrupted entry is detected and rebuilt.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

use crate::error::Result;

/// The one translation unit shared by NVRTC, hiprtc and offline HIP compilers.
pub const SOURCE: &str = include_str!("../../kernels/strided_copy.cu");
/// Its name in compiler logs.
pub const SOURCE_NAME: &str = "strided_copy.cu";

pub use super::launch::KERNELS;

/// Where a compiled module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled just now (NVRTC or hiprtc).
    Compiled,
    /// Read from the disk cache.
    Disk,
    /// Already in this process.
    Memory,
}

/// The disk cache directory, if there is a home for it.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DEVTENSOR_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("devtensor").join("kernels"))
}

/// The cache key (hex SHA-256) of [`SOURCE`] compiled with `options` by
/// `compiler` (its identity: version, library) for `target`.
pub fn key(compiler: &str, options: &[String], target: &str) -> String {
    let mut h = Sha256::new();
    for part in [SOURCE, &options.join(" "), compiler, target] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The payload of the cache entry at `path`, if it is there and intact.
pub fn read_cached(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let (digest, payload) = bytes.split_at_checked(32)?;
    (Sha256::digest(payload).as_slice() == digest).then(|| payload.to_vec())
}

/// Stores `payload` at `path` (atomically; silently skipped when the directory
/// cannot be written: every run then compiles, still correct).
pub(crate) fn write_cached(path: &Path, payload: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
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

/// The disk cache entry named `file` if present, else `compile()`'s result,
/// which is then stored under that name.
pub fn disk_cached(file: &str, compile: impl FnOnce() -> Result<Vec<u8>>) -> Result<(Vec<u8>, Origin)> {
    let path = cache_dir().map(|d| d.join(file));
    if let Some(p) = path.as_deref().and_then(read_cached) {
        return Ok((p, Origin::Disk));
    }
    let p = compile()?;
    if let Some(path) = &path {
        write_cached(path, &p);
    }
    Ok((p, Origin::Compiled))
}

/// Compiled modules of one backend in this process, by target.
#[derive(Debug, Default)]
pub struct ModuleCache {
    modules: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>>,
}

impl ModuleCache {
    /// An empty cache (usable in a `static`).
    pub const fn new() -> Self {
        Self {
            modules: OnceLock::new(),
        }
    }

    /// The module for `target`: from this process if built before, else from
    /// `build` (which reports whether it compiled or read the disk cache).
    /// The lock is not held while building: two threads may both build, and the
    /// first result stays.
    pub fn get_or_build(
        &self,
        target: &str,
        build: impl FnOnce() -> Result<(Vec<u8>, Origin)>,
    ) -> Result<(Arc<Vec<u8>>, Origin)> {
        let modules = self.modules.get_or_init(Default::default);
        if let Some(m) = modules.lock().unwrap_or_else(|p| p.into_inner()).get(target) {
            return Ok((m.clone(), Origin::Memory));
        }
        let (payload, origin) = build()?;
        let payload = modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(target.to_owned())
            .or_insert_with(|| Arc::new(payload))
            .clone();
        Ok((payload, origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_depends_on_every_part() {
        let opts = vec!["-O3".to_owned()];
        let base = key("c 1.0", &opts, "gfx90a");
        assert_eq!(base.len(), 64);
        assert_eq!(base, key("c 1.0", &opts, "gfx90a"));
        assert_ne!(base, key("c 1.1", &opts, "gfx90a"));
        assert_ne!(base, key("c 1.0", &[], "gfx90a"));
        assert_ne!(base, key("c 1.0", &opts, "gfx942"));
    }

    #[test]
    fn manifest_names_appear_in_source() {
        for k in KERNELS {
            let stem = k.rsplit_once("_e").map_or(*k, |(s, _)| s);
            assert!(SOURCE.contains(stem), "{k}");
        }
    }

    #[test]
    fn cache_entry_round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("devtensor-kcache-{}", std::process::id()));
        let path = dir.join("entry.bin");
        write_cached(&path, b"payload");
        assert_eq!(read_cached(&path).as_deref(), Some(&b"payload"[..]));
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read_cached(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn module_cache_builds_once() {
        let cache = ModuleCache::new();
        let (a, o) = cache.get_or_build("t", || Ok((vec![1, 2], Origin::Compiled))).unwrap();
        assert_eq!((a.as_slice(), o), (&[1u8, 2][..], Origin::Compiled));
        let (b, o) = cache.get_or_build("t", || panic!("built twice")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(o, Origin::Memory);
        assert!(cache.get_or_build("u", || Err(crate::Error::ReadOnly)).is_err());
    }
}
