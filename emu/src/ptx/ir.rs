//! The decoded form of a kernel: every operand is a register index (immediates,
//! symbol addresses and special registers are read-only registers filled when a
//! warp starts), ALU instructions carry a monomorphised lane loop, labels are
//! resolved to instruction indices.

/// Registers of one warp: `regs[r][lane]`, register-major so that an
/// instruction's lane loop walks contiguous memory.
pub type Regs = [[u64; 32]];

/// A lane loop: `(registers, lanes to execute, [dst, a, b, c])`.
pub type AluFn = fn(&mut Regs, u32, &[u32; 4]);

/// Register 0 always holds 0 (the unused operand slots point at it).
pub const ZERO_REG: u32 = 0;

/// Where the generic address of shared memory starts (`cvta.shared` adds it,
/// `cvta.to.shared` subtracts it). Above the 48-bit canonical user range, so it
/// never collides with a device address or a host pointer.
pub const SHARED_WINDOW: u64 = 0x0001_0000_0000_0000;

/// Special registers (PTX ISA §10 "Special Registers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
}

/// How a read-only register is filled when a warp starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    Const(u64),
    Special(Special),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Global,
    /// `ld.global.nc`: the launch must not write these bytes.
    GlobalNc,
    Shared,
    Param,
    /// No state space: shared if in [`SHARED_WINDOW`], global otherwise.
    Generic,
}

/// A load or store: `n` elements of `w` bytes at `regs[base] + off`.
#[derive(Debug, Clone, Copy)]
pub struct Mem {
    pub space: Space,
    /// Bytes per element (1, 2, 4, 8).
    pub w: u8,
    /// Elements (1, 2, 4).
    pub n: u8,
    /// Loads: sign-extend the element (`.s8`/`.s16`/`.s32` types).
    pub signed: bool,
    /// Loads: bits of the destination registers (the value is truncated to them).
    pub dbits: u8,
    /// Destination (loads) or source (stores) registers.
    pub regs: [u32; 4],
    pub base: u32,
    pub off: i64,
}

#[derive(Clone, Copy)]
pub enum Op {
    Alu {
        f: AluFn,
        o: [u32; 4],
    },
    Ld(Mem),
    St(Mem),
    /// `bra` to an instruction index.
    Bra(u32),
    /// `bar.sync 0` / `barrier.sync 0`.
    Bar,
    /// `ret` / `exit`.
    Exit,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Alu { o, .. } => write!(f, "Alu {o:?}"),
            Op::Ld(m) => write!(f, "Ld {m:?}"),
            Op::St(m) => write!(f, "St {m:?}"),
            Op::Bra(t) => write!(f, "Bra {t}"),
            Op::Bar => f.write_str("Bar"),
            Op::Exit => f.write_str("Exit"),
        }
    }
}

/// No guard predicate.
pub const NO_GUARD: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
pub struct Inst {
    pub op: Op,
    /// Guard predicate register or [`NO_GUARD`].
    pub guard: u32,
    /// `@!%p`.
    pub gneg: bool,
    /// Index into [`Body::lines`].
    pub src: u32,
}

/// A kernel's decoded body.
#[derive(Debug, Clone, Default)]
pub struct Body {
    pub code: Vec<Inst>,
    pub nregs: usize,
    /// Read-only registers and how each is filled.
    pub init: Vec<(u32, Init)>,
    /// (line number, source text) of each instruction, for messages.
    pub lines: Vec<(usize, String)>,
}

// ---- lane loops -------------------------------------------------------------

/// Runs `f(a, b, c)` for the lanes in `m` and writes `dst`. Each source is
/// copied first, so a destination may alias a source.
#[inline(always)]
pub fn lanes3(r: &mut Regs, m: u32, o: &[u32; 4], f: impl Fn(u64, u64, u64) -> u64) {
    let a = r[o[1] as usize];
    let b = r[o[2] as usize];
    let c = r[o[3] as usize];
    let d = &mut r[o[0] as usize];
    if m == u32::MAX {
        for l in 0..32 {
            d[l] = f(a[l], b[l], c[l]);
        }
    } else {
        for l in 0..32 {
            if (m >> l) & 1 != 0 {
                d[l] = f(a[l], b[l], c[l]);
            }
        }
    }
}

// ---- integer helpers (const generic width W in bits, signedness S) -----------

#[inline(always)]
pub fn trunc<const W: u32>(x: u64) -> u64 {
    if W >= 64 { x } else { x & ((1u64 << W) - 1) }
}

#[inline(always)]
pub fn sext<const W: u32>(x: u64) -> i64 {
    if W >= 64 {
        x as i64
    } else {
        ((x << (64 - W)) as i64) >> (64 - W)
    }
}

/// The value of a `W`-bit operand as i128 (signed or unsigned per `S`).
#[inline(always)]
pub fn val<const W: u32, const S: bool>(x: u64) -> i128 {
    if S { sext::<W>(x) as i128 } else { trunc::<W>(x) as i128 }
}

/// Comparison operators of `setp` (PTX ISA §9.7.7.1 "Comparison" tables).
pub mod cmp {
    pub const EQ: u8 = 0;
    pub const NE: u8 = 1;
    pub const LT: u8 = 2;
    pub const LE: u8 = 3;
    pub const GT: u8 = 4;
    pub const GE: u8 = 5;
    // float only: unordered variants and num/nan
    pub const EQU: u8 = 6;
    pub const NEU: u8 = 7;
    pub const LTU: u8 = 8;
    pub const LEU: u8 = 9;
    pub const GTU: u8 = 10;
    pub const GEU: u8 = 11;
    pub const NUM: u8 = 12;
    pub const NAN: u8 = 13;

    /// Integer comparisons; `lo ls hi hs` are the unsigned spellings of `lt le gt ge`.
    pub fn parse_int(s: &str) -> Option<u8> {
        Some(match s {
            "eq" => EQ,
            "ne" => NE,
            "lt" | "lo" => LT,
            "le" | "ls" => LE,
            "gt" | "hi" => GT,
            "ge" | "hs" => GE,
            _ => return None,
        })
    }

    pub fn parse_float(s: &str) -> Option<u8> {
        Some(match s {
            "eq" => EQ,
            "ne" => NE,
            "lt" => LT,
            "le" => LE,
            "gt" => GT,
            "ge" => GE,
            "equ" => EQU,
            "neu" => NEU,
            "ltu" => LTU,
            "leu" => LEU,
            "gtu" => GTU,
            "geu" => GEU,
            "num" => NUM,
            "nan" => NAN,
            _ => return None,
        })
    }
}
