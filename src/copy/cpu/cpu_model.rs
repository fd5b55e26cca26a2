//! The CPU's maker and family, from CPUID, for the choices the caches'
//! geometry ([`super::caches`]) cannot make: a Zen 2 and a Zen 3 core report
//! the same 32 KiB 8-way L1D and 512 KiB 8-way L2, yet the transposes' best
//! routes differ between them (`zen3_prefetched` in [`mod@super::transpose`]).

use std::sync::OnceLock;

/// AMD's family 19h: Zen 3 and Zen 4 (AMD's Processor Programming Reference
/// for family 19h, CPUID Fn0000_0001_EAX: the family is the base family
/// field plus the extended family field where the base is 0Fh).
const AMD_FAMILY_19H: u32 = 0x19;

/// Whether the CPU is a Zen 3 core: AMD, family 19h, without AVX-512 F
/// (which every Zen 4 of that family has). A Zen 4 whose hypervisor hides
/// AVX-512 counts as one too; its AVX-512 routes would not run there either.
pub(super) fn is_zen3() -> bool {
    static ZEN3: OnceLock<bool> = OnceLock::new();
    *ZEN3.get_or_init(detect_zen3)
}

// `__cpuid` is safe in recent Rust releases and unsafe in 1.89, the crate's
// `rust-version`.
#[allow(unused_unsafe)]
#[cfg(target_arch = "x86_64")]
fn detect_zen3() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: every x86-64 CPU has CPUID, and leaves 0 and 1 (the highest
    // basic leaf and the family) exist on all of them.
    let (leaf0, leaf1) = unsafe { (__cpuid(0), __cpuid(1)) };
    let vendor = [leaf0.ebx, leaf0.edx, leaf0.ecx];
    let amd = vendor.iter().flat_map(|r| r.to_le_bytes()).eq(*b"AuthenticAMD");
    amd && family(leaf1.eax) == AMD_FAMILY_19H && !std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_zen3() -> bool {
    false
}

/// The family CPUID leaf 1's EAX gives: the base family (bits 8–11), plus the
/// extended family (bits 20–27) where the base is 0Fh.
fn family(eax: u32) -> u32 {
    let base = (eax >> 8) & 0xf;
    if base == 0xf { base + ((eax >> 20) & 0xff) } else { base }
}

#[cfg(test)]
mod tests {
    use super::{family, is_zen3};

    #[test]
    fn family_adds_the_extended_field_to_0fh_only() {
        // Zen 3 (EPYC 7003, family 19h model 01h), Zen 2 (17h), an Intel core (06h).
        assert_eq!(family(0x00A0_0F11), 0x19);
        assert_eq!(family(0x0083_0F10), 0x17);
        assert_eq!(family(0x000C_06F2), 0x6);
    }

    /// Linux's /proc/cpuinfo says the same as CPUID does.
    #[test]
    fn zen3_agrees_with_proc_cpuinfo() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            println!("SKIP zen3_agrees_with_proc_cpuinfo: no /proc/cpuinfo");
            return;
        };
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        };
        let (Some(vendor), Some(fam), Some(flags)) = (field("vendor_id"), field("cpu family"), field("flags")) else {
            println!("SKIP zen3_agrees_with_proc_cpuinfo: /proc/cpuinfo lacks vendor_id, cpu family or flags");
            return;
        };
        let want = cfg!(target_arch = "x86_64")
            && vendor == "AuthenticAMD"
            && fam == "25"
            && !flags.split_whitespace().any(|f| f == "avx512f");
        assert_eq!(is_zen3(), want, "vendor {vendor}, family {fam}");
    }
}
