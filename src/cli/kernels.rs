//! `devtensor kernels --check`: compile every kernel without a GPU.

use clap::Args;

/// Options of `devtensor kernels`.
#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Compile every kernel and verify the module defines each one.
    #[arg(long)]
    pub check: bool,
    /// Target architectures (repeatable), e.g. sm_80, sm_90.
    #[arg(long = "arch", default_values_t = vec!["sm_80".to_owned(), "sm_90".to_owned()])]
    pub arch: Vec<String>,
    /// Backend whose compiler to use.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "rocm"])]
    pub backend: String,
}

pub fn run(args: &KernelsArgs) -> Result<(), String> {
    if args.backend != "cuda" {
        return Err(format!(
            "the {} kernel compiler is not part of this build",
            args.backend
        ));
    }
    #[cfg(feature = "cuda")]
    {
        use devtensor::backend::cuda::kernels;
        if !args.check {
            for k in kernels::KERNELS {
                println!("{k}");
            }
            return Ok(());
        }
        let mut failed = false;
        for arch in &args.arch {
            let r = kernels::check(arch).map_err(|e| e.to_string())?;
            let ((major, minor), path) = &r.nvrtc;
            println!(
                "{}: NVRTC {major}.{minor} ({path}): cubin {} bytes, {}/{} kernels: {}",
                r.arch,
                r.cubin_bytes,
                r.entries.len(),
                kernels::KERNELS.len(),
                r.entries.join(" ")
            );
            if !r.missing.is_empty() {
                println!("{}: MISSING {}", r.arch, r.missing.join(" "));
                failed = true;
            }
        }
        if failed {
            Err("some kernels are missing from the compiled module".to_owned())
        } else {
            Ok(())
        }
    }
    #[cfg(not(feature = "cuda"))]
    Err("built without the `cuda` feature".to_owned())
}
