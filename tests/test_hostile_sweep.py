"""Defects found by a generated sweep of hostile inputs over every public function (each
array argument in every integer dtype near its limits, bool, complex, 0-size and 0-d, extra
axes; every integer argument as NumPy scalars, 0-d arrays, bools, huge and negative values):
each case here returned a silently wrong number or raised something else than a
``ValueError``/``TypeError`` naming the argument.
"""

import numpy as np
import pytest

import posenc as pe

RNG = np.random.default_rng(142)


def floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_complex_attention_bias_is_refused(library):
    """A complex bias had its imaginary part dropped (NumPy's ComplexWarning, then the real part's result)."""
    q, k, v = floats(2, 3, 4), floats(2, 5, 4), floats(2, 5, 4)
    bias = np.zeros((3, 5), np.complex64) + 1j
    if library == "torch":
        torch = pytest.importorskip("torch")
        q, k, v, bias = (torch.from_numpy(a) for a in (q, k, v, bias))
    with pytest.raises(TypeError, match="bias must have a real dtype"):
        pe.attention(q, k, v, bias=bias)


@pytest.mark.parametrize("library", ["numpy", "torch", "array_api_strict"])
def test_permute_qk_weight_of_no_rows(library):
    """A weight of no heads (0 rows) raised NumPy's 'Cannot cast array data from dtype('float64')
    to dtype('int64')' (torch: 'index_select(): Expected dtype int32/int64 for index')."""
    w = floats(0, 6)
    if library != "numpy":
        w = pytest.importorskip(library).asarray(w)
    out = pe.permute_qk_weight(w, "interleaved", "half", head_dim=8)
    assert type(out) is type(w) and tuple(out.shape) == (0, 6) and out.dtype == w.dtype


@pytest.mark.parametrize("uq", [np.ones((), np.float32), np.ones(4, np.float32)], ids=["0d", "1d"])
def test_tupe_logits_names_a_misshapen_uq(uq):
    """uq's last axis was read before uq was checked: a 0-d uq raised IndexError 'tuple index out of range'."""
    with pytest.raises((ValueError, TypeError), match="uq"):
        pe.tupe_logits(floats(2, 3, 4), floats(2, 5, 4), floats(5, 4), uq, floats(2, 4, 4))


@pytest.mark.parametrize("library", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64", "int8"])
def test_segment_ids_of_two_integer_dtypes(library, dtype):
    """seg_q and seg_k of two integer dtypes: torch refused the comparison of uint16/32/64 with
    int64 (RuntimeError 'Promotion for uint16, uint32, uint64 types is not supported'), and JAX
    without x64 took uint32's 2**32 - 1 for int32's -1 (both promoted to int64, kept as int32)."""
    xp = pytest.importorskip({"jax": "jax.numpy"}.get(library, library))
    high = int(np.iinfo(dtype).max)
    seg_q = np.array([high, 1, 0], dtype)
    seg_k = np.array([-1, 0, 1, 1] if library == "jax" else [0, 0, 1, 1], "int32" if library == "jax" else "int64")
    q, same, diff, b = floats(2, 3, 4), floats(2, 1, 4), floats(2, 1, 4), floats(2, 1, 4)
    want = np.where(seg_q.astype(object)[:, None] == seg_k.astype(object)[None, :], ((q + b) * same).sum(-1)[..., None], ((q + b) * diff).sum(-1)[..., None])
    args = [xp.asarray(a) for a in (q, seg_q, seg_k, same, diff, b)]
    try:
        got = pe.segment_logits(*args)
    except ValueError as exc:  # ids past the index dtype are refused, naming them
        assert "seg_q must fit" in str(exc) and high > np.iinfo(np.int32 if library == "jax" else np.int64).max
        return
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module", ["ShawRelative", "CoPE", "XPos", "NoPE"])
@pytest.mark.parametrize("heads", [(3, 2, 2), (0, 2, 2), (2, 2, 0)], ids=["q3", "q0", "v0"])
def test_torch_modules_refuse_leading_axes_that_do_not_broadcast(module, heads):
    """The modules of any head count let torch find q, k and v of head counts that do not
    broadcast: RuntimeError 'Attempting to broadcast a dimension of length 2 at -1!' (or 'The
    size of tensor a (2) must match the size of tensor b (0)' for v), where the functions raise
    ValueError naming q and k."""
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    made = {"ShawRelative": lambda: pt.ShawRelative(4, max_distance=4), "CoPE": lambda: pt.CoPE(4), "XPos": lambda: pt.XPos(4), "NoPE": pt.NoPE}[module]()
    q, k, v = (torch.randn(1, h, n, 4) for h, n in zip(heads, (3, 5, 5)))
    with pytest.raises(ValueError, match="q, k and v must have leading"):
        made(q, k, v)


@pytest.mark.parametrize("positions", [np.arange(5), np.arange(10).reshape(2, 5)], ids=["shared", "per-row"])
def test_rope_cos_sin_of_a_frequency_set_per_row_on_array_api_strict(positions):
    """inv_freq ``[batch, r/2]`` took its rows as ``inv_freq[b]``, which array-api-strict refuses
    (IndexError 'the multi-axes index only specifies 1 dimensions'); NumPy gave the tables."""
    xs = pytest.importorskip("array_api_strict")
    inv = np.array([[1.0, 0.5, 0.25, 0.125], [2.0, 1.0, 0.5, 0.25]])
    want = pe.rope_cos_sin(positions, inv)
    got = pe.rope_cos_sin(xs.asarray(positions), xs.asarray(inv))
    for g, w in zip(got, want):
        assert type(g) is type(xs.asarray(0)) and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g._array), w)


@pytest.mark.parametrize("module", ["Rotary", "Sinusoidal", "Shaw", "ALiBi"])
@pytest.mark.parametrize("case", ["q0", "v0", "torch"])
def test_flax_modules_name_misshapen_or_foreign_q_k_v(module, case):
    """The Flax modules of any head count let JAX find q, k, v whose leading axes do not
    broadcast ('Incompatible shapes for broadcasting: shapes=[(1, 0), (1, 2)]', 'Incompatible
    types for matmul arguments'), and every module read a torch tensor's dtype with JAX
    ("Cannot interpret 'torch.float32' as a data type"), naming no argument (ALiBi's heads were
    already checked)."""
    jnp = pytest.importorskip("jax.numpy")
    nnx = pytest.importorskip("flax.nnx")
    import posenc.flax as pf

    rngs = nnx.Rngs(0)
    made = {"Rotary": lambda: pf.Rotary(8), "Sinusoidal": lambda: pf.Sinusoidal(8), "Shaw": lambda: pf.Shaw(8, max_distance=4, rngs=rngs), "ALiBi": lambda: pf.ALiBi(2)}[module]()
    q, k, v = floats(1, 2, 3, 8), floats(1, 2, 5, 8), floats(1, 2, 5, 8)
    if case == "q0":
        q = q[:, :0]
    if case == "v0":
        v = v[:, :0]
    q, k, v = (jnp.asarray(a) for a in (q, k, v))
    if case == "torch":
        q = pytest.importorskip("torch").tensor(np.array(q))
    with pytest.raises((TypeError, ValueError), match="q must be a JAX" if case == "torch" else "q, k and v must have leading|[qv] must have the module's"):
        made(q, k, v)


@pytest.mark.parametrize(("library", "max_distance"), [("numpy", 2**62), ("numpy", 2**63 - 1), ("torch", 2**63 - 1), ("jax", 2**31 - 1), ("jax", 2**31)])
def test_clip_relative_refuses_indices_past_the_index_dtype(library, max_distance):
    """``clip(rel, -K, K) + K`` in the index dtype wrapped where ``2K`` is past it: NumPy's
    ``clip_relative([0, 5, -3], 2**63 - 1)`` gave ``[2**63 - 1, -2**63 + 4, 2**63 - 4]``
    (indices outside ``[0, 2K]``, silently), JAX without x64 the same at ``2**31 - 1`` and an
    OverflowError at ``2**31``."""
    xp = pytest.importorskip({"jax": "jax.numpy"}.get(library, library))
    rel = xp.asarray(np.array([0, 5, -3], "int32" if library == "jax" else "int64"))
    largest = 2**31 - 1 if library == "jax" else 2**63 - 1
    if 2 * max_distance <= largest:
        assert np.asarray(pe.clip_relative(rel, max_distance)).tolist() == [max_distance, max_distance + 5, max_distance - 3]
    else:
        with pytest.raises(ValueError, match="max_distance must be at most"):
            pe.clip_relative(rel, max_distance)


@pytest.mark.parametrize("call", ["deberta_bucket", "deberta_logits"])
def test_deberta_bucket_size_past_jax_int32(call):
    """JAX without x64: a bucket_size whose m = bucket_size // 2 is past int32 (every distance
    in the identity zone, as NumPy gives) raised OverflowError 'An overflow was encountered while
    parsing an argument to a jitted computation'."""
    jnp = pytest.importorskip("jax.numpy")
    options = {"bucket_size": 2**40, "max_position": 2**41}
    if call == "deberta_bucket":
        rel = np.array([0, 5, -300, 2**30, -(2**30)], np.int32)
        assert np.asarray(pe.deberta_bucket(jnp.asarray(rel), **options)).tolist() == rel.tolist()
        return
    q, k, pos = floats(2, 3, 4), floats(2, 5, 4), floats(2, 8, 4)
    want = pe.deberta_logits(q, k, pos, pos, max_distance=4, **options)
    got = pe.deberta_logits(*(jnp.asarray(a) for a in (q, k, pos, pos)), max_distance=4, **options)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "library"),
    [("linear_attention", "numpy"), ("linear_attention", "torch"), ("linear_attention_pair", "numpy"), ("rope_cos_sin", "torch"), ("mrope_cos_sin", "torch"), ("xdrope_cos_sin", "torch")],
)
def test_list_positions_are_named(call, library):
    """Positions given as a list met the namespace lookup first: TypeError 'arrays of different
    kinds in one call: builtins.list, torch.Tensor' (linear_attention: also beside NumPy
    arrays; the table builders beside NumPy frequencies named positions already), naming no argument."""
    xp = pytest.importorskip(library)
    inv = xp.asarray(np.array([1.0, 0.5]))
    calls = {
        "linear_attention": lambda: pe.linear_attention(*(xp.asarray(floats(2, 3, 4)) for _ in range(3)), positions=[0, 1, 2]),
        "linear_attention_pair": lambda: pe.linear_attention(*(xp.asarray(floats(2, 3, 4)) for _ in range(3)), positions=(xp.asarray(np.arange(3)), [0, 1, 2])),
        "rope_cos_sin": lambda: pe.rope_cos_sin([0, 1, 2], inv),
        "mrope_cos_sin": lambda: pe.mrope_cos_sin([[0, 1], [0, 1], [0, 1]], inv, (1, 0, 1)),
        "xdrope_cos_sin": lambda: pe.xdrope_cos_sin([[0], [0], [1], [2]], inv, (1, 0, 1, 0)),
    }
    with pytest.raises(TypeError, match=r"positions(\[1\])? must be an array"):
        calls[call]()


@pytest.mark.parametrize("arg", ["q", "k"])
@pytest.mark.parametrize("bad", ["int64", "complex64", "0d", "3 channels", "list"])
def test_rotary_embedding_names_q_and_k(arg, bad):
    """RotaryEmbedding(q, k) left q and k to posenc.rope, whose errors name its own x ('x must
    have a real floating dtype', 'x must be an array'): which of the two was wrong was not said."""
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    good = torch.randn(1, 2, 3, 8)
    value = {"int64": good.to(torch.int64), "complex64": good.to(torch.complex64), "0d": good[0, 0, 0, 0], "3 channels": good[..., :3], "list": [0.0] * 8}[bad]
    args = {"q": good, "k": good, arg: value}
    with pytest.raises((TypeError, ValueError), match=f"^{arg} must"):
        pt.RotaryEmbedding(8)(args["q"], args["k"])
