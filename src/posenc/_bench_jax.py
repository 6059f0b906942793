"""``posenc bench``'s JAX section: posenc on JAX CPU arrays, eager and under ``jax.jit``,
beside the same call on NumPy arrays and the plain ``jax.numpy`` formula under ``jax.jit``.

Rows (the ``posenc bench`` table's columns; ``vs framework`` is over the plain ``jnp`` formula
compiled by XLA): ``pe.rope`` at positions ``1000..`` and ``pe.t5_bias``, at the model
sizes of issue 21 (``[1, 32, 4096, 128]``, 16 heads over ``2048 x 2048``). Then a decode
step (``pe.rope`` on ``[1, 32, 1, 128]``, traced offset) under ``jit`` against the plain
formula under ``jit``, interleaved as ``_bench_decode`` times its cases. JAX results are
waited for (``block_until_ready``). ``asv_benchmarks/benchmarks/jax.py`` times the same
calls with these formulas.
"""

from __future__ import annotations

import numpy as np

import posenc as pe

from ._bench_measure import Case, _measure

OFFSET = 1000  # the first position of the rope rows
DECODE_SHAPE = (1, 32, 1, 128)


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


def cos_sin(jnp, length, dim, offset=OFFSET):
    """The float32 ``cos``/``sin`` tables of positions ``offset ..`` in the ``half`` layout (the plain formula's input)."""
    angle = (offset + np.arange(length))[:, None] * (10000.0 ** (-np.arange(0, dim, 2) / dim))
    angle = np.concatenate([angle, angle], -1)
    return jnp.asarray(np.cos(angle), dtype=jnp.float32), jnp.asarray(np.sin(angle), dtype=jnp.float32)


class RopeCalls:
    """``pe.rope`` on ``shape`` float32 at positions ``offset ..``: NumPy, JAX eager, JAX ``jit``, and the plain formula under ``jit``."""

    def __init__(self, shape, offset=OFFSET):
        import jax
        import jax.numpy as jnp

        self.offset = offset
        self.x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        self.jx = jnp.asarray(self.x)
        self.cos, self.sin = cos_sin(jnp, shape[-2], shape[-1], offset)
        self.jitted = jax.jit(lambda x, o: pe.rope(x, offset=o))
        self.plain = jax.jit(lambda x, c, s: plain_rope(jnp, x, c, s))
        self.traced_offset = jnp.asarray(offset)

    def numpy(self):
        return pe.rope(self.x, offset=self.offset)

    def eager(self):
        return pe.rope(self.jx, offset=self.offset).block_until_ready()

    def jit(self):
        return self.jitted(self.jx, self.traced_offset).block_until_ready()

    def plain_jit(self):
        return self.plain(self.jx, self.cos, self.sin).block_until_ready()


class T5Calls:
    """``pe.t5_bias`` of ``heads`` heads over ``length x length``: NumPy, JAX eager, JAX ``jit``, the plain formula under ``jit``."""

    def __init__(self, heads, length):
        import jax
        import jax.numpy as jnp

        self.length = length
        self.table = np.random.default_rng(1).standard_normal((32, heads)).astype(np.float32)
        self.jtable = jnp.asarray(self.table)
        self.jitted = jax.jit(lambda t: pe.t5_bias(t, length, length))
        self.plain = jax.jit(lambda t: plain_t5(jnp, t, length, length))

    def numpy(self):
        return pe.t5_bias(self.table, self.length, self.length)

    def eager(self):
        return pe.t5_bias(self.jtable, self.length, self.length).block_until_ready()

    def jit(self):
        return self.jitted(self.jtable).block_until_ready()

    def plain_jit(self):
        return self.plain(self.jtable).block_until_ready()


def _cases(calls, name, nbytes):
    return [
        Case("jnp plain formula, jax.jit", calls.plain_jit, nbytes),
        Case(f"posenc {name} (NumPy arrays)", calls.numpy, nbytes),
        Case(f"posenc {name} (JAX, eager)", calls.eager, nbytes),
        Case(f"posenc {name} (JAX, jax.jit)", calls.jit, nbytes),
    ]


def rows(quick, repeat, progress):
    """The rope and t5_bias rows of the table (model sizes; small ones with ``quick``)."""
    shape, heads, length = ((1, 8, 1024, 128), 16, 512) if quick else ((1, 32, 4096, 128), 16, 2048)
    rope = RopeCalls(shape)
    found = _measure(f"JAX rope {list(shape)}", _cases(rope, "rope", 2 * rope.x.nbytes), repeat, progress)
    t5 = T5Calls(heads, length)
    found += _measure(f"JAX t5_bias h={heads} L={length}", _cases(t5, "t5_bias", heads * length * length * 4), repeat, progress)
    return found


def decode(rounds, calls=200, progress=lambda s: None):
    """The decode step under ``jit`` beside the plain formula under ``jit``, as ``_bench_decode`` prints its cases."""
    from . import _bench_decode

    step = RopeCalls(DECODE_SHAPE, offset=_bench_decode.PAST)
    case = _bench_decode.Case("rope jax.jit [1,32,1,128] vs jnp formula under jit", step.jit, step.plain_jit)
    progress(f"  {case.name} ...")
    ours, theirs = _bench_decode.interleaved(case, rounds, calls)
    return f"{case.name:<56} {ours * 1e6:7.1f}us {theirs * 1e6:8.1f}us {ours / theirs:6.2f} {case.limit:6.1f}"
