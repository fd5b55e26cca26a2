//! Scalars → the raw bytes of one element of any dtype (native byte order),
//! for fills. Float8 values are converted as ml_dtypes and torch convert them:
//! rounded to float32 first, then to nearest-even in the format; out-of-range
//! values become ±inf where the format has one, else NaN. A complex value with
//! a non-zero imaginary part is refused by every real and integer dtype (torch
//! refuses it too), never silently truncated; a bool takes its truth value. A
//! finite value past the largest float16, bfloat16 or float32 (and their
//! complex kinds) is refused as out of range, as torch's `fill_` refuses it,
//! not stored as inf; one that rounds down to the largest is kept (65519 →
//! float16 65504, as NumPy and `torch.full`; torch's `fill_` refuses it).

use crate::dtype::{DType, NumberKind};
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

    /// The element bytes of `self` as `dtype`; [`Error::InvalidScalar`] for
    /// a value the dtype cannot hold (an int out of range, a fraction into an
    /// integer dtype, a finite value past a wider-than-float8 float dtype's
    /// largest, a non-zero imaginary part into a real dtype).
    pub fn to_bytes(self, dtype: DType) -> Result<Vec<u8>> {
        self.convert(dtype, false)
    }

    /// As [`to_bytes`](Self::to_bytes), but a finite value past a float
    /// dtype's largest becomes an infinity of its sign, as NumPy and torch
    /// convert a Python number for a comparison.
    pub fn to_bytes_saturating(self, dtype: DType) -> Result<Vec<u8>> {
        self.convert(dtype, true)
    }

    /// The number kind of `self`.
    pub fn kind(self) -> NumberKind {
        match self {
            Scalar::Bool(_) => NumberKind::Bool,
            Scalar::Int(_) => NumberKind::Int,
            Scalar::Float(_) => NumberKind::Float,
            Scalar::Complex(..) => NumberKind::Complex,
        }
    }

    fn convert(self, dtype: DType, saturate: bool) -> Result<Vec<u8>> {
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
        // An int straight to float32 (through a double it was rounded twice
        // into float32 and complex64: 2^60 + 2^36 + 1 became 2^60, not 2^60 +
        // 2^37); the half types round that float32 again, as torch does (and
        // not from the double: `half`'s from_f64 drops the low 29 bits of a
        // double's mantissa in software: 3464.0007 became bfloat16 3456, not 3472).
        let f32_ = || match self {
            Scalar::Int(i) => i as f32,
            _ => f as f32,
        };
        // A finite value past the dtype's largest is an error, as in torch's
        // `fill_` ("cannot be converted ... without overflow"), not inf;
        // unless saturating, where the conversion's inf is the answer.
        let fits = |parts: &[(f64, bool)]| {
            if !saturate && parts.iter().any(|&(v, inf)| v.is_finite() && inf) {
                return Err(Error::InvalidScalar {
                    dtype,
                    reason: "out of range",
                });
            }
            Ok(())
        };
        if imag != 0.0 && !dtype.is_complex() && dtype != DType::Bool {
            return Err(Error::InvalidScalar {
                dtype,
                reason: COMPLEX_INTO_REAL,
            });
        }
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
            DType::F16 => {
                let h = half::f16::from_f32(f32_());
                fits(&[(f, h.is_infinite())])?;
                h.to_ne_bytes().to_vec()
            }
            DType::BF16 => {
                let b = half::bf16::from_f32(f32_());
                fits(&[(f, b.is_infinite())])?;
                b.to_ne_bytes().to_vec()
            }
            DType::F32 => {
                let v = f32_();
                fits(&[(f, v.is_infinite())])?;
                v.to_ne_bytes().to_vec()
            }
            DType::F64 => f.to_ne_bytes().to_vec(),
            DType::C32 => {
                let (re, im) = (half::f16::from_f32(f32_()), half::f16::from_f32(imag as f32));
                fits(&[(f, re.is_infinite()), (imag, im.is_infinite())])?;
                [re.to_ne_bytes(), im.to_ne_bytes()].concat()
            }
            DType::C64 => {
                let (re, im) = (f32_(), imag as f32);
                fits(&[(f, re.is_infinite()), (imag, im.is_infinite())])?;
                [re.to_ne_bytes(), im.to_ne_bytes()].concat()
            }
            DType::C128 => [f.to_ne_bytes(), imag.to_ne_bytes()].concat(),
            other => vec![float8(other, f)?],
        })
    }
}

/// The reason of the error for a complex value with a non-zero imaginary part
/// stored in a real or integer dtype.
pub const COMPLEX_INTO_REAL: &str = "a complex value with a non-zero imaginary part needs a complex dtype";

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

/// The layout of the float8 formats with a sign, exponent and mantissa:
/// (exponent bits, mantissa bits, bias, special values). Not for e8m0 (a bare
/// exponent), which its callers take first.
fn float8_format(dtype: DType) -> Result<(u32, u32, i32, Special)> {
    Ok(match dtype {
        DType::F8E3M4 => (3, 4, 3, Special::Ieee),
        DType::F8E4M3 => (4, 3, 7, Special::Ieee),
        DType::F8E4M3Fn => (4, 3, 7, Special::Fn),
        DType::F8E4M3Fnuz => (4, 3, 8, Special::Fnuz),
        DType::F8E4M3B11Fnuz => (4, 3, 11, Special::Fnuz),
        DType::F8E5M2 => (5, 2, 15, Special::Ieee),
        DType::F8E5M2Fnuz => (5, 2, 16, Special::Fnuz),
        _ => {
            return Err(Error::InvalidScalar {
                dtype,
                reason: "not a float8 dtype",
            });
        }
    })
}

/// Encodes `v` in a float8 format (through float32, as torch does, and
/// ml_dtypes did before 0.7, which rounds a float64 directly).
fn float8(dtype: DType, v: f64) -> Result<u8> {
    let v = f64::from(v as f32);
    if dtype == DType::F8E8M0Fnu {
        return Ok(e8m0(v));
    }
    let (e_bits, m_bits, bias, special) = float8_format(dtype)?;
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

/// E8M0 (a power-of-two scale, 2^(e - 127)): no sign, no zero; 0xff is NaN.
/// From the float32 bits, as ml_dtypes and torch: the exponent field, plus one
/// when the mantissa is at least half (more than half for float32 subnormals,
/// whose implicit bit is 0), so 1.5 → 2 and 3 → 4; past 2^127 that is 0xff,
/// NaN. Zero, negatives, infinities and NaN are NaN (no encoding for them).
fn e8m0(v: f64) -> u8 {
    let f = v as f32;
    if f.is_nan() || f.is_infinite() || f <= 0.0 {
        return 0xff;
    }
    let bits = f.to_bits();
    let exponent = (bits >> 23) & 0xff; // < 255: not inf or NaN
    let half = bits & 0x40_0000 != 0;
    let below_half = bits & 0x3f_ffff != 0;
    let implicit_one = exponent > 0;
    let up = half && (below_half || implicit_one);
    (exponent + u32::from(up)) as u8
}

fn round_half_even(x: f64) -> i64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && (r as i64) % 2 != 0 {
        (r - x.signum()) as i64
    } else {
        r as i64
    }
}

/// The value of one element of `dtype` stored in `bytes` (native byte order,
/// `dtype.size()` bytes): what `tolist()` and printing read. Float8 and
/// bfloat16 values come out exactly as ml_dtypes widens them.
pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<Scalar> {
    if bytes.len() != dtype.size() {
        return Err(Error::InvalidArgument {
            op: "scalar from bytes",
            reason: "element bytes differ from the dtype's size".into(),
        });
    }
    macro_rules! ne {
        ($t:ty) => {
            <$t>::from_ne_bytes(bytes.try_into().map_err(|_| Error::InvalidArgument {
                op: "scalar from bytes",
                reason: "element size".into(),
            })?)
        };
    }
    let half = |b: &[u8]| half::f16::from_ne_bytes([b[0], b[1]]).to_f64();
    Ok(match dtype {
        DType::Bool => Scalar::Bool(bytes[0] != 0),
        DType::I8 => Scalar::Int(i128::from(ne!(i8))),
        DType::I16 => Scalar::Int(i128::from(ne!(i16))),
        DType::I32 => Scalar::Int(i128::from(ne!(i32))),
        DType::I64 => Scalar::Int(i128::from(ne!(i64))),
        DType::U8 => Scalar::Int(i128::from(ne!(u8))),
        DType::U16 => Scalar::Int(i128::from(ne!(u16))),
        DType::U32 => Scalar::Int(i128::from(ne!(u32))),
        DType::U64 => Scalar::Int(i128::from(ne!(u64))),
        DType::F16 => Scalar::Float(half(bytes)),
        DType::BF16 => Scalar::Float(ne!(half::bf16).to_f64()),
        DType::F32 => Scalar::Float(f64::from(ne!(f32))),
        DType::F64 => Scalar::Float(ne!(f64)),
        DType::C32 => Scalar::Complex(half(&bytes[..2]), half(&bytes[2..])),
        DType::C64 => {
            let (re, im) = bytes.split_at(4);
            let f = |b: &[u8]| f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            Scalar::Complex(f(re), f(im))
        }
        DType::C128 => {
            let (re, im) = bytes.split_at(8);
            let f = |b: &[u8]| f64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
            Scalar::Complex(f(re), f(im))
        }
        other => Scalar::Float(float8_value(other, bytes[0])?),
    })
}

/// Decodes a float8 byte (the inverse of `float8`).
fn float8_value(dtype: DType, b: u8) -> Result<f64> {
    if dtype == DType::F8E8M0Fnu {
        // A power of two: 2^(b - 127); 0xff is the NaN.
        return Ok(if b == 0xff {
            f64::NAN
        } else {
            2f64.powi(i32::from(b) - 127)
        });
    }
    let (e_bits, m_bits, bias, special) = float8_format(dtype)?;
    if special == Special::Fnuz && b == 0x80 {
        return Ok(f64::NAN);
    }
    let max_e: u8 = (1 << e_bits) - 1;
    let exp = (b >> m_bits) & max_e;
    let mant = b & ((1u8 << m_bits) - 1);
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    match special {
        Special::Ieee if exp == max_e => return Ok(if mant == 0 { sign * f64::INFINITY } else { f64::NAN }),
        Special::Fn if exp == max_e && mant == (1 << m_bits) - 1 => return Ok(f64::NAN),
        _ => {}
    }
    let frac = f64::from(mant) / f64::from(1u32 << m_bits);
    let v = if exp == 0 {
        frac * 2f64.powi(1 - bias) // subnormal
    } else {
        (1.0 + frac) * 2f64.powi(i32::from(exp) - bias)
    };
    Ok(sign * v)
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
    fn half_types_round_above_a_tie_up_as_torch_does() {
        // Just above the tie between bfloat16 3456 and 3472 (16 apart): up,
        // from a double and from a float32 (torch, ml_dtypes); a true tie to even.
        let bf16 =
            |v: f64| half::bf16::from_ne_bytes(Scalar::Float(v).to_bytes(DType::BF16).unwrap().try_into().unwrap());
        assert_eq!(bf16(3464.0 * (1.0 + 2f64.powi(-22))).to_f64(), 3472.0);
        let three_f32_ulps_above = 3464.0 + 3.0 * 2f64.powi(-12); // a float32 exactly
        assert_eq!(bf16(f64::from(three_f32_ulps_above as f32)).to_f64(), 3472.0);
        assert_eq!(bf16(3464.0).to_f64(), 3456.0);
        assert_eq!(bf16(3480.0).to_f64(), 3488.0);
        // float16 near 2049 (ties between 2048 and 2050).
        let f16 = |v: f64| half::f16::from_ne_bytes(Scalar::Float(v).to_bytes(DType::F16).unwrap().try_into().unwrap());
        assert_eq!(f16(2049.0 * (1.0 + 2f64.powi(-20))).to_f64(), 2050.0);
        assert_eq!(f16(2049.0).to_f64(), 2048.0);
    }

    #[test]
    fn e8m0_rounds_and_overflows_as_ml_dtypes() {
        // Values from ml_dtypes 0.6 (`np.array(v).astype(float8_e8m0fnu)`).
        let cases: &[(f64, u8)] = &[
            (1.0, 127),
            (1.41, 127), // below 1.5: down (not the geometric midpoint √2)
            (1.49, 127),
            (1.5, 128), // half: up
            (0.75, 127),
            (0.7, 126),
            (3.0, 129),
            (6.0, 130),
            (2f64.powi(127), 254),
            (1.49 * 2f64.powi(127), 254),
            (1.5 * 2f64.powi(127), 255), // overflows to NaN
            (2f64.powi(128), 255),
            (2f64.powi(-127), 0),
            (1.49 * 2f64.powi(-127), 1), // float32 subnormal: anything above 2^-127 rounds up
            (0.99 * 2f64.powi(-127), 0),
            (2f64.powi(-149), 0),
            (1e-300, 255), // zero in float32
            (0.0, 255),
            (-1.0, 255),
            (f64::INFINITY, 255),
            (f64::NAN, 255),
        ];
        for &(v, want) in cases {
            assert_eq!(f8(DType::F8E8M0Fnu, v), want, "{v:e}");
        }
    }

    #[test]
    fn float8_goes_through_float32_as_ml_dtypes() {
        // 1.0625 + 2^-40 is above the e4m3fn midpoint of 1.0 and 1.125 in f64,
        // but rounds to the midpoint in f32, then to even: 1.0 (0x38).
        assert_eq!(f8(DType::F8E4M3Fn, 1.0625 + 2f64.powi(-40)), 0x38);
    }

    #[test]
    fn complex_values_need_a_complex_dtype() {
        for d in [DType::I32, DType::U8, DType::F32, DType::F16, DType::F8E4M3Fn] {
            assert!(
                matches!(
                    Scalar::Complex(1.0, 2.0).to_bytes(d),
                    Err(Error::InvalidScalar {
                        reason: COMPLEX_INTO_REAL,
                        ..
                    })
                ),
                "{d}"
            );
        }
        // A zero imaginary part loses nothing, a bool takes the truth value (as torch).
        assert_eq!(Scalar::Complex(0.0, 2.0).to_bytes(DType::Bool).unwrap(), [1]);
        assert_eq!(
            Scalar::Complex(2.0, 0.0).to_bytes(DType::F32).unwrap(),
            2f32.to_ne_bytes()
        );
        assert_eq!(
            Scalar::Complex(1.0, -2.0).to_bytes(DType::C64).unwrap(),
            [1f32.to_ne_bytes(), (-2f32).to_ne_bytes()].concat()
        );
    }

    #[test]
    fn saturating_conversions_give_infinities_of_the_sign() {
        // NumPy and torch compare a Python number past a float dtype's range as ±inf.
        let bits = |s: Scalar, d| s.to_bytes_saturating(d).unwrap();
        assert_eq!(bits(Scalar::Int(70000), DType::F16), half::f16::INFINITY.to_ne_bytes());
        assert_eq!(
            bits(Scalar::Float(-1e300), DType::BF16),
            half::bf16::NEG_INFINITY.to_ne_bytes()
        );
        assert_eq!(bits(Scalar::Float(1e300), DType::F32), f32::INFINITY.to_ne_bytes());
        let c = bits(Scalar::Complex(1.0, -1e39), DType::C64);
        assert_eq!(c, [1f32.to_ne_bytes(), f32::NEG_INFINITY.to_ne_bytes()].concat());
        // What fits converts as `to_bytes` does; integer ranges still refuse.
        assert_eq!(
            bits(Scalar::Float(65519.0), DType::F16),
            Scalar::Float(65519.0).to_bytes(DType::F16).unwrap()
        );
        assert!(Scalar::Int(300).to_bytes_saturating(DType::U8).is_err());
        assert!(Scalar::Complex(0.0, 1.0).to_bytes_saturating(DType::F32).is_err());
    }

    #[test]
    fn kinds_order_as_promotion_does() {
        use crate::NumberKind;
        assert!(NumberKind::Bool < NumberKind::Int && NumberKind::Int < NumberKind::Float);
        assert!(NumberKind::Float < NumberKind::Complex);
        for (d, k) in [
            (DType::Bool, NumberKind::Bool),
            (DType::U64, NumberKind::Int),
            (DType::BF16, NumberKind::Float),
            (DType::F8E8M0Fnu, NumberKind::Float),
            (DType::C32, NumberKind::Complex),
        ] {
            assert_eq!(d.kind(), k, "{d}");
        }
        assert_eq!(Scalar::Complex(1.0, 0.0).kind(), NumberKind::Complex);
        assert_eq!(Scalar::Bool(true).kind(), NumberKind::Bool);
    }

    #[test]
    fn integers_are_range_checked() {
        assert!(Scalar::Int(300).to_bytes(DType::U8).is_err());
        // Finite values past a float dtype's largest are refused, not inf;
        // inf itself and values that round down to the largest are kept.
        for (v, d) in [
            (70000.0, DType::F16),
            (1e300, DType::F32),
            (3.5e38, DType::BF16),
            (1e39, DType::C64),
        ] {
            assert!(Scalar::Float(v).to_bytes(d).is_err(), "{v} into {d}");
        }
        assert!(Scalar::Complex(0.0, 1e5).to_bytes(DType::C32).is_err());
        assert!(Scalar::Int(70000).to_bytes(DType::F16).is_err());
        assert_eq!(
            Scalar::Float(65519.0).to_bytes(DType::F16).unwrap(),
            half::f16::MAX.to_ne_bytes()
        );
        assert_eq!(
            Scalar::Float(f64::INFINITY).to_bytes(DType::F32).unwrap(),
            f32::INFINITY.to_ne_bytes()
        );
        // An int rounds once to float32 (2^60 + 2^36 + 1 is nearer 2^60 + 2^37).
        let v = (1i128 << 60) + (1 << 36) + 1;
        assert_eq!(
            Scalar::Int(v).to_bytes(DType::F32).unwrap(),
            (((1u64 << 60) + (1 << 37)) as f32).to_ne_bytes()
        );
        assert!(Scalar::Float(1.5).to_bytes(DType::I32).is_err());
        assert_eq!(Scalar::Float(2.0).to_bytes(DType::I16).unwrap(), 2i16.to_ne_bytes());
        assert_eq!(Scalar::Complex(1.0, -1.0).to_bytes(DType::C64).unwrap().len(), 8);
        assert_eq!(Scalar::Int(1).to_bytes(DType::BF16).unwrap(), 0x3f80u16.to_ne_bytes());
    }

    #[test]
    fn float8_bytes_decode_to_what_encodes_them_again() {
        for d in [
            DType::F8E3M4,
            DType::F8E4M3,
            DType::F8E4M3Fn,
            DType::F8E4M3Fnuz,
            DType::F8E4M3B11Fnuz,
            DType::F8E5M2,
            DType::F8E5M2Fnuz,
            DType::F8E8M0Fnu,
        ] {
            for b in 0..=255u8 {
                let Scalar::Float(v) = from_bytes(d, &[b]).unwrap() else {
                    panic!("{d}: not a float")
                };
                if v.is_nan() {
                    continue; // several NaN encodings; `float8` writes the canonical one
                }
                assert_eq!(f8(d, v), b, "{d}: {b:#04x} decodes to {v}");
            }
        }
        assert_eq!(from_bytes(DType::F8E4M3Fn, &[0x7e]).unwrap(), Scalar::Float(448.0));
        assert_eq!(
            from_bytes(DType::F8E5M2, &[0x7c]).unwrap(),
            Scalar::Float(f64::INFINITY)
        );
        assert_eq!(from_bytes(DType::F8E8M0Fnu, &[127]).unwrap(), Scalar::Float(1.0));
        assert_eq!(
            from_bytes(DType::F8E4M3Fn, &[0x01]).unwrap(),
            Scalar::Float(2f64.powi(-9))
        );
    }

    #[test]
    fn element_bytes_decode_for_every_kind() {
        let round = |d: DType, s: Scalar| from_bytes(d, &s.to_bytes(d).unwrap()).unwrap();
        assert_eq!(round(DType::Bool, Scalar::Bool(true)), Scalar::Bool(true));
        assert_eq!(round(DType::I8, Scalar::Int(-5)), Scalar::Int(-5));
        assert_eq!(
            round(DType::U64, Scalar::Int(u64::MAX as i128)),
            Scalar::Int(u64::MAX as i128)
        );
        assert_eq!(round(DType::BF16, Scalar::Float(1.5)), Scalar::Float(1.5));
        assert_eq!(round(DType::F16, Scalar::Float(-0.25)), Scalar::Float(-0.25));
        assert_eq!(round(DType::F64, Scalar::Float(0.1)), Scalar::Float(0.1));
        assert_eq!(
            round(DType::C32, Scalar::Complex(1.0, -2.0)),
            Scalar::Complex(1.0, -2.0)
        );
        assert_eq!(round(DType::C64, Scalar::Complex(0.5, 3.0)), Scalar::Complex(0.5, 3.0));
        assert_eq!(round(DType::C128, Scalar::Complex(0.1, 0.2)), Scalar::Complex(0.1, 0.2));
        assert!(from_bytes(DType::F32, &[0, 0]).is_err());
    }
}
