//! What the driver tests share: a current context, and running one test of
//! the binary alone in a child process (for errors that are sticky for the
//! context, and for faults that kill the process).

use std::ptr::null_mut;

use devtensor_emu::driver::context::*;
use devtensor_emu::driver::*;

/// Initialises the driver and makes device 0's primary context current.
pub fn setup() -> Handle {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        assert_eq!(devtensor_emu::driver::device::cuInit(0), CUDA_SUCCESS);
        let mut ctx = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        ctx
    }
}

/// Runs this test binary's test `name` alone in a child process with `env`;
/// returns (exit status, stderr).
pub fn child(name: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("EMU_CHILD", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// True in the child process `child` started.
pub fn in_child() -> bool {
    std::env::var_os("EMU_CHILD").is_some()
}
