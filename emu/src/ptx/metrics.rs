//! Per-launch counters: 32-byte sectors per global request, shared-memory bank
//! conflicts, and the merged byte ranges a launch touched.

/// Distinct 32-byte sectors among the active lanes' accesses. Every access is
/// aligned to its width (≤ 16 bytes, checked before), so each lies in one sector.
pub fn sectors(addr: &[u64; 32], m: u32) -> u64 {
    distinct(addr, m, 5)
}

/// Bytes the active lanes use, each counted once (Nsight's "bytes used" of a
/// request: lanes reading the same element share it). The accesses of one
/// instruction have one width and are aligned to it, so two are equal or disjoint.
pub fn used_bytes(addr: &[u64; 32], m: u32, width: u64) -> u64 {
    distinct(addr, m, 0) * width
}

/// Distinct values of `addr >> shift` among the active lanes.
fn distinct(addr: &[u64; 32], m: u32, shift: u32) -> u64 {
    let mut prev = u64::MAX;
    let mut sorted = true;
    let mut n = 0;
    let mut mm = m;
    while mm != 0 {
        let l = mm.trailing_zeros() as usize;
        mm &= mm - 1;
        let s = addr[l] >> shift;
        if prev != u64::MAX && s < prev {
            sorted = false;
            break;
        }
        if s != prev {
            n += 1;
            prev = s;
        }
    }
    if sorted {
        return n;
    }
    let mut v = [0u64; 32];
    let mut k = 0;
    let mut mm = m;
    while mm != 0 {
        let l = mm.trailing_zeros() as usize;
        mm &= mm - 1;
        v[k] = addr[l] >> shift;
        k += 1;
    }
    let v = &mut v[..k];
    v.sort_unstable();
    1 + v.windows(2).filter(|w| w[0] != w[1]).count() as u64
}

/// Shared-memory bank conflicts of one request (32 banks of 4-byte words): the
/// wavefronts (the most distinct words any bank must serve; lanes reading the
/// same word are served by one broadcast) minus the wavefronts the request
/// needs anyway (distinct words / 32, rounded up: a warp moving 8 or 16 bytes
/// per lane needs 2 or 4 even without conflicts). For accesses of at most 4
/// bytes per lane this is wavefronts - 1.
pub fn bank_conflicts(addr: &[u64; 32], m: u32, size: u32) -> u64 {
    let mut words = [0u64; 128];
    let mut k = 0;
    let mut mm = m;
    while mm != 0 {
        let l = mm.trailing_zeros() as usize;
        mm &= mm - 1;
        let a = addr[l];
        for wd in (a >> 2)..=((a + size as u64 - 1) >> 2) {
            if k < words.len() {
                words[k] = wd;
                k += 1;
            }
        }
    }
    let words = &mut words[..k];
    words.sort_unstable();
    let mut per_bank = [0u32; 32];
    let mut distinct = 0u64;
    let mut prev = u64::MAX;
    for &wd in words.iter() {
        if wd != prev {
            per_bank[(wd & 31) as usize] += 1;
            distinct += 1;
            prev = wd;
        }
    }
    let wavefronts = *per_bank.iter().max().unwrap_or(&0) as u64;
    let ideal = distinct.div_ceil(32).max(1);
    wavefronts.saturating_sub(ideal)
}

/// Merged `[lo, hi)` byte ranges, bounded in number: past [`RangeSet::CAP`]
/// ranges, neighbours closer than a growing gap are merged (an
/// over-approximation, which for the race detector errs on the side of a report).
#[derive(Debug, Default, Clone)]
pub struct RangeSet {
    v: Vec<(u64, u64)>,
    merged: usize,
}

impl RangeSet {
    pub const CAP: usize = 1 << 16;

    #[inline]
    pub fn push(&mut self, lo: u64, hi: u64) {
        if let Some(last) = self.v.last_mut() {
            if lo <= last.1 && hi >= last.0 {
                last.0 = last.0.min(lo);
                last.1 = last.1.max(hi);
                return;
            }
        }
        self.v.push((lo, hi));
        if self.v.len() > 2 * self.merged + 4096 {
            self.compact();
        }
    }

    pub fn compact(&mut self) {
        self.v.sort_unstable();
        merge_gap(&mut self.v, 0);
        let mut gap = 32;
        while self.v.len() > Self::CAP {
            merge_gap(&mut self.v, gap);
            gap *= 2;
        }
        self.merged = self.v.len();
    }

    pub fn extend(&mut self, other: &RangeSet) {
        for &(lo, hi) in &other.v {
            self.push(lo, hi);
        }
    }

    /// Sorted, merged ranges.
    pub fn ranges(&mut self) -> &[(u64, u64)] {
        self.compact();
        &self.v
    }
}

fn merge_gap(v: &mut Vec<(u64, u64)>, gap: u64) {
    let mut out = 0;
    for i in 0..v.len() {
        if out > 0 && v[i].0 <= v[out - 1].1.saturating_add(gap) {
            v[out - 1].1 = v[out - 1].1.max(v[i].1);
        } else {
            v[out] = v[i];
            out += 1;
        }
    }
    v.truncate(out);
}

/// The first overlap of two sorted, merged range lists.
pub fn first_overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> Option<(u64, u64)> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if lo < hi {
            return Some((lo, hi));
        }
        if a[i].1 <= b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn used_bytes_count_shared_elements_once() {
        let mut addr = [0u64; 32];
        // Every lane reads the same 4-byte element: 4 bytes used, one sector.
        addr.iter_mut().for_each(|a| *a = 4096);
        assert_eq!(super::used_bytes(&addr, u32::MAX, 4), 4);
        assert_eq!(super::sectors(&addr, u32::MAX), 1);
        // Consecutive elements: 128 bytes in 4 sectors (100 % utilisation).
        addr.iter_mut().enumerate().for_each(|(i, a)| *a = 4096 + 4 * i as u64);
        assert_eq!(super::used_bytes(&addr, u32::MAX, 4), 128);
        assert_eq!(super::sectors(&addr, u32::MAX), 4);
        // Half the lanes active.
        assert_eq!(super::used_bytes(&addr, 0xffff, 4), 64);
    }

    use super::*;

    fn addrs(f: impl Fn(u64) -> u64) -> [u64; 32] {
        std::array::from_fn(|l| f(l as u64))
    }

    #[test]
    fn sector_counts() {
        assert_eq!(sectors(&addrs(|l| 4 * l), u32::MAX), 4);
        assert_eq!(sectors(&addrs(|l| 8 * l), u32::MAX), 8);
        assert_eq!(sectors(&addrs(|l| 16 * l), u32::MAX), 16);
        assert_eq!(sectors(&addrs(|l| 128 * l), u32::MAX), 32);
        assert_eq!(sectors(&addrs(|_| 64), u32::MAX), 1);
        assert_eq!(sectors(&addrs(|l| 4 * (31 - l)), u32::MAX), 4);
        assert_eq!(sectors(&addrs(|l| 4 * l + 16), 1), 1);
        assert_eq!(sectors(&addrs(|l| 4 * l + 16), 0b11 | 1 << 31), 2);
    }

    #[test]
    fn bank_conflict_counts() {
        // 4-byte words, consecutive: no conflict; stride 2 words: 2-way; stride 32: 32-way.
        assert_eq!(bank_conflicts(&addrs(|l| 4 * l), u32::MAX, 4), 0);
        assert_eq!(bank_conflicts(&addrs(|l| 8 * l), u32::MAX, 4), 1);
        assert_eq!(bank_conflicts(&addrs(|l| 128 * l), u32::MAX, 4), 31);
        // broadcast of one word
        assert_eq!(bank_conflicts(&addrs(|_| 12), u32::MAX, 4), 0);
        // padded transpose column: stride 33 words
        assert_eq!(bank_conflicts(&addrs(|l| 132 * l), u32::MAX, 4), 0);
        // 8-byte consecutive: 2 wavefronts needed anyway
        assert_eq!(bank_conflicts(&addrs(|l| 8 * l), u32::MAX, 8), 0);
        // 8-byte, 33*8-byte row stride: banks 2l mod 32, two lanes per bank pair -> ideal
        assert_eq!(bank_conflicts(&addrs(|l| 264 * l), u32::MAX, 8), 0);
        // bytes in one word: broadcast
        assert_eq!(bank_conflicts(&addrs(|l| l), u32::MAX, 1), 0);
    }

    #[test]
    fn ranges_merge_and_overlap() {
        let mut r = RangeSet::default();
        r.push(0, 4);
        r.push(4, 8);
        r.push(100, 104);
        r.push(50, 60);
        r.push(8, 12);
        assert_eq!(r.ranges(), &[(0, 12), (50, 60), (100, 104)]);
        assert_eq!(first_overlap(&[(0, 12), (50, 60)], &[(12, 50)]), None);
        assert_eq!(first_overlap(&[(0, 12), (50, 60)], &[(12, 51)]), Some((50, 51)));
        let mut big = RangeSet::default();
        for i in 0..(RangeSet::CAP as u64 * 3) {
            big.push(i * 8, i * 8 + 4);
        }
        let n = big.ranges().len();
        assert!(n <= RangeSet::CAP, "{n}");
        assert_eq!(big.ranges().first().unwrap().0, 0);
        assert_eq!(big.ranges().last().unwrap().1, (RangeSet::CAP as u64 * 3 - 1) * 8 + 4);
    }
}
