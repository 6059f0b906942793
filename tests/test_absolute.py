"""The absolute family against float64 transcriptions of each formula (bad input: test_bad_inputs.py)."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import DTYPES, assert_close
from formulas import rel_matrix
from formulas import sinusoid as sinusoid_formula


# --- sinusoidal ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", None])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_sinusoidal_int_length_matches_formula(backend, layout, dtype):
    namespace_dtype = backend.dtype(dtype) if dtype else None
    out = backend.call(lambda: pe.sinusoidal(50, 16, layout=layout, xp=backend.xp, dtype=namespace_dtype))
    assert_close(out, sinusoid_formula(np.arange(50), 16, layout=layout), backend=backend, dtype=dtype or "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinusoidal_position_array_keeps_dtype(backend, dtype):
    pos = backend.asarray(np.array([[0.0, 3.0, 7.5], [100.0, 1000.0, 4096.0]]), dtype=dtype)
    out = backend.call(lambda p: pe.sinusoidal(p, 8, base=500.0), pos)
    exact = sinusoid_formula(backend.to_numpy(pos).astype(np.float64), 8, base=500.0)
    assert_close(out, exact, backend=backend, dtype=dtype, shape=(2, 3, 8))


def test_sinusoidal_integer_positions_default_float32(backend):
    pos = backend.asarray(np.array([0, 5, 1_000_000]))
    out = backend.call(lambda p: pe.sinusoidal(p, 6, layout="half"), pos)
    assert_close(out, sinusoid_formula([0, 5, 1_000_000], 6, layout="half"), backend=backend, dtype="float32")


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


def test_apply_absolute_takes_one_offset_per_batch_row(backend, rng):
    """Each row's result is the single-row call's with its offset (API.md's per-row rule)."""
    x, table = (rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 4, 8), (20, 8)))
    offsets = np.array([0, 5, 16], dtype=np.int32)
    got = backend.call(lambda a, t, o: pe.apply_absolute(a, t, offset=o), *map(backend.asarray, (x, table, offsets)))
    for run in backend.each_run(got):
        for row, offset in enumerate(offsets):
            np.testing.assert_array_equal(backend.to_numpy(run)[row : row + 1], pe.apply_absolute(x[row : row + 1], table, offset=int(offset)))
    with pytest.raises(ValueError, match=r"offset \+ L <= 20 .* in every row, got 0 \.\. 17"):
        pe.apply_absolute(x, table, offset=np.array([0, 5, 17]))
    with pytest.raises(ValueError, match="one value per batch row"):
        pe.apply_absolute(x, table, offset=np.array([0, 5]))


@pytest.mark.parametrize(("length", "dim"), [(2048, 8), (2048, 10), (2048, 64), (4096, 512), (4096, 768), (1024, 1024)])
def test_sinusoidal_half_is_marian_and_roformer_table(length, dim):
    """``layout="half"`` is transformers' Marian, Pegasus and RoFormer table, bit for bit:
    angles ``k / 10000**(2i/d)`` as they divide (the products ``k * 10000**(-2i/d)`` put 1 of
    Pegasus-large's 1024 x 1024 entries, 3 of 4096 x 768, an ulp away)."""
    pytest.importorskip("transformers")
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.pegasus.modeling_pegasus import PegasusSinusoidalPositionalEmbedding

    want = MarianSinusoidalPositionalEmbedding(length, dim).create_weight().numpy()
    np.testing.assert_array_equal(PegasusSinusoidalPositionalEmbedding(length, dim).create_weight().numpy(), want)
    np.testing.assert_array_equal(pe.sinusoidal(length, dim, layout="half"), want)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(pe.sinusoidal(length, dim, layout="half", xp=torch).numpy(), want)


def test_sinusoidal_half_is_not_fairseqs_table():
    """fairseq's table (``get_embedding``, transcribed) has the halves order but frequencies
    ``base**(-i/(d/2 - 1))``, as the docstring says: not a table posenc claims to give."""
    d, n = 16, 40
    frequencies = np.exp(np.arange(d // 2) * -(np.log(10000.0) / (d // 2 - 1)))
    fairseq = np.concatenate([np.sin(np.arange(n)[:, None] * frequencies), np.cos(np.arange(n)[:, None] * frequencies)], axis=1)
    ours = pe.sinusoidal(n, d, layout="half", dtype=np.float64)
    np.testing.assert_allclose(ours[:, [0, d // 2]], fairseq[:, [0, d // 2]], atol=1e-12)  # frequency 1 in both
    assert np.abs(ours - fairseq).max() > 0.5


def test_a_numpy_positions_array_with_xp_is_converted_and_another_library_refused():
    torch = pytest.importorskip("torch")
    got = pe.sinusoidal(np.arange(3), 4, xp=torch)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), pe.sinusoidal(np.arange(3), 4))
    decay = pe.rope_decay(np.arange(3.0), 4, xp=torch)
    np.testing.assert_array_equal(decay.numpy(), pe.rope_decay(np.arange(3.0), 4))
    with pytest.raises(TypeError, match="positions is a torch.Tensor but xp=numpy"):
        pe.sinusoidal(torch.arange(3), 4, xp=np)


# --- hierarchical_extend ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_hierarchical_extend_formula(backend, rng, dtype):
    n, d, alpha = 5, 3, 0.4
    table = rng.standard_normal((n, d))
    t = backend.asarray(table, dtype=dtype)
    out = backend.call(lambda a: pe.hierarchical_extend(a, 23, alpha=alpha), t)
    t64 = backend.to_numpy(t).astype(np.float64)
    u = (t64 - alpha * t64[0]) / (1 - alpha)
    expected = np.stack([alpha * u[p // n] + (1 - alpha) * u[p % n] for p in range(23)])
    assert_close(out, expected, backend=backend, dtype=dtype)
    assert bool(backend.xp.all(out[:n, ...] == t)), "the first n rows must be the table, bit for bit"


def test_hierarchical_extend_rounds_its_rows_once_the_same_in_every_namespace():
    """A float32 table's new rows are the formula in float64 rounded once to float32: within
    half a float32 ulp of the exact rows (and a float64 rounding: ``alpha / (1 - alpha)`` puts
    some exact rows on a float32 tie), the same bits in NumPy, torch and JAX with x64, eager or
    jitted. The float32 formula rounded each of its steps: 321 of the 900 entries here were a
    float32 ulp or more off (JAX's, whose XLA makes ``/ (1 - alpha)`` a product by the
    reciprocal and fuses the products, differed from NumPy's in a fifth of its entries)."""
    from fractions import Fraction

    n, d, alpha = 6, 25, 0.4
    table = np.random.default_rng(3).standard_normal((n, d)).astype(np.float32)
    got = pe.hierarchical_extend(table, n * n, alpha=alpha)
    a, t = Fraction(alpha), [[Fraction(float(v)) for v in row] for row in table]
    u = [[(t[i][j] - a * t[0][j]) / (1 - a) for j in range(d)] for i in range(n)]
    exact = [[a * u[p // n][j] + (1 - a) * u[p % n][j] for j in range(d)] for p in range(n * n)]
    error = np.array([[abs(Fraction(float(got[p, j])) - exact[p][j]) for j in range(d)] for p in range(n * n)], dtype=np.float64)
    assert (error <= np.spacing(np.abs(got)).astype(np.float64) / 2 + 2.0**-52 * np.abs(got)).all(), error.max()
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(pe.hierarchical_extend(torch.from_numpy(table), n * n, alpha=alpha).numpy(), got)
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        eager = pe.hierarchical_extend(jax.numpy.asarray(table), n * n, alpha=alpha)
        jitted = jax.jit(lambda x: pe.hierarchical_extend(x, n * n, alpha=alpha))(jax.numpy.asarray(table))
    np.testing.assert_array_equal(np.asarray(eager), got)
    np.testing.assert_array_equal(np.asarray(jitted), got)


# --- floater --------------------------------------------------------------------------


def test_floater_default_reproduces_sinusoid():
    out = pe.floater(256, 16, dtype=np.float64)
    assert np.abs(out - sinusoid_formula(np.arange(256), 16)).max() < 1e-4


def test_floater_default_substeps_follow_the_step():
    # 32 substeps a position at step=16 were RK4 steps of 0.5: 0.45 off the sinusoid by t = 1024.
    out = pe.floater(65, 8, step=16.0, dtype=np.float64)
    assert np.abs(out - sinusoid_formula(16.0 * np.arange(65), 8)).max() < 1e-4


def test_floater_refuses_an_unstable_step_and_a_diverged_state():
    with pytest.raises(ValueError, match="stability limit"):
        pe.floater(8, 8, step=100.0, substeps=32)  # was a finite 1e77 after 8 positions
    pe.floater(2, 8, step=2.8, substeps=1)  # just inside the limit
    with np.errstate(all="ignore"), pytest.raises(ValueError, match="diverged: the state at position 1 "):
        pe.floater(4, 2, dynamics=lambda p, t: 1e30 * p * p, p0=np.ones(2))
    with np.errstate(over="ignore"), pytest.raises(ValueError, match="diverged: the state at position 23 .* in float16"):
        pe.floater(40, 4, dynamics=lambda p, t: 0.5 * p, p0=np.ones(4), dtype=np.float16)  # e**12 > 65504: inf, silently
    for step in (1e6, 1e308):  # the default substeps: 3.2e7 RK4 steps a position (hours), or an OverflowError
        with pytest.raises(ValueError, match="give substeps"):
            pe.floater(4, 8, step=step)
    assert pe.floater(2, 2, dynamics=lambda p, t: 0 * p, p0=np.ones(2), step=1e6, substeps=1).shape == (2, 2)


def test_floater_default_in_every_namespace(backend):
    # RK4 with 16 substeps per position is 6e-7 from the exact solution, the sinusoid.
    out = backend.call(lambda: pe.floater(6, 4, substeps=16, xp=backend.xp))
    assert_close(out, sinusoid_formula(np.arange(6), 4), backend=backend, dtype="float32")


def test_floater_custom_dynamics_exponential_decay(backend):
    p0 = backend.asarray(np.array([1.0, 2.0]), dtype="float32")
    out = backend.call(lambda p: pe.floater(5, 2, dynamics=lambda p, t: -p, p0=p, step=0.5, substeps=16), p0)
    expected = np.exp(-0.5 * np.arange(5))[:, None] * np.array([1.0, 2.0])
    assert_close(out, expected, backend=backend, dtype="float32", atol=1e-5, rtol=1e-5)


def test_floater_time_dependent_dynamics():
    # dp/dt = t has p(t) = t**2 / 2; RK4 integrates polynomials of degree <= 4 exactly.
    out = pe.floater(4, 1, dynamics=lambda p, t: p * 0 + t, p0=np.zeros(1), step=1.0, substeps=3)
    np.testing.assert_allclose(out[:, 0], np.arange(4) ** 2 / 2, atol=1e-12)


# --- apply_absolute ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["add", "multiply"])
def test_apply_absolute(backend, rng, dtype, mode):
    x = backend.asarray(rng.standard_normal((2, 3, 4, 6)), dtype=dtype)
    table = backend.asarray(rng.standard_normal((10, 6)), dtype=dtype)
    out = backend.call(lambda a, t: pe.apply_absolute(a, t, mode=mode, offset=3), x, table)
    xs, ts = backend.to_numpy(x).astype(np.float64), backend.to_numpy(table).astype(np.float64)
    expected = xs + ts[3:7] if mode == "add" else xs * ts[3:7]
    assert_close(out, expected, backend=backend, dtype=dtype)


# --- complex_order ------------------------------------------------------------------


def test_complex_order_formula(backend, rng):
    r, w, th = (rng.uniform(0.5, 2.0, (3, 4)) for _ in range(3))
    # Phases are float64 products where the namespace has float64; JAX without x64 reduces
    # them exactly from float32 parts (a float32 product was off by 6e-2 at 1e6), so 1e6
    # keeps full precision everywhere.
    pos = np.array([0.0, 7.0, 1e6])
    result = backend.call(pe.complex_order, *(backend.asarray(a, dtype="float32") for a in (r, w, th)), backend.asarray(pos, dtype="float32"))
    # Reference with the inputs as float32 values, phase in float64.
    r32, w32, t32 = (a.astype(np.float32).astype(np.float64) for a in (r, w, th))
    expected = r32 * np.exp(1j * (w32 * pos[:, None] + t32))
    tol = 1e-6 if backend.name == "jax" else 2e-6
    for z in backend.each_run(result):
        assert z.dtype == backend.xp.complex64
        assert tuple(z.shape) == (3, 4)
        np.testing.assert_allclose(backend.to_numpy(z), expected, rtol=tol, atol=tol)


def test_complex_order_shared_embedding_broadcasts_over_positions():
    z = pe.complex_order(np.ones(4), np.linspace(0.1, 1.0, 4), np.zeros(4), np.arange(5))
    assert z.shape == (5, 4) and z.dtype == np.complex128
    np.testing.assert_allclose(np.abs(z), 1.0)


# --- conv_positions -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 5])
def test_conv_positions_formula(backend, rng, dtype, width):
    x = rng.standard_normal((2, 7, 4))
    kernel = rng.standard_normal((width, 4))
    xa, ka = backend.asarray(x, dtype=dtype), backend.asarray(kernel, dtype=dtype)
    out = backend.call(pe.conv_positions, xa, ka)
    x64, k64 = backend.to_numpy(xa).astype(np.float64), backend.to_numpy(ka).astype(np.float64)
    expected = x64.copy()
    for s in range(7):
        for t in range(width):
            src = s + t - width // 2
            if 0 <= src < 7:
                expected[:, s] += k64[t] * x64[:, src]
    assert_close(out, expected, backend=backend, dtype=dtype)


@pytest.mark.parametrize("length", [0, 1, 2, 3])
@pytest.mark.parametrize("width", [1, 5, 9])
def test_conv_positions_of_sequences_shorter_than_the_kernel(backend, rng, length, width):
    """A sequence shorter than half the kernel: the padding is ``width // 2`` zeros whatever
    the length (a119447's padding of at most ``length`` zeros gave an empty result at
    length 1 and width 5, and a broadcast error at 3 and 9)."""
    x, kernel = rng.standard_normal((2, length, 4)), rng.standard_normal((width, 4))
    expected = x.copy()
    for s in range(length):
        for t in range(width):
            if 0 <= s + t - width // 2 < length:
                expected[:, s] += kernel[t] * x[:, s + t - width // 2]
    out = backend.call(pe.conv_positions, backend.asarray(x, dtype="float32"), backend.asarray(kernel, dtype="float32"))
    assert_close(out, expected, backend=backend, dtype="float32")


def test_conv_positions_matches_torch_conv1d():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    kernel = torch.randn(5, 6, dtype=torch.float64)
    conv = torch.nn.functional.conv1d(x.transpose(1, 2), kernel.T[:, None, :], padding=2, groups=6).transpose(1, 2)
    torch.testing.assert_close(pe.conv_positions(x, kernel), x + conv)


# --- relative_positions and attention -------------------------------------------------


def test_relative_positions_sign_convention(backend):
    rel = backend.call(lambda: pe.relative_positions(3, 5, offset=2, xp=backend.xp))
    expected = rel_matrix(3, 5, offset=2)
    index = backend.xp.__array_namespace_info__().default_dtypes()["indexing"]
    assert_close(rel, expected, backend=backend, dtype=index)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_naive(backend, rng, causal):
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    bias = rng.standard_normal((2, 3, 5))
    arrays = (backend.asarray(a, dtype="float64") for a in (q, k, v, bias))
    out = backend.call(lambda *a: pe.attention(*a[:3], bias=a[3], causal=causal), *arrays)
    logits = q @ k.transpose(0, 2, 1) / 2.0 + bias
    if causal:
        logits = np.where(rel_matrix(3, 5, offset=2) >= 0, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert_close(out, w @ v, backend=backend, dtype="float64")


def test_float64_in_the_other_byte_order_is_computed_in_float64(rng):
    """NumPy float64 arrays in the other byte order (``>f8`` on x86) are float64: the dtype
    check that picks the working precision compared ``>f8`` with ``float64`` (unequal), so
    apply_absolute, conv_positions and attention computed in float32 (apply_absolute off by
    8.8e-7 here) and complex_order's angles too, while returning ``>f8``."""
    q = rng.standard_normal((2, 5, 8))
    table = np.arange(160.0).reshape(20, 8) / 7
    positions = np.arange(10.0).reshape(2, 5) * 1000
    calls = {
        "apply_absolute": lambda s: pe.apply_absolute(s(q), s(table), offset=3),
        "conv_positions": lambda s: pe.conv_positions(s(q), s(table[:3] / 100)),
        "attention": lambda s: pe.attention(s(q), s(q), s(q), causal=True),
        "complex_order": lambda s: pe.complex_order(s(q), s(q), s(q), s(positions)),
    }
    for name, call in calls.items():
        want = call(lambda a: a)
        got = call(lambda a: a.astype(a.dtype.newbyteorder()))
        if name == "attention":  # (NumPy's matmul of swapped arrays skips BLAS: its own summation order)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
