#!/usr/bin/env bash
# The Python package's checks: build the wheel with maturin, install it into a venv that
# holds the real consumers (numpy, torch, jax[cpu], apache-tvm-ffi), run mypy.stubtest on
# the hand-written stub, then the pytest interop suite.
#
#   VENV=/path/to/venv ci/python_test.sh [extra pytest args]
#
# $VENV defaults to the one ci/test.sh uses ($DEVTENSOR_CACHE/venv, outside the checkout)
# and is created when missing. Idempotent: packages that already import are not
# reinstalled, and cargo reuses its build cache, so a warm run takes seconds plus the tests.
# torch's default Linux wheel is large (~5 GB installed): keep the venv and pip's cache.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${DEVTENSOR_CACHE:-$HOME/.cache/devtensor-ci}
VENV=${VENV:-$CACHE/venv}
PY="$VENV/bin/python"
step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$PY" ]; then
  step "creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi
"$PY" -c "import sys; assert sys.version_info >= (3, 10), sys.version"

# --- consumers and tools (only what does not import yet) --------------------------------
# "spec|import check" pairs.
NEED=(
  "maturin>=1.9.4,<2|import maturin"
  "pytest|import pytest"
  "mypy|import mypy.stubtest"
  "numpy|import numpy"
  "ml_dtypes|import ml_dtypes"
  "torch|import torch"
  "jax[cpu]|import jax, jaxlib"
  "apache-tvm-ffi|import tvm_ffi"
)
missing=()
for pair in "${NEED[@]}"; do
  spec=${pair%%|*}
  check=${pair#*|}
  if ! "$PY" -c "$check" >/dev/null 2>&1; then
    missing+=("$spec")
  fi
done
# maturin is a binary too: make sure the venv has it.
[ -x "$VENV/bin/maturin" ] || missing+=("maturin>=1.9.4,<2")
if [ ${#missing[@]} -gt 0 ]; then
  step "pip install ${missing[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${missing[@]}"
else
  step "consumers already installed in $VENV"
fi
"$PY" - <<'EOF'
import importlib
for name in ["numpy", "ml_dtypes", "torch", "jax", "tvm_ffi", "pytest", "mypy"]:
    try:
        m = importlib.import_module(name)
        print(f"  {name:8} {getattr(m, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"  {name:8} NOT IMPORTABLE: {type(e).__name__}: {e}")
EOF

# --- build and install the wheel ----------------------------------------------------------
step "maturin build --release"
WHEELS=$(mktemp -d "${TMPDIR:-/tmp}/devtensor-wheels.XXXXXX")
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/maturin" build --release --locked --quiet -i "$PY" -o "$WHEELS"
WHEEL=$(ls "$WHEELS"/devtensor-*.whl)
echo "wheel: $(basename "$WHEEL")"
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
# Import from outside the checkout so that python/devtensor (no extension) cannot shadow it.
(cd "$WHEELS" && "$PY" -c 'import devtensor, sys; print("devtensor", devtensor.__version__, "from", devtensor.__file__)')

# --- stub check ------------------------------------------------------------------------------
step "mypy.stubtest devtensor._devtensor"
(cd "$WHEELS" && "$PY" -m mypy.stubtest devtensor._devtensor)

# --- the same abi3 wheel on the other CPythons here (3.10 and later) -----------------------------
step "the abi3 wheel on other CPythons"
"$PY" -m zipfile -e "$WHEEL" "$WHEELS/site"
ours=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
seen=" $ours "
for other in $(command -v python3.10 python3.11 python3.12 python3.13 python3.14 2>/dev/null) \
             "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3; do
  v=$("$other" -c 'import sys; assert sys.version_info >= (3, 10); print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
  case "$seen" in *" $v "*) continue ;; esac
  seen="$seen$v "
  (cd "$WHEELS" && PYTHONPATH="$WHEELS/site" "$other" "$OLDPWD/tests/python/abi3_smoke.py")
done
[ "$seen" != " $ours " ] || echo "SKIP abi3 smoke: no CPython >= 3.10 other than $ours here"

# --- the interop suite ---------------------------------------------------------------------------
step "pytest tests/python"
set +e
"$PY" -m pytest tests/python -v -p no:cacheprovider "$@"
rc=$?
set -e
case $rc in
  0) ;;
  5) echo "ci/python_test.sh: FAILED: pytest collected no tests" >&2; exit 1 ;;
  *) echo "ci/python_test.sh: FAILED: pytest exited with $rc" >&2; exit "$rc" ;;
esac

# --- the example kernel library on devtensor's Rust/PyO3 API (examples/axpy_ext) ---------------
# Its own workspace and Cargo.lock; built in the main target dir so that devtensor's
# dependencies compiled for the wheel above are reused (about a minute, not six).
step "examples/axpy_ext: maturin build, pytest"
"$VENV/bin/maturin" build --release --locked --quiet -m examples/axpy_ext/Cargo.toml -i "$PY" -o "$WHEELS/ext" \
  --target-dir "${CARGO_TARGET_DIR:-$PWD/target}"
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEELS"/ext/axpy_ext-*.whl
set +e
(cd "$WHEELS" && "$PY" -m pytest "$OLDPWD/examples/axpy_ext/tests" -v -p no:cacheprovider -rs)
rc=$?
set -e
case $rc in
  0) echo "ci/python_test.sh: python checks passed" ;;
  5) echo "ci/python_test.sh: FAILED: pytest collected no tests" >&2; exit 1 ;;
  *) echo "ci/python_test.sh: FAILED: pytest exited with $rc" >&2; exit "$rc" ;;
esac
