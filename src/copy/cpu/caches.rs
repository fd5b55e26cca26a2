//! CPU cache sizes, from Linux sysfs: the last level's sets the streaming
//! threshold ([`super::runs`]), a core's L2 the parallel schedule
//! ([`super::parallel`]), the L2's associativity the transposes' tiles
//! ([`mod@super::transpose`]) and where whole runs stream ([`super::runs`]).

use std::sync::OnceLock;

/// One cache of CPU 0.
#[derive(Clone, Copy)]
struct Cache {
    level: u32,
    bytes: usize,
    /// Logical CPUs sharing it (hyperthreads, core clusters).
    cpus: usize,
    /// Ways of associativity (0 where sysfs does not tell).
    ways: usize,
}

/// The caches of CPU 0.
fn caches() -> &'static [Cache] {
    static CACHES: OnceLock<Vec<Cache>> = OnceLock::new();
    CACHES.get_or_init(|| {
        let mut v = Vec::new();
        for i in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}"));
            let (Ok(level), Ok(size)) = (read("level"), read("size")) else {
                break;
            };
            if let (Ok(level), Some(bytes)) = (level.trim().parse(), parse_size(size.trim())) {
                let cpus = read("shared_cpu_list")
                    .ok()
                    .and_then(|l| count_cpus(l.trim()))
                    .unwrap_or(1);
                let ways = read("ways_of_associativity")
                    .ok()
                    .and_then(|w| w.trim().parse().ok())
                    .unwrap_or(0);
                v.push(Cache {
                    level,
                    bytes,
                    cpus,
                    ways,
                });
            }
        }
        v
    })
}

/// The number of CPUs in a sysfs list such as "0-3,8,10-11".
fn count_cpus(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// "48K", "2048K", "32M", "1G" or plain bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// Size of the largest CPU cache (the last level's), if sysfs tells.
pub(super) fn llc_bytes() -> Option<usize> {
    caches().iter().map(|c| c.bytes).max()
}

/// A logical CPU's part of its L2: the L2's size over the CPUs sharing it
/// (1 MiB where sysfs does not tell).
pub(super) fn l2_bytes() -> usize {
    caches()
        .iter()
        .find(|c| c.level == 2)
        .map_or(1 << 20, |c| c.bytes / c.cpus.max(1))
}

/// A logical CPU's part of the L2 from which it counts as big
/// ([`l2_is_big`]): what sysfs shows between the Emerald Rapids VM (2 MiB a
/// core) and the Zen 5 one (1 MiB), both 16-way, where some kernels' best
/// choices differ (2-byte transposes in `transpose`, far short rows in
/// `rows`); which of their differences decides is not known.
const BIG_L2: usize = 2 << 20;

/// Whether a logical CPU's part of the L2 is [`BIG_L2`] or more.
pub(super) fn l2_is_big() -> bool {
    l2_bytes() >= BIG_L2
}

/// Whether the L2 has fewer than [`FEW_L2_WAYS`] ways (false where sysfs
/// does not tell); read once, as every clone past the tiny ones asks.
pub(super) fn l2_has_few_ways() -> bool {
    static FEW: OnceLock<bool> = OnceLock::new();
    *FEW.get_or_init(|| l2_ways().is_some_and(|w| w < FEW_L2_WAYS))
}

/// Whether the L2 holds under 1 MiB (false where sysfs does not tell): with
/// few ways ([`l2_has_few_ways`]), what separates the Zen 3 VM (512 KiB)
/// from the Zen 4 one (1 MiB), whose clones stream from different sizes
/// ([`super::runs`]). Read once, as [`l2_has_few_ways`] is.
pub(super) fn l2_is_under_1mib() -> bool {
    static SMALL: OnceLock<bool> = OnceLock::new();
    *SMALL.get_or_init(|| {
        caches()
            .iter()
            .find(|c| c.level == 2)
            .is_some_and(|c| c.bytes < 1 << 20)
    })
}

/// The L2's set span and ways: addresses this many bytes apart share a set
/// (its bytes over its ways: 64 KiB for a 512 KiB 8-way L2), and a set holds
/// that many lines. 64 KiB and 16 ways where sysfs does not tell.
pub(super) fn l2_sets() -> (usize, usize) {
    caches()
        .iter()
        .find(|c| c.level == 2 && c.ways > 0)
        .map_or((64 << 10, 16), |c| (c.bytes / c.ways, c.ways))
}

/// The copies were tuned on three machines: a Zen 5 VM (16-way 1 MiB L2,
/// 12-way 48 KiB L1), a Zen 3 VM (8-way 512 KiB L2, 8-way 32 KiB L1) and a
/// Zen 4 VM (8-way 1 MiB L2, 8-way 32 KiB L1, AVX-512 run as two 256-bit
/// halves), all with a 32 MiB L3. On the Zen 3 VM streamed transposes want
/// other tiles (`transpose`) and whole runs stream from a smaller size
/// ([`super::runs`]); on the Zen 4 VM most AVX-512 transpose routes lose to
/// AVX2's. Which of the machines' differences decides is not known; the L2's
/// ways are the one sysfs shows that separates them.
const FEW_L2_WAYS: usize = 16;

/// The L2's ways of associativity, if sysfs tells.
fn l2_ways() -> Option<usize> {
    caches()
        .iter()
        .find(|c| c.level == 2)
        .map(|c| c.ways)
        .filter(|&w| w > 0)
}

#[cfg(test)]
mod tests {
    use super::{count_cpus, l2_ways, parse_size};

    #[test]
    fn l2_ways_are_sysfs_ones() {
        // The level-2 entry among CPU 0's caches, where sysfs lists one.
        let want = (0..8).find_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            (read("level")?.trim() == "2").then(|| read("ways_of_associativity")?.trim().parse::<usize>().ok())?
        });
        assert_eq!(l2_ways(), want.filter(|&w| w > 0));
    }

    #[test]
    fn sysfs_sizes_parse_with_their_suffixes() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("307200K"), Some(300 << 20));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn sysfs_cpu_lists_count_their_cpus() {
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0,8"), Some(2));
        assert_eq!(count_cpus("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus(""), None);
        assert_eq!(count_cpus("x"), None);
    }
}
