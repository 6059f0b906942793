"""Rotary kernels (op ``rope_rotate``) beside the plain formula and a plain copy.

posenc (allocating, ``out=``, in place) against ``x*cos + rotate_half(x)*sin`` with
precomputed ``cos``/``sin`` in NumPy and in torch eager, and against ``np.copyto`` of the
same bytes, the floor for a pass that reads ``x`` once and writes once. bfloat16 inputs
are torch tensors (NumPy has no bfloat16). ``track_`` methods report the in-place time in
units of the copy's (lower is better, as asv assumes of every benchmark: 1.25 is 0.8 of
copy bandwidth) and the error at positions near 2**24.

``python -m benchmarks.rope`` (from ``asv_benchmarks``) prints the same comparison as a
best-of-N table without asv.
"""

from __future__ import annotations

import numpy as np

from posenc import _dispatch
from posenc._oracles import rope_rotate_half

from .common import Benchmark, interleaved_best, require, sizes

LARGE_SHAPES = ["1x32x8192x128", "4x32x8192x128"]
SHAPES = sizes(["1x8x1024x128"], LARGE_SHAPES)
DTYPES = ["float32", "bfloat16"]


def _shape(text):
    return tuple(int(n) for n in text.split("x"))


def inv_freq(dim, base=10000.0):
    return base ** (-np.arange(0, dim, 2) / dim)


def rope_posenc(x, positions, frequencies, out=None):
    return _dispatch.call("rope_rotate", x, positions, frequencies, out=out)


def cos_sin_table(length, frequencies):
    """``cos``/``sin`` ``[S, D]`` in float64, each angle twice ("half" layout)."""
    angle = np.arange(length, dtype=np.float64)[:, None] * frequencies
    angle = np.concatenate([angle, angle], axis=-1)
    return np.cos(angle), np.sin(angle)


class Inputs:
    """``x`` (NumPy float32 or torch bfloat16), positions, buffers and the torch formula's tables."""

    def __init__(self, shape, dtype):
        torch = require("torch")
        rng = np.random.default_rng(0)
        data = rng.standard_normal(shape, dtype=np.float32)
        length, dim = shape[-2], shape[-1]
        self.frequencies = inv_freq(dim)
        cos, sin = cos_sin_table(length, self.frequencies)
        if dtype == "bfloat16":
            self.x = torch.from_numpy(data).to(torch.bfloat16)
            self.positions = torch.arange(length)
            self.raw = self.x.view(torch.int16).numpy()  # the same bytes, for np.copyto
            self.torch_x = self.x
            self.torch_cos, self.torch_sin = (torch.from_numpy(t).to(torch.bfloat16) for t in (cos, sin))
        else:
            self.x = data
            self.positions = np.arange(length)
            self.raw = data
            self.torch_x = torch.from_numpy(data)
            self.torch_cos, self.torch_sin = (torch.from_numpy(t.astype(np.float32)) for t in (cos, sin))
            self.numpy_cos, self.numpy_sin = cos.astype(np.float32), sin.astype(np.float32)
        self.out = rope_posenc(self.x, self.positions, self.frequencies)
        self.in_place = rope_posenc(self.x, self.positions, self.frequencies)
        self.copy_target = np.empty_like(self.raw)


class RopeRotate(Benchmark):
    params = (SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def make(self, shape, dtype):
        self.inputs = Inputs(_shape(shape), dtype)

    def time_rope_posenc_allocating(self, shape, dtype):
        i = self.inputs
        rope_posenc(i.x, i.positions, i.frequencies)

    def time_rope_posenc_out(self, shape, dtype):
        i = self.inputs
        rope_posenc(i.x, i.positions, i.frequencies, out=i.out)

    def time_rope_posenc_in_place(self, shape, dtype):
        i = self.inputs
        rope_posenc(i.in_place, i.positions, i.frequencies, out=i.in_place)

    def time_rope_plain_torch_eager(self, shape, dtype):
        i = self.inputs
        rope_rotate_half(i.torch_x, i.torch_cos, i.torch_sin)

    def time_copyto_same_bytes(self, shape, dtype):
        np.copyto(self.inputs.copy_target, self.inputs.raw)

    def track_in_place_time_over_copy(self, shape, dtype):
        i = self.inputs
        copy, rope = interleaved_best(
            [lambda: np.copyto(i.copy_target, i.raw), lambda: rope_posenc(i.in_place, i.positions, i.frequencies, out=i.in_place)]
        )
        return rope / copy

    track_in_place_time_over_copy.unit = "x copy time"


class RopeApply(Benchmark):
    """Op ``rope_apply`` (``pe.apply_rope``: precomputed ``cos``/``sin``, the Hugging Face
    drop-in's path). Its plain formula and copy baselines are ``RopeRotate``'s
    ``time_rope_plain_torch_eager`` and ``time_copyto_same_bytes``: the same formula and
    bytes on the same inputs."""

    params = (SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def make(self, shape, dtype):
        i = self.inputs = Inputs(_shape(shape), dtype)
        self.tables = (i.numpy_cos, i.numpy_sin) if dtype == "float32" else (i.torch_cos, i.torch_sin)

    def time_apply_posenc_out(self, shape, dtype):
        _dispatch.call("rope_apply", self.inputs.x, *self.tables, out=self.inputs.out)

    def time_apply_posenc_in_place(self, shape, dtype):
        i = self.inputs
        _dispatch.call("rope_apply", i.in_place, *self.tables, out=i.in_place)


class RopeRotatePlainNumpy(Benchmark):
    """The formula in NumPy (float32 only: NumPy has no bfloat16)."""

    params = (SHAPES,)
    param_names = ["shape"]

    def make(self, shape):
        self.inputs = Inputs(_shape(shape), "float32")

    def time_rope_rotate_half(self, shape):
        i = self.inputs
        rope_rotate_half(i.x, i.numpy_cos, i.numpy_sin)


class RopePrecision:
    """Largest error against a float64 transcription of the formula at positions near 2**24."""

    def setup(self):
        rng = np.random.default_rng(1)
        self.x = rng.standard_normal((4, 64, 128)).astype(np.float32)
        self.positions = 2**24 - 64 + np.arange(64)
        self.frequencies = inv_freq(128)

    def track_rope_max_abs_error_at_2_24(self):
        got = rope_posenc(self.x, self.positions, self.frequencies)
        angle = self.positions[:, None].astype(np.float64) * self.frequencies
        cos, sin = np.cos(angle), np.sin(angle)
        x = self.x.astype(np.float64)
        a, b = x[..., :64], x[..., 64:]
        exact = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
        return float(np.abs(got - exact).max())

    track_rope_max_abs_error_at_2_24.unit = "abs error"


def _table(shapes=LARGE_SHAPES, repeat=7):
    """Best-of-``repeat`` times of every variant, and ratios to torch eager and to copy."""
    rows = []
    for shape in shapes:
        for dtype in DTYPES:
            i = Inputs(_shape(shape), dtype)
            variants = {
                "np.copyto same bytes": lambda: np.copyto(i.copy_target, i.raw),
                "torch eager formula": lambda: rope_rotate_half(i.torch_x, i.torch_cos, i.torch_sin),
                "posenc allocating": lambda: rope_posenc(i.x, i.positions, i.frequencies),
                "posenc out=": lambda: rope_posenc(i.x, i.positions, i.frequencies, out=i.out),
                "posenc in place": lambda: rope_posenc(i.in_place, i.positions, i.frequencies, out=i.in_place),
            }
            if dtype == "float32":
                variants["numpy formula"] = lambda: rope_rotate_half(i.x, i.numpy_cos, i.numpy_sin)
            times = dict(zip(variants, interleaved_best(list(variants.values()), repeat)))
            for name, t in times.items():
                # The copy is the bandwidth reference, not a rotation: no ratio means anything there.
                ratios = "| - | - |" if name == "np.copyto same bytes" else (
                    f"| {times['torch eager formula'] / t:.1f}x | {times['np.copyto same bytes'] / t:.2f} |"
                )
                rows.append(f"| {shape} | {dtype} | {name} | {t * 1e3:.1f} {ratios}")
            del i
    print("| shape | dtype | variant | best ms | speed-up vs torch eager | fraction of copy bandwidth |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    _table()
