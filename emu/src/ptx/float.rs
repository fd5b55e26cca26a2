//! Conversions between f64 and the narrower IEEE-754 binary formats (f32, f16,
//! bf16) with the four IEEE rounding modes of PTX `cvt` (PTX ISA §9.7.9.21
//! "cvt": `.rn` nearest-even, `.rz` toward zero, `.rm` toward -inf, `.rp`
//! toward +inf). NaN results are the canonical NaN (all exponent and mantissa
//! bits set), as `cvt` produces.

/// A rounding mode of PTX floating-point instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rnd {
    N,
    Z,
    M,
    P,
}

/// (exponent bits, mantissa bits) of the formats.
pub const F16: (u32, u32) = (5, 10);
pub const BF16: (u32, u32) = (8, 7);
pub const F32: (u32, u32) = (8, 23);

/// Rounds `x` to the binary format with `eb` exponent and `mb` mantissa bits
/// and returns its bit pattern.
pub fn to_bits(x: f64, (eb, mb): (u32, u32), rm: Rnd) -> u64 {
    let sign_bit = 1u64 << (eb + mb);
    let neg = x.is_sign_negative();
    let sign = if neg { sign_bit } else { 0 };
    let exp_all = (1u64 << eb) - 1;
    if x.is_nan() {
        return (exp_all << mb) | ((1u64 << mb) - 1);
    }
    let inf = sign | (exp_all << mb);
    let max_finite = sign | ((exp_all << mb) - 1);
    if x.is_infinite() {
        return inf;
    }
    let a = x.abs();
    if a == 0.0 {
        return sign;
    }
    let bias = (1i32 << (eb - 1)) - 1;
    let emin = 1 - bias;
    let e_field = ((a.to_bits() >> 52) & 0x7ff) as i32;
    let e = if e_field == 0 { -1023 } else { e_field - 1023 };
    let q_exp = e.max(emin) - mb as i32;
    // a / 2^q_exp is exact: a power-of-two scaling that neither overflows nor underflows here.
    let scaled = a * pow2(-q_exp);
    let toward_zero = scaled.trunc();
    let n = match rm {
        Rnd::N => scaled.round_ties_even(),
        Rnd::Z => toward_zero,
        Rnd::M if neg => scaled.ceil(),
        Rnd::M => toward_zero,
        Rnd::P if neg => toward_zero,
        Rnd::P => scaled.ceil(),
    } as u64;
    // Subnormal when e < emin: the field is n itself (n == 2^mb is the smallest normal).
    // Normal: ((e - emin) << mb) + n carries into the exponent when n rounds up to 2^(mb+1).
    let bits = if e < emin { n } else { (((e - emin) as u64) << mb) + n };
    if bits >= (exp_all << mb) {
        // Overflow: nearest and the direction away from zero give infinity.
        return match rm {
            Rnd::N => inf,
            Rnd::Z => max_finite,
            Rnd::M if neg => inf,
            Rnd::M => max_finite,
            Rnd::P if neg => max_finite,
            Rnd::P => inf,
        };
    }
    sign | bits
}

fn pow2(e: i32) -> f64 {
    // Two steps keep every intermediate a normal f64 for |e| up to ~2000.
    let h = e / 2;
    f64::from_bits(((1023 + h) as u64) << 52) * f64::from_bits(((1023 + e - h) as u64) << 52)
}

/// The value of a bit pattern of the format (exact in f64).
pub fn from_bits(bits: u64, (eb, mb): (u32, u32)) -> f64 {
    let neg = (bits >> (eb + mb)) & 1 != 0;
    let exp_all = (1u64 << eb) - 1;
    let ef = (bits >> mb) & exp_all;
    let m = bits & ((1u64 << mb) - 1);
    let bias = (1i32 << (eb - 1)) - 1;
    let v = if ef == exp_all {
        if m == 0 { f64::INFINITY } else { f64::NAN }
    } else if ef == 0 {
        m as f64 * pow2(1 - bias - mb as i32)
    } else {
        (m | (1u64 << mb)) as f64 * pow2(ef as i32 - bias - mb as i32)
    };
    if neg { -v } else { v }
}

#[inline]
pub fn f16_to_f32(h: u64) -> f32 {
    from_bits(h & 0xffff, F16) as f32
}

#[inline]
pub fn bf16_to_f32(h: u64) -> f32 {
    f32::from_bits(((h & 0xffff) as u32) << 16)
}

/// `.ftz`: subnormal inputs and results become zero of the same sign (PTX ISA
/// §9.7.3 "Floating-Point Instructions", subnormal numbers).
#[inline(always)]
pub fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding() {
        assert_eq!(to_bits(1.0, F16, Rnd::N), 0x3c00);
        assert_eq!(to_bits(-2.0, F16, Rnd::N), 0xc000);
        assert_eq!(to_bits(65504.0, F16, Rnd::N), 0x7bff);
        assert_eq!(to_bits(65520.0, F16, Rnd::N), 0x7c00); // halfway to 2^16 rounds to inf
        assert_eq!(to_bits(65520.0, F16, Rnd::Z), 0x7bff);
        assert_eq!(to_bits(1e9, F16, Rnd::Z), 0x7bff);
        assert_eq!(to_bits(-1e9, F16, Rnd::P), 0xfbff);
        assert_eq!(to_bits(-1e9, F16, Rnd::M), 0xfc00);
        assert_eq!(to_bits(5.960464477539063e-8, F16, Rnd::N), 0x0001); // smallest subnormal
        assert_eq!(to_bits(2.9e-8, F16, Rnd::N), 0x0000);
        assert_eq!(to_bits(2.9e-8, F16, Rnd::P), 0x0001);
        assert_eq!(to_bits(6.097555160522461e-5, F16, Rnd::N), 0x03ff);
        assert_eq!(to_bits(6.103515625e-5, F16, Rnd::N), 0x0400); // smallest normal
        // 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even.
        assert_eq!(to_bits(1.0 + 2f64.powi(-11), F16, Rnd::N), 0x3c00);
        assert_eq!(to_bits(1.0 + 3.0 * 2f64.powi(-11), F16, Rnd::N), 0x3c02);
        assert_eq!(to_bits(1.0 + 2f64.powi(-11), F16, Rnd::P), 0x3c01);
        assert_eq!(to_bits(f64::NAN, F16, Rnd::N), 0x7fff);
        assert_eq!(to_bits(-0.0, F16, Rnd::N), 0x8000);
        for b in 0..0x7c00u64 {
            assert_eq!(to_bits(from_bits(b, F16), F16, Rnd::N), b, "{b:#x}");
            assert_eq!(to_bits(-from_bits(b, F16), F16, Rnd::N), b | 0x8000, "{b:#x}");
        }
    }

    #[test]
    fn bf16_and_f32_rounding() {
        assert_eq!(to_bits(1.0, BF16, Rnd::N), 0x3f80);
        assert_eq!(to_bits(1.0 + 2f64.powi(-8), BF16, Rnd::N), 0x3f80);
        assert_eq!(to_bits(1.0 + 3.0 * 2f64.powi(-8), BF16, Rnd::N), 0x3f82);
        assert_eq!(bf16_to_f32(0x3fc0), 1.5);
        for x in [1.0f64, 0.1, -3.7, 1e-40, 3.4e38, 1e39, -1e-46, 123456.789] {
            assert_eq!(to_bits(x, F32, Rnd::N) as u32, (x as f32).to_bits(), "{x}");
        }
        assert_eq!(to_bits(0.1, F32, Rnd::Z) as u32, 0x3dcccccc);
        assert_eq!(to_bits(0.1, F32, Rnd::P) as u32, 0x3dcccccd);
    }
}
