//! The `devtensor` command as a user runs it: its output piped into another
//! command, and arguments it must refuse.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn devtensor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_devtensor"))
}

/// `devtensor bench --list | head -0`: the reader has closed the pipe before
/// the command writes, and the command ends quietly (SIGPIPE, as `cat` does)
/// instead of panicking in `println!` with a backtrace on stderr (on Linux,
/// where the command restores SIGPIPE's default). The read end is closed
/// before the command starts: closed after, a busy machine let the command
/// write its whole list into the pipe's buffer first and exit 0 (CI, 2 cores).
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader); // the pipe's only reader
    let child = devtensor()
        .args(["bench", "--list", "--device", "cpu"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the devtensor binary starts");
    let out = child.wait_with_output().expect("the command ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::ExitStatusExt;
        const SIGPIPE: i32 = 13;
        assert_eq!(out.status.signal(), Some(SIGPIPE), "stderr: {stderr}");
    }
}

/// The list read whole through a pipe: one JSON object a line, each naming
/// its pattern.
#[test]
fn the_pattern_list_reads_whole_through_a_pipe() {
    let mut child = devtensor()
        .args(["bench", "--list", "--device", "cpu"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the devtensor binary starts");
    let lines: Vec<String> = BufReader::new(child.stdout.take().expect("piped stdout"))
        .lines()
        .collect::<Result<_, _>>()
        .expect("UTF-8 lines");
    assert!(child.wait().expect("the command ends").success());
    assert!(lines.len() > 10, "{} patterns", lines.len());
    for line in &lines {
        assert!(line.starts_with("{\"name\":\"") && line.ends_with('}'), "{line}");
    }
}

/// A device the command does not know is refused with a one-line error and
/// a failing exit status, not a panic.
#[test]
fn an_unknown_device_is_refused_with_an_error() {
    let out = devtensor()
        .args(["bench", "--list", "--device", "tpu:0"])
        .output()
        .expect("the devtensor binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(stderr.contains("tpu"), "the error names the device: {stderr}");
}
