//! CPU cache sizes, from Linux sysfs: the last level's sets the streaming
//! threshold ([`super::runs`]), a core's L2 the parallel schedule
//! ([`super::parallel`]).

use std::sync::OnceLock;

/// The caches of CPU 0 as (level, bytes).
fn caches() -> &'static [(u32, usize)] {
    static CACHES: OnceLock<Vec<(u32, usize)>> = OnceLock::new();
    CACHES.get_or_init(|| {
        let mut v = Vec::new();
        for i in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let (Ok(level), Ok(size)) = (
                std::fs::read_to_string(format!("{dir}/level")),
                std::fs::read_to_string(format!("{dir}/size")),
            ) else {
                break;
            };
            if let (Ok(level), Some(bytes)) = (level.trim().parse(), parse_size(size.trim())) {
                v.push((level, bytes));
            }
        }
        v
    })
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
    caches().iter().map(|&(_, b)| b).max()
}

/// Size of a core's L2 (1 MiB where sysfs does not tell).
pub(super) fn l2_bytes() -> usize {
    caches()
        .iter()
        .find(|&&(level, _)| level == 2)
        .map_or(1 << 20, |&(_, b)| b)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

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
}
