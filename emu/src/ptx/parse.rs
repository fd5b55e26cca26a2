//! Strict parser and decoder: PTX text -> [`Module`]. Every instruction form
//! (opcode, modifiers, types and operand shapes) is checked against the list of
//! supported forms; anything else is a [`ParseError`] naming the line.

use std::collections::HashMap;

use super::ir::{self, Body, Init, Inst, Mem, NO_GUARD, Op, Space, Special, ZERO_REG, cmp};
use super::lex::{Kind, Tok, lex, number};
use super::ops::{self, FOp, IntOp, fk};
use super::{Kernel, Module, ParamInfo, ParseError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TK {
    U,
    S,
    B,
    F,
    BF,
    Pred,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ty {
    k: TK,
    bits: u32,
}

impl Ty {
    fn bytes(self) -> u32 {
        self.bits.div_ceil(8)
    }
    fn is_int(self) -> bool {
        matches!(self.k, TK::U | TK::S | TK::B)
    }
    fn signed(self) -> bool {
        self.k == TK::S
    }
    /// The float kind of [`ops::fk`].
    fn fkind(self) -> Option<u8> {
        match (self.k, self.bits) {
            (TK::F, 32) => Some(fk::F32),
            (TK::F, 64) => Some(fk::F64),
            (TK::F, 16) => Some(fk::F16),
            (TK::BF, 16) => Some(fk::BF16),
            _ => None,
        }
    }
}

fn ty(s: &str) -> Option<Ty> {
    let (k, bits) = match s {
        "pred" => (TK::Pred, 1),
        "bf16" => (TK::BF, 16),
        _ => {
            let k = match s.as_bytes().first()? {
                b'u' => TK::U,
                b's' => TK::S,
                b'b' => TK::B,
                b'f' => TK::F,
                _ => return None,
            };
            let bits: u32 = s[1..].parse().ok()?;
            let ok = match k {
                TK::F => matches!(bits, 16 | 32 | 64),
                _ => matches!(bits, 8 | 16 | 32 | 64),
            };
            if !ok {
                return None;
            }
            (k, bits)
        }
    };
    Some(Ty { k, bits })
}

/// A parsed operand.
#[derive(Debug, Clone)]
enum Opnd<'a> {
    Name(&'a str),
    /// Bits and whether written as a float (`0f`/`0d`).
    Imm(u64, ImmKind),
    Mem(MemBase<'a>, i64),
    Vec(Vec<Opnd<'a>>),
    /// `%p|%q` (setp's two destinations).
    Pair(&'a str, &'a str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImmKind {
    Int,
    F32,
    F64,
}

#[derive(Debug, Clone, Copy)]
enum MemBase<'a> {
    Name(&'a str),
    Imm(u64),
}

pub fn parse(text: &str) -> Result<Module, ParseError> {
    let toks = lex(text)?;
    let lines: Vec<&str> = text.lines().collect();
    let mut p = P { toks, i: 0, lines };
    let mut kernels = Vec::new();
    while p.i < p.toks.len() {
        let t = p.toks[p.i];
        match t.text {
            ".version" | ".address_size" => {
                p.i += 1;
                let n = p.next()?;
                if n.kind != Kind::Num {
                    return Err(p.err_at(n, "expected a number"));
                }
                if t.text == ".address_size" && n.text != "64" {
                    return Err(p.err_at(n, "only .address_size 64 is supported"));
                }
            }
            ".target" => {
                p.i += 1;
                p.ident()?;
                while p.peek_punct(',') {
                    p.i += 1;
                    p.ident()?;
                }
            }
            ".visible" | ".weak" => {
                p.i += 1;
            }
            ".entry" => {
                p.i += 1;
                kernels.push(p.entry()?);
            }
            ".func" => return Err(p.err_at(t, ".func (device functions, calls) is not supported")),
            ".extern" | ".global" | ".const" | ".shared" | ".local" | ".file" | ".section" => {
                return Err(p.err_at(t, "module-scope variables and debug sections are not supported"));
            }
            _ => return Err(p.err_at(t, "unexpected token at module scope")),
        }
        if p.peek_punct(';') {
            p.i += 1;
        }
    }
    Ok(Module { kernels })
}

struct P<'a> {
    toks: Vec<Tok<'a>>,
    i: usize,
    lines: Vec<&'a str>,
}

impl<'a> P<'a> {
    fn err_at(&self, t: Tok<'_>, reason: &str) -> ParseError {
        self.err_line(t.line, reason)
    }
    fn err_line(&self, line: usize, reason: &str) -> ParseError {
        ParseError {
            line,
            text: self.lines.get(line.wrapping_sub(1)).unwrap_or(&"").to_string(),
            reason: reason.to_string(),
        }
    }
    fn next(&mut self) -> Result<Tok<'a>, ParseError> {
        let t = self.toks.get(self.i).copied().ok_or_else(|| {
            let line = self.toks.last().map_or(1, |t| t.line);
            self.err_line(line, "unexpected end of input")
        })?;
        self.i += 1;
        Ok(t)
    }
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.i).copied()
    }
    fn peek_punct(&self, c: char) -> bool {
        self.peek().is_some_and(|t| t.kind == Kind::Punct(c))
    }
    fn expect(&mut self, c: char) -> Result<Tok<'a>, ParseError> {
        let t = self.next()?;
        if t.kind != Kind::Punct(c) {
            return Err(self.err_at(t, &format!("expected `{c}`")));
        }
        Ok(t)
    }
    fn ident(&mut self) -> Result<Tok<'a>, ParseError> {
        let t = self.next()?;
        if t.kind != Kind::Ident {
            return Err(self.err_at(t, "expected a name"));
        }
        Ok(t)
    }
    fn num(&mut self) -> Result<u64, ParseError> {
        let t = self.next()?;
        if t.kind != Kind::Num {
            return Err(self.err_at(t, "expected a number"));
        }
        number(t.text).ok_or_else(|| self.err_at(t, "bad number"))
    }

    fn entry(&mut self) -> Result<Kernel, ParseError> {
        let name = self.ident()?;
        self.expect('(')?;
        let mut params = Vec::new();
        let mut off = 0usize;
        if !self.peek_punct(')') {
            loop {
                let pi = self.param(&mut off)?;
                params.push(pi);
                if self.peek_punct(',') {
                    self.i += 1;
                } else {
                    break;
                }
            }
        }
        self.expect(')')?;
        let mut maxntid = None;
        let mut reqntid = None;
        // Performance-tuning directives (PTX ISA §11.4).
        while let Some(t) = self.peek() {
            if t.kind != Kind::Ident {
                break;
            }
            self.i += 1;
            match t.text {
                ".maxntid" | ".reqntid" | ".reqnctapercluster" => {
                    let mut v = [1u32; 3];
                    v[0] = self.num()? as u32;
                    for slot in v.iter_mut().skip(1) {
                        if !self.peek_punct(',') {
                            break;
                        }
                        self.i += 1;
                        *slot = self.num()? as u32;
                    }
                    match t.text {
                        ".maxntid" => maxntid = Some(v),
                        ".reqntid" => reqntid = Some(v),
                        _ => {}
                    }
                }
                ".minnctapersm" | ".maxnctapersm" | ".maxnreg" | ".maxclusterrank" => {
                    self.num()?;
                }
                ".explicitcluster" | ".noreturn" => {}
                _ => return Err(self.err_at(t, "unsupported entry directive")),
            }
        }
        let open = self.expect('{')?;
        let mut b = Builder::new(&params);
        self.body(&mut b)?;
        let body = b.finish(self, open.line)?;
        let param_bytes = params.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
        Ok(Kernel {
            name: name.text.to_string(),
            params,
            param_bytes,
            shared_bytes: b.shared_bytes as usize,
            maxntid,
            reqntid,
            body,
        })
    }

    /// `.param [.type] [.ptr [.space] [.align N]] [.align N] [.type] name [ '[' N ']' ]`
    fn param(&mut self, off: &mut usize) -> Result<ParamInfo, ParseError> {
        let t = self.ident()?;
        if t.text != ".param" {
            return Err(self.err_at(t, "expected .param"));
        }
        let mut align = None;
        let mut elem = None;
        let mut ptr = false;
        let name = loop {
            let t = self.ident()?;
            match t.text {
                // After `.ptr`, `.align N` is the alignment of the pointee (PTX ISA §5.1.6.1
                // "Kernel Function Parameter Attributes"), not of the parameter.
                ".align" if ptr => {
                    self.num()?;
                }
                ".align" => align = Some(self.num()? as usize),
                ".ptr" => ptr = true,
                ".global" | ".const" | ".shared" | ".local" if ptr => {}
                s if s.starts_with('.') => {
                    let ty = ty(&s[1..]).ok_or_else(|| self.err_at(t, "bad parameter type"))?;
                    if ty.k == TK::Pred {
                        return Err(self.err_at(t, "bad parameter type"));
                    }
                    elem = Some(ty.bytes() as usize);
                }
                _ => break t,
            }
        };
        let elem = elem.ok_or_else(|| self.err_at(name, "parameter without a type"))?;
        let mut count = 1;
        if self.peek_punct('[') {
            self.i += 1;
            count = self.num()? as usize;
            self.expect(']')?;
        }
        let align = align.unwrap_or(elem).max(1);
        if !align.is_power_of_two() {
            return Err(self.err_at(name, "alignment not a power of two"));
        }
        let offset = off.div_ceil(align) * align;
        let size = elem * count;
        *off = offset + size;
        Ok(ParamInfo {
            name: name.text.to_string(),
            offset,
            size,
            align,
        })
    }

    fn body(&mut self, b: &mut Builder<'a>) -> Result<(), ParseError> {
        let mut depth = 1;
        loop {
            let t = self.next()?;
            match t.kind {
                Kind::Punct('{') => {
                    depth += 1;
                    b.scopes.push(HashMap::new());
                }
                Kind::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                    b.scopes.pop();
                }
                Kind::Punct('@') => {
                    self.i -= 1;
                    self.instruction(b)?;
                }
                Kind::Punct(';') => {}
                Kind::Ident if self.peek_punct(':') => {
                    self.i += 1;
                    if b.labels.insert(t.text, b.code.len() as u32).is_some() {
                        return Err(self.err_at(t, "duplicate label"));
                    }
                }
                Kind::Ident => match t.text {
                    ".reg" => self.reg_decl(b)?,
                    ".shared" => self.shared_decl(b)?,
                    ".pragma" => {
                        let s = self.next()?;
                        if s.kind != Kind::Str {
                            return Err(self.err_at(s, "expected a string"));
                        }
                        self.expect(';')?;
                    }
                    ".local" | ".const" | ".global" | ".param" => {
                        return Err(self.err_at(t, "unsupported variable declaration in a kernel body"));
                    }
                    s if s.starts_with('.') => return Err(self.err_at(t, "unsupported directive")),
                    _ => {
                        self.i -= 1;
                        self.instruction(b)?;
                    }
                },
                _ => return Err(self.err_at(t, "unexpected token")),
            }
        }
    }

    fn reg_decl(&mut self, b: &mut Builder<'a>) -> Result<(), ParseError> {
        let t = self.ident()?;
        let rt = t
            .text
            .strip_prefix('.')
            .and_then(ty)
            .ok_or_else(|| self.err_at(t, "bad register type"))?;
        let bits = rt.bits as u8;
        loop {
            let n = self.ident()?;
            if self.peek_punct('<') {
                self.i += 1;
                let count = self.num()?;
                self.expect('>')?;
                for k in 0..count {
                    b.declare(format!("{}{}", n.text, k), bits);
                }
            } else {
                b.declare(n.text.to_string(), bits);
            }
            let t = self.next()?;
            match t.kind {
                Kind::Punct(',') => continue,
                Kind::Punct(';') => return Ok(()),
                _ => return Err(self.err_at(t, "expected `,` or `;`")),
            }
        }
    }

    /// `.shared [.align N] .type name [ '[' N ']' ];`
    fn shared_decl(&mut self, b: &mut Builder<'a>) -> Result<(), ParseError> {
        let mut align = None;
        let mut elem = None;
        let name = loop {
            let t = self.ident()?;
            match t.text {
                ".align" => align = Some(self.num()?),
                s if s.starts_with('.') => {
                    let ty = ty(&s[1..]).ok_or_else(|| self.err_at(t, "bad .shared type"))?;
                    elem = Some(ty.bytes() as u64);
                }
                _ => break t,
            }
        };
        let elem = elem.ok_or_else(|| self.err_at(name, ".shared without a type"))?;
        let mut count = 1;
        if self.peek_punct('[') {
            self.i += 1;
            if self.peek_punct(']') {
                return Err(self.err_at(name, "dynamic (extern) shared memory is not supported"));
            }
            count = self.num()?;
            self.expect(']')?;
        }
        self.expect(';')?;
        let align = align.unwrap_or(elem).max(1);
        let off = b.shared_bytes.div_ceil(align) * align;
        b.shared_bytes = off + elem * count;
        if b.shared.insert(name.text, off).is_some() {
            return Err(self.err_at(name, "duplicate .shared name"));
        }
        Ok(())
    }

    fn operand(&mut self) -> Result<Opnd<'a>, ParseError> {
        let t = self.next()?;
        match t.kind {
            Kind::Punct('[') => {
                let bt = self.next()?;
                let base = match bt.kind {
                    Kind::Ident => MemBase::Name(bt.text),
                    Kind::Num => MemBase::Imm(number(bt.text).ok_or_else(|| self.err_at(bt, "bad number"))?),
                    _ => return Err(self.err_at(bt, "bad address")),
                };
                let mut off = 0i64;
                if self.peek_punct('+') || self.peek_punct('-') {
                    let mut neg = self.next()?.kind == Kind::Punct('-');
                    if self.peek_punct('-') {
                        self.i += 1;
                        neg = !neg;
                    }
                    let v = self.num()? as i64;
                    off = if neg { v.wrapping_neg() } else { v };
                }
                self.expect(']')?;
                Ok(Opnd::Mem(base, off))
            }
            Kind::Punct('{') => {
                let mut v = Vec::new();
                loop {
                    v.push(self.operand()?);
                    let t = self.next()?;
                    match t.kind {
                        Kind::Punct(',') => continue,
                        Kind::Punct('}') => break,
                        _ => return Err(self.err_at(t, "expected `,` or `}`")),
                    }
                }
                Ok(Opnd::Vec(v))
            }
            Kind::Punct('-') => {
                let n = self.next()?;
                let (v, k) = self.imm(n)?;
                if k != ImmKind::Int {
                    return Err(self.err_at(n, "negated float literal"));
                }
                Ok(Opnd::Imm(v.wrapping_neg(), k))
            }
            Kind::Num => {
                let (v, k) = self.imm(t)?;
                Ok(Opnd::Imm(v, k))
            }
            Kind::Ident => {
                if self.peek_punct('|') {
                    self.i += 1;
                    let q = self.ident()?;
                    return Ok(Opnd::Pair(t.text, q.text));
                }
                Ok(Opnd::Name(t.text))
            }
            _ => Err(self.err_at(t, "bad operand")),
        }
    }

    fn imm(&self, t: Tok<'_>) -> Result<(u64, ImmKind), ParseError> {
        if t.kind != Kind::Num {
            return Err(self.err_at(t, "expected a number"));
        }
        let v = number(t.text).ok_or_else(|| self.err_at(t, "bad number"))?;
        let l = t.text.as_bytes().get(1).map(|c| c.to_ascii_lowercase());
        let k = if t.text.starts_with('0') && l == Some(b'f') {
            ImmKind::F32
        } else if t.text.starts_with('0') && l == Some(b'd') {
            ImmKind::F64
        } else {
            ImmKind::Int
        };
        Ok((v, k))
    }

    fn instruction(&mut self, b: &mut Builder<'a>) -> Result<(), ParseError> {
        let first = self.peek().expect("caller checked");
        let line = first.line;
        let mut guard = None;
        if self.peek_punct('@') {
            self.i += 1;
            let neg = self.peek_punct('!');
            if neg {
                self.i += 1;
            }
            guard = Some((self.ident()?, neg));
        }
        let opc = self.ident()?;
        let mut opnds = Vec::new();
        if !self.peek_punct(';') {
            loop {
                opnds.push(self.operand()?);
                let t = self.next()?;
                match t.kind {
                    Kind::Punct(',') => continue,
                    Kind::Punct(';') => break,
                    _ => return Err(self.err_at(t, "expected `,` or `;`")),
                }
            }
        } else {
            self.i += 1;
        }
        let (g, gneg) = match guard {
            Some((p, neg)) => (b.reg(p.text, true).map_err(|e| self.err_at(p, &e))?, neg),
            None => (NO_GUARD, false),
        };
        let src = b.lines.len() as u32;
        b.lines
            .push((line, self.lines.get(line - 1).unwrap_or(&"").trim().to_string()));
        let ops = decode(b, opc.text, &opnds).map_err(|e| self.err_at(opc, &e))?;
        for op in ops {
            if let Op::Bra(_) = op {
                let Some(Opnd::Name(l)) = opnds.first() else {
                    unreachable!()
                };
                b.fixups.push((b.code.len(), l, line));
            }
            b.code.push(Inst {
                op,
                guard: g,
                gneg,
                src,
            });
        }
        Ok(())
    }
}

struct Builder<'a> {
    scopes: Vec<HashMap<String, u32>>,
    bits: Vec<u8>,
    init: Vec<(u32, Init)>,
    consts: HashMap<u64, u32>,
    specials: HashMap<&'static str, u32>,
    params: HashMap<String, u64>,
    shared: HashMap<&'a str, u64>,
    shared_bytes: u64,
    labels: HashMap<&'a str, u32>,
    fixups: Vec<(usize, &'a str, usize)>,
    code: Vec<Inst>,
    lines: Vec<(usize, String)>,
    sink: Option<u32>,
}

const SPECIALS: &[(&str, Special)] = &[
    ("%tid.x", Special::Tid(0)),
    ("%tid.y", Special::Tid(1)),
    ("%tid.z", Special::Tid(2)),
    ("%ntid.x", Special::Ntid(0)),
    ("%ntid.y", Special::Ntid(1)),
    ("%ntid.z", Special::Ntid(2)),
    ("%ctaid.x", Special::Ctaid(0)),
    ("%ctaid.y", Special::Ctaid(1)),
    ("%ctaid.z", Special::Ctaid(2)),
    ("%nctaid.x", Special::Nctaid(0)),
    ("%nctaid.y", Special::Nctaid(1)),
    ("%nctaid.z", Special::Nctaid(2)),
    ("%laneid", Special::LaneId),
    ("%warpid", Special::WarpId),
    ("%nwarpid", Special::NWarpId),
];

impl<'a> Builder<'a> {
    fn new(params: &[ParamInfo]) -> Self {
        let mut b = Builder {
            scopes: vec![HashMap::new()],
            bits: vec![64],
            init: vec![(ZERO_REG, Init::Const(0))],
            consts: HashMap::from([(0, ZERO_REG)]),
            specials: HashMap::new(),
            params: params.iter().map(|p| (p.name.clone(), p.offset as u64)).collect(),
            shared: HashMap::new(),
            shared_bytes: 0,
            labels: HashMap::new(),
            fixups: Vec::new(),
            code: Vec::new(),
            lines: Vec::new(),
            sink: None,
        };
        b.scopes.push(HashMap::new());
        b
    }

    fn new_reg(&mut self, bits: u8) -> u32 {
        self.bits.push(bits);
        (self.bits.len() - 1) as u32
    }

    fn declare(&mut self, name: String, bits: u8) {
        let r = self.new_reg(bits);
        self.scopes.last_mut().expect("scope").insert(name, r);
    }

    fn konst(&mut self, v: u64) -> u32 {
        if let Some(&r) = self.consts.get(&v) {
            return r;
        }
        let r = self.new_reg(64);
        self.consts.insert(v, r);
        self.init.push((r, Init::Const(v)));
        r
    }

    /// A declared register (`write`: not a read-only one) or, for reads, a
    /// special register.
    fn reg(&mut self, name: &str, write: bool) -> Result<u32, String> {
        for s in self.scopes.iter().rev() {
            if let Some(&r) = s.get(name) {
                return Ok(r);
            }
        }
        if write {
            if name == "_" {
                if let Some(r) = self.sink {
                    return Ok(r);
                }
                let r = self.new_reg(64);
                self.sink = Some(r);
                return Ok(r);
            }
            return Err(format!("`{name}` is not a declared register"));
        }
        if let Some(&(n, sp)) = SPECIALS.iter().find(|(n, _)| *n == name) {
            if let Some(&r) = self.specials.get(n) {
                return Ok(r);
            }
            let r = self.new_reg(32);
            self.specials.insert(n, r);
            self.init.push((r, Init::Special(sp)));
            return Ok(r);
        }
        Err(format!("unknown operand `{name}`"))
    }

    fn reg_bits(&self, r: u32) -> u32 {
        self.bits[r as usize] as u32
    }

    fn finish(&mut self, p: &P<'_>, _line: usize) -> Result<Body, ParseError> {
        for &(at, label, line) in &self.fixups {
            let t = *self
                .labels
                .get(label)
                .ok_or_else(|| p.err_line(line, &format!("unknown label `{label}`")))?;
            self.code[at].op = Op::Bra(t);
        }
        // Falling off the end of the body returns (a label may also point just past the last instruction).
        let src = self.lines.len() as u32;
        let end_line = p.toks.get(p.i.saturating_sub(1)).map_or(0, |t| t.line);
        self.lines.push((end_line, "}".to_string()));
        self.code.push(Inst {
            op: Op::Exit,
            guard: NO_GUARD,
            gneg: false,
            src,
        });
        Ok(Body {
            code: std::mem::take(&mut self.code),
            nregs: self.bits.len(),
            init: std::mem::take(&mut self.init),
            lines: std::mem::take(&mut self.lines),
        })
    }
}

// ---- decoding -----------------------------------------------------------------

type R<T> = Result<T, String>;

fn unsupported(opc: &str) -> String {
    format!("unsupported instruction form `{opc}`")
}

/// A source operand: register, special register, immediate (as a constant
/// register), or the address of a parameter or shared variable.
fn src(b: &mut Builder<'_>, o: &Opnd<'_>, t: Option<Ty>) -> R<u32> {
    match *o {
        Opnd::Name(n) => {
            if let Ok(r) = b.reg(n, false) {
                return Ok(r);
            }
            if let Some(&off) = b.params.get(n) {
                return Ok(b.konst(off));
            }
            if let Some(&off) = b.shared.get(n) {
                return Ok(b.konst(off));
            }
            Err(format!("unknown operand `{n}`"))
        }
        Opnd::Imm(v, k) => {
            let v = match (t.and_then(Ty::fkind), k) {
                (Some(fk::F32), ImmKind::F32) | (Some(fk::F64), ImmKind::F64) => v,
                (Some(fk::F32), ImmKind::F64) => (f64::from_bits(v) as f32).to_bits() as u64,
                (Some(fk::F64), ImmKind::F32) => (f32::from_bits(v as u32) as f64).to_bits(),
                (Some(fk::F32), ImmKind::Int) => (v as i64 as f32).to_bits() as u64,
                (Some(fk::F64), ImmKind::Int) => (v as i64 as f64).to_bits(),
                (Some(_), _) => return Err("immediate operand of a 16-bit float type".into()),
                (None, ImmKind::Int) => v,
                (None, _) => return Err("float literal for an integer operand".into()),
            };
            Ok(b.konst(v))
        }
        _ => Err("expected a register or an immediate".into()),
    }
}

fn dst(b: &mut Builder<'_>, o: &Opnd<'_>) -> R<u32> {
    match *o {
        Opnd::Name(n) => b.reg(n, true),
        _ => Err("expected a destination register".into()),
    }
}

fn nops(ops: &[Opnd<'_>], n: usize) -> R<()> {
    if ops.len() != n {
        Err(format!("expected {n} operands, found {}", ops.len()))
    } else {
        Ok(())
    }
}

fn alu(f: Option<AluFnOpt>, o: [u32; 4], opc: &str) -> R<Vec<Op>> {
    let f = f.ok_or_else(|| unsupported(opc))?;
    Ok(vec![Op::Alu { f, o }])
}
type AluFnOpt = ir::AluFn;

/// `[d, a, b, c]` from operands: one destination and up to three sources.
fn dabc(b: &mut Builder<'_>, ops: &[Opnd<'_>], n: usize, t: Option<Ty>) -> R<[u32; 4]> {
    nops(ops, n + 1)?;
    let mut o = [ZERO_REG; 4];
    for (k, op) in ops.iter().enumerate().skip(1) {
        o[k] = src(b, op, t)?;
    }
    o[0] = dst(b, &ops[0])?;
    Ok(o)
}

fn rounding(m: &str) -> Option<u8> {
    Some(match m {
        "rn" => 0,
        "rz" => 1,
        "rm" => 2,
        "rp" => 3,
        _ => return None,
    })
}

fn int_rounding(m: &str) -> Option<u8> {
    Some(match m {
        "rni" => 0,
        "rzi" => 1,
        "rmi" => 2,
        "rpi" => 3,
        _ => return None,
    })
}

fn decode(b: &mut Builder<'_>, opc: &str, ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let parts: Vec<&str> = opc.split('.').collect();
    let base = parts[0];
    let mods = &parts[1..];
    let bad = || unsupported(opc);
    // The last modifier is the type for most instructions.
    let last_ty = mods.last().and_then(|m| ty(m));
    match base {
        "add" | "sub" | "mul" | "mad" | "fma" | "div" | "rem" | "min" | "max" | "abs" | "neg" | "and" | "or"
        | "xor" | "not" | "shl" | "shr" | "popc" | "clz" | "brev" | "sqrt" | "rcp" => {
            let t = last_ty.ok_or_else(bad)?;
            let quals = &mods[..mods.len() - 1];
            if t.is_int() || t.k == TK::Pred {
                int_inst(b, opc, base, quals, t, ops)
            } else {
                float_inst(b, opc, base, quals, t, ops)
            }
        }
        "mov" => mov_inst(b, opc, mods, ops),
        // §9.7.9.7 prmt: the generic form only (the modes .f4e … .rc16 are not
        // supported; NVRTC packs bytes with the generic form).
        "prmt" => {
            if mods != ["b32"] {
                return Err(bad());
            }
            let o = dabc(b, ops, 3, ty("b32"))?;
            alu(ops::int_op(IntOp::Prmt, 32, false), o, opc)
        }
        "selp" => {
            let t = match mods {
                [t] => ty(t).filter(|t| t.k != TK::Pred).ok_or_else(bad)?,
                _ => return Err(bad()),
            };
            nops(ops, 4)?;
            let o = [
                dst(b, &ops[0])?,
                src(b, &ops[1], Some(t))?,
                src(b, &ops[2], Some(t))?,
                src(b, &ops[3], None)?,
            ];
            alu(ops::int_op(IntOp::Selp, t.bits.max(8), false), o, opc)
        }
        "setp" => setp_inst(b, opc, mods, ops),
        "cvt" => cvt_inst(b, opc, mods, ops),
        "cvta" => {
            let (to, sp, w) = match mods {
                ["to", sp, w] => (true, *sp, *w),
                [sp, w] => (false, *sp, *w),
                _ => return Err(bad()),
            };
            let shared = match sp {
                "global" => false,
                "shared" => true,
                _ => return Err(bad()),
            };
            let w = match w {
                "u64" => 64,
                "u32" => 32,
                _ => return Err(bad()),
            };
            let o = dabc(b, ops, 1, None)?;
            alu(ops::cvta_fn(to, shared, w), o, opc)
        }
        "ld" | "st" => mem_inst(b, opc, base == "ld", mods, ops),
        "bra" => {
            if !(mods.is_empty() || mods == ["uni"]) {
                return Err(bad());
            }
            nops(ops, 1)?;
            match ops[0] {
                Opnd::Name(_) => Ok(vec![Op::Bra(0)]),
                _ => Err("bra needs a label".into()),
            }
        }
        "bar" | "barrier" => {
            // §9.7.13.4 bar/barrier: only barrier 0 of the whole CTA.
            let ok = match base {
                "bar" => mods == ["sync"],
                _ => mods == ["sync"] || mods == ["sync", "aligned"],
            };
            if !ok {
                return Err(bad());
            }
            nops(ops, 1)?;
            match ops[0] {
                Opnd::Imm(0, ImmKind::Int) => Ok(vec![Op::Bar]),
                _ => Err("only barrier 0 without a thread count is supported".into()),
            }
        }
        "ret" | "exit" => {
            if !(mods.is_empty() || mods == ["uni"]) {
                return Err(bad());
            }
            nops(ops, 0)?;
            Ok(vec![Op::Exit])
        }
        _ => Err(bad()),
    }
}

fn int_inst(b: &mut Builder<'_>, opc: &str, base: &str, quals: &[&str], t: Ty, ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let bad = || unsupported(opc);
    let (w, s) = (t.bits, t.signed());
    let is_ub = matches!(t.k, TK::U | TK::S);
    let pred = t.k == TK::Pred;
    let (op, nsrc) = match (base, quals) {
        ("add", []) if is_ub && w >= 16 => (IntOp::Add, 2),
        ("sub", []) if is_ub && w >= 16 => (IntOp::Sub, 2),
        ("mul", ["lo"]) if is_ub && w >= 16 => (IntOp::MulLo, 2),
        ("mul", ["hi"]) if is_ub && w >= 16 => (IntOp::MulHi, 2),
        ("mul", ["wide"]) if is_ub && (w == 16 || w == 32) => (IntOp::MulWide, 2),
        ("mad", ["lo"]) if is_ub && w >= 16 => (IntOp::MadLo, 3),
        ("mad", ["hi"]) if is_ub && w >= 16 => (IntOp::MadHi, 3),
        ("mad", ["wide"]) if is_ub && (w == 16 || w == 32) => (IntOp::MadWide, 3),
        ("div", []) if is_ub && w >= 16 => (IntOp::Div, 2),
        ("rem", []) if is_ub && w >= 16 => (IntOp::Rem, 2),
        ("min", []) if is_ub && w >= 16 => (IntOp::Min, 2),
        ("max", []) if is_ub && w >= 16 => (IntOp::Max, 2),
        ("abs", []) if t.k == TK::S && w >= 16 => (IntOp::Abs, 1),
        ("neg", []) if t.k == TK::S && w >= 16 => (IntOp::Neg, 1),
        ("and", []) if (t.k == TK::B && w >= 16) || pred => (IntOp::And, 2),
        ("or", []) if (t.k == TK::B && w >= 16) || pred => (IntOp::Or, 2),
        ("xor", []) if (t.k == TK::B && w >= 16) || pred => (IntOp::Xor, 2),
        ("not", []) if (t.k == TK::B && w >= 16) || pred => (IntOp::Not, 1),
        ("shl", []) if t.k == TK::B && w >= 16 => (IntOp::Shl, 2),
        ("shr", []) if w >= 16 && !pred => (IntOp::Shr, 2),
        ("popc", []) if t.k == TK::B && w >= 32 => (IntOp::Popc, 1),
        ("clz", []) if t.k == TK::B && w >= 32 => (IntOp::Clz, 1),
        ("brev", []) if t.k == TK::B && w >= 32 => (IntOp::Brev, 1),
        _ => return Err(bad()),
    };
    let mut o = dabc(b, ops, nsrc, Some(t))?;
    if op == IntOp::Shl || op == IntOp::Shr {
        // The shift amount is a .u32 operand.
        o[2] = src(b, &ops[2], None)?;
    }
    if pred {
        let f = if op == IntOp::Not {
            Some(ops::not_pred_fn())
        } else {
            ops::int_op(op, 64, false)
        };
        return alu(f, o, opc);
    }
    alu(ops::int_op(op, w, s), o, opc)
}

fn float_inst(b: &mut Builder<'_>, opc: &str, base: &str, quals: &[&str], t: Ty, ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let bad = || unsupported(opc);
    let k = t.fkind().ok_or_else(bad)?;
    let mut rnd = None;
    let mut ftz = false;
    let mut approx = false;
    for q in quals {
        match *q {
            "rn" if rnd.is_none() => rnd = Some(0),
            "ftz" if !ftz => ftz = true,
            "approx" | "full" if !approx => approx = true,
            _ => return Err(bad()),
        }
    }
    if ftz && k != fk::F32 {
        return Err(bad());
    }
    let half = k == fk::F16 || k == fk::BF16;
    let (op, nsrc) = match base {
        "add" => (FOp::Add, 2),
        "sub" => (FOp::Sub, 2),
        "mul" => (FOp::Mul, 2),
        // §9.7.3.6 mad.f32 requires a rounding modifier on sm_20+ and is then fma.
        "fma" | "mad" if rnd.is_some() => (FOp::Fma, 3),
        "div" if (rnd.is_some() || approx) && !half => (FOp::Div, 2),
        "abs" if rnd.is_none() => (FOp::Abs, 1),
        "neg" if rnd.is_none() => (FOp::Neg, 1),
        "min" if rnd.is_none() => (FOp::Min, 2),
        "max" if rnd.is_none() => (FOp::Max, 2),
        "sqrt" if (rnd.is_some() || approx) && !half => (FOp::Sqrt, 1),
        "rcp" if (rnd.is_some() || approx) && !half => (FOp::Rcp, 1),
        _ => return Err(bad()),
    };
    // `.approx`/`.full` division, square root and reciprocal are computed
    // correctly rounded (a valid result within the documented error bounds).
    if approx && !matches!(op, FOp::Div | FOp::Sqrt | FOp::Rcp) || (approx && k == fk::F64 && op == FOp::Div) {
        return Err(bad());
    }
    let o = dabc(b, ops, nsrc, Some(t))?;
    alu(ops::float_op(op, k, ftz), o, opc)
}

fn mov_inst(b: &mut Builder<'_>, opc: &str, mods: &[&str], ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let t = match mods {
        [t] => ty(t).ok_or_else(|| unsupported(opc))?,
        _ => return Err(unsupported(opc)),
    };
    nops(ops, 2)?;
    match (&ops[0], &ops[1]) {
        // Packing: mov.b32 d, {lo, hi} (§9.7.9.3).
        (Opnd::Name(_), Opnd::Vec(v)) if t.k == TK::B && v.len() == 2 => {
            let o = [dst(b, &ops[0])?, src(b, &v[0], None)?, src(b, &v[1], None)?, ZERO_REG];
            alu(ops::pack_fn(t.bits / 2), o, opc)
        }
        // Unpacking: mov.b32 {lo, hi}, s.
        (Opnd::Vec(v), Opnd::Name(_)) if t.k == TK::B && (v.len() == 2 || v.len() == 4) => {
            let s = src(b, &ops[1], None)?;
            let eb = t.bits / v.len() as u32;
            let mut out = Vec::new();
            for (i, d) in v.iter().enumerate() {
                let d = dst(b, d)?;
                out.push(Op::Alu {
                    f: ops::unpack_fn(eb, i as u32).ok_or_else(|| unsupported(opc))?,
                    o: [d, s, 0, 0],
                });
            }
            Ok(out)
        }
        _ => {
            let o = dabc(b, ops, 1, Some(t))?;
            if t.k == TK::Pred {
                return alu(Some(ops::mov_pred_fn()), o, opc);
            }
            alu(ops::int_op(IntOp::Mov, t.bits, false), o, opc)
        }
    }
}

fn setp_inst(b: &mut Builder<'_>, opc: &str, mods: &[&str], ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let bad = || unsupported(opc);
    let (c, ftz, t) = match mods {
        [c, t] => (*c, false, ty(t).ok_or_else(bad)?),
        [c, "ftz", t] => (*c, true, ty(t).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    nops(ops, 3)?;
    let (p, q) = match ops[0] {
        Opnd::Name(p) => (b.reg(p, true)?, None),
        Opnd::Pair(p, q) => (b.reg(p, true)?, Some(b.reg(q, true)?)),
        _ => return Err("expected a predicate destination".into()),
    };
    let f = if t.is_int() {
        if ftz {
            return Err(bad());
        }
        let cc = cmp::parse_int(c).ok_or_else(bad)?;
        let signed = t.signed();
        // lo/ls/hi/hs are the unsigned comparisons; for .b types eq/ne only.
        if t.k == TK::B && !matches!(cc, cmp::EQ | cmp::NE) {
            return Err(bad());
        }
        if t.k == TK::S && matches!(c, "lo" | "ls" | "hi" | "hs") {
            return Err(bad());
        }
        ops::setp_int(t.bits, signed, cc).ok_or_else(bad)?
    } else {
        let mut k = t.fkind().ok_or_else(bad)?;
        if ftz {
            if k != fk::F32 {
                return Err(bad());
            }
            k = fk::F32Z;
        }
        ops::setp_float(k, cmp::parse_float(c).ok_or_else(bad)?).ok_or_else(bad)?
    };
    let o = [p, src(b, &ops[1], Some(t))?, src(b, &ops[2], Some(t))?, ZERO_REG];
    let mut v = vec![Op::Alu { f, o }];
    if let Some(q) = q {
        v.push(Op::Alu {
            f: ops::not_pred_fn(),
            o: [q, p, 0, 0],
        });
    }
    Ok(v)
}

fn cvt_inst(b: &mut Builder<'_>, opc: &str, mods: &[&str], ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let bad = || unsupported(opc);
    if mods.len() < 2 {
        return Err(bad());
    }
    let d = ty(mods[mods.len() - 2]).filter(|t| t.k != TK::Pred).ok_or_else(bad)?;
    let s = ty(mods[mods.len() - 1]).filter(|t| t.k != TK::Pred).ok_or_else(bad)?;
    let quals = &mods[..mods.len() - 2];
    let mut frnd = None;
    let mut irnd = None;
    for q in quals {
        if let Some(r) = rounding(q).filter(|_| frnd.is_none() && irnd.is_none()) {
            frnd = Some(r);
        } else if let Some(r) = int_rounding(q).filter(|_| frnd.is_none() && irnd.is_none()) {
            irnd = Some(r);
        } else {
            return Err(bad());
        }
    }
    let o = dabc(b, ops, 1, Some(s))?;
    // §9.7.9.21 cvt: which rounding modifiers each pair of types requires.
    let f = match (d.fkind(), s.fkind()) {
        (None, None) => {
            if frnd.is_some() || irnd.is_some() {
                return Err(bad());
            }
            ops::cvt_int(d.bits, s.bits, s.signed())
        }
        (Some(dk), None) => {
            let r = frnd.ok_or_else(bad)?;
            if irnd.is_some() {
                return Err(bad());
            }
            ops::cvt_i2f(dk, s.bits, s.signed(), r)
        }
        (None, Some(sk)) => {
            let r = irnd.ok_or_else(bad)?;
            ops::cvt_f2i(d.bits, d.signed(), sk, r)
        }
        (Some(dk), Some(sk)) => {
            let narrowing = d.bits < s.bits || (d.bits == s.bits && dk != sk);
            if dk == sk {
                match irnd {
                    Some(r) => ops::cvt_round_int(dk, r),
                    None => return Err(bad()),
                }
            } else if narrowing {
                if irnd.is_some() {
                    return Err(bad());
                }
                ops::cvt_float(dk, sk, frnd.ok_or_else(bad)?)
            } else {
                // Widening is exact; no rounding modifier allowed.
                if frnd.is_some() || irnd.is_some() {
                    return Err(bad());
                }
                ops::cvt_float(dk, sk, 0)
            }
        }
    };
    alu(f, o, opc)
}

fn mem_inst(b: &mut Builder<'_>, opc: &str, load: bool, mods: &[&str], ops: &[Opnd<'_>]) -> R<Vec<Op>> {
    let bad = || unsupported(opc);
    let mut space = Space::Generic;
    let mut it = mods.iter().peekable();
    let mut nc = false;
    let mut n = 1u8;
    let mut t = None;
    let mut seen_space = false;
    for m in it.by_ref() {
        match *m {
            "global" | "shared" | "param" if !seen_space && t.is_none() && n == 1 => {
                seen_space = true;
                space = match *m {
                    "global" => Space::Global,
                    "shared" => Space::Shared,
                    _ => Space::Param,
                };
            }
            "nc" if load && space == Space::Global && !nc => nc = true,
            // Cache operators (§9.7.9.8 ld / §9.7.9.10 st): hints only.
            "ca" | "cg" | "cs" | "lu" | "cv" if load && matches!(space, Space::Global | Space::Generic) => {}
            "wb" | "cg" | "cs" | "wt" if !load && matches!(space, Space::Global | Space::Generic) => {}
            "v2" if n == 1 && t.is_none() => n = 2,
            "v4" if n == 1 && t.is_none() => n = 4,
            m if t.is_none() => t = Some(ty(m).filter(|t| t.k != TK::Pred).ok_or_else(bad)?),
            _ => return Err(bad()),
        }
    }
    let t = t.ok_or_else(bad)?;
    if nc {
        space = Space::GlobalNc;
    }
    if !load && space == Space::Param {
        return Err(bad());
    }
    if t.bits as usize * n as usize > 128 {
        return Err(bad());
    }
    nops(ops, 2)?;
    let (addr, val) = if load { (&ops[1], &ops[0]) } else { (&ops[0], &ops[1]) };
    let Opnd::Mem(mb, off) = *addr else {
        return Err("expected an address operand `[...]`".into());
    };
    let base = match mb {
        MemBase::Imm(v) => b.konst(v),
        MemBase::Name(nm) => {
            if let Ok(r) = b.reg(nm, false) {
                r
            } else if let (Space::Param, Some(&o)) = (space, b.params.get(nm)) {
                b.konst(o)
            } else if let (Space::Shared, Some(&o)) = (space, b.shared.get(nm)) {
                b.konst(o)
            } else {
                return Err(format!("`{nm}` is not a register or a variable of this state space"));
            }
        }
    };
    let vals: Vec<&Opnd<'_>> = match val {
        Opnd::Vec(v) if n > 1 && v.len() == n as usize => v.iter().collect(),
        Opnd::Vec(_) => return Err("vector operand does not match .v2/.v4".into()),
        o if n == 1 => vec![o],
        _ => return Err("expected a vector operand".into()),
    };
    let mut regs = [ZERO_REG; 4];
    let mut dbits = 64u8;
    for (k, v) in vals.iter().enumerate() {
        regs[k] = if load { dst(b, v)? } else { src(b, v, Some(t))? };
        if load && k == 0 {
            dbits = b.reg_bits(regs[k]).max(t.bits) as u8;
        }
    }
    let m = Mem {
        space,
        w: t.bytes() as u8,
        n,
        signed: t.signed(),
        dbits,
        regs,
        base,
        off,
    };
    Ok(vec![if load { Op::Ld(m) } else { Op::St(m) }])
}
