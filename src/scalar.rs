//! Scalars → the raw bytes of one element of any dtype (native byte order),
//! for fills. Float8 values are rounded to nearest-even as ml_dtypes does;
//! out-of-range values become ±inf where the format has one, else NaN.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A value to store in a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// An integer (wide enough for every integer dtype).
    Int(i128),
    /// A real number.
    Float(f64),
    /// A complex number (real, imaginary).
    Complex(f64, f64),
}

impl Scalar {
    fn real(self) -> f64 {
        match self {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) | Scalar::Complex(f, _) => f,
        }
    }

    fn int(self, dtype: DType) -> Result<i128> {
        match self {
            Scalar::Bool(b) => Ok(i128::from(b)),
            Scalar::Int(i) => Ok(i),
            Scalar::Float(f) | Scalar::Complex(f, _) if f.is_finite() && f.fract() == 0.0 => Ok(f as i128),
            _ => Err(Error::InvalidScalar {
                dtype,
                reason: "not an integer",
            }),
        }
    }

    /// The element bytes of `self` as `dtype`.
    pub fn to_bytes(self, dtype: DType) -> Result<Vec<u8>> {
        macro_rules! int {
            ($t:ty) => {
                <$t>::try_from(self.int(dtype)?)
                    .map(|v| v.to_ne_bytes().to_vec())
                    .map_err(|_| Error::InvalidScalar {
                        dtype,
                        reason: "out of range",
                    })
            };
        }
        let f = self.real();
        let imag = if let Scalar::Complex(_, i) = self { i } else { 0.0 };
        Ok(match dtype {
            DType::Bool => vec![u8::from(f != 0.0 || imag != 0.0)],
            DType::I8 => int!(i8)?,
            DType::I16 => int!(i16)?,
            DType::I32 => int!(i32)?,
            DType::I64 => int!(i64)?,
            DType::U8 => int!(u8)?,
            DType::U16 => int!(u16)?,
            DType::U32 => int!(u32)?,
            DType::U64 => int!(u64)?,
            DType::F16 => half::f16::from_f64(f).to_ne_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(f).to_ne_bytes().to_vec(),
            DType::F32 => (f as f32).to_ne_bytes().to_vec(),
            DType::F64 => f.to_ne_bytes().to_vec(),
            DType::C32 => [
                half::f16::from_f64(f).to_ne_bytes(),
                half::f16::from_f64(imag).to_ne_bytes(),
            ]
            .concat(),
            DType::C64 => [(f as f32).to_ne_bytes(), (imag as f32).to_ne_bytes()].concat(),
            DType::C128 => [f.to_ne_bytes(), imag.to_ne_bytes()].concat(),
            other => vec![float8(other, f)?],
        })
    }
}

/// How a float8 format spends its top exponent and its sign.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Special {
    /// IEEE: top exponent holds ±inf and NaNs.
    Ieee,
    /// "fn": no infinities; only all-ones exponent and mantissa is NaN.
    Fn,
    /// "fnuz": no infinities, no negative zero; 0x80 is the only NaN.
    Fnuz,
}

/// Encodes `v` in a float8 format.
fn float8(dtype: DType, v: f64) -> Result<u8> {
    let (e_bits, m_bits, bias, special) = match dtype {
        DType::F8E3M4 => (3, 4, 3, Special::Ieee),
        DType::F8E4M3 => (4, 3, 7, Special::Ieee),
        DType::F8E4M3Fn => (4, 3, 7, Special::Fn),
        DType::F8E4M3Fnuz => (4, 3, 8, Special::Fnuz),
        DType::F8E4M3B11Fnuz => (4, 3, 11, Special::Fnuz),
        DType::F8E5M2 => (5, 2, 15, Special::Ieee),
        DType::F8E5M2Fnuz => (5, 2, 16, Special::Fnuz),
        DType::F8E8M0Fnu => return Ok(e8m0(v)),
        _ => {
            return Err(Error::InvalidScalar {
                dtype,
                reason: "not a float8 dtype",
            });
        }
    };
    let max_e: i32 = (1 << e_bits) - 1;
    let nan = match special {
        Special::Fnuz => 0x80,
        _ => ((max_e as u8) << m_bits) | ((1u8 << m_bits) - 1),
    };
    let sign: u8 = if v.is_sign_negative() && special != Special::Fnuz || v < 0.0 {
        0x80
    } else {
        0
    };
    if v.is_nan() {
        return Ok(nan);
    }
    let inf = match special {
        Special::Ieee => sign | ((max_e as u8) << m_bits),
        _ => nan,
    };
    let a = v.abs();
    if a.is_infinite() {
        return Ok(inf);
    }
    if a == 0.0 {
        return Ok(if special == Special::Fnuz { 0 } else { sign });
    }
    // Largest finite exponent field and mantissa.
    let (top_e, top_m) = match special {
        Special::Ieee => (max_e - 1, (1i64 << m_bits) - 1),
        Special::Fn => (max_e, (1i64 << m_bits) - 2),
        Special::Fnuz => (max_e, (1i64 << m_bits) - 1),
    };
    let min_normal_exp = 1 - bias;
    let e = a.log2().floor() as i32;
    let (mut e_field, mut m) = if e < min_normal_exp {
        (
            0,
            round_half_even(a / 2f64.powi(min_normal_exp) * f64::from(1u32 << m_bits)),
        )
    } else {
        (
            e + bias,
            round_half_even((a / 2f64.powi(e) - 1.0) * f64::from(1u32 << m_bits)),
        )
    };
    if m == 1i64 << m_bits {
        m = 0;
        e_field += 1;
    }
    if e_field > top_e || (e_field == top_e && m > top_m) {
        return Ok(inf);
    }
    if e_field == 0 && m == 0 {
        return Ok(if special == Special::Fnuz { 0 } else { sign });
    }
    Ok(sign | ((e_field as u8) << m_bits) | m as u8)
}

/// E8M0 (a power-of-two scale): no sign, no zero; 0xff is NaN.
fn e8m0(v: f64) -> u8 {
    if v.is_nan() || v <= 0.0 || v.is_infinite() {
        return 0xff;
    }
    let e = v.log2().round() as i32 + 127;
    e.clamp(0, 254) as u8
}

fn round_half_even(x: f64) -> i64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && (r as i64) % 2 != 0 {
        (r - x.signum()) as i64
    } else {
        r as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f8(d: DType, v: f64) -> u8 {
        float8(d, v).unwrap()
    }

    #[test]
    fn float8_encodings_match_ml_dtypes() {
        // 1.0 in every format.
        assert_eq!(f8(DType::F8E3M4, 1.0), 0x30);
        assert_eq!(f8(DType::F8E4M3, 1.0), 0x38);
        assert_eq!(f8(DType::F8E4M3Fn, 1.0), 0x38);
        assert_eq!(f8(DType::F8E4M3Fnuz, 1.0), 0x40);
        assert_eq!(f8(DType::F8E4M3B11Fnuz, 1.0), 0x58);
        assert_eq!(f8(DType::F8E5M2, 1.0), 0x3c);
        assert_eq!(f8(DType::F8E5M2Fnuz, 1.0), 0x40);
        assert_eq!(f8(DType::F8E8M0Fnu, 1.0), 0x7f);
        // Extremes and specials of e4m3fn: max 448, NaN 0x7f, no inf.
        assert_eq!(f8(DType::F8E4M3Fn, 448.0), 0x7e);
        assert_eq!(f8(DType::F8E4M3Fn, -448.0), 0xfe);
        assert_eq!(f8(DType::F8E4M3Fn, 1e9), 0x7f);
        assert_eq!(f8(DType::F8E4M3Fn, f64::NAN), 0x7f);
        // Subnormals: smallest e4m3fn is 2^-9.
        assert_eq!(f8(DType::F8E4M3Fn, 2f64.powi(-9)), 0x01);
        assert_eq!(f8(DType::F8E4M3Fn, -0.0), 0x80);
        // e5m2 is IEEE: inf 0x7c, max 57344.
        assert_eq!(f8(DType::F8E5M2, f64::INFINITY), 0x7c);
        assert_eq!(f8(DType::F8E5M2, 57344.0), 0x7b);
        assert_eq!(f8(DType::F8E5M2, -2.0), 0xc0);
        // fnuz: no negative zero, NaN is 0x80.
        assert_eq!(f8(DType::F8E4M3Fnuz, -0.0), 0x00);
        assert_eq!(f8(DType::F8E5M2Fnuz, f64::NAN), 0x80);
        // Round half to even: 1.0625 lies halfway between 1.0 and 1.125 in e4m3fn.
        assert_eq!(f8(DType::F8E4M3Fn, 1.0625), 0x38);
        assert_eq!(f8(DType::F8E4M3Fn, 1.1875), 0x3a);
        assert_eq!(f8(DType::F8E8M0Fnu, 0.25), 125);
    }

    #[test]
    fn integers_are_range_checked() {
        assert!(Scalar::Int(300).to_bytes(DType::U8).is_err());
        assert!(Scalar::Float(1.5).to_bytes(DType::I32).is_err());
        assert_eq!(Scalar::Float(2.0).to_bytes(DType::I16).unwrap(), 2i16.to_ne_bytes());
        assert_eq!(Scalar::Complex(1.0, -1.0).to_bytes(DType::C64).unwrap().len(), 8);
        assert_eq!(Scalar::Int(1).to_bytes(DType::BF16).unwrap(), 0x3f80u16.to_ne_bytes());
    }
}
