"""posenc.flax: every NNX module equal to its torch twin given the same parameters (the same
protocol: embed, logits, attend), and to the functional call it wraps."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

jax = pytest.importorskip("jax")
jnp = jax.numpy
nnx = pytest.importorskip("flax.nnx")
torch = pytest.importorskip("torch")
pf = pytest.importorskip("posenc.flax")
pt = pytest.importorskip("posenc.torch")

HEADS, DIM = 2, 8
rngs = nnx.Rngs(0)


def _set(flax_param, tensor, transpose=False):
    """The torch parameter's values, rounded to the flax parameter's dtype."""
    value = tensor.detach().numpy()
    flax_param[...] = jnp.asarray(value.T if transpose else value, flax_param[...].dtype)


def _randomised(module):
    """The torch module's parameters drawn again (CoPE's start at zero)."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return module


def _fire(**flax_options):
    t = _randomised(pt.FIRE(HEADS, mlp_width=4, threshold=8.0))
    f = pf.FIRE(HEADS, mlp_width=4, threshold=8.0, **flax_options, rngs=rngs)
    _set(f.hidden.kernel, t.mlp[0].weight, True), _set(f.hidden.bias, t.mlp[0].bias)
    _set(f.out.kernel, t.mlp[2].weight, True), _set(f.out.bias, t.mlp[2].bias)
    _set(f.c, t.c), _set(f.L_multiplier, t.L_multiplier)
    return t, f


def _pair(torch_module, flax_module, *names):
    _randomised(torch_module)
    for name in names:
        _set(getattr(flax_module, name), getattr(torch_module, name))
    return torch_module, flax_module


SCALINGS = {
    "plain": None,
    "linear": pe.scaling.Linear(2.0),
    "ntk": pe.scaling.NTK(2.0),
    "dynamic": pe.scaling.DynamicNTK(2.0, 4),
    "yarn": pe.scaling.YaRN(4.0, 4),
    "longrope": pe.scaling.LongRoPE((1.0, 1.5, 2.0, 3.0), (2.0, 3.0, 4.0, 8.0), 4, factor=4.0),
    "llama3": pe.scaling.Llama3(8.0, 4, low_freq_factor=1.0, high_freq_factor=4.0),
}

# (torch module, flax module); the learned ones pass **flax_options (param_dtype) to the flax module
PAIRS = {
    **{f"rotary {n}": (lambda s=s: (pt.RotaryEmbedding(DIM, scaling=s), pf.Rotary(DIM, scaling=s))) for n, s in SCALINGS.items()},
    "xpos": lambda: (pt.XPos(DIM, scale_base=16), pf.XPos(DIM, scale_base=16)),
    "t5": lambda **o: _pair(pt.T5RelativeBias(HEADS, num_buckets=8, max_distance=16), pf.T5(HEADS, num_buckets=8, max_distance=16, **o, rngs=rngs), "table"),
    "alibi": lambda: (pt.ALiBi(HEADS), pf.ALiBi(HEADS)),
    "fire": _fire,
    "kerple log": lambda **o: _pair(pt.KERPLE(HEADS), pf.KERPLE(HEADS, **o, rngs=rngs), "r1", "r2"),
    "kerple power": lambda **o: _pair(pt.KERPLE(HEADS, kind="power"), pf.KERPLE(HEADS, kind="power", **o, rngs=rngs), "r1", "r2"),
    "sandwich": lambda: (pt.Sandwich(HEADS, dim=16), pf.Sandwich(HEADS, dim=16)),
    "shaw": lambda **o: _pair(pt.ShawRelative(DIM, max_distance=3), pf.Shaw(DIM, max_distance=3, **o, rngs=rngs), "table_k", "table_v"),
    "deberta": lambda **o: _pair(pt.DeBERTaRelative(HEADS, DIM, max_distance=4), pf.DeBERTa(HEADS, DIM, max_distance=4, **o, rngs=rngs), "pos_q", "pos_k"),
    "xl": lambda **o: _pair(pt.TransformerXLRelative(HEADS, DIM), pf.XL(HEADS, DIM, **o, rngs=rngs), "r_proj", "u", "v"),
    "tener": lambda **o: _pair(pt.TENERRelative(HEADS, DIM), pf.TENER(HEADS, DIM, **o, rngs=rngs), "u", "v"),
    "tener half": lambda **o: _pair(pt.TENERRelative(HEADS, DIM, base=100.0, layout="half"), pf.TENER(HEADS, DIM, base=100.0, layout="half", **o, rngs=rngs), "u", "v"),
    "tupe": lambda **o: _pair(
        pt.TUPE(HEADS, DIM, max_positions=16, untie_cls=True), pf.TUPE(HEADS, DIM, max_positions=16, untie_cls=True, **o, rngs=rngs), "p", "uq", "uk", "cls"
    ),
    "cope": lambda **o: _pair(pt.CoPE(DIM, npos_max=8), pf.CoPE(DIM, npos_max=8, **o), "pos_emb"),
    "nope": lambda: (pt.NoPE(), pf.NoPE()),
    "sinusoidal": lambda: (pt.SinusoidalEmbedding(DIM), pf.Sinusoidal(DIM)),
    "learned": lambda **o: _pair(pt.LearnedEmbedding(16, DIM), pf.Learned(16, DIM, **o, rngs=rngs), "weight"),
}
LEARNED = sorted(n for n in PAIRS if jax.tree.leaves(nnx.state(PAIRS[n]()[1], nnx.Param)))
ABSOLUTE = ("sinusoidal", "learned", "nope")


def _qkv(q_len, k_len):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, HEADS, n, DIM)).astype(np.float32) for n in (q_len, k_len, k_len)]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_equals_the_torch_module_with_the_same_parameters(name):
    torch_module, flax_module = PAIRS[name]()
    for q_len, k_len, options in ((5, 5, {}), (2, 6, {"causal": True, "offset": 3})):
        q, k, v = _qkv(q_len, k_len)
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        jq, jk, jv = (jnp.asarray(a) for a in (q, k, v))
        logit_options = {"offset": options["offset"]} if "offset" in options else {}
        with torch.no_grad():
            want_logits = torch_module.logits(tq, tk, **logit_options).numpy()
            want = torch_module.attend(tq, tk, tv, **options).numpy()
        # under jax.jit: one compilation instead of JAX's eager op-by-op ones (the test's time)
        logits, out = jax.jit(lambda q, k, v: (flax_module.logits(q, k, **logit_options), flax_module(q, k, v, **options)))(jq, jk, jv)
        np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5)
    if name not in ABSOLUTE:
        return  # embed returns x unchanged: the absolute modules' only
    x = np.random.default_rng(1).standard_normal((2, 5, DIM)).astype(np.float32)
    with torch.no_grad():
        want = torch_module.embed(torch.from_numpy(x), offset=3).numpy()
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: flax_module.embed(x, offset=3))(jnp.asarray(x))), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", sorted(n for n in PAIRS if PAIRS[n]()[1].takes_positions))
def test_flax_module_with_per_token_positions_equals_the_torch_module(name):
    torch_module, flax_module = PAIRS[name]()
    assert torch_module.takes_positions
    keys = pe.positions_from_mask(np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]))  # left-padded [2, 6]
    q, k, v = _qkv(2, 6)
    with torch.no_grad():
        want = torch_module.attend(*(torch.from_numpy(a) for a in (q, k, v)), causal=True, query_positions=torch.from_numpy(keys[:, -2:]),
                                   key_positions=torch.from_numpy(keys)).numpy()  # fmt: skip
    got = jax.jit(lambda q, k, v, p: flax_module(q, k, v, causal=True, query_positions=p[:, -2:], key_positions=p))(*map(jnp.asarray, (q, k, v, keys)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


SIXTEEN_BIT = {"bfloat16": (jnp.bfloat16, torch.bfloat16), "float16": (jnp.float16, torch.float16)}


def _outputs_at(torch_module, flax_module, dtype):
    """Both modules' logits, attend and embed outputs at ``dtype`` inputs (``"bfloat16"``,
    ``"float16"``), the torch module moved to that dtype: ``(flax's, torch's as float32)``."""
    jax_dtype, torch_dtype = SIXTEEN_BIT[dtype]
    torch_module.to(torch_dtype)
    q, k, v = _qkv(2, 6)
    x = np.random.default_rng(1).standard_normal((2, 5, DIM)).astype(np.float32)
    with torch.no_grad():
        tq, tk, tv, tx = (torch.from_numpy(a).to(torch_dtype) for a in (q, k, v, x))
        want = (torch_module.logits(tq, tk, offset=3), torch_module.attend(tq, tk, tv, causal=True, offset=3), torch_module.embed(tx, offset=3))
    assert {w.dtype for w in want} == {torch_dtype}
    got = jax.jit(lambda q, k, v, x: (flax_module.logits(q, k, offset=3), flax_module(q, k, v, causal=True, offset=3), flax_module.embed(x, offset=3)))(
        *(jnp.asarray(a, jax_dtype) for a in (q, k, v, x))
    )
    return got, [w.float().numpy() for w in want]


def _assert_close_in_16_bits(got, want, dtype):
    """Each output in ``dtype`` and within two of its rounding steps of torch's."""
    tolerance = 2 * float(jnp.finfo(SIXTEEN_BIT[dtype][0]).eps)
    for g, w in zip(got, want):
        assert g.dtype == SIXTEEN_BIT[dtype][0]
        np.testing.assert_allclose(np.asarray(g, np.float32), w, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", sorted(SIXTEEN_BIT))
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_keeps_16_bit_inputs_16_bit_as_the_torch_module_moved_to_that_dtype(name, dtype):
    """dtype in = dtype out: the float32 parameters are cast to the inputs' dtype where used, as
    a torch module's are by ``.to(dtype)`` (XL, TUPE, DeBERTa and Shaw had given float32 logits
    for bfloat16 inputs, their parameters promoting the inputs)."""
    got, want = _outputs_at(*PAIRS[name](), dtype)
    _assert_close_in_16_bits(got, want, dtype)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_at_float64_inputs_equals_the_torch_module_moved_to_float64(name):
    """Under x64, float64 inputs give float64 outputs of float64 precision, as ``.double()``'s
    torch module (parameters in ``param_dtype=float64``; Sandwich's bias was computed in
    float32, 9e-7 off at distance 3000)."""
    with jax.enable_x64(True):
        torch_module, flax_module = PAIRS[name](param_dtype=jnp.float64) if name in LEARNED else PAIRS[name]()
    torch_module.double()
    length = 16 if name in ("learned", "tupe") else 3001  # (their tables' rows)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, HEADS, n, DIM)) for n in (1, length, length))
    x = rng.standard_normal((2, 5, DIM))
    with torch.no_grad():
        tq, tk, tv, tx = (torch.from_numpy(a) for a in (q, k, v, x))
        want = (torch_module.logits(tq, tk), torch_module.attend(tq, tk, tv, causal=True), torch_module.embed(tx, offset=length - 5))
    with jax.enable_x64(True):
        jq, jk, jv, jx = (jnp.asarray(a) for a in (q, k, v, x))
        got = (flax_module.logits(jq, jk), flax_module(jq, jk, jv, causal=True), flax_module.embed(jx, offset=length - 5))
    for g, w in zip(got, want):
        assert g.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-12, atol=1e-12)


def test_flax_alibi_at_float64_inputs_has_float64_slopes():
    # 12 heads: slopes that are not powers of two (float32 ones were 1.6e-4 off at distance 3000)
    q, k = (np.random.default_rng(0).standard_normal((1, 12, n, DIM)) for n in (1, 3001))
    want = q @ np.swapaxes(k, -1, -2) / np.sqrt(DIM) + pe.alibi_bias(pe.alibi_slopes(12, dtype=np.float64), 1, 3001)
    with jax.enable_x64(True):
        got = pf.ALiBi(12).logits(jnp.asarray(q), jnp.asarray(k))
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-12)


def test_flax_alibi_repr_shows_its_options():
    """As the torch module's (API.md: a module's repr shows its options): ``max_bias`` is
    not in the slopes' repr, an array's shape and dtype."""
    shown = repr(pf.ALiBi(4, max_bias=4.0, symmetric=True))
    assert "num_heads=4" in shown and "max_bias=4.0" in shown and "symmetric=True" in shown
    step = nnx.jit(lambda m, q, k: m.logits(q, k))(pf.ALiBi(4, max_bias=4.0), jnp.ones((1, 4, 1, 8)), jnp.ones((1, 4, 3, 8)))  # still jits
    np.testing.assert_allclose(np.asarray(step)[0, :, 0], np.sqrt(8) + pe.alibi_bias(pe.alibi_slopes(4, max_bias=4.0), 1, 3)[:, 0], rtol=1e-6)


@pytest.mark.parametrize("name", LEARNED)
def test_flax_module_stores_its_parameters_in_param_dtype(name):
    """``param_dtype=bfloat16``: every parameter bfloat16 (FIRE's MLP too), the module equal to
    the torch module moved to bfloat16, gradients bfloat16; float32 inputs still give float32."""
    torch_module, flax_module = PAIRS[name](param_dtype=jnp.bfloat16)
    stored = {leaf.dtype for leaf in jax.tree.leaves(nnx.state(flax_module, nnx.Param))}
    assert stored == {jnp.dtype(jnp.bfloat16)}
    _assert_close_in_16_bits(*_outputs_at(torch_module, flax_module, "bfloat16"), "bfloat16")
    q, k, v = (jnp.asarray(a) for a in _qkv(2, 6))
    x = jnp.ones((2, 5, DIM))

    @nnx.jit  # (one compilation instead of JAX's eager op-by-op ones: the test's time)
    def float32_outputs_and_grads(module):
        grads = nnx.grad(lambda m: jnp.sum(m(q, k, v, causal=True) ** 2) + jnp.sum(m.embed(x) ** 2))(module)
        return (module.logits(q, k), module(q, k, v), module.embed(x)), grads

    outputs, grads = float32_outputs_and_grads(flax_module)
    assert {out.dtype for out in outputs} == {jnp.dtype(jnp.float32)}
    assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("param_dtype", [jnp.int32, jnp.complex64, "nonsense", None, jnp.bool_])
def test_flax_modules_refuse_a_param_dtype_that_is_not_floating(param_dtype):
    modules = [
        lambda d: pf.T5(HEADS, param_dtype=d, rngs=rngs),
        lambda d: pf.FIRE(HEADS, param_dtype=d, rngs=rngs),
        lambda d: pf.KERPLE(HEADS, param_dtype=d, rngs=rngs),
        lambda d: pf.Shaw(DIM, max_distance=2, param_dtype=d, rngs=rngs),
        lambda d: pf.DeBERTa(HEADS, DIM, max_distance=2, param_dtype=d, rngs=rngs),
        lambda d: pf.XL(HEADS, DIM, param_dtype=d, rngs=rngs),
        lambda d: pf.TENER(HEADS, DIM, param_dtype=d, rngs=rngs),
        lambda d: pf.TUPE(HEADS, DIM, max_positions=4, param_dtype=d, rngs=rngs),
        lambda d: pf.CoPE(DIM, param_dtype=d),
        lambda d: pf.Learned(4, DIM, param_dtype=d, rngs=rngs),
    ]
    for module in modules:
        with pytest.raises(TypeError, match="param_dtype must be a floating dtype"):
            module(param_dtype)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_refuses_integer_inputs_as_the_torch_module(name):
    """Integer q/k/v are a TypeError (an integer call returned integers); a rotary module's
    queries of another head_dim a ValueError (it rotated the first head_dim channels of
    wider ones). (Two float dtypes promote in JAX; the torch module refuses them outside
    ``torch.autocast``.)"""
    torch_module, flax_module = PAIRS[name]()
    for module, wrap in ((torch_module, lambda a: torch.from_numpy(np.array(a))), (flax_module, lambda a: a)):
        with pytest.raises(TypeError, match="floating"):
            module.attend(*(wrap(jnp.ones((1, HEADS, 3, DIM), jnp.int32)),) * 3)
        if flax_module.head_dim is not None:
            with pytest.raises(ValueError, match="head_dim"):
                module.logits(*(wrap(jnp.ones((1, HEADS, 3, DIM + 2), jnp.float32)),) * 2)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_refuses_misshapen_inputs_as_the_torch_module(name):
    """q, k, v of another module's heads, of two head_dims, v of another length than k, a mask
    that does not broadcast against the logits: the torch module's ValueError naming them.
    The flax modules had let JAX raise "Incompatible shapes for broadcasting" or
    "dot_general requires contracting dimensions to have the same shape" (heads: T5, ALiBi,
    FIRE, KERPLE, Sandwich), or gone on with a later function's message."""
    torch_module, flax_module = PAIRS[name]()
    q, k, v = (jnp.ones((1, HEADS, 3, DIM)),) * 3
    bad = {
        "q and k must have the same head_dim": lambda a: (a(q), a(k[..., : DIM - 2]), a(v)),
        "v must have k_len = 3 rows": lambda a: (a(q), a(k), a(v[:, :, :2])),
    }
    if flax_module.num_heads is not None:
        bad["heads on axis -3"] = lambda a: (a(jnp.ones((1, HEADS + 1, 3, DIM))),) * 3
    for module, wrap in ((torch_module, lambda a: torch.from_numpy(np.array(a))), (flax_module, lambda a: a)):
        for message, make in bad.items():
            with pytest.raises(ValueError, match=message):
                module.attend(*make(wrap))
        with pytest.raises(ValueError, match=r"mask of shape \(2, 2\) does not broadcast against the logits"):
            module.attend(*(wrap(a) for a in (q, k, v)), mask=wrap(jnp.ones((2, 2), bool)))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="the index dtype is int32 without x64")
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_flax_module_refuses_an_offset_whose_positions_leave_the_index_dtype(name):
    """Query positions ``offset + arange(q_len)`` past int32 (JAX without x64) are the
    ValueError of the functions, for a causal mask, XL's distances and xPos's scales, which
    the modules compute themselves: XL's distances had wrapped (offset ``2**31 - 2``, three
    queries: logits 0.34 off the torch module's), NoPE's causal mask had hidden every key
    of the wrapped query (a row of zeros), and an offset of ``2**40`` had raised JAX's
    OverflowError."""
    _, module = PAIRS[name]()
    q = jnp.ones((1, HEADS, 3, DIM))
    for offset in (2**31 - 2, 2**40):
        with pytest.raises(ValueError, match="int32"):
            module.attend(q, q, q, causal=True, offset=offset)
        if name in ("xl", "xpos"):
            with pytest.raises(ValueError, match="int32"):
                module.logits(q, q, offset=offset)


def test_flax_tener_refuses_what_the_torch_module_refuses():
    """Bad arguments are refused at construction with the torch twin's error type; TENER, as
    ``TENERRelative``, takes no per-token positions."""
    for bad in ({"num_heads": 0}, {"num_heads": 2.0}, {"head_dim": 0}, {"head_dim": 7}, {"base": -1.0}, {"layout": "diagonal"}):
        options = {"num_heads": HEADS, "head_dim": DIM, **bad}
        heads, head_dim = options.pop("num_heads"), options.pop("head_dim")
        with pytest.raises((TypeError, ValueError)) as theirs:
            pt.TENERRelative(heads, head_dim, **options)
        with pytest.raises(theirs.type):
            pf.TENER(heads, head_dim, **options, rngs=rngs)
    q = jnp.ones((1, HEADS, 3, DIM))
    with pytest.raises(TypeError, match="takes no query_positions"):
        pf.TENER(HEADS, DIM, rngs=rngs).logits(q, q, query_positions=jnp.arange(3), key_positions=jnp.arange(3))


def test_flax_sinusoidal_embeds_float_positions_at_the_exact_sum_with_an_offset():
    """Without x64, float positions plus an offset were summed in float32: ``0.1 + 10**6``
    embedded 0.024 off, ``+ 2**24 + 1`` 1.1; the offset now enters the angles' exact reduction."""
    positions = np.array([[0.1, 0.25, 1e6 + 0.25], [12345.678, 3.0, 7.5]], dtype=np.float32)
    x = jnp.zeros((2, 3, DIM))
    module = pf.Sinusoidal(DIM)
    for offset in (3, 10**6, 2**24 + 1, np.array([10**6, 2**24 + 1], dtype=np.int32)):
        want = pe.sinusoidal(positions.astype(np.float64) + np.asarray(offset, dtype=np.float64)[..., None], DIM)
        given = offset if isinstance(offset, int) else jnp.asarray(offset)
        eager = module.embed(x, jnp.asarray(positions), offset=given)
        jitted = jax.jit(lambda x, p, given=given: module.embed(x, p, offset=given))(x, jnp.asarray(positions))
        for got in (eager, jitted):
            np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=5e-7)


def test_flax_absolute_modules_embed_an_offset_per_batch_row_and_refuse_rows_outside_the_table():
    """``embed(x, offset=[batch])`` puts row ``b`` at ``offset[b] + arange(seq)`` (with the
    batch as long as the sequence it had broadcast along the sequence); ``Learned`` refuses
    concrete positions outside its table, as the torch module does (``jnp.take`` had given
    NaN rows past the end and the last row for -1)."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 3, DIM)).astype(np.float32))
    offsets = jnp.asarray([0, 10, 20])
    for module in (pf.Sinusoidal(DIM), pf.Learned(32, DIM, rngs=nnx.Rngs(0))):
        rows = jnp.stack([module.embed(x[b : b + 1], offset=int(offsets[b]))[0] for b in range(3)])
        np.testing.assert_array_equal(np.asarray(module.embed(x, offset=offsets)), np.asarray(rows))
        positions = jnp.asarray([0, 4, 7])  # (given positions take the offset too: it had been dropped)
        np.testing.assert_array_equal(np.asarray(module.embed(x, positions, offset=5)), np.asarray(module.embed(x, positions + 5)))
        closed = jnp.asarray([0, 4, 7])  # positions closed over by a jitted step: values of its trace, not read by a check
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: module.embed(x, closed, offset=5))(x)), np.asarray(module.embed(x, positions + 5)))
    sinusoidal = pf.Sinusoidal(DIM)  # int8 positions plus an int8 offset: the sums' rows (they had wrapped in int8)
    narrow = sinusoidal.embed(x, jnp.asarray([0, 4, 7], dtype=jnp.int8), offset=jnp.asarray(124, dtype=jnp.int8))
    np.testing.assert_array_equal(np.asarray(narrow), np.asarray(sinusoidal.embed(x, jnp.asarray([124, 128, 131]))))
    learned = pf.Learned(8, DIM, rngs=nnx.Rngs(0))
    for bad in ({"offset": 6}, {"offset": -1}, {"positions": jnp.asarray([0, 1, 8])}):
        with pytest.raises(ValueError, match="num_positions = 8"):
            learned.embed(x[0], **bad)
    with pytest.raises(TypeError, match="integers"):
        learned.embed(x[0], jnp.asarray([0.0, 1.0, 2.0]))
    # Traced positions are not checked: those outside the table, negative ones too, give NaN rows.
    traced = np.asarray(nnx.jit(lambda m, p: m.embed(x[0], p))(learned, jnp.asarray([-1, 3, 8])))
    assert np.isnan(traced[0]).all() and np.isnan(traced[2]).all()
    np.testing.assert_array_equal(traced[1], np.asarray(learned.embed(x[0], jnp.asarray([0, 3, 4]))[1]))


def test_flax_learned_extend_equals_the_torch_module_and_keeps_the_trained_rows():
    """``extend`` grows the table as ``LearnedEmbedding.extend`` does (:func:`posenc.hierarchical_extend`
    with the module's ``alpha``): the first rows bit for bit, the new ones equal to torch's, in
    the parameter's dtype; the grown table embeds and trains."""
    theirs, ours = _pair(pt.LearnedEmbedding(8, DIM, alpha=0.3), pf.Learned(8, DIM, alpha=0.3, rngs=rngs), "weight")
    trained = np.asarray(ours.weight[...])
    assert ours.extend(40) is ours and ours.num_positions == 40 and theirs.extend(40).num_positions == 40
    np.testing.assert_array_equal(np.asarray(ours.weight[...])[:8], trained)
    np.testing.assert_allclose(np.asarray(ours.weight[...]), theirs.weight.detach().numpy(), rtol=1e-6, atol=1e-7)
    x = np.random.default_rng(3).standard_normal((2, 5, DIM)).astype(np.float32)
    with torch.no_grad():
        want = theirs.embed(torch.from_numpy(x), offset=33).numpy()
    np.testing.assert_allclose(np.asarray(ours.embed(jnp.asarray(x), offset=33)), want, rtol=1e-6, atol=1e-6)
    grads = nnx.grad(lambda m: jnp.sum(m.embed(jnp.asarray(x), offset=33) ** 2))(ours)
    assert grads.weight[...].shape == (40, DIM) and float(jnp.abs(grads.weight[...][33:38]).sum()) > 0
    half = pf.Learned(8, DIM, param_dtype=jnp.bfloat16, rngs=rngs)
    rows = np.asarray(half.weight[...])
    assert half.extend(64).weight[...].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(half.weight[...])[:8], rows)


def test_flax_learned_checks_alpha_now_and_extend_as_the_torch_module():
    """``alpha`` outside ``[0, 1)`` is refused at construction with the torch module's error;
    ``extend`` refuses to shrink the table (or to grow it past ``num_positions**2``); a position
    past the table points to ``extend``."""
    for alpha in (1.0, -0.1, float("nan"), "0.4", True):
        with pytest.raises((TypeError, ValueError)) as theirs:
            pt.LearnedEmbedding(8, DIM, alpha=alpha)
        with pytest.raises(theirs.type, match="alpha"):
            pf.Learned(8, DIM, alpha=alpha, rngs=rngs)
    learned = pf.Learned(8, DIM, rngs=rngs)
    for length, error in ((4, "length must be >= num_positions = 8"), (65, "n\\*n = 64"), (-1, "non-negative")):
        with pytest.raises(ValueError, match=error):
            learned.extend(length)
    with pytest.raises(TypeError, match="length must be an integer"):
        learned.extend(9.0)
    assert learned.num_positions == 8
    with pytest.raises(ValueError, match=r"num_positions = 8.*extend\(12\)"):
        learned.embed(jnp.zeros((1, 4, DIM)), offset=8)


def test_flax_modules_are_the_functional_calls():
    q, k, v = (jnp.asarray(a) for a in _qkv(3, 5))
    t5, shaw, dyn = pf.T5(HEADS, rngs=rngs), pf.Shaw(DIM, max_distance=2, rngs=rngs), pe.scaling.DynamicNTK(2.0, 4)

    def pairs(q, k):  # (module, functional call), all under one jax.jit
        dot = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(DIM)
        rotated = pe.rope(q, offset=2, scaling=dyn, seq_len=5) @ jnp.swapaxes(pe.rope(k, scaling=dyn, seq_len=5), -1, -2) / np.sqrt(DIM)
        return [
            (t5.logits(q, k), dot + pe.t5_bias(t5.table[...], 3, 5)),
            (pf.ALiBi(HEADS).logits(q, k), dot + pe.alibi_bias(pe.alibi_slopes(HEADS), 3, 5)),
            (pf.Rotary(DIM, scaling=dyn).logits(q, k), rotated),
            (shaw.logits(q, k), pe.shaw_logits(q, k, shaw.table_k[...], max_distance=2) / np.sqrt(DIM)),
            (pf.Sandwich(HEADS, dim=16).logits(q, k), dot + pe.sandwich_bias(3, 5, 16, heads=HEADS, xp=jnp)),
        ]

    for got, want in jax.jit(pairs)(q, k):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_flax_modules_train_under_nnx_jit_and_grad():
    q, k, v = (jnp.asarray(a) for a in _qkv(4, 4))
    model = pf.T5(HEADS, rngs=rngs)

    @nnx.jit
    def loss_and_grad(model):
        return nnx.value_and_grad(lambda m: jnp.sum(m(q, k, v, causal=True) ** 2))(model)

    loss, grads = loss_and_grad(model)
    assert np.isfinite(float(loss)) and float(jnp.abs(grads.table[...]).sum()) > 0
    with pytest.raises(TypeError, match="takes no query_positions"):
        pf.XL(HEADS, DIM, rngs=rngs).logits(q, k, query_positions=jnp.arange(4))


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_trains_as_the_torch_module_and_the_paper(kind):
    """Twenty SGD steps on the same loss (ten driving ``r1`` below ``eps``, ten back up), eager
    and under ``nnx.jit``: the stored values are clamped before each use as the paper's
    ``.data.clamp_`` clamps the torch module's. Left unclamped, the flax values had drifted
    below ``eps`` and ended ``[0.04, 0.82]`` against torch's ``[3.35, 4.13]``."""
    length, lr = 6, 0.01
    start = (np.array([0.05, 1.0], np.float32), np.array([0.5, 1.5], np.float32))
    theirs = pt.KERPLE(2, kind=kind)
    with torch.no_grad():
        theirs.r1.copy_(torch.from_numpy(start[0]))
        theirs.r2.copy_(torch.from_numpy(start[1]))
    ours = [pf.KERPLE(2, kind=kind, rngs=nnx.Rngs(0)) for _ in range(2)]
    for module in ours:
        module.r1[...], module.r2[...] = jnp.asarray(start[0]), jnp.asarray(start[1])

    def step(module, sign):
        grads = nnx.grad(lambda m: jnp.sum(m.bias(length, length) * sign))(module)
        module.r1[...] = module.r1[...] - lr * grads.r1[...]
        module.r2[...] = module.r2[...] - lr * grads.r2[...]

    jitted = nnx.jit(step)
    for t in range(20):
        sign = -1.0 if t < 10 else 1.0
        theirs.zero_grad()
        (theirs.bias(length, length) * sign).sum().backward()
        with torch.no_grad():
            theirs.r1 -= lr * theirs.r1.grad
            theirs.r2 -= lr * theirs.r2.grad
        step(ours[0], sign)
        jitted(ours[1], sign)
    want = theirs.bias(length, length).detach().numpy()
    for module in ours:
        np.testing.assert_allclose(np.asarray(module.bias(length, length)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_clamps_to_the_bit_so_a_call_does_not_change_the_next(kind):
    """A value below ``eps`` (or ``r2`` above 2 for ``"power"``) is used and stored as the
    clamped value exactly, as torch's ``clamp_``: ``value + (clip - value)`` had stored
    ``eps`` plus or minus an ulp, so the first call's bias differed from the next one's."""
    module = pf.KERPLE(2, kind=kind, rngs=nnx.Rngs(0))
    module.r1[...] = jnp.asarray([-0.3, 0.7], jnp.float32)
    module.r2[...] = jnp.asarray([0.5, 7.3] if kind == "power" else [0.5, -1.7], jnp.float32)
    first = np.asarray(module.bias(4, 6))
    np.testing.assert_array_equal(np.asarray(module.r1[...]), np.asarray([0.01, 0.7], np.float32))
    np.testing.assert_array_equal(np.asarray(module.r2[...]), np.asarray([0.5, 2.0] if kind == "power" else [0.5, 0.01], np.float32))
    np.testing.assert_array_equal(np.asarray(module.bias(4, 6)), first)


def test_fire_mlp_is_initialised_as_torchs_linear_layers():
    """``nn.Linear``'s default: weights and biases uniform in ``±1/sqrt(fan_in)`` (flax's
    ``nnx.Linear`` default had drawn normal weights, std 1.01 for the first layer, and zero biases)."""
    module = pf.FIRE(4, mlp_width=256, rngs=nnx.Rngs(0))
    for layer, fan_in in ((module.hidden, 1), (module.out, 256)):
        for values in (np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])):
            bound = 1 / np.sqrt(fan_in)
            assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound and values.std() > 0.5 * bound


ROW_MODULES = ("alibi", "cope", "deberta", "fire", "kerple log", "kerple power", "sandwich", "shaw", "t5", "tupe")


@pytest.mark.parametrize("name", ROW_MODULES)
def test_flax_modules_of_relative_biases_and_logits_take_one_offset_per_batch_row(name):
    """As the torch modules (API.md: offset takes one value per batch row, and posenc.flax
    mirrors the protocol): ``logits`` and ``attend`` (causal or not) with one ``offset`` per
    batch row, a JAX or NumPy array: row ``b`` is the call with ``offset[b]`` to the bit,
    and per-token positions give the same rows. They had been a ``TypeError``."""
    _, module = PAIRS[name]()
    q, k, v = _qkv(2, 9)
    q, k, v = (jnp.asarray(np.concatenate([a, a[::-1] * 0.5])) for a in (q, k, v))  # 4 rows
    offsets = jnp.asarray([4, 7, 0, 5])
    calls = [lambda o: module.logits(q, k, offset=o), *(lambda o, causal=causal: module.attend(q, k, v, causal=causal, offset=o) for causal in (False, True))]
    for call in calls:
        rows = np.asarray(call(offsets))
        assert rows.shape[0] == 4
        np.testing.assert_array_equal(np.asarray(call(np.asarray(offsets, np.int32))), rows)
        for b, offset in enumerate(offsets.tolist()):
            np.testing.assert_array_equal(rows[b], np.asarray(call(offset)[b]))
    if module.takes_positions:
        positions = module.logits(q, k, query_positions=offsets[:, None] + jnp.arange(2))
        np.testing.assert_array_equal(np.asarray(positions), np.asarray(module.logits(q, k, offset=offsets)))


def test_flax_tener_takes_one_offset_per_batch_row_each_row_its_call_on_that_row_alone():
    """``TENER``'s ``logits`` and ``attend`` (causal or not) with one ``offset`` per batch
    row, a JAX or NumPy array: row ``b`` is the call on row ``b`` alone with ``offset[b]``,
    to the bit (one product per row, as ``TENERRelative``). It had been a ``TypeError``."""
    _, module = PAIRS["tener"]()
    q, k, v = _qkv(2, 9)
    q, k, v = (jnp.asarray(np.concatenate([a, a[::-1] * 0.5])) for a in (q, k, v))  # 4 rows
    offsets = jnp.asarray([4, 7, 0, 5])
    calls = [lambda q, k, v, o: module.logits(q, k, offset=o), *(lambda q, k, v, o, causal=causal: module.attend(q, k, v, causal=causal, offset=o) for causal in (False, True))]
    for call in calls:
        rows = np.asarray(call(q, k, v, offsets))
        assert rows.shape[0] == 4
        np.testing.assert_array_equal(np.asarray(call(q, k, v, np.asarray(offsets, np.int32))), rows)
        for b, offset in enumerate(offsets.tolist()):
            np.testing.assert_array_equal(rows[b], np.asarray(call(q[b : b + 1], k[b : b + 1], v[b : b + 1], offset)[0]))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="the index dtype is int32 without x64")
@pytest.mark.parametrize("name", [*ROW_MODULES, "tener"])
def test_flax_modules_refuse_numpy_offsets_per_row_beyond_int32(name):
    """One NumPy int64 offset per batch row past int32 (JAX without x64) is the ValueError a
    NumPy offset beside JAX arrays gets from the functions: the modules' ``jnp.asarray`` had
    wrapped it (``[2**32 + 3, 0]`` gave the rows of offsets 3 and 0)."""
    _, module = PAIRS[name]()
    q, k, v = map(jnp.asarray, _qkv(2, 9))
    for offsets in (np.array([2**32 + 3, 0]), np.array([2**31 + 3, 0])):
        for call in (lambda o: module.logits(q, k, offset=o), lambda o: module.attend(q, k, v, causal=True, offset=o)):
            with pytest.raises(ValueError, match="offset holds values outside int32"):
                call(offsets)


def test_flax_other_modules_refuse_one_offset_per_batch_row_and_bad_ones_are_refused():
    q, k, v = map(jnp.asarray, _qkv(1, 6))
    for name in ("rotary plain", "xpos", "xl", "nope"):
        module = PAIRS[name]()[1]
        for call in (lambda o: module.logits(q, k, offset=o), lambda o: module.attend(q, k, v, offset=o)):
            with pytest.raises(TypeError, match=r"takes one offset for every row, got one of shape \(2,\): one per batch row is taken by .*T5"):
                call(jnp.asarray([2, 5]))
    module = PAIRS["t5"]()[1]
    for offset, error, says in (
        (jnp.asarray([2.0, 5.0]), TypeError, "offset must have an integer dtype"),
        (jnp.asarray([1, 2, 3]), ValueError, r"offset of shape \(3,\) \(one per batch row\) does not broadcast against the batch axes \(2,\)"),
    ):
        for call in (lambda o: module.logits(q, k, offset=o), lambda o: module.attend(q, k, v, causal=True, offset=o)):
            with pytest.raises(error, match=says):
                call(offset)
