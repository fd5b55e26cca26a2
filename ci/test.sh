#!/usr/bin/env bash
# The one test command (README): installs what it needs, then runs every check.
# CI runs it through .ci/run on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${DEVTENSOR_CACHE:-$HOME/.cache/devtensor-ci}
VENV=$CACHE/venv
step() { printf '\n==> %s\n' "$*"; }

# Runs a command into LOG and prints only its lines that match PATTERN. When the command fails
# (a build error, say), the log's last 60 lines are printed too: the filter would hide them.
filtered() {
  local log=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  grep -E "$pattern" "$log" || [ "$rc" -ne 0 ] || { echo "no line of $log matched: $pattern" >&2; return 1; }
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log"
    echo "failed (exit $rc): $*" >&2
    return "$rc"
  fi
}

# --- disk: every build below lands in one target directory (about 5 GB) -------------------
# A clean clone builds from nothing: incremental caches would only take space, and full
# debug info doubles the test binaries' size (line tables keep backtraces and valgrind's lines).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$CACHE" "$target_dir"
df -h "$target_dir" "$CACHE" | awk 'NR == 1 || !seen[$0]++'
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 {print $4}')
if [ "$free_kb" -lt $((12 * 1024 * 1024)) ]; then
  echo "warning: $((free_kb / 1024 / 1024)) GiB free under $target_dir; the builds and the venv need about 12" >&2
fi

# --- system packages: libclang for the bindgen ABI check (only when missing) ------
# (libclang-dev brings libclang.so and clang's own headers such as stddef.h.)
if ! dpkg -s libclang-dev >/dev/null 2>&1; then
  step "apt-get install libclang-dev"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi

# --- HIP for the `rocm` feature: Debian's HIP 5.2 runtime and headers, its device
# libraries, and clang/lld 19 (HIP 5.2's own compiler, LLVM 15, predates gfx942) ---------
ROCM_PKGS="libamdhip64-dev rocm-device-libs clang-19 lld-19"
# shellcheck disable=SC2086
if ! dpkg -s $ROCM_PKGS >/dev/null 2>&1; then
  step "apt-get install $ROCM_PKGS"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $ROCM_PKGS >/dev/null
fi
export HIP_PATH=${HIP_PATH:-/usr}

# --- Python venv outside the checkout: a real dlpack.h (apache-tvm-ffi) -------------
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
fi
step "pip install (venv $VENV)"
"$VENV/bin/pip" install -q --disable-pip-version-check apache-tvm-ffi nvidia-cuda-nvrtc
DEVTENSOR_DLPACK_H=$("$VENV/bin/python" -c \
  'import os, tvm_ffi; print(os.path.join(os.path.dirname(tvm_ffi.__file__), "include", "dlpack", "dlpack.h"))')
export DEVTENSOR_DLPACK_H DEVTENSOR_REQUIRE_DLPACK_H=1
echo "dlpack.h: $DEVTENSOR_DLPACK_H"
# NVRTC from pip, so every kernel is compiled here without a GPU or toolkit.
DEVTENSOR_NVRTC=$(dirname "$(find "$VENV" -name 'libnvrtc.so.1[0-9]*' | sort | tail -n 1)")
export DEVTENSOR_NVRTC
echo "NVRTC: $DEVTENSOR_NVRTC"

# --- Rust ------------------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (default features, no default features, python + capi, rocm, everything)"
cargo clippy --all-targets --locked -- -D warnings
cargo clippy --all-targets --locked --no-default-features -- -D warnings
cargo clippy --all-targets --locked --features python,capi -- -D warnings
cargo clippy --all-targets --locked --no-default-features --features rocm -- -D warnings
cargo clippy --all-targets --locked --features python,rocm,capi -- -D warnings
cargo clippy --all-targets --locked -p devtensor-emu -- -D warnings

step "cargo test (unit, integration, doc)"
cargo test --locked --no-fail-fast 2>&1 | tee "$CACHE/cargo-test.log"
grep -E "^test result:" "$CACHE/cargo-test.log" | awk '{p+=$4; f+=$6} END {printf "cargo test summary: %d passed, %d failed\n", p, f}'

step "cargo test --doc --features python (the README's kernel-library snippet and the python API's examples)"
cargo test --locked --doc --features python 2>&1 | tail -n 3

step "GPU suite (no device here: every test must print SKIP)"
filtered "$CACHE/gpu-suite.log" "^SKIP|^test result" cargo test --locked --test gpu_cuda -- --show-output

step "C ABI (--features capi; capi/ builds libdevtensor_c.so): header current (cbindgen), examples/c and the README's C snippet built with cc and run"
# The C tests need the real dlpack.h (DEVTENSOR_DLPACK_H; DEVTENSOR_REQUIRE_DLPACK_H=1: no SKIP).
filtered "$CACHE/capi-test.log" "^SKIP|: OK$|^test result" \
  cargo test --locked --features capi --test capi --test capi_header -- --show-output
filtered "$CACHE/capi-lib.log" "^test result" cargo test --locked --features capi --lib capi::
cargo clippy --all-targets --locked -p devtensor-capi -- -D warnings
filtered "$CACHE/capi-crate-test.log" "^SKIP|: OK$|^test result" \
  cargo test --locked -p devtensor-capi -- --show-output

step "ROCm: cargo test --features rocm against Debian's HIP (no AMD GPU: ROCm tests must SKIP)"
cargo test --locked --no-fail-fast --features rocm 2>&1 | tee "$CACHE/cargo-test-rocm.log"
grep -E "^test result:" "$CACHE/cargo-test-rocm.log" | awk '{p+=$4; f+=$6} END {printf "cargo test --features rocm summary: %d passed, %d failed\n", p, f}'
filtered "$CACHE/gpu-rocm.log" "^SKIP|^test result" cargo test --locked --features rocm --test gpu_rocm -- --show-output

step "devtensor kernels --check --backend rocm (gfx90a, gfx942; no GPU)"
cargo run --locked --quiet --features rocm -- kernels --check --backend rocm --arch gfx90a --arch gfx942

step "devtensor info (with the rocm feature)"
cargo run --locked --quiet --features rocm -- info

step "DLPack ABI check against the real header"
filtered "$CACHE/abi-check.log" "DLPack ABI|SKIP|test result" cargo test --locked --lib abi_check -- --nocapture

step "devtensor info"
cargo run --locked --quiet -- info

step "devtensor kernels --check (NVRTC, no GPU)"
cargo run --locked --quiet -- kernels --check --arch sm_80 --arch sm_90

step "caching pool under valgrind (CPU-backed)"
command -v valgrind >/dev/null || { SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"; $SUDO apt-get install -y -qq valgrind >/dev/null; }
# The binary's path from cargo itself, so that CARGO_TARGET_DIR (or a build.target-dir) is honoured.
pool_bin=$(cargo test --locked --no-run --test caching_alloc --message-format=json | "$VENV/bin/python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "caching_alloc":
        print(m["executable"])
')
[ -x "$pool_bin" ] || { echo "cargo test --no-run did not report the caching_alloc test binary"; exit 1; }
if DEVTENSOR_STRESS_ITERS=2000 valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
     "$pool_bin" --test-threads=1 >"$CACHE/valgrind.log" 2>&1; then
  grep -E "^test result" "$CACHE/valgrind.log"
  echo "valgrind memcheck: no errors, no definite leaks"
else
  tail -n 60 "$CACHE/valgrind.log"
  echo "valgrind found errors"
  exit 1
fi

step "Python package: stubtest and the interop suite (numpy, torch, jax, tvm_ffi)"
VENV="$VENV" bash ci/python_test.sh

# --- CUDA on the emulated driver (emu/): the real host code and the real NVRTC kernels -------
step "emu: the emulated driver's own tests (PTX forms, driver rules, broken programs it must catch)"
cargo test --locked --release -p devtensor-emu 2>&1 | tee "$CACHE/emu-test.log"
grep -E "^test result:" "$CACHE/emu-test.log" | awk '{p+=$4; f+=$6} END {printf "emu test summary: %d passed, %d failed\n", p, f}'

emu_start=$(date +%s)
# shellcheck source=ci/emu.sh
source ci/emu.sh   # builds emu/, puts libcuda.so.1 + the NVRTC shim first on the loader path
export DEVTENSOR_EMU_MEMORY=${DEVTENSOR_EMU_MEMORY:-6G}

step "CUDA on the emulated driver: devtensor info"
cargo run --locked --quiet -- info

for seed in 1 2; do
  step "CUDA on the emulated driver, seed $seed: cargo test (the GPU suite and every CUDA branch), DEVTENSOR_REQUIRE_GPU=1"
  # Seed 2 repeats the GPU suite but its 2^31-element test (2 x 10^10 lane-instructions, about
  # two minutes of the interpreter on CI's two cores): its index math does not depend on timing.
  if [ "$seed" = 1 ]; then tests=(); filter=(); else tests=(--test gpu_cuda); filter=(-- --skip index_math_beyond_2_pow_31_elements); fi
  DEVTENSOR_EMU_SEED=$seed cargo test --locked --no-fail-fast "${tests[@]}" "${filter[@]}" 2>&1 | tee "$CACHE/emu-cuda-$seed.log"
  grep -E "^test result:" "$CACHE/emu-cuda-$seed.log" | awk -v s="$seed" '{p+=$4; f+=$6} END {printf "cargo test on the emulator (seed %s) summary: %d passed, %d failed\n", s, p, f}'
  if grep -E "^SKIP" "$CACHE/emu-cuda-$seed.log"; then echo "a CUDA test skipped on the emulator"; exit 1; fi
done

step "CUDA on the emulated driver: devtensor bench --device cuda:0 --quick (launch metrics, not timings)"
cargo run --locked --quiet -- bench --device cuda:0 --quick

step "CUDA on the emulated driver: the Python package's own CUDA tests (pytest -m cuda)"
set +e
"$VENV/bin/python" -m pytest tests/python -m cuda -v -p no:cacheprovider
rc=$?
set -e
case $rc in
  0) ;;
  5) echo "pytest -m cuda collected no tests" >&2; exit 1 ;;
  *) echo "pytest -m cuda failed ($rc)" >&2; exit "$rc" ;;
esac
step "CUDA on the emulated driver: the C ABI, and examples/c/axpy.c launching its own NVRTC kernel on devtensor tensors"
DEVTENSOR_EMU_SEED=1 filtered "$CACHE/emu-capi.log" "^SKIP|: OK$|^test result" \
  cargo test --locked --features capi --test capi -- --show-output
DEVTENSOR_EMU_SEED=1 filtered "$CACHE/emu-capi-crate.log" "^SKIP|: OK$|^test result" \
  cargo test --locked -p devtensor-capi -- --show-output
if grep -E "^SKIP" "$CACHE/emu-capi.log" "$CACHE/emu-capi-crate.log"; then echo "a C ABI test skipped on the emulator"; exit 1; fi

step "CUDA on the emulated driver: the example kernel library (examples/axpy_ext, installed by ci/python_test.sh)"
set +e
"$VENV/bin/python" -m pytest examples/axpy_ext/tests -m cuda -v -p no:cacheprovider
rc=$?
set -e
[ "$rc" -eq 0 ] || { echo "axpy_ext pytest -m cuda failed ($rc)" >&2; exit "$rc"; }
echo "emulated CUDA steps took $(( $(date +%s) - emu_start )) s"

echo
echo "ci/test.sh: all checks passed"
