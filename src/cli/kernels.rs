//! `devtensor kernels --check`: compile every kernel without a GPU.

use clap::Args;

/// Options of `devtensor kernels`.
#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Compile every kernel and verify the module defines each one.
    #[arg(long)]
    pub check: bool,
    /// Target architectures (repeatable). Default: sm_80 sm_90 for cuda,
    /// gfx90a gfx942 for rocm. ROCm takes full target ids too (gfx90a:sramecc+:xnack-).
    #[arg(long = "arch")]
    pub arch: Vec<String>,
    /// Backend whose compiler to use.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "rocm"])]
    pub backend: String,
}

/// The architectures `--check` compiles for when `--arch` is not given.
pub fn default_archs(backend: &str) -> &'static [&'static str] {
    match backend {
        "rocm" => &["gfx90a", "gfx942"],
        _ => &["sm_80", "sm_90"],
    }
}

pub fn run(args: &KernelsArgs) -> Result<(), String> {
    let archs: Vec<String> = if args.arch.is_empty() {
        default_archs(&args.backend).iter().map(|a| (*a).to_owned()).collect()
    } else {
        args.arch.clone()
    };
    let missing = match args.backend.as_str() {
        "rocm" => check_rocm(args.check, &archs)?,
        _ => check_cuda(args.check, &archs)?,
    };
    if missing {
        Err("some kernels are missing from the compiled module".to_owned())
    } else {
        Ok(())
    }
}

/// Prints the manifest (every backend compiles the same kernels).
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn list() {
    for k in devtensor::backend::kernels::KERNELS {
        println!("{k}");
    }
}

/// Checks every arch with NVRTC; `Ok(true)` when some kernel is missing.
#[cfg(feature = "cuda")]
fn check_cuda(check: bool, archs: &[String]) -> Result<bool, String> {
    use devtensor::backend::cuda::kernels;
    if !check {
        list();
        return Ok(false);
    }
    let mut failed = false;
    for arch in archs {
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
    Ok(failed)
}

#[cfg(not(feature = "cuda"))]
fn check_cuda(_check: bool, _archs: &[String]) -> Result<bool, String> {
    Err("built without the `cuda` feature: rebuild with `--features cuda` (on by default)".to_owned())
}

/// Checks every arch with hiprtc or an offline clang; `Ok(true)` when some
/// kernel is missing.
#[cfg(feature = "rocm")]
fn check_rocm(check: bool, archs: &[String]) -> Result<bool, String> {
    use devtensor::backend::rocm::kernels;
    if !check {
        list();
        return Ok(false);
    }
    let mut failed = false;
    for arch in archs {
        let r = kernels::check(arch).map_err(|e| e.to_string())?;
        println!(
            "{}: {}: code object {} bytes (target {}), {}/{} kernels: {}",
            r.arch,
            r.compiler,
            r.code_object_bytes,
            r.target,
            r.entries.len(),
            kernels::KERNELS.len(),
            r.entries.join(" ")
        );
        for why in &r.passed_over {
            println!("{}:   (not used: {why})", r.arch);
        }
        if !r.missing.is_empty() {
            println!("{}: MISSING {}", r.arch, r.missing.join(" "));
            failed = true;
        }
    }
    Ok(failed)
}

#[cfg(not(feature = "rocm"))]
fn check_rocm(_check: bool, _archs: &[String]) -> Result<bool, String> {
    Err(
        "built without the `rocm` feature: install HIP (Debian: `apt-get install hipcc libamdhip64-dev`) \
         and rebuild with `--features rocm` (HIP_PATH=/usr on Debian)"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_backend() {
        assert_eq!(default_archs("cuda"), ["sm_80", "sm_90"]);
        assert_eq!(default_archs("rocm"), ["gfx90a", "gfx942"]);
    }
}
