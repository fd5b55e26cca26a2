//! The `devtensor` command: `info` and `bench`.

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "devtensor", version, about = "GPU tensors described with DLPack")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List backends, library versions and devices (and why a backend is unavailable).
    Info,
    /// Run the strided-copy pattern matrix on the best available device.
    Bench(cli::bench::BenchArgs),
    /// Compile the GPU kernels (no GPU needed with --check).
    Kernels(cli::kernels::KernelsArgs),
}

fn main() -> std::process::ExitCode {
    // A closed output pipe (`devtensor bench --list | head`) ends the command quietly, as it
    // ends `cat` or `ls`: Rust's runtime ignores SIGPIPE, so each print to the closed pipe
    // failed instead, and `println!` panicked with a backtrace.
    #[cfg(target_os = "linux")]
    // SAFETY: the first statement of main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = Args::parse();
    if matches!(args.command, Command::Bench(_)) && cli::bench_emulated::report_path().is_none() {
        // On the emulated driver the bench prints the emulator's launch metrics, which it
        // writes where this variable points; a real driver ignores it.
        let path = std::env::temp_dir().join(format!("devtensor-emu-report-{}.jsonl", std::process::id()));
        // SAFETY: the first statement of main after parsing: no other thread exists yet
        // to read the environment concurrently.
        unsafe { std::env::set_var("DEVTENSOR_EMU_REPORT", path) };
    }
    match args.command {
        Command::Info => {
            cli::info::run();
            std::process::ExitCode::SUCCESS
        }
        Command::Kernels(k) => match cli::kernels::run(&k) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("devtensor kernels: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Bench(b) => match cli::bench::run(&b) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("devtensor bench: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}
