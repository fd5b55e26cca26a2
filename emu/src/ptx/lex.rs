//! Tokenizer for PTX (PTX ISA §4 "Syntax"): identifiers (with their dotted
//! suffixes kept together: `ld.global.nc.u32`, `%tid.x`, `.param`), numbers
//! (`12`, `0x1F`, `0f3F800000`, `9.5`), strings and punctuation. `//` and
//! `/* */` comments are dropped.

use super::ParseError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ident,
    Num,
    Str,
    Punct(char),
}

#[derive(Debug, Clone, Copy)]
pub struct Tok<'a> {
    pub kind: Kind,
    pub text: &'a str,
    pub line: usize,
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || matches!(c, b'_' | b'$' | b'%' | b'.')
}

fn ident_cont(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.')
}

pub fn lex(src: &str) -> Result<Vec<Tok<'_>>, ParseError> {
    let b = src.as_bytes();
    let mut toks = Vec::with_capacity(src.len() / 4);
    let mut i = 0;
    let mut line = 1;
    let err = |line: usize, reason: &str| ParseError {
        line,
        text: src.lines().nth(line - 1).unwrap_or("").to_string(),
        reason: reason.to_string(),
    };
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= b.len() {
                    return Err(err(start, "unterminated /* comment"));
                }
                if b[i] == b'*' && b[i + 1] == b'/' {
                    i += 2;
                    break;
                }
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == b'"' {
            let s = i;
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err(err(line, "unterminated string"));
            }
            i += 1;
            toks.push(Tok {
                kind: Kind::Str,
                text: &src[s..i],
                line,
            });
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            toks.push(Tok {
                kind: Kind::Num,
                text: &src[s..i],
                line,
            });
        } else if ident_start(c) {
            let s = i;
            i += 1;
            while i < b.len() && ident_cont(b[i]) {
                i += 1;
            }
            toks.push(Tok {
                kind: Kind::Ident,
                text: &src[s..i],
                line,
            });
        } else if b",;:[]{}()+-<>@!|=".contains(&c) {
            toks.push(Tok {
                kind: Kind::Punct(c as char),
                text: &src[i..i + 1],
                line,
            });
            i += 1;
        } else {
            return Err(err(line, &format!("unexpected character {:?}", c as char)));
        }
    }
    Ok(toks)
}

/// Parses an integer literal (PTX ISA §4.5.1 "Integer Constants": decimal, hex
/// `0x`, octal `0`, binary `0b`, optional `U` suffix) or a float given as its
/// bits (`0f` + 8 hex digits for f32, `0d` + 16 for f64), returning the bits.
pub fn number(s: &str) -> Option<u64> {
    let t = s.strip_suffix('U').unwrap_or(s);
    let lower = t.to_ascii_lowercase();
    if let Some(h) = lower.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = lower.strip_prefix("0f") {
        return if h.len() == 8 {
            u64::from_str_radix(h, 16).ok()
        } else {
            None
        };
    }
    if let Some(h) = lower.strip_prefix("0d") {
        return if h.len() == 16 {
            u64::from_str_radix(h, 16).ok()
        } else {
            None
        };
    }
    if let Some(h) = lower.strip_prefix("0b") {
        return u64::from_str_radix(h, 2).ok();
    }
    if lower.len() > 1 && lower.starts_with('0') && lower.bytes().all(|c| c.is_ascii_digit()) {
        return u64::from_str_radix(&lower[1..], 8).ok();
    }
    lower.parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let t = lex("ld.param.u32 %r215, [%rd120+-92]; // c\n$L__BB0_2: /* x\n */ @!%p1 bra $L;").unwrap();
        let texts: Vec<_> = t.iter().map(|t| t.text).collect();
        assert_eq!(
            texts,
            [
                "ld.param.u32",
                "%r215",
                ",",
                "[",
                "%rd120",
                "+",
                "-",
                "92",
                "]",
                ";",
                "$L__BB0_2",
                ":",
                "@",
                "!",
                "%p1",
                "bra",
                "$L",
                ";"
            ]
        );
        assert_eq!(t[10].line, 2);
        assert_eq!(t[12].line, 3);
    }

    #[test]
    fn numbers() {
        assert_eq!(number("42"), Some(42));
        assert_eq!(number("0x1F"), Some(31));
        assert_eq!(number("0f3F800000"), Some(0x3f80_0000));
        assert_eq!(number("0d3FF0000000000000"), Some(0x3ff0_0000_0000_0000));
        assert_eq!(number("010"), Some(8));
        assert_eq!(number("0b101"), Some(5));
        assert_eq!(number("7U"), Some(7));
        assert_eq!(number("9.5"), None);
    }
}
