#!/usr/bin/env python3
"""CPU strided copy: devtensor vs NumPy's ascontiguousarray vs torch's .contiguous().

Takes the pattern matrix from `devtensor bench --json` (the same as `cargo bench`;
its GB/s, a copy into a preallocated destination, is the `cli` column), rebuilds
every source view with as_strided in NumPy, imports it zero-copy into devtensor
(devtensor.from_dlpack) and torch, and times the three copies that allocate their
output (`Tensor.contiguous()`, `ndarray.copy()`, `torch .contiguous()`) in this
process, interleaved round by round so that load on the machine hits all alike.
Prints GB/s (read + write) and the ratio of devtensor to the faster peer.

    python bench/cpu_copy_peers.py [--quick] [--bin target/release/devtensor]
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import devtensor

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
    ap.add_argument("--min-time", type=float, default=0.15, help="seconds per timing, per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best of)")
    ap.add_argument("--filter", help="only patterns whose name contains this text")
    args = ap.parse_args()

    cmd = [args.bin, "bench", "--json"] + (["--quick"] if args.quick else [])
    cmd += ["--filter", args.filter] if args.filter else []
    rows = [json.loads(line) for line in subprocess.check_output(cmd, text=True).splitlines() if line.startswith("{")]
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    head = f"{'pattern':<34} {'cli':>7} {'devtensor':>9} {'numpy':>8} {'torch':>8} {'vs best peer':>12}"
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
        dv = devtensor.from_dlpack(view)
        assert dv.data_ptr == view.ctypes.data, "devtensor must import the view without a copy"
        timed = {
            # A contiguous view is returned as is by contiguous(): force the copy.
            "devtensor": (lambda: dv.clone()) if dv.is_contiguous() else (lambda: dv.contiguous()),
            "numpy": lambda: view.copy(order="C"),
        }
        if torch is not None:
            tb = torch.from_numpy(base)
            if any(s < 0 for s in r["src_strides"]):
                # torch has no negative strides: flip() copies, so time flip on the positive view
                pos = [abs(s) for s in r["src_strides"]]
                dims = [i for i, s in enumerate(r["src_strides"]) if s < 0]
                off = r["src_offset"] + sum((n - 1) * s for n, s in zip(r["shape"], r["src_strides"]) if s < 0)
                src = torch.as_strided(tb, r["shape"], pos, off)
                timed["torch"] = lambda src=src, dims=dims: src.flip(dims)
            else:
                tv = torch.as_strided(tb, r["shape"], r["src_strides"], r["src_offset"])
                timed["torch"] = (lambda tv=tv: tv.clone()) if tv.is_contiguous() else (lambda tv=tv: tv.contiguous())
        best = {k: float("inf") for k in timed}
        for _ in range(args.rounds):
            for k, fn in timed.items():
                best[k] = min(best[k], best_time(fn, args.min_time))
        gb = {k: moved / t / 1e9 for k, t in best.items()}
        gb_t = gb.get("torch", float("nan"))
        peer = max(gb["numpy"], gb_t if gb_t == gb_t else 0.0)
        ratio = gb["devtensor"] / peer
        worst = min(worst, ratio)
        print(f"{r['name']:<34} {r['gbps']:7.2f} {gb['devtensor']:9.2f} {gb['numpy']:8.2f} {gb_t:8.2f} {ratio:11.2f}x")
    print(f"\nworst ratio devtensor / faster peer: {worst:.2f}x  (numpy {np.__version__}"
          + (f", torch {torch.__version__}, {torch.get_num_threads()} threads" if torch else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
