#!/usr/bin/env bash
# What a GPU runner runs: the whole GPU suite with its backend's REQUIRE flag,
# the memory checker where there is one, the Python GPU tests, then the GPU
# benchmark; writes bench/results/<date>-<gpu>.md.
#
#   bash ci/gpu.sh                  an NVIDIA runner (DEVTENSOR_REQUIRE_GPU=1)
#   DEVTENSOR_BACKEND=rocm bash ci/gpu.sh
#                                   an AMD runner (ROCm 6/7 or Debian's HIP):
#                                   cargo --features rocm, DEVTENSOR_REQUIRE_ROCM=1,
#                                   pytest without the CUDA-marked tests; the
#                                   bench runs on rocm:0
#
# With cargo on PATH it builds here; without (a runner with no Rust toolchain)
# it uses carry/ from ci/build_carry.sh: the nextest archive, cargo-nextest,
# the release CLI and the abi3 wheels.
#
# PYTHON names the interpreter to install the wheel into and test (default python3);
# DEVTENSOR_REPORT_DIR the report's folder (default bench/results; on a lent machine
# whose working tree is a throwaway copy, the folder that comes back); DEVTENSOR_LOG_DIR
# the folder for each step's full log (default a fresh temporary one). The exit
# status is non-zero when any test step, the kernel check, the bench or the
# memory checker failed.
# shellcheck disable=SC2086  # $CLI, $FEATURES, $KERNEL_CHECK and $PY split into words on purpose
set -uo pipefail
cd "$(dirname "$0")/.." || exit
BACKEND=${DEVTENSOR_BACKEND:-cuda}

if [ "$BACKEND" = rocm ]; then
  export DEVTENSOR_REQUIRE_ROCM=1 HIP_PATH=${HIP_PATH:-$( (hipconfig -p 2>/dev/null) || echo /opt/rocm)}
  FEATURES="--features rocm"
  gpu=$(rocminfo 2>/dev/null | grep -m1 -E '^\s*Marketing Name:.*(Instinct|Radeon)' | sed 's/.*Name:\s*//')
  arch=$(rocminfo 2>/dev/null | grep -m1 -oE 'gfx[0-9a-f]+')
  driver=$(cat /sys/module/amdgpu/version 2>/dev/null || echo "amdgpu")
  [ -n "$arch" ] || { echo "ci/gpu.sh: no AMD GPU (rocminfo found none)"; exit 1; }
  [ -n "$gpu" ] || gpu="AMD $arch"
  KERNEL_CHECK="--backend rocm --arch $arch"
  PYTEST_MARK="not gpu"   # the CPU tests and the rocm-marked ones
  BENCH_DEVICE="rocm:0"
  TEST_TARGET=gpu_rocm
else
  export DEVTENSOR_REQUIRE_GPU=1
  # The C ABI's tests too (tests/capi.rs on the GPU; capi/tests/c_programs.rs, with
  # examples/c/axpy.c, where DEVTENSOR_DLPACK_H names a dlpack.h, else they print SKIP).
  FEATURES="--features capi"
  CAPI_TESTS=1
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  [ -n "$gpu" ] || { echo "ci/gpu.sh: no NVIDIA GPU (nvidia-smi found none)"; exit 1; }
  KERNEL_CHECK="--arch $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d . | sed 's/^/sm_/')"
  PYTEST_MARK="gpu or not gpu"   # everything; rocm tests skip visibly
  BENCH_DEVICE="cuda:0"
  TEST_TARGET=gpu_cuda
fi
slug=$(echo "$gpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//')
report_dir=${DEVTENSOR_REPORT_DIR:-bench/results}
mkdir -p "$report_dir"
report="$report_dir/$(date -u +%Y-%m-%d)-$slug.md"
log=${DEVTENSOR_LOG_DIR:-$(mktemp -d)}
mkdir -p "$log"
PY=${PYTHON:-python3}
# DEVTENSOR_STEP_TIMEOUT=S caps each step at S seconds (DEVTENSOR_SANITIZER_TIMEOUT
# each sanitizer tool), for a lease of fixed length: a hung step is reported and
# the rest still runs.
step() { if [ -n "${DEVTENSOR_STEP_TIMEOUT:-}" ]; then timeout "$DEVTENSOR_STEP_TIMEOUT" "$@"; else "$@"; fi; }

# NVRTC: the toolkit's, or the one pip installed for torch / cupy.
if [ -z "${DEVTENSOR_NVRTC:-}" ]; then
  nvrtc=$($PY - <<'PYEOF' 2>/dev/null
import glob, os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    hits = sorted(glob.glob(os.path.join(d, "nvidia", "**", "libnvrtc.so.1[0-9]*"), recursive=True))
    if hits:
        print(os.path.dirname(hits[-1])); sys.exit()
PYEOF
)
  [ -n "$nvrtc" ] && export DEVTENSOR_NVRTC=$nvrtc
fi

if command -v cargo >/dev/null; then
  CARRY=""
  CLI="cargo run --release --quiet $FEATURES --"
  BIN="${CARGO_TARGET_DIR:-target}/release/devtensor"
  run_rust_tests() {
    step cargo test --release --no-fail-fast $FEATURES -- --test-threads=4 &&
      if [ -n "${CAPI_TESTS:-}" ]; then step cargo test --release --no-fail-fast -p devtensor-capi; fi
  }
  # The binary's path from cargo itself, so that CARGO_TARGET_DIR is honoured.
  gpu_test_bin() {
    cargo test --release --no-run $FEATURES --test $TEST_TARGET --message-format=json 2>/dev/null | $PY -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])
' "$TEST_TARGET" | head -n 1
  }
else
  CARRY=1
  CLI="carry/devtensor"
  BIN="carry/devtensor"
  # One test at a time: nextest runs each test in a process of its own, so the suite's
  # #[serial(gpu_memory)] (the tests that fill the GPU) would no longer keep the others
  # off the device while they run (DEVTENSOR_TEST_THREADS=N to run N at a time).
  # Not capi_header and cli: they open the build machine's paths, compiled in
  # (env!("CARGO_MANIFEST_DIR"), env!("CARGO_BIN_EXE_devtensor")), and need no GPU.
  run_rust_tests() {
    mkdir -p "$log/archive"  # nextest extracts only into a folder that exists
    step carry/cargo-nextest nextest run --archive-file carry/nextest-archive.tar.zst \
      --workspace-remap . --extract-to "$log/archive" --extract-overwrite --no-fail-fast \
      --test-threads "${DEVTENSOR_TEST_THREADS:-1}" \
      -E 'not (binary_id(devtensor::capi_header) | binary_id(devtensor::cli))'
  }
  gpu_test_bin() {
    local f
    for f in "$log"/archive/target/release/deps/"$TEST_TARGET"-*; do
      case $f in *.d) ;; *) [ -x "$f" ] && { echo "$f"; return; } ;; esac
    done
  }
fi

echo "==> devtensor info";            $CLI info 2>&1 | tee "$log/info.txt"
echo "==> kernels";                   $CLI kernels --check $KERNEL_CHECK 2>&1 | tee "$log/kernels.txt"; kernels_rc=${PIPESTATUS[0]}
echo "==> Rust tests (GPU required)"; run_rust_tests 2>&1 | tee "$log/rust.txt"; rust_rc=${PIPESTATUS[0]}

echo "==> Python tests (GPU required)"
# The carried wheel only where the Rust side is the carried one too (not a stale carry/).
wheel=$([ -n "$CARRY" ] && find carry/wheels -name '*.whl' 2>/dev/null | head -n 1)
if [ -n "$wheel" ]; then $PY -m pip install -q --no-deps --force-reinstall "$wheel"
elif [ "$BACKEND" = rocm ]; then $PY -m pip install -q . --config-settings=build-args="--features python,cuda,rocm"
else $PY -m pip install -q . ; fi
pip_rc=$?
step $PY -m pytest tests/python -q -rs -m "$PYTEST_MARK" 2>&1 | tee "$log/python.txt"; py_rc=${PIPESTATUS[0]}
[ "$py_rc" = 5 ] && py_rc=1  # nothing collected is a failure
[ "$pip_rc" = 0 ] || { echo "(pip install of devtensor failed: exit $pip_rc)" >> "$log/python.txt"; py_rc=1; }

# The example kernel library (examples/axpy_ext): torch's allocator and stream on a real GPU.
ext_rc=0
if [ "$BACKEND" = cuda ]; then
  echo "==> examples/axpy_ext tests"
  ext=$([ -n "$CARRY" ] && find carry/ext-wheels -name '*.whl' 2>/dev/null | head -n 1)
  if [ -n "$ext" ]; then $PY -m pip install -q --no-deps --force-reinstall "$ext"
  else $PY -m pip install -q --no-deps ./examples/axpy_ext; fi
  pip_rc=$?
  step $PY -m pytest examples/axpy_ext/tests -q -rs -m "$PYTEST_MARK" 2>&1 | tee "$log/axpy_ext.txt"; ext_rc=${PIPESTATUS[0]}
  [ "$ext_rc" = 5 ] && ext_rc=1
  [ "$pip_rc" = 0 ] || { echo "(pip install of axpy_ext failed: exit $pip_rc)" >> "$log/axpy_ext.txt"; ext_rc=1; }
fi

echo "==> benchmarks"
step $CLI bench --device "$BENCH_DEVICE" 2>&1 | tee "$log/bench.txt"; bench_rc=${PIPESTATUS[0]}
peers_rc=0
if [ "$BACKEND" = cuda ]; then step $PY bench/gpu_copy_peers.py --bin "$BIN" 2>&1 | tee "$log/peers.txt"; peers_rc=${PIPESTATUS[0]}
else echo "(torch ROCm peer bench: bench/gpu_copy_peers.py runs on torch.cuda, which is HIP on a ROCm torch)" > "$log/peers.txt"; fi
# Under a step cap the short form, so that the table (CUDA rows first) is printed at all.
step $PY bench/python_handoff.py ${DEVTENSOR_STEP_TIMEOUT:+--quick} 2>&1 | tee "$log/handoff.txt" || true

# The memory checker last: the slowest step, by far.
sanitizer="not available"
sanitizer_failed=0
if [ "$BACKEND" = cuda ] && command -v compute-sanitizer >/dev/null; then
  bin=$(gpu_test_bin)
  if [ -n "$bin" ]; then
    # memcheck: out-of-bounds and misaligned accesses, leaks; racecheck: shared-memory
    # hazards (the tiled transposes); synccheck: barriers in divergent code.
    sanitizer=""
    # memcheck also reports failed API calls by default; the suite makes some on
    # purpose (running out of memory; cuPointerGetAttribute on host memory, the
    # probe that names a pointer's device), so only memory errors count.
    for tool in memcheck racecheck synccheck; do
      echo "==> compute-sanitizer $tool $bin"
      api=(); [ "$tool" = memcheck ] && api=(--report-api-errors no)
      if timeout "${DEVTENSOR_SANITIZER_TIMEOUT:-${DEVTENSOR_STEP_TIMEOUT:-0}}" compute-sanitizer --tool "$tool" "${api[@]}" --error-exitcode 3 "$bin" --test-threads=1 >>"$log/sanitizer.txt" 2>&1; then
        sanitizer="$sanitizer $tool: clean;"
      elif [ $? = 124 ]; then
        sanitizer="$sanitizer $tool: stopped at the step timeout;"
      else
        sanitizer="$sanitizer $tool: FAILED (see the log below);"
        sanitizer_failed=1
      fi
    done
  else
    sanitizer=" no $TEST_TARGET test binary to run it on: FAILED;"
    sanitizer_failed=1
  fi
fi

{
  echo "# GPU run $(date -u +%Y-%m-%dT%H:%MZ) — $gpu"
  echo
  echo "- device: $gpu, driver $driver"
  echo "- Rust tests: $(grep -E '^test result:|Summary' "$log/rust.txt" | tail -n 3 | tr '\n' ' ') (exit $rust_rc)"
  echo "- Python tests: $(tail -n 1 "$log/python.txt") (exit $py_rc)"
  [ -f "$log/axpy_ext.txt" ] && echo "- examples/axpy_ext tests: $(tail -n 1 "$log/axpy_ext.txt") (exit $ext_rc)"
  echo "- kernels --check: exit $kernels_rc"
  echo "- devtensor bench: exit $bench_rc; gpu_copy_peers.py: exit $peers_rc"
  echo "- compute-sanitizer:$sanitizer"
  # Which tests failed: the end of each failing log (nextest, cargo test and pytest list them there).
  log_end() { [ "$2" = 0 ] || [ ! -f "$log/$1.txt" ] || { echo; echo "## $1: the end of the log"; echo '```'; tail -n 40 "$log/$1.txt"; echo '```'; }; }
  log_end rust "$rust_rc"; log_end python "$py_rc"; log_end axpy_ext "$ext_rc"
  echo
  echo '## devtensor info'; echo '```'; cat "$log/info.txt"; echo '```'
  echo '## Kernels'; echo '```'; cat "$log/kernels.txt"; echo '```'
  echo '## Strided copy (devtensor bench)'; echo '```'; cat "$log/bench.txt"; echo '```'
  echo '## devtensor vs torch (same process)'; cat "$log/peers.txt"
  echo '## Handoff latency'; cat "$log/handoff.txt"
  [ -f "$log/sanitizer.txt" ] && { echo '## compute-sanitizer'; echo '```'; tail -n 20 "$log/sanitizer.txt"; echo '```'; }
} > "$report"
echo "report: $report"
[ "$rust_rc" = 0 ] && [ "$py_rc" = 0 ] && [ "$ext_rc" = 0 ] && [ "$kernels_rc" = 0 ] &&
  [ "$bench_rc" = 0 ] && [ "$peers_rc" = 0 ] && [ "$sanitizer_failed" = 0 ]
