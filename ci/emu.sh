#!/usr/bin/env bash
# The emulated CUDA driver (emu/, crate devtensor-emu) for running the CUDA backend without a GPU.
#
#   source ci/emu.sh     build, install, check, and export the environment into this shell
#   bash ci/emu.sh       build, install, check, and print the exports (eval-able)
#
# Installs target/emu-lib/ (or $DEVTENSOR_EMU_DIR) with the one built library and three names
# for it, as symlinks so that every name is the same file and the loader maps it once (one set of
# statics: the NVRTC shim's PTX records are visible to the driver):
#   libdevtensor_emu.so   the cdylib (soname libcuda.so.1)
#   libcuda.so.1, libcuda.so  -> cudarc dlopens "libcuda.so" (then .so.1) from LD_LIBRARY_PATH
#   libnvrtc.so.13            -> devtensor opens $DEVTENSOR_NVRTC
# Exports: LD_LIBRARY_PATH (emu dir prepended), DEVTENSOR_EMU_NVRTC (the real NVRTC the shim
# forwards to, found as ci/test.sh finds it), DEVTENSOR_NVRTC=<emu dir>/libnvrtc.so.13,
# DEVTENSOR_REQUIRE_GPU=1 (GPU tests fail instead of printing SKIP), DEVTENSOR_REQUIRE_GPUS=2
# (the tests that need two GPUs fail instead of printing SKIP).

_devtensor_emu_main() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1

  # --- build (honours CARGO_TARGET_DIR; the artifact path comes from cargo itself) ---------
  echo "==> cargo build --locked --release -p devtensor-emu" >&2
  local json so
  json=$(cd "$root" && cargo build --locked --release -p devtensor-emu --message-format=json-render-diagnostics) || {
    echo "ci/emu.sh: cargo build failed" >&2
    return 1
  }
  so=$(printf '%s\n' "$json" | grep '"reason":"compiler-artifact"' | grep '"name":"devtensor_emu"' \
    | grep -o '"filenames":\[[^]]*\]' | grep -o '"[^"]*libdevtensor_emu\.so"' | tr -d '"' | tail -n 1)
  if [ -z "$so" ] || [ ! -f "$so" ]; then
    echo "ci/emu.sh: no libdevtensor_emu.so among cargo's artifacts" >&2
    return 1
  fi

  # --- install ---------------------------------------------------------------------------
  local dir=${DEVTENSOR_EMU_DIR:-$(dirname "$(dirname "$so")")/emu-lib}
  mkdir -p "$dir" || return 1
  dir=$(cd "$dir" && pwd)
  # Copy to a temporary name and rename: a process that has the old one mapped keeps it.
  cp "$so" "$dir/.libdevtensor_emu.so.tmp.$$" && mv -f "$dir/.libdevtensor_emu.so.tmp.$$" "$dir/libdevtensor_emu.so" || return 1
  local name
  for name in libcuda.so.1 libcuda.so libnvrtc.so.13; do
    ln -sfn libdevtensor_emu.so "$dir/$name" || return 1
  done
  echo "emulator: $dir (from $so)" >&2

  # --- the real NVRTC, as ci/test.sh finds it ----------------------------------------------
  local real=${DEVTENSOR_EMU_NVRTC:-}
  if [ -z "$real" ] && [ -n "${DEVTENSOR_NVRTC:-}" ]; then
    # Not if it already points at an emulator install (sourced twice).
    case "$(readlink -f "$DEVTENSOR_NVRTC" 2>/dev/null)" in
      *libdevtensor_emu.so) ;;
      *) real=$DEVTENSOR_NVRTC ;;
    esac
  fi
  if [ -z "$real" ]; then
    local venv=${DEVTENSOR_CACHE:-$HOME/.cache/devtensor-ci}/venv found
    found=$(find "$venv" -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | sort | tail -n 1)
    [ -n "$found" ] && real=$(dirname "$found")
  fi
  if [ -z "$real" ]; then
    echo "ci/emu.sh: no real NVRTC: set DEVTENSOR_NVRTC or DEVTENSOR_EMU_NVRTC (ci/test.sh installs pip's)" >&2
    return 1
  fi
  echo "real NVRTC: $real" >&2

  # --- check: both names resolve to one loaded object ----------------------------------------
  if command -v python3 >/dev/null 2>&1; then
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3 - "$dir" <<'PY' >&2 || return 1
import ctypes, sys
d = sys.argv[1]
cuda = ctypes.CDLL("libcuda.so")                 # what cudarc opens first, by bare name
nvrtc = ctypes.CDLL(d + "/libnvrtc.so.13")       # what devtensor opens through DEVTENSOR_NVRTC
a = ctypes.cast(cuda.nvrtcVersion, ctypes.c_void_p).value
b = ctypes.cast(nvrtc.nvrtcVersion, ctypes.c_void_p).value
if cuda._handle != nvrtc._handle or a != b:
    sys.exit(f"ci/emu.sh: libcuda.so and libnvrtc.so.13 are different objects ({cuda._handle:#x} {nvrtc._handle:#x})")
print(f"check: dlopen(libcuda.so) and dlopen({d}/libnvrtc.so.13) are one object (handle {cuda._handle:#x})")
PY
  else
    echo "ci/emu.sh: python3 not found, same-object check skipped" >&2
  fi

  _DEVTENSOR_EMU_DIR_OUT=$dir
  _DEVTENSOR_EMU_REAL_OUT=$real
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # Sourced: export into the caller's shell.
  if _devtensor_emu_main; then
    export LD_LIBRARY_PATH="$_DEVTENSOR_EMU_DIR_OUT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export DEVTENSOR_EMU_NVRTC="$_DEVTENSOR_EMU_REAL_OUT"
    export DEVTENSOR_NVRTC="$_DEVTENSOR_EMU_DIR_OUT/libnvrtc.so.13"
    export DEVTENSOR_REQUIRE_GPU=1
    export DEVTENSOR_REQUIRE_GPUS=2  # the emulated driver's two GPUs (DEVTENSOR_EMU_DEVICES)
    unset _DEVTENSOR_EMU_DIR_OUT _DEVTENSOR_EMU_REAL_OUT
  else
    unset _DEVTENSOR_EMU_DIR_OUT _DEVTENSOR_EMU_REAL_OUT
    return 1
  fi
else
  set -euo pipefail
  _devtensor_emu_main
  printf 'export LD_LIBRARY_PATH=%q\n' "$_DEVTENSOR_EMU_DIR_OUT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  printf 'export DEVTENSOR_EMU_NVRTC=%q\n' "$_DEVTENSOR_EMU_REAL_OUT"
  printf 'export DEVTENSOR_NVRTC=%q\n' "$_DEVTENSOR_EMU_DIR_OUT/libnvrtc.so.13"
  printf 'export DEVTENSOR_REQUIRE_GPU=1\n'
fi
