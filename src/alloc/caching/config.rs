//! Pool settings: [`PoolConfig`] and the `DEVTENSOR_ALLOC_CONF` variable
//! (`max_split_size_mb:256,limit_mb:8192,disable:1,staging_mb:16,cpu_cache_mb:1024`),
//! which also bounds the pinned staging memory of host↔device copies and the
//! freed large host blocks the CPU allocator keeps.

use crate::error::{Error, Result};

pub(super) const MIB: usize = 1 << 20;

/// Pool settings; `DEVTENSOR_ALLOC_CONF` overrides them
/// (`max_split_size_mb:256,limit_mb:8192,disable:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Blocks at least this large are never split (limits fragmentation by
    /// huge blocks); `usize::MAX` by default.
    pub max_split_size: usize,
    /// Most bytes the pool may hold from the device (a per-process limit).
    pub limit: usize,
    /// Largest request served from small segments.
    pub small_max: usize,
    /// Size of a small segment.
    pub small_segment: usize,
    /// Largest request served from shared large segments.
    pub large_max: usize,
    /// Size of a shared large segment.
    pub large_segment: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_split_size: usize::MAX,
            limit: usize::MAX,
            small_max: MIB,
            small_segment: 2 * MIB,
            large_max: 10 * MIB,
            large_segment: 20 * MIB,
        }
    }
}

impl PoolConfig {
    /// The defaults with `DEVTENSOR_ALLOC_CONF` applied; `Ok(None)` when the
    /// variable says `disable:1` (use the raw allocator).
    pub fn from_env() -> Result<Option<PoolConfig>> {
        match std::env::var("DEVTENSOR_ALLOC_CONF") {
            Ok(s) => PoolConfig::parse(&s),
            Err(_) => Ok(Some(PoolConfig::default())),
        }
    }

    /// Parses `key:value` pairs separated by commas.
    pub fn parse(conf: &str) -> Result<Option<PoolConfig>> {
        let mut c = PoolConfig::default();
        for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once(':').ok_or(Error::Config {
                var: "DEVTENSOR_ALLOC_CONF",
                reason: "entries are key:value".into(),
            })?;
            let n: usize = value.trim().parse().map_err(|_| Error::Config {
                var: "DEVTENSOR_ALLOC_CONF",
                reason: "values are integers".into(),
            })?;
            let mb = n.checked_mul(MIB).ok_or(Error::Overflow {
                what: "DEVTENSOR_ALLOC_CONF",
            })?;
            match key.trim() {
                "max_split_size_mb" => c.max_split_size = mb,
                "limit_mb" => c.limit = mb,
                "disable" if n != 0 => return Ok(None),
                "disable" => {}
                // Not pool settings: read by `staging_bytes` and the CPU allocator.
                "staging_mb" | "cpu_cache_mb" => {}
                _ => {
                    return Err(Error::Config {
                        var: "DEVTENSOR_ALLOC_CONF",
                        reason: format!("unknown key {:?}", key.trim()),
                    });
                }
            }
        }
        Ok(Some(c))
    }
}

/// Default bound of the pinned host memory host↔device copies stage through.
pub const DEFAULT_STAGING_BYTES: usize = 16 * MIB;

/// The most pinned host memory host↔device copies of pageable or strided host
/// views stage through (a ring of two slots of half that size each):
/// `staging_mb:N` in `DEVTENSOR_ALLOC_CONF`, [`DEFAULT_STAGING_BYTES`] without it.
/// Read once per process.
pub fn staging_bytes() -> Result<usize> {
    static BYTES: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let conf = || std::env::var("DEVTENSOR_ALLOC_CONF").ok();
    match BYTES.get_or_init(|| conf().map_or(Ok(DEFAULT_STAGING_BYTES), |s| parse_staging(&s)).ok()) {
        Some(b) => Ok(*b),
        // A bad value: its error again (the variable is read once; the error is not `Clone`).
        None => parse_staging(&conf().unwrap_or_default()).and(Err(Error::Config {
            var: "DEVTENSOR_ALLOC_CONF",
            reason: "staging_mb is invalid".into(),
        })),
    }
}

/// The `staging_mb` entry of a `DEVTENSOR_ALLOC_CONF` value, in bytes (at least 1 MiB).
pub fn parse_staging(conf: &str) -> Result<usize> {
    match entry_bytes(conf, "staging_mb")? {
        Some(0) => Err(Error::Config {
            var: "DEVTENSOR_ALLOC_CONF",
            reason: "staging_mb is at least 1".into(),
        }),
        Some(bytes) => Ok(bytes),
        None => Ok(DEFAULT_STAGING_BYTES),
    }
}

/// The `cpu_cache_mb` entry of a `DEVTENSOR_ALLOC_CONF` value, in bytes: the
/// most freed large host blocks kept for reuse (0: none); `None` without it.
pub fn parse_cpu_cache(conf: &str) -> Result<Option<usize>> {
    entry_bytes(conf, "cpu_cache_mb")
}

/// The last `key:N` entry of `conf` as `N` MiB in bytes.
fn entry_bytes(conf: &str, key: &str) -> Result<Option<usize>> {
    let mut bytes = None;
    for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((k, value)) = item.split_once(':')
            && k.trim() == key
        {
            let n: usize = value.trim().parse().map_err(|_| Error::Config {
                var: "DEVTENSOR_ALLOC_CONF",
                reason: "values are integers".into(),
            })?;
            bytes = Some(n.checked_mul(MIB).ok_or(Error::Overflow {
                what: "DEVTENSOR_ALLOC_CONF",
            })?);
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_rejects() {
        let c = PoolConfig::parse("max_split_size_mb:64, limit_mb:1024")
            .unwrap()
            .unwrap();
        assert_eq!((c.max_split_size, c.limit), (64 * MIB, 1024 * MIB));
        assert!(PoolConfig::parse("disable:1").unwrap().is_none());
        assert!(PoolConfig::parse("bogus:1").is_err());
        assert!(PoolConfig::parse("limit_mb:x").is_err());
        // The staging bound shares the variable without being a pool setting.
        assert_eq!(PoolConfig::parse("staging_mb:4").unwrap(), Some(PoolConfig::default()));
        assert_eq!(parse_staging("limit_mb:64, staging_mb:4").unwrap(), 4 * MIB);
        assert_eq!(parse_staging("").unwrap(), DEFAULT_STAGING_BYTES);
        assert!(parse_staging("staging_mb:0").is_err());
        assert!(parse_staging("staging_mb:x").is_err());
        assert_eq!(
            PoolConfig::parse("cpu_cache_mb:0").unwrap(),
            Some(PoolConfig::default())
        );
        assert_eq!(
            parse_cpu_cache("staging_mb:4,cpu_cache_mb:512").unwrap(),
            Some(512 * MIB)
        );
        assert_eq!(parse_cpu_cache("cpu_cache_mb:0").unwrap(), Some(0));
        assert_eq!(parse_cpu_cache("limit_mb:64").unwrap(), None);
        assert!(parse_cpu_cache("cpu_cache_mb:-1").is_err());
    }
}
