"""The absolute family against float64 transcriptions of each formula."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close

DTYPES = ["float16", "bfloat16", "float32", "float64"]


def sinusoid_formula(pos, dim, base=10000.0, layout="interleaved"):
    pos = np.asarray(pos, dtype=np.float64)
    i = np.arange(dim // 2)
    angle = pos[..., None] / base ** (2 * i / dim)
    if layout == "interleaved":
        out = np.empty(pos.shape + (dim,))
        out[..., 0::2] = np.sin(angle)
        out[..., 1::2] = np.cos(angle)
        return out
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)


# --- sinusoidal ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_sinusoidal_int_length_matches_formula(backend, layout):
    out = pe.sinusoidal(50, 16, layout=layout, xp=backend.xp, dtype=backend.dtype("float64"))
    assert_close(out, sinusoid_formula(np.arange(50), 16, layout=layout), backend=backend, dtype="float64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinusoidal_position_array_keeps_dtype(backend, dtype):
    pos = backend.asarray(np.array([[0.0, 3.0, 7.5], [100.0, 1000.0, 4096.0]]), dtype=dtype)
    out = pe.sinusoidal(pos, 8, base=500.0)
    exact = sinusoid_formula(backend.to_numpy(pos).astype(np.float64), 8, base=500.0)
    assert_close(out, exact, backend=backend, dtype=dtype, shape=(2, 3, 8))


def test_sinusoidal_integer_positions_default_float32(backend):
    pos = backend.asarray(np.array([0, 5, 1_000_000]))
    out = pe.sinusoidal(pos, 6, layout="split")
    assert_close(out, sinusoid_formula([0, 5, 1_000_000], 6, layout="split"), backend=backend, dtype="float32")


def test_sinusoidal_precision_at_long_positions():
    # float64 angles then one rounding: position 16,777,215 is as exact as position 10.
    pos = np.array([10, 1_000_000, 2**24 - 1])
    out = pe.sinusoidal(pos, 128)
    exact = sinusoid_formula(pos, 128)
    assert np.abs(out - exact).max() <= 2**-24 * 1.01


def test_sinusoidal_split_reduction_without_float64():
    strict = pytest.importorskip("array_api_strict")
    pos = np.array([0, 10, 1_000_000, 2**24 - 1, -123456])
    out = pe.sinusoidal(strict.asarray(pos, device=strict.Device("no_float64")), 128)
    assert out.dtype == strict.float32
    assert np.abs(np.asarray(out._array) - sinusoid_formula(pos, 128)).max() < 1e-6


def test_sinusoidal_matches_pytorch_transformer_tutorial_formula():
    # The widely copied PyTorch formula: div_term = exp(arange(0, d, 2) * -(ln(10000)/d)).
    d, n = 32, 64
    position = np.arange(n)[:, None]
    div_term = np.exp(np.arange(0, d, 2) * -(np.log(10000.0) / d))
    pe_ref = np.zeros((n, d))
    pe_ref[:, 0::2] = np.sin(position * div_term)
    pe_ref[:, 1::2] = np.cos(position * div_term)
    np.testing.assert_allclose(pe.sinusoidal(n, d, dtype=np.float64), pe_ref, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"positions": 4, "dim": 5}, ValueError),
        ({"positions": 4, "dim": 0}, ValueError),
        ({"positions": -1, "dim": 4}, ValueError),
        ({"positions": 4, "dim": 4, "layout": "zigzag"}, ValueError),
        ({"positions": 4, "dim": 4, "base": 0.0}, ValueError),
        ({"positions": 4, "dim": 4, "base": -2.0}, ValueError),
        ({"positions": 4.5, "dim": 4}, TypeError),
        ({"positions": 4, "dim": 4.0}, TypeError),
        ({"positions": np.array([0.0, np.nan]), "dim": 4}, ValueError),
        ({"positions": np.array(["a"]), "dim": 4}, TypeError),
    ],
)
def test_sinusoidal_bad_input(kwargs, error):
    with pytest.raises(error, match=r"positions|dim|layout|base"):
        pe.sinusoidal(**kwargs)


# --- hierarchical_extend ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_hierarchical_extend_formula(backend, rng, dtype):
    n, d, alpha = 5, 3, 0.4
    table = rng.standard_normal((n, d))
    t = backend.asarray(table, dtype=dtype)
    out = pe.hierarchical_extend(t, 23, alpha=alpha)
    t64 = backend.to_numpy(t).astype(np.float64)
    u = (t64 - alpha * t64[0]) / (1 - alpha)
    expected = np.stack([alpha * u[p // n] + (1 - alpha) * u[p % n] for p in range(23)])
    assert_close(out, expected, backend=backend, dtype=dtype)
    assert bool(backend.xp.all(out[:n, ...] == t)), "the first n rows must be the table, bit for bit"


@pytest.mark.parametrize(
    "length, alpha, match",
    [(26, 0.4, "length"), (-1, 0.4, "length"), (4, 1.0, "alpha"), (4, -0.1, "alpha")],
)
def test_hierarchical_extend_bad_input(length, alpha, match):
    with pytest.raises(ValueError, match=match):
        pe.hierarchical_extend(np.ones((5, 2)), length, alpha=alpha)


def test_hierarchical_extend_rejects_integer_table():
    with pytest.raises(TypeError, match="table"):
        pe.hierarchical_extend(np.ones((5, 2), dtype=np.int64), 4)


# --- floater --------------------------------------------------------------------------


def test_floater_default_reproduces_sinusoid():
    out = pe.floater(256, 16, dtype=np.float64)
    assert np.abs(out - sinusoid_formula(np.arange(256), 16)).max() < 1e-4


def test_floater_custom_dynamics_exponential_decay(backend):
    xp = backend.xp
    p0 = backend.asarray(np.array([1.0, 2.0]), dtype="float32")
    out = pe.floater(5, 2, dynamics=lambda p, t: -p, p0=p0, step=0.5, substeps=16)
    expected = np.exp(-0.5 * np.arange(5))[:, None] * np.array([1.0, 2.0])
    assert_close(out, expected, backend=backend, dtype="float32", atol=1e-5, rtol=1e-5)
    assert xp is backend.xp


def test_floater_time_dependent_dynamics():
    # dp/dt = t has p(t) = t**2 / 2; RK4 integrates polynomials of degree <= 4 exactly.
    out = pe.floater(4, 1, dynamics=lambda p, t: p * 0 + t, p0=np.zeros(1), step=1.0, substeps=3)
    np.testing.assert_allclose(out[:, 0], np.arange(4) ** 2 / 2, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"length": -1, "dim": 4}, ValueError),
        ({"length": 4, "dim": 3}, ValueError),
        ({"length": 4, "dim": 4, "step": 0.0}, ValueError),
        ({"length": 4, "dim": 4, "substeps": 0}, ValueError),
        ({"length": 4, "dim": 4, "dynamics": 3}, TypeError),
        ({"length": 4, "dim": 4, "p0": np.zeros(3)}, ValueError),
    ],
)
def test_floater_bad_input(kwargs, error):
    with pytest.raises(error):
        pe.floater(**kwargs)


# --- apply_absolute ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["add", "multiply"])
def test_apply_absolute(backend, rng, dtype, mode):
    x = backend.asarray(rng.standard_normal((2, 3, 4, 6)), dtype=dtype)
    table = backend.asarray(rng.standard_normal((10, 6)), dtype=dtype)
    out = pe.apply_absolute(x, table, mode=mode, offset=3)
    xs, ts = backend.to_numpy(x).astype(np.float64), backend.to_numpy(table).astype(np.float64)
    expected = xs + ts[3:7] if mode == "add" else xs * ts[3:7]
    assert_close(out, expected, backend=backend, dtype=dtype)


@pytest.mark.parametrize(
    "table_shape, offset, mode, error",
    [
        ((6, 6), 3, "add", ValueError),
        ((10, 5), 0, "add", ValueError),
        ((10, 6), -1, "add", ValueError),
        ((10, 6), 0, "concat", ValueError),
    ],
)
def test_apply_absolute_bad_input(table_shape, offset, mode, error):
    with pytest.raises(error):
        pe.apply_absolute(np.zeros((4, 6)), np.zeros(table_shape), mode=mode, offset=offset)


def test_apply_absolute_mixed_namespaces():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="different kinds"):
        pe.apply_absolute(torch.zeros(4, 6), np.zeros((4, 6)))


# --- complex_order ------------------------------------------------------------------


def test_complex_order_formula(backend, rng):
    r, w, th = (rng.uniform(0.5, 2.0, (3, 4)) for _ in range(3))
    # Phases are float64 products where the namespace has float64 (1e6 keeps full
    # precision); JAX without x64 computes them in float32, exact for small positions.
    pos = np.array([0.0, 7.0, 1e6 if backend.name != "jax" else 100.0])
    z = pe.complex_order(*(backend.asarray(a, dtype="float32") for a in (r, w, th)), backend.asarray(pos, dtype="float32"))
    assert z.dtype == backend.xp.complex64
    assert tuple(z.shape) == (3, 4)
    # Reference with the inputs as float32 values, phase in float64.
    r32, w32, t32 = (a.astype(np.float32).astype(np.float64) for a in (r, w, th))
    expected = r32 * np.exp(1j * (w32 * pos[:, None] + t32))
    got = np.asarray(z.compute() if backend.name == "dask" else (z._array if backend.name == "array_api_strict" else z))
    tol = 2e-5 if backend.name == "jax" else 2e-6
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_complex_order_shared_embedding_broadcasts_over_positions():
    z = pe.complex_order(np.ones(4), np.linspace(0.1, 1.0, 4), np.zeros(4), np.arange(5))
    assert z.shape == (5, 4) and z.dtype == np.complex128
    np.testing.assert_allclose(np.abs(z), 1.0)


def test_complex_order_bad_input():
    with pytest.raises(ValueError, match="broadcast"):
        pe.complex_order(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), np.arange(5))
    with pytest.raises(TypeError, match="amplitude"):
        pe.complex_order(np.ones(4, dtype=int), np.ones(4), np.ones(4), np.arange(5))


# --- conv_positions -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 5])
def test_conv_positions_formula(backend, rng, dtype, width):
    x = rng.standard_normal((2, 7, 4))
    kernel = rng.standard_normal((width, 4))
    xa, ka = backend.asarray(x, dtype=dtype), backend.asarray(kernel, dtype=dtype)
    out = pe.conv_positions(xa, ka)
    x64, k64 = backend.to_numpy(xa).astype(np.float64), backend.to_numpy(ka).astype(np.float64)
    expected = x64.copy()
    for s in range(7):
        for t in range(width):
            src = s + t - width // 2
            if 0 <= src < 7:
                expected[:, s] += k64[t] * x64[:, src]
    assert_close(out, expected, backend=backend, dtype=dtype)


def test_conv_positions_matches_torch_conv1d():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    kernel = torch.randn(5, 6, dtype=torch.float64)
    conv = torch.nn.functional.conv1d(x.transpose(1, 2), kernel.T[:, None, :], padding=2, groups=6).transpose(1, 2)
    torch.testing.assert_close(pe.conv_positions(x, kernel), x + conv)


def test_conv_positions_bad_input():
    with pytest.raises(ValueError, match="odd"):
        pe.conv_positions(np.zeros((4, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="columns"):
        pe.conv_positions(np.zeros((4, 3)), np.zeros((3, 2)))


# --- relative_positions and attention -------------------------------------------------


def test_relative_positions_sign_convention(backend):
    rel = pe.relative_positions(3, 5, offset=2, xp=backend.xp)
    expected = (2 + np.arange(3))[:, None] - np.arange(5)[None, :]
    index = backend.xp.__array_namespace_info__().default_dtypes()["indexing"]
    assert_close(rel, expected, backend=backend, dtype=index)


def test_relative_positions_bad_input():
    with pytest.raises(ValueError, match="q_len"):
        pe.relative_positions(-1, 3)
    with pytest.raises(TypeError, match="k_len"):
        pe.relative_positions(2, 3.0)
    with pytest.raises(ValueError, match="memory"):
        pe.relative_positions(10**7, 10**7)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_naive(backend, rng, causal):
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    bias = rng.standard_normal((2, 3, 5))
    out = pe.attention(*(backend.asarray(a, dtype="float64") for a in (q, k, v)), bias=backend.asarray(bias, dtype="float64"), causal=causal)
    logits = q @ k.transpose(0, 2, 1) / 2.0 + bias
    if causal:
        rel = (2 + np.arange(3))[:, None] - np.arange(5)
        logits = np.where(rel >= 0, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert_close(out, w @ v, backend=backend, dtype="float64")


def test_attention_bad_input():
    with pytest.raises(ValueError, match="last dimension"):
        pe.attention(np.zeros((2, 4)), np.zeros((3, 5)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="bias"):
        pe.attention(np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 4)), bias=np.zeros((4, 4)))
