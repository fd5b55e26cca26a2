//! The interpreter's checks (what compute-sanitizer's memcheck, racecheck and
//! synccheck report on a GPU) and its execution model: reconvergence after
//! divergent branches, block-wide barriers across warps, shared memory poison.

mod ptx_support;

use devtensor_emu::ptx::FaultKind;
use ptx_support::*;

/// A kernel `k(u64 out, u64 in)` with %r1 = tid.x, %rd1 = out, %rd2 = in, a
/// 256-byte static shared array `sm`.
fn module(body: &str) -> String {
    format!(
        r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(
	.param .u64 k_out,
	.param .u64 k_in
)
{{
	.reg .pred 	%p<8>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<16>;
	.shared .align 8 .b8 sm[256];
	ld.param.u64 	%rd1, [k_out];
	ld.param.u64 	%rd2, [k_in];
	mov.u32 	%r1, %tid.x;
{body}
	ret;
}}
"#
    )
}

struct Run {
    mem: TestMem,
    out: u64,
    inp: u64,
}

fn setup(out_len: usize, inp: &[u8]) -> Run {
    let mut mem = TestMem::new();
    let out = mem.alloc(out_len, 0);
    let inp = mem.alloc_with(inp);
    Run { mem, out, inp }
}

fn go(body: &str, r: &Run, block: u32) -> Result<devtensor_emu::ptx::LaunchStats, devtensor_emu::ptx::KernelError> {
    let text = module(body);
    let k = kernel(&text, "k");
    let p = params(&k, &[&r.out.to_le_bytes(), &r.inp.to_le_bytes()]);
    launch(&k, &r.mem, [1, 1, 1], [block, 1, 1], &p, 1)
}

/// out[tid] = value of %r2 (u32)
const STORE_R2: &str = "\tmul.wide.u32 %rd3, %r1, 4;\n\tadd.s64 %rd4, %rd1, %rd3;\n\tst.global.u32 [%rd4], %r2;";

fn out_u32(r: &Run, n: usize) -> Vec<u32> {
    r.mem
        .read(r.out, n * 4)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn divergent_branches_reconverge() {
    // if (tid & 1) r2 = 10 else r2 = 20;  r2 += tid;  (the join runs once for the whole warp)
    let body = format!(
        "\tand.b32 %r3, %r1, 1;\n\tsetp.eq.s32 %p1, %r3, 0;\n\t@%p1 bra $L_else;\n\tmov.u32 %r2, 10;\n\tbra.uni \
         $L_join;\n$L_else:\n\tmov.u32 %r2, 20;\n$L_join:\n\tadd.s32 %r2, %r2, %r1;\n{STORE_R2}"
    );
    let r = setup(32 * 4, &[0; 8]);
    let st = go(&body, &r, 32).unwrap();
    let out = out_u32(&r, 32);
    for (t, v) in out.iter().enumerate() {
        assert_eq!(*v, if t % 2 == 1 { 10 } else { 20 } + t as u32);
    }
    // 3 param/tid + and, setp, bra; then each side: 2 (then) + 1 (else); then add + 3 store + ret
    assert_eq!(st.warp_instructions, 3 + 3 + 2 + 1 + 1 + 3 + 1);
    assert_eq!(st.global_store_requests, 1);
    assert_eq!(st.global_store_sectors, 4);
}

#[test]
fn loops_with_per_lane_trip_counts() {
    // r2 = sum_{i < tid} i, with a data-dependent loop
    let body = format!(
        "\tmov.u32 %r2, 0;\n\tmov.u32 %r3, 0;\n$L_top:\n\tsetp.ge.u32 %p1, %r3, %r1;\n\t@%p1 bra $L_done;\n\tadd.s32 \
         %r2, %r2, %r3;\n\tadd.s32 %r3, %r3, 1;\n\tbra $L_top;\n$L_done:\n{STORE_R2}"
    );
    let r = setup(40 * 4, &[0; 8]);
    go(&body, &r, 40).unwrap();
    for (t, v) in out_u32(&r, 40).iter().enumerate() {
        assert_eq!(*v as usize, t * t.saturating_sub(1) / 2);
    }
}

#[test]
fn barrier_orders_shared_memory_across_warps() {
    // sm[tid] = tid * 3; bar.sync; r2 = sm[(tid + 32) % 64]  (reads the other warp's value)
    let body = format!(
        "\tmov.u32 %r4, sm;\n\tshl.b32 %r5, %r1, 2;\n\tadd.s32 %r6, %r4, %r5;\n\tmul.lo.s32 %r7, %r1, 3;\n\tst.shared.u32 \
         [%r6], %r7;\n\tbar.sync 0;\n\tadd.s32 %r8, %r1, 32;\n\tand.b32 %r8, %r8, 63;\n\tshl.b32 %r8, %r8, 2;\n\tld.shared.u32 \
         %r2, [sm+0];\n\tadd.s32 %r9, %r4, %r8;\n\tld.shared.u32 %r2, [%r9];\n{STORE_R2}"
    );
    let r = setup(64 * 4, &[0; 8]);
    let st = go(&body, &r, 64).unwrap();
    for (t, v) in out_u32(&r, 64).iter().enumerate() {
        assert_eq!(*v as usize, ((t + 32) % 64) * 3);
    }
    assert_eq!(st.shared_requests, 2 * 3);
    assert_eq!(st.shared_bank_conflicts, 0);
}

#[test]
fn missing_barrier_is_a_shared_race() {
    // as above without bar.sync: thread 0 reads sm[32], written by thread 32 in the same interval
    let body = format!(
        "\tmov.u32 %r4, sm;\n\tshl.b32 %r5, %r1, 2;\n\tadd.s32 %r6, %r4, %r5;\n\tst.shared.u32 [%r6], %r1;\n\tadd.s32 %r8, \
         %r1, 32;\n\tand.b32 %r8, %r8, 63;\n\tshl.b32 %r8, %r8, 2;\n\tadd.s32 %r9, %r4, %r8;\n\tld.shared.u32 %r2, \
         [%r9];\n{STORE_R2}"
    );
    let r = setup(64 * 4, &[0; 8]);
    let e = go(&body, &r, 64).unwrap_err();
    assert_eq!(e.kind, FaultKind::SharedRace, "{e}");
    // warp 0 runs to its end first, so the second access is thread 32's store
    assert!(e.message.contains("st.shared.u32"), "{e}");
    assert!(
        e.message.contains("thread (32,0,0)") && e.message.contains("thread (0,0,0)"),
        "{e}"
    );
    assert!(e.message.contains("address 0x80"), "{e}");
}

#[test]
fn two_threads_writing_one_shared_word_race() {
    let body = "\tshr.u32 %r2, %r1, 1;\n\tshl.b32 %r2, %r2, 2;\n\tst.shared.u32 [%r2], %r1;";
    let r = setup(8, &[0; 8]);
    let e = go(body, &r, 2).unwrap_err();
    assert_eq!(e.kind, FaultKind::SharedRace, "{e}");
}

#[test]
fn uninitialised_shared_memory_reads_poison() {
    let body = format!("\tld.shared.u32 %r2, [sm+8];\n{STORE_R2}");
    let r = setup(4, &[0; 8]);
    go(&body, &r, 1).unwrap();
    assert_eq!(out_u32(&r, 1), [0xA5A5_A5A5]);
}

#[test]
fn shared_out_of_bounds() {
    let body = "\tmov.u32 %r2, 256;\n\tld.shared.u32 %r3, [%r2];";
    let r = setup(4, &[0; 8]);
    let e = go(body, &r, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::SharedOutOfBounds, "{e}");
    let body = "\tld.shared.u64 %rd3, [sm+252];";
    assert_eq!(go(body, &r, 1).unwrap_err().kind, FaultKind::Misaligned);
    let body = "\tld.shared.u32 %r3, [sm+252];";
    go(body, &r, 1).unwrap();
}

#[test]
fn divergent_barrier() {
    let body = "\tsetp.lt.u32 %p1, %r1, 16;\n\t@%p1 bra $L_skip;\n\tbar.sync 0;\n$L_skip:\n\tbar.sync 0;";
    let r = setup(4, &[0; 8]);
    let e = go(body, &r, 32).unwrap_err();
    assert_eq!(e.kind, FaultKind::DivergentBarrier, "{e}");
    assert!(e.message.contains("bar.sync"), "{e}");
    // a whole warp exiting early is fine: the barrier waits for live threads only
    let body = "\tsetp.lt.u32 %p1, %r1, 32;\n\t@%p1 bra $L_out;\n\tbar.sync 0;\n$L_out:\n\tret;\n$L_end:";
    go(body, &r, 64).unwrap();
}

#[test]
fn misaligned_global_access() {
    let body = "\tld.global.u32 %r2, [%rd2+2];";
    let r = setup(4, &[0; 16]);
    let e = go(body, &r, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::Misaligned, "{e}");
    assert!(e.message.contains(&format!("{:#x}", r.inp + 2)), "{e}");
    // 16-byte vectors need 16-byte alignment
    let body = "\tld.global.v4.u32 {%r2, %r3, %r4, %r5}, [%rd2+8];";
    assert_eq!(go(body, &r, 1).unwrap_err().kind, FaultKind::Misaligned);
}

#[test]
fn global_faults_come_from_the_memory() {
    let r = setup(4, &[0; 16]);
    let e = go("\tld.global.u32 %r2, [%rd2+16];", &r, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::OutOfBounds, "{e}");
    let e = go("\tmov.u64 %rd3, 64;\n\tst.global.u32 [%rd3], %r1;", &r, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::Unallocated, "{e}");
    assert!(e.message.contains("block (0,0,0) thread (0,0,0)"), "{e}");
    // lanes spread over two allocations resolve one by one
    let body = format!(
        "\tsetp.lt.u32 %p1, %r1, 16;\n\tselp.b64 %rd5, %rd1, %rd2, %p1;\n\tld.global.u8 %r2, [%rd5];\n{STORE_R2}"
    );
    let r = setup(32 * 4, &[7; 16]);
    go(&body, &r, 32).unwrap();
    let out = out_u32(&r, 32);
    assert_eq!(out[20], 7);
}

#[test]
fn non_coherent_read_of_written_bytes() {
    // reads in[tid] through the read-only path, then writes in[tid]
    let body = "\tmul.wide.u32 %rd3, %r1, 4;\n\tadd.s64 %rd4, %rd2, %rd3;\n\tld.global.nc.u32 %r2, [%rd4];\n\tst.global.u32 \
                [%rd4], %r2;";
    let r = setup(4, &[0; 128]);
    let e = go(body, &r, 32).unwrap_err();
    assert_eq!(e.kind, FaultKind::NcReadOfWritten, "{e}");
    // the coherent path is fine
    let body = body.replace(".nc", "");
    let st = go(&body, &r, 32).unwrap();
    assert_eq!(st.footprint.len(), 2);
    assert!(st.footprint.iter().all(|a| a.lo == r.inp && a.hi == r.inp + 128));
}

#[test]
fn param_space_bounds() {
    let body = "\tmov.b64 %rd3, k_in;\n\tld.param.u64 %rd4, [%rd3+8];";
    let r = setup(4, &[0; 8]);
    let e = go(body, &r, 1).unwrap_err();
    assert_eq!(e.kind, FaultKind::OutOfBounds, "{e}");
    assert!(e.message.contains("parameter"), "{e}");
}

#[test]
fn coalescing_metrics() {
    // stride-2 u32 reads: each warp touches 8 sectors for 128 requested bytes
    let body =
        format!("\tmul.wide.u32 %rd3, %r1, 8;\n\tadd.s64 %rd4, %rd2, %rd3;\n\tld.global.u32 %r2, [%rd4];\n{STORE_R2}");
    let r = setup(64 * 4, &[1; 512]);
    let st = go(&body, &r, 64).unwrap();
    assert_eq!(st.global_load_requests, 2);
    assert_eq!(st.global_load_sectors, 16);
    assert_eq!(st.global_load_bytes, 256);
    assert_eq!(st.global_store_sectors, 8);
    assert_eq!(st.lane_instructions, st.warp_instructions * 32);
    // the strided reads merge into ranges with gaps; the writes into one range
    let reads: Vec<_> = st.footprint.iter().filter(|a| !a.write).collect();
    assert_eq!(reads.len(), 64);
    assert_eq!(st.footprint.iter().filter(|a| a.write).count(), 1);
    // shared: lanes 0..31 hitting words 0, 2, 4, ... -> 2-way bank conflict
    let body = "\tshl.b32 %r2, %r1, 3;\n\tld.shared.u32 %r3, [%r2];";
    let st = go(body, &r, 32).unwrap();
    assert_eq!((st.shared_requests, st.shared_bank_conflicts), (1, 1));
}

#[test]
fn first_error_stops_a_multi_threaded_launch() {
    let text = module("\tmov.u32 %r3, %ctaid.x;\n\tsetp.eq.s32 %p1, %r3, 57;\n\t@%p1 ld.global.u32 %r2, [0];");
    let k = kernel(&text, "k");
    let r = setup(4, &[0; 8]);
    let p = params(&k, &[&r.out.to_le_bytes(), &r.inp.to_le_bytes()]);
    let e = launch(&k, &r.mem, [200, 1, 1], [32, 1, 1], &p, 4).unwrap_err();
    assert_eq!(e.kind, FaultKind::Unallocated);
    assert!(e.message.contains("block (57,0,0)"), "{e}");
}
