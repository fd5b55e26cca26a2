//! Just enough of ELF64 to check an AMDGPU code object: the header (class,
//! byte order, machine, flags) and the names of the symbols it defines, read
//! from the section headers' `.symtab`/`.dynsym` and their linked string tables.

use std::collections::BTreeSet;

/// `e_machine` of AMD GPU code objects.
pub const EM_AMDGPU: u16 = 0xE0;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_DYNSYM: u32 = 11;
const SHN_UNDEF: u16 = 0;
const EHDR_SIZE: usize = 64;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;

/// What [`parse`] read from a code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObject {
    /// `e_machine`.
    pub machine: u16,
    /// `e_ident[EI_ABIVERSION]` (AMDGPU: 1 = code object v3, 2 = v4, 3 = v5, 4 = v6).
    pub abi_version: u8,
    /// `e_flags` (AMDGPU: processor in the low byte, xnack/sramecc above).
    pub flags: u32,
    /// Names of the symbols defined (not undefined) in `.symtab` and `.dynsym`.
    pub symbols: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy)]
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// The bytes `offset..offset + size` of `b`, if in bounds.
fn range(b: &[u8], offset: u64, size: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(size).ok()?)?;
    b.get(start..end)
}

/// The NUL-terminated string at `at` in a string table.
fn cstr(table: &[u8], at: usize) -> Option<&str> {
    let rest = table.get(at..)?;
    let end = rest.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Parses a little-endian ELF64 image; `Err` says what is wrong with it.
pub fn parse(b: &[u8]) -> Result<CodeObject, String> {
    if b.len() < EHDR_SIZE || b[..4] != *b"\x7fELF" {
        return Err(format!(
            "not an ELF file ({} bytes, starts {:02x?})",
            b.len(),
            &b[..b.len().min(4)]
        ));
    }
    if b[4] != 2 || b[5] != 1 {
        return Err(format!(
            "not a little-endian ELF64 file (class {}, data {})",
            b[4], b[5]
        ));
    }
    let bad = |what: &str| format!("truncated or malformed ELF: {what}");
    let machine = u16_at(b, 18).ok_or_else(|| bad("e_machine"))?;
    let flags = u32_at(b, 48).ok_or_else(|| bad("e_flags"))?;
    let shoff = u64_at(b, 40).ok_or_else(|| bad("e_shoff"))?;
    let shentsize = u16_at(b, 58).ok_or_else(|| bad("e_shentsize"))?;
    let mut shnum = u64::from(u16_at(b, 60).ok_or_else(|| bad("e_shnum"))?);
    if shoff == 0 {
        return Err(bad("no section headers"));
    }
    if usize::from(shentsize) != SHDR_SIZE {
        return Err(bad(&format!("section header size {shentsize}")));
    }
    if shnum == 0 {
        // Extended numbering: the count is section 0's sh_size.
        shnum = range(b, shoff, SHDR_SIZE as u64)
            .and_then(|h| u64_at(h, 32))
            .ok_or_else(|| bad("section 0"))?;
    }
    let table = shnum
        .checked_mul(SHDR_SIZE as u64)
        .and_then(|n| range(b, shoff, n))
        .ok_or_else(|| bad("section header table out of bounds"))?;
    let sections: Vec<Section> = table
        .chunks_exact(SHDR_SIZE)
        .map(|h| Section {
            kind: u32_at(h, 4).unwrap_or(0),
            offset: u64_at(h, 24).unwrap_or(0),
            size: u64_at(h, 32).unwrap_or(0),
            link: u32_at(h, 40).unwrap_or(0),
            entsize: u64_at(h, 56).unwrap_or(0),
        })
        .collect();
    let mut symbols = BTreeSet::new();
    for s in sections.iter().filter(|s| s.kind == SHT_SYMTAB || s.kind == SHT_DYNSYM) {
        if s.entsize != SYM_SIZE as u64 {
            return Err(bad(&format!("symbol entry size {}", s.entsize)));
        }
        let strtab = sections
            .get(s.link as usize)
            .filter(|t| t.kind == SHT_STRTAB)
            .ok_or_else(|| bad("symbol table without a string table"))?;
        let names = range(b, strtab.offset, strtab.size).ok_or_else(|| bad("string table out of bounds"))?;
        let syms = range(b, s.offset, s.size).ok_or_else(|| bad("symbol table out of bounds"))?;
        for sym in syms.chunks_exact(SYM_SIZE) {
            let name = u32_at(sym, 0).unwrap_or(0) as usize;
            let shndx = u16_at(sym, 6).unwrap_or(SHN_UNDEF);
            if name == 0 || shndx == SHN_UNDEF {
                continue;
            }
            let name = cstr(names, name).ok_or_else(|| bad("symbol name out of bounds"))?;
            symbols.insert(name.to_owned());
        }
    }
    Ok(CodeObject {
        machine,
        abi_version: b[8],
        flags,
        symbols,
    })
}

/// `EF_AMDGPU_MACH_*` (the low byte of `e_flags`) of the processors devtensor
/// knows by number; others are reported as a number and not checked.
const MACH: &[(&str, u32)] = &[
    ("gfx900", 0x2c),
    ("gfx906", 0x2f),
    ("gfx908", 0x30),
    ("gfx90a", 0x3f),
    ("gfx940", 0x40),
    ("gfx941", 0x4b),
    ("gfx942", 0x4c),
    ("gfx950", 0x4f),
    ("gfx1030", 0x36),
    ("gfx1100", 0x41),
    ("gfx1101", 0x46),
    ("gfx1102", 0x47),
    ("gfx1150", 0x43),
    ("gfx1151", 0x4a),
    ("gfx1200", 0x48),
    ("gfx1201", 0x4e),
];

impl CodeObject {
    /// The processor named by `e_flags`, if devtensor knows its number.
    pub fn processor(&self) -> Option<&'static str> {
        let mach = self.flags & 0xff;
        MACH.iter().find(|(_, m)| *m == mach).map(|(p, _)| *p)
    }

    /// `xnack` and `sramecc` as set in `e_flags`: `Some(true)` on, `Some(false)`
    /// off, `None` any (or unsupported by the processor).
    pub fn features(&self) -> [(&'static str, Option<bool>); 2] {
        let f = self.flags;
        if self.abi_version >= 2 {
            // Code object v4+: two bits each, 1 = any, 2 = off, 3 = on (0 = unsupported).
            let two = |v: u32| match v {
                2 => Some(false),
                3 => Some(true),
                _ => None,
            };
            [("sramecc", two((f >> 10) & 3)), ("xnack", two((f >> 8) & 3))]
        } else {
            // Code object v3: one bit each, on or off.
            [("sramecc", Some(f & 0x200 != 0)), ("xnack", Some(f & 0x100 != 0))]
        }
    }

    /// The target id the flags describe (`gfx90a:sramecc+:xnack-`), or
    /// `mach 0x..` for a processor devtensor does not know by number.
    pub fn target_id(&self) -> String {
        let mut id = match self.processor() {
            Some(p) => p.to_owned(),
            None => format!("mach {:#04x}", self.flags & 0xff),
        };
        for (name, on) in self.features() {
            if let Some(on) = on {
                id.push_str(&format!(":{name}{}", if on { '+' } else { '-' }));
            }
        }
        id
    }

    /// Checks the code object is an AMDGPU one built for `target` (a target id):
    /// the processor (when known by number) and every feature `target` sets.
    pub fn check_target(&self, target: &str) -> Result<(), String> {
        if self.machine != EM_AMDGPU {
            return Err(format!(
                "e_machine {:#x} is not EM_AMDGPU ({EM_AMDGPU:#x})",
                self.machine
            ));
        }
        let mut parts = target.split(':');
        let want = parts.next().unwrap_or_default();
        if let Some(p) = self.processor()
            && p != want
        {
            return Err(format!("code object is for {}, not {want}", self.target_id()));
        }
        let features = self.features();
        for f in parts {
            let (name, on) = match f.as_bytes().last() {
                Some(b'+') => (&f[..f.len() - 1], true),
                Some(b'-') => (&f[..f.len() - 1], false),
                _ => continue,
            };
            let got = features.iter().find(|(n, _)| *n == name).and_then(|(_, v)| *v);
            if got != Some(on) {
                return Err(format!("code object is for {}, not {target}", self.target_id()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 with sections null, .strtab, .symtab, .shstrtab and one
    /// defined symbol per name, plus an undefined one named `undefined_sym`.
    pub(crate) fn tiny_elf(machine: u16, abi_version: u8, flags: u32, names: &[&str]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut syms = vec![0u8; SYM_SIZE]; // symbol 0: null
        let mut add = |name: &str, shndx: u16, strtab: &mut Vec<u8>| {
            let off = strtab.len() as u32;
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
            let mut s = [0u8; SYM_SIZE];
            s[..4].copy_from_slice(&off.to_le_bytes());
            s[4] = 0x11; // STB_GLOBAL, STT_OBJECT
            s[6..8].copy_from_slice(&shndx.to_le_bytes());
            syms.extend_from_slice(&s);
        };
        for n in names {
            add(n, 1, &mut strtab);
        }
        add("undefined_sym", SHN_UNDEF, &mut strtab);
        let shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0".to_vec();
        let strtab_off = EHDR_SIZE;
        let symtab_off = strtab_off + strtab.len();
        let shstrtab_off = symtab_off + syms.len();
        let shoff = shstrtab_off + shstrtab.len();
        let mut b = vec![0u8; EHDR_SIZE];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // little endian
        b[6] = 1; // EV_CURRENT
        b[7] = 64; // ELFOSABI_AMDGPU_HSA
        b[8] = abi_version;
        b[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
        b[48..52].copy_from_slice(&flags.to_le_bytes());
        b[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        b[58..60].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        b[60..62].copy_from_slice(&4u16.to_le_bytes());
        b[62..64].copy_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&strtab);
        b.extend_from_slice(&syms);
        b.extend_from_slice(&shstrtab);
        let shdr = |name: u32, kind: u32, off: usize, size: usize, link: u32, entsize: u64| {
            let mut h = [0u8; SHDR_SIZE];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        b.extend_from_slice(&[0u8; SHDR_SIZE]);
        b.extend_from_slice(&shdr(1, SHT_STRTAB, strtab_off, strtab.len(), 0, 0));
        b.extend_from_slice(&shdr(9, SHT_SYMTAB, symtab_off, syms.len(), 1, SYM_SIZE as u64));
        b.extend_from_slice(&shdr(17, SHT_STRTAB, shstrtab_off, shstrtab.len(), 0, 0));
        b
    }

    #[test]
    fn parses_symbols_and_flags() {
        let elf = tiny_elf(
            EM_AMDGPU,
            2,
            0x53f,
            &["copy_contig_v16", "copy_contig_v16.kd", "fill_e1.kd"],
        );
        let co = parse(&elf).unwrap();
        assert_eq!(co.machine, EM_AMDGPU);
        assert_eq!(co.flags, 0x53f);
        let names: Vec<&str> = co.symbols.iter().map(String::as_str).collect();
        assert_eq!(names, ["copy_contig_v16", "copy_contig_v16.kd", "fill_e1.kd"]);
        assert!(!co.symbols.contains("undefined_sym"));
        assert_eq!(co.processor(), Some("gfx90a"));
        assert_eq!(co.target_id(), "gfx90a");
        assert!(co.check_target("gfx90a").is_ok());
        assert!(co.check_target("gfx942").unwrap_err().contains("not gfx942"));
        // sramecc any / xnack any does not satisfy an explicit request.
        assert!(co.check_target("gfx90a:xnack-").is_err());
    }

    #[test]
    fn feature_bits() {
        // v4: sramecc on (3 << 10), xnack off (2 << 8), gfx90a.
        let co = parse(&tiny_elf(EM_AMDGPU, 2, (3 << 10) | (2 << 8) | 0x3f, &[])).unwrap();
        assert_eq!(co.target_id(), "gfx90a:sramecc+:xnack-");
        assert!(co.check_target("gfx90a:sramecc+:xnack-").is_ok());
        assert!(co.check_target("gfx90a:xnack-").is_ok());
        assert!(co.check_target("gfx90a:xnack+").is_err());
        // v3: one bit each.
        let co = parse(&tiny_elf(EM_AMDGPU, 1, 0x100 | 0x4c, &[])).unwrap();
        assert_eq!(co.target_id(), "gfx942:sramecc-:xnack+");
        // Unknown processor numbers are shown, not checked.
        let co = parse(&tiny_elf(EM_AMDGPU, 3, 0x7e, &[])).unwrap();
        assert_eq!(co.target_id(), "mach 0x7e");
        assert!(co.check_target("gfx9999").is_ok());
    }

    #[test]
    fn rejects_what_is_not_an_amdgpu_elf() {
        assert!(parse(b"").unwrap_err().contains("not an ELF"));
        assert!(parse(b"\x7fELF").unwrap_err().contains("not an ELF"));
        assert!(parse(&[0u8; 200]).unwrap_err().contains("not an ELF"));
        let x86 = parse(&tiny_elf(62, 0, 0, &["main"])).unwrap();
        assert!(x86.check_target("gfx90a").unwrap_err().contains("EM_AMDGPU"));
        let mut elf32 = tiny_elf(EM_AMDGPU, 2, 0x3f, &[]);
        elf32[4] = 1;
        assert!(parse(&elf32).unwrap_err().contains("ELF64"));
        // Every truncation fails cleanly (no panic) once the section headers go.
        let full = tiny_elf(EM_AMDGPU, 2, 0x3f, &["k.kd"]);
        for n in 0..full.len() {
            if let Ok(co) = parse(&full[..n]) {
                panic!("parsed a {n}-byte prefix: {co:?}");
            }
        }
        // A symbol name pointing past its string table.
        let mut bad = full.clone();
        let symtab_off = EHDR_SIZE + "\0k.kd\0undefined_sym\0".len();
        bad[symtab_off + SYM_SIZE..symtab_off + SYM_SIZE + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(parse(&bad).unwrap_err().contains("symbol name"));
    }
}
