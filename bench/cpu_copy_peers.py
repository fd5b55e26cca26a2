#!/usr/bin/env python3
"""CPU strided copy: devtensor vs NumPy's ascontiguousarray vs torch's .contiguous().

Runs `devtensor bench --json` (the same pattern matrix as `cargo bench`), then
rebuilds every source view with as_strided in NumPy and torch and times them in
this process, on the same machine, right after. Prints GB/s (read + write) and
the ratio of devtensor to the faster peer.

    python bench/cpu_copy_peers.py [--quick] [--bin target/release/devtensor]
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # torch is optional: the table then compares with NumPy only
    torch = None

DTYPES = {1: np.uint8, 2: np.uint16, 4: np.float32, 8: np.float64, 16: np.complex128}


def best_time(fn, min_time):
    fn()  # warm-up
    best, total = float("inf"), 0.0
    while total < min_time:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, total = min(best, dt), total + dt
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/devtensor")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--filter", help="only patterns whose name contains this text")
    args = ap.parse_args()

    cmd = [args.bin, "bench", "--json"] + (["--quick"] if args.quick else [])
    cmd += ["--filter", args.filter] if args.filter else []
    rows = [json.loads(line) for line in subprocess.check_output(cmd, text=True).splitlines() if line.startswith("{")]
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    head = f"{'pattern':<34} {'devtensor':>9} {'numpy':>8} {'torch':>8} {'vs best peer':>12}"
    print(head + "\n" + "-" * len(head))
    worst = float("inf")
    for r in rows:
        e = r["elem_size"]
        dt = DTYPES.get(e)
        if dt is None:
            continue
        base = np.arange(r["src_alloc_elems"], dtype=np.uint64).astype(dt)
        itemsize = base.itemsize
        view = np.lib.stride_tricks.as_strided(
            base[r["src_offset"]:], shape=r["shape"], strides=[s * itemsize for s in r["src_strides"]]
        )
        moved = 2 * view.size * itemsize
        # ascontiguousarray returns a contiguous input as is: force the copy.
        t_np = best_time(lambda: view.copy(order="C"), args.min_time)
        gb_np = moved / t_np / 1e9
        gb_t = float("nan")
        if torch is not None:
            tb = torch.from_numpy(base)
            if any(s < 0 for s in r["src_strides"]):
                # torch has no negative strides: flip() copies, so time flip on the positive view
                pos = [abs(s) for s in r["src_strides"]]
                dims = [i for i, s in enumerate(r["src_strides"]) if s < 0]
                off = r["src_offset"] + sum((n - 1) * s for n, s in zip(r["shape"], r["src_strides"]) if s < 0)
                src = torch.as_strided(tb, r["shape"], pos, off)
                t_t = best_time(lambda: src.flip(dims), args.min_time)
            else:
                tv = torch.as_strided(tb, r["shape"], r["src_strides"], r["src_offset"])
                t_t = best_time(lambda: tv.contiguous() if not tv.is_contiguous() else tv.clone(), args.min_time)
            gb_t = moved / t_t / 1e9
        peer = max(gb_np, gb_t if gb_t == gb_t else 0.0)
        ratio = r["gbps"] / peer
        worst = min(worst, ratio)
        print(f"{r['name']:<34} {r['gbps']:9.2f} {gb_np:8.2f} {gb_t:8.2f} {ratio:11.2f}x")
    print(f"\nworst ratio devtensor / faster peer: {worst:.2f}x  (numpy {np.__version__}"
          + (f", torch {torch.__version__}, {torch.get_num_threads()} threads" if torch else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
