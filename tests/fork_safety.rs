//! fork() after the copy engine's threads exist: the child's parallel copies
//! must work (the default start method of Python's multiprocessing on Linux).
//! Its own test binary, so that no other test's threads are in the way.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use devtensor::{DType, Device, Tensor};

/// A 16 MiB transpose and clone: far above the size where copies go parallel.
fn parallel_copies() -> bool {
    let n = 2048;
    let src = Tensor::zeros(&[n, n], DType::F32, Device::Cpu).unwrap();
    src.fill(1.5f32).unwrap();
    let t = src.transpose(0, 1).unwrap().contiguous().unwrap();
    let c = t.contiguous_copy().unwrap();
    let v = c.to_vec::<f32>().unwrap();
    v.len() == n * n && v.iter().all(|&x| x == 1.5)
}

/// Waits for `pid` up to `limit`; `None` when it is still running then.
fn wait_for(pid: libc::pid_t, limit: Duration) -> Option<libc::c_int> {
    let start = Instant::now();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid failed");
        if r == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_forked_child_copies_in_parallel_after_the_parent_did() {
    // The parent's pool threads exist now.
    assert!(parallel_copies());
    // SAFETY: the child only runs devtensor's copies, then `_exit`s without
    // unwinding into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(parallel_copies).unwrap_or(false);
        // SAFETY: ends the child at once, without running the parent's atexit work.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    match wait_for(pid, Duration::from_secs(60)) {
        Some(status) => {
            assert!(libc::WIFEXITED(status), "the child died: status {status:#x}");
            assert_eq!(libc::WEXITSTATUS(status), 0, "the child's copies were wrong");
        }
        None => {
            // SAFETY: our own child, which hangs.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            panic!("the forked child hung in its first parallel copy");
        }
    }
    // The parent's pool still works.
    assert!(parallel_copies());
}
