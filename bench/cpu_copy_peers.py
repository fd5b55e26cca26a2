#!/usr/bin/env python3
"""CPU strided copy: devtensor vs NumPy's ascontiguousarray vs torch's .contiguous().

Takes the pattern matrix from `devtensor bench --json` (the same as `cargo bench`;
its GB/s, a copy into a preallocated destination, is the `cli` column), rebuilds
every source view with as_strided in NumPy, imports it zero-copy into devtensor
(devtensor.from_dlpack) and torch, and times the three copies that allocate their
output (`Tensor.contiguous()`, `ndarray.copy()`, `torch .contiguous()`) in this
process, interleaved round by round so that load on the machine hits all alike.
Prints GB/s (read + write) and the ratio of devtensor to the faster peer.

Besides the CLI's matrix, the kinds where a peer once won, at several sizes
(`peer_patterns`): large contiguous clones, small permutes (call and dispatch
overhead), narrow column slices of a large matrix, 2-D flips, complex128
transposes; permutes of 1–4 MiB in cache whose destination rows are 4 KiB apart
or whose unit-stride side is a pair or a pixel of three; tall, narrow matrices
transposed; permutes of odd shapes (prime dims, short unit-stride sides); and small
ones whose unit-stride side of 2–4 elements moves anywhere (`cpu_permute_sweep.py`
times every permutation); transposes of strided views (`x[:, ::2].T`). Then copies between views of one buffer whose
elements interleave (`inplace_patterns`), timed as `copy_` / `np.copyto`.

    python bench/cpu_copy_peers.py [--quick] [--bin target/release/devtensor] [--no-matrix]
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


def dense(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    return strides


def pattern(name, elem_size, alloc, shape, strides, offset=0):
    return {"name": name, "elem_size": elem_size, "src_alloc_elems": alloc, "shape": list(shape),
            "src_strides": list(strides), "src_offset": offset, "gbps": float("nan")}


def permute(name, elem_size, src_shape, perm):
    d = dense(src_shape)
    n = 1
    for x in src_shape:
        n *= x
    return pattern(name, elem_size, n, [src_shape[p] for p in perm], [d[p] for p in perm])


def peer_patterns(quick):
    """Patterns where NumPy or torch once beat devtensor, at several sizes."""
    v = []
    for mib in ([1, 16] if quick else [1, 16, 64, 256]):  # contiguous clones
        n = (mib << 20) // 4
        v.append(pattern(f"clone_f32_{mib}MiB", 4, n, [n], [1]))
    for c in [8, 16, 32, 64]:  # small permutes: 2 KiB .. 1 MiB
        v.append(permute(f"small_permute3d_210_f32_{c}x{c}x{c}", 4, [c, c, c], [2, 1, 0]))
        v.append(permute(f"small_permute3d_021_f32_{c}x{c}x{c}", 4, [c, c, c], [0, 2, 1]))
    for s in [16, 64, 256]:
        v.append(permute(f"small_attention_f16_1x{s}x8x64", 2, [1, s, 8, 64], [0, 2, 1, 3]))
    n = 2048 if quick else 8192
    for k in [1, 2, 4, 16, 64]:  # x[:, 5:5+k] of a large row-major matrix
        v.append(pattern(f"narrow_cols_{k}_of_f32_{n}x{n}", 4, n * n, [n, k], [n, 1], 5))
    for mib in ([2, 8] if quick else [2, 8, 16, 64]):  # x[:, :1024]: 4 KiB rows of a 2×-wide f32 matrix
        r = (mib << 20) // 4096
        v.append(pattern(f"sliced_rows_4KiB_{mib}MiB_of_f32_{r}x2048", 4, r * 2048, [r, 1024], [2048, 1]))
    for m in ([256, 1024] if quick else [256, 512, 1024, 4096]):  # 2-D flips
        v.append(pattern(f"flip2d_both_f32_{m}x{m}", 4, m * m, [m, m], [-m, -1], m * m - 1))
        v.append(pattern(f"flip2d_rows_f32_{m}x{m}", 4, m * m, [m, m], [-m, 1], (m - 1) * m))
        v.append(pattern(f"flip2d_cols_f32_{m}x{m}", 4, m * m, [m, m], [m, -1], m - 1))
    # complex128 (16-byte elements) transposed: in L1 and L2, and streamed.
    for m in ([100, 300] if quick else [64, 100, 150, 300, 1000, 2048]):
        v.append(permute(f"transpose2d_c128_{m}x{m}", 16, [m, m], [1, 0]))
    # In cache, 1-4 MiB: destination rows 4 KiB apart (their lines share L1 sets),
    # and unit-stride sides of 2 or 3 elements (pairs, pixels) moved outermost.
    v.append(permute("cached_permute3d_210_f32_96x96x96", 4, [96, 96, 96], [2, 1, 0]))
    v.append(permute("cached_transpose2d_f32_1024x256", 4, [1024, 256], [1, 0]))
    v.append(permute("cached_transpose2d_f64_512x512", 8, [512, 512], [1, 0]))
    v.append(permute("pairs_reversed_f32_64x64x64x2", 4, [64, 64, 64, 2], [3, 2, 1, 0]))
    v.append(permute("pairs_reversed_f32_2x32x32x32x16", 4, [2, 32, 32, 32, 16], [4, 3, 2, 1, 0]))
    v.append(permute("pixels_reversed_f32_60x62x64x3", 4, [60, 62, 64, 3], [3, 2, 1, 0]))
    # Streamed, tall and narrow: short source rows (128-800 bytes) under long
    # destination rows, alone and batched.
    rows = 50000 if quick else 200000
    v.append(permute(f"tall_transpose2d_f32_{rows}x64", 4, [rows, 64], [1, 0]))
    v.append(permute(f"tall_transpose2d_f32_{rows // 4}x200", 4, [rows // 4, 200], [1, 0]))
    v.append(permute("tall_batched_transpose_f32_64x2048x64", 4, [64, 2048, 64], [0, 2, 1]))
    v.append(permute("tall_batched_transpose_f16_16x4096x128", 2, [16, 4096, 128], [0, 2, 1]))
    # Odd shapes (prime dims, unit-stride sides of 3-15 elements, attention's
    # B × S × H × D → B × H × S × D at odd S), from 80 KiB in cache to 40 MiB
    # streamed: no power-of-two blocks fit them.
    for name, e, shape, perm in [
        ("odd_permute3d_210_u8_127x131x5", 1, [127, 131, 5], [2, 1, 0]),
        ("odd_permute3d_210_u16_127x131x5", 2, [127, 131, 5], [2, 1, 0]),
        ("odd_permute3d_210_f16_300x200x6", 2, [300, 200, 6], [2, 1, 0]),
        ("odd_permute4d_3210_f32_31x29x27x3", 4, [31, 29, 27, 3], [3, 2, 1, 0]),
        ("odd_permute4d_3210_f32_61x67x59x3", 4, [61, 67, 59, 3], [3, 2, 1, 0]),
        ("odd_permute4d_3021_u8_61x67x59x13", 1, [61, 67, 59, 13], [3, 0, 2, 1]),
        ("odd_permute4d_3021_f16_61x67x59x7", 2, [61, 67, 59, 7], [3, 0, 2, 1]),
        ("odd_permute4d_3021_f32_61x67x59x63", 4, [61, 67, 59, 63], [3, 0, 2, 1]),
        ("odd_permute5d_43210_f32_31x37x29x41x7", 4, [31, 37, 29, 41, 7], [4, 3, 2, 1, 0]),
        ("odd_permute5d_43210_f64_31x29x33x31x6", 8, [31, 29, 33, 31, 6], [4, 3, 2, 1, 0]),
        ("odd_permute5d_43210_f32_31x33x29x31x15", 4, [31, 33, 29, 31, 15], [4, 3, 2, 1, 0]),
        ("odd_permute5d_03142_f16_31x29x33x31x30", 2, [31, 29, 33, 31, 30], [0, 3, 1, 4, 2]),
        ("odd_attention_f16_4x77x12x64", 2, [4, 77, 12, 64], [0, 2, 1, 3]),
        ("odd_attention_f16_2x333x16x32", 2, [2, 333, 16, 32], [0, 2, 1, 3]),
        ("odd_attention_f32_2x333x16x128", 4, [2, 333, 16, 128], [0, 2, 1, 3]),
        ("odd_batched_transpose_f64_100x7x100", 8, [100, 7, 100], [0, 2, 1]),
        # Unit-stride sides of 3 elements in slices of 64 pixels or more (the
        # pixels' channels to planes, the pixels transposed): tiles lost to torch.
        ("odd_permute4d_3201_f32_61x67x59x3", 4, [61, 67, 59, 3], [3, 2, 0, 1]),
        ("pixels_transposed_to_planes_f32_512x512x3", 4, [512, 512, 3], [2, 1, 0]),
        ("pixels_transposed_to_planes_f64_128x128x3", 8, [128, 128, 3], [2, 1, 0]),
    ]:
        v.append(permute(name, e, shape, perm))
    # Pixels of 5-8 channels to planes (channels-last to channels-first), one
    # channel of pixels, and the first channels of wider pixels (x[:, :k].T):
    # NumPy's element loop beat the routes that took them before.
    for name, e, shape, perm in [
        ("pixels_to_planes_u8_40x30x6", 1, [40, 30, 6], [0, 2, 1]),
        ("pixels_to_planes_u8_100x20x7", 1, [100, 20, 7], [0, 2, 1]),
        ("pixels_to_planes_u16_64x64x5", 2, [64, 64, 5], [0, 2, 1]),
        ("pixels_to_planes_f32_40x30x6", 4, [40, 30, 6], [0, 2, 1]),
        ("pixels_to_planes_f64_100x100x8", 8, [100, 100, 8], [0, 2, 1]),
        ("pixels_to_planes_f64_1000x5", 8, [1000, 5], [1, 0]),
    ]:
        v.append(permute(name, e, shape, perm))
    for e, t in [(1, "u8"), (2, "u16"), (4, "f32"), (8, "f64")]:
        v.append(pattern(f"one_channel_{t}_10000x5", e, 50000, [10000], [5], 1))
        v.append(pattern(f"first_channels_{t}_5_of_1000x8", e, 8000, [5, 1000], [1, 8]))
        # A few channels of pixels wider than 8 elements (NumPy gathers a channel
        # at a time), in cache and past it.
        v.append(pattern(f"first_channels_{t}_2_of_4000x20", e, 80000, [2, 4000], [1, 20]))
        v.append(pattern(f"first_channels_{t}_3_of_1000x16", e, 16000, [3, 1000], [1, 16]))
        v.append(pattern(f"first_channels_{t}_6_of_500x12", e, 6000, [6, 500], [1, 12]))
        if not quick:
            v.append(pattern(f"first_channels_{t}_3_of_100000x16", e, 1600000, [3, 100000], [1, 16]))
            v.append(pattern(f"first_channels_{t}_2_of_20000x64", e, 1280000, [2, 20000], [1, 64]))
    # Unit-stride sides of 2-4 elements (pairs, pixels) moved anywhere in small odd
    # shapes, 60 KiB to 300 KiB: bench/cpu_permute_sweep.py times every permutation.
    for name, e, shape, perm in [
        ("narrow_permute4d_3102_u8_31x29x27x2", 1, [31, 29, 27, 2], [3, 1, 0, 2]),
        ("narrow_permute4d_0132_u8_33x35x37x4", 1, [33, 35, 37, 4], [0, 1, 3, 2]),
        ("narrow_transpose3d_021_u8_64x64x2", 1, [64, 64, 2], [0, 2, 1]),
        ("narrow_permute4d_3102_f32_17x19x23x2", 4, [17, 19, 23, 2], [3, 1, 0, 2]),
        ("narrow_permute4d_0321_f32_31x29x27x3", 4, [31, 29, 27, 3], [0, 3, 2, 1]),
        ("narrow_permute4d_3120_f32_31x29x27x3", 4, [31, 29, 27, 3], [3, 1, 2, 0]),
        ("narrow_permute4d_3210_f64_17x19x23x2", 8, [17, 19, 23, 2], [3, 2, 1, 0]),
        ("narrow_permute5d_03142_f64_5x7x9x11x2", 8, [5, 7, 9, 11, 2], [0, 3, 1, 4, 2]),
    ]:
        v.append(permute(name, e, shape, perm))
    # Transposes of strided views: x[:, ::k].T, the real parts of a complex
    # matrix transposed, one channel of an image transposed. No side has a
    # unit stride; NumPy and torch read a line per element.
    for n in ([256, 1024] if quick else [256, 1024, 4096]):
        for k in [2, 4]:
            v.append(pattern(f"strided_transpose_f32_{n}x{n}_step{k}", 4, n * n * k, [n, n], [k, n * k]))
    v.append(pattern("real_parts_transposed_c128_2048x2048", 8, 2048 * 2048 * 2, [2048, 2048], [2, 4096]))
    v.append(pattern("channel_transposed_u8_1080x1920x3", 1, 1080 * 1920 * 3, [1920, 1080], [3, 5760]))
    v.append(pattern("channel_transposed_u16_1080x1920x3", 2, 1080 * 1920 * 3, [1920, 1080], [3, 5760]))
    if not quick:
        # A 4K frame: a sweep along a column crosses 2160 pages, past the TLB.
        v.append(pattern("channel_transposed_u8_2160x3840x3", 1, 2160 * 3840 * 3, [3840, 2160], [3, 11520]))
    return v


def inplace_patterns(quick):
    """Copies between views of one buffer whose byte ranges overlap and whose
    elements do not (`x[:, 0::2] = x[:, 1::2]`): (name, buffer shape, dst
    view, src view), views as functions of the buffer. NumPy decides on the
    bounds and copies the source aside first; torch and devtensor copy in place."""
    n = 2048 if quick else 4096
    return [
        (f"inplace_even_cols_from_odd_f32_{n}x{n}", (n, n), lambda x: x[:, 0::2], lambda x: x[:, 1::2]),
        (f"inplace_left_halves_from_right_f32_{n}x{n}", (n, n), lambda x: x[:, : n // 2], lambda x: x[:, n // 2:]),
        (f"inplace_real_from_imag_f32_{n * n // 2}x2", (n * n // 2, 2), lambda x: x[:, 0], lambda x: x[:, 1]),
        (f"inplace_channel_from_channel_f32_{n * n // 4}x4", (n * n // 4, 4), lambda x: x[:, 2], lambda x: x[:, 0]),
        (f"inplace_even_cols_from_odd_transposed_f32_{n // 2}x{n}", (n // 2, n),
         lambda x: x[:, 0::2], lambda x: x[:, 1::2].T),
    ]


def best_time(fn, min_time):
    fn()  # warm-up
    best, total = float("inf"), 0.0
    while total < min_time:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, total = min(best, dt), total + dt
    return best


def compare(timed, moved, args):
    """Times `timed` (name -> call) in interleaved rounds: GB/s by name, torch's
    (NaN without it), and devtensor's ratio to the faster peer."""
    best = {k: float("inf") for k in timed}
    for _ in range(args.rounds):
        for k, fn in timed.items():
            best[k] = min(best[k], best_time(fn, args.min_time))
    gb = {k: moved / t / 1e9 for k, t in best.items()}
    gb_t = gb.get("torch", float("nan"))
    return gb, gb_t, gb["devtensor"] / max(gb["numpy"], gb_t if gb_t == gb_t else 0.0)


def pool_delta(before):
    """What the copy pool did since `before` (a `_pool_stats()` dict), as one short line."""
    now = devtensor._devtensor._pool_stats()
    d = {k: now[k] - before[k] for k in now}
    n = max(1, d["pool_started"])
    first, last, joins = (d.pop(k) / n for k in ("pool_start_ns", "pool_last_start_ns", "pool_joins"))
    return ("  pool: " + " ".join(f"{k}={v}" for k, v in d.items() if v)
            + f" joins={joins:.1f} first_start={first / 1e3:.1f}us last_start={last / 1e3:.1f}us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/devtensor")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-time", type=float, default=0.15, help="seconds per timing, per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best of)")
    ap.add_argument("--filter", help="only patterns whose name contains this text (or one of these, comma-separated)")
    ap.add_argument("--no-matrix", action="store_true", help="only the peer patterns (no CLI run)")
    ap.add_argument("--pool-stats", action="store_true",
                    help="after each row, what devtensor's copy pool did while it ran (devtensor._devtensor._pool_stats)")
    args = ap.parse_args()
    wanted = args.filter.split(",") if args.filter else None

    def picked(name):
        return wanted is None or any(w in name for w in wanted)

    rows = []
    if not args.no_matrix:
        cmd = [args.bin, "bench", "--json"] + (["--quick"] if args.quick else [])
        # The CLI takes one filter: run it whole where there are several.
        cmd += ["--filter", args.filter] if args.filter and len(wanted) == 1 else []
        rows = [json.loads(line) for line in subprocess.check_output(cmd, text=True).splitlines() if line.startswith("{")]
    rows = [r for r in rows + peer_patterns(args.quick) if picked(r["name"])]
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    inplace = [p for p in inplace_patterns(args.quick) if picked(p[0])]
    w = max([34] + [len(r["name"]) for r in rows] + [len(p[0]) for p in inplace])  # the name column fits the longest
    head = f"{'pattern':<{w}} {'cli':>7} {'devtensor':>9} {'numpy':>8} {'torch':>8} {'vs best peer':>12}"
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
        stats = devtensor._devtensor._pool_stats()
        gb, gb_t, ratio = compare(timed, moved, args)
        worst = min(worst, ratio)
        print(f"{r['name']:<{w}} {r['gbps']:7.2f} {gb['devtensor']:9.2f} {gb['numpy']:8.2f} {gb_t:8.2f} {ratio:11.2f}x"
              + (pool_delta(stats) if args.pool_stats else ""), flush=True)
    if inplace:
        print(f"\n{'copy between views of one buffer':<{w}} {'':>7} {'devtensor':>9} {'numpy':>8} {'torch':>8} "
              f"{'vs best peer':>12}")
    for name, shape, dst_of, src_of in inplace:
        buf = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        d, s = dst_of(buf), src_of(buf)
        moved = 2 * d.size * d.itemsize
        dd, ds = devtensor.from_dlpack(d), devtensor.from_dlpack(s)
        assert dd.data_ptr == d.ctypes.data, "devtensor must import the views without a copy"
        timed = {"devtensor": lambda dd=dd, ds=ds: dd.copy_(ds), "numpy": lambda d=d, s=s: np.copyto(d, s)}
        if torch is not None:
            td, ts = torch.from_numpy(d), torch.from_numpy(s)
            timed["torch"] = lambda td=td, ts=ts: td.copy_(ts)
        gb, gb_t, ratio = compare(timed, moved, args)
        worst = min(worst, ratio)
        print(f"{name:<{w}} {'':>7} {gb['devtensor']:9.2f} {gb['numpy']:8.2f} {gb_t:8.2f} {ratio:11.2f}x", flush=True)
    print(f"\nworst ratio devtensor / faster peer: {worst:.2f}x  (numpy {np.__version__}"
          + (f", torch {torch.__version__}, {torch.get_num_threads()} threads" if torch else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
