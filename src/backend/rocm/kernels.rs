//! The shared kernel source ([`crate::backend::kernels`]) compiled for AMD GPUs.
//!
//! At run time: hiprtc ([`super::hiprtc`]), once per (source, options, hiprtc
//! identity, target id), cached in memory and on disk like the CUDA modules.
//! The target is the device's full target id (`gfx90a:sramecc+:xnack-`), so a
//! code object built for one xnack/sramecc mode is never loaded on another.
//!
//! Without a GPU, [`check`] builds the code object for any target: hiprtc when
//! it knows the processor, else an offline clang ([`clang`]; HIP 5.x's hiprtc
//! predates gfx942), and verifies that the result is an AMDGPU ELF for that
//! target defining a kernel descriptor (`<kernel>.kd`) for every kernel of
//! [`KERNELS`].
//!
//! The kernels are wave64-safe: they use no warp-level intrinsics and assume
//! nothing of the wavefront size (32 on RDNA, 64 on CDNA).

pub mod clang;
pub(crate) mod elf;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::hiprtc;
pub use crate::backend::kernels::{KERNELS, Origin, SOURCE, SOURCE_NAME};
use crate::backend::kernels::{ModuleCache, disk_cached, key};
use crate::device::Backend;
use crate::error::{Error, Result};

/// hiprtc options for a target id (`gfx942`, `gfx90a:sramecc+:xnack-`).
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--offload-arch={arch}"),
        "-O3".to_owned(),
        "-std=c++17".to_owned(),
    ]
}

/// Checks that `arch` is an AMD GPU target id: `gfx` and a processor number,
/// then `:feature+` / `:feature-` settings.
pub fn validate_target(arch: &str) -> Result<()> {
    let mut parts = arch.split(':');
    let processor = parts.next().unwrap_or_default();
    let digits = processor.strip_prefix("gfx").unwrap_or_default();
    let ok_processor = !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase());
    let ok_features = parts.all(|f| {
        f.len() > 1
            && matches!(f.as_bytes().last(), Some(b'+' | b'-'))
            && f[..f.len() - 1].bytes().all(|c| c.is_ascii_lowercase())
    });
    if ok_processor && ok_features {
        Ok(())
    } else {
        Err(Error::KernelCompile {
            kernel: SOURCE_NAME.to_owned(),
            arch: arch.to_owned(),
            log: "not an AMD GPU target id: expected gfxNNN with optional :feature+ / :feature- \
                  settings (gfx942, gfx90a:sramecc+:xnack-)"
                .to_owned(),
        })
    }
}

/// Parses `code` and checks it is an AMDGPU code object for `arch`; returns the
/// target id read back from it and the manifest kernels it defines and lacks.
fn inspect(code: &[u8], arch: &str) -> std::result::Result<(String, Vec<&'static str>, Vec<&'static str>), String> {
    let co = elf::parse(code)?;
    co.check_target(arch)?;
    let (found, missing) = KERNELS.iter().partition(|k| co.symbols.contains(&format!("{k}.kd")));
    Ok((co.target_id(), found, missing))
}

/// The compiled code object for `arch`, the device's target id
/// (`gfx90a:sramecc+:xnack-`, `gfx942`, ...), built by hiprtc.
pub fn module(arch: &str) -> Result<(Arc<Vec<u8>>, Origin)> {
    static MEMORY: ModuleCache = ModuleCache::new();
    MEMORY.get_or_build(arch, || {
        validate_target(arch)?;
        let compiler = hiprtc::identity()?;
        let options = options(arch);
        let file = format!("{}.hsaco", key(&compiler, &options, arch));
        disk_cached(&file, || {
            let code = hiprtc::compile(SOURCE_NAME, SOURCE, &options)?;
            match inspect(&code, arch) {
                Ok((_, _, missing)) if missing.is_empty() => Ok(code),
                Ok((_, _, missing)) => Err(Error::KernelCompile {
                    kernel: SOURCE_NAME.to_owned(),
                    arch: arch.to_owned(),
                    log: format!("{compiler}: the code object lacks {}", missing.join(" ")),
                }),
                Err(why) => Err(Error::KernelCompile {
                    kernel: SOURCE_NAME.to_owned(),
                    arch: arch.to_owned(),
                    log: format!("{compiler}: bad code object: {why}"),
                }),
            }
        })
    })
}

/// The compiler [`check`] used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiler {
    /// hiprtc, as at run time.
    Hiprtc {
        /// `hiprtcVersion` (9.0 for every HIP 5.x).
        version: (i32, i32),
        /// The library it was loaded from.
        path: String,
        /// comgr's version, when comgr could be loaded.
        comgr: Option<(usize, usize)>,
    },
    /// An offline clang.
    Clang {
        /// The executable.
        path: PathBuf,
        /// Its version (`19.1.7`).
        version: String,
    },
}

impl fmt::Display for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compiler::Hiprtc {
                version: (major, minor),
                path,
                comgr,
            } => {
                write!(f, "hiprtc {major}.{minor} ({path}")?;
                if let Some((cmaj, cmin)) = comgr {
                    write!(f, ", comgr {cmaj}.{cmin}")?;
                }
                write!(f, ")")
            }
            Compiler::Clang { path, version } => write!(f, "clang {version} ({})", path.display()),
        }
    }
}

/// What `devtensor kernels --check --backend rocm` reports for one target.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The target id checked (`gfx942`, ...).
    pub arch: String,
    /// The compiler that built the code object.
    pub compiler: Compiler,
    /// Why each compiler tried before it was not used (empty when hiprtc did it).
    pub passed_over: Vec<String>,
    /// Size of the code object.
    pub code_object_bytes: usize,
    /// The target id read back from the code object's ELF flags.
    pub target: String,
    /// Manifest kernels whose descriptor `<kernel>.kd` the code object defines.
    pub entries: Vec<&'static str>,
    /// Manifest kernels without one (a failed check when non-empty).
    pub missing: Vec<&'static str>,
}

/// True when a hiprtc failure means "this processor is not supported" rather
/// than "the source does not compile".
fn rejects_target(log: &str) -> bool {
    [
        hiprtc::UNSUPPORTED_TARGET,
        "invalid target ID",
        "unknown target CPU",
        "not a recognized processor",
    ]
    .iter()
    .any(|m| log.contains(m))
}

/// Compiles every kernel for `arch` (a target id) with no GPU: with hiprtc, or,
/// when hiprtc is missing or does not know the processor, with an offline clang.
/// A hiprtc that knows the processor but fails to compile is an error (that is
/// what would run), not a reason to try clang.
pub fn check(arch: &str) -> Result<CheckReport> {
    let (code, compiler, passed_over) = build(arch)?;
    let (target, entries, missing) = inspect(&code, arch).map_err(|why| Error::KernelCompile {
        kernel: SOURCE_NAME.to_owned(),
        arch: arch.to_owned(),
        log: format!("{compiler}: bad code object: {why}"),
    })?;
    Ok(CheckReport {
        arch: arch.to_owned(),
        compiler,
        passed_over,
        code_object_bytes: code.len(),
        target,
        entries,
        missing,
    })
}

/// [`check`]'s compile: the code object, its compiler, and why compilers
/// before it were passed over.
fn build(arch: &str) -> Result<(Vec<u8>, Compiler, Vec<String>)> {
    validate_target(arch)?;
    let mut passed_over = Vec::new();
    match hiprtc::compile(SOURCE_NAME, SOURCE, &options(arch)) {
        Ok(code) => {
            let (version, path) = hiprtc::version()?;
            let comgr = hiprtc::comgr().map(|c| c.version);
            return Ok((code, Compiler::Hiprtc { version, path, comgr }, passed_over));
        }
        Err(Error::BackendUnavailable { reason, .. }) => passed_over.push(format!("hiprtc: {reason}")),
        Err(Error::KernelCompile { log, .. }) if rejects_target(&log) => {
            let first = log.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
            passed_over.push(format!("hiprtc: {first}"));
        }
        Err(e) => return Err(e),
    }
    match clang::compile(SOURCE_NAME, SOURCE, arch) {
        Ok((code, c)) => Ok((
            code,
            Compiler::Clang {
                path: c.path,
                version: c.version,
            },
            passed_over,
        )),
        Err(clang::ClangError::NotFound(why)) => Err(Error::BackendUnavailable {
            backend: Backend::Rocm,
            reason: format!("no HIP compiler for {arch}: {}; {why}", passed_over.join("; ")),
        }),
        Err(clang::ClangError::Failed(why)) => Err(Error::KernelCompile {
            kernel: SOURCE_NAME.to_owned(),
            arch: arch.to_owned(),
            log: format!("{}\n  {why}", passed_over.join("\n  ")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ids() {
        for ok in ["gfx90a", "gfx942", "gfx1100", "gfx90a:sramecc+:xnack-", "gfx942:xnack+"] {
            assert!(validate_target(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "gfx",
            "sm_90",
            "gfx90a:",
            "gfx90a:xnack",
            "gfx90a:+",
            "gfx-unknown",
            "gfx942 -O0",
            "GFX942",
        ] {
            assert!(
                matches!(validate_target(bad), Err(Error::KernelCompile { .. })),
                "{bad}"
            );
        }
        assert_eq!(options("gfx942")[0], "--offload-arch=gfx942");
    }

    #[test]
    fn hiprtc_rejections_are_told_apart_from_source_errors() {
        assert!(rejects_target(&format!(
            "{} gfx942: hiprtc ... knows gfx90a",
            hiprtc::UNSUPPORTED_TARGET
        )));
        assert!(rejects_target(
            "clang: error: invalid target ID 'gfx942'; format is ..."
        ));
        assert!(!rejects_target(
            "strided_copy.cu:12:3: error: use of undeclared identifier 'x'"
        ));
    }

    #[test]
    fn inspect_hand_built_code_objects() {
        let mut names: Vec<String> = KERNELS.iter().map(|k| format!("{k}.kd")).collect();
        names.extend(KERNELS.iter().map(|k| k.to_string()));
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let full = elf::tests::tiny_elf(elf::EM_AMDGPU, 2, 0x54c, &refs);
        let (target, found, missing) = inspect(&full, "gfx942").unwrap();
        assert_eq!(
            (target.as_str(), found.len(), missing.len()),
            ("gfx942", KERNELS.len(), 0)
        );
        assert!(inspect(&full, "gfx90a").unwrap_err().contains("not gfx90a"));
        // Function symbols alone do not count: the descriptor is what a launch needs.
        let no_kd: Vec<&str> = KERNELS.to_vec();
        let (_, found, missing) = inspect(&elf::tests::tiny_elf(elf::EM_AMDGPU, 2, 0x54c, &no_kd), "gfx942").unwrap();
        assert_eq!((found.len(), missing.as_slice()), (0, KERNELS));
    }

    /// Builds the real code object with whatever compiler this machine has.
    fn check_or_skip(test: &str, arch: &str) {
        match check(arch) {
            Err(Error::BackendUnavailable { reason, .. }) => println!("SKIP {test}: {reason}"),
            Err(e) => panic!("{arch}: {e}"),
            Ok(r) => {
                println!(
                    "{arch}: {}: {} bytes, target {}, {}/{} kernels",
                    r.compiler,
                    r.code_object_bytes,
                    r.target,
                    r.entries.len(),
                    KERNELS.len()
                );
                assert!(r.missing.is_empty(), "{arch}: missing {:?}", r.missing);
                assert_eq!(r.entries, KERNELS);
                assert_eq!(hiprtc::processor(&r.target), hiprtc::processor(arch));
                assert!(r.code_object_bytes > 1000);
            }
        }
    }

    #[test]
    fn module_is_built_once_and_unknown_targets_fail_cleanly() {
        let (first, origin) = match module("gfx90a") {
            Err(Error::BackendUnavailable { reason, .. }) => {
                println!("SKIP module_is_built_once_and_unknown_targets_fail_cleanly: {reason}");
                return;
            }
            Err(e) if hiprtc::supports("gfx90a") == Some(false) => {
                println!("SKIP module_is_built_once_and_unknown_targets_fail_cleanly: {e}");
                return;
            }
            r => r.unwrap(),
        };
        assert_ne!(origin, Origin::Memory);
        let (again, origin) = module("gfx90a").unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(origin, Origin::Memory);
        let (_, found, missing) = inspect(&first, "gfx90a").unwrap();
        assert_eq!((found.len(), missing.len()), (KERNELS.len(), 0));
        // A processor this hiprtc does not know is an error, not an abort (HIP 5.2 and gfx942).
        match module("gfx942") {
            Ok((code, _)) => assert!(inspect(&code, "gfx942").is_ok()),
            Err(e) => assert!(matches!(e, Error::KernelCompile { .. }), "{e}"),
        }
        assert!(matches!(module("sm_90"), Err(Error::KernelCompile { .. })));
    }

    #[test]
    fn check_gfx90a() {
        check_or_skip("check_gfx90a", "gfx90a");
    }

    #[test]
    fn check_gfx942() {
        check_or_skip("check_gfx942", "gfx942");
    }

    #[test]
    fn check_full_target_id() {
        check_or_skip("check_full_target_id", "gfx90a:sramecc+:xnack-");
    }

    #[test]
    fn parse_a_tiny_real_code_object() {
        // A one-kernel object from the offline clang, if there is one.
        let src =
            "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void tiny_kernel(int* p) { p[threadIdx.x] = 1; }\n";
        match clang::compile("tiny.hip", src, "gfx90a") {
            Err(clang::ClangError::NotFound(why)) => println!("SKIP parse_a_tiny_real_code_object: {why}"),
            Err(clang::ClangError::Failed(why)) => panic!("{why}"),
            Ok((code, c)) => {
                let co = elf::parse(&code).unwrap();
                assert_eq!(co.machine, elf::EM_AMDGPU, "{}", c.path.display());
                assert_eq!(co.processor(), Some("gfx90a"));
                assert!(co.symbols.contains("tiny_kernel.kd"), "{:?}", co.symbols);
                assert!(co.symbols.contains("tiny_kernel"));
            }
        }
    }
}
