#!/usr/bin/env python3
"""CPU copies alternated call by call with torch's, in one process.

Real programs mix libraries: a devtensor copy, then a torch op, then another
copy. torch's OpenMP threads spin for a while after each parallel loop, so
the cores a devtensor copy would split across may be busy. This times each
copy alone (a run of calls of one library), then alternated with torch's
copy of the same view (devtensor, torch, devtensor, ...), and prints the
median GB/s (read + write) of each and the ratio devtensor / torch.

    python bench/cpu_copy_interleaved.py [--seconds 2] [--sizes 1,4,16]
"""

import argparse
import statistics
import time

import numpy as np

import devtensor

try:
    import torch
except ImportError:
    torch = None


def medians(fns, seconds):
    """Median seconds per call of each function, called in turn until `seconds` pass."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    ap.add_argument("--sizes", default="1,4,16", help="MiB of 4 KiB rows (x[:, :1024] of an f32 matrix twice as wide)")
    args = ap.parse_args()
    if torch is None:
        print("SKIP: torch is not installed")
        return 0
    print(f"{'case':<34} {'devtensor':>10} {'torch':>8} {'ratio':>7}")
    for mib in [int(s) for s in args.sizes.split(",")]:
        rows = (mib << 20) // 4096
        base = np.arange(rows * 2048, dtype=np.float32).reshape(rows, 2048)
        view = base[:, :1024]
        dv = devtensor.from_dlpack(view)
        tv = torch.from_numpy(base)[:, :1024]
        moved = 2 * view.nbytes
        ours = lambda: dv.contiguous()  # noqa: E731
        theirs = lambda: tv.contiguous()  # noqa: E731
        alone = {**medians({"devtensor": ours}, args.seconds), **medians({"torch": theirs}, args.seconds)}
        mixed = medians({"devtensor": ours, "torch": theirs}, args.seconds)
        for label, m in [("alone", alone), ("alternated", mixed)]:
            gb = {k: moved / t / 1e9 for k, t in m.items()}
            print(f"{f'rows {mib} MiB, {label}':<34} {gb['devtensor']:10.1f} {gb['torch']:8.1f} "
                  f"{gb['devtensor'] / gb['torch']:6.2f}x", flush=True)
    print(f"\nmedian GB/s (read + write); torch {torch.__version__}, {torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
