"""RoPE: cos/sin tables, apply_rope and rope against float64 transcriptions of the papers.

Transcriptions: LLaMA / GPT-NeoX ``x * cos + rotate_half(x) * sin`` for ``layout="half"``,
RoFormer / GPT-J ``x * cos + rotate_every_two(x) * sin`` for ``layout="interleaved"``.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close

DTYPES = ["float16", "bfloat16", "float32", "float64"]
LAYOUTS = ["half", "interleaved"]


def theta(dim, base=10000.0):
    return np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)])


def tables(pos, inv_freq, layout):
    angle = np.asarray(pos, dtype=np.float64)[..., None] * inv_freq
    if layout == "half":
        return np.concatenate([np.cos(angle)] * 2, -1), np.concatenate([np.sin(angle)] * 2, -1)
    return np.repeat(np.cos(angle), 2, axis=-1), np.repeat(np.sin(angle), 2, axis=-1)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_every_two(x):
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def rope_formula(x, cos, sin, layout):
    """float64 RoPE of the first ``cos.shape[-1]`` channels; the rest pass through."""
    x = np.asarray(x, dtype=np.float64)
    r = cos.shape[-1]
    rot = x[..., :r]
    turned = rotate_half(rot) if layout == "half" else rotate_every_two(rot)
    return np.concatenate([rot * cos + turned * sin, x[..., r:]], axis=-1)


# --- rope_cos_sin -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_cos_sin_matches_formula(backend, layout):
    pos = np.array([[0, 1, 7], [100, 4096, 123456]])
    inv_freq, _ = pe.rope_frequencies(12, base=500.0)
    cos, sin = pe.rope_cos_sin(backend.asarray(pos), inv_freq, layout=layout)
    want_cos, want_sin = tables(pos, theta(12, 500.0), layout)
    assert_close(cos, want_cos, backend=backend, dtype="float32")
    assert_close(sin, want_sin, backend=backend, dtype="float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_cos_sin_keeps_float_position_dtype_and_scales(backend, dtype):
    pos = backend.asarray(np.array([0.0, 2.5, 300.0]), dtype=dtype)
    cos, sin = pe.rope_cos_sin(pos, [1.0, 0.01], scale=1.25)
    want_cos, want_sin = tables(backend.to_numpy(pos).astype(np.float64), np.array([1.0, 0.01]), "half")
    assert_close(cos, 1.25 * want_cos, backend=backend, dtype=dtype)
    assert_close(sin, 1.25 * want_sin, backend=backend, dtype=dtype)


def test_rope_cos_sin_takes_frequencies_of_the_positions_namespace():
    torch = pytest.importorskip("torch")
    inv_freq, _ = pe.rope_frequencies(8, xp=pe._xp.namespace(torch.zeros(1)))
    assert inv_freq.dtype == torch.float64
    cos, _ = pe.rope_cos_sin(torch.arange(5), inv_freq)
    np.testing.assert_allclose(cos.numpy(), tables(np.arange(5), theta(8), "half")[0], atol=1e-7)


# --- apply_rope ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rope_matches_llama_and_gptj_formulas(backend, rng, layout, dtype):
    x = backend.asarray(rng.standard_normal((2, 3, 5, 8)), dtype=dtype)
    cos, sin = pe.rope_cos_sin(backend.asarray(np.arange(5)), pe.rope_frequencies(8)[0], layout=layout, dtype=backend.dtype(dtype))
    out = pe.apply_rope(x, cos, sin, layout=layout)
    c64, s64 = (backend.to_numpy(t).astype(np.float64) for t in (cos, sin))
    want = rope_formula(backend.to_numpy(x), c64, s64, layout)
    assert_close(out, want, backend=backend, dtype=dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_partial_rotary_passes_the_rest_through(backend, rng, layout):
    x_np = rng.standard_normal((4, 10))
    x = backend.asarray(x_np, dtype="float32")
    cos, sin = pe.rope_cos_sin(backend.asarray(np.arange(4)), theta(4), layout=layout)
    out = pe.apply_rope(x, cos, sin, layout=layout)
    want = rope_formula(backend.to_numpy(x), *tables(np.arange(4), theta(4), layout), layout)
    assert_close(out, want, backend=backend, dtype="float32")
    assert np.array_equal(backend.to_numpy(out)[:, 4:], backend.to_numpy(x)[:, 4:])


def test_apply_rope_in_place(backend, rng):
    if backend.name == "jax":
        with pytest.raises(TypeError, match="out"):
            x = backend.asarray(np.ones((3, 4)), dtype="float32")
            pe.apply_rope(x, *pe.rope_cos_sin(backend.asarray(np.arange(3)), theta(4)), out=x)
        return
    x_np = rng.standard_normal((3, 4)).astype(np.float32)
    x = backend.asarray(x_np.copy())
    cos, sin = pe.rope_cos_sin(backend.asarray(np.arange(3)), theta(4))
    result = pe.apply_rope(x, cos, sin, out=x)
    assert result is x
    assert_close(x, rope_formula(x_np, *tables(np.arange(3), theta(4), "half"), "half"), backend=backend, dtype="float32")


# --- rope -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_default_positions_with_offset(backend, rng, layout, dtype):
    x = backend.asarray(rng.standard_normal((2, 3, 6, 16)), dtype=dtype)
    out = pe.rope(x, layout=layout, offset=7, base=1000.0)
    pos = (7 + np.arange(6))[None, None, :]
    want = rope_formula(backend.to_numpy(x), *tables(pos, theta(16, 1000.0), layout), layout)
    assert_close(out, want, backend=backend, dtype=dtype)


def test_rope_seq_axis_and_rotary_dim(backend, rng):
    # [batch, seq, heads, d] as flash-attention lays it out, 8 of 12 channels rotated.
    x = backend.asarray(rng.standard_normal((2, 5, 3, 12)), dtype="float32")
    out = pe.rope(x, seq_axis=1, rotary_dim=8)
    pos = np.arange(5)[None, :, None]
    want = rope_formula(backend.to_numpy(x), *tables(pos, theta(8), "half"), "half")
    assert_close(out, want, backend=backend, dtype="float32")


def test_rope_per_token_positions_kv_cache_and_packed(backend, rng):
    x_np = rng.standard_normal((2, 4, 1, 8))  # [batch, heads, 1 new token, d]
    cache_lengths = np.array([10, 3])  # per-batch KV-cache length = position of the new token
    pos = cache_lengths[:, None, None]
    out = pe.rope(backend.asarray(x_np, dtype="float32"), backend.asarray(pos))
    want = rope_formula(x_np.astype(np.float32), *tables(pos, theta(8), "half"), "half")
    assert_close(out, want, backend=backend, dtype="float32")
    packed = pe.positions_from_cu_seqlens(backend.asarray(np.array([0, 3, 7])), 7)
    y = pe.rope(backend.asarray(rng.standard_normal((7, 8)), dtype="float32"), packed)
    assert tuple(y.shape) == (7, 8)


def test_rope_inverse_undoes_it_with_a_scaling(backend, rng):
    x_np = rng.standard_normal((3, 9, 16))
    x = backend.asarray(x_np, dtype="float64" if backend.name != "jax" else "float32")
    yarn = pe.scaling.YaRN(4.0, 64)
    y = pe.rope(x, scaling=yarn, offset=100)
    back = pe.rope(y, scaling=yarn, offset=100, inverse=True)
    assert_close(back, backend.to_numpy(x).astype(np.float64), backend=backend, atol=1e-5, rtol=1e-5)
    # the rotated channels carry YaRN's attention scale
    norms = np.linalg.norm(backend.to_numpy(y), axis=-1) / np.linalg.norm(backend.to_numpy(x), axis=-1)
    np.testing.assert_allclose(norms, yarn.attention_scale(), rtol=1e-5)


def test_rope_scores_depend_on_relative_position_only(rng):
    q, k = rng.standard_normal((2, 32))

    def score(m, n):
        return float(pe.rope(q, np.array(m)) @ pe.rope(k, np.array(n)))

    assert score(5, 2) == pytest.approx(score(1005, 1002), rel=1e-10)
    assert score(2, 5) == pytest.approx(score(40, 43), rel=1e-10)
    assert score(0, 0) == pytest.approx(float(q @ k), rel=1e-12)


def test_rope_longrope_switches_on_the_largest_position(rng):
    short, long = [1.0] * 4, [4.0] * 4
    lr = pe.scaling.LongRoPE(short, long, 16)
    x = rng.standard_normal((20, 8))
    pos = np.arange(20)
    np.testing.assert_allclose(pe.rope(x, pos, scaling=lr), pe.rope(x, pos, scaling=pe.scaling.Linear(4.0)), atol=1e-12)
    np.testing.assert_allclose(pe.rope(x[:16], pos[:16], scaling=lr), pe.rope(x[:16], pos[:16]), atol=1e-12)
    np.testing.assert_allclose(pe.rope(x[:16], pos[:16], scaling=lr, seq_len=17), pe.rope(x[:16], pos[:16], scaling=pe.scaling.Linear(4.0)), atol=1e-12)


def test_rope_is_lazy_on_dask_and_traceable_under_jit(rng):
    da = pytest.importorskip("dask.array")
    x_np = rng.standard_normal((4, 6, 8)).astype(np.float32)
    lazy = pe.rope(da.from_array(x_np, chunks=(2, 3, 8)), scaling=pe.scaling.DynamicNTK(2.0, 4))
    assert isinstance(lazy, da.Array)
    # The length (6 > 4: the base grows) is decided inside the lazy graph, as eagerly.
    want = pe.rope(x_np, scaling=pe.scaling.DynamicNTK(2.0, 4))
    assert not np.allclose(want, pe.rope(x_np, scaling=pe.scaling.DynamicNTK(2.0, 4), seq_len=4), atol=1e-3)
    np.testing.assert_allclose(lazy.compute(), want, atol=1e-6)
    jax = pytest.importorskip("jax")
    jitted = jax.jit(lambda a, p: pe.rope(a, p))
    got = jitted(jax.numpy.asarray(x_np), jax.numpy.arange(6))
    np.testing.assert_allclose(np.asarray(got), pe.rope(x_np), atol=2e-6)


# --- precision --------------------------------------------------------------------------


def _exact_rotation(x, pos, inv_freq):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    out = np.empty(x.shape, dtype=np.float64)
    half = x.shape[-1] // 2
    for row, p in enumerate(pos):
        for i, f in enumerate(inv_freq):
            angle = mpmath.mpf(int(p)) * mpmath.mpf(float(f))
            c, s = mpmath.cos(angle), mpmath.sin(angle)
            a, b = mpmath.mpf(float(x[row, i])), mpmath.mpf(float(x[row, i + half]))
            out[row, i] = float(a * c - b * s)
            out[row, i + half] = float(b * c + a * s)
    return out


LONG_POSITIONS = np.array([1_000_000, 1_234_567, 4_000_000, 9_999_991, 2**24 - 2, 2**24 - 1])


def test_float32_rotation_at_long_positions_is_exact_to_4e6(rng):
    x = rng.uniform(-1, 1, (LONG_POSITIONS.size, 64)).astype(np.float32)
    inv_freq, _ = pe.rope_frequencies(64)
    got = pe.rope(x, LONG_POSITIONS[:, None].squeeze(-1))
    assert got.dtype == np.float32
    assert np.abs(got - _exact_rotation(x, LONG_POSITIONS, inv_freq)).max() <= 4e-6


@pytest.mark.parametrize("make", ["array_api_strict_no_float64", "jax_without_x64"])
def test_no_float64_path_at_long_positions(rng, make):
    x = rng.uniform(-1, 1, (LONG_POSITIONS.size, 64)).astype(np.float32)
    inv_freq, _ = pe.rope_frequencies(64)
    if make == "array_api_strict_no_float64":
        strict = pytest.importorskip("array_api_strict")
        dev = strict.Device("no_float64")
        xs, ps = strict.asarray(x, device=dev), strict.asarray(LONG_POSITIONS, device=dev)
        got = pe.rope(xs, ps)
        assert got.dtype == strict.float32
        got = np.asarray(got._array)
    else:
        jax = pytest.importorskip("jax")
        if jax.config.jax_enable_x64:
            pytest.skip("jax runs with x64 here")
        got = np.asarray(pe.rope(jax.numpy.asarray(x), jax.numpy.asarray(LONG_POSITIONS.astype(np.int32))))
    assert np.abs(got - _exact_rotation(x, LONG_POSITIONS, inv_freq)).max() <= 4e-6


def _ulp(values, dtype):
    mantissa = {"float16": 10, "bfloat16": 7}[dtype]
    tiny = {"float16": 2.0**-14, "bfloat16": 2.0**-126}[dtype]
    mag = np.maximum(np.abs(values), tiny)
    return 2.0 ** (np.floor(np.log2(mag)) - mantissa)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_keeps_dtype_within_one_ulp(backend, rng, dtype):
    x = backend.asarray(rng.uniform(-4, 4, (6, 32)), dtype=dtype)
    pos = backend.asarray(LONG_POSITIONS)
    got = pe.rope(x, pos)
    assert got.dtype == x.dtype
    exact = _exact_rotation(backend.to_numpy(x).astype(np.float64), LONG_POSITIONS, pe.rope_frequencies(32)[0])
    err = np.abs(backend.to_numpy(got).astype(np.float64) - exact)
    assert np.all(err <= _ulp(exact, dtype))


# --- bad input ----------------------------------------------------------------------------


X = np.zeros((2, 3, 8), dtype=np.float32)
COS, SIN = pe.rope_cos_sin(np.arange(3), theta(8))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: pe.rope_frequencies(7), ValueError, "dim"),
        (lambda: pe.rope_frequencies(0), ValueError, "dim"),
        (lambda: pe.rope_frequencies(8.0), TypeError, "dim"),
        (lambda: pe.rope_frequencies(8, base=-1.0), ValueError, "base"),
        (lambda: pe.rope_frequencies(8, scaling="yarn"), TypeError, "scaling"),
        (lambda: pe.rope_frequencies(8, seq_len=-1), ValueError, "seq_len"),
        (lambda: pe.rope_frequencies(8, seq_len=2.5), TypeError, "seq_len"),
        (lambda: pe.rope_frequencies(2, scaling=pe.scaling.NTK(2.0)), ValueError, "dim"),
        (lambda: pe.rope_frequencies(8, scaling=pe.scaling.LongRoPE([1.0] * 3, [1.0] * 3, 16)), ValueError, "short_factor"),
        (lambda: pe.rope_frequencies(8, xp=np, dtype=np.int32), TypeError, "dtype"),
        (lambda: pe.rope_cos_sin([0, 1], theta(8)), TypeError, "positions"),
        (lambda: pe.rope_cos_sin(np.array([0.0, np.inf]), theta(8)), ValueError, "positions"),
        (lambda: pe.rope_cos_sin(np.arange(3), theta(8), layout="zigzag"), ValueError, "layout"),
        (lambda: pe.rope_cos_sin(np.arange(3), np.array([1.0, np.nan])), ValueError, "inv_freq"),
        (lambda: pe.rope_cos_sin(np.arange(3), np.ones((2, 2))), ValueError, "inv_freq"),
        (lambda: pe.rope_cos_sin(np.arange(3), theta(8), dtype=np.int64), TypeError, "dtype"),
        (lambda: pe.apply_rope(X.astype(np.int32), COS, SIN), TypeError, "x"),
        (lambda: pe.apply_rope(X, COS[:, :6], SIN), ValueError, "cos"),
        (lambda: pe.apply_rope(X, COS[:, :5], SIN[:, :5]), ValueError, "rotary"),
        (lambda: pe.apply_rope(X[..., :4], COS, SIN), ValueError, "rotary"),
        (lambda: pe.apply_rope(X, COS[:2], SIN[:2]), ValueError, "cos"),
        (lambda: pe.apply_rope(X, COS, SIN, layout="gptj"), ValueError, "layout"),
        (lambda: pe.apply_rope(X, COS, SIN, out=np.zeros((2, 3, 8))), ValueError, "out"),
        (lambda: pe.apply_rope(X, COS, SIN, out=np.zeros((2, 3, 4), dtype=np.float32)), ValueError, "out"),
        (lambda: pe.apply_rope(X, COS.astype(np.int64), SIN), TypeError, "cos"),
        (lambda: pe.rope(X.astype(np.int64)), TypeError, "x"),
        (lambda: pe.rope(X, rotary_dim=5), ValueError, "rotary_dim"),
        (lambda: pe.rope(X, rotary_dim=10), ValueError, "rotary_dim"),
        (lambda: pe.rope(X, np.arange(4)), ValueError, "positions"),
        (lambda: pe.rope(X, np.array([0.0, np.nan, 1.0])), ValueError, "positions"),
        (lambda: pe.rope(X, np.array(["a", "b", "c"])), TypeError, "positions"),
        (lambda: pe.rope(X, seq_axis=-1), ValueError, "seq_axis"),
        (lambda: pe.rope(X, seq_axis=3), ValueError, "seq_axis"),
        (lambda: pe.rope(X, offset=1.5), TypeError, "offset"),
        (lambda: pe.rope(X, inverse=1), TypeError, "inverse"),
        (lambda: pe.rope(X, base=0.0), ValueError, "base"),
        (lambda: pe.rope(X, scaling={"factor": 2}), TypeError, "scaling"),
        (lambda: pe.rope(X, out=np.zeros((2, 3, 8))), ValueError, "out"),
        (lambda: pe.rope(X, out=[0.0]), TypeError, "out"),
        (lambda: pe.rope(np.zeros((2, 6), dtype=np.float32), scaling=pe.scaling.LongRoPE([1.0] * 2, [1.0] * 2, 4)), ValueError, "short_factor"),
    ],
)
def test_rotary_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_rope_rejects_mixed_namespaces_and_foreign_out():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="different kinds"):
        pe.rope(torch.zeros(2, 3, 8), np.arange(3))
    with pytest.raises(TypeError, match="out"):
        pe.rope(torch.zeros(2, 3, 8), out=np.zeros((2, 3, 8), dtype=np.float32))


def test_frequencies_of_another_namespace_are_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="inv_freq"):
        pe.rope_cos_sin(np.arange(3), torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="new_inv_freq"):
        pe.rerotate(np.zeros((3, 4)), 1, np.ones(2), new_inv_freq=torch.ones(2))


S = pe.scaling


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: S.Linear(0.0), ValueError, "factor"),
        (lambda: S.Linear(-2.0), ValueError, "factor"),
        (lambda: S.Linear("2"), TypeError, "factor"),
        (lambda: S.NTK(0.0), ValueError, "alpha"),
        (lambda: S.NTK(float("inf")), ValueError, "alpha"),
        (lambda: S.DynamicNTK(-1.0, 2048), ValueError, "factor"),
        (lambda: S.DynamicNTK(2.0, 0), ValueError, "original_max_position"),
        (lambda: S.DynamicNTK(2.0, 2048.5), TypeError, "original_max_position"),
        (lambda: S.YaRN(0.0, 4096), ValueError, "factor"),
        (lambda: S.YaRN(4.0, 4096, beta_fast=0.0), ValueError, "beta_fast"),
        (lambda: S.YaRN(4.0, 4096, beta_slow=-1.0), ValueError, "beta_slow"),
        (lambda: S.YaRN(4.0, 4096, attention_factor=0.0), ValueError, "attention_factor"),
        (lambda: S.YaRN(4.0, 4096, mscale=float("nan")), ValueError, "mscale"),
        (lambda: S.YaRN(4.0, 4096, truncate="yes"), TypeError, "truncate"),
        (lambda: S.LongRoPE([], [], 4096), ValueError, "short_factor"),
        (lambda: S.LongRoPE([1.0, 2.0], [1.0], 4096), ValueError, "long_factor"),
        (lambda: S.LongRoPE([1.0, -2.0], [1.0, 1.0], 4096), ValueError, r"short_factor\[1\]"),
        (lambda: S.LongRoPE([1.0, 2.0], [0.0, 1.0], 4096), ValueError, r"long_factor\[0\]"),
        (lambda: S.LongRoPE("12", [1.0, 1.0], 4096), TypeError, "short_factor"),
        (lambda: S.LongRoPE([1.0], [1.0], 4096, factor=0.0), ValueError, "factor"),
        (lambda: S.Llama3(0.0, 8192), ValueError, "factor"),
        (lambda: S.Llama3(8.0, 8192, low_freq_factor=4.0, high_freq_factor=1.0), ValueError, "high_freq_factor"),
        (lambda: S.Llama3(8.0, 8192, low_freq_factor=0.0), ValueError, "low_freq_factor"),
        (lambda: S.from_hf({"rope_type": "axial"}, head_dim=64), ValueError, "rope_type"),
        (lambda: S.from_hf({"type": "ntk-by-parts"}, head_dim=64), ValueError, "rope_type"),
        (lambda: S.from_hf("linear", head_dim=64), TypeError, "rope_parameters"),
        (lambda: S.from_hf({"rope_type": "linear"}, head_dim=64), ValueError, "factor"),
        (lambda: S.from_hf({"rope_type": "linear", "factor": -1.0}, head_dim=64), ValueError, "factor"),
        (lambda: S.from_hf({"rope_type": "dynamic", "factor": 2.0}, head_dim=64), ValueError, "max_position_embeddings"),
        (lambda: S.from_hf({"rope_type": "yarn", "factor": 2.0}, head_dim=64), ValueError, "original_max_position"),
        (lambda: S.from_hf({"rope_type": "default", "partial_rotary_factor": 0.3}, head_dim=10), ValueError, "partial_rotary_factor"),
        (lambda: S.from_hf({"rope_type": "default", "partial_rotary_factor": 1.5}, head_dim=64), ValueError, "partial_rotary_factor"),
        (lambda: S.from_hf({"rope_type": "default", "rope_theta": 0.0}, head_dim=64), ValueError, "rope_theta"),
        (lambda: S.from_hf({}, head_dim=0), ValueError, "head_dim"),
        (
            lambda: S.from_hf(
                {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3, "original_max_position_embeddings": 8, "factor": 2.0},
                head_dim=8,
            ),
            ValueError,
            "short_factor",
        ),
    ],
)
def test_scaling_bad_input(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_scalings_are_frozen_and_hashable():
    yarn = S.YaRN(4, 4096)
    assert yarn.factor == 4.0 and isinstance(yarn.factor, float)
    with pytest.raises(AttributeError):
        yarn.factor = 2.0
    assert len({yarn, S.YaRN(4.0, 4096), S.LongRoPE(np.ones(2), [1, 1], 8)}) == 2
