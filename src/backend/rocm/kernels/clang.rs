//! An offline HIP compiler for `devtensor kernels --check` when hiprtc is
//! missing or does not know the target: a clang with the AMDGPU backend, the
//! HIP headers and the ROCm device-library bitcode.
//!
//! The clang: `DEVTENSOR_HIP_CLANG` if set; else ROCm's own
//! (`<root>/lib/llvm/bin/clang`, `<root>/llvm/bin/clang`), then `clang-22` …
//! `clang-15` and `clang` on `PATH`; the first that compiles the source wins.
//! Roots: `HIP_PATH`, `ROCM_PATH`, `/opt/rocm`, `/usr`. Headers: the first root
//! with `include/hip/hip_runtime.h`. Bitcode: the first of `<root>/amdgcn/bitcode`,
//! `<root>/lib/<multiarch>/amdgcn/bitcode` (Debian), and
//! `<root>/lib/llvm/lib/clang/*/lib/amdgcn/bitcode` (ROCm 6.3+) holding `ockl.bc`.
//!
//! When the bitcode directory has the processor's `oclc_isa_version_<N>.bc`,
//! clang links the device libraries itself (`--rocm-device-lib-path`), as hipcc
//! does. Otherwise (Debian bookworm's device libraries predate gfx942) it
//! compiles with `-nogpulib` and links only `ockl.bc` (and `hip.bc` where it
//! exists): the kernels call nothing else.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One clang found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clang {
    /// The executable.
    pub path: PathBuf,
    /// `19.1.7` (from `--version`), or the whole first line when it has no
    /// `clang version` in it.
    pub version: String,
}

/// Where the HIP headers and the device-library bitcode are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipRoot {
    /// The root whose `include/hip/hip_runtime.h` is used (passed as `--rocm-path`).
    pub root: PathBuf,
    /// The directory holding `ockl.bc`.
    pub bitcode: PathBuf,
}

/// Why no code object came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClangError {
    /// No clang, no HIP headers or no bitcode.
    NotFound(String),
    /// Every clang found failed; their reasons.
    Failed(String),
}

/// The HIP roots to look in, in order: `HIP_PATH`, `ROCM_PATH`, `/opt/rocm`, `/usr`.
pub fn roots(hip_path: Option<OsString>, rocm_path: Option<OsString>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in [hip_path, rocm_path]
        .into_iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .chain([PathBuf::from("/opt/rocm"), PathBuf::from("/usr")])
    {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The clang executables to try, in order (only existing files).
pub fn candidates(env: Option<OsString>, roots: &[PathBuf], path_var: Option<OsString>) -> Vec<PathBuf> {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        // A bare name is looked up on PATH like any other.
        if p.components().count() == 1 {
            return on_path(&p.to_string_lossy(), path_var.as_ref());
        }
        return vec![p];
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for root in roots {
        for rel in ["lib/llvm/bin/clang", "llvm/bin/clang"] {
            let p = root.join(rel);
            if p.is_file() {
                out.push(p);
            }
        }
    }
    let names = (15..=22)
        .rev()
        .map(|v| format!("clang-{v}"))
        .chain(["clang".to_owned()]);
    for name in names {
        for p in on_path(&name, path_var.as_ref()) {
            let same = |q: &PathBuf| q.canonicalize().ok() == p.canonicalize().ok();
            if !out.iter().any(same) {
                out.push(p);
            }
        }
    }
    out
}

/// The first `name` in `PATH` (as a list: empty or one entry).
fn on_path(name: &str, path_var: Option<&OsString>) -> Vec<PathBuf> {
    path_var
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .into_iter()
        .collect()
}

/// The device-library bitcode directories under `root`, in order of preference.
fn bitcode_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("amdgcn/bitcode")];
    let mut more = |pattern_parent: PathBuf, tail: &str| {
        if let Ok(rd) = std::fs::read_dir(&pattern_parent) {
            let mut found: Vec<(u32, PathBuf)> = rd
                .flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let major = name.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
                    (major, e.path().join(tail))
                })
                .collect();
            // Newest clang resource dir (`lib/llvm/lib/clang/19`) first.
            found.sort();
            found.reverse();
            out.extend(found.into_iter().map(|(_, p)| p));
        }
    };
    more(root.join("lib"), "amdgcn/bitcode");
    more(root.join("lib/llvm/lib/clang"), "lib/amdgcn/bitcode");
    out
}

/// Finds the HIP headers and the bitcode.
pub fn hip_root(roots: &[PathBuf]) -> Result<HipRoot, String> {
    let root = roots
        .iter()
        .find(|r| r.join("include/hip/hip_runtime.h").is_file())
        .ok_or_else(|| {
            format!(
                "no HIP headers (include/hip/hip_runtime.h) under {}: install hipcc / libamdhip64-dev \
                 (Debian) or ROCm, or set HIP_PATH",
                show(roots)
            )
        })?;
    let search: Vec<&PathBuf> = std::iter::once(root)
        .chain(roots.iter().filter(|r| *r != root))
        .collect();
    let bitcode = search
        .iter()
        .flat_map(|r| bitcode_dirs(r))
        .find(|d| d.join("ockl.bc").is_file())
        .ok_or_else(|| {
            format!(
                "no ROCm device libraries (amdgcn/bitcode/ockl.bc) under {}: install rocm-device-libs",
                show(roots)
            )
        })?;
    Ok(HipRoot {
        root: root.clone(),
        bitcode,
    })
}

fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `Debian clang version 19.1.7 (++2025...)` → `19.1.7`.
pub fn parse_version(first_line: &str) -> String {
    first_line
        .split_once("clang version ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or(first_line.trim())
        .to_owned()
}

fn version_of(clang: &Path) -> Result<String, String> {
    let out = Command::new(clang)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", clang.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_version(text.lines().next().unwrap_or_default()))
}

/// The clang arguments compiling `source` for `target` into `output`.
pub fn arguments(target: &str, hip: &HipRoot, source: &Path, output: &Path) -> Vec<OsString> {
    let processor = target.split(':').next().unwrap_or(target);
    let isa = hip
        .bitcode
        .join(format!("oclc_isa_version_{}.bc", processor.trim_start_matches("gfx")));
    let mut args: Vec<OsString> = [
        "-x",
        "hip",
        &format!("--offload-arch={target}"),
        "--cuda-device-only",
        "--no-gpu-bundle-output",
        "-O3",
        "-std=c++17",
        "-D__HIP_PLATFORM_AMD__",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let mut flag = |prefix: &str, p: &Path| {
        let mut s = OsString::from(prefix);
        s.push(p);
        args.push(s);
    };
    flag("--rocm-path=", &hip.root);
    flag("-I", &hip.root.join("include"));
    if isa.is_file() {
        flag("--rocm-device-lib-path=", &hip.bitcode);
    } else {
        args.push("-nogpulib".into());
        for lib in ["hip.bc", "ockl.bc"] {
            let p = hip.bitcode.join(lib);
            if p.is_file() {
                for a in ["-Xclang", "-mlink-builtin-bitcode", "-Xclang"] {
                    args.push(a.into());
                }
                args.push(p.into());
            }
        }
    }
    args.push("-o".into());
    args.push(output.into());
    args.push(source.into());
    args
}

/// A fresh private directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "devtensor-hip-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `source` (named `name`) for `target` with the first clang that
/// succeeds; returns the code object and that clang.
pub fn compile(name: &str, source: &str, target: &str) -> Result<(Vec<u8>, Clang), ClangError> {
    let roots = roots(std::env::var_os("HIP_PATH"), std::env::var_os("ROCM_PATH"));
    let clangs = candidates(
        std::env::var_os("DEVTENSOR_HIP_CLANG"),
        &roots,
        std::env::var_os("PATH"),
    );
    if clangs.is_empty() {
        return Err(ClangError::NotFound(
            "no clang found (DEVTENSOR_HIP_CLANG, ROCm's lib/llvm/bin/clang, clang-22 … clang-15, clang on PATH): \
             install clang-19 and lld-19, or set DEVTENSOR_HIP_CLANG"
                .to_owned(),
        ));
    }
    let hip = hip_root(&roots).map_err(ClangError::NotFound)?;
    let dir = TempDir::new().map_err(|e| ClangError::Failed(format!("temporary directory: {e}")))?;
    let src = dir.0.join(name);
    std::fs::write(&src, source).map_err(|e| ClangError::Failed(format!("{}: {e}", src.display())))?;
    let mut failures = Vec::new();
    for path in clangs {
        let version = match version_of(&path) {
            Ok(v) => v,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let out = dir.0.join(format!("{}.hsaco", failures.len()));
        let run = Command::new(&path).args(arguments(target, &hip, &src, &out)).output();
        match run {
            Ok(o) if o.status.success() => match std::fs::read(&out) {
                Ok(code) => return Ok((code, Clang { path, version })),
                Err(e) => failures.push(format!("clang {version} ({}): {}: {e}", path.display(), out.display())),
            },
            Ok(o) => {
                let log = String::from_utf8_lossy(&o.stderr);
                let log: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).take(8).collect();
                failures.push(format!("clang {version} ({}): {}", path.display(), log.join("\n    ")));
            }
            Err(e) => failures.push(format!("clang {version} ({}): {e}", path.display())),
        }
    }
    Err(ClangError::Failed(failures.join("\n  ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("devtensor-clang-test-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Self(d)
        }
        fn touch(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
            p
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn roots_order_and_dedup() {
        let r = roots(Some("/usr".into()), Some("/opt/rocm-6.4".into()));
        assert_eq!(
            r,
            [Path::new("/usr"), Path::new("/opt/rocm-6.4"), Path::new("/opt/rocm")]
        );
        let r = roots(None, Some("".into()));
        assert_eq!(r, [Path::new("/opt/rocm"), Path::new("/usr")]);
    }

    #[test]
    fn candidate_order() {
        let s = Scratch::new("cand");
        let rocm = s.0.join("rocm");
        let rocm_clang = s.touch("rocm/lib/llvm/bin/clang");
        let bin1 = s.0.join("bin1");
        let bin2 = s.0.join("bin2");
        let c19 = s.touch("bin1/clang-19");
        let c16 = s.touch("bin2/clang-16");
        let c19b = s.touch("bin2/clang-19"); // shadowed by bin1
        let plain = s.touch("bin2/clang");
        s.touch("bin2/clang-14"); // too old: not tried
        let path = std::env::join_paths([&bin1, &bin2]).unwrap();
        let got = candidates(None, std::slice::from_ref(&rocm), Some(path.clone()));
        assert_eq!(got, [rocm_clang, c19.clone(), c16, plain]);
        assert!(!got.contains(&c19b));
        // DEVTENSOR_HIP_CLANG wins alone, as a path or as a name on PATH.
        let chosen = s.0.join("elsewhere/my-clang");
        assert_eq!(
            candidates(
                Some(chosen.clone().into()),
                std::slice::from_ref(&rocm),
                Some(path.clone())
            ),
            [chosen]
        );
        assert_eq!(candidates(Some("clang-19".into()), &[rocm], Some(path)), [c19]);
        assert!(candidates(None, &[], None).is_empty());
    }

    #[test]
    fn hip_root_and_bitcode_layouts() {
        let s = Scratch::new("roots");
        let debian = s.0.join("usr");
        let rocm6 = s.0.join("opt/rocm");
        assert!(
            hip_root(std::slice::from_ref(&debian))
                .unwrap_err()
                .contains("no HIP headers")
        );
        s.touch("usr/include/hip/hip_runtime.h");
        assert!(
            hip_root(std::slice::from_ref(&debian))
                .unwrap_err()
                .contains("rocm-device-libs")
        );
        // Debian multiarch layout.
        s.touch("usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ockl.bc");
        let h = hip_root(std::slice::from_ref(&debian)).unwrap();
        assert_eq!(h.root, debian);
        assert_eq!(h.bitcode, debian.join("lib/x86_64-linux-gnu/amdgcn/bitcode"));
        // ROCm 6.3+: bitcode inside the clang resource dir, newest first; headers win by root order.
        s.touch("opt/rocm/include/hip/hip_runtime.h");
        s.touch("opt/rocm/lib/llvm/lib/clang/17/lib/amdgcn/bitcode/ockl.bc");
        s.touch("opt/rocm/lib/llvm/lib/clang/19/lib/amdgcn/bitcode/ockl.bc");
        s.touch("opt/rocm/lib/llvm/lib/clang/9/lib/amdgcn/bitcode/ockl.bc");
        let h = hip_root(&[rocm6.clone(), debian.clone()]).unwrap();
        assert_eq!(h.root, rocm6);
        assert_eq!(h.bitcode, rocm6.join("lib/llvm/lib/clang/19/lib/amdgcn/bitcode"));
        // Older ROCm: <root>/amdgcn/bitcode first.
        s.touch("opt/rocm/amdgcn/bitcode/ockl.bc");
        assert_eq!(
            hip_root(std::slice::from_ref(&rocm6)).unwrap().bitcode,
            rocm6.join("amdgcn/bitcode")
        );
    }

    #[test]
    fn arguments_pick_device_lib_mode() {
        let s = Scratch::new("args");
        s.touch("bc/ockl.bc");
        s.touch("bc/hip.bc");
        s.touch("bc/oclc_isa_version_90a.bc");
        let hip = HipRoot {
            root: s.0.join("usr"),
            bitcode: s.0.join("bc"),
        };
        let text = |t: &str| -> Vec<String> {
            arguments(t, &hip, Path::new("k.cu"), Path::new("k.hsaco"))
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let a90a = text("gfx90a:sramecc+:xnack-");
        assert!(a90a.contains(&"--offload-arch=gfx90a:sramecc+:xnack-".to_owned()));
        assert!(a90a.iter().any(|a| a.starts_with("--rocm-device-lib-path=")));
        assert!(!a90a.contains(&"-nogpulib".to_owned()));
        let a942 = text("gfx942");
        assert!(a942.contains(&"-nogpulib".to_owned()));
        assert!(a942.iter().any(|a| a.ends_with("ockl.bc")) && a942.iter().any(|a| a.ends_with("hip.bc")));
        assert_eq!(&a942[a942.len() - 3..], ["-o", "k.hsaco", "k.cu"]);
    }

    #[test]
    fn version_lines() {
        assert_eq!(
            parse_version("Debian clang version 19.1.7 (++20250114103320+cd708029e0b2-1~exp1)"),
            "19.1.7"
        );
        assert_eq!(
            parse_version("AMD clang version 18.0.0git (https://github.com/RadeonOpenCompute/llvm-project roc-6.3.0)"),
            "18.0.0git"
        );
        assert_eq!(parse_version("clang version 15.0.6"), "15.0.6");
        assert_eq!(parse_version("something else"), "something else");
    }
}
