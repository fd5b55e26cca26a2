#!/usr/bin/env python3
"""GPU strided copy: devtensor vs torch's .contiguous(), same process, CUDA events.

Takes the pattern matrix from `devtensor bench --list` (scaled up so every
buffer is well past the L2 cache), rebuilds each view on the GPU with
torch.as_strided, imports it into devtensor zero-copy (DLPack), and times
`devtensor .contiguous()` and `torch .contiguous()` on the same memory, plus a
same-size device-to-device copy. Prints a markdown table: GB/s (read + write),
% of memcpy, and the ratio to torch.

    python bench/gpu_copy_peers.py [--bin carry/devtensor] [--scale 4]
"""

import argparse
import json
import subprocess
import sys

import torch

import devtensor

DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def time_ms(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/devtensor")
    ap.add_argument("--scale", type=int, default=4, help="multiply the leading dim of each pattern")
    args = ap.parse_args()
    rows = [json.loads(l) for l in subprocess.check_output([args.bin, "bench", "--list"], text=True).splitlines()]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  devtensor {devtensor.__version__}\n")
    print("| pattern | devtensor GB/s | % memcpy | torch GB/s | devtensor / torch |")
    print("|---|---:|---:|---:|---:|")
    worst = float("inf")
    for r in rows:
        dt = DTYPES.get(r["elem_size"])
        if dt is None:  # 3-byte elements: torch has no such dtype
            print(f"| {r['name']} | — | — | — | (no torch dtype of {r['elem_size']} bytes) |")
            continue
        shape, strides, off = list(r["shape"]), list(r["src_strides"]), r["src_offset"]
        alloc = r["src_alloc_elems"]
        if args.scale > 1 and shape and strides[0] > 0 and all(s >= 0 for s in strides):
            # Extend the slowest-varying dim of the view by stacking copies of the source.
            outer = max(range(len(shape)), key=lambda i: strides[i])
            shape[outer] *= args.scale
            alloc = alloc * args.scale
        base = torch.zeros(alloc + 16, dtype=dt, device="cuda")
        neg = [i for i, s in enumerate(strides) if s < 0]
        if neg:
            pos = [abs(s) for s in strides]
            start = off + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
            tv = torch.as_strided(base, shape, pos, start)
            torch_fn = lambda: tv.flip(neg)
            dv = devtensor.from_dlpack(tv)
            for d in neg:
                dv = dv[(slice(None),) * d + (slice(None, None, -1),)]
        else:
            tv = torch.as_strided(base, shape, strides, off)
            torch_fn = lambda: tv.contiguous() if not tv.is_contiguous() else tv.clone()
            dv = devtensor.from_dlpack(tv)
        dev_fn = lambda: dv.contiguous() if not dv.is_contiguous() else dv.clone()
        nbytes = 2 * tv.numel() * tv.element_size()
        flat_src = torch.zeros(tv.numel(), dtype=dt, device="cuda")
        flat_dst = torch.empty_like(flat_src)
        t_mem = time_ms(lambda: flat_dst.copy_(flat_src))
        t_dev = time_ms(dev_fn)
        t_torch = time_ms(torch_fn)
        gb = lambda ms: nbytes / ms / 1e6
        ratio = t_torch / t_dev
        worst = min(worst, ratio)
        print(f"| {r['name']} x{args.scale} | {gb(t_dev):.0f} | {100 * t_mem / t_dev:.0f}% | {gb(t_torch):.0f} | {ratio:.2f}x |")
    print(f"\nworst devtensor / torch: {worst:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
