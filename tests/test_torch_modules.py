"""posenc.torch modules and score_mod: same numbers as the functions, gradients through kernels
(bad arguments: test_bad_inputs.py)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc as pe  # noqa: E402
from posenc.torch import (  # noqa: E402
    ALiBi,
    DeBERTaRelative,
    LearnedEmbedding,
    RotaryEmbedding,
    ShawRelative,
    SinusoidalEmbedding,
    T5RelativeBias,
    score_mod,
)


def test_sinusoidal_embedding():
    m = SinusoidalEmbedding(16, layout="half")
    pos = torch.arange(10)
    torch.testing.assert_close(m(pos), torch.from_numpy(pe.sinusoidal(10, 16, layout="half")))


def test_learned_embedding_extend_keeps_trained_rows():
    m = LearnedEmbedding(8, 4)
    trained = m.weight.detach().clone()
    m.extend(40)
    assert m.weight.shape == (40, 4) and m.weight.requires_grad
    torch.testing.assert_close(m.weight[:8].detach(), trained, rtol=0, atol=0)
    m(torch.arange(40)).sum().backward()
    assert m.weight.grad.shape == (40, 4)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_embedding_matches_rope_and_gradcheck(layout):
    m = RotaryEmbedding(8, layout=layout, rotary_dim=6, scaling=pe.scaling.YaRN(4.0, 64))
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    rq, rk = m(q, k, offset=7)
    with torch.no_grad():
        expected = pe.rope(q.detach(), layout=layout, rotary_dim=6, offset=7, scaling=pe.scaling.YaRN(4.0, 64))
    torch.testing.assert_close(rq.detach(), expected)
    assert torch.autograd.gradcheck(lambda x: m.rotate(x, offset=7), (q,))


def test_rotary_embedding_from_hf_and_compile_fullgraph():
    m = RotaryEmbedding.from_hf({"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "original_max_position_embeddings": 8192,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}, head_dim=16)
    q = torch.randn(1, 2, 7, 16)
    compiled = torch.compile(lambda a: m(a, a), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q)[0], m(q, q)[0])


@pytest.mark.parametrize(
    "params, scaling",
    [
        ({"rope_type": "dynamic", "factor": 4.0}, pe.scaling.DynamicNTK(4.0, 32)),
        ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8, "original_max_position_embeddings": 32},
         pe.scaling.LongRoPE([1.0] * 8, [4.0] * 8, 32, factor=1.0)),
    ],
)
def test_rotary_embedding_decides_length_dependent_scalings_per_call(params, scaling):
    # Stateless: each call uses the frequencies of its own positions, exactly as pe.rope does,
    # also after a longer call and without seq_len.
    m = RotaryEmbedding.from_hf(params, head_dim=16, max_position_embeddings=32)
    q = torch.randn(1, 2, 48, 16, dtype=torch.float64)
    short = q[:, :, :20]
    for x in (q, short, q[:, :, :40], short):
        got, _ = m(x, x)
        torch.testing.assert_close(got, pe.rope(x, scaling=scaling), rtol=0, atol=1e-12)
    positions = torch.arange(30, 50)  # given positions decide too
    torch.testing.assert_close(m.rotate(short, positions), pe.rope(short, positions, scaling=scaling), rtol=0, atol=1e-12)
    # decoding one token at offset 47: the cache length decides, as for the prompt
    got, _ = m(q[:, :, -1:], q[:, :, -1:], offset=47)
    torch.testing.assert_close(got, pe.rope(q[:, :, -1:], offset=47, scaling=scaling), rtol=0, atol=1e-12)


def test_t5_bias_module_gradient_is_bucketed_scatter_add():
    m = T5RelativeBias(3, num_buckets=8, max_distance=16, bidirectional=False).double()
    bias = m(5, 7, offset=2)
    torch.testing.assert_close(bias.detach(), torch.from_numpy(pe.t5_bias(m.table.detach().numpy(), 5, 7, bidirectional=False, max_distance=16, offset=2)))
    weight = torch.randn_like(bias)
    (bias * weight).sum().backward()
    buckets = pe.t5_bucket(pe.relative_positions(5, 7, offset=2), bidirectional=False, num_buckets=8, max_distance=16)
    expected = np.zeros((8, 3))
    for h in range(3):
        np.add.at(expected[:, h], buckets.ravel(), weight[h].numpy().ravel())
    np.testing.assert_allclose(m.table.grad.numpy(), expected, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: pe.t5_bias(t, 4, 6, max_distance=16), (m.table.detach().requires_grad_(),))


def test_alibi_module():
    m = ALiBi(6)
    torch.testing.assert_close(m(3, 5, offset=2), torch.from_numpy(pe.alibi_bias(pe.alibi_slopes(6), 3, 5, offset=2)))


def test_bias_modules_are_built_on_the_default_device():
    # as their parameters are: `with torch.device("cuda"): model = ...` builds nothing on the CPU
    with torch.device("meta"):
        alibi, t5 = ALiBi(4), T5RelativeBias(4)
    assert alibi.slopes.device.type == "meta" and t5.table.device.type == "meta"
    torch.testing.assert_close(ALiBi(4).slopes, torch.from_numpy(pe.alibi_slopes(4)), rtol=0, atol=0)


def test_parameters_beyond_memory_are_refused_where_they_would_be_allocated():
    # On the meta device nothing is allocated (a module built there is materialised elsewhere):
    # only more bytes than int64 counts is refused (torch's "numel: integer multiplication overflow").
    with torch.device("meta"):
        assert LearnedEmbedding(10**12, 8).weight.shape == (10**12, 8)
        with pytest.raises(ValueError, match="LearnedEmbedding's weight of shape"):
            LearnedEmbedding(2**62, 4)
    with pytest.raises(ValueError, match="LearnedEmbedding's weight of shape .* more than the memory available"):
        LearnedEmbedding(10**12, 8)


def test_alibi_slopes_follow_the_options_through_dtype_moves_and_state_dicts():
    # The slopes are computed afresh in float64 for each dtype: the float32 buffer cast to
    # float64 was 3.6e-5 off the float64 bias at distance 3000 (12 heads).
    exact = pe.alibi_slopes(12, xp=torch, dtype=torch.float64)
    want = pe.alibi_bias(exact, 1, 3001)
    for module in (ALiBi(12).double(), ALiBi(12).half().float().double(), ALiBi(12).bfloat16().to(torch.float64)):
        torch.testing.assert_close(module(1, 3001), want, rtol=0, atol=0)
    torch.testing.assert_close(ALiBi(12).half().float().slopes, pe.alibi_slopes(12, xp=torch), rtol=0, atol=0)
    with torch.device("meta"):
        empty = ALiBi(12)
    torch.testing.assert_close(empty.to_empty(device="cpu").slopes, pe.alibi_slopes(12, xp=torch), rtol=0, atol=0)
    # Another max_bias's (or head count's) slopes are refused, strict or not; matching ones load, exact.
    for other in (ALiBi(12), ALiBi(8, max_bias=4.0)):
        with pytest.raises(RuntimeError, match="max_bias = 4.0"):
            ALiBi(12, max_bias=4.0).load_state_dict(other.state_dict(), strict=False)
    for saved in (ALiBi(12).state_dict(), {"slopes": ALiBi(12).slopes.double()}, ALiBi(12).bfloat16().state_dict()):
        module = ALiBi(12).double()
        module.load_state_dict(saved)
        torch.testing.assert_close(module.slopes, exact, rtol=0, atol=0)


def test_shaw_module_matches_naive_and_gradcheck():
    torch.manual_seed(0)
    m = ShawRelative(4, max_distance=2).double()
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    out = m(q, k, v, causal=True)
    idx = pe.clip_relative(pe.relative_positions(5, 5), 2)
    ak, av = m.table_k.detach()[idx], m.table_v.detach()[idx]  # [q, k, d] only in the test
    logits = (torch.einsum("bhqd,bhkd->bhqk", q, k) + torch.einsum("bhqd,qkd->bhqk", q, ak)) / math.sqrt(4)
    logits = logits.masked_fill(torch.from_numpy(pe.relative_positions(5, 5) < 0), float("-inf"))
    w = torch.softmax(logits, -1)
    expected = w @ v + torch.einsum("bhqk,qkd->bhqd", w, av)
    torch.testing.assert_close(out.detach(), expected)
    assert torch.autograd.gradcheck(lambda tk, tv: ShawRelative.forward(_with(m, tk, tv), q, k, v), (m.table_k, m.table_v))


def _with(module, table_k, table_v):
    clone = ShawRelative(4, max_distance=module.max_distance)
    clone.table_k, clone.table_v = table_k, table_v
    return clone


def test_deberta_module_matches_function_and_has_grads():
    m = DeBERTaRelative(2, 4, max_distance=3).double()
    q, k = torch.randn(2, 6, 4, dtype=torch.float64), torch.randn(2, 6, 4, dtype=torch.float64)
    out = m(q, k)
    torch.testing.assert_close(out.detach(), pe.deberta_logits(q, k, m.pos_q.detach(), m.pos_k.detach(), max_distance=3))
    out.sum().backward()
    assert m.pos_q.grad.abs().sum() > 0 and m.pos_k.grad.abs().sum() > 0


# flex_attention in eager mode runs its math reference and warns that it is not compiled.
@pytest.mark.filterwarnings("ignore:.*flex_attention.*:UserWarning")
@pytest.mark.parametrize("kind, params, options", [
    ("t5", lambda: torch.randn(32, 2), {}),
    ("alibi", lambda: torch.from_numpy(pe.alibi_slopes(2)), {"symmetric": True}),
    ("shaw", lambda: torch.randn(7, 2), {"max_distance": 3}),
])
def test_score_mod_equals_materialised_bias(kind, params, options):
    from torch.nn.attention.flex_attention import flex_attention

    p = params()
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    out = flex_attention(q, k, v, score_mod=score_mod(kind, p, 6, 6, offset=0, **options))
    bias = pe.relative_bias(kind, p, 6, 6, **options)
    torch.testing.assert_close(out, pe.attention(q, k, v, bias=bias), rtol=1e-5, atol=1e-5)


ROPE_PARAMETERS = {
    "default": {"rope_type": "default"},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0],
                 "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("rope", list(ROPE_PARAMETERS))
def test_rotary_inv_freq_and_attention_scale_equal_transformers(rope):
    # transformers' rotary module builds its buffer at the original length (dynamic,
    # longrope: the frequencies before any length-dependent switch), as ours reports them.
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {**ROPE_PARAMETERS[rope], "rope_theta": 500.0}
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, max_position_embeddings=64, rope_parameters=params)
    theirs, ours = LlamaRotaryEmbedding(config), RotaryEmbedding.from_hf(config)
    assert ours.inv_freq.dtype == torch.float64 and ours.inv_freq.shape == (4,)
    torch.testing.assert_close(ours.inv_freq.float(), theirs.inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_scale == pytest.approx(theirs.attention_scaling, rel=1e-6)
    inv_freq, scale = pe.rope_frequencies(8, base=500.0, scaling=ours.scaling)
    np.testing.assert_array_equal(ours.inv_freq.numpy(), inv_freq)
    assert ours.attention_scale == scale


def test_rotary_inv_freq_and_attention_scale_are_read_only():
    m = RotaryEmbedding(8, scaling=pe.scaling.YaRN(4.0, 64))
    assert m.attention_scale == pytest.approx(0.1 * math.log(4.0) + 1.0)  # YaRN's default temperature
    with pytest.raises(AttributeError):
        m.inv_freq = torch.ones(4)
    with pytest.raises(AttributeError):
        m.attention_scale = 2.0
    m.inv_freq.mul_(0)  # a copy: the module's frequencies stay
    torch.testing.assert_close(m.inv_freq, torch.from_numpy(pe.rope_frequencies(8, scaling=pe.scaling.YaRN(4.0, 64))[0]))


def test_learned_embedding_past_its_table_points_to_extend():
    m = LearnedEmbedding(16, 8)
    with pytest.raises(ValueError, match=r"num_positions = 16.*extend\(20\)"):
        m(torch.arange(20))
    with pytest.raises(ValueError, match="extend"):
        m.embed(torch.zeros(1, 4, 8), offset=14)
    with pytest.raises(ValueError, match="num_positions"):
        m(torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="integer"):
        m(torch.tensor([0.0, 1.0]))
    assert m.extend(20)(torch.arange(20)).shape == (20, 8)


def test_learned_embedding_under_vmap_equals_a_loop():
    # its range check read the batched positions' values: vmap's "calling .item()" RuntimeError
    m = LearnedEmbedding(16, 4)
    positions, x, offsets = torch.tensor([[1, 2, 3], [4, 5, 15]]), torch.randn(2, 3, 4), torch.tensor([0, 5])
    torch.testing.assert_close(torch.func.vmap(m)(positions), torch.stack([m(p) for p in positions]), rtol=0, atol=0)
    batched = torch.func.vmap(lambda row, o: m.embed(row[None], offset=o)[0])(x, offsets)
    torch.testing.assert_close(batched, torch.cat([m.embed(x[i : i + 1], offset=int(offsets[i])) for i in range(2)]), rtol=0, atol=0)


@pytest.mark.parametrize("module", [lambda: SinusoidalEmbedding(8), lambda: LearnedEmbedding(64, 8)], ids=["sinusoidal", "learned"])
def test_absolute_modules_add_the_offset_to_given_positions_as_rope_does(module):
    """``embed(x, positions, offset=o)`` embeds ``positions + o`` (the offset had been
    dropped where positions were given), per row too; a NumPy per-row offset is a host
    constant (it had raised inside NumPy), and a float or bool offset a ``TypeError``
    naming it (a fractional position had been embedded)."""
    m, x = module(), torch.randn(2, 5, 8)
    positions = torch.tensor([0, 3, 4, 9, 20])
    torch.testing.assert_close(m.embed(x, positions, offset=5), m.embed(x, positions + 5), rtol=0, atol=0)
    per_row = m.embed(x, positions, offset=np.array([1, 7]))
    for row, offset in enumerate((1, 7)):
        torch.testing.assert_close(per_row[row], m.embed(x[row : row + 1], positions + offset)[0], rtol=0, atol=0)
    torch.testing.assert_close(m.embed(x, offset=np.array([1, 7]))[1], m.embed(x[1:], offset=7)[0], rtol=0, atol=0)
    for bad in (1.5, torch.tensor([0.5, 2.5]), True):
        with pytest.raises(TypeError, match="offset must be an integer"):
            m.embed(x, offset=bad)


@pytest.mark.parametrize("module", [lambda: SinusoidalEmbedding(8), lambda: LearnedEmbedding(300, 8)], ids=["sinusoidal", "learned"])
def test_absolute_modules_add_an_offset_to_narrow_integer_positions_without_wrapping(module):
    """int8/uint8 positions plus an offset are the sums' rows, not the narrow dtype's wrapped
    ones (``int8 124 + 10`` had embedded position -122); a sum beyond int64 is refused."""
    m, x = module(), torch.randn(1, 4, 8)
    want = m.embed(x, torch.arange(134, 138))
    for positions in (torch.arange(124, 128, dtype=torch.int8), np.arange(124, 128, dtype=np.int8)):
        for offset in (10, np.int8(10), torch.tensor(10, dtype=torch.int8), torch.tensor([10], dtype=torch.uint8)):
            torch.testing.assert_close(m.embed(x, torch.as_tensor(positions), offset=offset), want, rtol=0, atol=0)
    torch.testing.assert_close(m.embed(x, torch.arange(4, dtype=torch.uint8), offset=torch.tensor(134, dtype=torch.uint8)), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="must stay within int64"):
        m.embed(x, torch.tensor([2**63 - 2] * 4), offset=5)


def test_learned_embedding_takes_every_integer_dtype_and_checks_alpha_and_extend_now():
    """Narrow and unsigned integer positions read the rows of their values (torch's
    embedding had raised on them); ``alpha`` is checked when the module is built, and
    ``extend`` to fewer rows is a ``ValueError`` (it had silently dropped trained rows)."""
    m = LearnedEmbedding(300, 4)
    want = m(torch.tensor([5, 100, 127]))
    for dtype in (torch.int8, torch.int16, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int32):
        torch.testing.assert_close(m(torch.tensor([5, 100, 127], dtype=dtype)), want, rtol=0, atol=0)
    with pytest.raises(TypeError, match="integer tensor"):
        m(torch.tensor([True]))
    with pytest.raises(ValueError, match="alpha"):
        LearnedEmbedding(4, 2, alpha=1.0)
    with pytest.raises(ValueError, match="length must be >= num_positions = 300"):
        m.extend(16)
    assert m.num_positions == 300
    with pytest.raises(TypeError, match="dtype"):
        SinusoidalEmbedding(8, dtype=torch.int32)


def test_learned_embedding_extend_replaces_the_parameter_the_optimizer_must_be_rebuilt():
    m = LearnedEmbedding(4, 2)
    old = m.weight
    optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
    m.extend(8)
    assert m.weight is not old and "optimizer" in LearnedEmbedding.extend.__doc__
    m(torch.arange(8)).sum().backward()
    before = m.weight.detach().clone()
    optimizer.step()  # the old optimizer holds the old Parameter: the new table does not move
    torch.testing.assert_close(m.weight.detach(), before, rtol=0, atol=0)
    torch.optim.SGD(m.parameters(), lr=1.0).step()  # rebuilt: it does
    torch.testing.assert_close(m.weight.detach(), before - 1.0, rtol=0, atol=0)


def test_bias_modules_align_the_queries_with_the_last_keys_by_default():
    t5, alibi = T5RelativeBias(2, num_buckets=8, max_distance=16), ALiBi(2, max_bias=4.0)
    table = t5.table.detach().numpy()
    np.testing.assert_allclose(t5(3, 7).detach().numpy(), pe.t5_bias(table, 3, 7, max_distance=16, offset=4))
    np.testing.assert_allclose(alibi(3, 7).numpy(), pe.alibi_bias(pe.alibi_slopes(2, max_bias=4.0), 3, 7, offset=4))
    np.testing.assert_allclose(alibi(3, 7, offset=0).numpy(), pe.alibi_bias(pe.alibi_slopes(2, max_bias=4.0), 3, 7, offset=0))


def test_xpos_16_bit_logits_stay_finite_far_from_the_centre():
    from posenc.torch import XPos

    q, k = torch.randn(1, 2, 1, 8, dtype=torch.float64), torch.randn(1, 2, 20000, 8, dtype=torch.float64)
    got = XPos(8).logits(q.half(), k.half())
    assert got.dtype == torch.float16
    # float64 reference, positions not centred: zeta**(-20000/512) ~ 5e-22 is in float64's range
    zq = pe.xpos_scale(torch.tensor([19999.0], dtype=torch.float64), 8)
    zk = pe.xpos_scale(torch.arange(20000, dtype=torch.float64), 8)
    expected = (pe.rope(q.half().double(), offset=19999) * zq) @ (pe.rope(k.half().double()) / zk).transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(got.double(), expected, rtol=1e-2, atol=2e-3)


def test_rotary_module_rotates_along_the_sequence_axis_when_heads_equal_seq():
    # [batch, heads, seq, dim] with heads == seq: pe.rope alone would ask for seq_axis; the module states it
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 4, 4, 8, dtype=torch.float64)
    positions = torch.tensor([[3, 4, 5, 6], [0, 1, 2, 3]])
    got = rope.rotate(x, positions)
    want = pe.rope(x, positions[:, None, :, None].expand(2, 4, 4, 1)[..., 0], seq_axis="bhsd")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got[1], pe.rope(x[1], positions[1], seq_axis=-2), rtol=0, atol=0)
