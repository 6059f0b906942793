"""A decode step gives the numbers of one long call, and bad input the same error, planned or not.

``posenc._plans`` serves repeated call signatures from a plan built after the first
(validated) call. Every decode-step row here is computed in a loop of calls of one signature (its first two
calls take the full path, later ones the plan) and compared with the same row of one
long call, bit for bit, in every float dtype (API.md, Conventions: results do not depend
on the size of a call). Hostile input is given after a plan of the same function exists,
twice, and must raise the same error both times.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from formulas import exact_rope
from posenc import _plans

torch = pytest.importorskip("torch")
try:
    from ml_dtypes import bfloat16 as NUMPY_BFLOAT16  # NumPy's bfloat16, where installed
except ImportError:
    NUMPY_BFLOAT16 = None
NUMPY_DTYPES = [np.float16, np.float32, np.float64, *[NUMPY_BFLOAT16] * (NUMPY_BFLOAT16 is not None)]
TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LENGTH, HEADS, DIM = 9, 4, 16
STEPS = (0, 1, 5, LENGTH - 1)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _twice(fn):
    """The full path's result and the plan's, which must be equal."""
    first, second = fn(), fn()
    _same(first, second)
    return second


def _x(library, dtype, shape=(1, HEADS, LENGTH, DIM), seed=0):
    x = np.random.default_rng(seed).standard_normal(shape)
    return torch.from_numpy(x).to(dtype) if library == "torch" else x.astype(dtype)


CASES = [("numpy", d) for d in NUMPY_DTYPES] + [("torch", d) for d in TORCH_DTYPES]


@pytest.mark.parametrize("library, dtype", CASES, ids=str)
def test_rope_decode_rows_equal_the_long_call(library, dtype):
    x = _x(library, dtype)
    for layout in ("half", "interleaved"):
        full = pe.rope(x, layout=layout)
        for t in STEPS:
            _same(_twice(lambda: pe.rope(x[:, :, t : t + 1], offset=t, layout=layout)), full[:, :, t : t + 1])


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("given", ["positions [1]", "positions [1, 1]", "offset 0-d", "offset [1]"])
def test_one_position_for_a_query_whose_batch_and_heads_do_not_merge(library, given):
    """q of a fused projection (``qkv[:, :, 0]`` in ``[b, h, 1, d]``): its batch and head axes
    are one kernel axis no longer, so its one position is read at several cells of the
    kernel's grid (a plan reshaped it to the grid and raised from the third call)."""
    qkv = np.random.default_rng(1).standard_normal((3, 1, 3, HEADS, DIM))
    q = (torch.from_numpy(qkv) if library == "torch" else qkv)[:, :, 0].swapaxes(1, 2)
    wrap = torch.tensor if library == "torch" else np.array
    arguments = {
        "positions [1]": lambda t: {"positions": wrap([t])},
        "positions [1, 1]": lambda t: {"positions": wrap([[t]])},
        "offset 0-d": lambda t: {"offset": wrap(t)},
        "offset [1]": lambda t: {"offset": wrap([t])},
    }[given]
    first = pe.rope(q, **arguments(9))
    for t in (9, 10, 11, 12, 2**20):  # (a float64 angle near 2**20 is within 2**-33 of the exact one)
        got = pe.rope(q, **arguments(t))
        np.testing.assert_allclose(np.asarray(got), exact_rope(np.asarray(q), np.array([t])), rtol=0, atol=1e-9)
        if t == 9:
            _same(got, first)


@pytest.mark.parametrize("library, dtype", CASES, ids=str)
def test_apply_rope_decode_rows_equal_the_long_call(library, dtype):
    x = _x(library, dtype)
    xp_positions = torch.arange(LENGTH) if library == "torch" else np.arange(LENGTH)
    cos, sin = pe.rope_cos_sin(xp_positions, pe.rope_frequencies(DIM)[0], dtype=dtype)
    full = pe.apply_rope(x, cos, sin)
    for t in STEPS:
        _same(_twice(lambda: pe.apply_rope(x[:, :, t : t + 1], cos[t : t + 1], sin[t : t + 1])), full[:, :, t : t + 1])
        _same(_twice(lambda: pe.rope_cos_sin(xp_positions[t : t + 1], pe.rope_frequencies(DIM)[0], dtype=dtype)[0]), cos[t : t + 1])


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_hugging_face_drop_in_decode_rows_equal_the_long_call(dtype):
    from transformers import LlamaConfig

    from posenc.torch.hf import HFRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=HEADS * DIM, num_attention_heads=HEADS, num_key_value_heads=2)
    rotary = HFRotaryEmbedding(config)
    q, k = _x("torch", dtype), _x("torch", dtype, (1, 2, LENGTH, DIM), seed=1)
    cos, sin = rotary(q, torch.arange(LENGTH)[None])
    full_q, full_k = apply_rotary_pos_emb(q, k, cos, sin)
    # The module's position-keyed rows are the ones computed afresh, also past the rows it first kept.
    inv_freq, scale = pe.rope_frequencies(DIM, base=config.rope_parameters["rope_theta"])
    for ids in (torch.arange(LENGTH)[None], torch.tensor([[3, 70, 200]]), torch.tensor([[5]])):
        fresh = pe.rope_cos_sin(ids, inv_freq, dtype=dtype, scale=scale)
        for got, want in zip(rotary(q, ids), fresh):
            _same(got, want)
    for t in STEPS:
        c, s = _twice(lambda: rotary(q, torch.tensor([[t]]))[0]), _twice(lambda: rotary(q, torch.tensor([[t]]))[1])
        _same(c, cos[:, t : t + 1])
        _same(s, sin[:, t : t + 1])
        _same(_twice(lambda: apply_rotary_pos_emb(q[:, :, t : t + 1], k[:, :, t : t + 1], c, s)[0]), full_q[:, :, t : t + 1])
        _same(_twice(lambda: apply_rotary_pos_emb(q[:, :, t : t + 1], k[:, :, t : t + 1], c, s)[1]), full_k[:, :, t : t + 1])


def test_rows_kept_between_calls_are_the_rows_computed_afresh_across_sets_and_evictions():
    """``posenc.torch.hf.cached_rows`` keeps a few row sets (frequencies, scale, dtype): more
    sets than it keeps, revisited and grown, read the rows ``rope_cos_sin`` computes afresh."""
    from posenc.torch import hf

    sets = [(pe.rope_frequencies(16, base=base)[0], scale) for base in (100.0, 1e4, 5e5) for scale in (1.0, 1.25, 0.5)]
    for round_ in range(2):
        for i, (inv_freq, scale) in enumerate(sets):
            ids = torch.tensor([[3, 70 + 300 * round_ + i]])
            for dtype in (torch.bfloat16, torch.float32):
                got = hf.cached_rows(tuple(inv_freq.tolist()), scale, dtype, ids)
                for table, want in zip(got, pe.rope_cos_sin(ids, inv_freq, dtype=dtype, scale=scale)):
                    _same(table, want)
            assert len(hf._ROWS) <= hf._MOST_CACHED_SETS
    assert hf.cached_rows(tuple(sets[0][0].tolist()), 1.0, torch.float32, torch.tensor([[1 << 16]])) is None
    assert hf.cached_rows(tuple(sets[0][0].tolist()), 1.0, torch.float32, torch.tensor([[-1]])) is None


def test_rows_read_at_a_0d_position_are_the_callers_own():
    """A 0-d ``position_ids`` reads tensors of its own from the kept rows, by the function
    and through ``HFRotaryEmbedding`` (indexing by a 0-d tensor gives a view: a caller's
    ``cos.mul_(0)`` had zeroed position 3 for every later call, other modules' too)."""
    from transformers import LlamaConfig

    from posenc.torch import hf

    inv_freq = tuple(pe.rope_frequencies(8)[0].tolist())
    want = hf.cached_rows(inv_freq, 1.0, torch.float32, torch.tensor([3]))
    for table in hf.cached_rows(inv_freq, 1.0, torch.float32, torch.tensor(3)):
        table.mul_(0)
    for table in hf.stacked_tables(inv_freq, 1.0, torch.float32, torch.tensor(3)):
        table.mul_(0)
    rotary = hf.HFRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4))
    for table in rotary(torch.zeros(1, 1, 8), torch.tensor(3)):
        table.mul_(0)
    for got, expected in zip(hf.cached_rows(inv_freq, 1.0, torch.float32, torch.tensor([3])), want):
        _same(got, expected)
    assert float(want[0].abs().min()) > 0


def _tables(library, dtype):
    rng = np.random.default_rng(2)
    table, slopes = rng.standard_normal((32, HEADS)), pe.alibi_slopes(HEADS, dtype=np.float64)
    if library == "torch":
        return torch.from_numpy(table).to(dtype), torch.from_numpy(slopes).to(dtype)
    return table.astype(dtype), slopes.astype(dtype)


BIASES = {
    "t5_bias": lambda table, slopes, q, k, offset: pe.t5_bias(table, q, k, offset=offset),
    "t5_bias decoder": lambda table, slopes, q, k, offset: pe.t5_bias(table, q, k, offset=offset, bidirectional=False, max_distance=20),
    "relative_bias t5": lambda table, slopes, q, k, offset: pe.relative_bias("t5", table, q, k, offset=offset),
    "alibi_bias": lambda table, slopes, q, k, offset: pe.alibi_bias(slopes, q, k, offset=offset),
    "alibi_bias symmetric": lambda table, slopes, q, k, offset: pe.alibi_bias(slopes, q, k, offset=offset, symmetric=True),
    "vector + expand": lambda table, slopes, q, k, offset: pe.expand_bias(pe.relative_bias_vector("t5", table, q, k, offset=offset), q, k),
    "relative_bias shaw": lambda table, slopes, q, k, offset: pe.relative_bias("shaw", table[:7], q, k, offset=offset, max_distance=3),
    "relative_bias deberta": lambda table, slopes, q, k, offset: pe.relative_bias("deberta", table[:8], q, k, offset=offset, max_distance=4),
    "relative_bias deberta buckets": lambda table, slopes, q, k, offset: pe.relative_bias(
        "deberta", table, q, k, offset=offset, max_distance=16, bucket_size=8, max_position=64
    ),
}


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("library, dtype", CASES, ids=str)
def test_bias_decode_rows_equal_the_long_call(library, dtype, name):
    table, slopes = _tables(library, dtype)
    bias = BIASES[name]
    full = bias(table, slopes, LENGTH, LENGTH, 0)
    for t in STEPS:
        _same(_twice(lambda: bias(table, slopes, 1, t + 1, t)), full[:, t : t + 1, : t + 1])
        # the same row with keys running on past the query (an encoder's bidirectional row)
        _same(_twice(lambda: bias(table, slopes, 1, LENGTH, t)), full[:, t : t + 1])


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("library, dtype", [("numpy", np.float32), ("torch", torch.bfloat16)], ids=str)
def test_planned_bias_rows_at_any_offset_equal_the_full_path(library, dtype, name):
    """A bias plan keeps the per-distance values it has met: offsets that jump far ahead,
    back, below zero and past what it holds give the rows of a two-query call (the full path)."""
    table, slopes = _tables(library, dtype)
    bias = BIASES[name]
    _twice(lambda: bias(table, slopes, 1, 40, 39))  # the signature is planned
    for offset in (3, 39, 100_000, 5, -60, 2**40, 41):
        for k_len in (1, 40, 300):
            _same(bias(table, slopes, 1, k_len, offset), bias(table, slopes, 2, k_len, offset)[..., :1, :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bias_modules_decode_rows_equal_the_long_call(dtype):
    from posenc.torch import ALiBi, T5RelativeBias

    for module in (T5RelativeBias(HEADS).to(dtype), ALiBi(HEADS).to(dtype)):
        with torch.no_grad():
            full = module(LENGTH, LENGTH)
            for t in STEPS:
                _same(_twice(lambda: module(1, t + 1, offset=t)), full[:, t : t + 1, : t + 1])


# ---------------------------------------------------------------- bad input, cold and planned

X = np.zeros((1, HEADS, 1, DIM), np.float32)
COS, SIN = pe.rope_cos_sin(np.array([3]), pe.rope_frequencies(DIM)[0], dtype=np.float32)
TABLE, SLOPES = np.zeros((32, HEADS), np.float32), pe.alibi_slopes(HEADS)

T_Q, T_K = torch.zeros(1, HEADS, 1, DIM), torch.zeros(1, 2, 1, DIM)
T_COS, T_SIN = (torch.from_numpy(t)[None] for t in (COS, SIN))


def _hf_apply(*args, **kwargs):
    from posenc.torch.hf import apply_rotary_pos_emb

    return apply_rotary_pos_emb(*args, **kwargs)


# name: (a good call that plans the signature, the hostile call)
HOSTILE = {
    "rope integer x": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X.astype(np.int32), offset=3)),
    "rope float offset": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3.5)),
    "rope bool offset": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=True)),
    "rope odd rotary_dim": (lambda: pe.rope(X, offset=3, rotary_dim=4), lambda: pe.rope(X, offset=3, rotary_dim=5)),
    "rope layout": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3, layout="diagonal")),
    "rope feature seq_axis": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3, seq_axis=-1)),
    "rope negative base": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3, base=-1.0)),
    "rope unknown keyword": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3, offest=2)),
    "rope huge offset": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=2**70)),
    "rope offset past int64": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X[:, :, :1].repeat(3, 2), offset=2**63 - 2)),
    "rope int64 positions past int64 by an int32 offset tensor": (
        lambda: pe.rope(T_Q, torch.tensor([5]), offset=torch.tensor(1, dtype=torch.int32)),
        lambda: pe.rope(T_Q, torch.tensor([2**63 - 1]), offset=torch.tensor(1, dtype=torch.int32)),
    ),
    "t5_bias huge offset": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8, offset=-(2**64))),
    "t5_bias distances below int64": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8, offset=-(2**63) + 3)),
    "alibi_bias distances below int64": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7), lambda: pe.alibi_bias(SLOPES, 1, 8, offset=-(2**63))),
    "relative_bias_vector distances below int64": (
        lambda: pe.relative_bias_vector("alibi", SLOPES, 1, 8, offset=7),
        lambda: pe.relative_bias_vector("alibi", SLOPES, 1, 8, offset=-(2**63) + 6),
    ),
    "apply_rope cos/sin shapes": (lambda: pe.apply_rope(X, COS, SIN), lambda: pe.apply_rope(X, COS, SIN[..., :8])),
    "apply_rope odd width": (lambda: pe.apply_rope(X, COS, SIN), lambda: pe.apply_rope(X, COS[..., :3], SIN[..., :3])),
    "apply_rope integer cos": (lambda: pe.apply_rope(X, COS, SIN), lambda: pe.apply_rope(X, COS.astype(np.int64), SIN)),
    "apply_rope layout": (lambda: pe.apply_rope(X, COS, SIN), lambda: pe.apply_rope(X, COS, SIN, layout=None)),
    "rope_cos_sin non-finite inv_freq": (
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5])),
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, np.nan])),
    ),
    "rope_cos_sin non-finite positions": (
        lambda: pe.rope_cos_sin(np.array([3.0]), np.array([1.0, 0.5])),
        lambda: pe.rope_cos_sin(np.array([np.inf]), np.array([1.0, 0.5])),
    ),
    "rope_cos_sin 3-d inv_freq": (  # 2-d: a frequency set per row
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5])),
        lambda: pe.rope_cos_sin(np.array([3]), np.array([[[1.0, 0.5]]])),
    ),
    "rope_cos_sin integer dtype": (
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5])),
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5]), dtype=np.int32),
    ),
    "rope unhashable base": (lambda: pe.rope(X, offset=3), lambda: pe.rope(X, offset=3, base=[10000.0])),
    "t5_bias negative k_len": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, -1, offset=7)),
    "t5_bias float k_len": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8.0, offset=7)),
    "t5_bias string offset": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8, offset="7")),
    "t5_bias 1-d table": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE[:, 0], 1, 8, offset=7)),
    "t5_bias max_distance": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8, offset=7, max_distance=0)),
    "t5_bias too large": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 2**50, offset=7)),
    "t5_bias bidirectional 1": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, 8, offset=7, bidirectional=1)),
    "t5_bias bool k_len": (lambda: pe.t5_bias(TABLE, 1, 8, offset=7), lambda: pe.t5_bias(TABLE, 1, True, offset=7)),
    "alibi_bias bool offset": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7), lambda: pe.alibi_bias(SLOPES, 1, 8, offset=False)),
    "alibi_bias integer slopes": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7), lambda: pe.alibi_bias(SLOPES.astype(np.int32), 1, 8, offset=7)),
    "rope_cos_sin string scale": (
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5]), dtype=np.float32),
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5]), dtype=np.float32, scale="2"),
    ),
    "rope_cos_sin array dtype": (
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5]), dtype=np.float32),
        lambda: pe.rope_cos_sin(np.array([3]), np.array([1.0, 0.5]), dtype=np.zeros(2)),
    ),
    "alibi_bias 2-d slopes": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7), lambda: pe.alibi_bias(SLOPES[None], 1, 8, offset=7)),
    "alibi_bias symmetric": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7), lambda: pe.alibi_bias(SLOPES, 1, 8, offset=7, symmetric=1)),
    "relative_bias kind": (lambda: pe.relative_bias("t5", TABLE, 1, 8, offset=7), lambda: pe.relative_bias("t6", TABLE, 1, 8, offset=7)),
    "relative_bias option": (lambda: pe.relative_bias("t5", TABLE, 1, 8, offset=7), lambda: pe.relative_bias("t5", TABLE, 1, 8, offset=7, maxdistance=3)),
    "relative_bias_vector k_len": (
        lambda: pe.relative_bias_vector("alibi", SLOPES, 1, 8, offset=7),
        lambda: pe.relative_bias_vector("alibi", SLOPES, 1, -3, offset=7),
    ),
    "expand_bias vector length": (
        lambda: pe.expand_bias(np.zeros((HEADS, 8)), 1, 8),
        lambda: pe.expand_bias(np.zeros((HEADS, 8)), 1, 9),
    ),
    "hf apply_rotary_pos_emb cos width": (lambda: _hf_apply(T_Q, T_K, T_COS, T_SIN), lambda: _hf_apply(T_Q, T_K, T_COS[..., :8], T_SIN)),
    "hf apply_rotary_pos_emb integer k": (lambda: _hf_apply(T_Q, T_K, T_COS, T_SIN), lambda: _hf_apply(T_Q, T_K.long(), T_COS, T_SIN)),
    "hf apply_rotary_pos_emb k head dim": (lambda: _hf_apply(T_Q, T_K, T_COS, T_SIN), lambda: _hf_apply(T_Q, T_K[..., :8], T_COS, T_SIN)),
    "hf apply_rotary_pos_emb two rows": (lambda: _hf_apply(T_Q, T_K, T_COS, T_SIN), lambda: _hf_apply(T_Q, T_K, torch.cat([T_COS] * 2, 1), torch.cat([T_SIN] * 2, 1))),
    "rerotate too many frequencies": (
        lambda: pe.rerotate(X, 3, pe.rope_frequencies(DIM)[0]),
        lambda: pe.rerotate(X, 3, pe.rope_frequencies(2 * DIM)[0]),
    ),
    "rerotate boolean delta": (lambda: pe.rerotate(X, 3, pe.rope_frequencies(DIM)[0]), lambda: pe.rerotate(X, True, pe.rope_frequencies(DIM)[0])),
    "rerotate huge delta": (lambda: pe.rerotate(X, 3, pe.rope_frequencies(DIM)[0]), lambda: pe.rerotate(X, 2**64, pe.rope_frequencies(DIM)[0])),
    "rerotate out dtype": (
        lambda: pe.rerotate(X, 3, pe.rope_frequencies(DIM)[0], out=X.copy()),
        lambda: pe.rerotate(X, 3, pe.rope_frequencies(DIM)[0], out=X.astype(np.float64)),
    ),
    "expand_bias 0-d vector": (lambda: pe.expand_bias(np.zeros((HEADS, 8)), 1, 8), lambda: pe.expand_bias(np.zeros(()), 1, 8)),
}


def _error(call):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_gets_the_same_error_cold_and_planned(name):
    good, hostile = HOSTILE[name]
    good()
    good()  # the signature is planned
    first = _error(hostile)
    assert first[0] in (ValueError, TypeError), first
    assert _error(hostile) == first
    good()  # the plan still serves the good call


def test_a_plan_reads_the_extremes_of_every_sum_that_may_leave_int64():
    """The integer rule in a plan (``rope_plan._Source._must_check``): positions and an offset
    whose sum may leave int64 are read before they are added (the full path's error, not a
    wrapped position); a CUDA plan leaves such calls to the full path. int64 positions with
    an offset tensor of at most 32 bits (or a NumPy int32) may: int64 + 1 wraps."""
    from posenc._kernels.rope_plan import _Source

    int64_positions = _Source((1,), None, None, "int64", "narrow")
    assert int64_positions._must_check(torch.tensor(1, dtype=torch.int32)) and int64_positions._must_check(np.int32(1))
    assert int64_positions._must_check(3) and not int64_positions._must_check(0)
    narrow = _Source((1,), None, None, "narrow", "narrow")
    assert not narrow._must_check(torch.tensor(1, dtype=torch.int32)) and not narrow._must_check(2**61)
    assert narrow._must_check(2**62) and _Source((1,), None, None, "narrow", "int64")._must_check(torch.tensor(1))


def test_a_plan_made_without_grad_does_not_serve_a_call_autograd_records():
    x = torch.randn(1, HEADS, 1, DIM, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        planned = _twice(lambda: pe.rope(x, offset=3))
    assert not planned.requires_grad
    y = pe.rope(x, offset=3)
    assert y.requires_grad and y.grad_fn is not None
    torch.testing.assert_close(y.detach(), planned, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert grad.shape == x.shape


def test_the_reference_backend_is_not_served_by_a_kernel_plan():
    x = np.random.default_rng(3).standard_normal((1, HEADS, 1, DIM))
    kernel = _twice(lambda: pe.rope(x, offset=3))
    with pe.use_backend("reference"):
        reference = _twice(lambda: pe.rope(x, offset=3))
    np.testing.assert_allclose(reference, kernel, rtol=1e-12, atol=1e-12)
    # The backend is part of the key: the reference's signature has no plan, the kernel's one has.
    served = {key[2][0]: plan for key, plan in pe.rope.plans.items() if key[1] == _plans.array_key(x)}
    assert served["reference"] is False and served["auto"]


def test_planned_apply_rope_reads_cos_and_sin_as_they_are_now():
    """q and k share their cos/sin views; a table written in place, or a new one, is read afresh."""
    q, k = _x("torch", torch.float32), _x("torch", torch.float32, (1, 2, LENGTH, DIM), seed=1)
    cos, sin = pe.rope_cos_sin(torch.arange(LENGTH), pe.rope_frequencies(DIM)[0])
    for step in range(3):
        with pe.use_backend("reference"):
            expected = pe.apply_rope(q, cos, sin), pe.apply_rope(k, cos, sin)
        for _ in range(2):
            got = pe.apply_rope(q, cos, sin), pe.apply_rope(k, cos, sin)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
        if step == 0:
            cos.mul_(0.5)  # in place: same memory, new values
        else:
            cos, sin = cos.flip(0).contiguous(), sin.flip(0).contiguous()  # new tables


def test_signed_zero_options_share_a_key_but_keep_their_sign():
    pos, freqs = np.array([1, 2]), np.array([1.0, 0.5])
    for scale in (0.0, -0.0, 0.0, -0.0):
        cos, _ = pe.rope_cos_sin(pos, freqs, scale=scale)
        assert np.all(np.signbit(cos[:, 0]) == np.signbit(np.cos(pos * 1.0) * scale))


def test_planned_rope_cos_sin_sees_frequencies_written_in_place():
    """The plan keeps the converted frequencies while their bytes stay the same: a write in
    place gives the new values' tables, and a non-finite one the full path's error."""
    pos, freqs = np.array([1, 2]), np.array([1.0, 0.5])
    _twice(lambda: pe.rope_cos_sin(pos, freqs)[0])
    freqs[1] = 0.25
    with pe.use_backend("reference"):
        expected = pe.rope_cos_sin(pos, freqs)
    for got, want in zip(pe.rope_cos_sin(pos, freqs), expected):
        _same(got, want)
    freqs[1] = np.nan
    first = _error(lambda: pe.rope_cos_sin(pos, freqs))
    assert first[0] is ValueError and _error(lambda: pe.rope_cos_sin(pos, freqs)) == first


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_planned_hugging_face_apply_is_the_two_apply_rope_calls(dtype, unsqueeze_dim):
    from posenc.torch.hf import apply_rotary_pos_emb

    q, k = _x("torch", dtype, (1, HEADS, 1, DIM)), _x("torch", dtype, (1, 2, 1, DIM), seed=1)
    if unsqueeze_dim == 2:  # [batch, seq, heads, dim]
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    table = pe.rope_cos_sin(torch.arange(40), pe.rope_frequencies(DIM)[0], dtype=dtype)
    for t in (3, 39, 7):  # cos/sin rows are views into a longer table, at a different offset each step
        cos, sin = (c[t : t + 1][None] for c in table)
        want = [pe.apply_rope(x, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)) for x in (q, k)]
        for i in (0, 1):
            _same(_twice(lambda: apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)[i]), want[i])
            _same(_twice(lambda: apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)[i]), want[i])
    from posenc.rotary.apply import rotate_pair

    assert any(type(plan).__name__ == "PairPlan" for plan in rotate_pair.plans.values())


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
def test_a_sequential_numpy_decode_loop_gets_the_long_calls_rows(dtype):
    """One position a call, each the last plus one (the plan computes rows ahead), with jumps
    back and ahead, a 0-d position, and frequencies rewritten in place mid-loop."""
    from posenc.rotary._tables_plan import BLOCK

    freqs = pe.rope_frequencies(DIM, base=500.0)[0]
    steps = [*range(0, 2 * BLOCK + 3), 7, 8, 9, 500, 501, 502, *range(3 * BLOCK, 4 * BLOCK + 2)]
    with pe.use_backend("reference"):
        cos, sin = pe.rope_cos_sin(np.arange(4 * BLOCK + 2), freqs, dtype=dtype)
        far = pe.rope_cos_sin(np.arange(500, 503), freqs, dtype=dtype)
    for position in steps:
        got = pe.rope_cos_sin(np.array([position]), freqs, dtype=dtype)
        want = (far[0][position - 500 : position - 499], far[1][position - 500 : position - 499]) if position >= 500 else (cos[position : position + 1], sin[position : position + 1])
        _same(got[0], want[0])
        _same(got[1], want[1])
        got[0][...] = 7  # the caller's own array: writing it changes no later call's rows
        _same(pe.rope_cos_sin(np.array([position]), freqs, dtype=dtype)[0], want[0])
    for position in range(3):
        got = pe.rope_cos_sin(np.array(position), freqs, dtype=dtype)
        _same(got[0], cos[position])
    freqs[0] *= 0.5
    with pe.use_backend("reference"):
        halved = pe.rope_cos_sin(np.arange(4), freqs, dtype=dtype)
    for position in (2, 3):
        _same(pe.rope_cos_sin(np.array([position]), freqs, dtype=dtype)[0], halved[0][position : position + 1])


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
@pytest.mark.parametrize("position_dtype", [np.int64, np.int32, np.uint64], ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_one_numpy_position_of_any_shape_gets_the_long_calls_row(dtype, position_dtype, layout):
    """Positions ``[1, 1]`` (position ids) and ``[]``, each asked twice, in a loop that jumps
    (each row computed alone), steps (rows ahead), and reaches positions near and beyond
    2**52 and 2**62 (float64 no longer holds every integer)."""
    freqs = pe.rope_frequencies(DIM, base=500.0)[0]
    top = np.iinfo(position_dtype).max // 2
    steps = [5, 3, 3, 9, 10, 11, 2**20, top - 40, top - 39, top - 38, top]
    if position_dtype is not np.int32:
        steps += [2**52 - 40, 2**52 - 1, 2**52, 2**52 + 1, 2**53 + 3, 2**62 + 1, 2**62 + 2]
    ids = np.array(steps, dtype=position_dtype)
    with pe.use_backend("reference"):
        cos, sin = pe.rope_cos_sin(ids, freqs, layout=layout, dtype=dtype)
    for shape in ((1, 1), ()):
        for i in range(len(ids)):
            for _ in range(2):
                got = pe.rope_cos_sin(ids[i : i + 1].reshape(shape), freqs, layout=layout, dtype=dtype)
                _same(got[0], cos[i].reshape(shape + cos.shape[1:]))
                _same(got[1], sin[i].reshape(shape + sin.shape[1:]))


@pytest.mark.parametrize(("library", "dtype"), CASES, ids=str)
def test_planned_rerotate_equals_the_full_path(library, dtype):
    """By any delta, allocating, in place and into a buffer; frequencies rewritten in place
    are read again."""
    freqs = pe.rope_frequencies(DIM, base=500.0)[0]
    x = _x(library, dtype)

    def full(delta, f=freqs):
        pe.rerotate.plans.clear()
        return pe.rerotate(x, delta, f)

    pe.rerotate.plans.clear()
    for delta in (-3, 7, 0, -100, 2**40):
        want = full(delta)
        pe.rerotate(x, 1, freqs)  # plans the signature
        _same(pe.rerotate(x, delta, freqs), want)
        buf = x * 0
        _same(pe.rerotate(x, 1, freqs, out=buf), full(1))
        _same(pe.rerotate(x, delta, freqs, out=buf), want)
        cache = x * 1
        pe.rerotate(cache, 1, freqs, out=cache)
        cache = x * 1
        assert pe.rerotate(cache, delta, freqs, out=cache) is cache
        _same(cache, want)
    assert any(type(plan).__name__ == "RerotatePlan" for plan in pe.rerotate.plans.values())
    freqs[0] *= 0.5
    _same(pe.rerotate(x, 5, freqs), full(5))


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_planned_out_meeting_x_gets_the_full_paths_answer(library):
    """x and out as views of one memory (neither owns it), under one planned key: a separate
    buffer is served by the plan, one starting an element into x gets the full path's error,
    and x's own memory under another array object is rotated in place."""
    n, shape = HEADS * LENGTH * DIM, (1, HEADS, LENGTH, DIM)
    dtype = torch.float64 if library == "torch" else np.float64
    memory = _x(library, dtype, (3 * n,))
    freqs = pe.rope_frequencies(DIM)[0]
    cos, sin = pe.rope_cos_sin(torch.arange(LENGTH) if library == "torch" else np.arange(LENGTH), freqs, dtype=dtype)
    calls = {
        pe.rope: lambda x, **out: pe.rope(x, offset=3, **out),
        pe.apply_rope: lambda x, **out: pe.apply_rope(x, cos, sin, **out),
        pe.rerotate: lambda x, **out: pe.rerotate(x, 3, freqs, **out),
    }

    def view(start):
        return memory[start : start + n].reshape(shape)

    for fn, call in calls.items():
        want = call(view(0) * 1)
        buf = view(2 * n)
        for _ in range(2):
            assert call(view(0), out=buf) is buf
            _same(buf, want)
        assert fn.plans[next(reversed(fn.plans))]  # the buffer's signature has a plan
        assert _plans.out_key(view(1), None) == _plans.out_key(buf, None)  # and serves these calls
        for _ in range(2):
            with pytest.raises(ValueError, match="out overlaps the memory of x without being x"):
                call(view(0), out=view(1))
        alias = view(0)
        assert call(view(0), out=alias) is alias
        _same(alias, want)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_planned_in_place_shift_loop_follows_the_rotation_formula(library):
    """A cache shifted by -1 in place, step after step (planned from the second), holds the
    keys rotated from scratch at the shifted positions (the float64 formula)."""
    keys = np.random.default_rng(4).standard_normal((1, HEADS, LENGTH, DIM))
    cache = pe.rope(torch.from_numpy(keys) if library == "torch" else keys.copy())
    freqs = pe.rope_frequencies(DIM)[0]
    for step in range(1, 6):
        assert pe.rerotate(cache, -1, freqs, out=cache) is cache
        got = cache.numpy() if library == "torch" else cache
        np.testing.assert_allclose(got, exact_rope(keys, np.arange(LENGTH) - step), rtol=0, atol=1e-13)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # forward AD's own import
def test_the_key_of_several_arrays_is_their_array_keys():
    """``_plans.arrays_key`` (one pass, torch's transforms asked once) gives the tuple of
    ``array_key``s, None where one is None or NumPy arrays are among torch tensors."""
    t = torch.zeros(2, 3)
    cases = [
        (np.zeros(3), np.ones((2, 2), np.float32)[:, ::-1]),
        (t, t.T, torch.zeros(3, requires_grad=True), torch.nn.Parameter(torch.ones(2))),
        (t, torch.zeros(2).expand(3, 2), torch.inference_mode()(lambda: torch.ones(2))()),
        (t, t.neg().detach()._neg_view() if hasattr(t, "_neg_view") else t, np.zeros(2)),
        (t, np.zeros(2)),
        (t, "not an array"),
    ]
    for arrays in cases:
        each = tuple(_plans.array_key(a, cuda=True) for a in arrays)
        mixed = 0 < sum(type(a) is np.ndarray for a in arrays) < len(arrays)
        assert _plans.arrays_key(arrays, cuda=True) == (None if None in each or mixed else each)
    with torch.autograd.forward_ad.dual_level():  # a dual tensor: torch's transforms, no key
        dual = torch.autograd.forward_ad.make_dual(torch.zeros(2), torch.ones(2))
        assert _plans.arrays_key((dual, t)) is None and _plans.array_key(dual) is None


def test_a_cleared_plan_cache_keeps_no_plan_alive():
    """``plans.clear()`` releases every plan (docs/decoding-loop.md), the one given last too."""
    import gc
    import weakref

    x = np.ones((1, 2, 3, 8))
    pe.rope.plans.clear()
    for _ in range(3):
        pe.rope(x, offset=4)
    plan = next(p for p in pe.rope.plans.values() if p)
    gone = weakref.ref(plan)
    del plan
    pe.rope.plans.clear()
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_planned_0d_offset_in_the_memory_rotated_in_place_gets_the_full_paths_error(library):
    """An offset of one integer is read as an int by a plan, but one that lies in ``out``'s
    memory is refused as the full path refuses it (``out`` shares memory with ``offset``)."""
    x = _x(library, np.float32 if library == "numpy" else torch.float32, (1, HEADS, 1, DIM))
    inside, apart = (a.view(np.int32)[0, 0, 0, 0:1].reshape(()) if library == "numpy" else a.view(torch.int32)[0, 0, 0, 0] for a in (x, 0 * x))
    for _ in range(3):
        pe.rope(x, offset=apart, out=x)  # (the signature is planned)
    assert any(pe.rope.plans.values())
    with pytest.raises(ValueError, match="out shares memory with offset"):
        pe.rope(x, offset=inside, out=x)


@pytest.mark.parametrize(
    "offset",
    [lambda t: torch.tensor(t), lambda t: torch.tensor([t]), lambda t: np.int64(t), lambda t: np.uint32(t)],
    ids=["torch 0-d", "torch one row", "numpy int64 scalar", "numpy uint32 scalar"],
)
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_an_offset_of_one_integer_is_planned_as_the_int_it_holds(library, offset):
    """A decode step's offset given as a 0-d array, one row or a NumPy scalar (an engine's
    cache length) is served by the plan of an int offset, which reads it once (``.item()``),
    with the bits of the full path at every step."""
    if library == "numpy" and type(offset(0)) is torch.Tensor:
        offset = lambda t, made=offset: made(t).numpy()  # noqa: E731
    x = _x(library, np.float32 if library == "numpy" else torch.float32, (1, HEADS, LENGTH, DIM))
    full = pe.rope(x)
    pe.rope.plans.clear()
    for t in STEPS:
        _same(_twice(lambda: pe.rope(x[:, :, t : t + 1], offset=offset(t))), full[:, :, t : t + 1])
    assert [type(plan).__name__ for plan in pe.rope.plans.values() if plan] == ["RotatePlan"]
    pe.rope.plans.clear()


BIAS_OFFSETS = {
    "0-d": lambda t, library: np.array(t) if library == "numpy" else torch.tensor(t),
    "numpy int64 scalar": lambda t, library: np.int64(t),
    "numpy uint32 scalar": lambda t, library: np.uint32(t),
}


@pytest.mark.parametrize("positions", [False, True], ids=["offset", "offset + positions"])
@pytest.mark.parametrize("offset", BIAS_OFFSETS)
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_bias_offset_of_one_integer_is_planned_as_the_int_it_holds(library, offset, positions):
    """A decode step's bias offset given as a 0-d array or a NumPy scalar (an engine's cache
    length) is served by a plan, as an int is, which reads it once: the bits of the
    full path (the int's) at every step. Before, each such call took the full path (t5_bias
    of 16 heads over 512 keys: 158 us against 12 us for an int)."""
    table, slopes = _tables(library, np.float32 if library == "numpy" else torch.float32)
    shaw = table[: 2 * 3 + 1]
    calls = {
        "t5_bias": lambda **kw: pe.t5_bias(table, 1, LENGTH, **kw),
        "alibi_bias": lambda **kw: pe.alibi_bias(slopes, 1, LENGTH, **kw),
        "shaw": lambda **kw: pe.relative_bias("shaw", shaw, 1, LENGTH, max_distance=3, **kw),
        "deberta": lambda **kw: pe.relative_bias("deberta", table, 1, LENGTH, max_distance=16, bucket_size=8, max_position=64, **kw),
    }
    keys = (np.arange(LENGTH) if library == "numpy" else torch.arange(LENGTH)) if positions else None
    queries = (np.zeros(1, np.int64) if library == "numpy" else torch.zeros(1, dtype=torch.int64)) if positions else None
    made = BIAS_OFFSETS[offset]
    for name, call in calls.items():
        pe.relative_bias.plans.clear()  # (t5_bias's and alibi_bias's plans too)
        for t in (*STEPS, 40, 3):
            want = call(offset=t, query_positions=queries, key_positions=keys)
            _same(_twice(lambda: call(offset=made(t, library), query_positions=queries, key_positions=keys)), want)
        kinds = [type(plan).__name__ for plan in pe.relative_bias.plans.values() if plan]  # the int's and the offset's
        assert len(kinds) == 2 and kinds[0] == kinds[1] == ("PerTokenPlans" if positions else "BiasPlan"), (name, kinds)


@pytest.mark.parametrize("kind", ["shaw", "deberta"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_table_bias_plan_keeps_the_rows_of_its_distances(library, kind):
    """Shaw's and DeBERTa's decode-step plans keep the table row of each distance of a window,
    as T5's keeps its buckets: a step is a slice of them and one gather from the table
    (before, each step computed the clipped or log-bucketed rows of its 512 distances afresh:
    Shaw's 16 heads over 512 keys 22 us in NumPy, 44 us in torch, against 17 and 19 us for
    the formula; DeBERTa's log buckets 65 us against 32 us)."""
    table, _ = _tables(library, np.float32 if library == "numpy" else torch.float32)
    options = {"max_distance": 3} if kind == "shaw" else {"max_distance": 16, "bucket_size": 8, "max_position": 64}
    table = table[:7] if kind == "shaw" else table
    pe.relative_bias.plans.clear()
    for t in (30, 31, 32, 1000, 5):
        _same(_twice(lambda: pe.relative_bias(kind, table, 1, 40, offset=t, **options)), pe.relative_bias(kind, table, 2, 40, offset=t, **options)[:, :1])
    plans = [plan for plan in pe.relative_bias.plans.values() if type(plan).__name__ == "BiasPlan"]
    assert len(plans) == 1 and plans[0].row.held[2] is not None
