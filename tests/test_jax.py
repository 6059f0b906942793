"""What only JAX has: ``jax.jit`` with static arguments, precision without x64, gradients.

Every public function runs under ``jax.jit`` (and eagerly) in the ordinary tests, through
the ``backend`` fixture (``Backend.call`` in tests/arrays.py). JAX runs here without x64
(float32 at most), so the angles take the exact split reduction. Gradients are compared
with the gradients of naive ``jax.numpy`` transcriptions of each formula (independent of
posenc's code: gathers and ``[q, k, d]`` tensors written out; the rotation is Hugging
Face's ``apply_rotary_pos_emb`` from ``posenc._oracles``, held equal to transformers').
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import posenc as pe
from formulas import exact_rope, hf_t5_bucket, inv_freq, rel_matrix, rope_half_any, rope_tables, sinusoid

jax = pytest.importorskip("jax")
jnp = jax.numpy

# float32 results against NumPy's (float64 angles, float32 or float64 arithmetic).
RTOL = ATOL = 2e-5


def test_jax_runs_without_x64():
    # The point of these tests: no float64 anywhere on the JAX side.
    assert not jax.config.jax_enable_x64
    assert not pe._xp.has_float64(jnp)


def test_static_arguments_by_name(rng):
    table = rng.standard_normal((32, 2)).astype(np.float32)
    biased = jax.jit(pe.t5_bias, static_argnames=("q_len", "k_len", "offset", "bidirectional"))
    got = biased(jnp.asarray(table), q_len=4, k_len=6, offset=2, bidirectional=False)
    np.testing.assert_array_equal(np.asarray(got), pe.t5_bias(table, 4, 6, offset=2, bidirectional=False))
    rotate = jax.jit(pe.rope, static_argnames=("base", "layout", "offset"))
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    got = rotate(jnp.asarray(x), base=500.0, layout="interleaved", offset=7)
    np.testing.assert_allclose(np.asarray(got), pe.rope(x, base=500.0, layout="interleaved", offset=7), rtol=RTOL, atol=ATOL)


# --- precision without float64 ----------------------------------------------------------


def test_rope_angles_stay_exact_at_long_positions_without_float64(rng):
    dim = 64
    x = rng.standard_normal((6, dim)).astype(np.float32)
    pos = np.array([0, 1, 4095, 2**20 + 3, 2**23 + 11, 10_000_000], dtype=np.int32)
    got = np.asarray(jax.jit(pe.rope)(jnp.asarray(x), jnp.asarray(pos)))
    np.testing.assert_allclose(got, exact_rope(x, pos), rtol=0, atol=2e-6 * np.abs(x).max() * 2)
    # The check has teeth: float32 angles are off by up to half a radian at 10M.
    angle = pos.astype(np.float64)[:, None] * inv_freq(dim)
    naive = jnp.cos(jnp.asarray(pos, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq(dim), dtype=jnp.float32))
    assert np.abs(np.asarray(naive) - np.cos(angle)).max() > 1e-2


def test_sinusoidal_and_cos_sin_exact_at_long_positions_without_float64():
    pos = np.array([3, 2**21 + 1, 9_999_991], dtype=np.int32)
    table = np.asarray(jax.jit(lambda p: pe.sinusoidal(p, 16))(jnp.asarray(pos)))
    np.testing.assert_allclose(table, sinusoid(pos, 16), atol=1e-6)
    cos, sin = jax.jit(lambda p: pe.rope_cos_sin(p, inv_freq(16)))(jnp.asarray(pos))
    want_cos, want_sin = rope_tables(pos, inv_freq(16), "half")
    np.testing.assert_allclose(np.asarray(cos), want_cos, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin), want_sin, atol=1e-6)


def test_sinusoidal_with_x64_divides_as_numpy():
    """With x64 the angles are the float64 quotients ``k / base**(2i/d)``, NumPy's bits:
    XLA turns a division by a broadcast divisor into a product by its reciprocal (float32
    tables at positions ``10**6 + i`` had 10,231 of 33.5 million entries a step from
    NumPy's; float64 ones 2.3e-10 off), eagerly and under ``jax.jit``."""
    positions = np.arange(10**6, 10**6 + 2048)
    with jax.enable_x64(True):
        for dtype in (np.float32, np.float64):
            want = pe.sinusoidal(positions, 128, dtype=dtype)
            eager = pe.sinusoidal(jnp.asarray(positions), 128, dtype=dtype)
            jitted = jax.jit(lambda p: pe.sinusoidal(p, 128, dtype=dtype))(jnp.asarray(positions))
            np.testing.assert_array_equal(np.asarray(eager), want)
            np.testing.assert_array_equal(np.asarray(jitted), want)


def test_xpos_scale_within_float32_rounding_at_long_positions_without_float64():
    """``zeta ** (m / gamma)`` takes its exponent ``m ln(zeta) / gamma`` as a double-float:
    within two float32 ulps of the float64 power (a float32 product was 38 ulps off at
    ``m = -20000``, its error growing with ``|m|``)."""
    pos = np.array([-20000, -3001, 0, 7, 4097, 16384, 33333], dtype=np.int32)
    zeta = (np.arange(0, 16, 2) / 16 + 0.4) / 1.4
    want = zeta ** (pos[:, None] / 512)
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    for positions in (jnp.asarray(pos), jnp.asarray(pos, dtype=jnp.float32)):
        got = np.asarray(jax.jit(lambda p: pe.xpos_scale(p, 16))(positions))
        assert got.dtype == np.float32
        assert (np.abs(got[:, :8] - want) <= 2 * ulp).all()


def test_traced_frequency_arrays_keep_long_positions_exact_without_float64():
    """Frequencies that are arrays of the computation (passed into ``jax.jit``, or learned)
    are turned into a double-float of turns and reduced exactly, as host frequencies are:
    ``rope_cos_sin`` and ``complex_order`` at position 10**6 within float32 rounding of the
    float64 formula (a float32 product was off by 1e-2), and their gradients follow."""
    pos = np.array([3, 123_457, 1_000_000], dtype=np.int32)
    freqs = np.asarray(inv_freq(16), dtype=np.float32)
    angle = pos.astype(np.float64)[:, None] * freqs.astype(np.float64)
    cos, sin = jax.jit(lambda p, f: pe.rope_cos_sin(p, f))(jnp.asarray(pos), jnp.asarray(freqs))
    np.testing.assert_allclose(np.asarray(cos)[:, :8], np.cos(angle), atol=3e-7)
    np.testing.assert_allclose(np.asarray(sin)[:, :8], np.sin(angle), atol=3e-7)
    w, phase = jnp.asarray([0.3, 1.1, 2.9], jnp.float32), jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    z = jax.jit(pe.complex_order)(jnp.ones(3), w, phase, jnp.asarray(pos))
    want = np.exp(1j * (np.asarray(w, np.float64) * pos[:, None] + np.asarray(phase, np.float64)))
    np.testing.assert_allclose(np.asarray(z), want, atol=3e-7)
    grad = jax.grad(lambda w: jnp.sum(jnp.real(pe.complex_order(jnp.ones(3), w, phase, jnp.asarray(pos)))))(w)
    want_grad = (-np.sin(np.asarray(w, np.float64) * pos[:, None] + np.asarray(phase, np.float64)) * pos[:, None]).sum(0)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-6, atol=1e-6 * np.abs(want_grad).max())


@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (3.5, 4.0)])
def test_traced_frequency_arrays_at_the_last_int32_position_without_float64(low, high):
    """The double-float turns of a traced float32 frequency array carry about 48 bits: at
    position ``p`` the angle is within ``p f 2**-48`` (against mpmath), 7.6e-6 for ``f <= 1``
    at ``2**31 - 1`` and 3e-5 for ``f <= 4`` (the docs had said 3e-6 and 2.5e-5; measured 6.6e-6
    and 2.8e-5)."""
    mpmath = pytest.importorskip("mpmath")
    if jax.config.jax_enable_x64:
        pytest.skip("jax runs with x64 here")
    freqs = np.random.default_rng(5).uniform(low, high, 64).astype(np.float32)
    pos = np.array([2**31 - 1, 2**31 - 12345], dtype=np.int32)
    cos, sin = (np.asarray(t)[:, :64] for t in jax.jit(lambda p, f: pe.rope_cos_sin(p, f))(jnp.asarray(pos), jnp.asarray(freqs)))
    with mpmath.workdps(40):
        angles = [[mpmath.mpf(int(p)) * mpmath.mpf(float(f)) for f in freqs] for p in pos]
        want_cos = np.array([[float(mpmath.cos(a)) for a in row] for row in angles])
        want_sin = np.array([[float(mpmath.sin(a)) for a in row] for row in angles])
    bound = float(2**31 - 1) * high * 2.0**-48
    assert max(np.abs(cos - want_cos).max(), np.abs(sin - want_sin).max()) <= bound


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_traced_length_through_the_last_int32_position(rng, backend):
    """Under ``jit`` the length a scaling adapts to, ``max + 1`` of int32 positions (or a
    traced offset + seq), is 2**31 where they reach 2**31 - 1: the eager call's bits (it had
    wrapped to -2**31, the original frequencies: 1.6 to 3.8 off)."""
    x = rng.standard_normal((2, 1, 3, 8)).astype(np.float32)
    top = 2**31 - 1
    scalings = (pe.scaling.DynamicNTK(2.0, 8), pe.scaling.LongRoPE([1.0] * 4, [2.0, 3.0, 4.0, 5.0], 8))
    with pe.use_backend(backend):
        for scaling in scalings:
            for last in (top, top - 1):
                pos = np.arange(last - 2, last + 1, dtype=np.int32)
                want = pe.rope(x, pos.astype(np.int64), scaling=scaling)
                got = jax.jit(lambda x, p: pe.rope(x, p, scaling=scaling))(jnp.asarray(x), jnp.asarray(pos))
                np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL, err_msg=f"{scaling} {last}")
                offsets = (np.int32(last - 2), np.array([last - 2, 5], np.int32).reshape(2, 1, 1))
                for offset in offsets:
                    want = pe.rope(x, offset=offset.astype(np.int64), scaling=scaling)
                    got = jax.jit(lambda x, o: pe.rope(x, offset=o, scaling=scaling))(jnp.asarray(x), jnp.asarray(offset))
                    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL, err_msg=f"{scaling} offset {offset}")


# --- gradients against naive transcriptions -----------------------------------------------


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
    linear = inv_freq(6) / 2.0  # Linear(2.0) on the first 6 of 8 channels
    _assert_same_gradients(
        lambda x: pe.rope(x, rotary_dim=6, offset=3, scaling=pe.scaling.Linear(2.0)),
        lambda x: rope_half_any(x, pos[:, None] * linear, 6),
        [_x(rng, 2, 5, 8)],
        rng,
        "rope",
    )
    # Per-token positions and the inverse rotation (the backward pass itself).
    pos = np.array([[0, 7, 900], [2**20, 5, 1]])
    _assert_same_gradients(
        lambda x: pe.rope(x, jnp.asarray(pos), inverse=True),
        lambda x: rope_half_any(x, -pos[..., None] * inv_freq(8), 8),
        [_x(rng, 2, 3, 8)],
        rng,
        "rope inverse",
    )


def test_rematerialised_gradients_at_a_constant_length(rng):
    """Under ``jax.checkpoint`` a constant 0-d ``seq_len`` reaches the primitive as a literal
    (a Python int), eagerly and in the JVP's tangent rule: both read ``.shape`` / ``.ndim``
    of it (AttributeError 'TypedInt')."""
    scaling = pe.scaling.DynamicNTK(2.0, 8)
    x = jnp.asarray(_x(rng, 1, 5, 16))
    positions = jnp.asarray([0.5, 3.0, 7.25, 100.0, 2000.5], jnp.float32)

    def rotated(p):
        return pe.rope(x, p, scaling=scaling, seq_len=jnp.asarray(3000))

    def loss(p):
        return jnp.sum(rotated(p) ** 3)

    want = jax.grad(loss)(positions)
    for got in (jax.grad(jax.checkpoint(loss))(positions), jax.jit(jax.grad(jax.checkpoint(loss)))(positions)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    tangent = jax.jvp(jax.checkpoint(rotated), (positions,), (jnp.ones(5),))[1]
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(jax.jvp(rotated, (positions,), (jnp.ones(5),))[1]), rtol=1e-5, atol=1e-5)


def test_apply_rope_gradient(rng):
    angle = np.arange(4)[:, None] * inv_freq(6)
    c, s = (jnp.asarray(t, dtype=jnp.float32) for t in rope_tables(np.arange(4), inv_freq(6), "half"))
    _assert_same_gradients(lambda x: pe.apply_rope(x, c, s), lambda x: rope_half_any(x, angle, 6), [_x(rng, 2, 4, 10)], rng, "apply_rope")


def test_rerotate_gradient(rng):
    delta = np.array([-5, 0, 3, 70_000])
    _assert_same_gradients(
        lambda x: pe.rerotate(x, jnp.asarray(delta), inv_freq(8)),
        lambda x: rope_half_any(x, delta[:, None] * inv_freq(8), 8),
        [_x(rng, 4, 8)],
        rng,
        "rerotate",
    )


def test_axial_rope_gradient(rng):
    grid = np.stack([np.arange(6) // 3, np.arange(6) % 3], axis=-1)

    def naive(x):
        rows = rope_half_any(x[..., :4], grid[:, :1] * inv_freq(4), 4)
        cols = rope_half_any(x[..., 4:8], grid[:, 1:] * inv_freq(4), 4)
        return jnp.concatenate([rows, cols, x[..., 8:]], -1)

    _assert_same_gradients(lambda x: pe.axial_rope(x, jnp.asarray(grid)), naive, [_x(rng, 2, 6, 9)], rng, "axial_rope")


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_gradient(causal, rng):
    n, d = 5, 6
    pos = np.arange(n) * 3

    def naive(q, k, v):
        # The quadratic form of RoFormer eq. 29: an n x n matrix of rotated and plain scores.
        fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
        angle = pos[:, None] * inv_freq(d)
        rq, rk = rope_half_any(fq, angle, d), rope_half_any(fk, angle, d)
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


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_gradient_wrt_table(bidirectional, rng):
    q_len, k_len, offset = 6, 9, 150
    bucket = hf_t5_bucket(-rel_matrix(q_len, k_len, offset), bidirectional=bidirectional)
    _assert_same_gradients(
        lambda t: pe.t5_bias(t, q_len, k_len, offset=offset, bidirectional=bidirectional),
        lambda t: jnp.transpose(t[bucket], (2, 0, 1)),
        [_x(rng, 32, 3)],
        rng,
        "t5_bias",
    )


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_bias_gradient_wrt_slopes(symmetric, rng):
    rel = rel_matrix(4, 7, offset=2)
    rel = np.abs(rel) if symmetric else rel
    _assert_same_gradients(
        lambda s: pe.alibi_bias(s, 4, 7, offset=2, symmetric=symmetric),
        lambda s: -s[:, None, None] * rel.astype(np.float32),
        [_x(rng, 4)],
        rng,
        "alibi_bias",
    )


def test_shaw_gradients(rng):
    h, q_len, k_len, d, big_k, offset = 2, 4, 6, 5, 2, 1
    idx = np.clip(rel_matrix(q_len, k_len, offset), -big_k, big_k) + big_k

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
    delta = np.clip(rel_matrix(q_len, k_len, 0) + big_k, 0, 2 * big_k - 1)

    def naive(q, k, pq, pk):
        c2p = jnp.einsum("hid,hijd->hij", q, pk[:, delta])
        p2c = jnp.einsum("hjd,hijd->hij", k, pq[:, delta])
        return (jnp.einsum("hid,hjd->hij", q, k) + c2p + p2c) / math.sqrt(3 * d)

    _assert_same_gradients(
        lambda q, k, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=big_k, offset=0),
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, h, 2 * big_k, d), _x(rng, h, 2 * big_k, d)],
        rng,
        "deberta_logits",
    )


def test_xl_logits_gradient(rng):
    h, q_len, k_len, d = 2, 3, 5, 4
    row = k_len - 1 - rel_matrix(q_len, k_len, k_len - q_len)  # bidirectional r: k_len + q_len rows

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
    rel = rel_matrix(q_len, k_len, 0).astype(np.float64)
    angle = rel[..., None] * inv_freq(d)
    table = np.stack([np.sin(angle), np.cos(angle)], -1).reshape(q_len, k_len, d).astype(np.float32)

    def naive(q, k, u, v):
        return jnp.einsum("hid,hjd->hij", q + u, k) + jnp.einsum("hid,ijd->hij", q + v, table)

    _assert_same_gradients(
        lambda q, k, u, v: pe.tener_logits(q, k, u, v, offset=0),
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
        lambda *a: pe.tupe_logits(*a[:5], bias=a[5], offset=0),
        naive,
        [_x(rng, h, q_len, d), _x(rng, h, k_len, d), _x(rng, 5, dp), _x(rng, h, dp, d), _x(rng, h, dp, d), _x(rng, h, q_len, k_len)],
        rng,
        "tupe_logits",
    )


@pytest.mark.parametrize("lengths", [(0, 5), (3, 0), (0, 0)])
def test_an_empty_bias_gives_its_parameters_a_zero_gradient(lengths):
    q_len, k_len = lengths
    for name, bias, param in (
        ("t5_bias", lambda t: pe.t5_bias(t, q_len, k_len), jnp.ones((32, 2))),
        ("alibi_bias", lambda t: pe.alibi_bias(t, q_len, k_len), jnp.ones(2)),
        ("kerple_bias", lambda t: pe.kerple_bias(t, t, q_len, k_len), jnp.ones(2)),
    ):
        grad = jax.grad(lambda t: jnp.sum(bias(t)))(param)
        np.testing.assert_array_equal(np.asarray(grad), np.zeros(param.shape), err_msg=name)


@pytest.mark.parametrize("bucket_size, max_position", [(64, 1024), (128, 512), (256, 256), (32, 513), (256, 512)])
def test_deberta_bucket_under_jit_is_the_eager_bucket(bucket_size, max_position):
    """The log of the table's top ratio and the distances' logs are one runtime log: under
    jax.jit a log of a constant alone was folded at compile time by another log, and
    |rel| = max_position - 1 landed one bucket past the original's (64, 1024: 64, not 63)."""
    rel = jnp.arange(-4 * max_position, 4 * max_position + 1)
    eager = pe.deberta_bucket(rel, bucket_size=bucket_size, max_position=max_position)
    jitted = jax.jit(lambda r: pe.deberta_bucket(r, bucket_size=bucket_size, max_position=max_position))(rel)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(eager))
    edge = jnp.asarray([max_position - 1, -(max_position - 1)])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda r: pe.deberta_bucket(r, bucket_size=bucket_size, max_position=max_position))(edge)),
                                  [bucket_size - 1, -(bucket_size - 1)])  # fmt: skip


def test_apply_absolute_at_a_traced_offset_gives_nan_rows_outside_the_table():
    """A traced offset is not range-checked: rows before the table (a negative offset) are
    NaN as rows past its end are, not rows read from its end (they were 8 and 9 of 10)."""
    x, table = jnp.zeros((4, 2)), jnp.arange(20.0).reshape(10, 2)
    at = jax.jit(lambda o: pe.apply_absolute(x, table, offset=o))
    before, after = np.asarray(at(jnp.int32(-2))), np.asarray(at(jnp.int32(8)))
    assert np.isnan(before[:2]).all() and np.isnan(after[2:]).all()
    np.testing.assert_array_equal(before[2:], np.asarray(table[:2]))
    np.testing.assert_array_equal(after[:2], np.asarray(table[8:]))
    np.testing.assert_array_equal(np.asarray(at(jnp.int32(3))), np.asarray(pe.apply_absolute(x, table, offset=3)))


_CLOSED_FLOATS = jnp.asarray([0.5, 3.0, 7.25, 12.0], jnp.float32)
_CLOSED_INTS = jnp.arange(4)
_CLOSED_FREQS = jnp.asarray(inv_freq(8), jnp.float32)
_CLOSED_NEW_FREQS = _CLOSED_FREQS * 0.5
_CLOSED_LENGTH, _CLOSED_CU = jnp.asarray(4), jnp.asarray([0, 1, 4])
_CLOSED_SEQ_LEN, _CLOSED_ROW_SEQ_LENS, _DYNAMIC = jnp.asarray(9), jnp.asarray([9, 12]), pe.scaling.DynamicNTK(2.0, 4)


@pytest.mark.parametrize(
    "name, call",
    [
        ("rope_cos_sin", lambda x: pe.rope_cos_sin(_CLOSED_FLOATS, inv_freq(8))[0] + x),
        ("rerotate", lambda x: pe.rerotate(jnp.broadcast_to(x, (2, 4, 8)), _CLOSED_FLOATS, inv_freq(8))),
        ("rerotate[JAX frequencies]", lambda x: pe.rerotate(jnp.broadcast_to(x, (2, 4, 8)), _CLOSED_INTS, _CLOSED_FREQS, new_inv_freq=_CLOSED_NEW_FREQS)),
        ("rerotate[scaling, 0-d seq_len]", lambda x: pe.rerotate(jnp.broadcast_to(x, (2, 4, 8)), _CLOSED_INTS, scaling=_DYNAMIC, seq_len=_CLOSED_SEQ_LEN)),
        ("rerotate[scaling, per-row seq_len]", lambda x: pe.rerotate(jnp.broadcast_to(x, (2, 4, 8)), _CLOSED_INTS, scaling=_DYNAMIC, seq_len=_CLOSED_ROW_SEQ_LENS)),
        ("sinusoidal", lambda x: pe.sinusoidal(_CLOSED_FLOATS, 8) + x),
        ("t5_bias[0-d lengths]", lambda x: pe.t5_bias(jnp.broadcast_to(x[0, :2], (32, 2)), _CLOSED_LENGTH, _CLOSED_LENGTH)),
        ("positions_from_cu_seqlens", lambda x: x + pe.positions_from_cu_seqlens(_CLOSED_CU, 4)[:, None]),
        ("complex_order", lambda x: pe.complex_order(x[0], x[0], x[0], _CLOSED_FLOATS).real),
        ("alibi_bias", lambda x: pe.alibi_bias(x[0, :2], 4, 4, query_positions=_CLOSED_FLOATS, key_positions=_CLOSED_FLOATS)),
        ("t5_bias", lambda x: pe.t5_bias(jnp.broadcast_to(x[0, :2], (32, 2)), 4, 4, query_positions=_CLOSED_INTS, key_positions=_CLOSED_INTS)),
        ("kerple_bias", lambda x: pe.kerple_bias(x[0, :2], x[0, :2], 4, 4, query_positions=_CLOSED_INTS, key_positions=_CLOSED_INTS)),
    ],
)  # fmt: skip
def test_concrete_positions_closed_over_under_jit_give_the_eager_result(name, call):
    """Positions closed over by a jitted function are concrete arrays whose operations JAX
    stages: the checks that read them eagerly (finite floats, per-token distances) raised
    ``TracerBoolConversionError`` / ``ConcretizationTypeError``; they are read as traced now.
    ``rerotate``'s frequencies, host constants of its kernel, are read on the host: closed-over
    JAX ones were refused as traced (``TypeError`` "inv_freq must hold concrete values ...,
    got a traced ArrayImpl"), as were 0-d lengths ("q_len must be a concrete integer here
    ..., got a traced ArrayImpl"), and ``cu_seqlens`` took the ``checkify`` check of traced
    values, which a plain ``jax.jit`` refuses to compile; both are read now, as eagerly, as is
    ``rerotate``'s ``seq_len`` with ``scaling=`` ("seq_len must be readable now ..., got a
    traced value")."""
    x = jnp.full((4, 8), 0.5, jnp.float32)
    # (complex_order's traced frequencies round as XLA fuses them: within an ulp)
    np.testing.assert_allclose(np.asarray(jax.jit(call)(x)), np.asarray(call(x)), rtol=2e-7 if name == "complex_order" else 0, atol=0)
