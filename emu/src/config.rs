//! The emulator's environment (see emu/README.md, "Environment"), read once.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Everything the environment configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `DEVTENSOR_EMU_DEVICES`: number of emulated GPUs (default 2).
    pub devices: u32,
    /// `DEVTENSOR_EMU_MEMORY`: bytes of memory per GPU (default 80 GiB).
    pub memory: u64,
    /// `DEVTENSOR_EMU_DRIVER_VERSION`: the version `cuDriverGetVersion` reports
    /// (1000 × major + 10 × minor; default 13000). Functions introduced later
    /// answer `CUDA_ERROR_NOT_SUPPORTED`.
    pub driver_version: i32,
    /// `DEVTENSOR_EMU_SEED`: seed of the random delay per stream operation (0: none).
    pub seed: u64,
    /// `DEVTENSOR_EMU_REPORT`: file the per-launch metrics are appended to.
    pub report: Option<PathBuf>,
    /// `DEVTENSOR_EMU_THREADS`: host threads a launch spreads its blocks over.
    pub threads: usize,
    /// `DEVTENSOR_EMU_RACECHECK`: `0` turns the stream race detector off (default on).
    pub racecheck: bool,
    /// `DEVTENSOR_EMU_NVRTC`: the real NVRTC the shim forwards to (file or directory).
    pub nvrtc: Option<PathBuf>,
    /// `DEVTENSOR_EMU_PTX_CACHE`: directory of cubin-hash → PTX records.
    pub ptx_cache: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            devices: 2,
            memory: 80 << 30,
            driver_version: 13000,
            seed: 0,
            report: None,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            racecheck: true,
            nvrtc: None,
            ptx_cache: None,
        }
    }
}

/// Parses a byte count: a plain number or one with a `K`/`M`/`G`/`T` suffix
/// (binary multiples; an optional trailing `B`/`iB` is accepted).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix("iB").or_else(|| s.strip_suffix('B')).unwrap_or(s);
    let (num, shift) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 10),
        'm' | 'M' => (&s[..s.len() - 1], 20),
        'g' | 'G' => (&s[..s.len() - 1], 30),
        't' | 'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = num.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

impl Config {
    /// The configuration from the process environment (unset or unparsable
    /// variables keep their defaults; a warning names the unparsable ones).
    pub fn from_env() -> Config {
        let mut c = Config::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let warn = |name: &str, v: &str| eprintln!("devtensor-emu: ignoring {name}={v:?} (not understood)");
        if let Some(v) = var("DEVTENSOR_EMU_DEVICES") {
            match v.trim().parse::<u32>() {
                Ok(n) if n <= 64 => c.devices = n,
                _ => warn("DEVTENSOR_EMU_DEVICES", &v),
            }
        }
        if let Some(v) = var("DEVTENSOR_EMU_MEMORY") {
            match parse_bytes(&v) {
                Some(n) if n > 0 => c.memory = n,
                _ => warn("DEVTENSOR_EMU_MEMORY", &v),
            }
        }
        if let Some(v) = var("DEVTENSOR_EMU_DRIVER_VERSION") {
            match v.trim().parse::<i32>() {
                Ok(n) if n > 0 => c.driver_version = n,
                _ => warn("DEVTENSOR_EMU_DRIVER_VERSION", &v),
            }
        }
        if let Some(v) = var("DEVTENSOR_EMU_SEED") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.seed = n,
                _ => warn("DEVTENSOR_EMU_SEED", &v),
            }
        }
        c.report = var("DEVTENSOR_EMU_REPORT").map(PathBuf::from);
        if let Some(v) = var("DEVTENSOR_EMU_THREADS") {
            match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => c.threads = n,
                _ => warn("DEVTENSOR_EMU_THREADS", &v),
            }
        }
        if let Some(v) = var("DEVTENSOR_EMU_RACECHECK") {
            c.racecheck = !matches!(v.trim(), "0" | "off" | "false" | "no");
        }
        c.nvrtc = var("DEVTENSOR_EMU_NVRTC").map(PathBuf::from);
        c.ptx_cache = var("DEVTENSOR_EMU_PTX_CACHE").map(PathBuf::from).or_else(|| {
            let base = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("devtensor-emu"))
        });
        c
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process configuration (read from the environment on first use).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Installs `config` instead of the environment's; only before the first
/// [`get`] (returns false, changing nothing, afterwards). For tests.
pub fn set(config: Config) -> bool {
    CONFIG.set(config).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("80G"), Some(80 << 30));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("x"), None);
    }
}
