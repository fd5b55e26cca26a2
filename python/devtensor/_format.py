"""`repr(Tensor)`: the values laid out as torch prints them.

The rules are torch's (`torch/_tensor_str.py`, default print options): precision 4,
int mode for floats that are all integers, scientific notation when the finite
non-zero magnitudes span more than 1000x, exceed 1e8 or fall below 1e-4, lines of 80
characters, and above 1000 elements only the first and last 3 items of each
dimension with "..." between. `device=` is shown for anything but the CPU and
`dtype=` for anything but float32, int64, bool and complex64, as torch does for its
defaults.
"""

from __future__ import annotations

import math

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80

_FLOATING = ("float", "bfloat")
_DEFAULT_DTYPES = ("float32", "int64", "bool", "complex64")


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(_FLOATING)


def _summarized(t, summarize):
    """Nested lists of the values printed: every item, or when summarizing only the
    first and last EDGEITEMS of each dimension longer than 2 * EDGEITEMS."""
    if t.ndim == 0:
        return t.tolist()
    n = t.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        if t.ndim == 1:
            return t[:EDGEITEMS].tolist() + t[n - EDGEITEMS :].tolist()
        rows = list(range(EDGEITEMS)) + list(range(n - EDGEITEMS, n))
    elif t.ndim == 1:
        return t.tolist()
    else:
        rows = range(n)
    return [_summarized(t[i], summarize) for i in rows]


def _flatten(values, ndim):
    if ndim == 0:
        return [values]
    if ndim == 1:
        return list(values)
    out = []
    for v in values:
        out.extend(_flatten(v, ndim - 1))
    return out


class _Formatter:
    def __init__(self, values, floating):
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        if not floating:
            for v in values:
                self.max_width = max(self.max_width, len(f"{v}"))
            return
        finite = [v for v in values if math.isfinite(v) and v != 0]
        if not finite:
            return
        magnitudes = [abs(v) for v in finite]
        lo, hi = min(magnitudes), max(magnitudes)
        self.int_mode = all(v == math.ceil(v) for v in finite)
        if self.int_mode:
            if hi / lo > 1000.0 or hi > 1.0e8:
                self.sci_mode = True
                self.max_width = max(len(f"{v:.{PRECISION}e}") for v in finite)
            else:
                self.max_width = max(len(f"{v:.0f}") + 1 for v in finite)
        elif hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4:
            self.sci_mode = True
            self.max_width = max(len(f"{v:.{PRECISION}e}") for v in finite)
        else:
            self.max_width = max(len(f"{v:.{PRECISION}f}") for v in finite)

    def width(self):
        return self.max_width

    def format(self, v):
        if self.floating:
            if self.sci_mode:
                s = f"{v:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}"
                if not (math.isinf(v) or math.isnan(v)):
                    s += "."
            else:
                s = f"{v:.{PRECISION}f}"
        else:
            s = f"{v}"
        return (self.max_width - len(s)) * " " + s


def _value(v, f1, f2):
    if f2 is None:
        return f1.format(v)
    real = f1.format(v.real)
    imag = (f2.format(v.imag) + "j").lstrip()
    if imag[0] in "+-":  # negative numbers, -0.0
        return real + imag
    return real + "+" + imag


def _vector(values, size, indent, summarize, f1, f2):
    element_length = f1.width() + 2
    if f2 is not None:
        element_length += f2.width() + 1
    per_line = max(1, int(math.floor((LINEWIDTH - indent) / element_length)))
    data = [_value(v, f1, f2) for v in values]
    if summarize and size > 2 * EDGEITEMS:
        data = data[:EDGEITEMS] + [" ..."] + data[EDGEITEMS:]
    lines = [", ".join(data[i : i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(values, shape, indent, summarize, f1, f2):
    ndim = len(shape)
    if ndim == 0:
        return _value(values, f1, f2)
    if ndim == 1:
        return _vector(values, shape[0], indent, summarize, f1, f2)
    slices = [_nested(v, shape[1:], indent + 1, summarize, f1, f2) for v in values]
    if summarize and shape[0] > 2 * EDGEITEMS:
        slices = slices[:EDGEITEMS] + ["..."] + slices[EDGEITEMS:]
    return "[" + ("," + "\n" * (ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _add_suffixes(text, suffixes, indent):
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > LINEWIDTH:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(t) -> str:
    """`tensor([...], device='cuda:0', dtype=float16)`, as torch prints it."""
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.device != "cpu":
        suffixes.append(f"device='{t.device}'")
    numel = math.prod(t.shape)
    if numel == 0:
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype != "float32":
            suffixes.append(f"dtype={t.dtype}")
        body = "[]"
    else:
        if t.dtype not in _DEFAULT_DTYPES:
            suffixes.append(f"dtype={t.dtype}")
        summarize = numel > THRESHOLD
        values = _summarized(t, summarize)
        flat = _flatten(values, t.ndim)
        if t.dtype.startswith("complex"):
            f1 = _Formatter([v.real for v in flat], True)
            f2 = _Formatter([v.imag for v in flat], True)
        else:
            f1, f2 = _Formatter(flat, _is_floating(t.dtype)), None
        body = _nested(values, tuple(t.shape), indent, summarize, f1, f2)
    return _add_suffixes(prefix + body, suffixes, indent)
