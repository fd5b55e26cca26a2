//! Element types and their DLPack encoding.

use std::fmt;
use std::str::FromStr;

use crate::dlpack::ffi::{self, DLDataType};
use crate::error::{Error, Result};

macro_rules! dtypes {
    ($( $(#[$doc:meta])* $variant:ident = ($code:expr, $bits:expr, $name:literal $(, $alias:literal)*) ),* $(,)?) => {
        /// An element type. Every DLPack type code is covered; names are spelled
        /// as NumPy and PyTorch spell them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DType {
            $( $(#[$doc])* $variant, )*
        }

        impl DType {
            /// Every dtype, in declaration order.
            pub const ALL: &'static [DType] = &[$(DType::$variant),*];

            /// The DLPack encoding (always one lane).
            pub const fn to_dlpack(self) -> DLDataType {
                match self {
                    $( DType::$variant => DLDataType { code: $code, bits: $bits, lanes: 1 }, )*
                }
            }

            /// The canonical name (`"float32"`, `"bfloat16"`, `"float8_e4m3fn"`, ...).
            pub const fn name(self) -> &'static str {
                match self {
                    $( DType::$variant => $name, )*
                }
            }

            /// Looks a dtype up by its canonical name or a common alias
            /// (`"float"`, `"half"`, `"double"`, `"bool_"`, ...).
            pub fn from_name(name: &str) -> Result<DType> {
                let name = name.strip_prefix("torch.").unwrap_or(name);
                match name {
                    $( $name $(| $alias)* => Ok(DType::$variant), )*
                    other => Err(Error::UnknownDTypeName(other.to_owned())),
                }
            }

            /// Reads a DLPack dtype; unknown codes, widths or lane counts are errors.
            pub fn from_dlpack(dt: DLDataType) -> Result<DType> {
                if dt.lanes == 1 {
                    $( if dt.code == $code && dt.bits == $bits { return Ok(DType::$variant); } )*
                }
                Err(Error::UnsupportedDType { code: dt.code, bits: dt.bits, lanes: dt.lanes })
            }
        }
    };
}

dtypes! {
    /// `bool` (one byte, 0 or 1).
    Bool = (ffi::kDLBool, 8, "bool", "bool_"),
    /// `int8`.
    I8 = (ffi::kDLInt, 8, "int8"),
    /// `int16`.
    I16 = (ffi::kDLInt, 16, "int16", "short"),
    /// `int32`.
    I32 = (ffi::kDLInt, 32, "int32", "int"),
    /// `int64`.
    I64 = (ffi::kDLInt, 64, "int64", "long"),
    /// `uint8`.
    U8 = (ffi::kDLUInt, 8, "uint8"),
    /// `uint16`.
    U16 = (ffi::kDLUInt, 16, "uint16"),
    /// `uint32`.
    U32 = (ffi::kDLUInt, 32, "uint32"),
    /// `uint64`.
    U64 = (ffi::kDLUInt, 64, "uint64"),
    /// IEEE half.
    F16 = (ffi::kDLFloat, 16, "float16", "half"),
    /// IEEE single.
    F32 = (ffi::kDLFloat, 32, "float32", "float"),
    /// IEEE double.
    F64 = (ffi::kDLFloat, 64, "float64", "double"),
    /// bfloat16.
    BF16 = (ffi::kDLBfloat, 16, "bfloat16"),
    /// Complex of two float16 (torch's `complex32`).
    C32 = (ffi::kDLComplex, 32, "complex32", "chalf"),
    /// Complex of two float32.
    C64 = (ffi::kDLComplex, 64, "complex64", "cfloat"),
    /// Complex of two float64.
    C128 = (ffi::kDLComplex, 128, "complex128", "cdouble"),
    /// float8 e3m4.
    F8E3M4 = (ffi::kDLFloat8_e3m4, 8, "float8_e3m4"),
    /// float8 e4m3.
    F8E4M3 = (ffi::kDLFloat8_e4m3, 8, "float8_e4m3"),
    /// float8 e4m3b11fnuz.
    F8E4M3B11Fnuz = (ffi::kDLFloat8_e4m3b11fnuz, 8, "float8_e4m3b11fnuz"),
    /// float8 e4m3fn (the common "fp8").
    F8E4M3Fn = (ffi::kDLFloat8_e4m3fn, 8, "float8_e4m3fn"),
    /// float8 e4m3fnuz.
    F8E4M3Fnuz = (ffi::kDLFloat8_e4m3fnuz, 8, "float8_e4m3fnuz"),
    /// float8 e5m2.
    F8E5M2 = (ffi::kDLFloat8_e5m2, 8, "float8_e5m2"),
    /// float8 e5m2fnuz.
    F8E5M2Fnuz = (ffi::kDLFloat8_e5m2fnuz, 8, "float8_e5m2fnuz"),
    /// float8 e8m0fnu (a scale type).
    F8E8M0Fnu = (ffi::kDLFloat8_e8m0fnu, 8, "float8_e8m0fnu"),
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        (self.to_dlpack().bits / 8) as usize
    }

    /// True for the floating kinds (float, bfloat, float8).
    pub const fn is_floating_point(self) -> bool {
        matches!(
            self.to_dlpack().code,
            ffi::kDLFloat | ffi::kDLBfloat | ffi::kDLFloat8_e3m4..=ffi::kDLFloat8_e8m0fnu
        )
    }

    /// True for complex types.
    pub const fn is_complex(self) -> bool {
        self.to_dlpack().code == ffi::kDLComplex
    }

    /// The kind of number an element is.
    pub const fn kind(self) -> NumberKind {
        match self {
            DType::Bool => NumberKind::Bool,
            d if d.is_complex() => NumberKind::Complex,
            d if d.is_floating_point() => NumberKind::Float,
            _ => NumberKind::Int,
        }
    }
}

/// The kinds of number, lowest first: each holds the values of those before
/// it (the order of NumPy's and torch's type promotion across kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NumberKind {
    /// True or false.
    Bool,
    /// Signed or unsigned integers.
    Int,
    /// Real floating point (float, bfloat, float8).
    Float,
    /// Complex floating point.
    Complex,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DType> {
        DType::from_name(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_dlpack_and_name() {
        for &dt in DType::ALL {
            assert_eq!(DType::from_dlpack(dt.to_dlpack()).unwrap(), dt);
            assert_eq!(DType::from_name(dt.name()).unwrap(), dt);
            assert_eq!(dt.name().parse::<DType>().unwrap(), dt);
            assert_eq!(dt.size() * 8, dt.to_dlpack().bits as usize);
        }
    }

    #[test]
    fn encodings_match_the_spec() {
        let enc = |d: DType| {
            let x = d.to_dlpack();
            (x.code, x.bits, x.lanes)
        };
        assert_eq!(enc(DType::Bool), (6, 8, 1));
        assert_eq!(enc(DType::BF16), (4, 16, 1));
        assert_eq!(enc(DType::C64), (5, 64, 1));
        assert_eq!(enc(DType::C128), (5, 128, 1));
        assert_eq!(enc(DType::F8E4M3Fn), (10, 8, 1));
        assert_eq!(enc(DType::F8E8M0Fnu), (14, 8, 1));
    }

    #[test]
    fn aliases_and_torch_prefix_parse() {
        assert_eq!(DType::from_name("torch.float32").unwrap(), DType::F32);
        assert_eq!(DType::from_name("half").unwrap(), DType::F16);
        assert_eq!(DType::from_name("bool_").unwrap(), DType::Bool);
    }

    #[test]
    fn unknown_encodings_and_names_are_errors() {
        let bad = [
            DLDataType {
                code: 2,
                bits: 24,
                lanes: 1,
            },
            DLDataType {
                code: 2,
                bits: 32,
                lanes: 4,
            },
            DLDataType {
                code: 99,
                bits: 8,
                lanes: 1,
            },
            DLDataType {
                code: ffi::kDLFloat4_e2m1fn,
                bits: 4,
                lanes: 1,
            },
        ];
        for dt in bad {
            assert!(
                matches!(DType::from_dlpack(dt), Err(Error::UnsupportedDType { .. })),
                "{dt:?}"
            );
        }
        assert!(matches!(DType::from_name("float31"), Err(Error::UnknownDTypeName(_))));
    }
}
