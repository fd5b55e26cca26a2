//! One test per supported instruction family, against the semantics the PTX ISA
//! documents (section numbers of the PTX ISA 8.x/9.x "Instruction Set" chapter
//! cited per test). Each case runs a one-thread kernel whose inputs a, b, c are
//! 64-bit parameters, available as %rd1..3, %r1..3 (low 32 bits), %h1..3 (low
//! 16 bits), %f1..3 / %fd1..3 (the same bits as f32 / f64); the body leaves its
//! result in %rd7.

mod ptx_support;

use devtensor_emu::ptx;
use ptx_support::*;

fn module(decls: &str, body: &str) -> String {
    format!(
        r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry t(
	.param .u64 t_out,
	.param .u64 t_a,
	.param .u64 t_b,
	.param .u64 t_c
)
{{
	.reg .pred 	%p<8>;
	.reg .b16 	%h<8>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<8>;
	.reg .f32 	%f<8>;
	.reg .f64 	%fd<8>;
	{decls}
	ld.param.u64 	%rd0, [t_out];
	ld.param.u64 	%rd1, [t_a];
	ld.param.u64 	%rd2, [t_b];
	ld.param.u64 	%rd3, [t_c];
	cvt.u32.u64 	%r1, %rd1;
	cvt.u32.u64 	%r2, %rd2;
	cvt.u32.u64 	%r3, %rd3;
	cvt.u16.u64 	%h1, %rd1;
	cvt.u16.u64 	%h2, %rd2;
	cvt.u16.u64 	%h3, %rd3;
	mov.b32 	%f1, %r1;
	mov.b32 	%f2, %r2;
	mov.b32 	%f3, %r3;
	mov.b64 	%fd1, %rd1;
	mov.b64 	%fd2, %rd2;
	mov.b64 	%fd3, %rd3;
	mov.u64 	%rd7, 0;
	{body}
	st.global.u64 	[%rd0], %rd7;
	ret;
}}
"#
    )
}

fn eval(body: &str, a: u64, b: u64, c: u64) -> u64 {
    let k = kernel(&module("", body), "t");
    let mut mem = TestMem::new();
    let out = mem.alloc(8, 0);
    let p = params(
        &k,
        &[&out.to_le_bytes(), &a.to_le_bytes(), &b.to_le_bytes(), &c.to_le_bytes()],
    );
    launch(&k, &mem, [1, 1, 1], [1, 1, 1], &p, 1).unwrap_or_else(|e| panic!("{body}: {e}"));
    u64::from_le_bytes(mem.read(out, 8).try_into().unwrap())
}

/// A 32-bit result in %r7.
fn r32(ins: &str, a: u64, b: u64, c: u64) -> u32 {
    eval(&format!("{ins}\n\tcvt.u64.u32 %rd7, %r7;"), a, b, c) as u32
}
/// A 16-bit result in %h7.
fn r16(ins: &str, a: u64, b: u64, c: u64) -> u16 {
    eval(&format!("{ins}\n\tcvt.u64.u16 %rd7, %h7;"), a, b, c) as u16
}
/// A predicate result in %p7.
fn rp(ins: &str, a: u64, b: u64, c: u64) -> bool {
    eval(&format!("{ins}\n\tselp.u64 %rd7, 1, 0, %p7;"), a, b, c) != 0
}
/// An f32 result in %f7.
fn rf(ins: &str, a: f32, b: f32, c: f32) -> f32 {
    let v = eval(
        &format!("{ins}\n\tmov.b32 %r7, %f7;\n\tcvt.u64.u32 %rd7, %r7;"),
        a.to_bits() as u64,
        b.to_bits() as u64,
        c.to_bits() as u64,
    );
    f32::from_bits(v as u32)
}

const M32: u64 = 0xffff_ffff;
fn n32(x: i32) -> u64 {
    x as u32 as u64
}

#[test]
fn add_sub() {
    // §9.7.1.1 add, §9.7.1.2 sub: wrapping at the type's width.
    assert_eq!(r32("add.s32 %r7, %r1, %r2;", M32, 2, 0), 1);
    assert_eq!(r32("add.u32 %r7, %r1, -1;", 5, 0, 0), 4);
    assert_eq!(r32("sub.s32 %r7, %r1, %r2;", 1, 3, 0), n32(-2) as u32);
    assert_eq!(eval("add.s64 %rd7, %rd1, %rd2;", u64::MAX, 3, 0), 2);
    assert_eq!(eval("sub.s64 %rd7, %rd1, %rd2;", 0, 1, 0), u64::MAX);
    assert_eq!(eval("add.u64 %rd7, %rd1, -92;", 100, 0, 0), 8);
    assert_eq!(r16("add.u16 %h7, %h1, %h2;", 0xffff, 2, 0), 1);
    assert_eq!(r16("sub.s16 %h7, %h1, %h2;", 0, 1, 0), 0xffff);
}

#[test]
fn mul_mad() {
    // §9.7.1.3 mul.{lo,hi,wide}, §9.7.1.4 mad.{lo,hi,wide}.
    assert_eq!(r32("mul.lo.s32 %r7, %r1, %r2;", 0x10000, 0x10001, 0), 0x10000);
    assert_eq!(r32("mul.hi.u32 %r7, %r1, %r2;", M32, M32, 0), 0xffff_fffe);
    assert_eq!(r32("mul.hi.s32 %r7, %r1, %r2;", n32(-2), 0x8000_0000, 0), 1);
    assert_eq!(eval("mul.wide.u32 %rd7, %r1, %r2;", M32, M32, 0), 0xffff_fffe_0000_0001);
    assert_eq!(eval("mul.wide.s32 %rd7, %r1, %r2;", n32(-3), 4, 0), (-12i64) as u64);
    assert_eq!(eval("mul.wide.s32 %rd7, %r1, 4;", n32(-1), 0, 0), (-4i64) as u64);
    assert_eq!(eval("mul.lo.s64 %rd7, %rd1, %rd2;", u64::MAX, 3, 0), (-3i64) as u64);
    assert_eq!(
        eval("mul.hi.u64 %rd7, %rd1, %rd2;", u64::MAX, u64::MAX, 0),
        u64::MAX - 1
    );
    assert_eq!(eval("mul.hi.s64 %rd7, %rd1, %rd2;", (-1i64) as u64, 5, 0), u64::MAX);
    assert_eq!(r32("mad.lo.s32 %r7, %r1, %r2, %r3;", 3, 4, n32(-20)), n32(-8) as u32);
    assert_eq!(eval("mad.lo.s64 %rd7, %rd1, %rd2, %rd3;", 1 << 40, 3, 7), (3 << 40) + 7);
    assert_eq!(r32("mad.hi.u32 %r7, %r1, %r2, %r3;", M32, 2, 5), 6);
    assert_eq!(
        eval("mad.wide.u32 %rd7, %r1, %r2, %rd3;", M32, 2, 10),
        0x1_ffff_fffe + 10
    );
    assert_eq!(eval("mad.wide.s32 %rd7, %r1, %r2, %rd3;", n32(-1), 2, 1), u64::MAX);
    assert_eq!(
        r16("mul.wide.u16 %r7, %h1, %h2;\n\tcvt.u16.u32 %h7, %r7;", 0x100, 0x100, 0),
        0
    );
    assert_eq!(r32("mul.wide.u16 %r7, %h1, %h2;", 0xffff, 0xffff, 0), 0xfffe_0001);
}

#[test]
fn div_rem() {
    // §9.7.1.8 div, §9.7.1.9 rem: truncating; by zero the result is unspecified —
    // the emulator returns all ones for div and the dividend for rem.
    assert_eq!(r32("div.u32 %r7, %r1, %r2;", 100, 7, 0), 14);
    assert_eq!(r32("rem.u32 %r7, %r1, %r2;", 100, 7, 0), 2);
    assert_eq!(r32("div.s32 %r7, %r1, %r2;", n32(-7), 2, 0), n32(-3) as u32);
    assert_eq!(r32("rem.s32 %r7, %r1, %r2;", n32(-7), 2, 0), n32(-1) as u32);
    assert_eq!(eval("div.u64 %rd7, %rd1, %rd2;", u64::MAX, 2, 0), u64::MAX / 2);
    assert_eq!(eval("rem.u64 %rd7, %rd1, %rd2;", u64::MAX, 10, 0), u64::MAX % 10);
    assert_eq!(eval("div.s64 %rd7, %rd1, %rd2;", (-9i64) as u64, 4, 0), (-2i64) as u64);
    assert_eq!(r32("div.u32 %r7, %r1, %r2;", 5, 0, 0), u32::MAX);
    assert_eq!(r32("rem.u32 %r7, %r1, %r2;", 5, 0, 0), 5);
    assert_eq!(eval("div.u64 %rd7, %rd1, %rd2;", 5, 0, 0), u64::MAX);
    assert_eq!(r32("div.s32 %r7, %r1, %r2;", 0x8000_0000, M32, 0), 0x8000_0000);
}

#[test]
fn min_max_abs_neg() {
    // §9.7.1.12 min, §9.7.1.13 max, §9.7.1.10 abs, §9.7.1.11 neg.
    assert_eq!(r32("max.s32 %r7, %r1, 1;", n32(-5), 0, 0), 1);
    assert_eq!(r32("max.u32 %r7, %r1, 1;", n32(-5), 0, 0), n32(-5) as u32);
    assert_eq!(r32("min.s32 %r7, %r1, %r2;", n32(-5), 3, 0), n32(-5) as u32);
    assert_eq!(eval("min.u64 %rd7, %rd1, %rd2;", u64::MAX, 3, 0), 3);
    assert_eq!(eval("max.s64 %rd7, %rd1, %rd2;", u64::MAX, 3, 0), 3);
    assert_eq!(r32("abs.s32 %r7, %r1;", n32(-5), 0, 0), 5);
    assert_eq!(r32("abs.s32 %r7, %r1;", 0x8000_0000, 0, 0), 0x8000_0000);
    assert_eq!(r32("neg.s32 %r7, %r1;", 5, 0, 0), n32(-5) as u32);
    assert_eq!(eval("neg.s64 %rd7, %rd1;", 1, 0, 0), u64::MAX);
}

#[test]
fn bitwise_and_shifts() {
    // §9.7.8.1-4 and/or/xor/not, §9.7.8.6 shl, §9.7.8.7 shr (amounts >= width clamp).
    assert_eq!(r32("and.b32 %r7, %r1, 3;", 0xff, 0, 0), 3);
    assert_eq!(r32("or.b32 %r7, %r1, %r2;", 0xf0, 0x0f, 0), 0xff);
    assert_eq!(r32("xor.b32 %r7, %r1, %r2;", 0xff, 0x0f, 0), 0xf0);
    assert_eq!(r32("not.b32 %r7, %r1;", 0, 0, 0), u32::MAX);
    assert_eq!(eval("and.b64 %rd7, %rd1, %rd2;", u64::MAX, 1 << 40, 0), 1 << 40);
    assert_eq!(eval("or.b64 %rd7, %rd1, %rd2;", 1 << 40, 1, 0), (1 << 40) | 1);
    assert_eq!(eval("not.b64 %rd7, %rd1;", 0, 0, 0), u64::MAX);
    assert_eq!(r16("and.b16 %h7, %h1, %h2;", 0xff0f, 0x0fff, 0), 0x0f0f);
    assert_eq!(r32("shl.b32 %r7, %r1, 4;", 0x1234_5678, 0, 0), 0x2345_6780);
    assert_eq!(r32("shl.b32 %r7, %r1, %r2;", 1, 32, 0), 0);
    assert_eq!(eval("shl.b64 %rd7, %rd1, 40;", 1, 0, 0), 1 << 40);
    assert_eq!(r32("shr.u32 %r7, %r1, %r2;", 0x8000_0000, 31, 0), 1);
    assert_eq!(r32("shr.u32 %r7, %r1, %r2;", 0x8000_0000, 40, 0), 0);
    assert_eq!(r32("shr.s32 %r7, %r1, %r2;", 0x8000_0000, 31, 0), u32::MAX);
    assert_eq!(r32("shr.s32 %r7, %r1, %r2;", 0x8000_0000, 99, 0), u32::MAX);
    assert_eq!(r32("shr.b32 %r7, %r1, 4;", 0x8000_0000, 0, 0), 0x0800_0000);
    assert_eq!(eval("shr.s64 %rd7, %rd1, 63;", 1 << 63, 0, 0), u64::MAX);
    assert_eq!(eval("shr.u64 %rd7, %rd1, 63;", 1 << 63, 0, 0), 1);
    // §9.7.1.15 popc, §9.7.1.16 clz, §9.7.1.19 brev
    assert_eq!(r32("popc.b32 %r7, %r1;", 0xf0f0, 0, 0), 8);
    assert_eq!(r32("clz.b32 %r7, %r1;", 1, 0, 0), 31);
    assert_eq!(r32("clz.b64 %r7, %rd1;", 1, 0, 0), 63);
    assert_eq!(r32("brev.b32 %r7, %r1;", 1, 0, 0), 0x8000_0000);
    // §9.7.9.7 prmt, generic form: {b, a} bytes 0..7, a nibble of c per
    // byte of d, its msb replicating the selected byte's sign.
    let (a, b) = (0x8302_0100u64, 0x0706_0584u64);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, %r3;", a, b, 0x3210), 0x8302_0100);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, %r3;", a, b, 0x7654), 0x0706_0584);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, %r3;", a, b, 0x0516), 0x0005_0106);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, 0x7531;", a, b, 0), 0x0705_8301);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, %r3;", a, b, 0xcb98), 0xffff_0000);
    assert_eq!(r32("prmt.b32 %r7, %r1, %r2, %r3;", a, b, 0xb8cf), 0xff00_ff00);
}

#[test]
fn predicates() {
    // §9.7.8 and/or/xor/not on .pred, §9.7.7.2 selp.
    let pre = "setp.ne.u64 %p1, %rd1, 0;\n\tsetp.ne.u64 %p2, %rd2, 0;\n\t";
    for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        assert_eq!(rp(&format!("{pre}and.pred %p7, %p1, %p2;"), a, b, 0), a & b == 1);
        assert_eq!(rp(&format!("{pre}or.pred %p7, %p1, %p2;"), a, b, 0), a | b == 1);
        assert_eq!(rp(&format!("{pre}xor.pred %p7, %p1, %p2;"), a, b, 0), a ^ b == 1);
        assert_eq!(rp(&format!("{pre}not.pred %p7, %p1;"), a, b, 0), a == 0);
        assert_eq!(rp(&format!("{pre}mov.pred %p7, %p2;"), a, b, 0), b == 1);
    }
    assert_eq!(
        r32("setp.ne.u64 %p1, %rd3, 0;\n\tselp.b32 %r7, %r1, %r2, %p1;", 7, 9, 1),
        7
    );
    assert_eq!(
        r32("setp.ne.u64 %p1, %rd3, 0;\n\tselp.b32 %r7, %r1, %r2, %p1;", 7, 9, 0),
        9
    );
    assert_eq!(
        eval("setp.ne.u64 %p1, %rd3, 0;\n\tselp.s64 %rd7, -1, 2, %p1;", 0, 0, 1),
        u64::MAX
    );
    assert_eq!(
        r32(
            "setp.ne.u64 %p1, %rd3, 0;\n\tselp.f32 %f7, %f1, %f2, %p1;\n\tmov.b32 %r7, %f7;",
            1,
            2,
            0
        ),
        2
    );
    // setp with two destinations: p = cmp, q = !cmp
    assert!(rp("setp.lt.s32 %p6|%p7, %r1, %r2;", 5, 3, 0));
}

#[test]
fn setp_integer_comparisons() {
    // §9.7.7.1 setp: signed compares for .s, unsigned for .u (and lo/ls/hi/hs), eq/ne for .b.
    let m1 = n32(-1);
    let cases: [(&str, u64, u64, bool); 26] = [
        ("eq.s32", 3, 3, true),
        ("ne.s32", 3, 3, false),
        ("lt.s32", m1, 0, true),
        ("le.s32", 0, 0, true),
        ("gt.s32", m1, 0, false),
        ("ge.s32", 0, m1, true),
        ("lt.u32", m1, 0, false),
        ("le.u32", 1, 0, false),
        ("gt.u32", m1, 0, true),
        ("ge.u32", 0, m1, false),
        ("lo.u32", 0, 1, true),
        ("ls.u32", 1, 1, true),
        ("hi.u32", 2, 1, true),
        ("hs.u32", 0, 1, false),
        ("eq.b32", 5, 5, true),
        ("ne.b32", 5, 6, true),
        ("eq.s64", u64::MAX, u64::MAX, true),
        ("ne.s64", 1, 2, true),
        ("lt.s64", u64::MAX, 0, true),
        ("gt.s64", u64::MAX, 0, false),
        ("lt.u64", u64::MAX, 0, false),
        ("ge.u64", u64::MAX, 0, true),
        ("le.u64", 7, 7, true),
        ("gt.u64", 8, 7, true),
        ("ne.b64", 1 << 40, 1 << 41, true),
        ("eq.b64", 1 << 40, 1 << 40, true),
    ];
    for (op, a, b, want) in cases {
        let (r1, r2) = if op.ends_with("64") {
            ("%rd1", "%rd2")
        } else {
            ("%r1", "%r2")
        };
        assert_eq!(
            rp(&format!("setp.{op} %p7, {r1}, {r2};"), a, b, 0),
            want,
            "setp.{op} {a:#x} {b:#x}"
        );
    }
    assert!(rp("setp.lt.u16 %p7, %h1, %h2;", 1, 0xffff, 0));
    assert!(!rp("setp.lt.s16 %p7, %h1, %h2;", 1, 0xffff, 0));
}

#[test]
fn integer_conversions() {
    // §9.7.9.21 cvt between integer types: extend per the source type, truncate to the destination.
    assert_eq!(eval("cvt.s64.s32 %rd7, %r1;", n32(-2), 0, 0), (-2i64) as u64);
    assert_eq!(eval("cvt.u64.u32 %rd7, %r1;", n32(-2), 0, 0), 0xffff_fffe);
    assert_eq!(r32("cvt.u32.u64 %r7, %rd1;", 0x1_2345_6789, 0, 0), 0x2345_6789);
    assert_eq!(r16("cvt.u16.u8 %h7, %h1;", 0x1ff, 0, 0), 0xff);
    assert_eq!(r16("cvt.s16.s8 %h7, %h1;", 0x80, 0, 0), 0xff80);
    assert_eq!(r32("cvt.s32.s16 %r7, %h1;", 0x8000, 0, 0), 0xffff_8000);
    assert_eq!(r32("cvt.u32.u16 %r7, %h1;", 0x8000, 0, 0), 0x8000);
    assert_eq!(r16("cvt.u16.u32 %h7, %r1;", 0x12345, 0, 0), 0x2345);
    assert_eq!(eval("cvt.s64.s8 %rd7, %rd1;", 0xff, 0, 0), u64::MAX);
}

#[test]
fn moves_and_cvta() {
    // §9.7.9.3 mov (registers, immediates, special registers, packing), §9.7.9.19 cvta.
    assert_eq!(r32("mov.u32 %r7, %r1;", 42, 0, 0), 42);
    assert_eq!(r32("mov.b32 %r7, 0x7fffffff;", 0, 0, 0), 0x7fff_ffff);
    assert_eq!(eval("mov.u64 %rd7, %rd1;", u64::MAX, 0, 0), u64::MAX);
    assert_eq!(r32("mov.u32 %r7, %tid.x;", 0, 0, 0), 0);
    assert_eq!(r32("mov.u32 %r7, %ntid.x;", 0, 0, 0), 1);
    assert_eq!(r32("mov.u32 %r7, %nctaid.x;", 0, 0, 0), 1);
    assert_eq!(r32("mov.u32 %r7, %ctaid.y;", 0, 0, 0), 0);
    assert_eq!(r32("mov.b32 %r7, {%h1, %h2};", 0x1111, 0x2222, 0), 0x2222_1111);
    assert_eq!(eval("mov.b64 %rd7, {%r1, %r2};", 0x1111, 0x2222, 0), 0x2222_0000_1111);
    assert_eq!(r16("mov.b32 {%h6, %h7}, %r1;", 0xaaaa_bbbb, 0, 0), 0xaaaa);
    assert_eq!(r16("mov.b32 {%h7, %h6}, %r1;", 0xaaaa_bbbb, 0, 0), 0xbbbb);
    assert_eq!(r32("mov.b64 {%r6, %r7}, %rd1;", 0x1_0000_0002, 0, 0), 1);
    assert_eq!(eval("cvta.to.global.u64 %rd7, %rd1;", 0x1234, 0, 0), 0x1234);
    assert_eq!(eval("cvta.global.u64 %rd7, %rd1;", 0x1234, 0, 0), 0x1234);
    // generic <-> shared window round trip
    assert_eq!(
        eval(
            "cvta.shared.u64 %rd6, %rd1;\n\tcvta.to.shared.u64 %rd7, %rd6;",
            0x40,
            0,
            0
        ),
        0x40
    );
    // the address of a parameter, then ld.param through it with negative offsets
    assert_eq!(
        eval("mov.b64 %rd6, t_c;\n\tld.param.u64 %rd7, [%rd6+-8];", 1, 77, 3),
        77
    );
    assert_eq!(
        eval(
            "mov.u64 %rd6, t_b;\n\tld.param.u32 %r7, [%rd6+4];\n\tcvt.u64.u32 %rd7, %r7;",
            0,
            5 << 32,
            0
        ),
        5
    );
}

#[test]
fn float_arithmetic() {
    // §9.7.3.1 add, .2 sub, .3 mul, .4 fma (single rounding), .8 div, .9 abs, .10 neg,
    // .11 min, .12 max, .13 rcp, .14 sqrt; NaN results canonical (0x7fffffff).
    assert_eq!(rf("add.f32 %f7, %f1, %f2;", 1.5, 2.25, 0.0), 3.75);
    assert_eq!(rf("add.rn.f32 %f7, %f1, %f2;", 0.1, 0.2, 0.0), 0.1f32 + 0.2f32);
    assert_eq!(rf("sub.f32 %f7, %f1, %f2;", 1.0, 3.0, 0.0), -2.0);
    assert_eq!(rf("mul.rn.f32 %f7, %f1, %f2;", 1.5, -4.0, 0.0), -6.0);
    let (a, b, c) = (1.0f32 + f32::EPSILON, 1.0f32 - f32::EPSILON, -1.0f32);
    assert_eq!(rf("fma.rn.f32 %f7, %f1, %f2, %f3;", a, b, c), a.mul_add(b, c));
    assert_ne!(a.mul_add(b, c), a * b + c); // fma really is fused
    assert_eq!(rf("mad.rn.f32 %f7, %f1, %f2, %f3;", a, b, c), a.mul_add(b, c));
    assert_eq!(rf("fma.rn.f32 %f7, %f1, 0f3F000000, %f2;", 3.0, 1.0, 0.0), 2.5);
    assert_eq!(rf("div.rn.f32 %f7, %f1, %f2;", 1.0, 3.0, 0.0), 1.0 / 3.0);
    assert_eq!(rf("abs.f32 %f7, %f1;", -2.5, 0.0, 0.0), 2.5);
    assert_eq!(rf("neg.f32 %f7, %f1;", 2.5, 0.0, 0.0), -2.5);
    assert_eq!(rf("min.f32 %f7, %f1, %f2;", f32::NAN, 2.0, 0.0), 2.0);
    assert_eq!(rf("max.f32 %f7, %f1, %f2;", -1.0, 2.0, 0.0), 2.0);
    assert_eq!(rf("sqrt.rn.f32 %f7, %f1;", 2.0, 0.0, 0.0), 2f32.sqrt());
    assert_eq!(rf("rcp.rn.f32 %f7, %f1;", 4.0, 0.0, 0.0), 0.25);
    assert_eq!(
        rf("sub.f32 %f7, %f1, %f2;", f32::INFINITY, f32::INFINITY, 0.0).to_bits(),
        0x7fff_ffff
    );
    // .ftz: subnormal inputs and results flush to zero
    let sub = f32::from_bits(1);
    assert_eq!(rf("add.ftz.f32 %f7, %f1, %f2;", sub, 0.0, 0.0).to_bits(), 0);
    assert_eq!(rf("add.f32 %f7, %f1, %f2;", sub, 0.0, 0.0).to_bits(), 1);
    // f64
    let d = |x: f64| x.to_bits();
    assert_eq!(
        eval("add.f64 %fd7, %fd1, %fd2;\n\tmov.b64 %rd7, %fd7;", d(0.1), d(0.2), 0),
        d(0.1 + 0.2)
    );
    assert_eq!(
        eval(
            "fma.rn.f64 %fd7, %fd1, %fd2, %fd3;\n\tmov.b64 %rd7, %fd7;",
            d(1.5),
            d(2.0),
            d(0.25)
        ),
        d(3.25)
    );
    assert_eq!(
        eval("neg.f64 %fd7, %fd1;\n\tmov.b64 %rd7, %fd7;", d(1.0), 0, 0),
        d(-1.0)
    );
}

#[test]
fn half_arithmetic() {
    // §9.7.4.1 add, .2 sub, .3 mul, .4 fma (.rn), .5 neg, .6 abs on .f16 / .bf16.
    let one = 0x3c00u64;
    let two = 0x4000u64;
    assert_eq!(r16("add.f16 %h7, %h1, %h2;", one, two, 0), 0x4200); // 3.0
    assert_eq!(r16("add.rn.f16 %h7, %h1, %h2;", one, two, 0), 0x4200);
    assert_eq!(r16("sub.f16 %h7, %h1, %h2;", one, two, 0), 0xbc00); // -1.0
    assert_eq!(r16("mul.f16 %h7, %h1, %h2;", 0x4200, two, 0), 0x4600); // 6.0
    assert_eq!(r16("fma.rn.f16 %h7, %h1, %h2, %h3;", two, two, one), 0x4500); // 5.0
    assert_eq!(r16("neg.f16 %h7, %h1;", one, 0, 0), 0xbc00);
    assert_eq!(r16("abs.f16 %h7, %h1;", 0xbc00, 0, 0), 0x3c00);
    assert_eq!(r16("mul.f16 %h7, %h1, %h2;", 0x7bff, two, 0), 0x7c00); // overflow -> inf
    // bf16: 1.0 = 0x3f80, 2.0 = 0x4000
    assert_eq!(r16("add.bf16 %h7, %h1, %h2;", 0x3f80, 0x4000, 0), 0x4040);
    assert_eq!(r16("fma.rn.bf16 %h7, %h1, %h2, %h3;", 0x4000, 0x4000, 0x3f80), 0x40a0);
    assert_eq!(r16("mul.rn.bf16 %h7, %h1, %h2;", 0x3fc0, 0x3fc0, 0), 0x4010); // 1.5 * 1.5 = 2.25
    assert_eq!(r16("neg.bf16 %h7, %h1;", 0x3f80, 0, 0), 0xbf80);
}

#[test]
fn float_conversions_and_compares() {
    // §9.7.9.21 cvt: f16/bf16 <-> f32 (widening exact, narrowing per .rn/.rz/.rm/.rp),
    // float <-> integer (.rni/.rzi/.rmi/.rpi, saturating, NaN -> 0).
    let h = |ins: &str, x: f32| r16(ins, x.to_bits() as u64, 0, 0);
    assert_eq!(h("cvt.rn.f16.f32 %h7, %f1;", 1.0), 0x3c00);
    assert_eq!(h("cvt.rn.f16.f32 %h7, %f1;", 1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(h("cvt.rp.f16.f32 %h7, %f1;", 1.0 + 2f32.powi(-11)), 0x3c01);
    assert_eq!(h("cvt.rz.f16.f32 %h7, %f1;", 1e6), 0x7bff);
    assert_eq!(h("cvt.rn.f16.f32 %h7, %f1;", 1e6), 0x7c00);
    assert_eq!(h("cvt.rm.f16.f32 %h7, %f1;", -1.0 - 2f32.powi(-12)), 0xbc01);
    assert_eq!(h("cvt.rn.bf16.f32 %h7, %f1;", 1.0 + 2f32.powi(-9)), 0x3f80);
    assert_eq!(h("cvt.rn.bf16.f32 %h7, %f1;", 1.0 + 3.0 * 2f32.powi(-9)), 0x3f81);
    assert_eq!(h("cvt.rz.bf16.f32 %h7, %f1;", 1.0 + 3.0 * 2f32.powi(-9)), 0x3f80);
    assert_eq!(
        rf("cvt.f32.f16 %f7, %h1;", f32::from_bits(0x3555), 0.0, 0.0),
        0.333_251_95
    );
    assert_eq!(rf("cvt.f32.bf16 %f7, %h1;", f32::from_bits(0x3fc0), 0.0, 0.0), 1.5);
    assert_eq!(
        rf("cvt.rn.f32.s32 %f7, %r1;", f32::from_bits(n32(-3) as u32), 0.0, 0.0),
        -3.0
    );
    assert_eq!(
        rf("cvt.rn.f32.u32 %f7, %r1;", f32::from_bits(u32::MAX), 0.0, 0.0),
        4294967296.0
    );
    assert_eq!(
        rf("cvt.rz.f32.u32 %f7, %r1;", f32::from_bits(u32::MAX), 0.0, 0.0),
        4294967040.0
    );
    assert_eq!(
        rf("cvt.rn.f32.u64 %f7, %rd1;", f32::from_bits(16777217), 0.0, 0.0),
        16777216.0
    );
    assert_eq!(rf("cvt.rn.f32.f64 %f7, %fd1;", f32::from_bits(0), 0.0, 0.0), 0.0);
    let f2i = |ins: &str, x: f32| r32(ins, x.to_bits() as u64, 0, 0);
    assert_eq!(f2i("cvt.rzi.s32.f32 %r7, %f1;", -2.7), n32(-2) as u32);
    assert_eq!(f2i("cvt.rni.s32.f32 %r7, %f1;", 2.5), 2);
    assert_eq!(f2i("cvt.rmi.s32.f32 %r7, %f1;", -2.5), n32(-3) as u32);
    assert_eq!(f2i("cvt.rpi.u32.f32 %r7, %f1;", 2.1), 3);
    assert_eq!(f2i("cvt.rzi.u32.f32 %r7, %f1;", -5.0), 0);
    assert_eq!(f2i("cvt.rzi.s32.f32 %r7, %f1;", 1e20), i32::MAX as u32);
    assert_eq!(f2i("cvt.rzi.s32.f32 %r7, %f1;", f32::NAN), 0);
    assert_eq!(rf("cvt.rmi.f32.f32 %f7, %f1;", -1.5, 0.0, 0.0), -2.0);
    let d = |x: f64| x.to_bits();
    assert_eq!(
        eval(
            "cvt.f64.f32 %fd7, %f1;\n\tmov.b64 %rd7, %fd7;",
            0.5f32.to_bits() as u64,
            0,
            0
        ),
        d(0.5)
    );
    // §9.7.7.1 setp (float): ordered comparisons false on NaN, `u` forms true.
    let fp = |op: &str, a: f32, b: f32| {
        rp(
            &format!("setp.{op}.f32 %p7, %f1, %f2;"),
            a.to_bits() as u64,
            b.to_bits() as u64,
            0,
        )
    };
    assert!(fp("lt", 1.0, 2.0));
    assert!(!fp("lt", f32::NAN, 2.0));
    assert!(fp("ltu", f32::NAN, 2.0));
    assert!(!fp("eq", f32::NAN, f32::NAN));
    assert!(fp("nan", f32::NAN, 1.0));
    assert!(fp("num", 0.0, 1.0));
    assert!(fp("ge", 2.0, 2.0));
    assert!(fp("neu", 1.0, 2.0));
    assert!(rp("setp.gt.f16 %p7, %h1, %h2;", 0x4000, 0x3c00, 0));
}

#[test]
fn strict_parser_rejects_unknown_forms_with_their_line() {
    let cases = [
        (
            "add.sat.s32 %r7, %r1, %r2;",
            "unsupported instruction form `add.sat.s32`",
        ),
        ("frobnicate.b32 %r7, %r1;", "unsupported instruction form"),
        ("add.s32 %r7, %r1;", "expected 3 operands"),
        ("add.s32 %r7, %r1, %q2;", "unknown operand `%q2`"),
        ("bra $L_nowhere;", "unknown label"),
        ("ld.shared.nc.u32 %r7, [%rd1];", "unsupported instruction form"),
        ("st.param.u32 [t_a], %r1;", "unsupported instruction form"),
        ("setp.lt.b32 %p7, %r1, %r2;", "unsupported instruction form"),
        ("cvt.f16.f32 %h7, %f1;", "unsupported instruction form"),
        ("cvt.rn.s32.f32 %r7, %f1;", "unsupported instruction form"),
        ("add.rz.f32 %f7, %f1, %f2;", "unsupported instruction form"),
        ("bar.sync 1;", "only barrier 0"),
        ("ld.global.v8.u32 %r7, [%rd1];", "unsupported instruction form"),
        ("atom.global.add.u32 %r7, [%rd1], 1;", "unsupported instruction form"),
    ];
    for (ins, want) in cases {
        let text = module("", &format!("mov.u32 %r7, 0;\n{ins}"));
        let e = ptx::parse(&text).expect_err(ins);
        let line = text.lines().position(|l| l.contains(ins)).unwrap() + 1;
        assert_eq!(e.line, line, "{ins}: {e}");
        assert!(e.to_string().contains(want), "{ins}: {e}");
        assert!(e.to_string().contains(ins.trim_end_matches(';')), "{ins}: {e}");
    }
    let func = ".version 8.0\n.target sm_80\n.address_size 64\n.func f()\n{\n ret;\n}\n";
    let e = ptx::parse(func).unwrap_err();
    assert_eq!(e.line, 4);
    assert!(e.reason.contains(".func"), "{e}");
    let ext = module(".shared .align 4 .b8 dyn[];", "");
    assert!(ptx::parse(&ext).unwrap_err().reason.contains("dynamic"));
}

#[test]
fn directives_and_declarations() {
    let text = r#"
.version 9.0
.target sm_90a
.address_size 64
	// .globl k
.weak .entry k(
	.param .align 16 .b8 k_param_0[352],
	.param .u8 k_param_1
)
.maxntid 256, 1, 1
.minnctapersm 2
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<2>;
	.reg .pred 	%p;
	.shared .align 4 .b8 smem[100];
	.shared .align 16 .b8 smem2[16];
	/* a block
	   comment */
	.pragma "nounroll";
	{
	.reg .b32 inner;
	mov.u32 inner, 1;
	}
$L__BB0_1:
	@!%p bra.uni 	$L__BB0_1;
	exit;
}
"#;
    let m = ptx::parse(text).unwrap();
    let k = m.kernel("k").unwrap();
    assert_eq!(k.params.len(), 2);
    assert_eq!((k.params[0].offset, k.params[0].size, k.params[0].align), (0, 352, 16));
    assert_eq!((k.params[1].offset, k.params[1].size), (352, 1));
    assert_eq!(k.param_bytes, 353);
    assert_eq!(k.shared_bytes, 112 + 16);
    assert_eq!(k.maxntid, Some([256, 1, 1]));
    assert!(m.kernel("nope").is_none());
}
