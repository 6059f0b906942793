"""The posenc.torch module protocol (embed / logits / attend), checked on every module at once.

References are the public functions called directly (and softmax attention written out
here), never a module's own output.
"""

import copy
import math

import pytest

torch = pytest.importorskip("torch")

import posenc as pe  # noqa: E402
import posenc.torch as pt  # noqa: E402

H, D = 2, 8
YARN = pe.scaling.YaRN(4.0, 16)


def _dot(q, k):
    return torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])


def _rel(q_len, k_len, offset):
    return (offset + torch.arange(q_len))[:, None] - torch.arange(k_len)[None, :]


# name -> (constructor, reference logits(module, q, k, offset) from the public function)
MODULES = {
    "none": (lambda: pt.NoPE(), lambda m, q, k, o: _dot(q, k)),
    "sinusoidal": (lambda: pt.SinusoidalEmbedding(D), lambda m, q, k, o: _dot(q, k)),
    "learned": (lambda: pt.LearnedEmbedding(32, D), lambda m, q, k, o: _dot(q, k)),
    "rope": (
        lambda: pt.RotaryEmbedding(D, scaling=YARN),
        lambda m, q, k, o: _dot(pe.rope(q, offset=o, scaling=YARN), pe.rope(k, scaling=YARN)),
    ),
    "rope_dynamic": (
        lambda: pt.RotaryEmbedding(D, scaling=pe.scaling.DynamicNTK(2.0, 4), layout="interleaved"),
        lambda m, q, k, o: _dot(*(pe.rope(x, offset=off, scaling=pe.scaling.DynamicNTK(2.0, 4), layout="interleaved",
                                          seq_len=max(o + q.shape[-2], k.shape[-2])) for x, off in ((q, o), (k, 0)))),
    ),
    "t5": (
        lambda: pt.T5RelativeBias(H, num_buckets=8, max_distance=6),
        lambda m, q, k, o: _dot(q, k) + pe.t5_bias(m.table, q.shape[-2], k.shape[-2], max_distance=6, offset=o),
    ),
    "alibi": (
        lambda: pt.ALiBi(H, max_bias=4.0),
        lambda m, q, k, o: _dot(q, k) + pe.alibi_bias(torch.from_numpy(pe.alibi_slopes(H, max_bias=4.0)), q.shape[-2], k.shape[-2], offset=o),
    ),
    "shaw": (
        lambda: pt.ShawRelative(D, max_distance=3),
        lambda m, q, k, o: pe.shaw_logits(q, k, m.table_k, max_distance=3, offset=o) / math.sqrt(D),
    ),
    "deberta": (
        lambda: pt.DeBERTaRelative(H, D, max_distance=3),
        lambda m, q, k, o: pe.deberta_logits(q, k, m.pos_q, m.pos_k, max_distance=3, offset=o),
    ),
    "deberta_c2p": (
        lambda: pt.DeBERTaRelative(H, D, max_distance=3, bucket_size=4, max_position=16, terms=("c2p",)),
        lambda m, q, k, o: pe.deberta_logits(q, k, None, m.pos_k, max_distance=3, bucket_size=4, max_position=16, terms=("c2p",), offset=o),
    ),
    "xl": (lambda: pt.TransformerXLRelative(H, D, dim=12), lambda m, q, k, o: _xl_reference(m, q, k, o)),
    "tener": (
        lambda: pt.TENERRelative(H, D, base=100.0),
        lambda m, q, k, o: pe.tener_logits(q, k, m.u, m.v, base=100.0, offset=o),
    ),
    "tupe": (lambda: pt.TUPE(H, D, max_positions=32, dim=12), lambda m, q, k, o: _tupe_reference(m, q, k, o)),
    "tupe_cls": (lambda: pt.TUPE(H, D, max_positions=32, untie_cls=True), lambda m, q, k, o: _tupe_reference(m, q, k, o)),
    "tupe_r": (
        lambda: pt.TUPE(H, D, max_positions=32, bias=pt.T5RelativeBias(H, num_buckets=8, max_distance=6)),
        lambda m, q, k, o: _tupe_reference(m, q, k, o) + pe.t5_bias(m.bias.table, q.shape[-2], k.shape[-2], max_distance=6, offset=o),
    ),
    "xpos": (lambda: pt.XPos(D, scale_base=16), lambda m, q, k, o: _xpos_reference(q, k, o, scale_base=16)),
    "fire": (
        lambda: pt.FIRE(H, mlp_width=8, threshold=4.0),
        lambda m, q, k, o: _dot(q, k) + pe.fire_bias(m.mlp, q.shape[-2], k.shape[-2], offset=o, c=m.c, threshold=m.L_multiplier * 4.0, xp=torch, dtype=torch.float64),
    ),
    "kerple": (
        lambda: pt.KERPLE(H, kind="power"),
        lambda m, q, k, o: _dot(q, k) + pe.kerple_bias(m.r1.clamp(min=0.01), m.r2.clamp(0.01, 2.0), q.shape[-2], k.shape[-2], kind="power", offset=o),
    ),
    "sandwich": (
        lambda: pt.Sandwich(H, dim=16),
        lambda m, q, k, o: _dot(q, k) + pe.sandwich_bias(q.shape[-2], k.shape[-2], 16, heads=H, offset=o, xp=torch, dtype=torch.float64),
    ),
    "cope": (lambda: pt.CoPE(D, npos_max=6), lambda m, q, k, o: pe.cope_logits(q, k, m.pos_emb, offset=o)),
    "randomized": (
        lambda: pt.RandomizedRoPE(D, max_length=64),
        lambda m, q, k, o: _dot(pe.rope(q, offset=o), pe.rope(k)),
    ),
}


def _xl_reference(m, q, k, o):
    # (q_i + u).k_j + (q_i + v).(R[rel_ij] W_R), the [q, k, d] tensor written out
    r = torch.einsum("qkc,hcd->hqkd", pe.sinusoidal(_rel(q.shape[-2], k.shape[-2], o), m.dim, dtype=torch.float64), m.r_proj)
    return (torch.einsum("bhqd,bhkd->bhqk", q + m.u, k) + torch.einsum("bhqd,hqkd->bhqk", q + m.v, r)) / math.sqrt(D)


def _tupe_reference(m, q, k, o):
    pq = m.p[o : o + q.shape[-2]] @ m.uq  # [heads, q_len, head_dim]
    pk = m.p[: k.shape[-2]] @ m.uk
    position = torch.einsum("hqd,hkd->hqk", pq, pk) / math.sqrt(2 * D)
    if m.cls is not None:  # the [CLS] token (position 0): row of query 0, column of key 0
        qpos, kpos = (o + torch.arange(q.shape[-2]))[:, None], torch.arange(k.shape[-2])[None, :]
        position = torch.where(qpos == 0, m.cls[0][:, None, None], torch.where(kpos == 0, m.cls[1][:, None, None], position))
    return torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(2 * D) + position


def _xpos_reference(q, k, o, *, scale_base):
    # positions not centred: small here, so zeta**(+-m / scale_base) stays in range
    qpos, kpos = o + torch.arange(q.shape[-2]), torch.arange(k.shape[-2])
    zq = pe.xpos_scale(qpos, D, scale_base=scale_base, dtype=torch.float64)
    zk = pe.xpos_scale(kpos, D, scale_base=scale_base, dtype=torch.float64)
    return _dot(pe.rope(q, offset=o) * zq, pe.rope(k) / zk)


def _value_term(m, weights, v, offset):
    if isinstance(m, pt.ShawRelative):
        return pe.shaw_output(weights, v, m.table_v, max_distance=m.max_distance, offset=offset)
    return weights @ v


def _make(name):
    torch.manual_seed(0)
    m = MODULES[name][0]().double()
    for p in m.parameters():  # away from the small initial values, so every term shows
        torch.nn.init.normal_(p)
    return m


def _qkv(q_len=5, k_len=9):
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(2, H, n, D, dtype=torch.float64, generator=g) for n in (q_len, k_len, k_len))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_logits_equal_the_public_function(name):
    m = _make(name)
    q, k, _ = _qkv()
    with torch.no_grad():
        for offset in (None, 0, 7, torch.tensor(7)):  # a 0-d tensor offset too (a compiled decode step)
            reference = MODULES[name][1](m, q, k, 9 - 5 if offset is None else int(offset))
            torch.testing.assert_close(m.logits(q, k, offset=offset), reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("causal", [False, True])
def test_attend_is_softmax_of_the_logits_with_the_causal_alignment(name, causal):
    m = _make(name)
    q, k, v = _qkv()
    with torch.no_grad():
        logits = MODULES[name][1](m, q, k, 4)
        if causal:
            logits = logits.masked_fill(_rel(5, 9, 4) < 0, float("-inf"))
        expected = _value_term(m, torch.softmax(logits, -1), v, 4)
        torch.testing.assert_close(m.attend(q, k, v, causal=causal), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_one_query_call_equals_the_last_row_of_the_full_call(name):
    m = _make(name)
    q, k, v = _qkv(9, 9)
    with torch.no_grad():
        full = m.logits(q, k)
        torch.testing.assert_close(m.logits(q[:, :, -1:], k), full[:, :, -1:], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m.logits(q[:, :, -3:], k), full[:, :, -3:], rtol=1e-12, atol=1e-12)
        for causal in (False, True):
            full = m.attend(q, k, v, causal=causal)
            torch.testing.assert_close(m.attend(q[:, :, -1:], k, v, causal=causal), full[:, :, -1:], rtol=1e-12, atol=1e-12)
            # decoding: the prefix as a KV cache, one query per step (a length-dependent
            # scaling such as dynamic NTK changes its frequencies with the length, by design)
            steps = torch.cat([m.attend(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], causal=causal) for t in range(9)], dim=-2)
            if causal and name != "rope_dynamic":
                torch.testing.assert_close(steps, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_gradients_reach_every_parameter_and_a_fully_masked_row_gives_zeros(name):
    m = _make(name)
    q, k, v = (x.requires_grad_() for x in _qkv())
    mask = torch.ones(2, 1, 5, 9, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of the first batch row may attend to nothing
    out = m.attend(q, k, v, causal=True, mask=mask)
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))
    (out.square().sum() + m.embed(torch.randn(2, 5, D, dtype=torch.float64)).square().sum()).backward()
    for p_name, p in [("q", q), ("k", k), ("v", v), *m.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), p_name
        assert p.grad.abs().sum() > 0, p_name


def test_xl_logits_with_memory_equal_xl_logits_of_the_transformer_xl_rows():
    # offset left out: r's rows are xl_logits' own distances k_len - 1 .. -q_len
    m = _make("xl")
    q, k, _ = _qkv()
    with torch.no_grad():
        r = pe.sinusoidal(torch.arange(8, -6, -1), 12, dtype=torch.float64) @ m.r_proj
        torch.testing.assert_close(m.logits(q, k), pe.xl_logits(q, k, r, m.u, m.v) / math.sqrt(D), rtol=1e-12, atol=1e-12)


def test_tupe_refuses_positions_past_its_table():
    m = pt.TUPE(H, D, max_positions=6)
    q = torch.randn(1, H, 2, D)
    with pytest.raises(ValueError, match="max_positions = 6"):
        m.logits(q, torch.randn(1, H, 7, D))
    with pytest.raises(ValueError, match="max_positions = 6"):
        m.logits(q, q, offset=5)


def test_masks_combine_with_causal():
    m = _make("t5")
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 9, generator=torch.Generator().manual_seed(3)) > 0.3
    with torch.no_grad():
        logits = MODULES["t5"][1](m, q, k, 4).masked_fill(~mask | (_rel(5, 9, 4) < 0), float("-inf"))
        weights = torch.nan_to_num(torch.softmax(logits, -1))  # fully masked rows: NaN -> 0 in the reference only
        torch.testing.assert_close(m.attend(q, k, v, causal=True, mask=mask), weights @ v, rtol=1e-12, atol=1e-12)


def test_absolute_modules_embed_at_positions_and_the_others_leave_x():
    x = torch.randn(2, 5, D, dtype=torch.float64)
    sinusoidal = _make("sinusoidal")
    torch.testing.assert_close(sinusoidal.embed(x, offset=3), x + torch.from_numpy(pe.sinusoidal(8, D))[3:])
    learned = _make("learned")
    positions = torch.tensor([4, 0, 2, 2, 9])
    torch.testing.assert_close(learned.embed(x, positions), x + learned.weight[positions])
    torch.testing.assert_close(learned.embed(x, offset=2), x + learned.weight[2:7])
    for name in ("none", "rope", "t5", "alibi", "shaw", "deberta", "xl", "tener", "tupe", "xpos"):
        assert _make(name).embed(x) is x


def test_absolute_modules_embed_an_offset_per_batch_row_on_its_own_row():
    """``embed(x, offset=[batch])``: row ``b`` at ``offset[b] + arange(seq)``, also where the
    batch is as long as the sequence (``offset + arange(seq)`` had broadcast the offsets
    along the sequence: every row at ``offset[j] + j``); offsets that fit neither are a
    ``ValueError`` naming ``offset``."""
    x = torch.randn(3, 3, D, dtype=torch.float64)
    offsets = torch.tensor([0, 10, 20])
    for module in (_make("sinusoidal"), _make("learned").extend(64)):
        rows = torch.stack([module.embed(x[b : b + 1], offset=int(offsets[b]))[0] for b in range(3)])
        torch.testing.assert_close(module.embed(x, offset=offsets), rows, rtol=0, atol=0)
        with pytest.raises(ValueError, match="offset"):
            module.embed(x[:2], offset=offsets)


@pytest.mark.parametrize(
    "module, shown",
    [
        (pt.ALiBi(4, max_bias=4.0), "ALiBi(num_heads=4, max_bias=4.0, symmetric=False)"),
        (pt.RotaryEmbedding(16, scaling=pe.scaling.Linear(2.0)), "scaling=Linear(factor=2.0)"),
        (pt.T5RelativeBias(3, num_buckets=16, max_distance=64, bidirectional=False), "num_buckets=16, bidirectional=False, max_distance=64"),
        (pt.ShawRelative(8, max_distance=4), "ShawRelative(head_dim=8, max_distance=4)"),
        (pt.DeBERTaRelative(2, 8, max_distance=4, terms=("c2p",)), "terms=('c2p',)"),
        (pt.SinusoidalEmbedding(16, base=500.0), "base=500.0"),
        (pt.LearnedEmbedding(16, 8), "LearnedEmbedding(num_positions=16, dim=8, alpha=0.4)"),
        (pt.NoPE(), "NoPE()"),
        (pt.TransformerXLRelative(2, 8, base=100.0), "TransformerXLRelative(num_heads=2, head_dim=8, dim=16, base=100.0, layout='interleaved')"),
        (pt.TENERRelative(2, 8, layout="interleaved"), "TENERRelative(num_heads=2, head_dim=8, base=10000.0, layout='interleaved')"),
        (pt.TUPE(2, 8, max_positions=64, untie_cls=True), "TUPE(num_heads=2, head_dim=8, max_positions=64, dim=16, untie_cls=True)"),
        (pt.XPos(8, scale_base=256), "XPos(head_dim=8, base=10000.0, scale_base=256, layout='half')"),
    ],
)
def test_repr_shows_the_options(module, shown):
    assert shown in repr(module)


def test_every_module_is_a_positional_module():
    for name in MODULES:
        assert isinstance(MODULES[name][0](), pt.PositionalModule)
    exported = {getattr(pt, n) for n in pt.__all__ if isinstance(getattr(pt, n), type) and issubclass(getattr(pt, n), pt.PositionalModule)}
    assert {type(MODULES[name][0]()) for name in MODULES} | {pt.PositionalModule} == exported


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda m, q: m.attend(q, q, q, mask=torch.ones(5, 5)), TypeError, "mask must be a boolean"),
        (lambda m, q: m.attend(q, q, q, mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, "mask of shape"),
        (lambda m, q: m.attend(q, q, q, causal=1), TypeError, "causal"),
        (lambda m, q: m.logits(q, q, offset=1.5), TypeError, "offset"),
        (lambda m, q: m.logits(q, q[..., :4]), ValueError, "head_dim"),
        (lambda m, q: m.attend(q, q, q[:, :, :3]), ValueError, "v must have k_len"),
    ],
)
def test_bad_calls_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call(pt.NoPE(), torch.randn(1, 2, 5, 8))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_bad_calls_are_refused_by_every_module(name):
    """Integer tensors, q, k and v of two dtypes, and (where the module fixes them) heads
    or a head_dim other than the module's: a TypeError/ValueError naming them. Before, an
    integer call returned integers (NoPE, the bias modules), two dtypes or another count of
    heads met torch's RuntimeError in a matmul or a broadcast, and RotaryEmbedding rotated
    the first head_dim channels of wider queries (a partial rotation asked for by no one)."""
    m = MODULES[name][0]()
    q = torch.randn(1, H, 5, D)
    with pytest.raises(TypeError, match="floating"):
        m.attend(*(torch.ones(1, H, 5, D, dtype=torch.int64),) * 3)
    with pytest.raises(TypeError, match="one dtype"):
        m.attend(q, q.double(), q)
    with pytest.raises(TypeError, match="one dtype"):
        m.logits(q, q.half())
    if getattr(m, "num_heads", None) is not None:
        with pytest.raises(ValueError, match="heads"):
            m.attend(*(torch.randn(1, H + 1, 5, D),) * 3)
    if getattr(m, "head_dim", None) is not None:
        with pytest.raises(ValueError, match="head_dim"):
            m.logits(*(torch.randn(1, H, 5, D + 2),) * 2)
    if isinstance(m, pt.RotaryEmbedding):
        with pytest.raises(ValueError, match="head_dim"):
            m.rotate(torch.randn(1, H, 5, D + 2))


@pytest.mark.parametrize("name", ["none", "alibi", "shaw", "rope"])
def test_autocast_regions_mix_dtypes_and_are_taken(name):
    """Under ``torch.autocast`` q and k after a float32 QK-norm beside a bfloat16 v are one
    call's, as autocast's own ops take them: attend gives v's dtype."""
    m = MODULES[name][0]()
    q, k = torch.randn(1, H, 5, D), torch.randn(1, H, 5, D)
    v = torch.randn(1, H, 5, D).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m.attend(q, k, v, causal=True).dtype == torch.bfloat16


# Modules whose float32 parameters enter the logits as they are (the others cast theirs, or
# their functions compute 16-bit inputs in 16 bits as a model's own layers would)
IN_PARAMETER_DTYPE = {"shaw", "deberta", "deberta_c2p", "xl", "tener", "tupe", "tupe_cls", "tupe_r", "t5", "alibi", "fire", "kerple", "cope"}


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_calls_return_their_dtype(name, dtype):
    """dtype in = dtype out with float32 parameters (a model's activations in 16 bits):
    ``logits`` of ``q``'s dtype, ``attend`` of ``v``'s; where float32 parameters enter the
    logits, they are the float32 logits of the same (exactly widened) queries and keys
    rounded once. ShawRelative returned float32 from both, DeBERTaRelative,
    TransformerXLRelative, TENERRelative and TUPE from ``logits``; T5RelativeBias, ALiBi, FIRE
    and KERPLE rounded their bias to 16 bits before the sum (4% to 32% of the logits an ulp off),
    CoPE its ``pos_emb`` and computed its gates and logits in 16 bits."""
    m = MODULES[name][0]()
    g = torch.Generator().manual_seed(2)
    if name == "cope":  # (zeros at first)
        m.pos_emb.data = torch.randn(m.pos_emb.shape, generator=g)
    q, k, v = (torch.randn(2, H, n, D, generator=g).to(dtype) for n in (3, 6, 6))
    got = m.logits(q, k)
    assert got.dtype == dtype
    if name in IN_PARAMETER_DTYPE:
        assert torch.equal(got, m.logits(q.float(), k.float()).to(dtype))
    assert m.attend(q, k, v, causal=True).dtype == dtype


def test_float16_alibi_attends_to_far_keys_as_float32_does():
    """A query 100,000 tokens past its keys: float32 slopes give biases down to -70,700, past
    float16's range. They were rounded to float16 before the sum: every logit of 8 of 12 heads
    -inf, and attend's softmax gave NaN there; the float32 logits reach the softmax now."""
    m = pt.ALiBi(12)
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 12, 1, 8, generator=g), torch.randn(1, 12, 4, 8, generator=g), torch.randn(1, 12, 4, 8, generator=g)
    want = m.attend(q, k, v, offset=100_000)
    got = m.attend(q.half(), k.half(), v.half(), offset=100_000)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("convert", ["half", "bfloat16"])
@pytest.mark.parametrize("make", [lambda: pt.ALiBi(8), lambda: pt.KERPLE(8, kind="power")], ids=["alibi", "kerple_power"])
def test_16_bit_modules_compute_their_growing_bias_in_float32(make, convert):
    """A module converted with ``.half()`` holds float16 slopes (ALiBi) or ``r1, r2`` (KERPLE):
    its bias was float16 too, -inf past 65,504 (a query 200,000 tokens past its keys: every
    logit of the row -inf, attend NaN) and an ulp of 0.25-32 below that (at 1,000 tokens,
    attend 0.1 off the float32 module's). The parameters are widened to float32 (exactly) for
    ``logits``/``attend``: the float32 sum rounded once, as beside float32 parameters."""
    with torch.random.fork_rng():  # (KERPLE draws r1, r2 from torch's generator)
        torch.manual_seed(0)
        m16 = getattr(make(), convert)()
    m32 = copy.deepcopy(m16).float()  # (the same parameter values, widened)
    g = torch.Generator().manual_seed(3)
    dtype = torch.float16 if convert == "half" else torch.bfloat16
    q, k, v = (torch.randn(2, 8, n, 16, generator=g).to(dtype) for n in (3, 5, 5))
    for offset in (0, 1000, 200_000):
        got = m16.attend(q, k, v, offset=offset)
        assert got.dtype == q.dtype and torch.isfinite(got).all()
        want = m32.attend(q.float(), k.float(), v.float(), offset=offset)
        eps = torch.finfo(dtype).eps  # (the weights, rounded to 16 bits, times v; the output rounded)
        torch.testing.assert_close(got.float(), want, atol=4 * eps * float(v.abs().max()), rtol=0)
        assert torch.equal(m16.logits(q, k, offset=offset), m32.logits(q.float(), k.float(), offset=offset).to(q.dtype))


@pytest.mark.parametrize("name", ["rope", "t5", "shaw", "xl", "xpos", "tupe_r", "cope", "alibi", "kerple"])
def test_compile_fullgraph(name):
    torch.compiler.reset()  # (one lambda's code for every module: a graph each, past dynamo's recompile limit)
    m = _make(name)
    q, k, v = _qkv(1, 9)
    compiled = torch.compile(lambda q, k, v: m.attend(q, k, v, causal=True), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), m.attend(q, k, v, causal=True))


@pytest.mark.parametrize("name", ["tupe", "tupe_cls", "shaw", "xpos", "xl", "rope", "alibi"])
def test_compile_fullgraph_with_a_tensor_offset(name):
    """A decode step whose offset is a tensor stays one graph (TUPE takes its query rows of
    ``p`` at the traced offset) and equals the eager call. (xPos's scale lost a traced
    offset to the clamp of a GPU one, which leaves a traced one as it is: a TypeError.)"""
    m = _make(name)
    q, k, v = _qkv(1, 9)
    compiled = torch.compile(lambda q, k, v, o: m.attend(q, k, v, causal=True, offset=o), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for offset in (8, 3):
            torch.testing.assert_close(compiled(q, k, v, torch.tensor(offset)), m.attend(q, k, v, causal=True, offset=offset))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_non_strict_export_with_dynamic_lengths_gives_the_eager_bits(name):
    """``torch.export`` (non-strict, its default) with a ``Dim`` on each length: one program
    for every ``q_len <= k_len``. ``_xp.size`` had read the relative logits' lengths with
    ``int()``, which specializes a symbolic size (shaw, deberta, xl, tener, tupe, fire,
    sandwich, cope refused their ``Dim``), and KERPLE's in-place clamp of ``.data`` left a
    fake tensor among the program's constants."""
    from torch.export import Dim, export

    m = _make(name)
    q_len, k_len = Dim("q_len", min=1, max=30), Dim("k_len", min=1, max=30)
    program = export(_Logits(m), _qkv(5, 7)[:2], strict=False, dynamic_shapes=({2: q_len}, {2: k_len})).module()
    for lengths in ((1, 9), (4, 4), (30, 30)):
        q, k, _ = _qkv(*lengths)
        assert torch.equal(program(q, k), m.logits(q, k)), lengths


class _Logits(torch.nn.Module):
    """``module.logits(q, k)`` as a forward (what ``torch.export`` takes)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, q, k):
        return self.module.logits(q, k)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: pt.TransformerXLRelative(0, 8), ValueError, "num_heads"),
        (lambda: pt.TransformerXLRelative(2, 8, dim=7), ValueError, "dim"),
        (lambda: pt.TENERRelative(2, 7), ValueError, "dim"),
        (lambda: pt.TUPE(2, 8, max_positions=0), ValueError, "max_positions"),
        (lambda: pt.TUPE(2, 8, max_positions=8, untie_cls=1), TypeError, "untie_cls"),
        (lambda: pt.TUPE(2, 8, max_positions=8, bias=pt.NoPE()), TypeError, "bias must be a bias module"),
        (lambda: pt.XPos(7), ValueError, "dim"),
        (lambda: pt.XPos(8, scale_base=0), ValueError, "scale_base"),
        (lambda: pt.ALiBi(4, max_bias=-1.0), ValueError, "max_bias"),
        (lambda: pt.DeBERTaRelative(2, 8, max_distance=4, terms=("c2c",)), ValueError, "terms"),
        (lambda: pt.DeBERTaRelative(2, 8, max_distance=4, terms=()), ValueError, "terms"),
    ],
)
def test_bad_options_name_the_argument(make, error, words):
    with pytest.raises(error, match=words):
        make()


# --- per-token positions: the bias and relative-logits modules pass them to their functions ---

PACKED = torch.from_numpy(pe.positions_from_cu_seqlens(torch.tensor([0, 3, 9]).numpy(), 9))  # [9]: documents of 3 and 6
LEFT_PADDED = torch.from_numpy(pe.positions_from_mask(torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9]).numpy()))  # [2, 9]

# name -> reference logits(module, q, k, offset, query_positions, key_positions) from the public function
PER_TOKEN = {
    "t5": lambda m, q, k, o, qp, kp: _dot(q, k) + pe.t5_bias(m.table, q.shape[-2], k.shape[-2], max_distance=6, offset=o,
                                                          query_positions=qp, key_positions=kp),
    "alibi": lambda m, q, k, o, qp, kp: _dot(q, k) + pe.alibi_bias(m.slopes, q.shape[-2], k.shape[-2], offset=o,
                                                                query_positions=qp, key_positions=kp),
    "shaw": lambda m, q, k, o, qp, kp: pe.shaw_logits(q, k, m.table_k, max_distance=3, offset=o, query_positions=qp,
                                                   key_positions=kp) / math.sqrt(D),
    "deberta": lambda m, q, k, o, qp, kp: pe.deberta_logits(q, k, m.pos_q, m.pos_k, max_distance=3, offset=o,
                                                         query_positions=qp, key_positions=kp),
    "deberta_c2p": lambda m, q, k, o, qp, kp: pe.deberta_logits(q, k, None, m.pos_k, max_distance=3, bucket_size=4, max_position=16,
                                                             terms=("c2p",), offset=o, query_positions=qp, key_positions=kp),
    "fire": lambda m, q, k, o, qp, kp: _dot(q, k) + pe.fire_bias(m.mlp, q.shape[-2], k.shape[-2], offset=o, c=m.c, threshold=m.L_multiplier * 4.0,
                                                              query_positions=qp, key_positions=kp, xp=torch, dtype=torch.float64),
    "kerple": lambda m, q, k, o, qp, kp: _dot(q, k) + pe.kerple_bias(m.r1.clamp(min=0.01), m.r2.clamp(0.01, 2.0), q.shape[-2], k.shape[-2],
                                                                  kind="power", offset=o, query_positions=qp, key_positions=kp),
    "sandwich": lambda m, q, k, o, qp, kp: _dot(q, k) + pe.sandwich_bias(q.shape[-2], k.shape[-2], 16, heads=H, offset=o, query_positions=qp,
                                                                      key_positions=kp, xp=torch, dtype=torch.float64),
}
LAYOUTS = {  # (query_positions, key_positions, offset) for queries = the last 4 of 9 keys
    "packed": (PACKED[-4:], PACKED, None),
    "left-padded": (LEFT_PADDED[:, -4:], LEFT_PADDED, None),
    "keys only": (None, LEFT_PADDED, None),
    "offset shifts the queries": (PACKED[:4], PACKED, 2),
}


def _rel_of(qp, kp, offset):
    qp = torch.arange(5, 9) if qp is None else qp + (offset or 0)
    return qp[..., :, None] - kp[..., None, :]


def _shaw_reference_output(m, weights, v, rel):
    # sum_j w_ij (v_j + table_v[clip(rel_ij) + K]), the [.., q, k, d] tensor written out
    a = m.table_v[rel.clamp(-3, 3) + 3]  # [..., q, k, d]
    return weights @ v + torch.einsum("...hqk,...qkd->...hqd", weights, a)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(PER_TOKEN))
def test_per_token_positions_reach_the_function(name, layout):
    m = _make(name)
    q, k, v = _qkv(4, 9)
    qp, kp, offset = LAYOUTS[layout]
    with torch.no_grad():
        want = PER_TOKEN[name](m, q, k, offset, qp, kp)
        assert want.shape == (2, H, 4, 9)
        got = m.logits(q, k, offset=offset, query_positions=qp, key_positions=kp)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        # attend: causal by token order (query i sees keys j <= offset + i, offset=None: 5 + i), whatever the positions
        allowed = _rel(4, 9, 5 if offset is None else offset) >= 0
        weights = torch.softmax(want.masked_fill(~allowed, float("-inf")), -1)
        if name == "shaw":
            expected = _shaw_reference_output(m, weights, v, _rel_of(qp, kp, offset))
        else:
            expected = weights @ v
        got = m.attend(q, k, v, causal=True, offset=offset, query_positions=qp, key_positions=kp)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_per_token_bias_modules_forward_is_the_function():
    t5, alibi = _make("t5"), _make("alibi")
    with torch.no_grad():
        for qp, kp, offset in LAYOUTS.values():
            torch.testing.assert_close(
                t5(4, 9, offset=offset, query_positions=qp, key_positions=kp),
                pe.t5_bias(t5.table, 4, 9, max_distance=6, offset=offset, query_positions=qp, key_positions=kp), rtol=0, atol=0,
            )  # fmt: skip
            # ALiBi's formula written out: -slope_h * rel[..., i, j]
            want = -alibi.slopes[:, None, None] * _rel_of(qp, kp, offset)[..., None, :, :]
            torch.testing.assert_close(alibi(4, 9, offset=offset, query_positions=qp, key_positions=kp), want, rtol=0, atol=0)


def test_packed_decode_step_equals_the_last_row_of_the_full_call():
    q, k, v = _qkv(9, 9)
    same_doc = torch.tensor([0] * 3 + [1] * 6)
    mask = same_doc[:, None] == same_doc[None, :]
    for name in sorted(PER_TOKEN):
        m = _make(name)
        with torch.no_grad():
            full = m.attend(q, k, v, causal=True, mask=mask, query_positions=PACKED, key_positions=PACKED)
            step = m.attend(q[:, :, -1:], k, v, causal=True, mask=mask[-1:], query_positions=PACKED[-1:], key_positions=PACKED)
            torch.testing.assert_close(step, full[:, :, -1:], rtol=1e-12, atol=1e-12)


def test_per_token_positions_get_gradients_to_the_tables():
    for name in ("t5", "shaw", "deberta", "fire", "kerple"):
        m = _make(name)
        q, k, v = _qkv(4, 9)
        m.attend(q, k, v, causal=True, query_positions=LEFT_PADDED[:, -4:], key_positions=LEFT_PADDED).square().sum().backward()
        for p_name, p in m.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (name, p_name)


def test_modules_without_per_token_positions_refuse_them():
    q = torch.randn(1, H, 5, D)
    for name in ("rope", "xpos", "tupe", "xl", "none"):
        with pytest.raises(TypeError, match="takes no query_positions/key_positions"):
            _make(name).float().logits(q, q, key_positions=torch.arange(5))


ROW_MODULES = ("alibi", "cope", "deberta", "deberta_c2p", "fire", "kerple", "sandwich", "shaw", "t5", "tupe", "tupe_cls", "tupe_r")


def _assert_rows_are_the_calls_of_each_offset(m, calls, offsets, alone):
    """For each ``call(q, k, v, offset)`` of ``calls`` (module ``m``'s, on the float64 batch
    ``q, k, v`` of 4 rows it is given with): ``call(offsets)``, a tensor or int32 NumPy
    offsets, has row ``b`` equal to ``alone(call, b, offsets[b])`` to the bit, and its
    gradients are the loop of those calls'."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, H, n, D, dtype=torch.float64, generator=g, requires_grad=True) for n in (2, 9, 9))
    for call in calls:
        rows = call(q, k, v, offsets)
        assert rows.shape[0] == 4
        assert torch.equal(call(q, k, v, offsets.numpy().astype("int32")), rows)
        weights = torch.randn(rows.shape, dtype=torch.float64, generator=g)
        leaves = (q, k, v, *m.parameters())
        got = torch.autograd.grad((rows * weights).sum(), leaves, allow_unused=True)
        loop = 0
        for b, offset in enumerate(offsets.tolist()):
            one = alone(call, (q, k, v), b, offset)
            assert torch.equal(rows[b], one), b
            loop = loop + (one * weights[b]).sum()
        for grad, want in zip(got, torch.autograd.grad(loop, leaves, allow_unused=True)):
            assert (grad is None) == (want is None)
            if grad is not None:
                torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def _calls(m):
    """``logits`` and ``attend`` (causal or not) of module ``m`` as ``call(q, k, v, offset)``."""
    return [lambda q, k, v, o: m.logits(q, k, offset=o), *(lambda q, k, v, o, causal=causal: m.attend(q, k, v, causal=causal, offset=o) for causal in (False, True))]


@pytest.mark.parametrize("name", ROW_MODULES)
def test_modules_of_relative_biases_and_logits_take_one_offset_per_batch_row(name):
    """``logits`` and ``attend`` (causal or not) with one
    ``offset`` per batch row (a batch of caches of different lengths, as a tensor or a
    NumPy array): row ``b`` is the call with ``offset[b]`` to the bit, and the gradients
    are the loop of those calls'. They had been a ``TypeError``."""
    m = _make(name)
    _assert_rows_are_the_calls_of_each_offset(m, _calls(m), torch.tensor([4, 8, 0, 11]), lambda call, qkv, b, offset: call(*qkv, offset)[b])


def test_tener_takes_one_offset_per_batch_row_each_row_its_call_on_that_row_alone():
    """``TENERRelative``'s ``logits`` and ``attend`` (causal or not) with one ``offset`` per
    batch row (a tensor or a NumPy array): row ``b`` is the call on row ``b`` alone with
    ``offset[b]``, to the bit (``tener_logits`` makes one product per row; a one-offset
    call of the whole batch folds its rows into one product, which may round them apart),
    and the gradients are the loop of those calls'. It had been a ``TypeError``."""
    m = _make("tener")
    alone = lambda call, qkv, b, offset: call(*(t[b : b + 1] for t in qkv), offset)[0]  # noqa: E731
    _assert_rows_are_the_calls_of_each_offset(m, _calls(m), torch.tensor([4, 8, 0, 11]), alone)


def test_other_modules_refuse_one_offset_per_batch_row_and_bad_ones_are_refused_before_any_work():
    """The modules whose functions take one offset for every row (Transformer-XL; the
    absolute and rotary ones) refuse one per batch row naming those
    that take it. A float, boolean or mis-shaped ``offset``, or one whose query positions
    leave int64, is refused before any work."""
    q, k, v = _qkv(1, 9)
    offsets = torch.tensor([4, 8])
    for name in ("rope", "xl", "none"):
        with pytest.raises(TypeError, match=r"'s logits takes one offset for every row, got one of shape \(2,\): one per batch row is taken by .*T5RelativeBias"):
            _make(name).logits(q, k, offset=offsets)
    m = _make("t5")
    for offset, error, says in (
        (torch.tensor([4.0, 8.0]), TypeError, "offset must have an integer dtype, got torch.float32"),
        (torch.tensor([True, False]), TypeError, "offset must have an integer dtype, got torch.bool"),
        (torch.tensor([1, 2, 3]), ValueError, r"offset of shape \(3,\) \(one per batch row\) does not broadcast against the batch axes \(2,\)"),
        (torch.tensor([-(2**63), 0]), ValueError, r"offset \+ i - j must stay within int64"),
        ([4, 8], TypeError, "offset must be"),
    ):
        for call in (lambda o: m.logits(q, k, offset=o), lambda o: m.attend(q, k, v, causal=True, offset=o)):
            with pytest.raises(error, match=says):
                call(offset)
