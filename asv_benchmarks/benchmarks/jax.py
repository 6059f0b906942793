"""JAX CPU arrays through posenc's kernels, beside the same call on NumPy arrays and the plain
``jax.numpy`` formula under ``jax.jit``.

Every ``time_`` row is posenc's: ``time_*_posenc_numpy`` is the NumPy path (the kernels on NumPy arrays); ``_posenc_jax_eager``
the same call on JAX CPU arrays (the kernels on the arrays' memory); ``_posenc_jax_jit`` the
call under ``jax.jit`` (a host call into the same kernels); ``_plain_jnp_jit`` the formula
written in ``jax.numpy`` (precomputed ``cos``/``sin`` for rope, T5's bucket on the full
relative matrix for the bias), compiled by XLA; the calls and formulas are
``posenc._bench_jax``'s (``posenc bench``'s JAX rows). The plain formula runs only inside
``track_`` ratios. JAX results are waited for (``block_until_ready``). ``track_`` methods
give the JAX times as multiples of the NumPy path's or the plain formula's, timed in
turns. Every class skips without JAX. Shapes: a small one and a model-sized one.

``python -m benchmarks.jax`` (from ``asv_benchmarks``) prints the issue's table, best of
``--repeat`` in one process: ``--rounds`` tables in a row show the spread of a shared machine.
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import Benchmark, interleaved_best, ratio, require

ROPE_SHAPES = ["1x8x1024x128", "1x32x4096x128"]
BIAS_LENGTHS = [512, 2048]
HEADS = 16
OFFSET = 1000


def _shape(text):
    return tuple(int(n) for n in text.split("x"))


def rope_calls(shape):
    require("jax")
    from posenc._bench_jax import RopeCalls

    return RopeCalls(shape, OFFSET)


def bias_calls(length):
    require("jax")
    from posenc._bench_jax import T5Calls

    return T5Calls(HEADS, length)


class JaxRope(Benchmark):
    """``pe.rope`` at positions ``1000..``."""

    params = (ROPE_SHAPES,)
    param_names = ["shape"]

    def make(self, shape):
        self.inputs = rope_calls(_shape(shape))

    def time_rope_posenc_numpy(self, shape):
        self.inputs.numpy()

    def time_rope_posenc_jax_eager(self, shape):
        self.inputs.eager()

    def time_rope_posenc_jax_jit(self, shape):
        self.inputs.jit()

    def track_jax_jit_over_numpy(self, shape):
        return ratio(self.inputs.jit, self.inputs.numpy)

    track_jax_jit_over_numpy.unit = "x NumPy time"

    def track_jax_eager_over_numpy(self, shape):
        return ratio(self.inputs.eager, self.inputs.numpy)

    track_jax_eager_over_numpy.unit = "x NumPy time"

    def track_jax_jit_over_plain_jnp_jit(self, shape):
        return ratio(self.inputs.jit, self.inputs.plain_jit)

    track_jax_jit_over_plain_jnp_jit.unit = "x plain formula time"


class JaxDecode(Benchmark):
    """``pe.rope`` on a decode step ``[1, 32, 1, 128]`` under ``jax.jit`` (traced offset)."""

    def make(self):
        self.inputs = rope_calls((1, 32, 1, 128))

    def time_decode_posenc_jax_jit(self):
        self.inputs.jit()

    def time_decode_posenc_jax_eager(self):
        self.inputs.eager()

    def track_jax_jit_over_plain_jnp_jit(self):
        return ratio(self.inputs.jit, self.inputs.plain_jit, repeat=50, calls=20)

    track_jax_jit_over_plain_jnp_jit.unit = "x plain formula time"


class JaxT5Bias(Benchmark):
    """``pe.t5_bias``, ``16`` heads, ``L x L``."""

    params = (BIAS_LENGTHS,)
    param_names = ["length"]

    def make(self, length):
        self.inputs = bias_calls(length)

    def time_t5_posenc_numpy(self, length):
        self.inputs.numpy()

    def time_t5_posenc_jax_eager(self, length):
        self.inputs.eager()

    def time_t5_posenc_jax_jit(self, length):
        self.inputs.jit()

    def track_jax_jit_over_numpy(self, length):
        return ratio(self.inputs.jit, self.inputs.numpy)

    track_jax_jit_over_numpy.unit = "x NumPy time"

    def track_jax_jit_over_plain_jnp_jit(self, length):
        return ratio(self.inputs.jit, self.inputs.plain_jit)

    track_jax_jit_over_plain_jnp_jit.unit = "x plain formula time"


class JaxTracedLength(Benchmark):
    """A decode step ``[1, 32, 1, 128]`` with ``DynamicNTK(2.0, 4096)`` past its switch (offset
    5000), under ``jax.jit`` with a traced offset: the host call reads the length when it runs
    and rotates with the eager call's frequencies (op ``rope_rotate_at_length``), beside the
    eager NumPy call."""

    def make(self):
        jax = require("jax")
        import jax.numpy as jnp

        import posenc as pe

        self.scaling = pe.scaling.DynamicNTK(2.0, 4096)
        self.x = np.random.default_rng(0).standard_normal((1, 32, 1, 128), dtype=np.float32)
        self.jx, self.offset = jnp.asarray(self.x), jnp.asarray(5000)
        self.jitted = jax.jit(lambda x, offset: pe.rope(x, offset=offset, scaling=self.scaling))

    def time_traced_length_posenc_numpy(self):
        import posenc as pe

        pe.rope(self.x, offset=5000, scaling=self.scaling)

    def time_traced_length_posenc_jax_jit(self):
        self.jitted(self.jx, self.offset).block_until_ready()

    def track_jax_jit_over_numpy(self):
        return ratio(self.time_traced_length_posenc_jax_jit, self.time_traced_length_posenc_numpy, repeat=50, calls=20)

    track_jax_jit_over_numpy.unit = "x NumPy time"


def _table(repeat):
    """The issue's table: best of ``repeat`` of each call, timed in turns."""
    rows = []
    for label, inputs in (
        ("pe.rope [1,32,4096,128] float32, positions 1000..", rope_calls((1, 32, 4096, 128))),
        (f"pe.t5_bias {HEADS} heads, 2048 x 2048", bias_calls(2048)),
        ("pe.rope [1,32,1,128] (a decode step)", rope_calls((1, 32, 1, 128))),
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
