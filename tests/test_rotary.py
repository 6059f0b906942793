"""RoPE: cos/sin tables, apply_rope and rope against float64 transcriptions of the papers
(tests/formulas.py: LLaMA / GPT-NeoX ``x * cos + rotate_half(x) * sin`` for ``layout="half"``,
RoFormer / GPT-J ``x * cos + rotate_every_two(x) * sin`` for ``layout="interleaved"``).
Bad input: test_bad_inputs.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import DTYPES, assert_close, ulp, without_float64
from formulas import exact_rope
from formulas import inv_freq as theta
from formulas import rope_formula
from formulas import rope_tables as tables

LAYOUTS = ["half", "interleaved"]


# --- rope_cos_sin -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_cos_sin_matches_formula(backend, layout):
    pos = np.array([[0, 1, 7], [100, 4096, 123456]])
    inv_freq, _ = pe.rope_frequencies(12, base=500.0)
    cos, sin = backend.call(lambda p: pe.rope_cos_sin(p, inv_freq, layout=layout), backend.asarray(pos))
    want_cos, want_sin = tables(pos, theta(12, 500.0), layout)
    assert_close(cos, want_cos, backend=backend, dtype="float32")
    assert_close(sin, want_sin, backend=backend, dtype="float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_cos_sin_keeps_float_position_dtype_and_scales(backend, dtype):
    pos = backend.asarray(np.array([0.0, 2.5, 300.0]), dtype=dtype)
    cos, sin = backend.call(lambda p: pe.rope_cos_sin(p, [1.0, 0.01], scale=1.25), pos)
    want_cos, want_sin = tables(backend.to_numpy(pos).astype(np.float64), np.array([1.0, 0.01]), "half")
    assert_close(cos, 1.25 * want_cos, backend=backend, dtype=dtype)
    assert_close(sin, 1.25 * want_sin, backend=backend, dtype=dtype)


def test_rope_frequencies_in_every_namespace(backend):
    got = backend.call(lambda: pe.rope_frequencies(8, scaling=pe.scaling.Linear(2.0), xp=backend.xp)[0])
    assert_close(got, theta(8) / 2.0, backend=backend, dtype="float32" if backend.name == "jax" else "float64")  # JAX without x64


@pytest.mark.parametrize(("dim", "base"), [(430, 1e6), (430, 100.0), (634, 5e5), (248, 8e4)])
def test_16_bit_frequencies_are_the_formula_rounded_once(dim, base):
    """float16 frequencies in torch (eager and compiled) and in NumPy are ``base**(-2i/d)``
    rounded once, as NumPy rounds a float64: torch's own conversion went through float32 and
    rounded one frequency of each of these twice, an ulp away."""
    torch = pytest.importorskip("torch")
    want = (1.0 / base ** (np.arange(0, dim, 2) / dim)).astype(np.float16)
    for got in (
        pe.rope_frequencies(dim, base=base, xp=torch, dtype=torch.float16)[0],
        torch.compile(lambda: pe.rope_frequencies(dim, base=base, xp=torch, dtype=torch.float16)[0], fullgraph=True)(),
        pe.axial_frequencies(dim, base=base, xp=torch, dtype=torch.float16),
    ):
        assert got.dtype == torch.float16
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(pe.rope_frequencies(dim, base=base, dtype=np.float16)[0], want)


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
    out = backend.call(lambda *a: pe.apply_rope(*a, layout=layout), x, cos, sin)
    c64, s64 = (backend.to_numpy(t).astype(np.float64) for t in (cos, sin))
    want = rope_formula(backend.to_numpy(x), c64, s64, layout)
    assert_close(out, want, backend=backend, dtype=dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_partial_rotary_passes_the_rest_through(backend, rng, layout):
    x_np = rng.standard_normal((4, 10))
    x = backend.asarray(x_np, dtype="float32")
    cos, sin = pe.rope_cos_sin(backend.asarray(np.arange(4)), theta(4), layout=layout)
    out = backend.call(lambda *a: pe.apply_rope(*a, layout=layout), x, cos, sin)
    want = rope_formula(backend.to_numpy(x), *tables(np.arange(4), theta(4), layout), layout)
    assert_close(out, want, backend=backend, dtype="float32")
    assert np.array_equal(backend.to_numpy(out)[:, 4:], backend.to_numpy(x)[:, 4:])


def test_apply_rope_in_place(backend, rng):
    if backend.name == "jax":
        pytest.skip("JAX arrays are immutable: out= is refused (test_bad_inputs.py)")
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
    out = backend.call(lambda a: pe.rope(a, layout=layout, offset=7, base=1000.0), x)
    pos = (7 + np.arange(6))[None, None, :]
    want = rope_formula(backend.to_numpy(x), *tables(pos, theta(16, 1000.0), layout), layout)
    assert_close(out, want, backend=backend, dtype=dtype)


def test_rope_seq_axis_and_rotary_dim(backend, rng):
    # [batch, seq, heads, d] as flash-attention lays it out, 8 of 12 channels rotated.
    x = backend.asarray(rng.standard_normal((2, 5, 3, 12)), dtype="float32")
    out = backend.call(lambda a: pe.rope(a, seq_axis=1, rotary_dim=8), x)
    pos = np.arange(5)[None, :, None]
    want = rope_formula(backend.to_numpy(x), *tables(pos, theta(8), "half"), "half")
    assert_close(out, want, backend=backend, dtype="float32")


def test_rope_per_token_positions_kv_cache_and_packed(backend, rng):
    x_np = rng.standard_normal((2, 4, 1, 8))  # [batch, heads, 1 new token, d]
    cache_lengths = np.array([10, 3])  # per-batch KV-cache length = position of the new token
    pos = cache_lengths[:, None, None]
    out = backend.call(pe.rope, backend.asarray(x_np, dtype="float32"), backend.asarray(pos))
    want = rope_formula(x_np.astype(np.float32), *tables(pos, theta(8), "half"), "half")
    assert_close(out, want, backend=backend, dtype="float32")
    cu_seqlens, y_np = np.array([0, 3, 7]), rng.standard_normal((7, 8))
    y = backend.call(lambda a, c: pe.rope(a, pe.positions_from_cu_seqlens(c, 7, check_traced=False)), backend.asarray(y_np, dtype="float32"), backend.asarray(cu_seqlens))
    packed = np.concatenate([np.arange(3), np.arange(4)])
    assert_close(y, rope_formula(y_np.astype(np.float32), *tables(packed, theta(8), "half"), "half"), backend=backend, dtype="float32")


def test_rope_inverse_undoes_it_with_a_scaling(backend, rng):
    x_np = rng.standard_normal((3, 9, 16))
    x = backend.asarray(x_np, dtype="float64" if backend.name != "jax" else "float32")
    yarn = pe.scaling.YaRN(4.0, 64)
    y = backend.call(lambda a: pe.rope(a, scaling=yarn, offset=100), x)
    back = backend.call(lambda a: pe.rope(a, scaling=yarn, offset=100, inverse=True), y)
    assert_close(back, backend.to_numpy(x).astype(np.float64), backend=backend, atol=1e-5, rtol=1e-5)
    # the rotated channels carry YaRN's attention scale
    for rotated in backend.each_run(y):
        norms = np.linalg.norm(backend.to_numpy(rotated), axis=-1) / np.linalg.norm(backend.to_numpy(x), axis=-1)
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


def test_rope_dynamic_ntk_decides_the_length_in_the_graph(backend, rng):
    # 6 positions > original 4: the base grows by alpha ** (d / (d - 2)), alpha = 2 * 6 / 4 - 1,
    # a length each library decides as it runs (in the lazy graph, under jit).
    x_np = rng.standard_normal((4, 6, 8)).astype(np.float32)
    got = backend.call(lambda a: pe.rope(a, scaling=pe.scaling.DynamicNTK(2.0, 4)), backend.asarray(x_np))
    grown = exact_rope(x_np, np.arange(6), base=10000.0 * 2.0 ** (8 / 6))
    assert not np.allclose(grown, exact_rope(x_np, np.arange(6)), atol=1e-3)  # the switch matters
    assert_close(got, grown, backend=backend, dtype="float32", atol=1e-6, rtol=1e-6)


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
    exact = _exact_rotation(x, LONG_POSITIONS, inv_freq)
    assert np.abs(got - exact).max() <= 4e-6
    # one rounding: half an ulp of the exact value, plus the float64 angle's error (p f 2**-53)
    assert (np.abs(got - exact) <= 0.5 * np.abs(np.spacing(exact.astype(np.float32))) + 4e-9).all()


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


@pytest.mark.parametrize("make", ["array_api_strict_no_float64", "jax_without_x64"])
def test_no_float64_path_adds_an_offset_to_float_positions_exactly(rng, make):
    """Float positions plus an offset were summed in float32 where there is no float64:
    ``0.1 + 10**6`` rotated 0.014 off, ``+ 2**24 + 1`` 2.4 (positions past 2**24 lost their
    fraction and their last bit). The offset now enters the angles' exact reduction as chunks of
    its own: eagerly, under ``jax.jit`` (a traced offset, one per row), at a scaling's fixed length
    and at one per row."""
    positions = np.array([[0.1, 0.25, 1e6 + 0.25], [12345.678, 3.0, 7.5]], dtype=np.float32)  # [batch, seq]
    x = rng.uniform(-1, 1, (2, 3, 64)).astype(np.float32)
    dynamic = pe.scaling.DynamicNTK(2.0, 16)
    to, back, jit = without_float64(make)
    offsets = np.array([10**6, 2**24 + 1], dtype=np.int32)
    for scaling, seq_len in ((None, None), (pe.scaling.Linear(2.0), None), (dynamic, 2**25), (dynamic, np.array([2**20, 2**25], dtype=np.int32))):
        for offset in (3, -5, 10**6, 2**24 + 1, offsets):
            exact = positions.astype(np.float64) + np.asarray(offset, dtype=np.float64)[..., None]
            lengths = np.broadcast_to(np.asarray(seq_len if seq_len is not None else 0), (2,))
            want = np.stack([pe.rope(x[b].astype(np.float64), exact[b], scaling=scaling, seq_len=int(lengths[b]) if seq_len is not None else None) for b in range(2)])
            arrays = [to(a) for a in (x, positions, *(() if isinstance(offset, int) else (offset,)), *(() if not isinstance(seq_len, np.ndarray) else (seq_len,)))]

            def call(x, p, *rest, offset=offset, seq_len=seq_len):
                o = rest[0] if not isinstance(offset, int) else offset
                n = rest[-1] if isinstance(seq_len, np.ndarray) else seq_len
                return pe.rope(x, p, offset=o, scaling=scaling, seq_len=n)

            for f in (call, jit(call)) if isinstance(seq_len, (int, type(None))) else (call,):
                got = back(f(*arrays))
                assert np.abs(got - want).max() <= 1e-6, (scaling, offset, seq_len)


@pytest.mark.parametrize("make", ["array_api_strict_no_float64", "jax_without_x64"])
@pytest.mark.parametrize("seq_axis", [None, "bshd"])
def test_no_float64_path_gives_each_row_of_per_row_offsets_the_bits_of_its_own_call(rng, make, seq_axis):
    """Float positions and one offset per row without float64: the offsets are read now, so row
    ``b`` is the call with the int ``offset[b]`` to the bit. An offset of 0 is not carried into
    the split reduction (the positions are the sum): the row of offset 0 took the split
    reduction beside its neighbours (3.6e-7 off the call with ``offset=0`` on JAX's CPU)."""
    positions = np.array([[0.1, 0.25, 1e6 + 0.25, 12345.678], [5e6 + 0.5, 3.0, 7.5, 4e6], [2.5, 1.0, 9.75, 3e6]], dtype=np.float32)
    shape = (3, 4, 2, 32) if seq_axis == "bshd" else (3, 2, 4, 32)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    offsets = np.array([10**6, 0, -7], dtype=np.int32)
    to, back, _ = without_float64(make)
    for scaling, seq_len in ((None, None), (pe.scaling.DynamicNTK(2.0, 16), 2**23)):
        for inverse in (False, True):
            options = {"scaling": scaling, "seq_len": seq_len, "inverse": inverse, "seq_axis": seq_axis}
            got = back(pe.rope(to(x), to(positions), offset=to(offsets), **options))
            for b in range(3):
                one = back(pe.rope(to(x[b : b + 1]), to(positions[b : b + 1]), offset=int(offsets[b]), **options))
                np.testing.assert_array_equal(got[b], one[0])


def test_no_float64_path_keeps_int64_positions_past_2_to_the_31_exact_in_their_digits(rng):
    """Without float64, int64 positions are cut into 12-bit digits whose products with the
    frequency's chunks are exact: past 2**36 the top piece had kept 27 bits, and position
    9.3e10 rotated 0.77 off. The error left is the frequency's own (turns to 48 bits), as
    float64's grows with the position."""
    strict = pytest.importorskip("array_api_strict")
    dev = strict.Device("no_float64")
    positions = np.array([2**36, 93_000_000_000, 2**40 + 7, -(2**40) + 3])
    x = rng.uniform(-1, 1, (positions.size, 64)).astype(np.float32)
    got = pe.rope(strict.asarray(x, device=dev), strict.asarray(positions, device=dev))
    err = np.abs(np.asarray(got._array).astype(np.float64) - _exact_rotation(x, positions, pe.rope_frequencies(64)[0]))
    assert np.all(err.max(axis=-1) <= 4e-6 + np.abs(positions) * 2.0**-46)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_keeps_dtype_within_one_ulp(backend, rng, dtype):
    x = backend.asarray(rng.uniform(-4, 4, (6, 32)), dtype=dtype)
    pos = backend.asarray(LONG_POSITIONS)
    result = backend.call(pe.rope, x, pos)
    exact = _exact_rotation(backend.to_numpy(x).astype(np.float64), LONG_POSITIONS, pe.rope_frequencies(32)[0])
    for got in backend.each_run(result):
        assert got.dtype == x.dtype
        err = np.abs(backend.to_numpy(got).astype(np.float64) - exact)
        assert np.all(err <= ulp(exact, dtype))


# --- scalings ------------------------------------------------------------------------------


def test_scalings_are_frozen_and_hashable():
    yarn = pe.scaling.YaRN(4, 4096)
    assert yarn.factor == 4.0 and isinstance(yarn.factor, float)
    with pytest.raises(AttributeError):
        yarn.factor = 2.0
    assert len({yarn, pe.scaling.YaRN(4.0, 4096), pe.scaling.LongRoPE(np.ones(2), [1, 1], 8)}) == 2


def _rounded_once(table, dtype):
    """Float64 ``table`` rounded once, to nearest even, to float16 (NumPy's own conversion)
    or bfloat16 (the top 16 bits of the float64 rounded at bit 45: normal values only)."""
    if dtype == "float16":
        return table.astype(np.float16).view(np.int16)
    bits = table.view(np.uint64)
    low, keep = bits & np.uint64(2**45 - 1), bits >> np.uint64(45)
    up = (low > np.uint64(2**44)) | ((low == np.uint64(2**44)) & (keep & np.uint64(1) == np.uint64(1)))
    exact = ((keep + up.astype(np.uint64)) << np.uint64(45)).view(np.float64)
    return exact.astype(np.float32).view(np.int32) >> 16  # (exact in float32: its top half is the bfloat16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_16_bit_tables_are_the_float64_tables_rounded_once_on_every_call(library, dtype):
    """rope_cos_sin and sinusoidal in float16 / bfloat16 round their float64 values once.
    torch's (and JAX's, and ml_dtypes') float64 -> 16-bit conversions go through float32 and
    round twice: torch's float16 tables differed from NumPy's in 180 of 2.6M entries (one
    value in 14,000), a row of a decode step from NumPy's row. The first, second (planned)
    and one-position calls all give the one rounding."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    inv_freq, _ = pe.rope_frequencies(128)
    n = 8192
    want_cos, _ = pe.rope_cos_sin(np.arange(n), inv_freq, dtype=np.float64)
    want = _rounded_once(np.asarray(want_cos), dtype).astype(np.int16)
    sine_want = _rounded_once(np.asarray(pe.sinusoidal(np.arange(n), 128, dtype=np.float64)), dtype).astype(np.int16)
    if library == "numpy":
        target = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
        positions, bits = np.arange(n), lambda a: np.asarray(a).view(np.int16)
    else:
        target = getattr(torch, dtype)
        positions, bits = torch.arange(n), lambda a: a.view(torch.int16).numpy()
    for _ in range(3):
        cos, _ = pe.rope_cos_sin(positions, inv_freq, dtype=target)
        np.testing.assert_array_equal(bits(cos), want)
    np.testing.assert_array_equal(bits(pe.sinusoidal(positions, 128, dtype=target)), sine_want)
    for p in (2949, 2950, 2951, 8191):  # one position (a decode loop's plan computes rows ahead)
        for _ in range(2):
            cos, _ = pe.rope_cos_sin(positions[p : p + 1], inv_freq, dtype=target)
            np.testing.assert_array_equal(bits(cos), want[p : p + 1])


def test_16_bit_tables_pass_gradients_straight_through():
    """The one rounding of a float64 table to bfloat16 passes learned frequencies' gradients
    as torch's own conversion does (its steps had been differentiated: the gradient was
    wrong by up to 50 %), in torch and under ``jax.grad``."""
    torch = pytest.importorskip("torch")
    inv_freq = pe.rope_frequencies(16)[0]

    def grads(dtype, convert):
        learned = torch.tensor(inv_freq, requires_grad=True)
        cos, sin = pe.rope_cos_sin(torch.arange(10), learned, dtype=dtype)
        (convert(cos).float().sum() + convert(sin).float().sum()).backward()
        return learned.grad

    want = grads(torch.float64, lambda t: t.to(torch.bfloat16))
    torch.testing.assert_close(grads(torch.bfloat16, lambda t: t), want, rtol=0, atol=0)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def total(learned, dtype, convert):
        cos, sin = pe.rope_cos_sin(jnp.arange(10), learned, dtype=dtype)
        return convert(cos).astype(jnp.float32).sum() + convert(sin).astype(jnp.float32).sum()

    with jax.enable_x64(True):  # (float64 tables: the rounding's path)
        learned = jnp.asarray(inv_freq)
        want = jax.grad(total)(learned, jnp.float64, lambda t: t.astype(jnp.bfloat16))
        np.testing.assert_array_equal(np.asarray(jax.grad(total)(learned, jnp.bfloat16, lambda t: t)), np.asarray(want))


def test_16_bit_tables_keep_signed_zeros_with_gradients_straight_through():
    """A -0 (sin of a -0.0 position) stays -0 in a 16-bit table of JAX float64 values or of
    a torch ``inv_freq`` that carries a gradient, as NumPy's and torch's own conversions keep
    it: the straight-through ``a + (rounded - a)`` turned -0 (and negative values rounding to
    zero) into +0."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    inv_freq = pe.rope_frequencies(8)[0]
    positions = np.array([-0.0, 1.0])
    for dtype in ("float16", "bfloat16"):
        numpy_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
        want = np.signbit(np.asarray(pe.rope_cos_sin(positions, inv_freq, dtype=numpy_dtype)[1], np.float32))
        assert want[0].all()
        learned = torch.tensor(inv_freq, requires_grad=True)
        _, sin = pe.rope_cos_sin(torch.tensor(positions), learned, dtype=getattr(torch, dtype))
        np.testing.assert_array_equal(torch.signbit(sin).numpy(), want, err_msg=f"torch {dtype}")
        tiny = torch.tensor([-0.0, -1e-30, -(2.0**-140)], dtype=torch.float64, requires_grad=True)
        np.testing.assert_array_equal(torch.signbit(pe._xp.cast(pe._xp.namespace(tiny), tiny, getattr(torch, dtype))).numpy(), [True] * 3)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    with jax.enable_x64(True):
        for dtype in ("float16", "bfloat16"):
            numpy_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
            want = np.signbit(np.asarray(pe.rope_cos_sin(positions, inv_freq, dtype=numpy_dtype)[1], np.float32))
            _, sin = pe.rope_cos_sin(jnp.asarray(positions), jnp.asarray(inv_freq), dtype=getattr(jnp, dtype))
            np.testing.assert_array_equal(np.signbit(np.asarray(sin, np.float32)), want, err_msg=f"jax {dtype}")
            table = pe.sinusoidal(jnp.asarray(positions), 8, dtype=getattr(jnp, dtype))
            np.testing.assert_array_equal(np.signbit(np.asarray(table, np.float32)), np.signbit(np.asarray(pe.sinusoidal(positions, 8, dtype=numpy_dtype), np.float32)))


def test_a_numpy_decode_step_cast_runs_no_numpy_python_code():
    """A decode step's table cast (float64 -> the plan's ``np.dtype``) runs no NumPy Python code: the
    16-bit check of ``_xp.cast`` named every target dtype with ``str()`` (Python code in
    ``numpy/_core/_dtype.py``) and converted with ``numpy.astype`` (Python checks), which
    made a float32 NumPy ``rope_cos_sin`` of one position 5.4 -> 10.9 us."""
    import sys

    inv_freq = pe.rope_frequencies(128)[0]
    positions = np.array([777])
    seen = []

    def profile(frame, event, arg):
        name = f"{frame.f_code.co_filename}:{frame.f_code.co_name}".replace("\\", "/")
        if event == "call" and (name.endswith("numpy/_core/_dtype.py:__str__") or name.endswith("numpy/_core/numeric.py:astype")):
            seen.append(name)

    for dtype in (np.float32, np.float16):
        for _ in range(3):  # (plan made)
            pe.rope_cos_sin(positions, inv_freq, dtype=dtype)
        sys.setprofile(profile)
        try:
            pe._xp.cast(np, np.cos(inv_freq), np.dtype(dtype))
            pe.rope_cos_sin(positions, inv_freq, dtype=dtype)
        finally:
            sys.setprofile(None)
    assert not seen, seen[:5]


def _midpoints_and_neighbours(ml_dtype):
    """Every midpoint between two consecutive finite non-negative values of a 16-bit float
    format (exact in float64), a float64 step below and above it, and the value one rounding
    gives each (ties to the even bits), both signs: an oracle built from the format alone."""
    words = np.arange(2**15, dtype=np.uint16)  # the non-negative encodings, in increasing value
    with np.errstate(invalid="ignore"):  # (the NaN encodings)
        values = words.view(ml_dtype).astype(np.float64)
    finite = np.isfinite(values)
    words, values = words[finite], values[finite]
    low, high, low_words, high_words = values[:-1], values[1:], words[:-1], words[1:]
    mid = (low + high) / 2
    tie = np.where(low_words % 2 == 0, low_words, high_words)
    x = np.concatenate([mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf)])
    want = np.concatenate([tie, low_words, high_words])
    return np.concatenate([x, -x]), np.concatenate([want, want | np.uint16(0x8000)])


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_float64_to_16_bit_casts_round_once_at_every_midpoint(name):
    """``_xp.cast`` from float64 to float16 / bfloat16 gives one rounding at every midpoint
    of the format and a float64 step either side, subnormals included: NumPy (bfloat16's
    word path and its fallback), torch through NumPy (small tensors) and torch's own
    operations (large ones)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    from posenc._xp import cast, namespace

    x, want = _midpoints_and_neighbours(np.float16 if name == "float16" else ml_dtypes.bfloat16)
    normal = np.abs(x) >= (2.0**-14 if name == "float16" else 2.0**-126)
    numpy_dtype = np.float16 if name == "float16" else ml_dtypes.bfloat16
    for part in (x[normal], x, x[:1000]):  # (word path where every value is normal, else the fallback)
        pick = np.isin(x, part)
        np.testing.assert_array_equal(cast(np, part, np.dtype(numpy_dtype)).view(np.uint16), want[pick])
    tensor = torch.from_numpy(x)
    assert tensor.numel() > 2**14
    xp = namespace(tensor)
    got = cast(xp, tensor, getattr(torch, name)).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(got, want)
    small = cast(xp, tensor[: 2**14], getattr(torch, name)).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(small, want[: 2**14])
