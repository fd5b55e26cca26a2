//! Interpreter speed on copy_strided_e4 (NVRTC 13, compute_90) over 4 Mi
//! elements with a trivial global memory, on one host thread. Prints the
//! lane-instructions per second of thread CPU time (a launch with one host
//! thread runs on the caller's thread, so other processes sharing the machine
//! do not skew it) and the ratio to the goal of 1e8 per core.
//!
//!     cargo bench -p devtensor-emu --bench ptx_speed

#[path = "../tests/ptx_support/mod.rs"]
mod ptx_support; // (the module allows its own dead code)

use std::time::Instant;

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for clock_gettime.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

use ptx_support::*;

fn magic(d: u32) -> [u32; 3] {
    let shift = 32 - (d - 1).leading_zeros();
    let mul = (((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1) as u32;
    [mul, shift, d]
}

fn main() {
    let (_, text) = &fixtures("strided_copy_nvrtc13_sm90")[0];
    let m = devtensor_emu::ptx::parse(text).unwrap();
    let k = m.kernel("copy_strided_e4").unwrap();
    let n = 2048u32;
    let numel = (n * n) as usize;
    let mut args = Vec::new();
    args.extend((n * n).to_le_bytes());
    args.extend(2i32.to_le_bytes());
    for d in 0..16 {
        for v in magic(if d < 2 { n } else { 1 }) {
            args.extend(v.to_le_bytes());
        }
    }
    for s in [[n as i32, 1], [1, n as i32]] {
        for d in 0..16 {
            args.extend(s.get(d).copied().unwrap_or(0).to_le_bytes());
        }
    }
    let mut mem = TestMem::new();
    let src: Vec<u8> = (0..numel as u32).flat_map(|i| i.to_le_bytes()).collect();
    let s = mem.alloc_with(&src);
    let d = mem.alloc(numel * 4, 0);
    let p = params(k, &[&s.to_le_bytes(), &d.to_le_bytes(), &args]);
    let block = 256u32;
    let grid = (numel as u32).div_ceil(block * 4);
    let t = Instant::now();
    let cpu = thread_cpu_seconds();
    let st = launch(k, &mem, [grid, 1, 1], [block, 1, 1], &p, 1).unwrap();
    let secs = thread_cpu_seconds() - cpu;
    let wall = t.elapsed().as_secs_f64();
    let rate = st.lane_instructions as f64 / secs;
    println!(
        "copy_strided_e4, {numel} elements, 1 host thread: {} lane-instructions ({} warp) in {secs:.3} s of CPU \
         ({wall:.3} s wall) = {rate:.3e} lane-instructions/s",
        st.lane_instructions, st.warp_instructions
    );
    let out = mem.read(d, numel * 4);
    for i in [0usize, 1, 2047, 2048, 12345, numel - 1] {
        let (r, c) = (i % n as usize, i / n as usize); // dst index i = r + c * n, src = r * n + c
        let v = u32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(v as usize, r * n as usize + c);
    }
    println!("{:.2}x the goal of 1e8 lane-instructions/s per core", rate / 1e8);
}
