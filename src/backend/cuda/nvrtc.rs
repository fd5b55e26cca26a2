//! NVRTC, loaded at run time by devtensor itself.
//!
//! cudarc binds one NVRTC soname per CUDA version feature; devtensor must work
//! with NVRTC 12 or 13 (pip's `nvidia-cuda-nvrtc-cu12` or `nvidia-cuda-nvrtc`),
//! so it opens whichever is present: `DEVTENSOR_NVRTC` (a file or a directory)
//! first, then `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` on the loader path.

use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use crate::backend::rtc::{OutputCopy, OutputSize, Rtc, Symbols};
use crate::device::Backend;
use crate::error::{Error, Result};

/// NVRTC's names for the functions every run-time compiler has.
static SYMBOLS: Symbols = Symbols {
    version: "nvrtcVersion",
    error_string: "nvrtcGetErrorString",
    create: "nvrtcCreateProgram",
    compile: "nvrtcCompileProgram",
    destroy: "nvrtcDestroyProgram",
    log_size: "nvrtcGetProgramLogSize",
    log: "nvrtcGetProgramLog",
};

struct Api {
    rtc: Rtc,
    ptx_size: OutputSize,
    ptx: OutputCopy,
    cubin_size: OutputSize,
    cubin: OutputCopy,
    /// Where the library was found.
    path: String,
}

/// NVRTC sonames in the order to try for a driver of CUDA version `driver`
/// (0: unknown). A cubin from NVRTC 13 needs a CUDA 13 driver (r580+): under an
/// older driver NVRTC 12 comes first, so the kernels it compiles can load.
fn sonames(driver: i32) -> [&'static str; 3] {
    if driver > 0 && driver < 13000 {
        ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]
    } else {
        ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    }
}

fn candidates(driver: i32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("DEVTENSOR_NVRTC").map(PathBuf::from) {
        if p.is_dir() {
            for name in sonames(driver) {
                out.push(p.join(name));
            }
        } else {
            out.push(p);
        }
    }
    for name in sonames(driver) {
        out.push(PathBuf::from(name));
    }
    for name in ["nvrtc64_130_0.dll", "nvrtc64_120_0.dll"] {
        out.push(PathBuf::from(name));
    }
    out
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for path in candidates(super::probe::driver_version()) {
        // SAFETY: loading NVRTC runs its (side-effect free) initialisers only.
        let Ok(lib) = (unsafe { Library::new(&path) }) else {
            tried.push(path.display().to_string());
            continue;
        };
        // SAFETY: NVRTC's library; its functions have the signatures of nvrtc.h
        // (stable since CUDA 11.1).
        let api = unsafe { Rtc::load(lib, Backend::Cuda, &SYMBOLS) }.and_then(|rtc| {
            // SAFETY: as above.
            unsafe {
                Ok(Api {
                    ptx_size: rtc.symbol("nvrtcGetPTXSize")?,
                    ptx: rtc.symbol("nvrtcGetPTX")?,
                    cubin_size: rtc.symbol("nvrtcGetCUBINSize")?,
                    cubin: rtc.symbol("nvrtcGetCUBIN")?,
                    path: path.display().to_string(),
                    rtc,
                })
            }
        });
        match api {
            Ok(api) => return Ok(api),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "libnvrtc not found (tried {}): install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, \
         then put its lib directory on LD_LIBRARY_PATH or set DEVTENSOR_NVRTC",
        tried.join(", ")
    ))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: Backend::Cuda,
            reason: reason.clone(),
        })
}

/// NVRTC's version and where it was loaded from.
pub fn version() -> Result<((i32, i32), String)> {
    let api = api()?;
    Ok((api.rtc.version()?, api.path.clone()))
}

/// What a compile produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text (target `compute_XY`).
    Ptx,
    /// A cubin for one SM (target `sm_XY`): what devtensor loads, since PTX newer
    /// than the driver does not load.
    Cubin,
}

/// Compiles `source` with `options`; a failed compile returns the log.
pub fn compile(name: &str, source: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let api = api()?;
    let arch = options
        .iter()
        .find_map(|o| o.strip_prefix("--gpu-architecture="))
        .unwrap_or_default();
    api.rtc.compile(name, source, options, arch, |prog| match output {
        Output::Ptx => api.rtc.read(prog, api.ptx_size, api.ptx, "nvrtcGetPTX"),
        Output::Cubin => api.rtc.read(prog, api.cubin_size, api.cubin, "nvrtcGetCUBIN"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_kernel_fails_with_the_compiler_log_and_a_good_one_compiles() {
        if let Err(e) = version() {
            println!("SKIP a_broken_kernel_fails_with_the_compiler_log: no NVRTC ({e})");
            return;
        }
        let opts = ["--gpu-architecture=sm_80".to_owned()];
        let err = compile(
            "broken.cu",
            "extern \"C\" __global__ void k() { undeclared(); }",
            &opts,
            Output::Ptx,
        )
        .unwrap_err();
        match err {
            Error::KernelCompile { kernel, arch, log } => {
                assert_eq!((kernel.as_str(), arch.as_str()), ("broken.cu", "sm_80"));
                assert!(log.contains("undeclared"), "the log names the error: {log}");
            }
            other => panic!("expected KernelCompile, got {other:?}"),
        }
        let ptx = compile(
            "ok.cu",
            "extern \"C\" __global__ void k(int* p) { *p = 1; }",
            &opts,
            Output::Ptx,
        )
        .unwrap();
        assert!(String::from_utf8_lossy(&ptx).contains(".entry k"));
        let bad = compile("nul.cu", "a\0b", &opts, Output::Ptx).unwrap_err();
        assert!(matches!(bad, Error::InvalidArgument { .. }), "{bad:?}");
    }

    #[test]
    fn an_older_driver_gets_nvrtc_12_first() {
        assert_eq!(sonames(12080)[0], "libnvrtc.so.12");
        assert_eq!(sonames(13000)[0], "libnvrtc.so.13");
        assert_eq!(sonames(0)[0], "libnvrtc.so.13", "no driver: the newest compiler");
        let names: Vec<String> = candidates(12040)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // The loader-path names, after whatever DEVTENSOR_NVRTC adds in front.
        let (p12, p13) = (
            names.iter().rposition(|n| n == "libnvrtc.so.12").unwrap(),
            names.iter().rposition(|n| n == "libnvrtc.so.13").unwrap(),
        );
        assert!(p12 < p13, "{names:?}");
    }
}
