#!/usr/bin/env python3
"""Mixed-size allocation trace replayed through devtensor.empty and torch.empty
(and numpy.empty on the CPU, cupy.empty on CUDA), same process.

The trace is deterministic: log-uniform sizes from 256 B to 64 MiB, up to 64
live tensors, frees in random order — the shape of a training step's
temporaries. On CUDA both sides use their caching allocators, so this compares
devtensor's pool with torch's CUDACachingAllocator; on the CPU it compares
devtensor's allocator path with torch's and numpy's (malloc underneath).

    python bench/alloc_trace.py [--device cuda:0] [--ops 20000]
"""

import argparse
import random
import sys
import time

import numpy as np

import devtensor

try:
    import torch
except ImportError:
    torch = None


def make_trace(ops, seed=7):
    rng = random.Random(seed)
    trace, live = [], 0
    for _ in range(ops):
        if live < 64 and (live == 0 or rng.random() < 0.55):
            size = int(2 ** rng.uniform(8, 26))
            trace.append(("alloc", size))
            live += 1
        else:
            trace.append(("free", rng.randrange(live)))
            live -= 1
    return trace


def replay(trace, empty):
    live = []
    t0 = time.perf_counter()
    for op, arg in trace:
        if op == "alloc":
            live.append(empty(arg))
        else:
            live[arg] = live[-1]
            live.pop()
    live.clear()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0" if torch is not None and torch.cuda.is_available() else "cpu")
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    trace = make_trace(args.ops)
    dev = args.device
    peers = {"devtensor.empty": lambda n: devtensor.empty(n, dtype="uint8", device=dev)}
    if torch is not None:
        peers["torch.empty"] = lambda n: torch.empty(n, dtype=torch.uint8, device=dev)
    if dev == "cpu":
        peers["numpy.empty"] = lambda n: np.empty(n, dtype=np.uint8)
    else:
        try:
            import cupy

            peers["cupy.empty"] = lambda n: cupy.empty(n, dtype=cupy.uint8)
        except ImportError:
            pass
    results = {}
    for name, fn in peers.items():
        replay(trace, fn)  # warm the caches
        if dev != "cpu":
            torch.cuda.synchronize()
        results[name] = min(replay(trace, fn) for _ in range(args.repeat)) / len(trace) * 1e9
    ours = results["devtensor.empty"]
    print(f"allocation trace on {dev}: {len(trace)} ops (alloc or free), ns per op, best of {args.repeat}\n")
    print("| allocator | ns/op | devtensor / this |")
    print("|---|---:|---:|")
    for name, ns in results.items():
        print(f"| {name} | {ns:.0f} | {ours / ns:.2f} |")
    if dev != "cpu":
        s = devtensor.memory_stats(dev)
        print(f"\ndevtensor pool: {s['segments']} segments, {s['reserved_bytes'] >> 20} MiB reserved, "
              f"peak {s['peak_reserved_bytes'] >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
