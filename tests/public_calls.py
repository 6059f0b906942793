"""One call of every public function, for the tests that carry them to JAX and Dask.

``ARRAY_CALLS[name] = (fn, make_args)``: ``make_args(rng)`` builds NumPy arguments
(float32 floats, int32 integers: what JAX without x64 holds), and ``fn(*arrays)`` calls
the public function with every other argument fixed, so ``jax.jit(fn)`` traces arrays
only and ``fn`` can be fed arrays of any namespace. ``CREATOR_CALLS[name](xp)`` builds an
array from nothing in namespace ``xp``. ``CONFIG`` lists the names that are no array
function (backend switches, the scaling classes' module, the kernel warm-up).
"""

from __future__ import annotations

import numpy as np

import posenc as pe

H, Q, K, D = 2, 3, 5, 4
CONFIG = {"get_backend", "set_backend", "use_backend", "scaling", "warmup"}


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _i(values):
    return np.asarray(values, dtype=np.int32)


_GRID = np.stack([np.arange(6) // 3, np.arange(6) % 3], axis=-1).astype(np.int32)
_INV_FREQ = pe.rope_frequencies(8)[0]

ARRAY_CALLS = {
    # absolute
    "sinusoidal": (lambda p: pe.sinusoidal(p, 8), lambda r: (_i(np.arange(6) * 1000),)),
    "hierarchical_extend": (lambda t: pe.hierarchical_extend(t, 10), lambda r: (_f(r, 4, 6),)),
    "floater": (lambda p0: pe.floater(4, 4, p0=p0, substeps=4), lambda r: (_f(r, 4),)),
    "apply_absolute": (lambda x, t: pe.apply_absolute(x, t, offset=1), lambda r: (_f(r, 2, 3, 4), _f(r, 6, 4))),
    "complex_order": (pe.complex_order, lambda r: (_f(r, 3, 4), _f(r, 3, 4), _f(r, 3, 4), _i([0, 5, 9]))),
    "conv_positions": (pe.conv_positions, lambda r: (_f(r, 2, 5, 4), _f(r, 3, 4))),
    "attention": (
        lambda q, k, v, b: pe.attention(q, k, v, bias=b, causal=True),
        lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, H, K, D), _f(r, H, Q, K)),
    ),
    # relative indices, buckets, biases
    "clip_relative": (lambda rel: pe.clip_relative(rel, 2), lambda r: (_i(np.arange(-4, 5)),)),
    "t5_bucket": (lambda rel: pe.t5_bucket(rel, bidirectional=False), lambda r: (_i(np.arange(-40, 200, 3)),)),
    "deberta_bucket": (
        lambda rel: pe.deberta_bucket(rel, bucket_size=8, max_position=16),
        lambda r: (_i(np.arange(-40, 40)),),
    ),
    "t5_bias": (lambda t: pe.t5_bias(t, Q, K, offset=2), lambda r: (_f(r, 32, H),)),
    "alibi_bias": (lambda s: pe.alibi_bias(s, Q, K, symmetric=True), lambda r: (_f(r, H),)),
    "relative_bias_vector": (
        lambda t: pe.relative_bias_vector("shaw", t, Q, K, max_distance=2),
        lambda r: (_f(r, 5, H),),
    ),
    "relative_bias": (
        lambda t: pe.relative_bias("deberta", t, Q, K, max_distance=2, bucket_size=2, max_position=4),
        lambda r: (_f(r, 4, H),),
    ),
    "expand_bias": (lambda v: pe.expand_bias(v, Q, K), lambda r: (_f(r, H, Q + K - 1),)),
    # relative logits
    "shaw_logits": (
        lambda q, k, t: pe.shaw_logits(q, k, t, max_distance=2, offset=1),
        lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, 5, D)),
    ),
    "shaw_output": (
        lambda w, v, t: pe.shaw_output(w, v, t, max_distance=2),
        lambda r: (_f(r, H, Q, K), _f(r, H, K, D), _f(r, 5, D)),
    ),
    "rel_shift": (pe.rel_shift, lambda r: (_f(r, H, Q, K),)),
    "xl_logits": (
        pe.xl_logits,
        lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, H, K + Q, D), _f(r, H, 1, D), _f(r, H, 1, D)),
    ),
    "tener_logits": (pe.tener_logits, lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, H, 1, D), _f(r, H, 1, D))),
    "deberta_logits": (
        lambda q, k, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=2),
        lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, H, 4, D), _f(r, H, 4, D)),
    ),
    "tupe_logits": (
        lambda q, k, p, uq, uk, b: pe.tupe_logits(q, k, p, uq, uk, bias=b, cls=(1.0, -1.0)),
        lambda r: (_f(r, H, Q, D), _f(r, H, K, D), _f(r, 6, 3), _f(r, H, 3, D), _f(r, H, 3, D), _f(r, H, Q, K)),
    ),
    "segment_logits": (
        pe.segment_logits,
        lambda r: (_f(r, H, Q, D), _i([0, 0, 1]), _i([0, 1, 1, 0, 1]), _f(r, H, 1, D), _f(r, H, 1, D), _f(r, H, 1, D)),
    ),
    # rotary
    "rope_cos_sin": (lambda p: pe.rope_cos_sin(p, _INV_FREQ, layout="interleaved"), lambda r: (_i([0, 7, 70_000]),)),
    "apply_rope": (
        lambda x, c, s: pe.apply_rope(x, c, s),
        lambda r: (_f(r, H, Q, 10), *(a.astype(np.float32) for a in pe.rope_cos_sin(np.arange(Q), _INV_FREQ))),
    ),
    "rope": (
        lambda x, p: pe.rope(x, p, scaling=pe.scaling.YaRN(4.0, 16), rotary_dim=6, offset=3),
        lambda r: (_f(r, H, Q, 8), _i([5, 1_000_000, 2**23 + 11])),
    ),
    "mrope_cos_sin": (
        lambda p: pe.mrope_cos_sin(p, _INV_FREQ, [1, 2, 1], layout="interleaved"),
        lambda r: (_i([[0, 3, 90_000], [0, 1, 2], [5, 0, 7]]),),
    ),
    "axial_rope": (pe.axial_rope, lambda r: (_f(r, 6, 10), _GRID)),
    "convert_layout": (lambda x: pe.convert_layout(x, "half", "interleaved", rotary_dim=6), lambda r: (_f(r, 3, 8),)),
    "permute_qk_weight": (
        lambda w: pe.permute_qk_weight(w, "interleaved", "half", head_dim=4),
        lambda r: (_f(r, 8, 3),),
    ),
    "linear_attention": (
        lambda q, k, v, p: pe.linear_attention(q, k, v, positions=p, causal=True),
        lambda r: (_f(r, H, Q, D), _f(r, H, Q, D), _f(r, H, Q, 3), _i(np.arange(Q))),
    ),
    "positions_from_mask": (lambda m: pe.positions_from_mask(m, start=2), lambda r: (_i([[0, 1, 1], [1, 1, 0]]),)),
    "positions_from_cu_seqlens": (lambda c: pe.positions_from_cu_seqlens(c, 5), lambda r: (_i([0, 3, 5]),)),
    "rerotate": (lambda x, d: pe.rerotate(x, d, _INV_FREQ), lambda r: (_f(r, 3, 8), _i([-4, 0, 90_000]))),
    "rope_decay": (lambda m: pe.rope_decay(m, 8), lambda r: (np.array([0.0, 10.0, 1e6], np.float32),)),
    "xpos_scale": (lambda p: pe.xpos_scale(p, 8), lambda r: (_i(np.arange(-3, 3)),)),
}

CREATOR_CALLS = {
    "alibi_slopes": lambda xp: pe.alibi_slopes(6, xp=xp),
    "nezha_table": lambda xp: pe.nezha_table(3, 4, xp=xp),
    "relative_positions": lambda xp: pe.relative_positions(3, 4, offset=1, xp=xp),
    "rope_frequencies": lambda xp: pe.rope_frequencies(8, scaling=pe.scaling.Linear(2.0), xp=xp)[0],
    "sinusoidal": lambda xp: pe.sinusoidal(5, 8, xp=xp),
    "floater": lambda xp: pe.floater(3, 4, substeps=4, xp=xp),
    "rope_decay": lambda xp: pe.rope_decay(4, 8, xp=xp),
}


def uncovered():
    """Public names that neither table calls (should be empty)."""
    return sorted(set(pe.__all__) - CONFIG - set(ARRAY_CALLS) - set(CREATOR_CALLS))
