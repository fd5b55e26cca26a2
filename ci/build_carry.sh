#!/usr/bin/env bash
# Builds what a GPU runner without a Rust toolchain needs, into carry/ (ignored):
#   carry/nextest-archive.tar.zst  every test binary (cargo nextest archive)
#   carry/cargo-nextest            the runner for that archive
#   carry/devtensor                the release CLI (info, bench, kernels)
#   carry/wheels/*.whl             the abi3 Python wheel (any CPython >= 3.10)
#   carry/ext-wheels/*.whl         the example kernel library examples/axpy_ext (abi3)
# Then on the runner: `bash ci/gpu.sh` (it finds carry/ and uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p carry/wheels
# capi: tests/capi.rs runs on the GPU too, as in ci/gpu.sh's cargo path.
# zstd level 19: a third of the default level's size (the test binaries share most of their
# code), for a carry that travels size-capped (64 MiB with the working tree on a lent machine).
cargo nextest archive --release --features capi --zstd-level 19 --archive-file carry/nextest-archive.tar.zst
cp "$(command -v cargo-nextest)" carry/cargo-nextest
strip carry/cargo-nextest 2>/dev/null || true  # the carry travels size-capped
cargo build --release --bin devtensor
cp "${CARGO_TARGET_DIR:-target}/release/devtensor" carry/devtensor
VENV=${VENV:-$HOME/.cache/devtensor-ci/venv}
[ -x "$VENV/bin/maturin" ] || "$VENV/bin/pip" install -q "maturin>=1.9.4,<2"
rm -f carry/wheels/*.whl
# pyproject.toml picks the features (python, cuda; not the default set, which adds the CLI).
"$VENV/bin/maturin" build --release -o carry/wheels
rm -rf carry/ext-wheels
"$VENV/bin/maturin" build --release --locked -m examples/axpy_ext/Cargo.toml -o carry/ext-wheels \
  --target-dir "${CARGO_TARGET_DIR:-$PWD/target}"
ls -la carry carry/wheels carry/ext-wheels
du -sh carry
