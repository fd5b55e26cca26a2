//! `devtensor bench`: the strided-copy pattern matrix on the best available device.

use clap::Args;

/// Options of `devtensor bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Smaller sizes and shorter timing (a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per pattern on stdout (for bench/cpu_copy_peers.py).
    #[arg(long)]
    pub json: bool,
    /// Only patterns whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
}

pub fn run(_args: &BenchArgs) -> devtensor::Result<()> {
    Ok(())
}
