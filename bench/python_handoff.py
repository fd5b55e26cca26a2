#!/usr/bin/env python3
"""Per-call latency of devtensor's Python API against its peers, same process.

Rows (each: devtensor vs peers doing the same job; ratios = devtensor / peer, < 1 is faster;
"1st" is the comparator listed first below, "best" the fastest peer in the row):
  * handoff out:  torch.from_dlpack(devtensor)        vs torch.from_dlpack(numpy)      [CPU]
                  torch.from_dlpack(devtensor cuda)   vs torch.from_dlpack(cupy)       [CUDA]
  * handoff in:   devtensor.from_dlpack(torch), exchange API vs the `__dlpack__` path,
                  and vs numpy.from_dlpack(torch) as an outside reference
  * allocation:   devtensor.empty vs torch.empty / numpy.empty (/ cupy.empty on CUDA)
  * CPU copies:   Tensor.contiguous() vs numpy.ascontiguousarray and torch .contiguous()
                  on a few transposes/slices (the full pattern matrix is bench/cpu_copy_peers.py)

    python bench/python_handoff.py [--quick] [--min-time 0.2] [--no-gpu]

Prints a markdown table (µs per call, best of several repeats, devtensor's and the peers' repeats
interleaved).
"""

import argparse
import os
import platform
import sys
import timeit
import warnings

import numpy as np

import devtensor

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import torch
    except ImportError:
        torch = None


def best_us(fns, min_time, repeat):
    """Best per-call time in µs of each of `fns` over `repeat` runs of ~min_time
    seconds each, the runs of the callables interleaved (ours, peer, ours, peer,
    ...) so that a slow spell of the machine hits them alike."""
    timers = []
    for fn in fns:
        timer = timeit.Timer(fn)
        number, _ = timer.autorange()  # enough calls for >= 0.2 s
        timers.append((timer, max(1, int(number * min_time / 0.2))))
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for k, (timer, number) in enumerate(timers):
            best[k] = min(best[k], timer.timeit(number) / number * 1e6)
    return best


class Rows:
    def __init__(self, min_time, repeat):
        self.min_time = min_time
        self.repeat = repeat
        self.rows = []

    def add(self, group, what, ours, peers):
        """ours: callable; peers: list of (name, callable)."""
        t_ours, *t_peers = best_us([ours] + [fn for _, fn in peers], self.min_time, self.repeat)
        timed = [(name, us) for (name, _), us in zip(peers, t_peers)]
        self.rows.append((group, what, t_ours, timed))
        print(f"  {what:<52} {t_ours:10.2f} µs", file=sys.stderr)

    def table(self):
        head = ["group", "case", "devtensor µs", "peers µs (1st = comparator)", "ratio vs 1st", "ratio vs best"]
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for group, what, t_ours, timed in self.rows:
            peers = "; ".join(f"{name} {us:.2f}" for name, us in timed)
            first = timed[0][1] if timed else float("nan")
            best = min(us for _, us in timed) if timed else float("nan")
            cells = [group, what, f"{t_ours:.2f}", peers, f"{t_ours / first:.2f}×", f"{t_ours / best:.2f}×"]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out)


class DunderOnly:
    """Hides the producer type's __dlpack_c_exchange_api__: the consumer must call __dlpack__."""

    __slots__ = ("__dlpack__", "__dlpack_device__")

    def __init__(self, x):
        self.__dlpack__ = x.__dlpack__
        self.__dlpack_device__ = x.__dlpack_device__


def handoff_rows(r, gpu):
    print("handoff", file=sys.stderr)
    for shape in [(16,), (1024, 1024)]:
        t = devtensor.zeros(shape)
        a = np.zeros(shape, dtype=np.float32)
        label = "x".join(map(str, shape))
        if torch is not None:
            r.add(
                "handoff out",
                f"torch.from_dlpack(devtensor) {label} f32",
                lambda: torch.from_dlpack(t),
                [("torch(numpy)", lambda: torch.from_dlpack(a))],
            )
        x = torch.zeros(shape) if torch is not None else None
        peers = [("numpy(torch)", lambda: np.from_dlpack(x))] if x is not None else []
        r.add(
            "handoff out",
            f"numpy.from_dlpack(devtensor) {label} f32",
            lambda: np.from_dlpack(t),
            peers + [("numpy(numpy)", lambda: np.from_dlpack(a))],
        )
        peers = [("torch(numpy)", lambda: torch.from_dlpack(a))] if torch is not None else []
        r.add(
            "handoff in",
            f"devtensor.from_dlpack(numpy) {label} f32",
            lambda: devtensor.from_dlpack(a),
            peers + [("numpy(numpy)", lambda: np.from_dlpack(a))],
        )
        if torch is not None:
            wrapped = DunderOnly(x)
            peers = [("devtensor via __dlpack__", lambda: devtensor.from_dlpack(wrapped))]
            peers.append(("numpy(torch)", lambda: np.from_dlpack(x)))
            r.add("handoff in", f"devtensor.from_dlpack(torch) exchange API {label}", lambda: devtensor.from_dlpack(x), peers)
    if gpu:
        cp = _cupy()
        t = devtensor.zeros((1024,), device="cuda")
        x = torch.zeros((1024,), device="cuda")
        peers = [("torch(torch)", lambda: torch.from_dlpack(x))]
        if cp is not None:
            c = cp.zeros((1024,), dtype=cp.float32)
            peers.insert(0, ("torch(cupy)", lambda: torch.from_dlpack(c)))
        r.add("handoff out (CUDA)", "torch.from_dlpack(devtensor cuda) 1024 f32", lambda: torch.from_dlpack(t), peers)
        peers = [("devtensor via __dlpack__", lambda: devtensor.from_dlpack(DunderOnly(x)))]
        if cp is not None:
            peers.append(("cupy(torch)", lambda: cp.from_dlpack(x)))
        r.add("handoff in (CUDA)", "devtensor.from_dlpack(torch cuda) 1024 f32", lambda: devtensor.from_dlpack(x), peers)


def _cupy():
    try:
        import cupy

        return cupy
    except ImportError:
        return None


def empty_rows(r, gpu):
    print("empty", file=sys.stderr)
    for shape in [(16,), (1024,), (256, 256), (4096, 4096)]:
        label = "x".join(map(str, shape))
        peers = [("numpy", lambda: np.empty(shape, dtype=np.float32))]
        if torch is not None:
            peers.append(("torch", lambda: torch.empty(shape)))
        r.add("empty", f"empty({label}) f32 cpu", lambda: devtensor.empty(shape), peers)
    # The argument forms users write: each parsed value costs as much as the allocation.
    shape = (1024,)
    forms = [
        ("empty(1024, dtype='float32')", lambda: devtensor.empty(shape, dtype="float32"), lambda: np.empty(shape, dtype="float32"),
         lambda: torch.empty(shape, dtype=torch.float32)),
        ("empty(1024, dtype=np.float64)", lambda: devtensor.empty(shape, dtype=np.float64), lambda: np.empty(shape, dtype=np.float64),
         lambda: torch.empty(shape, dtype=torch.float64)),
        ("empty(1024, device='cpu') f32", lambda: devtensor.empty(shape, device="cpu"), lambda: np.empty(shape, dtype=np.float32),
         lambda: torch.empty(shape, device="cpu")),
        ("zeros(1024) f32", lambda: devtensor.zeros(shape), lambda: np.zeros(shape, dtype=np.float32), lambda: torch.zeros(shape)),
        ("full(1024, 1.5) f32", lambda: devtensor.full(shape, 1.5), lambda: np.full(shape, 1.5, dtype=np.float32),
         lambda: torch.full(shape, 1.5)),
    ]
    for what, ours, np_fn, torch_fn in forms:
        peers = [("numpy", np_fn)] + ([("torch", torch_fn)] if torch is not None else [])
        r.add("empty", f"{what} cpu", ours, peers)
    if gpu:
        cp = _cupy()
        for shape in [(16,), (4096, 4096)]:
            label = "x".join(map(str, shape))
            peers = [("torch", lambda: torch.empty(shape, device="cuda"))]
            if cp is not None:
                peers.append(("cupy", lambda: cp.empty(shape, dtype=cp.float32)))
            r.add("empty (CUDA)", f"empty({label}) f32 cuda", lambda: devtensor.empty(shape, device="cuda"), peers)


COPY_CASES = [
    # (label, shape, dtype, view on a devtensor tensor, the same view on numpy/torch)
    ("2D transpose 4096² f32", (4096, 4096), "float32", lambda t: t.transpose(0, 1), lambda a: a.T),
    ("2D transpose 64² f32", (64, 64), "float32", lambda t: t.transpose(0, 1), lambda a: a.T),
    ("2D transpose 2048² c128", (2048, 2048), "complex128", lambda t: t.transpose(0, 1), lambda a: a.T),
    ("2D transpose 4096² u8", (4096, 4096), "uint8", lambda t: t.transpose(0, 1), lambda a: a.T),
    ("3D permute(2,0,1) 256³ f32", (256, 256, 256), "float32", lambda t: t.permute(2, 0, 1), None),
    ("3D permute(1,0,2) 256³ f32", (256, 256, 256), "float32", lambda t: t.permute(1, 0, 2), None),
    ("column slice [:, ::2] 4096² f64", (4096, 4096), "float64", lambda t: t[:, ::2], lambda a: a[:, ::2]),
    ("row flip [::-1] 4096² f32", (4096, 4096), "float32", lambda t: t[::-1], lambda a: a[::-1]),
]


def copy_rows(r, quick):
    print("contiguous", file=sys.stderr)
    for label, shape, dtype, ours, theirs in COPY_CASES:
        if quick and np.prod(shape) > 1 << 22:
            shape = tuple(max(1, s // 2) for s in shape)
            label = f"{label} (quick: {'x'.join(map(str, shape))})"
        # Every source written: NumPy's zeros are calloc'd pages that all map
        # the one shared zero page, which a copy reads from cache.
        t = devtensor.full(shape, 1, dtype=dtype)
        a = np.ones(shape, dtype=dtype)
        v = ours(t)
        if theirs is None:  # a permute: the same axes on numpy / torch
            dims = {"3D permute(2,0,1)": (2, 0, 1), "3D permute(1,0,2)": (1, 0, 2)}[label.split(" 256")[0]]
            av = a.transpose(dims)
            tv_fn = lambda x: x.permute(*dims)  # noqa: E731
        else:
            av = theirs(a)
            tv_fn = theirs
        peers = [("numpy.ascontiguousarray", lambda: np.ascontiguousarray(av))]
        if torch is not None and hasattr(torch, dtype):
            try:
                x = tv_fn(torch.ones(shape, dtype=getattr(torch, dtype)))
            except ValueError:
                pass  # torch has no negative strides (no view for a flip)
            else:
                peers.append(("torch .contiguous()", lambda: x.contiguous()))
        r.add("contiguous (CPU)", label, lambda: v.contiguous(), peers)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, smaller copies")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per repeat (default 0.2, quick 0.05)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats per measurement (default 7, quick 3)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the CUDA rows")
    args = ap.parse_args()
    min_time = args.min_time or (0.05 if args.quick else 0.2)
    repeat = args.repeat or (3 if args.quick else 7)

    gpu = False
    if not args.no_gpu and torch is not None and torch.cuda.is_available():
        try:
            devtensor.empty(1, device="cuda")
            gpu = True
        except Exception as e:  # noqa: BLE001
            print(f"CUDA rows skipped: {type(e).__name__}: {e}", file=sys.stderr)

    r = Rows(min_time, repeat)
    handoff_rows(r, gpu)
    empty_rows(r, gpu)
    copy_rows(r, args.quick)

    print()
    print(
        f"devtensor {devtensor.__version__}, numpy {np.__version__}"
        + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch is not None else ", no torch")
        + f"; Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"
        + (f"; CUDA rows included ({torch.cuda.get_device_name()}{', no cupy' if _cupy() is None else ''})" if gpu else "; CPU only")
    )
    print(f"best of {repeat} repeats of ~{min_time}s each; ratio = devtensor / peer (< 1: devtensor faster)")
    print()
    print(r.table())


if __name__ == "__main__":
    main()
