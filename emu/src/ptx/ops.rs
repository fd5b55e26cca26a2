//! Per-lane semantics of the ALU instructions, as monomorphised lane loops
//! ([`AluFn`]). Each function cites the PTX ISA section it implements; the
//! section numbers are those of PTX ISA 8.x/9.x ("Instruction Set" chapter).
//!
//! Values live in 64-bit registers; an instruction of a `W`-bit type reads the
//! low `W` bits of its operands (sign- or zero-extended per the type) and writes
//! its result zero-extended to 64 bits.

use super::float::{self, BF16, F16, F32, Rnd, from_bits, ftz32, to_bits};
use super::ir::{AluFn, SHARED_WINDOW, cmp, lanes3, sext, trunc, val};

macro_rules! mk {
    ($f:expr) => {{
        let g: AluFn = |r, m, o| lanes3(r, m, o, $f);
        g
    }};
}

macro_rules! by_w {
    ($w:expr, $f:ident) => {
        match $w {
            8 => mk!($f::<8>),
            16 => mk!($f::<16>),
            32 => mk!($f::<32>),
            64 => mk!($f::<64>),
            _ => return None,
        }
    };
}

macro_rules! by_ws {
    ($w:expr, $s:expr, $f:ident $(, $extra:expr)*) => {
        match ($w, $s) {
            (8, false) => mk!($f::<8, false $(, { $extra })*>),
            (8, true) => mk!($f::<8, true $(, { $extra })*>),
            (16, false) => mk!($f::<16, false $(, { $extra })*>),
            (16, true) => mk!($f::<16, true $(, { $extra })*>),
            (32, false) => mk!($f::<32, false $(, { $extra })*>),
            (32, true) => mk!($f::<32, true $(, { $extra })*>),
            (64, false) => mk!($f::<64, false $(, { $extra })*>),
            (64, true) => mk!($f::<64, true $(, { $extra })*>),
            _ => return None,
        }
    };
}

/// Integer operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOp {
    Add,
    Sub,
    MulLo,
    MulHi,
    MulWide,
    MadLo,
    MadHi,
    MadWide,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Not,
    Neg,
    Abs,
    Shl,
    Shr,
    Popc,
    Clz,
    Brev,
    Prmt,
    Mov,
    Selp,
}

// §9.7.1.1 add: d = a + b (wrapping, no .sat).
fn add<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a.wrapping_add(b))
}
// §9.7.1.2 sub: d = a - b.
fn sub<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a.wrapping_sub(b))
}
// §9.7.1.3 mul.lo: the low W bits of the 2W-bit product.
fn mul_lo<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a.wrapping_mul(b))
}
fn hi<const W: u32, const S: bool>(p: i128) -> u64 {
    trunc::<W>(if S { (p >> W) as u64 } else { ((p as u128) >> W) as u64 })
}
fn wide<const W: u32>(p: i128) -> u64 {
    let x = p as u64;
    if W >= 32 { x } else { x & ((1u64 << (2 * W)) - 1) }
}
fn ext2<const W: u32, const S: bool>(c: u64) -> i128 {
    // A 2W-bit operand (mad.wide's c).
    if W >= 32 {
        if S { c as i64 as i128 } else { c as i128 }
    } else {
        val::<32, S>(c)
    }
}
// §9.7.1.3 mul.hi: the high W bits of the 2W-bit product.
fn mul_hi<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    hi::<W, S>(val::<W, S>(a).wrapping_mul(val::<W, S>(b)))
}
// §9.7.1.3 mul.wide: the full 2W-bit product (W = 16 or 32).
fn mul_wide<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    wide::<W>(val::<W, S>(a).wrapping_mul(val::<W, S>(b)))
}
// §9.7.1.4 mad.lo: d = (a * b)[W-1:0] + c.
fn mad_lo<const W: u32>(a: u64, b: u64, c: u64) -> u64 {
    trunc::<W>(a.wrapping_mul(b).wrapping_add(c))
}
// §9.7.1.4 mad.hi: d = (a * b)[2W-1:W] + c.
fn mad_hi<const W: u32, const S: bool>(a: u64, b: u64, c: u64) -> u64 {
    trunc::<W>(mul_hi::<W, S>(a, b, 0).wrapping_add(c))
}
// §9.7.1.4 mad.wide: d = a * b + c, with c and d 2W bits wide.
fn mad_wide<const W: u32, const S: bool>(a: u64, b: u64, c: u64) -> u64 {
    wide::<W>(
        val::<W, S>(a)
            .wrapping_mul(val::<W, S>(b))
            .wrapping_add(ext2::<W, S>(c)),
    )
}
// §9.7.1.8 div: "Division by zero yields an unspecified, machine-specific value."
// The emulator's choice: all bits set (u: the maximum, s: -1), as NVIDIA GPUs return
// for unsigned division; signed MIN / -1 wraps to MIN.
fn div<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (val::<W, S>(a), val::<W, S>(b));
    if y == 0 {
        trunc::<W>(u64::MAX)
    } else {
        trunc::<W>((x / y) as u64)
    }
}
// §9.7.1.9 rem: d = a % b (sign of the dividend). By zero: unspecified; the emulator
// returns the dividend.
fn rem<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (val::<W, S>(a), val::<W, S>(b));
    if y == 0 {
        trunc::<W>(a)
    } else {
        trunc::<W>((x % y) as u64)
    }
}
// §9.7.1.12 min / §9.7.1.13 max.
fn min<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(if val::<W, S>(a) <= val::<W, S>(b) { a } else { b })
}
fn max<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(if val::<W, S>(a) >= val::<W, S>(b) { a } else { b })
}
// §9.7.8.1 and, §9.7.8.2 or, §9.7.8.3 xor, §9.7.8.4 not (bitwise; .pred values are 0/1).
fn and<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a & b)
}
fn or<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a | b)
}
fn xor<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    trunc::<W>(a ^ b)
}
fn not<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(!a)
}
fn not_pred(a: u64, _: u64, _: u64) -> u64 {
    (a == 0) as u64
}
// §9.7.1.11 neg: d = -a; §9.7.1.10 abs: d = |a| (abs of MIN is MIN).
fn neg<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(0u64.wrapping_sub(a))
}
fn abs<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(sext::<W>(a).wrapping_abs() as u64)
}
// §9.7.8.6 shl: the shift amount b is unsigned 32-bit; amounts >= W give 0.
fn shl<const W: u32>(a: u64, b: u64, _: u64) -> u64 {
    let n = b as u32;
    if n >= W { 0 } else { trunc::<W>(a << n) }
}
// §9.7.8.7 shr: .s shifts in sign bits, .u/.b zeros; amounts >= W clamp to W.
fn shr<const W: u32, const S: bool>(a: u64, b: u64, _: u64) -> u64 {
    let n = b as u32;
    if S {
        trunc::<W>((sext::<W>(a) >> n.min(W - 1)) as u64)
    } else if n >= W {
        0
    } else {
        trunc::<W>(a) >> n
    }
}
// §9.7.1.15 popc, §9.7.1.16 clz, §9.7.1.19 brev.
fn popc<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a).count_ones() as u64
}
fn clz<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    (trunc::<W>(a).leading_zeros() - (64 - W)) as u64
}
fn brev<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a).reverse_bits() >> (64 - W)
}
// §9.7.9.7 prmt, the generic form: the bytes of {b, a} are numbered 0..7
// (a's low byte 0, b's high byte 7); byte i of d is the byte that nibble i of
// c selects with its three low bits, or, where the nibble's msb is set, that
// byte's sign bit replicated over all eight bits.
fn prmt(a: u64, b: u64, c: u64) -> u64 {
    let src = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
    (0..4).fold(0, |d, i| {
        let sel = (c >> (4 * i)) & 0xf;
        let byte = (src >> (8 * (sel & 7))) & 0xff;
        let byte = if sel & 8 == 0 {
            byte
        } else if byte & 0x80 != 0 {
            0xff
        } else {
            0
        };
        d | (byte << (8 * i))
    })
}
// §9.7.9.3 mov: d = a.
fn mov<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a)
}
fn mov_pred(a: u64, _: u64, _: u64) -> u64 {
    (a & 1 != 0) as u64
}
// §9.7.7.2 selp: d = c ? a : b.
fn selp<const W: u32>(a: u64, b: u64, c: u64) -> u64 {
    trunc::<W>(if c != 0 { a } else { b })
}
// §9.7.7.1 setp (integer): p = a CMP b.
fn setp_i<const W: u32, const S: bool, const C: u8>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (val::<W, S>(a), val::<W, S>(b));
    (match C {
        cmp::EQ => x == y,
        cmp::NE => x != y,
        cmp::LT => x < y,
        cmp::LE => x <= y,
        cmp::GT => x > y,
        _ => x >= y,
    }) as u64
}
// §9.7.9.21 cvt between integer types: the source's W bits, extended per its
// signedness, truncated to the destination (no .sat).
fn cvt_ii<const DW: u32, const SW: u32, const SS: bool>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<DW>(val::<SW, SS>(a) as u64)
}
// §9.7.9.3 mov with a vector operand: packing and unpacking.
fn pack16(a: u64, b: u64, _: u64) -> u64 {
    (a & 0xffff) | ((b & 0xffff) << 16)
}
fn pack32(a: u64, b: u64, _: u64) -> u64 {
    (a & 0xffff_ffff) | (b << 32)
}
fn field<const SH: u32, const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a >> SH)
}
// §9.7.9.19 cvta: generic <-> shared window; global addresses are identical.
fn to_shared<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a.wrapping_sub(SHARED_WINDOW))
}
fn from_shared<const W: u32>(a: u64, _: u64, _: u64) -> u64 {
    trunc::<W>(a.wrapping_add(SHARED_WINDOW))
}

pub fn int_op(op: IntOp, w: u32, s: bool) -> Option<AluFn> {
    use IntOp::*;
    Some(match op {
        Add => by_w!(w, add),
        Sub => by_w!(w, sub),
        MulLo => by_w!(w, mul_lo),
        MulHi => by_ws!(w, s, mul_hi),
        MulWide if w <= 32 => by_ws!(w, s, mul_wide),
        MadLo => by_w!(w, mad_lo),
        MadHi => by_ws!(w, s, mad_hi),
        MadWide if w <= 32 => by_ws!(w, s, mad_wide),
        Div => by_ws!(w, s, div),
        Rem => by_ws!(w, s, rem),
        Min => by_ws!(w, s, min),
        Max => by_ws!(w, s, max),
        And => by_w!(w, and),
        Or => by_w!(w, or),
        Xor => by_w!(w, xor),
        Not => by_w!(w, not),
        Neg => by_w!(w, neg),
        Abs => by_w!(w, abs),
        Shl => by_w!(w, shl),
        Shr => by_ws!(w, s, shr),
        Popc => by_w!(w, popc),
        Clz => by_w!(w, clz),
        Brev => by_w!(w, brev),
        Prmt if w == 32 => mk!(prmt),
        Mov => by_w!(w, mov),
        Selp => by_w!(w, selp),
        MulWide | MadWide | Prmt => return None,
    })
}

pub fn not_pred_fn() -> AluFn {
    mk!(not_pred)
}
pub fn mov_pred_fn() -> AluFn {
    mk!(mov_pred)
}
pub fn setp_int(w: u32, s: bool, c: u8) -> Option<AluFn> {
    Some(match c {
        cmp::EQ => by_ws!(w, s, setp_i, cmp::EQ),
        cmp::NE => by_ws!(w, s, setp_i, cmp::NE),
        cmp::LT => by_ws!(w, s, setp_i, cmp::LT),
        cmp::LE => by_ws!(w, s, setp_i, cmp::LE),
        cmp::GT => by_ws!(w, s, setp_i, cmp::GT),
        cmp::GE => by_ws!(w, s, setp_i, cmp::GE),
        _ => return None,
    })
}

macro_rules! by_src {
    ($dw:literal, $sw:expr, $ss:expr) => {
        match ($sw, $ss) {
            (8, false) => mk!(cvt_ii::<$dw, 8, false>),
            (8, true) => mk!(cvt_ii::<$dw, 8, true>),
            (16, false) => mk!(cvt_ii::<$dw, 16, false>),
            (16, true) => mk!(cvt_ii::<$dw, 16, true>),
            (32, false) => mk!(cvt_ii::<$dw, 32, false>),
            (32, true) => mk!(cvt_ii::<$dw, 32, true>),
            (64, false) => mk!(cvt_ii::<$dw, 64, false>),
            (64, true) => mk!(cvt_ii::<$dw, 64, true>),
            _ => return None,
        }
    };
}

pub fn cvt_int(dw: u32, sw: u32, ss: bool) -> Option<AluFn> {
    Some(match dw {
        8 => by_src!(8, sw, ss),
        16 => by_src!(16, sw, ss),
        32 => by_src!(32, sw, ss),
        64 => by_src!(64, sw, ss),
        _ => return None,
    })
}

pub fn pack_fn(elem_bits: u32) -> Option<AluFn> {
    Some(match elem_bits {
        16 => mk!(pack16),
        32 => mk!(pack32),
        _ => return None,
    })
}

/// Element `i` of a register split into `elem_bits` pieces.
pub fn unpack_fn(elem_bits: u32, i: u32) -> Option<AluFn> {
    Some(match (elem_bits, i) {
        (16, 0) => mk!(field::<0, 16>),
        (16, 1) => mk!(field::<16, 16>),
        (16, 2) => mk!(field::<32, 16>),
        (16, 3) => mk!(field::<48, 16>),
        (32, 0) => mk!(field::<0, 32>),
        (32, 1) => mk!(field::<32, 32>),
        (8, 0) => mk!(field::<0, 8>),
        (8, 1) => mk!(field::<8, 8>),
        (8, 2) => mk!(field::<16, 8>),
        (8, 3) => mk!(field::<24, 8>),
        _ => return None,
    })
}

pub fn cvta_fn(to: bool, shared: bool, w: u32) -> Option<AluFn> {
    Some(match (to, shared, w) {
        (_, false, 64) => mk!(mov::<64>),
        (_, false, 32) => mk!(mov::<32>),
        (true, true, 64) => mk!(to_shared::<64>),
        (true, true, 32) => mk!(to_shared::<32>),
        (false, true, 64) => mk!(from_shared::<64>),
        (false, true, 32) => mk!(from_shared::<32>),
        _ => return None,
    })
}

// ---- floating point -----------------------------------------------------------

/// Float kinds as const generic parameters.
pub mod fk {
    pub const F32: u8 = 0;
    pub const F64: u8 = 1;
    pub const F16: u8 = 2;
    pub const BF16: u8 = 3;
    /// f32 with `.ftz`.
    pub const F32Z: u8 = 4;
}

#[inline(always)]
fn f(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
/// f32 results: NaN is the canonical NaN 0x7fffffff (§9.7.3 "Floating-Point
/// Instructions": "NaN results are canonical").
#[inline(always)]
fn fb(x: f32) -> u64 {
    if x.is_nan() { 0x7fff_ffff } else { x.to_bits() as u64 }
}
#[inline(always)]
fn z<const Z: bool>(x: f32) -> f32 {
    if Z { ftz32(x) } else { x }
}
#[inline(always)]
fn d(x: u64) -> f64 {
    f64::from_bits(x)
}
#[inline(always)]
fn db(x: f64) -> u64 {
    x.to_bits()
}
/// Any float kind's value, exactly, as f64.
#[inline(always)]
fn fv<const K: u8>(x: u64) -> f64 {
    match K {
        fk::F32 => f(x) as f64,
        fk::F32Z => ftz32(f(x)) as f64,
        fk::F64 => d(x),
        fk::F16 => from_bits(x & 0xffff, F16),
        _ => float::bf16_to_f32(x) as f64,
    }
}
fn rnd<const R: u8>() -> Rnd {
    match R {
        0 => Rnd::N,
        1 => Rnd::Z,
        2 => Rnd::M,
        _ => Rnd::P,
    }
}
/// Rounds an exact f64 value to kind `K` with mode `R`.
#[inline(always)]
fn to_kind<const K: u8, const R: u8>(x: f64) -> u64 {
    match K {
        fk::F32 => to_bits(x, F32, rnd::<R>()),
        fk::F32Z => fb(ftz32(f32::from_bits(to_bits(x, F32, rnd::<R>()) as u32))),
        fk::F64 => db(x),
        fk::F16 => to_bits(x, F16, rnd::<R>()),
        _ => to_bits(x, BF16, rnd::<R>()),
    }
}

// §9.7.3.1 add, §9.7.3.2 sub, §9.7.3.3 mul, §9.7.3.4 fma (.rn: IEEE round to
// nearest even; fma rounds once), §9.7.3.8 div.rn (IEEE), §9.7.3.9 abs,
// §9.7.3.10 neg, §9.7.3.11 min, §9.7.3.12 max (a NaN operand yields the other),
// §9.7.3.13 rcp.rn, §9.7.3.14 sqrt.rn. `.ftz` flushes subnormal inputs and results.
fn fadd<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)) + z::<Z>(f(b))))
}
fn fsub<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)) - z::<Z>(f(b))))
}
fn fmul<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)) * z::<Z>(f(b))))
}
fn ffma<const Z: bool>(a: u64, b: u64, c: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)).mul_add(z::<Z>(f(b)), z::<Z>(f(c)))))
}
fn fdiv<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)) / z::<Z>(f(b))))
}
fn fabs<const Z: bool>(a: u64, _: u64, _: u64) -> u64 {
    fb(z::<Z>(f(a)).abs())
}
fn fneg<const Z: bool>(a: u64, _: u64, _: u64) -> u64 {
    fb(-z::<Z>(f(a)))
}
fn fmin<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(f(a)).min(z::<Z>(f(b))))
}
fn fmax<const Z: bool>(a: u64, b: u64, _: u64) -> u64 {
    fb(z::<Z>(f(a)).max(z::<Z>(f(b))))
}
fn fsqrt<const Z: bool>(a: u64, _: u64, _: u64) -> u64 {
    fb(z::<Z>(z::<Z>(f(a)).sqrt()))
}
fn frcp<const Z: bool>(a: u64, _: u64, _: u64) -> u64 {
    fb(z::<Z>(1.0 / z::<Z>(f(a))))
}
fn dadd(a: u64, b: u64, _: u64) -> u64 {
    db(d(a) + d(b))
}
fn dsub(a: u64, b: u64, _: u64) -> u64 {
    db(d(a) - d(b))
}
fn dmul(a: u64, b: u64, _: u64) -> u64 {
    db(d(a) * d(b))
}
fn dfma(a: u64, b: u64, c: u64) -> u64 {
    db(d(a).mul_add(d(b), d(c)))
}
fn ddiv(a: u64, b: u64, _: u64) -> u64 {
    db(d(a) / d(b))
}
fn dabs(a: u64, _: u64, _: u64) -> u64 {
    a & !(1u64 << 63)
}
fn dneg(a: u64, _: u64, _: u64) -> u64 {
    a ^ (1u64 << 63)
}
fn dmin(a: u64, b: u64, _: u64) -> u64 {
    db(d(a).min(d(b)))
}
fn dmax(a: u64, b: u64, _: u64) -> u64 {
    db(d(a).max(d(b)))
}
fn dsqrt(a: u64, _: u64, _: u64) -> u64 {
    db(d(a).sqrt())
}
fn drcp(a: u64, _: u64, _: u64) -> u64 {
    db(1.0 / d(a))
}
// §9.7.4 half precision add/sub/mul/fma (.rn), §9.7.4.5 neg, §9.7.4.6 abs,
// min/max. Computed in f64 and rounded once to the 16-bit format: add, sub and
// mul are exact in f64, so the result is correctly rounded; fma can round twice
// only when the addend and the product differ by more than 2^29 in magnitude.
fn hadd<const K: u8>(a: u64, b: u64, _: u64) -> u64 {
    to_kind::<K, 0>(fv::<K>(a) + fv::<K>(b))
}
fn hsub<const K: u8>(a: u64, b: u64, _: u64) -> u64 {
    to_kind::<K, 0>(fv::<K>(a) - fv::<K>(b))
}
fn hmul<const K: u8>(a: u64, b: u64, _: u64) -> u64 {
    to_kind::<K, 0>(fv::<K>(a) * fv::<K>(b))
}
fn hfma<const K: u8>(a: u64, b: u64, c: u64) -> u64 {
    to_kind::<K, 0>(fv::<K>(a).mul_add(fv::<K>(b), fv::<K>(c)))
}
fn hneg(a: u64, _: u64, _: u64) -> u64 {
    (a ^ 0x8000) & 0xffff
}
fn habs(a: u64, _: u64, _: u64) -> u64 {
    a & 0x7fff
}
fn hmin<const K: u8>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (fv::<K>(a), fv::<K>(b));
    if y.is_nan() || x <= y {
        if x.is_nan() { b & 0xffff } else { a & 0xffff }
    } else {
        b & 0xffff
    }
}
fn hmax<const K: u8>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (fv::<K>(a), fv::<K>(b));
    if y.is_nan() || x >= y {
        if x.is_nan() { b & 0xffff } else { a & 0xffff }
    } else {
        b & 0xffff
    }
}
// §9.7.3.5 / §9.7.7.1 setp (float): ordered comparisons are false when either
// operand is NaN, the `u` variants true; num: neither NaN; nan: either NaN.
fn setp_f<const K: u8, const C: u8>(a: u64, b: u64, _: u64) -> u64 {
    let (x, y) = (fv::<K>(a), fv::<K>(b));
    let u = x.is_nan() || y.is_nan();
    (match C {
        cmp::EQ => !u && x == y,
        cmp::NE => !u && x != y,
        cmp::LT => !u && x < y,
        cmp::LE => !u && x <= y,
        cmp::GT => !u && x > y,
        cmp::GE => !u && x >= y,
        cmp::EQU => u || x == y,
        cmp::NEU => u || x != y,
        cmp::LTU => u || x < y,
        cmp::LEU => u || x <= y,
        cmp::GTU => u || x > y,
        cmp::GEU => u || x >= y,
        cmp::NUM => !u,
        _ => u,
    }) as u64
}
// §9.7.9.21 cvt float -> float: exact widening, or rounding per `.rn/.rz/.rm/.rp`.
fn cvt_ff<const SK: u8, const DK: u8, const R: u8>(a: u64, _: u64, _: u64) -> u64 {
    to_kind::<DK, R>(fv::<SK>(a))
}
/// Rounding to an integral value (`.rni .rzi .rmi .rpi`), NaN stays NaN.
fn round_int<const R: u8>(x: f64) -> f64 {
    match R {
        0 => x.round_ties_even(),
        1 => x.trunc(),
        2 => x.floor(),
        _ => x.ceil(),
    }
}
// §9.7.9.21 cvt.rni/rzi/rmi/rpi between floats of one kind: round to an integral value.
fn cvt_fri<const K: u8, const R: u8>(a: u64, _: u64, _: u64) -> u64 {
    to_kind::<K, 0>(round_int::<R>(fv::<K>(a)))
}
// §9.7.9.21 cvt float -> integer: round per the integer rounding modifier, then
// saturate to the destination's range; NaN converts to 0.
fn cvt_fi<const SK: u8, const DW: u32, const DS: bool, const R: u8>(a: u64, _: u64, _: u64) -> u64 {
    let x = round_int::<R>(fv::<SK>(a));
    if x.is_nan() {
        return 0;
    }
    if DS {
        let lo = -(2f64.powi(DW as i32 - 1));
        let hi = 2f64.powi(DW as i32 - 1) - 1.0;
        trunc::<DW>(x.clamp(lo, hi) as i64 as u64)
    } else {
        let hi = if DW == 64 {
            u64::MAX as f64
        } else {
            2f64.powi(DW as i32) - 1.0
        };
        trunc::<DW>(x.clamp(0.0, hi) as u64)
    }
}
// §9.7.9.21 cvt integer -> float with `.rn/.rz/.rm/.rp`. 8- to 32-bit integers are
// exact in f64 and rounded once; 64-bit integers with `.rn` use Rust's correctly
// rounded conversion, with the directed modes they go through f64 (may round twice).
fn cvt_if<const SW: u32, const SS: bool, const DK: u8, const R: u8>(a: u64, _: u64, _: u64) -> u64 {
    let x = val::<SW, SS>(a);
    if SW == 64 && R == 0 {
        return match DK {
            fk::F32 | fk::F32Z => fb(x as f32),
            fk::F64 => db(x as f64),
            _ => to_kind::<DK, 0>(x as f32 as f64),
        };
    }
    to_kind::<DK, R>(x as f64)
}

macro_rules! by_z {
    ($z:expr, $f:ident) => {
        if $z { mk!($f::<true>) } else { mk!($f::<false>) }
    };
}

/// Float operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FOp {
    Add,
    Sub,
    Mul,
    Fma,
    Div,
    Abs,
    Neg,
    Min,
    Max,
    Sqrt,
    Rcp,
}

/// `k`: fk::F32 / F64 / F16 / BF16; `ftz` only for f32.
pub fn float_op(op: FOp, k: u8, ftz: bool) -> Option<AluFn> {
    use FOp::*;
    Some(match (k, op) {
        (fk::F32, Add) => by_z!(ftz, fadd),
        (fk::F32, Sub) => by_z!(ftz, fsub),
        (fk::F32, Mul) => by_z!(ftz, fmul),
        (fk::F32, Fma) => by_z!(ftz, ffma),
        (fk::F32, Div) => by_z!(ftz, fdiv),
        (fk::F32, Abs) => by_z!(ftz, fabs),
        (fk::F32, Neg) => by_z!(ftz, fneg),
        (fk::F32, Min) => by_z!(ftz, fmin),
        (fk::F32, Max) => by_z!(ftz, fmax),
        (fk::F32, Sqrt) => by_z!(ftz, fsqrt),
        (fk::F32, Rcp) => by_z!(ftz, frcp),
        (_, _) if ftz => return None,
        (fk::F64, Add) => mk!(dadd),
        (fk::F64, Sub) => mk!(dsub),
        (fk::F64, Mul) => mk!(dmul),
        (fk::F64, Fma) => mk!(dfma),
        (fk::F64, Div) => mk!(ddiv),
        (fk::F64, Abs) => mk!(dabs),
        (fk::F64, Neg) => mk!(dneg),
        (fk::F64, Min) => mk!(dmin),
        (fk::F64, Max) => mk!(dmax),
        (fk::F64, Sqrt) => mk!(dsqrt),
        (fk::F64, Rcp) => mk!(drcp),
        (fk::F16, Add) => mk!(hadd::<{ fk::F16 }>),
        (fk::F16, Sub) => mk!(hsub::<{ fk::F16 }>),
        (fk::F16, Mul) => mk!(hmul::<{ fk::F16 }>),
        (fk::F16, Fma) => mk!(hfma::<{ fk::F16 }>),
        (fk::F16, Min) => mk!(hmin::<{ fk::F16 }>),
        (fk::F16, Max) => mk!(hmax::<{ fk::F16 }>),
        (fk::BF16, Add) => mk!(hadd::<{ fk::BF16 }>),
        (fk::BF16, Sub) => mk!(hsub::<{ fk::BF16 }>),
        (fk::BF16, Mul) => mk!(hmul::<{ fk::BF16 }>),
        (fk::BF16, Fma) => mk!(hfma::<{ fk::BF16 }>),
        (fk::BF16, Min) => mk!(hmin::<{ fk::BF16 }>),
        (fk::BF16, Max) => mk!(hmax::<{ fk::BF16 }>),
        (fk::F16 | fk::BF16, Neg) => mk!(hneg),
        (fk::F16 | fk::BF16, Abs) => mk!(habs),
        _ => return None,
    })
}

macro_rules! by_k {
    ($k:expr, $f:ident $(, $extra:expr)*) => {
        match $k {
            fk::F32 => mk!($f::<{ fk::F32 } $(, { $extra })*>),
            fk::F32Z => mk!($f::<{ fk::F32Z } $(, { $extra })*>),
            fk::F64 => mk!($f::<{ fk::F64 } $(, { $extra })*>),
            fk::F16 => mk!($f::<{ fk::F16 } $(, { $extra })*>),
            fk::BF16 => mk!($f::<{ fk::BF16 } $(, { $extra })*>),
            _ => return None,
        }
    };
}

pub fn setp_float(k: u8, c: u8) -> Option<AluFn> {
    Some(match c {
        cmp::EQ => by_k!(k, setp_f, cmp::EQ),
        cmp::NE => by_k!(k, setp_f, cmp::NE),
        cmp::LT => by_k!(k, setp_f, cmp::LT),
        cmp::LE => by_k!(k, setp_f, cmp::LE),
        cmp::GT => by_k!(k, setp_f, cmp::GT),
        cmp::GE => by_k!(k, setp_f, cmp::GE),
        cmp::EQU => by_k!(k, setp_f, cmp::EQU),
        cmp::NEU => by_k!(k, setp_f, cmp::NEU),
        cmp::LTU => by_k!(k, setp_f, cmp::LTU),
        cmp::LEU => by_k!(k, setp_f, cmp::LEU),
        cmp::GTU => by_k!(k, setp_f, cmp::GTU),
        cmp::GEU => by_k!(k, setp_f, cmp::GEU),
        cmp::NUM => by_k!(k, setp_f, cmp::NUM),
        cmp::NAN => by_k!(k, setp_f, cmp::NAN),
        _ => return None,
    })
}

macro_rules! by_r {
    ($r:expr, $mac:ident ! ( $($args:tt)* )) => {
        match $r {
            0 => $mac!($($args)*, 0),
            1 => $mac!($($args)*, 1),
            2 => $mac!($($args)*, 2),
            _ => $mac!($($args)*, 3),
        }
    };
}

macro_rules! ff_dk {
    ($sk:expr, $dk:expr, $r:expr) => {
        match $dk {
            fk::F32 => by_k!($sk, cvt_ff, fk::F32, $r),
            fk::F64 => by_k!($sk, cvt_ff, fk::F64, $r),
            fk::F16 => by_k!($sk, cvt_ff, fk::F16, $r),
            fk::BF16 => by_k!($sk, cvt_ff, fk::BF16, $r),
            _ => return None,
        }
    };
}

/// cvt between float kinds; `r` 0..3 = rn rz rm rp.
pub fn cvt_float(dk: u8, sk: u8, r: u8) -> Option<AluFn> {
    Some(by_r!(r, ff_dk!(sk, dk)))
}

macro_rules! fri {
    ($k:expr, $r:expr) => {
        by_k!($k, cvt_fri, $r)
    };
}

/// cvt.rXi between floats of one kind.
pub fn cvt_round_int(k: u8, r: u8) -> Option<AluFn> {
    Some(by_r!(r, fri!(k)))
}

macro_rules! fi_dst {
    ($sk:expr, $dw:expr, $ds:expr, $r:expr) => {
        match $sk {
            fk::F32 => by_ws!($dw, $ds, cvt_fi_f32, $r),
            fk::F64 => by_ws!($dw, $ds, cvt_fi_f64, $r),
            fk::F16 => by_ws!($dw, $ds, cvt_fi_f16, $r),
            fk::BF16 => by_ws!($dw, $ds, cvt_fi_bf16, $r),
            _ => return None,
        }
    };
}
fn cvt_fi_f32<const DW: u32, const DS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_fi::<{ fk::F32 }, DW, DS, R>(a, b, c)
}
fn cvt_fi_f64<const DW: u32, const DS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_fi::<{ fk::F64 }, DW, DS, R>(a, b, c)
}
fn cvt_fi_f16<const DW: u32, const DS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_fi::<{ fk::F16 }, DW, DS, R>(a, b, c)
}
fn cvt_fi_bf16<const DW: u32, const DS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_fi::<{ fk::BF16 }, DW, DS, R>(a, b, c)
}

/// cvt float -> integer with an integer rounding modifier (0..3 = rni rzi rmi rpi).
pub fn cvt_f2i(dw: u32, ds: bool, sk: u8, r: u8) -> Option<AluFn> {
    Some(by_r!(r, fi_dst!(sk, dw, ds)))
}

macro_rules! if_src {
    ($dk:expr, $sw:expr, $ss:expr, $r:expr) => {
        match $dk {
            fk::F32 => by_ws!($sw, $ss, cvt_if_f32, $r),
            fk::F64 => by_ws!($sw, $ss, cvt_if_f64, $r),
            fk::F16 => by_ws!($sw, $ss, cvt_if_f16, $r),
            fk::BF16 => by_ws!($sw, $ss, cvt_if_bf16, $r),
            _ => return None,
        }
    };
}
fn cvt_if_f32<const SW: u32, const SS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_if::<SW, SS, { fk::F32 }, R>(a, b, c)
}
fn cvt_if_f64<const SW: u32, const SS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_if::<SW, SS, { fk::F64 }, R>(a, b, c)
}
fn cvt_if_f16<const SW: u32, const SS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_if::<SW, SS, { fk::F16 }, R>(a, b, c)
}
fn cvt_if_bf16<const SW: u32, const SS: bool, const R: u8>(a: u64, b: u64, c: u64) -> u64 {
    cvt_if::<SW, SS, { fk::BF16 }, R>(a, b, c)
}

/// cvt integer -> float with a float rounding modifier (0..3 = rn rz rm rp).
pub fn cvt_i2f(dk: u8, sw: u32, ss: bool, r: u8) -> Option<AluFn> {
    Some(by_r!(r, if_src!(dk, sw, ss)))
}
