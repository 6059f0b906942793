"""A named table of bad inputs across every family: each raises ValueError/TypeError naming
the argument, before anything is computed."""

import numpy as np
import pytest

import posenc as pe

X = np.zeros((2, 3, 5, 8), dtype=np.float32)
Q = np.zeros((2, 4, 8))
K = np.zeros((2, 6, 8))
T5_TABLE = np.zeros((32, 2))
SLOPES = np.ones(2)

CASES = {
    # absolute
    "sinusoidal odd dim": (lambda: pe.sinusoidal(4, 7), ValueError, "dim"),
    "sinusoidal negative length": (lambda: pe.sinusoidal(-3, 8), ValueError, "positions"),
    "sinusoidal unknown layout": (lambda: pe.sinusoidal(4, 8, layout="diagonal"), ValueError, "layout"),
    "sinusoidal zero base": (lambda: pe.sinusoidal(4, 8, base=0.0), ValueError, "base"),
    "sinusoidal nan positions": (lambda: pe.sinusoidal(np.array([1.0, np.nan]), 8), ValueError, "positions"),
    "sinusoidal integer dtype": (lambda: pe.sinusoidal(4, 8, dtype=np.int32), TypeError, "dtype"),
    "hierarchical beyond n*n": (lambda: pe.hierarchical_extend(np.zeros((4, 2)), 17), ValueError, "length"),
    "hierarchical alpha 1": (lambda: pe.hierarchical_extend(np.zeros((4, 2)), 8, alpha=1.0), ValueError, "alpha"),
    "floater zero substeps": (lambda: pe.floater(4, 8, substeps=0), ValueError, "substeps"),
    "floater dynamics not callable": (lambda: pe.floater(4, 8, dynamics="rk4"), TypeError, "dynamics"),
    "apply_absolute table too short": (lambda: pe.apply_absolute(np.zeros((5, 8)), np.zeros((6, 8)), offset=2), ValueError, "table"),
    "apply_absolute unknown mode": (lambda: pe.apply_absolute(np.zeros((5, 8)), np.zeros((6, 8)), mode="concat"), ValueError, "mode"),
    "apply_absolute integer x": (lambda: pe.apply_absolute(np.zeros((5, 8), dtype=int), np.zeros((6, 8))), TypeError, "x"),
    "complex_order mismatched shapes": (lambda: pe.complex_order(np.ones(4), np.ones(3), np.ones(4), np.arange(2)), ValueError, "broadcast"),
    "conv even kernel width": (lambda: pe.conv_positions(np.zeros((5, 4)), np.zeros((2, 4))), ValueError, "kernel"),
    "mixed array kinds": (lambda: pe.apply_absolute(np.zeros((5, 8)), _torch_zeros(6, 8)), TypeError, "different kinds"),
    # relative
    "relative_positions negative q_len": (lambda: pe.relative_positions(-1, 3), ValueError, "q_len"),
    "relative_positions float k_len": (lambda: pe.relative_positions(2, 3.5), TypeError, "k_len"),
    "clip_relative float rel": (lambda: pe.clip_relative(np.array([0.5]), 4), TypeError, "rel"),
    "clip_relative negative K": (lambda: pe.clip_relative(np.arange(3), -1), ValueError, "max_distance"),
    "t5_bucket float rel": (lambda: pe.t5_bucket(np.array([1.5])), TypeError, "rel"),
    "t5_bucket one bucket": (lambda: pe.t5_bucket(np.arange(3), num_buckets=1), ValueError, "num_buckets"),
    "t5_bucket odd buckets bidirectional": (lambda: pe.t5_bucket(np.arange(3), num_buckets=31), ValueError, "num_buckets"),
    "t5_bucket max_distance too small": (lambda: pe.t5_bucket(np.arange(3), num_buckets=32, max_distance=16), ValueError, "max_distance"),
    "t5_bias table 1-D": (lambda: pe.t5_bias(np.zeros(32), 4, 4), ValueError, "table"),
    "t5_bias negative k_len": (lambda: pe.t5_bias(T5_TABLE, 4, -4), ValueError, "k_len"),
    "t5_bias out wrong shape": (lambda: pe.t5_bias(T5_TABLE, 4, 4, out=np.zeros((2, 4, 5))), ValueError, "out"),
    "t5_bias out wrong dtype": (lambda: pe.t5_bias(T5_TABLE, 4, 4, out=np.zeros((2, 4, 4), dtype=np.float32)), ValueError, "out"),
    "t5_bias too large": (lambda: pe.t5_bias(T5_TABLE, 10**6, 10**6), ValueError, "memory"),
    "deberta_bucket bucket_size 1": (lambda: pe.deberta_bucket(np.arange(3), bucket_size=1), ValueError, "bucket_size"),
    "alibi_slopes zero heads": (lambda: pe.alibi_slopes(0), ValueError, "num_heads"),
    "alibi_slopes float heads": (lambda: pe.alibi_slopes(4.0), TypeError, "num_heads"),
    "alibi_bias integer slopes": (lambda: pe.alibi_bias(np.ones(2, dtype=int), 3, 3), TypeError, "slopes"),
    "alibi_bias too large": (lambda: pe.alibi_bias(np.ones(4), 2**40, 2**40), ValueError, "memory"),
    "alibi_bias positions do not broadcast": (
        lambda: pe.alibi_bias(SLOPES, 3, 3, query_positions=np.zeros((2, 3), dtype=int), key_positions=np.zeros((4, 3), dtype=int)),
        ValueError,
        "key_positions",
    ),
    "alibi_slopes zero max_bias": (lambda: pe.alibi_slopes(4, max_bias=0.0), ValueError, "max_bias"),
    "deberta_logits terms not a subset": (
        lambda: pe.deberta_logits(Q, K, np.zeros((2, 6, 8)), np.zeros((2, 6, 8)), max_distance=3, terms=("c2p", "p2p")), ValueError, "terms",
    ),
    "relative_bias_vector unknown kind": (lambda: pe.relative_bias_vector("rotary", SLOPES, 3, 3), ValueError, "kind"),
    "shaw_logits head dim mismatch": (lambda: pe.shaw_logits(Q, np.zeros((2, 6, 7)), np.zeros((5, 8)), max_distance=2), ValueError, "k"),
    "shaw_logits table rows": (lambda: pe.shaw_logits(Q, K, np.zeros((4, 8)), max_distance=2), ValueError, "table_k"),
    "rel_shift 1-D": (lambda: pe.rel_shift(np.zeros(4)), ValueError, "x"),
    "deberta_logits pos rows": (lambda: pe.deberta_logits(Q, K, np.zeros((2, 5, 8)), np.zeros((2, 6, 8)), max_distance=3), ValueError, "pos_q"),
    "tupe_logits bad cls": (lambda: pe.tupe_logits(Q, K, np.zeros((6, 8)), np.eye(8), np.eye(8), cls=3.0), TypeError, "cls"),
    # rotary
    "rope integer x": (lambda: pe.rope(np.zeros((3, 8), dtype=np.int32)), TypeError, "x"),
    "rope odd rotary_dim": (lambda: pe.rope(X, rotary_dim=5), ValueError, "rotary_dim"),
    "rope rotary_dim too big": (lambda: pe.rope(X, rotary_dim=10), ValueError, "rotary_dim"),
    "rope odd head dim": (lambda: pe.rope(np.zeros((3, 7), dtype=np.float32)), ValueError, "rotary_dim"),
    "rope positions do not broadcast": (lambda: pe.rope(X, positions=np.arange(4)), ValueError, "positions"),
    "rope non-finite positions": (lambda: pe.rope(X, positions=np.full(5, np.inf)), ValueError, "positions"),
    "rope unknown layout": (lambda: pe.rope(X, layout="quarter"), ValueError, "layout"),
    "rope out wrong dtype": (lambda: pe.rope(X, out=np.zeros(X.shape)), ValueError, "out"),
    "rope out other namespace": (lambda: pe.rope(X, out=_torch_zeros(*X.shape)), TypeError, "out"),
    "rope out overlaps x": (lambda: pe.rope(X, out=X[:, ::-1]), ValueError, "overlaps"),
    "rope torch out overlaps x": (lambda: _overlapping_torch_rope(), ValueError, "overlaps"),
    "apply_rope cos/sin mismatch": (lambda: pe.apply_rope(X, np.ones((5, 6)), np.ones((5, 4))), ValueError, "sin"),
    "rope_frequencies odd dim": (lambda: pe.rope_frequencies(7), ValueError, "dim"),
    "linear scaling factor 0": (lambda: pe.scaling.Linear(0.0), ValueError, "factor"),
    "yarn negative factor": (lambda: pe.scaling.YaRN(-2.0, 4096), ValueError, "factor"),
    "longrope wrong list length": (lambda: pe.rope_frequencies(8, scaling=pe.scaling.LongRoPE([1.0] * 3, [1.0] * 3, 4096)), ValueError, "factor"),
    "from_hf unknown rope_type": (lambda: pe.scaling.from_hf({"rope_type": "spiral"}, head_dim=64), ValueError, "rope_type"),
    "from_hf yarn without factor": (
        lambda: pe.scaling.from_hf({"rope_type": "yarn", "original_max_position_embeddings": 64}, head_dim=64), ValueError, "factor",
    ),
    "from_hf unknown layer_type": (
        lambda: pe.scaling.from_hf({"full_attention": {}, "sliding_attention": {}}, head_dim=64, layer_type="local"), ValueError, "layer_type",
    ),
    "from_hf nested without layer_type": (lambda: pe.scaling.from_hf({"full_attention": {}}, head_dim=64), ValueError, "layer_type"),
    "mrope_cos_sin sections do not sum": (lambda: pe.mrope_cos_sin(np.zeros((3, 4), dtype=int), [1.0] * 4, [1, 1, 1]), ValueError, "sections"),
    "rope offset 0-d float array": (lambda: pe.rope(X, offset=np.asarray(2.0)), TypeError, "offset"),
    "rope seq_len 1-d array": (lambda: pe.rope(X, scaling=pe.scaling.DynamicNTK(2.0, 4), seq_len=np.arange(2)), TypeError, "seq_len"),
    "positions_from_mask 1-D float": (lambda: pe.positions_from_mask(np.array([0.5, 1.0])), TypeError, "mask"),
    "positions_from_cu_seqlens decreasing": (lambda: pe.positions_from_cu_seqlens(np.array([0, 5, 3]), 5), ValueError, "cu_seqlens"),
    "convert_layout same name typo": (lambda: pe.convert_layout(X, "half", "interleave"), ValueError, "dst"),
    "permute_qk_weight rows": (lambda: pe.permute_qk_weight(np.zeros((10, 4)), "interleaved", "half", head_dim=8), ValueError, "w"),
    "rope_decay odd dim": (lambda: pe.rope_decay(10, 7), ValueError, "dim"),
    "linear_attention unknown feature map": (lambda: pe.linear_attention(Q, K, K, feature_map="relu6"), ValueError, "feature_map"),
    "xpos_scale zero scale_base": (lambda: pe.xpos_scale(np.arange(4), 8, scale_base=0), ValueError, "scale_base"),
    # attention and configuration
    "attention bias shape": (lambda: pe.attention(Q, K, K, bias=np.zeros((3, 4, 6))), ValueError, "bias"),
    "set_backend unknown": (lambda: pe.set_backend("cuda"), ValueError, "backend"),
}


def _overlapping_torch_rope():
    t = _torch_zeros(2, 6, 8)
    return pe.rope(t[:, :5], out=t[:, 1:])


def _torch_zeros(*shape):
    torch = pytest.importorskip("torch")
    return torch.zeros(*shape)


def test_table_has_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name):
    call, error, fragment = CASES[name]
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert fragment in message, f"{name}: message {message!r} does not name {fragment!r}"
