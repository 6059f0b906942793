"""JAX reach: every public function on ``jax.numpy`` arrays, under ``jax.jit``, and gradients.

JAX runs here without x64 (float32 at most), so the angles take the exact split
reduction; results are compared with NumPy (float64 angles) and with float64 formulas.
Gradients are compared with the gradients of naive ``jax.numpy`` transcriptions of each
formula (independent of posenc's code: gathers and ``[q, k, d]`` tensors written out).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import posenc as pe
from public_calls import ARRAY_CALLS, CREATOR_CALLS, uncovered

jax = pytest.importorskip("jax")
jnp = jax.numpy

# float32 results against NumPy's (float64 angles, float32 or float64 arithmetic).
RTOL = ATOL = 2e-5


def _numpy(a):
    return np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a)


# NumPy's dtype of a result -> the dtype JAX without x64 holds it in.
_WITHOUT_X64 = {np.dtype(np.float64): np.float32, np.dtype(np.int64): np.int32, np.dtype(np.complex128): np.complex64}


def _check_like_numpy(got, want, name):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, jax.Array), f"{name}: result is {type(g).__name__}, not a jax Array"
        dtype = np.asarray(w).dtype
        assert np.dtype(g.dtype) == _WITHOUT_X64.get(dtype, dtype), f"{name}: dtype {g.dtype} for NumPy's {dtype}"
        assert tuple(g.shape) == np.shape(w), f"{name}: shape {g.shape} != {np.shape(w)}"
        np.testing.assert_allclose(_numpy(g), np.asarray(w), rtol=RTOL, atol=ATOL, err_msg=name)


def test_jax_runs_without_x64():
    # The point of these tests: no float64 anywhere on the JAX side.
    assert not jax.config.jax_enable_x64
    assert not pe._xp.has_float64(jnp)


def test_every_public_function_is_called():
    assert uncovered() == []


@pytest.mark.parametrize("name", sorted(ARRAY_CALLS))
def test_public_function_on_jax_eager_and_jit(name, rng):
    fn, make_args = ARRAY_CALLS[name]
    args = make_args(rng)
    want = fn(*args)
    jargs = [jnp.asarray(a) for a in args]
    _check_like_numpy(fn(*jargs), want, name)
    _check_like_numpy(jax.jit(fn)(*jargs), want, name + " (jit)")


@pytest.mark.parametrize("name", sorted(CREATOR_CALLS))
def test_creator_on_jax_eager_and_jit(name):
    fn = CREATOR_CALLS[name]
    want = fn(None)
    _check_like_numpy(fn(jnp), want, name)
    _check_like_numpy(jax.jit(functools.partial(fn, jnp))(), want, name + " (jit)")


def test_static_arguments_by_name(rng):
    table = rng.standard_normal((32, 2)).astype(np.float32)
    biased = jax.jit(pe.t5_bias, static_argnames=("q_len", "k_len", "offset", "bidirectional"))
    got = biased(jnp.asarray(table), q_len=4, k_len=6, offset=2, bidirectional=False)
    np.testing.assert_array_equal(np.asarray(got), pe.t5_bias(table, 4, 6, offset=2, bidirectional=False))
    rotate = jax.jit(pe.rope, static_argnames=("base", "layout", "offset"))
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    got = rotate(jnp.asarray(x), base=500.0, layout="interleaved", offset=7)
    np.testing.assert_allclose(np.asarray(got), pe.rope(x, base=500.0, layout="interleaved", offset=7), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtype_in_is_dtype_out_under_jit(dtype, rng):
    jdtype = getattr(jnp, dtype)
    x = jnp.asarray(rng.standard_normal((2, 4, 8)), dtype=jdtype)
    table = jnp.asarray(rng.standard_normal((32, 2)), dtype=jdtype)
    q = jnp.asarray(rng.standard_normal((2, 4, 8)), dtype=jdtype)
    outputs = {
        "rope": jax.jit(pe.rope)(x),
        "t5_bias": jax.jit(lambda t: pe.t5_bias(t, 4, 4))(table),
        "shaw_logits": jax.jit(lambda a, t: pe.shaw_logits(a, a, t, max_distance=1))(q, x[0, :3]),
    }
    for name, out in outputs.items():
        assert out.dtype == jdtype, f"{name}: {out.dtype} != {jdtype}"


# --- precision without float64 ----------------------------------------------------------


def test_rope_angles_stay_exact_at_long_positions_without_float64(rng):
    dim = 64
    x = rng.standard_normal((6, dim)).astype(np.float32)
    pos = np.array([0, 1, 4095, 2**20 + 3, 2**23 + 11, 10_000_000], dtype=np.int32)
    inv_freq = 10000.0 ** (-np.arange(0, dim, 2) / dim)
    angle = pos.astype(np.float64)[:, None] * inv_freq
    a, b = x[:, : dim // 2].astype(np.float64), x[:, dim // 2 :].astype(np.float64)
    exact = np.concatenate([a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)], axis=-1)
    got = np.asarray(jax.jit(pe.rope)(jnp.asarray(x), jnp.asarray(pos)))
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6 * np.abs(x).max() * 2)
    # The check has teeth: float32 angles are off by up to half a radian at 10M.
    naive = jnp.cos(jnp.asarray(pos, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq, dtype=jnp.float32))
    assert np.abs(np.asarray(naive) - np.cos(angle)).max() > 1e-2


def test_sinusoidal_and_cos_sin_exact_at_long_positions_without_float64():
    pos = np.array([3, 2**21 + 1, 9_999_991], dtype=np.int32)
    freqs = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    angle = pos.astype(np.float64)[:, None] * freqs
    table = np.asarray(jax.jit(lambda p: pe.sinusoidal(p, 16))(jnp.asarray(pos)))
    np.testing.assert_allclose(table[:, 0::2], np.sin(angle), atol=1e-6)
    np.testing.assert_allclose(table[:, 1::2], np.cos(angle), atol=1e-6)
    cos, sin = jax.jit(lambda p: pe.rope_cos_sin(p, freqs))(jnp.asarray(pos))
    np.testing.assert_allclose(np.asarray(cos)[:, :8], np.cos(angle), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin)[:, 8:], np.sin(angle), atol=1e-6)


# --- gradients against naive transcriptions -----------------------------------------------


def _rotate_half_naive(x, angle, rotary_dim, scale=1.0):
    """LLaMA's ``x * cos + rotate_half(x) * sin`` on the first ``rotary_dim`` channels;
    ``angle`` is a float64 NumPy array ``[..., rotary_dim / 2]``."""
    cos = jnp.asarray(np.cos(angle) * scale, dtype=jnp.float32)
    sin = jnp.asarray(np.sin(angle) * scale, dtype=jnp.float32)
    cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
    rot = x[..., :rotary_dim]
    half = jnp.concatenate([-rot[..., rotary_dim // 2 :], rot[..., : rotary_dim // 2]], -1)
    return jnp.concatenate([rot * cos + half * sin, x[..., rotary_dim:]], -1)


def _inv_freq(dim, base=10000.0):
    return base ** (-np.arange(0, dim, 2) / dim)


def _assert_same_gradients(fn, naive, args, rng, name):
    """``d sum(w * f(args)) / d args`` of posenc's ``fn`` and of ``naive``, both under ``jit``
    (eager differentiation runs the same rules, one dispatch per operation)."""
    args = [jnp.asarray(a) for a in args]
    weights = jnp.asarray(rng.standard_normal(np.shape(naive(*args))), dtype=jnp.float32)
    argnums = tuple(range(len(args)))

    def gradient(f):
        return jax.jit(jax.grad(lambda *a: jnp.sum(weights * f(*a)), argnums=argnums))

    got, want = gradient(fn)(*args), gradient(naive)(*args)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5, err_msg=f"{name}: argument {i}")


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_rope_gradient(rng):
    pos = np.arange(5) + 3
    inv_freq = _inv_freq(6) / 2.0  # Linear(2.0) on the first 6 of 8 channels
    _assert_same_gradients(
        lambda x: pe.rope(x, rotary_dim=6, offset=3, scaling=pe.scaling.Linear(2.0)),
        lambda x: _rotate_half_naive(x, pos[:, None] * inv_freq, 6),
        [_x(rng, 2, 5, 8)],
        rng,
        "rope",
    )
    # Per-token positions and the inverse rotation (the backward pass itself).
    pos = np.array([[0, 7, 900], [2**20, 5, 1]])
    _assert_same_gradients(
        lambda x: pe.rope(x, jnp.asarray(pos), inverse=True),
        lambda x: _rotate_half_naive(x, -pos[..., None] * _inv_freq(8), 8),
        [_x(rng, 2, 3, 8)],
        rng,
        "rope inverse",
    )


def test_apply_rope_gradient(rng):
    angle = np.arange(4)[:, None] * _inv_freq(6)
    cos = np.concatenate([np.cos(angle)] * 2, -1).astype(np.float32)
    sin = np.concatenate([np.sin(angle)] * 2, -1).astype(np.float32)

    def naive(x):
        rot = x[..., :6]
        half = jnp.concatenate([-rot[..., 3:], rot[..., :3]], -1)
        return jnp.concatenate([rot * cos + half * sin, x[..., 6:]], -1)

    c, s = jnp.asarray(cos), jnp.asarray(sin)
    _assert_same_gradients(lambda x: pe.apply_rope(x, c, s), naive, [_x(rng, 2, 4, 10)], rng, "apply_rope")


def test_rerotate_gradient(rng):
    delta = np.array([-5, 0, 3, 70_000])
    _assert_same_gradients(
        lambda x: pe.rerotate(x, jnp.asarray(delta), _inv_freq(8)),
        lambda x: _rotate_half_naive(x, delta[:, None] * _inv_freq(8), 8),
        [_x(rng, 4, 8)],
        rng,
        "rerotate",
    )


def test_axial_rope_gradient(rng):
    grid = np.stack([np.arange(6) // 3, np.arange(6) % 3], axis=-1)

    def naive(x):
        rows = _rotate_half_naive(x[..., :4], grid[:, :1] * _inv_freq(4), 4)
        cols = _rotate_half_naive(x[..., 4:8], grid[:, 1:] * _inv_freq(4), 4)
        return jnp.concatenate([rows, cols, x[..., 8:]], -1)

    _assert_same_gradients(lambda x: pe.axial_rope(x, jnp.asarray(grid)), naive, [_x(rng, 2, 6, 9)], rng, "axial_rope")


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_gradient(causal, rng):
    n, d = 5, 6
    pos = np.arange(n) * 3

    def naive(q, k, v):
        # The quadratic form of RoFormer eq. 29: an n x n matrix of rotated and plain scores.
        fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
        angle = pos[:, None] * _inv_freq(d)
        rq, rk = _rotate_half_naive(fq, angle, d), _rotate_half_naive(fk, angle, d)
        num = rq @ jnp.swapaxes(rk, -1, -2)
        den = fq @ jnp.swapaxes(fk, -1, -2)
        if causal:
            keep = np.tril(np.ones((n, n), dtype=bool))
            num, den = jnp.where(keep, num, 0.0), jnp.where(keep, den, 0.0)
        return (num @ v) / jnp.sum(den, -1, keepdims=True)

    _assert_same_gradients(
        lambda q, k, v: pe.linear_attention(q, k, v, positions=jnp.asarray(pos), causal=causal),
        naive,
        [_x(rng, 2, n, d), _x(rng, 2, n, d), _x(rng, 2, n, 3)],
        rng,
        "linear_attention",
    )


def _hf_t5_bucket(relative_position, bidirectional, num_buckets=32, max_distance=128):
    """Hugging Face T5's ``_relative_position_bucket`` (``key - query``), in NumPy float32."""
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(relative_position.dtype) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(relative_position.astype(np.float32) / max_exact) / np.float32(math.log(max_distance / max_exact)) * (num_buckets - max_exact)
        )
    large = np.minimum(np.where(is_small, 0, large).astype(relative_position.dtype), num_buckets - 1)
    return buckets + np.where(is_small, relative_position, large)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_gradient_wrt_table(bidirectional, rng):
    q_len, k_len, offset = 6, 9, 150
    key_minus_query = np.arange(k_len)[None, :] - (offset + np.arange(q_len))[:, None]
    bucket = _hf_t5_bucket(key_minus_query, bidirectional)
    _assert_same_gradients(
        lambda t: pe.t5_bias(t, q_len, k_len, offset=offset, bidirectional=bidirectional),
        lambda t: jnp.transpose(t[bucket], (2, 0, 1)),
        [_x(rng, 32, 3)],
        rng,
        "t5_bias",
    )


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_bias_gradient_wrt_slopes(symmetric, rng):
    rel = (2 + np.arange(4))[:, None] - np.arange(7)[None, :]
    rel = np.abs(rel) if symmetric else rel
    _assert_same_gradients(
        lambda s: pe.alibi_bias(s, 4, 7, offset=2, symmetric=symmetric),
        lambda s: -s[:, None, None] * rel.astype(np.float32),
        [_x(rng, 4)],
        rng,
        "alibi_bias",
    )


def _rel(q_len, k_len, offset):
    return (offset + np.arange(q_len))[:, None] - np.arange(k_len)[None, :]


def test_shaw_gradients(rng):
    h, q_len, k_len, d, big_k, offset = 2, 4, 6, 5, 2, 1
    idx = np.clip(_rel(q_len, k_len, offset), -big_k, big_k) + big_k

    def naive_logits(q, k, t):
        return jnp.einsum("hid,hjd->hij", q, k) + jnp.einsum("hid,ijd->hij", q, t[idx])

    _assert_same_gradients(
        lambda q, k, t: pe.shaw_logits(q, k, t, max_distance=big_k, offset=offset),
        naive_logits,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, 2 * big_k + 1, d)],
        rng,
        "shaw_logits",
    )

    def naive_output(w, v, t):
        return jnp.einsum("hij,hjd->hid", w, v) + jnp.einsum("hij,ijd->hid", w, t[idx])

    _assert_same_gradients(
        lambda w, v, t: pe.shaw_output(w, v, t, max_distance=big_k, offset=offset),
        naive_output,
        [_x(rng, h, q_len, k_len), _x(rng, h, k_len, 3), _x(rng, 2 * big_k + 1, 3)],
        rng,
        "shaw_output",
    )


def test_deberta_logits_gradient(rng):
    h, q_len, k_len, d, big_k = 2, 4, 6, 4, 3
    delta = np.clip(_rel(q_len, k_len, 0) + big_k, 0, 2 * big_k - 1)

    def naive(q, k, pq, pk):
        c2p = jnp.einsum("hid,hijd->hij", q, pk[:, delta])
        p2c = jnp.einsum("hjd,hijd->hij", k, pq[:, delta])
        return (jnp.einsum("hid,hjd->hij", q, k) + c2p + p2c) / math.sqrt(3 * d)

    _assert_same_gradients(
        lambda q, k, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=big_k),
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, h, 2 * big_k, d), _x(rng, h, 2 * big_k, d)],
        rng,
        "deberta_logits",
    )


def test_xl_logits_gradient(rng):
    h, q_len, k_len, d = 2, 3, 5, 4
    row = k_len - 1 - _rel(q_len, k_len, k_len - q_len)  # bidirectional r: k_len + q_len rows

    def naive(q, k, r, u, v):
        return jnp.einsum("hid,hjd->hij", q + u, k) + jnp.einsum("hid,hijd->hij", q + v, r[:, row])

    _assert_same_gradients(
        pe.xl_logits,
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, h, k_len + q_len, d), _x(rng, h, 1, d), _x(rng, h, 1, d)],
        rng,
        "xl_logits",
    )


def test_tener_logits_gradient(rng):
    h, q_len, k_len, d = 2, 3, 5, 6
    rel = _rel(q_len, k_len, 0).astype(np.float64)
    angle = rel[..., None] * _inv_freq(d)
    table = np.stack([np.sin(angle), np.cos(angle)], -1).reshape(q_len, k_len, d).astype(np.float32)

    def naive(q, k, u, v):
        return jnp.einsum("hid,hjd->hij", q + u, k) + jnp.einsum("hid,ijd->hij", q + v, table)

    _assert_same_gradients(
        pe.tener_logits,
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, h, 1, d), _x(rng, h, 1, d)],
        rng,
        "tener_logits",
    )


def test_tupe_logits_gradient(rng):
    h, q_len, k_len, d, dp = 2, 3, 4, 4, 3

    def naive(q, k, p, uq, uk, b):
        pq, pk = jnp.einsum("id,hde->hie", p[:q_len], uq), jnp.einsum("jd,hde->hje", p[:k_len], uk)
        return (jnp.einsum("hid,hjd->hij", q, k) + jnp.einsum("hie,hje->hij", pq, pk)) / math.sqrt(2 * d) + b

    _assert_same_gradients(
        lambda *a: pe.tupe_logits(*a[:5], bias=a[5]),
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, 5, dp), _x(rng, h, dp, d), _x(rng, h, dp, d), _x(rng, h, q_len, k_len)],
        rng,
        "tupe_logits",
    )


def test_bad_input_on_jax():
    x = jnp.ones((3, 4))
    with pytest.raises(TypeError, match="out is not supported for JAX"):
        pe.rope(x, out=x)
    with pytest.raises(TypeError, match="different kinds"):
        pe.rope(x, np.arange(3))
    with pytest.raises(TypeError, match="inv_freq must hold concrete values"):  # a kernel takes host frequencies
        jax.jit(lambda f: pe.rerotate(x, 1, f))(jnp.ones(2))
    with pytest.raises(ValueError, match="positions"):
        jax.jit(lambda a, p: pe.rope(a, p))(x, jnp.arange(4))
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        jax.jit(pe.rope)(jnp.ones((3, 4), dtype=jnp.int32))
