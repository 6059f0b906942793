"""Rotary kernels (ops ``rope_rotate`` and ``rope_apply``): posenc's rows, and its ratios to
a copy of the same bytes and to the plain formula.

``time_`` rows time posenc alone (allocating, ``out=``, in place). ``track_`` rows time posenc
and a baseline in turns in one process (``common.interleaved_best``) and report posenc's
time over the baseline's (lower is better): ``np.copyto`` of the same bytes, the floor of a
pass that reads ``x`` once and writes once (both on one thread, ``common.floor_ratio``:
the regression check's rows), and the plain
formula ``x*cos + rotate_half(x)*sin`` with precomputed tables in NumPy or torch eager.
bfloat16 inputs are torch tensors (NumPy has no bfloat16): those rows skip without torch.

Shapes: ``1x8x256x128`` (1 MiB in float32, held in the caches: the regression check's size,
where the ratio to a copy moves by 2-4 % between runs on a loaded machine, against 8 % at
4 MiB) and a model-sized prefill ``1x32x8192x128`` (one layer's q of an 8192-token prompt,
128 MiB).

``python -m benchmarks.rope`` (from ``asv_benchmarks``) prints the same comparison as a
best-of-N table without asv, with the 4x shape too.
"""

from __future__ import annotations

import numpy as np

from posenc import _dispatch
from posenc._oracles import rope_rotate_half

from .common import Benchmark, floor_copy, floor_ratio, interleaved_best, ratio, require, shape

SHAPES = ["1x8x256x128", "1x32x8192x128"]
DTYPES = ["float32", "bfloat16"]


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
    """``x`` (NumPy float32, or torch bfloat16), positions, buffers, ``cos``/``sin`` tables in ``x``'s kind."""

    def __init__(self, dims, dtype):
        rng = np.random.default_rng(0)
        data = rng.standard_normal(dims, dtype=np.float32)
        length, dim = dims[-2], dims[-1]
        self.frequencies = inv_freq(dim)
        cos, sin = cos_sin_table(length, self.frequencies)
        if dtype == "bfloat16":
            torch = require("torch")
            self.x = torch.from_numpy(data).to(torch.bfloat16)
            self.positions = torch.arange(length)
            self.raw = self.x.view(torch.int16).numpy()  # the same bytes, for np.copyto
            self.cos, self.sin = (torch.from_numpy(t).to(torch.bfloat16) for t in (cos, sin))
        else:
            self.x = data
            self.positions = np.arange(length)
            self.raw = data
            self.cos, self.sin = cos.astype(np.float32), sin.astype(np.float32)
        self.out = rope_posenc(self.x, self.positions, self.frequencies)
        self.in_place = rope_posenc(self.x, self.positions, self.frequencies)
        self.copy = floor_copy(self.raw)

    def allocating(self):
        return rope_posenc(self.x, self.positions, self.frequencies)

    def into_out(self):
        return rope_posenc(self.x, self.positions, self.frequencies, out=self.out)

    def rotate_in_place(self):
        return rope_posenc(self.in_place, self.positions, self.frequencies, out=self.in_place)

    def formula(self, x):
        """The plain formula on ``x`` (the same values as ``self.x``, in NumPy or torch)."""
        if isinstance(x, np.ndarray) == isinstance(self.x, np.ndarray):
            return lambda: rope_rotate_half(x, self.cos, self.sin)
        torch = require("torch")
        cos, sin = torch.from_numpy(self.cos), torch.from_numpy(self.sin)
        return lambda: rope_rotate_half(x, cos, sin)


class RopeRotate(Benchmark):
    """``rope_rotate`` on ``x`` at positions ``0..S-1``; ratios to ``np.copyto`` of the same bytes."""

    params = (SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def make(self, dims, dtype):
        self.inputs = Inputs(shape(dims), dtype)

    def time_rope_posenc_allocating(self, dims, dtype):
        self.inputs.allocating()

    def time_rope_posenc_out(self, dims, dtype):
        self.inputs.into_out()

    def time_rope_posenc_in_place(self, dims, dtype):
        self.inputs.rotate_in_place()

    def track_in_place_time_over_copy(self, dims, dtype):
        return floor_ratio(self.inputs.rotate_in_place, self.inputs.copy)

    def track_out_time_over_copy(self, dims, dtype):
        return floor_ratio(self.inputs.into_out, self.inputs.copy)

    track_in_place_time_over_copy.unit = track_out_time_over_copy.unit = "x copy time"


class RopeVsFormula(Benchmark):
    """posenc's allocating ``rope_rotate`` over the plain formula (precomputed tables) in
    NumPy or torch eager, on the same values in that library; bfloat16 in torch only."""

    params = (SHAPES, DTYPES, ["numpy", "torch"])
    param_names = ["shape", "dtype", "formula"]

    def make(self, dims, dtype, formula):
        if dtype == "bfloat16" and formula == "numpy":
            raise NotImplementedError("NumPy has no bfloat16")
        self.inputs = Inputs(shape(dims), dtype)
        x = self.inputs.x
        self.formula = self.inputs.formula(require("torch").from_numpy(x) if formula == "torch" and isinstance(x, np.ndarray) else x)

    def track_posenc_time_over_formula(self, dims, dtype, formula):
        return ratio(self.inputs.allocating, self.formula, repeat=3)

    track_posenc_time_over_formula.unit = "x formula time"


class RopeApply(Benchmark):
    """Op ``rope_apply`` (``pe.apply_rope``: precomputed ``cos``/``sin``, the Hugging Face
    drop-in's path), on the same inputs as ``RopeRotate``."""

    params = (SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def make(self, dims, dtype):
        self.inputs = Inputs(shape(dims), dtype)

    def time_apply_posenc_out(self, dims, dtype):
        i = self.inputs
        _dispatch.call("rope_apply", i.x, i.cos, i.sin, out=i.out)

    def time_apply_posenc_in_place(self, dims, dtype):
        i = self.inputs
        _dispatch.call("rope_apply", i.in_place, i.cos, i.sin, out=i.in_place)


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


def _table(shapes=("1x32x8192x128", "4x32x8192x128"), repeat=7):
    """Best-of-``repeat`` times of every variant, and ratios to torch eager and to copy."""
    torch = require("torch")
    rows = []
    for text in shapes:
        for dtype in DTYPES:
            i = Inputs(shape(text), dtype)
            torch_x = torch.from_numpy(i.x) if dtype == "float32" else i.x
            variants = {
                "np.copyto same bytes": i.copy,
                "torch eager formula": i.formula(torch_x),
                "posenc allocating": i.allocating,
                "posenc out=": i.into_out,
                "posenc in place": i.rotate_in_place,
            }
            if dtype == "float32":
                variants["numpy formula"] = i.formula(i.x)
            times = dict(zip(variants, interleaved_best(list(variants.values()), repeat)))
            for name, t in times.items():
                # The copy is the bandwidth reference, not a rotation: no ratio means anything there.
                ratios = "| - | - |" if name == "np.copyto same bytes" else (
                    f"| {times['torch eager formula'] / t:.1f}x | {times['np.copyto same bytes'] / t:.2f} |"
                )
                rows.append(f"| {text} | {dtype} | {name} | {t * 1e3:.1f} {ratios}")
            del i
    print("| shape | dtype | variant | best ms | speed-up vs torch eager | fraction of copy bandwidth |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


class RopeTracedLengthCompiled(Benchmark):
    """A decode step ``[1, 32, 1, 128]`` float32 with ``DynamicNTK(2.0, 4096)`` past its switch
    under ``torch.compile`` with a tensor offset: the op reads the length when the graph runs
    (``posenc::rope_rotate_at_lengths``: the eager call's frequencies), beside the eager call."""

    def make(self):
        torch = require("torch")

        import posenc as pe

        scaling = pe.scaling.DynamicNTK(2.0, 4096)
        self.x = torch.randn(1, 32, 1, 128)
        self.eager = lambda: pe.rope(self.x, offset=5000, scaling=scaling)
        compiled = torch.compile(lambda x, offset: pe.rope(x, offset=offset, scaling=scaling), fullgraph=True)
        offset = torch.tensor(5000)
        self.compiled = lambda: compiled(self.x, offset)

    def time_traced_length_posenc_torch_eager(self):
        self.eager()

    def time_traced_length_posenc_torch_compiled(self):
        self.compiled()

    def track_compiled_over_eager(self):
        return ratio(self.compiled, self.eager, repeat=50, calls=20)

    track_compiled_over_eager.unit = "x eager time"


if __name__ == "__main__":
    _table()
