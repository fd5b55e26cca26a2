//! A minimal reader for the cubins NVRTC emits (ELF64, little-endian, `EM_CUDA` = 190).
//!
//! Written from the ELF specification (System V gABI: file header, section header table,
//! symbol table) plus what the cubins themselves show. NVIDIA does not document the
//! CUDA-specific parts; the layouts below were determined by compiling kernels with known
//! parameters with NVRTC 12.9 and 13.x for sm_75 … sm_121 (see `tests/cubin_parse.rs` and the
//! fixtures under `tests/fixtures/cubin/`).
//!
//! ## `e_flags` (the architecture)
//!
//! Two layouts, told apart by `EI_ABIVERSION` (byte 8 of `e_ident`):
//!
//! | `EI_OSABI` | `EI_ABIVERSION` | who emits it | `e_flags` |
//! |---|---|---|---|
//! | 0x33 | 7 | NVRTC 12 for sm_5x … sm_90a | bits 0–7 SM (0x5a = sm_90), bits 16–23 the virtual arch, 0x400 64-bit addresses, 0x800 the `a` (arch-specific) variant |
//! | 0x41 | 8 | NVRTC 13 for every SM; NVRTC 12.9 for sm_100 and later | bits 8–15 SM (0x5a = sm_90, 0x64 = sm_100, 0x78 = sm_120), bits 0–7 flags, bits 24–31 0x06 |
//!
//! Examples: NVRTC 12 sm_90 `0x005a055a`, NVRTC 13 sm_90 `0x06005a04`, both sm_120 `0x06007802`.
//!
//! ## `.nv.info` attributes
//!
//! `.nv.info` (module-wide) and `.nv.info.<kernel>` hold records with a 4-byte header:
//! `u8 format, u8 attribute, u16 value`. Format 0x01 (NVAL): no value; 0x02 (BVAL): one byte,
//! in the low byte of the u16; 0x03 (HVAL): the u16; 0x04 (SVAL): the u16 is a byte count and
//! that many bytes follow. (The value half-word is always present, so records stay 4-byte
//! aligned.) Attributes used here:
//!
//! - 0x2f `REGCOUNT` (`.nv.info`, SVAL): `u32 symbol index, u32 registers`.
//! - 0x17 `KPARAM_INFO` (`.nv.info.<kernel>`, SVAL, one per parameter, last first):
//!   `u32 index (0), u16 ordinal, u16 offset, u32 packed` where `packed` is
//!   bits 0–7 flags (pointee log-alignment), bits 8–11 space (5 for pointers on sm_100+),
//!   bits 12–16 constant bank (0x1f), bits 18–31 **size in bytes**. Example: a 352-byte struct
//!   at offset 16 is `0x0581f000` (352 << 18 | 0x1f000); a `u8` value is `0x0005f000`.
//! - 0x45 `KPARAM_INFO_V2` (used instead when a size or offset does not fit: 16 KiB or more):
//!   `u32 index, u32 (ordinal | offset << 16), u32 (size in bits 0–23 | flags << 24)`.
//! - 0x0a `PARAM_CBANK` (SVAL): `u32 symbol index of .nv.constant0.<kernel>, u32 (offset in the
//!   bank | total parameter bytes << 16)`; 0x19 `CBANK_PARAM_SIZE` (HVAL): total parameter bytes.
//! - 0x05 `MAX_THREADS` (SVAL, from `__launch_bounds__`): `u32 x, y, z`.
//! - 0x1b `MAXREG_COUNT` (HVAL): the register cap (0xff: none given).
//!
//! ## Static shared memory
//!
//! `.nv.shared.<kernel>` is a NOBITS section whose size is the kernel's static shared memory.
//! From sm_90 on, when a `.nv.shared.reserved.0` section is present, the size *includes* the
//! 1 KiB the driver reserves per block (`.nv.reservedSmem.cap` = 1024 on sm_100+; on sm_90 the
//! cap symbol is absent and the reserved part is still 1,024 bytes): `transpose_tiled_e4`
//! (32 × 33 × 4 = 4,224 bytes of tile) shows 5,248 for sm_90/sm_120 and 4,224 for sm_80.
//! [`KernelInfo::shared_bytes`] is the kernel's own part; [`KernelInfo::shared_reserved_bytes`]
//! the reserved part included in the section.

use std::collections::HashMap;

const EM_CUDA: u16 = 190;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_FUNC: u8 = 2;
const STB_LOCAL: u8 = 0;

const EIFMT_NVAL: u8 = 0x01;
const EIFMT_BVAL: u8 = 0x02;
const EIFMT_HVAL: u8 = 0x03;
const EIFMT_SVAL: u8 = 0x04;

const EIATTR_MAX_THREADS: u8 = 0x05;
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_MAXREG_COUNT: u8 = 0x1b;
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

/// The block-reserved shared memory included in `.nv.shared.<kernel>` from sm_90 on, when the
/// cubin has no `.nv.reservedSmem.cap` symbol saying otherwise.
const DEFAULT_RESERVED_SMEM: u32 = 1024;

/// What the emulated driver needs from a cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinInfo {
    /// The SM the cubin was compiled for: 90 for sm_90, 120 for sm_120.
    pub arch: u32,
    /// `EI_ABIVERSION`: 7 (the older `e_flags` layout) or 8 (CUDA 13's).
    pub abi_version: u8,
    /// The raw `e_flags`.
    pub e_flags: u32,
    /// Kernels (entry functions), in symbol-table order.
    pub kernels: Vec<KernelInfo>,
}

impl CubinInfo {
    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// One kernel's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// The symbol name (`extern "C"` names are unmangled).
    pub name: String,
    /// Registers per thread (`EIATTR_REGCOUNT`).
    pub regcount: Option<u32>,
    /// Parameters sorted by ordinal.
    pub params: Vec<ParamInfo>,
    /// Total bytes of the parameter buffer (`PARAM_CBANK`, `CBANK_PARAM_SIZE`, or the end of the
    /// last parameter).
    pub param_bytes: u32,
    /// The kernel's own static shared memory in bytes (the section size less the reserved part).
    pub shared_bytes: u32,
    /// The block-reserved shared memory included in the `.nv.shared.<kernel>` section (1,024 on
    /// sm_90+ for a kernel with static shared memory, else 0).
    pub shared_reserved_bytes: u32,
    /// `__launch_bounds__` maximum threads per block as `[x, y, z]` (`EIATTR_MAX_THREADS`).
    pub max_threads: Option<[u32; 3]>,
    /// The register cap (`EIATTR_MAXREG_COUNT`), when one was given (not 0xff).
    pub max_reg_count: Option<u32>,
    /// Size of the kernel's code (`.text.<name>`) in bytes.
    pub code_bytes: u64,
}

impl KernelInfo {
    /// Threads per block `__launch_bounds__` allows (x·y·z), if given.
    pub fn max_threads_per_block(&self) -> Option<u32> {
        self.max_threads.map(|[x, y, z]| x.saturating_mul(y).saturating_mul(z))
    }
}

/// One kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// Position in the parameter list, from 0.
    pub ordinal: u32,
    /// Byte offset in the parameter buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// The record's remaining bits (alignment, space, bank), for diagnostics.
    pub flags: u32,
}

/// The number of bytes of the ELF image starting at `ptr`: the end of the section-header or
/// program-header table, whichever is last (NVRTC puts them at the end of the file). `None`
/// when `ptr` does not start with a 64-bit little-endian ELF header.
///
/// `cuModuleLoadData` receives only a pointer; this tells the driver how much to read.
///
/// # Safety
///
/// `ptr` must be null or point to at least 64 readable bytes (the size of an ELF64 header).
pub unsafe fn image_len(ptr: *const u8) -> Option<usize> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees 64 readable bytes at `ptr`; `read_unaligned` copes with any
    // alignment.
    let header: [u8; 64] = unsafe { std::ptr::read_unaligned(ptr.cast::<[u8; 64]>()) };
    header_image_len(&header)
}

fn header_image_len(h: &[u8]) -> Option<usize> {
    if h.len() < 64 || &h[0..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(h[0x20..0x28].try_into().ok()?);
    let shoff = u64::from_le_bytes(h[0x28..0x30].try_into().ok()?);
    let ehsize = u16::from_le_bytes([h[0x34], h[0x35]]) as u64;
    let phentsize = u16::from_le_bytes([h[0x36], h[0x37]]) as u64;
    let phnum = u16::from_le_bytes([h[0x38], h[0x39]]) as u64;
    let shentsize = u16::from_le_bytes([h[0x3a], h[0x3b]]) as u64;
    let shnum = u16::from_le_bytes([h[0x3c], h[0x3d]]) as u64;
    let sh_end = if shnum == 0 {
        0
    } else {
        shoff.checked_add(shnum.checked_mul(shentsize)?)?
    };
    let ph_end = if phnum == 0 {
        0
    } else {
        phoff.checked_add(phnum.checked_mul(phentsize)?)?
    };
    let end = sh_end.max(ph_end).max(ehsize).max(64);
    // A corrupt header must not make the driver read gigabytes.
    if end > (1u64 << 32) {
        return None;
    }
    usize::try_from(end).ok()
}

struct Section<'a> {
    name: &'a str,
    sh_type: u32,
    offset: u64,
    size: u64,
    link: u32,
}

struct Symbol<'a> {
    name: &'a str,
    info: u8,
    shndx: u16,
    value: u64,
}

fn rd_u16(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| format!("truncated cubin: u16 at {at}"))
}

fn rd_u32(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("truncated cubin: u32 at {at}"))
}

fn rd_u64(b: &[u8], at: usize) -> Result<u64, String> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
        .ok_or_else(|| format!("truncated cubin: u64 at {at}"))
}

fn cstr_at(b: &[u8], at: usize) -> Result<&str, String> {
    let tail = b.get(at..).ok_or_else(|| format!("string offset {at} out of range"))?;
    let end = tail.iter().position(|&c| c == 0).ok_or("unterminated string")?;
    std::str::from_utf8(&tail[..end]).map_err(|_| format!("non-UTF-8 name at {at}"))
}

fn slice<'a>(b: &'a [u8], off: u64, size: u64, what: &str) -> Result<&'a [u8], String> {
    let start = usize::try_from(off).map_err(|_| format!("{what}: offset too large"))?;
    let len = usize::try_from(size).map_err(|_| format!("{what}: size too large"))?;
    let end = start.checked_add(len).ok_or_else(|| format!("{what}: overflow"))?;
    b.get(start..end)
        .ok_or_else(|| format!("{what}: bytes {start}..{end} beyond the image ({})", b.len()))
}

/// The architecture from `e_flags`, per the layout `EI_ABIVERSION` selects (module docs).
fn arch_from_flags(abi_version: u8, flags: u32) -> Result<u32, String> {
    let sm = match abi_version {
        // OSABI 0x33 (CUDA), ABI version 7 and older: SM in bits 0-7.
        0..=7 => flags & 0xff,
        // OSABI 0x41, ABI version 8 (CUDA 13; NVRTC 12.9 for sm_100+): SM in bits 8-15.
        _ => (flags >> 8) & 0xff,
    };
    if sm == 0 {
        return Err(format!("e_flags {flags:#x} (ABI version {abi_version}) names no SM"));
    }
    Ok(sm)
}

/// One `.nv.info` record.
struct Attr<'a> {
    attr: u8,
    /// The header's u16 (BVAL/HVAL value; SVAL size).
    half: u16,
    /// SVAL bytes (empty otherwise).
    data: &'a [u8],
}

fn attrs<'a>(sec: &'a [u8], what: &str) -> Result<Vec<Attr<'a>>, String> {
    let mut out = Vec::new();
    let mut p = 0usize;
    while p + 4 <= sec.len() {
        let (fmt, attr) = (sec[p], sec[p + 1]);
        let half = u16::from_le_bytes([sec[p + 2], sec[p + 3]]);
        p += 4;
        let data = match fmt {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => &sec[p..p],
            EIFMT_SVAL => {
                let d = sec
                    .get(p..p + half as usize)
                    .ok_or_else(|| format!("{what}: attribute {attr:#x} runs past the section"))?;
                p += half as usize;
                d
            }
            other => return Err(format!("{what}: unknown attribute format {other:#x} at byte {}", p - 4)),
        };
        out.push(Attr { attr, half, data });
    }
    Ok(out)
}

fn words(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Parses a cubin (ELF64 little-endian, `EM_CUDA`).
pub fn parse(bytes: &[u8]) -> Result<CubinInfo, String> {
    let b = bytes;
    if b.len() < 64 || &b[0..4] != b"\x7fELF" {
        return Err("not an ELF image".into());
    }
    if b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF image".into());
    }
    let abi_version = b[8];
    let machine = rd_u16(b, 0x12)?;
    if machine != EM_CUDA {
        return Err(format!("ELF machine {machine}, not EM_CUDA (190)"));
    }
    match header_image_len(b) {
        Some(n) if n <= b.len() => {}
        Some(n) => {
            return Err(format!(
                "truncated cubin: the header describes {n} bytes, {} given",
                b.len()
            ));
        }
        None => return Err("corrupt ELF header (table extents)".into()),
    }
    let e_flags = rd_u32(b, 0x30)?;
    let arch = arch_from_flags(abi_version, e_flags)?;

    let shoff = rd_u64(b, 0x28)?;
    let shentsize = rd_u16(b, 0x3a)? as usize;
    let shnum = rd_u16(b, 0x3c)? as usize;
    let shstrndx = rd_u16(b, 0x3e)? as usize;
    if shnum == 0 {
        return Err("cubin has no sections".into());
    }
    if shentsize < 64 {
        return Err(format!("section header size {shentsize} < 64"));
    }
    let shoff = usize::try_from(shoff).map_err(|_| "section table offset too large")?;
    let mut raw = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let at = shoff + i * shentsize;
        raw.push((
            rd_u32(b, at)?,        // sh_name
            rd_u32(b, at + 4)?,    // sh_type
            rd_u64(b, at + 0x18)?, // sh_offset
            rd_u64(b, at + 0x20)?, // sh_size
            rd_u32(b, at + 0x28)?, // sh_link
        ));
    }
    let (_, _, stroff, strsize, _) = *raw.get(shstrndx).ok_or("e_shstrndx out of range")?;
    let shstr = slice(b, stroff, strsize, ".shstrtab")?;
    let mut secs = Vec::with_capacity(shnum);
    for &(name, sh_type, offset, size, link) in &raw {
        secs.push(Section {
            name: cstr_at(shstr, name as usize)?,
            sh_type,
            offset,
            size,
            link,
        });
    }

    // Symbols.
    let mut syms = Vec::new();
    if let Some(st) = secs.iter().find(|s| s.sh_type == SHT_SYMTAB) {
        let data = slice(b, st.offset, st.size, ".symtab")?;
        let strsec = secs.get(st.link as usize).ok_or("symtab sh_link out of range")?;
        let strtab = slice(b, strsec.offset, strsec.size, ".strtab")?;
        for e in data.chunks_exact(24) {
            syms.push(Symbol {
                name: cstr_at(strtab, rd_u32(e, 0)? as usize)?,
                info: e[4],
                shndx: rd_u16(e, 6)?,
                value: rd_u64(e, 8)?,
            });
        }
    }

    // Module-wide attributes: register counts by symbol index.
    let mut regcount: HashMap<u32, u32> = HashMap::new();
    if let Some(s) = secs.iter().find(|s| s.name == ".nv.info") {
        for a in attrs(slice(b, s.offset, s.size, ".nv.info")?, ".nv.info")? {
            if a.attr == EIATTR_REGCOUNT {
                if let [sym, count, ..] = words(a.data)[..] {
                    regcount.insert(sym, count);
                }
            }
        }
    }

    // Reserved shared memory (sm_90+): present when the cubin has `.nv.shared.reserved.*`.
    let has_reserved = secs.iter().any(|s| s.name.starts_with(".nv.shared.reserved."))
        || syms.iter().any(|s| s.name == ".nv.reservedSmem.offset0");
    let reserved_cap = syms
        .iter()
        .find(|s| s.name == ".nv.reservedSmem.cap")
        .map(|s| s.value as u32)
        .unwrap_or(DEFAULT_RESERVED_SMEM);

    let mut kernels = Vec::new();
    for (idx, sym) in syms.iter().enumerate() {
        let (bind, ty) = (sym.info >> 4, sym.info & 0xf);
        if ty != STT_FUNC || bind == STB_LOCAL || sym.name.is_empty() {
            continue;
        }
        let Some(text) = secs.get(sym.shndx as usize) else {
            continue;
        };
        if text.name.strip_prefix(".text.") != Some(sym.name) {
            continue;
        }
        let name = sym.name;
        let mut k = KernelInfo {
            name: name.to_owned(),
            regcount: regcount.get(&(idx as u32)).copied(),
            params: Vec::new(),
            param_bytes: 0,
            shared_bytes: 0,
            shared_reserved_bytes: 0,
            max_threads: None,
            max_reg_count: None,
            code_bytes: text.size,
        };
        let mut cbank_bytes = None;
        let info_name = format!(".nv.info.{name}");
        if let Some(s) = secs.iter().find(|s| s.name == info_name) {
            for a in attrs(slice(b, s.offset, s.size, &info_name)?, &info_name)? {
                let w = words(a.data);
                match (a.attr, &w[..]) {
                    (EIATTR_KPARAM_INFO, [_index, ord_off, packed, ..]) => k.params.push(ParamInfo {
                        ordinal: ord_off & 0xffff,
                        offset: ord_off >> 16,
                        size: packed >> 18,
                        flags: packed & 0x3_ffff,
                    }),
                    (EIATTR_KPARAM_INFO_V2, [_index, ord_off, size_flags, ..]) => k.params.push(ParamInfo {
                        ordinal: ord_off & 0xffff,
                        offset: ord_off >> 16,
                        size: size_flags & 0x00ff_ffff,
                        flags: size_flags >> 24,
                    }),
                    (EIATTR_PARAM_CBANK, [_sym, off_size, ..]) => cbank_bytes = Some(off_size >> 16),
                    (EIATTR_CBANK_PARAM_SIZE, _) => {
                        cbank_bytes.get_or_insert(a.half as u32);
                    }
                    (EIATTR_MAX_THREADS, [x, y, z, ..]) => k.max_threads = Some([*x, *y, *z]),
                    (EIATTR_MAXREG_COUNT, _) if a.half != 0xff => k.max_reg_count = Some(a.half as u32),
                    _ => {}
                }
            }
        }
        k.params.sort_by_key(|p| p.ordinal);
        let end = k.params.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
        k.param_bytes = cbank_bytes.unwrap_or(end).max(end);
        let shared_name = format!(".nv.shared.{name}");
        if let Some(s) = secs.iter().find(|s| s.name == shared_name && s.sh_type == SHT_NOBITS) {
            let size = u32::try_from(s.size).map_err(|_| format!("{shared_name}: size too large"))?;
            let reserved = if has_reserved { reserved_cap.min(size) } else { 0 };
            k.shared_reserved_bytes = reserved;
            k.shared_bytes = size - reserved;
        }
        kernels.push(k);
    }
    Ok(CubinInfo {
        arch,
        abi_version,
        e_flags,
        kernels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_layouts() {
        // Values read from NVRTC 12.9 / 13.x cubins (module docs).
        assert_eq!(arch_from_flags(7, 0x005a_055a), Ok(90));
        assert_eq!(arch_from_flags(7, 0x0050_0550), Ok(80));
        assert_eq!(arch_from_flags(7, 0x005a_0d5a), Ok(90)); // sm_90a
        assert_eq!(arch_from_flags(8, 0x0600_5a04), Ok(90));
        assert_eq!(arch_from_flags(8, 0x0600_6402), Ok(100));
        assert_eq!(arch_from_flags(8, 0x0600_7802), Ok(120));
        assert!(arch_from_flags(8, 0x0600_0004).is_err());
    }

    #[test]
    fn rejects_non_cubins() {
        assert!(parse(b"").is_err());
        assert!(parse(&[0u8; 128]).is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x12] = 62; // EM_X86_64
        assert!(parse(&elf).unwrap_err().contains("EM_CUDA"));
        assert_eq!(header_image_len(&elf), Some(64));
        // SAFETY: a null pointer is rejected before any read.
        assert_eq!(unsafe { image_len(std::ptr::null()) }, None);
    }

    #[test]
    fn attribute_records() {
        // NVAL, BVAL, HVAL, SVAL(8) back to back.
        let sec = [
            0x01, 0x35, 0, 0, //
            0x02, 0x4c, 1, 0, //
            0x03, 0x1b, 0x80, 0, //
            0x04, 0x2f, 8, 0, 7, 0, 0, 0, 34, 0, 0, 0,
        ];
        let a = attrs(&sec, "t").unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!((a[1].attr, a[1].half), (0x4c, 1));
        assert_eq!((a[2].attr, a[2].half), (0x1b, 0x80));
        assert_eq!(words(a[3].data), vec![7, 34]);
        assert!(attrs(&[0x04, 0x2f, 9, 0, 1], "t").is_err());
        assert!(attrs(&[0x07, 0x2f, 0, 0], "t").is_err());
    }
}
