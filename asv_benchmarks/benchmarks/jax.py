"""JAX CPU arrays through posenc's kernels, beside the same call on NumPy arrays and the plain
``jax.numpy`` formula under ``jax.jit``.

``time_*_posenc_numpy`` is the NumPy path (the kernels on NumPy arrays); ``_posenc_jax_eager``
the same call on JAX CPU arrays (the kernels on the arrays' memory); ``_posenc_jax_jit`` the
call under ``jax.jit`` (a host call into the same kernels); ``_plain_jnp_jit`` the formula
written in ``jax.numpy`` (precomputed ``cos``/``sin`` for rope, T5's bucket on the full
relative matrix for the bias), compiled by XLA. JAX results are waited for
(``block_until_ready``). ``track_`` methods give the JAX times as multiples of the NumPy
path's (the model sizes) or the plain formula's (the decode step), timed in turns.

``python -m benchmarks.jax`` (from ``asv_benchmarks``) prints the issue's table, best of
``--repeat`` in one process: ``--rounds`` tables in a row show the spread of a shared machine.
"""

from __future__ import annotations

import argparse

import numpy as np

import posenc as pe

from .common import Benchmark, interleaved_best, require, sizes

ROPE_SHAPES = sizes(["1x8x1024x128"], ["1x32x4096x128"])
BIAS_LENGTHS = sizes([512], [2048])
HEADS = 16
OFFSET = 1000


def _shape(text):
    return tuple(int(n) for n in text.split("x"))


def _jax():
    jax = require("jax")
    import jax.numpy as jnp

    return jax, jnp


def _ready(a):
    return a.block_until_ready()


def plain_rope(jnp, x, cos, sin):
    """LLaMA's ``x * cos + rotate_half(x) * sin``, the formula a JAX model writes."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def plain_t5(jnp, table, q_len, k_len, num_buckets=32, max_distance=128):
    """T5's bidirectional bucket of ``key - query`` on the full ``[q, k]`` matrix, a table lookup and a transpose."""
    rel = jnp.arange(k_len)[None, :] - jnp.arange(q_len)[:, None]
    n = num_buckets // 2
    bucket = (rel > 0).astype(jnp.int32) * n
    rel = jnp.abs(rel)
    exact = n // 2
    large = exact + (jnp.log(jnp.maximum(rel, 1).astype(jnp.float32) / exact) / np.log(max_distance / exact) * (n - exact)).astype(jnp.int32)
    bucket = bucket + jnp.where(rel < exact, rel, jnp.minimum(large, n - 1))
    return jnp.transpose(table[bucket], (2, 0, 1))


class RopeInputs:
    def __init__(self, shape, decode=False):
        jax, jnp = _jax()
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal(shape, dtype=np.float32)
        self.jx = jnp.asarray(self.x)
        length, dim = shape[-2], shape[-1]
        angle = (OFFSET + np.arange(length))[:, None] * (10000.0 ** (-np.arange(0, dim, 2) / dim))
        angle = np.concatenate([angle, angle], -1)
        self.cos, self.sin = (jnp.asarray(t, dtype=jnp.float32) for t in (np.cos(angle), np.sin(angle)))
        self.jitted = jax.jit(lambda x, o: pe.rope(x, offset=o))
        self.plain = jax.jit(lambda x, c, s: plain_rope(jnp, x, c, s))
        self.offset = jnp.asarray(OFFSET)

    def numpy(self):
        return pe.rope(self.x, offset=OFFSET)

    def eager(self):
        return _ready(pe.rope(self.jx, offset=OFFSET))

    def jit(self):
        return _ready(self.jitted(self.jx, self.offset))

    def plain_jit(self):
        return _ready(self.plain(self.jx, self.cos, self.sin))


class BiasInputs:
    def __init__(self, length):
        jax, jnp = _jax()
        self.length = length
        self.table = np.random.default_rng(0).standard_normal((32, HEADS)).astype(np.float32)
        self.jtable = jnp.asarray(self.table)
        self.jitted = jax.jit(lambda t: pe.t5_bias(t, length, length))
        self.plain = jax.jit(lambda t: plain_t5(jnp, t, length, length))

    def numpy(self):
        return pe.t5_bias(self.table, self.length, self.length)

    def eager(self):
        return _ready(pe.t5_bias(self.jtable, self.length, self.length))

    def jit(self):
        return _ready(self.jitted(self.jtable))

    def plain_jit(self):
        return _ready(self.plain(self.jtable))


class JaxRope(Benchmark):
    """``pe.rope`` at positions ``1000..``."""

    params = (ROPE_SHAPES,)
    param_names = ["shape"]

    def make(self, shape):
        self.inputs = RopeInputs(_shape(shape))

    def time_rope_posenc_numpy(self, shape):
        self.inputs.numpy()

    def time_rope_posenc_jax_eager(self, shape):
        self.inputs.eager()

    def time_rope_posenc_jax_jit(self, shape):
        self.inputs.jit()

    def time_rope_plain_jnp_jit(self, shape):
        self.inputs.plain_jit()

    def track_jax_jit_over_numpy(self, shape):
        numpy, jit = interleaved_best([self.inputs.numpy, self.inputs.jit])
        return jit / numpy

    track_jax_jit_over_numpy.unit = "x NumPy time"

    def track_jax_eager_over_numpy(self, shape):
        numpy, eager = interleaved_best([self.inputs.numpy, self.inputs.eager])
        return eager / numpy

    track_jax_eager_over_numpy.unit = "x NumPy time"


class JaxDecodeStep(Benchmark):
    """``pe.rope`` on a decode step ``[1, 32, 1, 128]`` under ``jax.jit`` (traced offset)."""

    def make(self):
        self.inputs = RopeInputs((1, 32, 1, 128))

    def time_decode_posenc_jax_jit(self):
        self.inputs.jit()

    def time_decode_plain_jnp_jit(self):
        self.inputs.plain_jit()

    def time_decode_posenc_jax_eager(self):
        self.inputs.eager()

    def track_jax_jit_over_plain_jnp_jit(self):
        plain, jit = interleaved_best([self.inputs.plain_jit, self.inputs.jit], repeat=50)
        return jit / plain

    track_jax_jit_over_plain_jnp_jit.unit = "x plain formula time"


class JaxT5Bias(Benchmark):
    """``pe.t5_bias``, ``16`` heads, ``L x L``."""

    params = (BIAS_LENGTHS,)
    param_names = ["length"]

    def make(self, length):
        self.inputs = BiasInputs(length)

    def time_t5_posenc_numpy(self, length):
        self.inputs.numpy()

    def time_t5_posenc_jax_eager(self, length):
        self.inputs.eager()

    def time_t5_posenc_jax_jit(self, length):
        self.inputs.jit()

    def time_t5_plain_jnp_jit(self, length):
        self.inputs.plain_jit()

    def track_jax_jit_over_numpy(self, length):
        numpy, jit = interleaved_best([self.inputs.numpy, self.inputs.jit])
        return jit / numpy

    track_jax_jit_over_numpy.unit = "x NumPy time"


def _table(repeat):
    """The issue's table: best of ``repeat`` of each call, timed in turns."""
    rows = []
    for label, inputs in (
        ("pe.rope [1,32,4096,128] float32, positions 1000..", RopeInputs((1, 32, 4096, 128))),
        (f"pe.t5_bias {HEADS} heads, 2048 x 2048", BiasInputs(2048)),
        ("pe.rope [1,32,1,128] (a decode step)", RopeInputs((1, 32, 1, 128))),
    ):
        fns = [inputs.numpy, inputs.eager, inputs.jit, inputs.plain_jit]
        for fn in fns:
            fn()  # compile, trace, load kernels
        numpy, eager, jit, plain = interleaved_best(fns, repeat if "decode" not in label else 10 * repeat)
        rows.append(
            f"| {label} | {numpy * 1e3:.3f} | {eager * 1e3:.3f} ({eager / numpy:.2f}x) | {jit * 1e3:.3f} ({jit / numpy:.2f}x) "
            f"| {plain * 1e3:.3f} (jit / plain {jit / plain:.2f}x) |"
        )
        del inputs
    print("| call | NumPy arrays, ms | JAX eager, ms | JAX jax.jit, ms | plain jnp formula under jit, ms |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    for _ in range(options.rounds):
        _table(options.repeat)
