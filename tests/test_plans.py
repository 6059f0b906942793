"""Plans of calls with array arguments: the cold call's numbers and errors, and a bounded cache.

``posenc._plans`` keys a call on its arrays' metadata (library, dtype, device, shape,
strides), never their values, and passes the arrays of each call to the plan. Here every
planned function is called with values that change between calls: each planned result
must equal, bit for bit, the result of the same call on an empty plan cache (the full
path). Hostile input must get the full path's error word for word cold, once a plan of
the signature exists, and when the array a plan has served is then spoiled in place.
The caches drop their least recently used plan past ``MAX_PLANS`` and keep no caller's
array alive.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import posenc as pe
from posenc import _plans

torch = pytest.importorskip("torch")
from posenc.torch import ALiBi, DeBERTaRelative, ShawRelative, T5RelativeBias, score_mod  # noqa: E402
from posenc.torch import _ops  # noqa: E402
from posenc.torch import hf as _hf  # noqa: E402
from posenc.rotary.apply import rotate_pair  # noqa: E402

PLANNED = (
    pe.rope, pe.apply_rope, pe.rerotate, pe.rope_cos_sin, pe.relative_bias, pe.relative_bias_vector, pe.expand_bias, pe.shaw_logits,
    pe.deberta_logits,
    rotate_pair, _ops._apply_kernel, _ops._rotate_kernel,
)  # fmt: skip
HEADS, DIM = 4, 16


def _clear():
    for fn in PLANNED:
        fn.plans.clear()


def _cold(call):
    """The full path's result: the call on empty plan caches (the caches are emptied after it too)."""
    _clear()
    try:
        return call()
    finally:
        _clear()


def _same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True), (a, b)


def _served(fn):
    return [type(plan).__name__ for plan in fn.plans.values() if plan]


rng = np.random.default_rng(0)
X = rng.standard_normal((2, HEADS, 3, DIM)).astype(np.float32)
X1 = rng.standard_normal((1, HEADS, 1, DIM)).astype(np.float32)
T_X = torch.from_numpy(X.copy())
T_X1 = torch.from_numpy(X1.copy())
T_BSHD = torch.from_numpy(X.transpose(0, 2, 1, 3).copy())  # [b, s, h, d]
INV = pe.rope_frequencies(DIM)[0]
TABLE = rng.standard_normal((32, HEADS)).astype(np.float32)
SHAW = rng.standard_normal((9, HEADS)).astype(np.float32)
DEBERTA = rng.standard_normal((8, HEADS)).astype(np.float32)
SLOPES = pe.alibi_slopes(HEADS)
T_TABLE, T_SLOPES = torch.from_numpy(TABLE), torch.from_numpy(SLOPES)
STEPS = (0, 1, 7, 511, 2**40)


def _t5_module():
    module = T5RelativeBias(HEADS)
    with torch.no_grad():
        module.table.copy_(T_TABLE)
    return module


T5_MODULE, ALIBI_MODULE = _t5_module(), ALiBi(HEADS)
# Shaw's attention logits: q [1, heads, 1, d] / [2, heads, 3, d], keys [.., 8, d], a table of K = 4.
SHAW_K = rng.standard_normal((2, HEADS, 8, DIM)).astype(np.float32)
SHAW_TABLE = rng.standard_normal((9, DIM)).astype(np.float32)
T_SHAW_K, T_SHAW_TABLE = torch.from_numpy(SHAW_K), torch.from_numpy(SHAW_TABLE)


def _inferred(call):
    """``call()`` as a decode loop makes it: a call that autograd records is not planned."""
    with torch.no_grad():
        return call()


def _shaw(q, k, table=SHAW_TABLE, **options):
    return pe.shaw_logits(q, k, table, max_distance=4, **options)


# DeBERTa's: projected tables [heads, 2K, d] of K = 4, log buckets of 4 up to 12 where asked.
POS_Q, POS_K = (rng.standard_normal((HEADS, 8, DIM)).astype(np.float32) for _ in range(2))
T_POS_Q, T_POS_K = torch.from_numpy(POS_Q), torch.from_numpy(POS_K)
BUCKETS = {"bucket_size": 4, "max_position": 12}


def _deberta(q, k, pos_q=POS_Q, pos_k=POS_K, **options):
    return pe.deberta_logits(q, k, pos_q, pos_k, max_distance=4, **options)


SHAW_MODULE, DEBERTA_MODULE = ShawRelative(DIM, max_distance=4), DeBERTaRelative(HEADS, DIM, max_distance=4, **BUCKETS)


def _flex(kind, params, offset, q_len=1, **options):
    """A FlexAttention ``score_mod`` of ``q_len`` queries and 8 keys, applied to every (head, query, key)."""
    mod = score_mod(kind, params, q_len, 8, offset=offset, **options)
    return mod(torch.zeros(()), 0, torch.arange(HEADS)[:, None, None], torch.arange(q_len)[:, None], torch.arange(8)[None])

# name: (the planned function, call(step) -> result): the arrays made per step hold new values
CALLS = {
    "rope numpy [1] positions": (pe.rope, lambda t: pe.rope(X1, np.array([t]))),
    "rope numpy [[p]] positions": (pe.rope, lambda t: pe.rope(X1, np.array([[t]]))),
    "rope numpy [B, S] positions": (pe.rope, lambda t: pe.rope(X, np.arange(6).reshape(2, 3) * 3 + t)),
    "rope numpy int32 positions and offset": (pe.rope, lambda t: pe.rope(X, np.arange(3, dtype=np.int32) + t % 1000, offset=t % 100)),
    "rope numpy float positions": (pe.rope, lambda t: pe.rope(X, np.arange(3.0) + t / 3)),
    "rope numpy negative positions": (pe.rope, lambda t: pe.rope(X, -np.arange(3) - t)),
    "rope numpy per-row offset": (pe.rope, lambda t: pe.rope(X, offset=np.array([t, 2 * t]))),
    "rope numpy positions and per-row offset": (pe.rope, lambda t: pe.rope(X, np.arange(3), offset=np.array([t, 5]))),
    "rope numpy 0-d offset": (pe.rope, lambda t: pe.rope(X, offset=np.array(t))),
    # An offset of one integer (0-d, a NumPy scalar, one row): read as the int it holds.
    "rope numpy int64 scalar offset": (pe.rope, lambda t: pe.rope(X, offset=np.int64(t))),
    "rope numpy uint64 scalar offset, positions": (pe.rope, lambda t: pe.rope(X, np.arange(3) * 2, offset=np.uint64(t))),
    "rope torch x, NumPy int32 scalar offset": (pe.rope, lambda t: pe.rope(T_X, offset=np.int32(t % 2**31))),
    "rope numpy per-row offset of one row": (pe.rope, lambda t: pe.rope(X1, offset=np.array([t]))),
    "rope numpy 0-d offset in place": (pe.rope, lambda t: (lambda x: pe.rope(x, offset=np.array(t), out=x))(X.copy())),
    "rope numpy int8 positions and 0-d offset": (pe.rope, lambda t: pe.rope(X, np.arange(3, dtype=np.int8), offset=np.array(t))),
    "rope numpy per-row offset of one row, dynamic NTK": (pe.rope, lambda t: pe.rope(X1, offset=np.array([t % 1000]), scaling=pe.scaling.DynamicNTK(2.0, 8))),
    "rope numpy per-row offset of one row, 0-d positions": (pe.rope, lambda t: pe.rope(X1, np.array(3), offset=np.array([[t]]))),
    "rope numpy positions interleaved inverse": (pe.rope, lambda t: pe.rope(X, np.arange(3) + t, layout="interleaved", inverse=True)),
    "rope numpy bshd positions": (pe.rope, lambda t: pe.rope(X.transpose(0, 2, 1, 3), np.arange(3) + t, seq_axis="bshd")),
    "rope numpy float64 rotary_dim": (pe.rope, lambda t: pe.rope(X.astype(np.float64), np.array([[t], [t + 1]]), rotary_dim=8, offset=2)),
    "rope numpy float16": (pe.rope, lambda t: pe.rope(X.astype(np.float16), np.array([t]))),
    "rope numpy in place": (pe.rope, lambda t: (lambda x: pe.rope(x, np.array([t]), out=x))(X1.copy())),
    "rope numpy Llama 3 scaling, positions": (pe.rope, lambda t: pe.rope(X1, np.array([t]), scaling=pe.scaling.Llama3(8.0, 8192))),
    "rope numpy YaRN scaling (attention factor), offset": (pe.rope, lambda t: pe.rope(X, offset=t, scaling=pe.scaling.YaRN(4.0, 4096))),
    "rope numpy linear scaling, interleaved": (pe.rope, lambda t: pe.rope(X, np.arange(3) + t, scaling=pe.scaling.Linear(2.0), layout="interleaved")),
    "rope numpy NTK, proportional and axial scalings": (
        pe.rope,
        lambda t: tuple(pe.rope(X1, offset=t, scaling=s) for s in (pe.scaling.NTK(2.0), pe.scaling.Proportional(0.5, 2.0), pe.scaling.Axial(2))),
    ),
    "rope torch YaRN scaling, position_ids": (pe.rope, lambda t: pe.rope(T_X1, torch.tensor([[t]]), scaling=pe.scaling.YaRN(2.0, 64, attention_factor=0.8))),
    "rope numpy dynamic NTK, positions past its length": (pe.rope, lambda t: pe.rope(X1, np.array([t]), scaling=pe.scaling.DynamicNTK(2.0, 8))),
    "rope numpy dynamic NTK, offset, inverse": (pe.rope, lambda t: pe.rope(X, offset=t, scaling=pe.scaling.DynamicNTK(4.0, 16), inverse=True)),
    "rope numpy dynamic NTK, seq_len given": (pe.rope, lambda t: pe.rope(X, np.arange(3), scaling=pe.scaling.DynamicNTK(2.0, 8), seq_len=t % 1000)),
    "rope numpy dynamic NTK, per-row seq_len": (
        pe.rope,
        lambda t: pe.rope(X, np.arange(3) + t % 500, scaling=pe.scaling.DynamicNTK(2.0, 8), seq_len=np.array([t % 500 + 3, 40])),
    ),
    "rope numpy LongRoPE, short and long factors": (
        pe.rope,
        lambda t: pe.rope(X1, offset=t % 100, scaling=pe.scaling.LongRoPE([1.0, 1.5, 2.0, 3.0] * 2, [2.0, 3.0, 5.0, 8.0] * 2, 50)),
    ),
    "rope torch dynamic NTK, position_ids": (pe.rope, lambda t: pe.rope(T_X1, torch.tensor([[t]]), scaling=pe.scaling.DynamicNTK(2.0, 8))),
    "rope torch [[p]] positions": (pe.rope, lambda t: pe.rope(T_X1, torch.tensor([[t]]))),
    "rope torch [B, S] positions": (pe.rope, lambda t: pe.rope(T_X, torch.arange(6).reshape(2, 3) + t)),
    "rope torch bfloat16 x and positions": (pe.rope, lambda t: pe.rope(T_X.bfloat16(), (torch.arange(3) + t % 200).bfloat16())),
    "rope torch per-row offset": (pe.rope, lambda t: pe.rope(T_X, offset=torch.tensor([t, t + 3]))),
    "rope torch 0-d offset": (pe.rope, lambda t: pe.rope(T_X, offset=torch.tensor(t))),
    "rope torch int32 0-d offset": (pe.rope, lambda t: pe.rope(T_X, offset=torch.tensor(t % 2**31, dtype=torch.int32))),
    "rope torch per-row offset of one row": (pe.rope, lambda t: pe.rope(T_X1, offset=torch.tensor([t]))),
    "rope torch per-row offset of one row, [B, S] positions": (pe.rope, lambda t: pe.rope(T_X[:1], torch.arange(3)[None] + 5, offset=torch.tensor([t]))),
    "rope torch positions and 0-d offset": (pe.rope, lambda t: pe.rope(T_X, torch.arange(3) * 7, offset=torch.tensor(t))),
    "rope torch positions and int offset": (pe.rope, lambda t: pe.rope(T_X1, torch.tensor([t]), offset=7)),
    "rope torch uint8 per-row offset, positions": (pe.rope, lambda t: pe.rope(T_X, torch.arange(3) + t, offset=torch.tensor([t % 256, 3], dtype=torch.uint8))),
    "rope torch per-row offset, float positions": (pe.rope, lambda t: pe.rope(T_X, torch.arange(3.0) / 3, offset=torch.tensor([t, 2 * t]))),
    "rope torch 0-d offset into a buffer": (pe.rope, lambda t: (lambda o: (pe.rope(T_X, offset=torch.tensor(t), out=o), o)[1])(torch.empty_like(T_X))),
    # float positions plus an offset, summed in float64 (in float16 2047 + 3 is 2048)
    "rope numpy float16 positions and offset": (pe.rope, lambda t: pe.rope(X, (np.arange(3) + 2045 - t % 3).astype(np.float16), offset=3 + t % 5)),
    "rope torch float16 positions and per-row offset": (
        pe.rope,
        lambda t: pe.rope(T_X, (torch.arange(3) + 2045 - t % 3).half(), offset=torch.tensor([3 + t % 5, 1])),
    ),
    "rope torch bfloat16 positions and offset": (pe.rope, lambda t: pe.rope(T_X, (torch.arange(3) + 253 - t % 3).bfloat16(), offset=3 + t % 5)),
    "apply_rope numpy": (pe.apply_rope, lambda t: pe.apply_rope(X1, *pe.rope_cos_sin(np.array([t]), INV))),
    "apply_rope torch": (pe.apply_rope, lambda t: pe.apply_rope(T_X, *(c[:, None] for c in pe.rope_cos_sin(torch.arange(6).reshape(2, 3) + t, INV)))),
    "rerotate numpy new frequencies": (pe.rerotate, lambda t: pe.rerotate(X, 3, INV * (1 + t % 5))),
    "rope_cos_sin numpy": (pe.rope_cos_sin, lambda t: pe.rope_cos_sin(np.array([t, t + 1]), INV)),
    "rope_cos_sin numpy float positions": (pe.rope_cos_sin, lambda t: pe.rope_cos_sin(np.array([t / 3, t + 0.5]), INV, layout="interleaved")),
    "rope_cos_sin torch float16 positions": (pe.rope_cos_sin, lambda t: pe.rope_cos_sin(torch.tensor([t % 2048], dtype=torch.float16), INV, scale=0.5)),
    "rope_cos_sin torch": (pe.rope_cos_sin, lambda t: pe.rope_cos_sin(torch.tensor([[t]]), INV, dtype=torch.float32)),
    "t5_bias numpy positions": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([t]), key_positions=np.arange(8) + t // 2)),
    "t5_bias numpy batched positions": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 2, 8, query_positions=np.array([[t, t + 1], [3, 4]]), key_positions=np.arange(8))),
    "t5_bias numpy int32 positions": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([t % 1000], np.int32), key_positions=np.arange(8, dtype=np.int32))),
    "t5_bias numpy unidirectional, offset": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, bidirectional=False, offset=t % 9, query_positions=np.array([t]))),
    "alibi_bias numpy positions": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, query_positions=np.array([t]), key_positions=np.arange(8))),
    "alibi_bias numpy float positions": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, query_positions=np.array([t / 2]), key_positions=np.arange(8))),
    "alibi_bias numpy float16 positions and offset": (
        pe.relative_bias,
        lambda t: pe.alibi_bias(SLOPES, 1, 8, offset=3 + t % 5, query_positions=np.array([2047 - t % 3], np.float16), key_positions=np.arange(2040, 2048, dtype=np.float16)),
    ),
    "alibi_bias numpy symmetric key positions": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, symmetric=True, key_positions=np.arange(8) * t)),
    # The per-token T5/ALiBi plans gather from their kept window: queries one or many, given or
    # not, keys before or after them, far from zero, batched, reversed, in every float dtype.
    "t5_bias numpy keys after the query": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([t]), key_positions=np.arange(8) + t + 3)),
    "t5_bias numpy keys only": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, key_positions=np.arange(8) * (t % 7) - t)),
    "t5_bias numpy queries of arange, keys given": (pe.relative_bias, lambda t: pe.t5_bias(TABLE.astype(np.float64), 3, 8, key_positions=np.arange(8) + t, offset=t % 5)),
    "t5_bias numpy one query, batched keys": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([[t]]), key_positions=np.arange(24).reshape(3, 8) - t)),
    "t5_bias numpy reversed keys": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([t]), key_positions=np.arange(16)[::-2] + t)),
    "t5_bias numpy positions near 2**62": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([2**62 + t]), key_positions=np.arange(8) + 2**62)),
    "t5_bias numpy positions rising to int64's top": (
        pe.relative_bias,
        lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([2**63 - 1 - max(0, 70000 - 10 * t)]), key_positions=np.arange(8)),
    ),  # the window grows past int64 (an OverflowError before)
    "t5_bias numpy keys at int64's least": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([-(2**63) + 7]), key_positions=np.arange(8) - t % 3)),
    "t5_bias torch keys at int64's least": (
        pe.relative_bias,
        lambda t: pe.t5_bias(T_TABLE, 1, 8, query_positions=torch.tensor([-(2**63) + 7]), key_positions=torch.arange(8) - t % 3),
    ),
    "t5_bias numpy empty batch": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, query_positions=np.zeros((0, 1), np.int64) + t, key_positions=np.arange(8))),
    "alibi_bias numpy negative positions, offset": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, offset=-t, query_positions=np.array([-t]), key_positions=-np.arange(8))),
    "alibi_bias numpy float16 slopes": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES.astype(np.float16), 1, 8, query_positions=np.array([t % 4096]), key_positions=np.arange(8))),
    "alibi_bias numpy float64 slopes, batched queries": (
        pe.relative_bias,
        lambda t: pe.alibi_bias(SLOPES.astype(np.float64), 2, 8, query_positions=np.array([[t, t + 1], [1, 9]]), key_positions=np.arange(8)),
    ),
    "t5_bias torch batched positions": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 8, query_positions=torch.tensor([[t], [3]]), key_positions=torch.arange(16).reshape(2, 8))),
    "t5_bias torch keys after the query": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 8, query_positions=torch.tensor([t]), key_positions=torch.arange(8) + t + 3)),
    "alibi_bias torch bfloat16 slopes": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES.bfloat16(), 1, 8, query_positions=torch.tensor([t]), key_positions=torch.arange(8))),
    "alibi_bias torch float16 slopes, queries of arange": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES.half(), 2, 8, key_positions=torch.arange(8) - t, symmetric=True)),
    "relative_bias shaw positions": (pe.relative_bias, lambda t: pe.relative_bias("shaw", SHAW, 1, 8, max_distance=4, query_positions=np.array([t]))),
    "relative_bias deberta positions": (
        pe.relative_bias,
        lambda t: pe.relative_bias("deberta", DEBERTA, 1, 8, max_distance=4, bucket_size=2, max_position=64, query_positions=np.array([t])),
    ),
    "t5_bias torch positions": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 8, query_positions=torch.tensor([t]), key_positions=torch.arange(8))),
    "alibi_bias torch positions": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES, 1, 8, query_positions=torch.tensor([[t]]), key_positions=torch.arange(8))),
    "T5RelativeBias positions": (pe.relative_bias, lambda t: _inferred(lambda: T5_MODULE(1, 8, query_positions=torch.tensor([t]), key_positions=torch.arange(8)))),
    "ALiBi positions": (pe.relative_bias, lambda t: ALIBI_MODULE(1, 8, query_positions=torch.tensor([t]), key_positions=torch.arange(8))),
    # One offset per batch row (a decode step after caches of different lengths): RowsPlan.
    "t5_bias numpy per-row offsets": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.array([t, t + 3, t + 1]))),
    "t5_bias numpy per-row offsets far apart, 2 queries": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 2, 8, offset=np.array([t, 100000 - t, -t]))),
    "t5_bias numpy per-row offsets 1000 apart (pairs, not windows)": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.array([t, t + 1000]))),
    "alibi_bias torch per-row offsets 1000 apart, 2 queries": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES, 2, 8, offset=torch.tensor([t + 1000, t]))),
    "t5_bias numpy int32 per-row offsets, negative": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.array([-(t % 2**31), 5], np.int32))),
    "t5_bias numpy uint64 per-row offsets, 3 queries": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 3, 8, offset=np.array([t, 2 * t], np.uint64))),
    "t5_bias numpy [2, 2] per-row offsets, unidirectional": (
        pe.relative_bias, lambda t: pe.t5_bias(TABLE, 3, 8, bidirectional=False, offset=np.array([[t, 1], [t + 2, 0]])),
    ),  # fmt: skip
    "t5_bias numpy per-row offsets rising to int64's top": (
        pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.array([2**63 - 1 - max(0, 70000 - 10 * t), 2**63 - 8])),
    ),  # fmt: skip
    "t5_bias numpy per-row offsets at int64's least": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 2, 8, offset=np.array([-(2**63) + 7, -(2**63) + 7 + t % 3]))),
    "t5_bias numpy no per-row offsets": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.zeros(0, np.int64) + t)),
    "t5_bias numpy strided per-row offsets": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8, offset=np.arange(8)[::2] * t)),
    "t5_bias torch per-row offset of one row": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 8, offset=torch.tensor([t]))),
    "alibi_bias numpy int8 [1, 1] per-row offsets": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, offset=np.array([[t % 128]], np.int8))),
    "alibi_bias numpy per-row offsets, no keys": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 0, offset=np.array([t - t % 3 - 1] * 2))),
    "t5_bias torch per-row offset of one row at -1, no keys": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 0, offset=torch.tensor([-1]))),
    "relative_bias shaw per-row offset of one row, no keys": (pe.relative_bias, lambda t: pe.relative_bias("shaw", SHAW, 1, 0, max_distance=4, offset=np.array([t]))),
    "t5_bias torch per-row offsets": (pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 8, offset=torch.tensor([t, t + 1, t + 2, t + 7]))),
    # A decode loop's keys grow a step at a time: one plan serves every length (its per-token plans: a few lengths at a time).
    "t5_bias numpy per-row offsets, a key more each step": (pe.relative_bias, lambda t: pe.t5_bias(TABLE, 1, 8 + t % 11, offset=np.array([t + 7, t + 3]))),
    "t5_bias torch per-row offsets 1000 apart, lengths coming back": (
        pe.relative_bias, lambda t: pe.t5_bias(T_TABLE, 1, 1 + t % 6, offset=torch.tensor([t, t + 1000, 5])),
    ),  # fmt: skip
    "alibi_bias torch per-row offsets, 2 queries, a key more each step": (
        pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES, 2, 3 + t % 13, offset=torch.tensor([t, t + 2])),
    ),  # fmt: skip
    "alibi_bias numpy int32 per-row offsets, lengths from 0 keys": (
        pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, t % 4, offset=np.array([t % 2**31, 2**31 - 1 - t % 9], np.int32)),
    ),  # fmt: skip
    "t5_bias torch bfloat16 int32 per-row offsets, 4 queries": (
        pe.relative_bias, lambda t: pe.t5_bias(T_TABLE.bfloat16(), 4, 8, offset=torch.tensor([t % 2**31, 3], dtype=torch.int32)),
    ),  # fmt: skip
    "alibi_bias numpy per-row offsets": (pe.relative_bias, lambda t: pe.alibi_bias(SLOPES, 1, 8, offset=np.array([t, t + 5]))),
    "alibi_bias numpy float16 per-row offsets, symmetric": (
        pe.relative_bias, lambda t: pe.alibi_bias(SLOPES.astype(np.float16), 2, 8, offset=np.array([t % 4096, -t % 4096]), symmetric=True),
    ),  # fmt: skip
    "alibi_bias torch per-row offsets": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES, 1, 8, offset=torch.tensor([t, 0, -t]))),
    "alibi_bias torch bfloat16 per-row offsets": (pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES.bfloat16(), 1, 8, offset=torch.tensor([t, t - 1]))),
    "alibi_bias torch bfloat16 per-row offsets, 20000 keys": (
        pe.relative_bias, lambda t: pe.alibi_bias(T_SLOPES.bfloat16(), 1, 20000, offset=torch.tensor([t, t + 3, t + 5000]), symmetric=True),
    ),  # fmt: skip
    "relative_bias shaw per-row offsets": (pe.relative_bias, lambda t: pe.relative_bias("shaw", SHAW, 1, 8, max_distance=4, offset=np.array([t, t - 3]))),
    "relative_bias deberta per-row offsets": (
        pe.relative_bias,
        lambda t: pe.relative_bias("deberta", DEBERTA, 2, 8, max_distance=4, bucket_size=2, max_position=64, offset=np.array([t, 3])),
    ),
    "shaw_logits numpy offset": (pe.shaw_logits, lambda t: _shaw(X1, SHAW_K[:1], offset=t)),
    "shaw_logits numpy prefill, default offset": (pe.shaw_logits, lambda t: _shaw(X, SHAW_K, SHAW_TABLE * (t % 7)),),
    "shaw_logits numpy [1] positions": (pe.shaw_logits, lambda t: _shaw(X1, SHAW_K[:1], query_positions=np.array([t]), key_positions=np.arange(8) + t // 2)),
    "shaw_logits numpy [[p]] positions and offset": (pe.shaw_logits, lambda t: _shaw(X1, SHAW_K[:1], query_positions=np.array([[t]]), offset=t % 5)),
    "shaw_logits numpy key positions only": (pe.shaw_logits, lambda t: _shaw(X, SHAW_K, key_positions=np.arange(8) * (t % 3))),
    "shaw_logits numpy [B, S] positions": (pe.shaw_logits, lambda t: _shaw(X, SHAW_K, query_positions=np.array([[t, t + 1, t + 2], [0, 5, 9]]))),
    "shaw_logits numpy int32 positions": (
        pe.shaw_logits,
        lambda t: _shaw(X, SHAW_K, query_positions=np.arange(3, dtype=np.int32) + t % 1000, key_positions=np.arange(8, dtype=np.uint8)),
    ),
    "shaw_logits numpy decode step, int32 query, uint8 keys": (
        pe.shaw_logits, lambda t: _shaw(X1, SHAW_K[:1], query_positions=np.array([[t % 2**31]], np.int32), key_positions=np.arange(8, dtype=np.uint8) * 30),
    ),  # fmt: skip
    "shaw_logits torch decode step, uint8 keys, offset": (
        pe.shaw_logits,
        lambda t: _shaw(T_X1, T_SHAW_K[:1], T_SHAW_TABLE, query_positions=torch.tensor([t]), key_positions=torch.arange(8, dtype=torch.uint8), offset=-3),
    ),
    "shaw_logits numpy uint64 positions": (pe.shaw_logits, lambda t: _shaw(X1, SHAW_K[:1], query_positions=np.array([t], np.uint64))),
    "shaw_logits numpy float64 and float16": (pe.shaw_logits, lambda t: _shaw(X.astype(np.float64), SHAW_K.astype(np.float16), offset=t)),
    "shaw_logits numpy float16 positions": (pe.shaw_logits, lambda t: _shaw(X1.astype(np.float16), SHAW_K[:1], query_positions=np.array([t]))),
    "shaw_logits numpy table with a batch axis": (pe.shaw_logits, lambda t: _shaw(X, SHAW_K, np.stack([SHAW_TABLE, SHAW_TABLE + t % 3])[:, None], offset=t)),
    "shaw_logits numpy 5-d positions": (pe.shaw_logits, lambda t: _shaw(X1[0], SHAW_K[0], query_positions=np.array([[[t]]]))),
    "shaw_logits torch offset": (pe.shaw_logits, lambda t: _shaw(T_X1, T_SHAW_K[:1], T_SHAW_TABLE, offset=t)),
    "shaw_logits torch position_ids": (
        pe.shaw_logits,
        lambda t: _shaw(T_X1, T_SHAW_K[:1], T_SHAW_TABLE, query_positions=torch.tensor([[t]]), key_positions=torch.arange(8)),
    ),
    "shaw_logits torch [B, S] positions": (pe.shaw_logits, lambda t: _shaw(T_X, T_SHAW_K, T_SHAW_TABLE, query_positions=torch.arange(6).reshape(2, 3) + t)),
    "shaw_logits torch bfloat16 int32 positions": (
        pe.shaw_logits,
        lambda t: _shaw(T_X.bfloat16(), T_SHAW_K.bfloat16(), T_SHAW_TABLE.bfloat16(), query_positions=torch.arange(3, dtype=torch.int32) + t % 1000),
    ),
    "deberta_logits numpy offset": (pe.deberta_logits, lambda t: _deberta(X1, SHAW_K[:1], offset=t)),
    "deberta_logits numpy buckets, default offset": (pe.deberta_logits, lambda t: _deberta(X, SHAW_K, POS_Q * (t % 7), **BUCKETS)),
    "deberta_logits numpy c2p, list of terms": (pe.deberta_logits, lambda t: _deberta(X1, SHAW_K[:1], None, offset=t, terms=["c2p"], **BUCKETS)),
    "deberta_logits numpy p2c": (pe.deberta_logits, lambda t: _deberta(X, SHAW_K, pos_k=None, offset=t, terms=("p2c",))),
    "deberta_logits numpy [[p]] positions": (
        pe.deberta_logits,
        lambda t: _deberta(X1, SHAW_K[:1], query_positions=np.array([[t]]), key_positions=np.arange(8) + t // 2, **BUCKETS),
    ),
    "deberta_logits numpy [B, S] positions": (
        pe.deberta_logits,
        lambda t: _deberta(X, SHAW_K, query_positions=np.array([[t, t + 1, t + 2], [0, 5, 9]]), offset=3, **BUCKETS),
    ),
    "deberta_logits numpy int32 positions, float64": (
        pe.deberta_logits,
        lambda t: _deberta(X.astype(np.float64), SHAW_K, query_positions=np.arange(3, dtype=np.int32) + t % 1000),
    ),
    "shaw_logits numpy per-row offsets": (pe.shaw_logits, lambda t: _shaw(X, SHAW_K, offset=np.array([t, t - 3]))),
    "shaw_logits numpy int32 per-row offsets far apart, q of one row": (pe.shaw_logits, lambda t: _shaw(X1, SHAW_K, offset=np.array([t % 2**31, 5], np.int32))),
    "shaw_logits torch bfloat16 per-row offsets": (
        pe.shaw_logits, lambda t: _shaw(T_X1.bfloat16(), T_SHAW_K.bfloat16(), T_SHAW_TABLE.bfloat16(), offset=torch.tensor([t, 2 * t + 1])),
    ),  # fmt: skip
    "shaw_logits numpy [2, 1] per-row offsets, heads of q alone": (pe.shaw_logits, lambda t: _shaw(X1[0], SHAW_K[:1], offset=np.array([[t], [3]]))),
    "deberta_logits numpy per-row offsets, buckets": (pe.deberta_logits, lambda t: _deberta(X, SHAW_K, offset=np.array([t, 0]), **BUCKETS)),
    "deberta_logits numpy c2p, per-row offset of one row": (pe.deberta_logits, lambda t: _deberta(X1, SHAW_K[:1], None, offset=np.array([t]), terms=("c2p",))),
    "deberta_logits torch per-row offsets": (pe.deberta_logits, lambda t: _deberta(T_X1, T_SHAW_K, T_POS_Q, T_POS_K, offset=torch.tensor([t, t + 2]), **BUCKETS)),
    "deberta_logits torch offset": (pe.deberta_logits, lambda t: _deberta(T_X1, T_SHAW_K[:1], T_POS_Q, T_POS_K, offset=t, **BUCKETS)),
    "deberta_logits torch position_ids": (
        pe.deberta_logits,
        lambda t: _deberta(T_X1, T_SHAW_K[:1], T_POS_Q, T_POS_K, query_positions=torch.tensor([[t]]), key_positions=torch.arange(8), **BUCKETS),
    ),
    "deberta_logits torch [B, S] positions, float16": (
        pe.deberta_logits,
        lambda t: _deberta(T_X.half(), T_SHAW_K.half(), T_POS_Q.half(), T_POS_K.half(), query_positions=torch.arange(6).reshape(2, 3) + t),
    ),
    "ShawRelative logits position_ids": (
        pe.shaw_logits, lambda t: SHAW_MODULE.logits(T_X1, T_SHAW_K[:1], query_positions=torch.tensor([[t]]), key_positions=torch.arange(8)).detach(),
    ),  # fmt: skip
    "DeBERTaRelative logits position_ids": (
        pe.deberta_logits, lambda t: DEBERTA_MODULE.logits(T_X1, T_SHAW_K[:1], query_positions=torch.tensor([[t]]), key_positions=torch.arange(8)).detach(),
    ),  # fmt: skip
    "score_mod t5 int offset": (pe.relative_bias_vector, lambda t: _flex("t5", T_TABLE, t)),
    "score_mod t5 prefill of 5 queries": (pe.relative_bias_vector, lambda t: _flex("t5", T_TABLE, t, q_len=5)),
    "score_mod alibi prefill, symmetric": (pe.relative_bias_vector, lambda t: _flex("alibi", T_SLOPES, t - 40, q_len=3, symmetric=True)),
    "relative_bias_vector t5 numpy 4 queries": (pe.relative_bias_vector, lambda t: pe.relative_bias_vector("t5", TABLE, 4, 8, offset=t, bidirectional=False)),
    "relative_bias_vector alibi numpy 2 queries, default offset": (pe.relative_bias_vector, lambda t: pe.relative_bias_vector("alibi", SLOPES, 2, 8 + t % 7)),
    "score_mod t5 0-d tensor offset": (pe.relative_bias_vector, lambda t: _flex("t5", T_TABLE, torch.tensor(t))),
    "score_mod alibi 0-d int32 tensor offset": (pe.relative_bias_vector, lambda t: _flex("alibi", T_SLOPES, torch.tensor(t % 2**31, dtype=torch.int32))),
    "rope_rotate op, int64 positions": (_ops._rotate_kernel, lambda t: _ops.rope_rotate_op(T_X1, torch.tensor([t]), INV.tolist(), False, False, 1.0)),
    "rope_rotate op, int32 positions of a prefill": (
        _ops._rotate_kernel,
        lambda t: _ops.rope_rotate_op(torch.from_numpy(X), torch.arange(3, dtype=torch.int32) + t % 2**30, INV.tolist(), True, True, 1.25),
    ),
    "rope_rotate op, float positions per row": (
        _ops._rotate_kernel,
        lambda t: _ops.rope_rotate_op(torch.from_numpy(X), torch.tensor([[[0.5, 1.5, 2.5]], [[3.0, 4.0, 5.5]]], dtype=torch.float64) + t, INV.tolist(), False, False, 1.0),
    ),
    "hf apply_rotary_pos_emb q + k": (
        rotate_pair,
        lambda t: _hf.apply_rotary_pos_emb(T_X1, T_X1[:, :2], *(c[None] for c in pe.rope_cos_sin(torch.tensor([t]), INV))),
    ),
    # q and k as an attention layer holds them: views [b, h, s, d] of [b, s, h, d] (a planned call views their span in one step)
    "hf apply_rotary_pos_emb q + k, views of [b, s, h, d]": (
        rotate_pair,
        lambda t: _hf.apply_rotary_pos_emb(T_BSHD.transpose(1, 2), T_BSHD[:, :, :2].transpose(1, 2), *pe.rope_cos_sin(torch.arange(3)[None] + t, INV)),
    ),
    "apply_rope torch view into a view": (
        pe.apply_rope,
        lambda t: pe.apply_rope(T_BSHD.transpose(1, 2), *pe.rope_cos_sin(torch.arange(3) + t, INV), out=torch.zeros_like(T_BSHD).transpose(1, 2)),
    ),
    "apply_rope torch view in place": (
        pe.apply_rope,
        lambda t: (lambda x: pe.apply_rope(x, *pe.rope_cos_sin(torch.arange(3) + t, INV), out=x))(T_BSHD.clone().transpose(1, 2)),
    ),
}


@pytest.mark.parametrize("name", CALLS)
def test_a_planned_call_gives_the_cold_calls_bits(name):
    """Every step through one plan, twice over: what a plan keeps between calls (a window
    of distances it moves, a row cache) changes no bit."""
    fn, call = CALLS[name]
    cold = [_cold(lambda: call(t)) for t in STEPS]
    call(STEPS[0])
    call(STEPS[0])  # the second call of a signature plans it, for the steps after it
    assert _served(fn), f"{name}: no plan"
    for _ in range(2):
        for t, expected in zip(STEPS, cold):
            _same(call(t), expected)
    _clear()


@pytest.mark.parametrize("xp", [np, torch], ids=["numpy", "torch"])
def test_one_plan_serves_per_row_offsets_whatever_the_length_of_keys(xp):
    """A decode loop with one offset per batch row (caches of different lengths) asks for a
    key more each step: every length was a signature of its own, so every step took the
    full path (t5_bias of 16 heads, 4 rows, ~600 keys: 234 us NumPy, 375 us torch, against
    14 and 18 us with an int offset). One plan serves them all now, with the cold bits."""
    table = xp.asarray(TABLE)
    calls = [(k_len, xp.asarray([k_len - 1, k_len + 3, k_len - 5])) for k_len in range(8, 40)]
    cold = [_cold(lambda: pe.t5_bias(table, 1, k_len, offset=offsets)) for k_len, offsets in calls]
    for (k_len, offsets), expected in zip(calls, cold):
        _same(pe.t5_bias(table, 1, k_len, offset=offsets), expected)
    assert len(pe.relative_bias.plans) == 1 and _served(pe.relative_bias) == ["RowsPlan"]
    _clear()


@pytest.mark.parametrize("given", ["keys", "queries", "both"])
@pytest.mark.parametrize("xp", [np, torch], ids=["numpy", "torch"])
def test_one_plan_serves_per_token_positions_whatever_the_length_of_keys(xp, given):
    """Per-token positions in a decode loop (a padded batch's ``positions_from_mask``, the
    query's position ids) meet a key more each step: every length was a signature of its
    own, the full path every step (BLOOM's 16 heads, 4 rows of ~600 keys: 104 us NumPy, 196
    us torch, against 13 and 22 us at a length already planned). One plan serves them all
    now, with the cold bits, and a call whose keys' last axis is not ``k_len`` still meets
    the full path's error."""
    slopes = xp.asarray(SLOPES)
    calls = []
    for k_len in range(8, 40):
        keys = xp.reshape(xp.arange(4 * k_len), (4, k_len)) % (k_len + 3) if given != "queries" else None
        queries = xp.asarray([[k_len + 2], [k_len], [3], [k_len - 1]]) if given != "keys" else None
        calls.append((k_len, {"query_positions": queries, "key_positions": keys}))
    cold = [_cold(lambda: pe.alibi_bias(slopes, 1, k_len, **kwargs)) for k_len, kwargs in calls]
    for (k_len, kwargs), expected in zip(calls, cold):
        _same(pe.alibi_bias(slopes, 1, k_len, **kwargs), expected)
    assert len(pe.relative_bias.plans) == 1 and _served(pe.relative_bias) == ["PerTokenPlans"]
    if given != "queries":
        with pytest.raises(ValueError, match="key_positions must have k_len = 41 entries"):
            pe.alibi_bias(slopes, 1, 41, **calls[-1][1])
    _clear()


SWAPPED_STEPS = {
    "t5_bias": lambda a: pe.t5_bias(a, 1, 8),
    "alibi_bias": lambda a: pe.alibi_bias(SLOPES.astype(a.dtype), 1, 8),
    "relative_bias shaw": lambda a: pe.relative_bias("shaw", a[:9], 1, 8, max_distance=4),
    "relative_bias deberta": lambda a: pe.relative_bias("deberta", a[:8], 1, 8, max_distance=4),
    "expand_bias": lambda a: pe.expand_bias(a[:8, 0], 1, 8),
    "kerple_bias": lambda a: pe.kerple_bias(SLOPES.astype(a.dtype), SLOPES.astype(a.dtype), 1, 8),
}


@pytest.mark.parametrize("name", SWAPPED_STEPS)
def test_a_decode_step_of_byte_swapped_parameters_has_the_cold_calls_dtype(name):
    """A decode step's plan read a byte-swapped table (or vector) backwards in its own byte
    order, where the full path's Toeplitz expansion gives the native one: ``>f4`` from the
    third call on, ``float32`` before."""
    call = SWAPPED_STEPS[name]
    swapped = TABLE.astype(">f4")
    cold = _cold(lambda: call(swapped))
    assert cold.dtype == np.float32
    for _ in range(3):
        _same(call(swapped), cold)
    _clear()


@pytest.mark.parametrize("given", ["both", "query", "key"])
@pytest.mark.parametrize("kind", ["t5", "alibi"])
def test_byte_swapped_int64_positions_get_the_cold_calls_bits_on_every_call(kind, given):
    """A per-token bias plan read ``>i8`` positions (int64 by name) as the int64 its Numba
    kernel takes: from the fourth call on (once its window was kept), numba's TypeError ("No
    matching definition") where the cold call gave the bias."""
    params, function = (TABLE, pe.t5_bias) if kind == "t5" else (SLOPES, pe.alibi_bias)
    queries, keys = np.array([[40], [3]], ">i8"), np.array([[0, 5, 9, 30, 100, 7, 8, 2], np.arange(8)], ">i8")
    positions = {"query_positions": queries, "key_positions": keys}
    kwargs = {name: a for name, a in positions.items() if given in ("both", name.split("_")[0])}
    cold = _cold(lambda: function(params, 1, 8, **kwargs))
    for _ in range(5):
        _same(function(params, 1, 8, **kwargs), cold)
    _clear()


@pytest.mark.parametrize("fn", [pe.shaw_logits, pe.deberta_logits])
@pytest.mark.parametrize("positions", [False, True])
def test_a_planned_logits_call_gives_the_cold_calls_gradients(fn, positions):
    options = {"query_positions": torch.tensor([[5]]), "key_positions": torch.arange(8)} if positions else {"offset": 5}
    tables = (T_SHAW_TABLE,) if fn is pe.shaw_logits else (T_POS_Q, T_POS_K)

    def grads(scale):
        arrays = [a.clone().requires_grad_() for a in (T_X1, T_SHAW_K[:1], *tables)]
        (fn(*arrays, max_distance=4, **options) * scale).sum().backward()
        return tuple(a.grad for a in arrays)

    _clear()
    grads(1.0)
    grads(1.0)
    assert _served(fn)
    for scale in (2.0, -0.5):
        _same(grads(scale), _cold(lambda: grads(scale)))
    _clear()


_G = torch.Generator().manual_seed(0)
_R = {dtype: {n: torch.randn(*shape, generator=_G, dtype=dtype) for n, shape in (
    ("q", (2, 3, 9, 8)), ("q1", (2, 3, 1, 8)), ("k", (2, 3, 40, 8)), ("t5", (16, 3)), ("slopes", (3,)), ("shaw", (13, 8)), ("pos", (3, 12, 8)),
)} for dtype in (torch.bfloat16, torch.float32, torch.float64)}  # fmt: skip
_QPOS, _KPOS = torch.randint(0, 80, (1, 9), generator=_G), torch.arange(40)[None] * 2
RECORDED = {
    "t5_bias step": lambda a: pe.t5_bias(a["t5"], 1, 40, num_buckets=16, max_distance=32),
    "t5_bias positions": lambda a: pe.t5_bias(a["t5"], 9, 40, num_buckets=16, max_distance=32, query_positions=_QPOS, key_positions=_KPOS),
    "t5_bias decoder step at offset 1000": lambda a: pe.t5_bias(a["t5"], 1, 40, num_buckets=16, max_distance=32, bidirectional=False, offset=1000),
    "alibi_bias step": lambda a: pe.alibi_bias(a["slopes"], 1, 40),
    "alibi_bias symmetric step at offset 17": lambda a: pe.alibi_bias(a["slopes"], 1, 40, offset=17, symmetric=True),
    "t5_bias per-row offsets": lambda a: pe.t5_bias(a["t5"], 1, 40, num_buckets=16, max_distance=32, offset=torch.tensor([39, 45, 1000])),
    "t5_bias per-row offset of one row": lambda a: pe.t5_bias(a["t5"], 1, 40, num_buckets=16, max_distance=32, offset=torch.tensor([41])),
    "alibi_bias per-row offsets of 2 queries": lambda a: pe.alibi_bias(a["slopes"], 2, 40, offset=torch.tensor([38, 3], dtype=torch.int32)),
    "alibi_bias positions": lambda a: pe.alibi_bias(a["slopes"], 9, 40, query_positions=_QPOS, key_positions=_KPOS),
    "shaw_logits step": lambda a: pe.shaw_logits(a["q1"], a["k"], a["shaw"], max_distance=6),
    "shaw_logits prefill": lambda a: pe.shaw_logits(a["q"], a["k"], a["shaw"], max_distance=6),
    "deberta_logits step": lambda a: pe.deberta_logits(a["q1"], a["k"], a["pos"], a["pos"] * 0.5, max_distance=6),
    "deberta_logits prefill": lambda a: pe.deberta_logits(a["q"], a["k"], a["pos"], a["pos"] * 0.5, max_distance=6, bucket_size=4, max_position=64),
    "shaw_logits per-row offsets": lambda a: pe.shaw_logits(a["q1"], a["k"], a["shaw"], max_distance=6, offset=torch.tensor([39, 1000])),
    "deberta_logits per-row offsets of a prefill": lambda a: pe.deberta_logits(
        a["q"], a["k"], a["pos"], a["pos"] * 0.5, max_distance=6, bucket_size=4, max_position=64, offset=torch.tensor([31, 35], dtype=torch.int32),
    ),  # fmt: skip
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", RECORDED)
def test_a_call_autograd_records_gets_the_cold_calls_gradients_from_the_third_call_on(name, dtype):
    """The plans' gathers and slices have other backwards than the full path's custom ops
    (``toeplitz_scatter`` sums in float64): their gradients were an ulp or two off the first
    two calls' (relative 1e-7 in float32, 1e-15 in float64). The biases are planned all the
    same: a decode step's row gathered in the full path's order and read backwards; per-token
    values finished (the table read, the slopes multiplied) once per pair, as the full path does."""

    def grads():
        arrays = {n: a.clone().requires_grad_() for n, a in _R[dtype].items()}
        result = RECORDED[name](arrays)
        (result * torch.linspace(-1, 1, result.numel(), dtype=dtype).reshape(result.shape)).sum().backward()
        return (result.detach(), *(a.grad for a in arrays.values() if a.grad is not None))

    cold = _cold(grads)
    for _ in range(4):
        _same(grads(), cold)
    if "bias" in name:
        assert _served(pe.relative_bias) == ["RowsPlan" if "per-row" in name else "PerTokenPlans" if "positions" in name else "BiasPlan"]
    elif "per-row" in name:
        assert _served(pe.shaw_logits) + _served(pe.deberta_logits) == ["ShawPlan" if "shaw" in name else "DebertaPlan"]
    _clear()


CHUNKED = {
    "shaw_logits float16": (pe.shaw_logits, lambda o: _shaw(X.astype(np.float16), SHAW_K.astype(np.float16), SHAW_TABLE.astype(np.float16), offset=o)),
    "deberta_logits float32": (pe.deberta_logits, lambda o: _deberta(X, SHAW_K, offset=o, **BUCKETS)),
    "deberta_logits float16, pos_k with a batch axis": (
        pe.deberta_logits, lambda o: _deberta(X.astype(np.float16), SHAW_K.astype(np.float16), POS_Q, np.stack([POS_K, -POS_K]), offset=o),
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", CHUNKED)
def test_per_row_logits_a_chunk_of_rows_at_a_time_give_the_whole_batchs_bits(name, monkeypatch):
    """NumPy's plans of one offset per batch row cast the keys and multiply them with the
    tables a chunk of rows at a time where those intermediates pass ``_logits_plan.CHUNK``
    bytes (here 1: a row a chunk): every row the bits of the whole batch's call, cold, and of
    its own offset's."""
    from posenc.relative import _logits_plan

    monkeypatch.setattr(_logits_plan, "CHUNK", 1)
    fn, call = CHUNKED[name]
    _clear()
    for _ in range(2):
        call(np.array([5, 9]))
    assert [plan.chunk for plan in fn.plans.values() if plan] == [1]
    for offsets in (np.array([7, 3]), np.array([0, 2**40]), np.array([-4, 12], np.int32)):
        rows = call(offsets)
        _same(rows, _cold(lambda: call(offsets)))
        call(np.array([5, 9]))
        call(np.array([5, 9]))
        for b, offset in enumerate(offsets.tolist()):
            _same(rows[b], call(offset)[b])
    _clear()


def test_rope_plans_posencs_static_scalings_only():
    """A scaling of the user's own (its fields may change between calls) takes the full path
    every call; equal scalings of posenc's share a plan; a plan in place, a negative
    ``seq_len`` meets the full path's error."""
    from dataclasses import dataclass

    @dataclass
    class Halved(pe.scaling.Scaling):  # a user's mutable scaling: frequencies / factor
        factor: float = 2.0

        def frequencies(self, dim, base, seq_len=None):
            return pe.rope_frequencies(dim, base=base)[0] / self.factor, 1.0

    _clear()
    users = Halved()
    for _ in range(3):
        pe.rope(X1, offset=7, scaling=users)
    assert not _served(pe.rope)
    users.factor = 4.0
    np.testing.assert_array_equal(pe.rope(X1, offset=7, scaling=users), _cold(lambda: pe.rope(X1, offset=7, scaling=pe.scaling.Linear(4.0))))
    for _ in range(3):
        pe.rope(X1, offset=7, scaling=pe.scaling.Llama3(8.0, 8192))
    pe.rope(X1, offset=7, scaling=pe.scaling.Llama3(8.0, 8192))
    assert _served(pe.rope) == ["RotatePlan"]
    dynamic = pe.scaling.DynamicNTK(2.0, 4)
    for _ in range(3):
        pe.rope(X1, offset=7, scaling=dynamic, seq_len=9)
    with pytest.raises(ValueError, match="seq_len"):
        pe.rope(X1, offset=7, scaling=dynamic, seq_len=-1)
    _clear()


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_rotate_pair_on_a_cpu_is_planned_by_its_two_apply_rope_plans(library):
    """``rotate_pair`` (an attention layer's q and k: ``patch_hf``'s and the HF drop-in's
    ``apply_rotary_pos_emb``) is served on a CPU by the plans its two ``apply_rope`` calls
    made, under one key; torch CUDA tensors get one launch (``test_cuda_torch.py``)."""
    make = np.asarray if library == "numpy" else torch.as_tensor
    q, k = make(X), make(X[:, :1])
    tables = [pe.rope_cos_sin(make(np.arange(3) + t), INV) for t in range(5)]
    cold = [_cold(lambda: (pe.apply_rope(q, cos, sin), pe.apply_rope(k, cos, sin))) for cos, sin in tables]
    for (cos, sin), want in zip(tables, cold):
        _same(rotate_pair(q, k, cos, sin), want)
    assert _served(rotate_pair) == ["PairPlan"]
    _clear()


def test_logits_calls_past_the_plans_bound_are_not_planned():
    from posenc.relative import _logits_plan

    _clear()
    k = np.zeros((1, 1, _logits_plan.LARGEST + 1, DIM), np.float32)
    for _ in range(3):
        _shaw(X1[:, :1], k, offset=5)
        _deberta(X1[:, :1], k, POS_Q[:1], POS_K[:1], query_positions=np.array([5]))
    assert len(pe.shaw_logits.plans) == len(pe.deberta_logits.plans) == 1
    assert not any(pe.shaw_logits.plans.values()) and not any(pe.deberta_logits.plans.values())
    _clear()


def test_hf_rotary_embedding_with_position_ids_gives_the_cold_calls_bits():
    from transformers import LlamaConfig

    module = _hf.HFRotaryEmbedding(LlamaConfig(hidden_size=HEADS * DIM, num_attention_heads=HEADS))
    for t in STEPS[:-1]:
        ids = torch.tensor([[t]])
        _same(module(T_X1, ids), _cold(lambda: module(T_X1, ids)))


# ---------------------------------------------------------------- hostile input, cold and planned


def _jax_arange(n):
    """Positions of a second device library (two are refused; a NumPy array among torch ones is converted)."""
    return pytest.importorskip("jax.numpy").arange(n)


def _spoil(a, value):
    a[...] = value
    return a


def _error(call):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return type(info.value), str(info.value)


# name: (call(array), a good array, a bad one, spoil(good array) -> it made bad in place, or
# None where the bad one differs in its metadata)
HOSTILE = {
    "rope NaN positions": (lambda p: pe.rope(X1, p), lambda: np.array([3.0]), lambda: np.array([np.nan]), lambda a: _spoil(a, np.nan)),
    "rope inf positions": (lambda p: pe.rope(X, p), lambda: np.arange(3.0), lambda: np.array([0.0, np.inf, 2.0]), lambda a: _spoil(a, [0.0, np.inf, 2.0])),
    "rope torch NaN positions": (lambda p: pe.rope(T_X1, p), lambda: torch.tensor([[3.0]]), lambda: torch.tensor([[float("nan")]]), lambda a: _spoil(a, float("nan"))),
    "rope NaN positions with an offset": (lambda p: pe.rope(X1, p, offset=4), lambda: np.array([3.0]), lambda: np.array([np.nan]), lambda a: _spoil(a, np.nan)),
    "rope float per-row offset": (lambda o: pe.rope(X, offset=o), lambda: np.array([1, 2]), lambda: np.array([1.0, 2.0]), None),
    "rope positions of another length": (lambda p: pe.rope(X, p), lambda: np.arange(3), lambda: np.arange(4), None),
    "rope positions of another library": (lambda p: pe.rope(T_X, p), lambda: torch.arange(3), lambda: _jax_arange(3), None),
    "rope positions on another device": (lambda p: pe.rope(T_X, p), lambda: torch.arange(3), lambda: torch.arange(3, device="meta"), None),
    # A 0-d offset or frequencies on another device, not read now (torch's RuntimeError once computing).
    "rope 0-d offset on another device": (lambda o: pe.rope(T_X, offset=o), lambda: torch.tensor(3), lambda: torch.tensor(3, device="meta"), None),
    "rope_cos_sin frequencies on another device": (
        lambda f: pe.rope_cos_sin(torch.arange(3), f), lambda: torch.from_numpy(INV.copy()), lambda: torch.from_numpy(INV).to("meta"), None,
    ),  # fmt: skip
    "rope per-row offset of another length": (lambda o: pe.rope(X, offset=o), lambda: np.array([1, 2]), lambda: np.array([1, 2, 3]), None),
    "rope offset past int64": (lambda p: pe.rope(X, offset=p), lambda: 3, lambda: 2**63 - 2, None),
    # An offset of one integer read as an int: its sums with the positions are still checked.
    "rope 0-d offset whose positions leave int64": (
        lambda o: pe.rope(X, offset=o), lambda: np.array(3), lambda: np.array(2**63 - 2), lambda a: _spoil(a, 2**63 - 2),
    ),  # fmt: skip
    "rope torch 0-d offset whose positions leave int64": (
        lambda o: pe.rope(T_X, offset=o), lambda: torch.tensor(3), lambda: torch.tensor(2**63 - 2), lambda a: _spoil(a, 2**63 - 2),
    ),  # fmt: skip
    "rope torch per-row offset of one row whose positions leave int64": (
        lambda o: pe.rope(T_X[:1], offset=o), lambda: torch.tensor([3]), lambda: torch.tensor([2**63 - 1]), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "rope NumPy scalar offset whose positions leave int64": (lambda o: pe.rope(X, offset=o), lambda: np.int64(3), lambda: np.int64(2**63 - 2), None),
    "rope uint64 0-d offset past int64": (
        lambda o: pe.rope(X, offset=o), lambda: np.array(3, np.uint64), lambda: np.array(2**63, np.uint64), lambda a: _spoil(a, 2**63),
    ),  # fmt: skip
    "rope torch positions past int64 with a 0-d offset": (
        lambda p: pe.rope(T_X1, p, offset=torch.tensor(5)), lambda: torch.tensor([3]), lambda: torch.tensor([2**63 - 3]), lambda a: _spoil(a, 2**63 - 3),
    ),  # fmt: skip
    "rope torch positions past int64 with an int offset": (
        lambda p: pe.rope(T_X1, p, offset=5), lambda: torch.tensor([3]), lambda: torch.tensor([2**63 - 3]), lambda a: _spoil(a, 2**63 - 3),
    ),  # fmt: skip
    "rope torch per-row offsets whose positions leave int64": (
        lambda o: pe.rope(T_X, offset=o), lambda: torch.tensor([3, 4]), lambda: torch.tensor([3, 2**63 - 2]), lambda a: _spoil(a, torch.tensor([3, 2**63 - 2])),
    ),  # fmt: skip
    # Byte-swapped integers: by their dtype's name (">u8" is uint64), not its str.
    "rope byte-swapped uint64 positions past int64": (
        lambda p: pe.rope(X, p), lambda: np.arange(3, dtype=">u8"), lambda: np.array([0, 1, 2**64 - 1], ">u8"), lambda a: _spoil(a, [0, 1, 2**64 - 1]),
    ),  # fmt: skip
    "rope byte-swapped uint64 per-row offsets past int64": (
        lambda o: pe.rope(X, offset=o), lambda: np.array([1, 2], ">u8"), lambda: np.array([1, 2**64 - 1], ">u8"), lambda a: _spoil(a, [1, 2**64 - 1]),
    ),  # fmt: skip
    "rope_cos_sin byte-swapped uint64 positions past int64": (
        lambda p: pe.rope_cos_sin(p, INV), lambda: np.array([3], ">u8"), lambda: np.array([2**64 - 1], ">u8"), lambda a: _spoil(a, 2**64 - 1),
    ),  # fmt: skip
    "t5_bias byte-swapped uint64 per-row offsets past int64": (
        lambda o: pe.t5_bias(TABLE, 2, 8, offset=o), lambda: np.array([3, 4], ">u8"), lambda: np.full(2, 2**64 - 1, ">u8"), lambda a: _spoil(a, 2**64 - 1),
    ),  # fmt: skip
    "rope NumPy float scalar offset": (lambda o: pe.rope(X, offset=o), lambda: np.int64(1), lambda: np.float64(1.0), None),
    "rerotate NaN frequencies": (lambda f: pe.rerotate(X, 3, f), lambda: INV.copy(), lambda: np.full_like(INV, np.nan), lambda a: _spoil(a, np.nan)),
    "rope_cos_sin inf positions": (lambda p: pe.rope_cos_sin(p, INV), lambda: np.array([3.0]), lambda: np.array([np.inf]), lambda a: _spoil(a, np.inf)),
    "rope_cos_sin uint64 positions past int64": (
        lambda p: pe.rope_cos_sin(p, INV), lambda: np.array([3], np.uint64), lambda: np.array([2**63], np.uint64), lambda a: _spoil(a, 2**63),
    ),  # fmt: skip
    "rope_cos_sin torch uint64 positions past int64": (
        lambda p: pe.rope_cos_sin(p, INV), lambda: torch.tensor([3, 4], dtype=torch.uint64), lambda: torch.tensor([-1, 4]).view(torch.uint64), None,
    ),  # fmt: skip
    "alibi_bias NaN query positions": (
        lambda p: pe.alibi_bias(SLOPES, 1, 8, query_positions=p, key_positions=np.arange(8)),
        lambda: np.array([7.0]), lambda: np.array([np.nan]), lambda a: _spoil(a, np.nan),
    ),  # fmt: skip
    "alibi_bias inf key positions": (
        lambda p: pe.alibi_bias(SLOPES, 1, 8, query_positions=np.array([7]), key_positions=p),
        lambda: np.arange(8.0), lambda: np.full(8, -np.inf), lambda a: _spoil(a, -np.inf),
    ),  # fmt: skip
    "alibi_bias torch NaN key positions": (
        lambda p: pe.alibi_bias(T_SLOPES, 1, 8, query_positions=torch.tensor([7]), key_positions=p),
        lambda: torch.arange(8.0), lambda: torch.full((8,), float("nan")), lambda a: _spoil(a, float("nan")),
    ),  # fmt: skip
    "t5_bias float positions": (lambda p: pe.t5_bias(TABLE, 1, 8, query_positions=p), lambda: np.array([7]), lambda: np.array([7.0]), None),
    "t5_bias positions of another length": (lambda p: pe.t5_bias(TABLE, 1, 8, key_positions=p), lambda: np.arange(8), lambda: np.arange(7), None),
    "t5_bias positions of another library": (lambda p: pe.t5_bias(T_TABLE, 1, 8, key_positions=p), lambda: torch.arange(8), lambda: _jax_arange(8), None),
    "t5_bias positions whose batches disagree": (
        lambda p: pe.t5_bias(TABLE, 1, 8, query_positions=p, key_positions=np.zeros((3, 8), np.int64)),
        lambda: np.zeros((3, 1), np.int64), lambda: np.zeros((2, 1), np.int64), None,
    ),  # fmt: skip
    "T5RelativeBias float positions": (lambda p: _inferred(lambda: T5_MODULE(1, 8, query_positions=p)), lambda: torch.tensor([7]), lambda: torch.tensor([7.0]), None),
    # Integer positions whose sums leave int64 (the per-token plans index their kept window without forming them).
    "t5_bias key positions whose differences leave int64": (
        lambda p: pe.t5_bias(TABLE, 1, 8, query_positions=np.array([7]), key_positions=p),
        lambda: np.arange(8), lambda: np.full(8, -(2**63)), lambda a: _spoil(a, -(2**63)),
    ),  # fmt: skip
    "alibi_bias query positions past int64 with the offset": (
        lambda p: pe.alibi_bias(SLOPES, 1, 8, offset=5, query_positions=p, key_positions=np.arange(8)),
        lambda: np.array([7]), lambda: np.array([2**63 - 1]), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "t5_bias batched query positions whose differences leave int64": (
        lambda p: pe.t5_bias(TABLE, 1, 8, query_positions=p, key_positions=-np.arange(8)),
        lambda: np.array([[0], [1]]), lambda: np.full((2, 1), 2**63 - 1), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "t5_bias torch key positions whose differences leave int64": (
        lambda p: pe.t5_bias(T_TABLE, 1, 8, query_positions=torch.tensor([7]), key_positions=p),
        lambda: torch.arange(8), lambda: torch.full((8,), -(2**63)), lambda a: _spoil(a, -(2**63)),
    ),  # fmt: skip
    "ALiBi query positions past int64 with the offset": (
        lambda p: ALIBI_MODULE(1, 8, offset=5, query_positions=p, key_positions=torch.arange(8)),
        lambda: torch.tensor([7]), lambda: torch.tensor([2**63 - 1]), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "t5_bias float per-row offsets": (lambda o: pe.t5_bias(TABLE, 1, 8, offset=o), lambda: np.array([1, 2]), lambda: np.array([1.0, 2.0]), None),
    "t5_bias uint64 per-row offsets past int64": (
        lambda o: pe.t5_bias(TABLE, 1, 8, offset=o), lambda: np.array([3, 4], np.uint64), lambda: np.full(2, 2**64 - 1, np.uint64), lambda a: _spoil(a, 2**64 - 1),
    ),  # fmt: skip
    "t5_bias per-row offsets whose queries leave int64 (one key)": (
        lambda o: pe.t5_bias(TABLE, 2, 1, offset=o), lambda: np.array([3, 4]), lambda: np.full(2, 2**63 - 1), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "alibi_bias torch per-row offsets whose distances leave int64": (
        lambda o: pe.alibi_bias(T_SLOPES, 1, 8, offset=o), lambda: torch.tensor([3, 4]), lambda: torch.full((2,), -(2**63)), lambda a: _spoil(a, -(2**63)),
    ),  # fmt: skip
    "t5_bias torch int32 per-row offsets on another device": (
        lambda o: pe.t5_bias(T_TABLE, 1, 8, offset=o), lambda: torch.tensor([3, 4], dtype=torch.int32), lambda: torch.tensor([3, 4], device="meta"), None,
    ),  # fmt: skip
    "shaw_logits float positions": (lambda p: _shaw(X1, SHAW_K[:1], query_positions=p), lambda: np.array([7]), lambda: np.array([7.0]), None),
    "shaw_logits positions of another length": (lambda p: _shaw(X, SHAW_K, key_positions=p), lambda: np.arange(8), lambda: np.arange(7), None),
    "shaw_logits positions whose batches disagree": (
        lambda p: _shaw(X, SHAW_K, query_positions=p, key_positions=np.zeros((2, 8), np.int64)),
        lambda: np.zeros((2, 3), np.int64), lambda: np.zeros((3, 3), np.int64), None,
    ),  # fmt: skip
    "shaw_logits positions of another library": (lambda p: _shaw(T_X, T_SHAW_K, T_SHAW_TABLE, key_positions=p), lambda: torch.arange(8), lambda: _jax_arange(8), None),
    "shaw_logits positions on another device": (
        lambda p: _shaw(T_X, T_SHAW_K, T_SHAW_TABLE, key_positions=p), lambda: torch.arange(8), lambda: torch.arange(8, device="meta"), None,
    ),  # fmt: skip
    "shaw_logits relative positions past int64": (
        lambda p: _shaw(X1, SHAW_K[:1], query_positions=np.array([-5]), key_positions=p),
        lambda: np.arange(8), lambda: np.full(8, 2**63 - 1), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "shaw_logits torch offset + positions past int64": (
        lambda p: _shaw(T_X1, T_SHAW_K[:1], T_SHAW_TABLE, query_positions=p, offset=7),
        lambda: torch.tensor([[3]]), lambda: torch.tensor([[2**63 - 3]]), lambda a: _spoil(a, 2**63 - 3),
    ),  # fmt: skip
    "shaw_logits uint64 positions past int64": (
        lambda p: _shaw(X1, SHAW_K[:1], query_positions=p), lambda: np.array([3], np.uint64), lambda: np.array([2**63], np.uint64), lambda a: _spoil(a, 2**63),
    ),  # fmt: skip
    "shaw_logits offset past int64": (lambda o: _shaw(X1, SHAW_K[:1], offset=o), lambda: 3, lambda: -(2**63) + 3, None),
    "shaw_logits uint64 per-row offsets past int64": (
        lambda o: _shaw(X, SHAW_K, offset=o), lambda: np.array([3, 4], np.uint64), lambda: np.full(2, 2**63, np.uint64), lambda a: _spoil(a, 2**63),
    ),  # fmt: skip
    "shaw_logits per-row offsets whose queries leave int64": (
        lambda o: _shaw(X, SHAW_K, offset=o), lambda: np.array([3, 4]), lambda: np.full(2, 2**63 - 2), lambda a: _spoil(a, 2**63 - 2),
    ),  # fmt: skip
    "shaw_logits float per-row offsets": (lambda o: _shaw(X, SHAW_K, offset=o), lambda: np.array([1, 2]), lambda: np.array([1.0, 2.0]), None),
    "shaw_logits per-row offsets of another length": (lambda o: _shaw(X, SHAW_K, offset=o), lambda: np.array([1, 2]), lambda: np.array([1, 2, 3]), None),
    "score_mod float 0-d offset": (lambda o: _flex("t5", T_TABLE, o), lambda: torch.tensor(3), lambda: torch.tensor(3.0), None),
    "score_mod 1-d offset": (lambda o: _flex("t5", T_TABLE, o), lambda: torch.tensor(3), lambda: torch.tensor([3]), None),
    "score_mod 0-d offset past int64": (lambda o: _flex("t5", T_TABLE, o), lambda: torch.tensor(3), lambda: torch.tensor(-(2**63)), lambda a: _spoil(a, -(2**63))),
    "deberta_logits float positions": (lambda p: _deberta(X1, SHAW_K[:1], query_positions=p), lambda: np.array([7]), lambda: np.array([7.0]), None),
    "deberta_logits positions of another length": (lambda p: _deberta(X, SHAW_K, key_positions=p, **BUCKETS), lambda: np.arange(8), lambda: np.arange(9), None),
    "deberta_logits a term's table missing": (lambda t: _deberta(X1, SHAW_K[:1], t, offset=3), lambda: POS_Q.copy(), lambda: None, None),
    "deberta_logits relative positions past int64": (
        lambda p: _deberta(X1, SHAW_K[:1], query_positions=p, key_positions=-np.arange(8), **BUCKETS),
        lambda: np.array([3]), lambda: np.array([2**63 - 1]), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
    "deberta_logits torch per-row offsets whose distances leave int64": (
        lambda o: _deberta(T_X1, T_SHAW_K, T_POS_Q, T_POS_K, offset=o), lambda: torch.tensor([3, 4]), lambda: torch.full((2,), -(2**63)), lambda a: _spoil(a, -(2**63)),
    ),  # fmt: skip
    "deberta_logits torch relative positions past int64": (
        lambda p: _deberta(T_X1, T_SHAW_K[:1], T_POS_Q, T_POS_K, query_positions=torch.tensor([[-3]]), key_positions=p),
        lambda: torch.arange(8), lambda: torch.full((8,), 2**63 - 1), lambda a: _spoil(a, 2**63 - 1),
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_gets_the_full_paths_error_cold_planned_and_spoiled(name):
    call, good, bad, spoil = HOSTILE[name]
    _clear()
    cold = _error(lambda: call(bad()))
    served = good()
    for _ in range(3):  # the good signature is planned, and the plan has served it (what it keeps is set)
        call(served)
    assert any(any(fn.plans.values()) for fn in PLANNED)
    assert _error(lambda: call(bad())) == cold
    if spoil is not None:
        assert _error(lambda: call(spoil(served))) == cold
    call(good())  # and still serves good input
    _clear()


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_per_token_bias_plan_refuses_a_query_past_int64_whose_distances_it_keeps(lib):
    """``offset + query_positions`` leaves int64 while every distance to the keys is one the
    plan's window holds (the same distances as the good call's): the full path's error."""
    arange = np.arange if lib == "numpy" else torch.arange
    offset, table = 2**63 - 105, TABLE if lib == "numpy" else T_TABLE

    def call(query, keys):
        return pe.t5_bias(table, 1, 8, offset=offset, query_positions=arange(query, query + 1), key_positions=keys)

    _clear()
    cold = _error(lambda: call(110, arange(8) + 10))
    assert "offset + query_positions must stay within int64" in cold[1]
    for _ in range(3):  # planned, and its window holds the distances 2**63 - 12 .. 2**63 - 5
        call(100, arange(8))
    assert _error(lambda: call(110, arange(8) + 10)) == cold
    _clear()


# A layout by its earlier name ("split" for "half"): the full path warns (FutureWarning)
# and computes "half"; a plan built for it served later calls silently, and apply_rope's and
# rope_cos_sin's read "split" as interleaved. Calls that name it are never planned.
SPLIT = {
    "rope": (pe.rope, lambda layout: pe.rope(X, np.arange(3) + 5, layout=layout)),
    "rope offset": (pe.rope, lambda layout: pe.rope(X, offset=5, layout=layout)),
    "apply_rope": (pe.apply_rope, lambda layout: pe.apply_rope(X1, *pe.rope_cos_sin(np.array([5]), INV), layout=layout)),
    "rope_cos_sin": (pe.rope_cos_sin, lambda layout: pe.rope_cos_sin(np.array([3, 4]), INV, layout=layout)),
    "rerotate": (pe.rerotate, lambda layout: pe.rerotate(X, 3, np.asarray(INV), layout=layout)),
}


@pytest.mark.parametrize("name", SPLIT)
def test_a_layouts_earlier_name_warns_and_means_half_on_every_call(name):
    fn, call = SPLIT[name]
    _clear()
    half = _cold(lambda: call("half"))
    for _ in range(4):
        with pytest.warns(FutureWarning, match='layout="split" is the earlier name of "half"'):
            _same(call("split"), half)
    assert not _served(fn)


def test_a_numpy_constant_among_torch_arrays_is_converted_on_every_call():
    """``host_constants`` converts a NumPy ``positions`` (or ``cos``/``sin``) to torch on the
    full path; a plan's key refuses the mix, so no plan ever gets the NumPy array as it is."""
    _clear()
    cos, sin = pe.rope_cos_sin(np.array([5]), INV)
    for _ in range(4):
        _same(pe.rope(T_X1, np.array([[5]])), _cold(lambda: pe.rope(T_X1, torch.tensor([[5]]))))
        _same(pe.apply_rope(T_X1, cos, sin), _cold(lambda: pe.apply_rope(T_X1, torch.from_numpy(cos), torch.from_numpy(sin))))
    assert not _served(pe.rope) and not _served(pe.apply_rope)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_numpy_scalar_argument_is_passed_as_it_is_without_binding_the_signature(monkeypatch, library):
    """``host_constants`` never converts a NumPy scalar (an ``np.int64`` cache length), so a
    call holding one takes its fast exit rather than binding the signature (``alibi_bias``
    of 16 heads over 512 keys, offset ``np.int64(511)``: 42 us against 7 us for an int)."""
    from posenc import _xp

    slopes, table = pe.alibi_slopes(4).astype(np.float32), np.random.default_rng(0).standard_normal((32, 4))
    if library == "torch":
        slopes, table = torch.from_numpy(slopes), torch.from_numpy(table)
    want = [(pe.alibi_bias(slopes, 1, 9, offset=t), pe.t5_bias(table, 1, 9, offset=t)) for t in (0, 8, 300)]

    def refused(fn):
        raise AssertionError(f"{fn.__name__}'s signature bound for a NumPy scalar")

    monkeypatch.setattr(_xp, "_signature", refused)
    for t, (alibi, t5) in zip((0, 8, 300), want):
        for offset in (np.int64(t), np.uint16(t), np.int32(t)):
            _same(pe.alibi_bias(slopes, 1, 9, offset=offset), alibi)
            _same(pe.t5_bias(table, 1, 9, offset=offset), t5)


def test_a_modules_parameter_beside_a_tensor_is_passed_as_it_is_without_binding_the_signature(monkeypatch):
    """A ``Parameter`` (``T5RelativeBias``'s table) beside a tensor offset or positions is one
    library, nothing to convert: ``host_constants`` took it for two and bound the signature
    on every call (the module's decode step, 16 heads, 512 keys: 45 us with a 0-d offset,
    47 us with positions, 106 us with 8 row offsets, against 25, 27 and 74 us now). The
    module's call is its function's plan, with the cold bits."""
    from posenc import _xp

    module = _t5_module()
    calls = [
        {"offset": torch.tensor(511)}, {"offset": torch.tensor([503, 511, 0])},
        {"query_positions": torch.tensor([[511]]), "key_positions": torch.arange(512)[None]},
    ]  # fmt: skip
    with torch.no_grad():
        cold = [_cold(lambda: module(1, 512, **kwargs)) for kwargs in calls]

        def refused(fn):
            raise AssertionError(f"{fn.__name__}'s signature bound for a Parameter beside a tensor")

        monkeypatch.setattr(_xp, "_signature", refused)
        for kwargs, expected in zip(calls, cold):
            for _ in range(3):
                _same(module(1, 512, **kwargs), expected)
                _same(pe.t5_bias(module.table, 1, 512, **kwargs), expected)
    assert set(_served(pe.relative_bias)) == {"BiasPlan", "PerTokenPlans", "RowsPlan"}
    _clear()


# ---------------------------------------------------------------- the caches


def test_a_plan_cache_drops_its_least_recently_used_plan():
    cache = _plans.PlanCache(limit=3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("d", "D")
    assert list(cache) == ["c", "a", "d"]
    assert cache.get("b") is None
    cache.put("e", "E")
    assert list(cache) == ["a", "d", "e"]


def test_a_planned_function_keeps_its_recent_signatures_past_the_bound(monkeypatch):
    _clear()
    limit = 4
    monkeypatch.setattr(pe.rope.plans, "limit", limit)
    xs = [np.zeros((1, HEADS, n, DIM), np.float32) for n in range(1, 2 * limit + 1)]
    kept = xs[0]
    for x in xs:
        pe.rope(x, offset=1)
        pe.rope(kept, offset=1)  # used again between every new signature
    assert len(pe.rope.plans) == limit
    shapes = {key[1][1] for key in pe.rope.plans}
    assert kept.shape in shapes and xs[-1].shape in shapes and xs[1].shape not in shapes
    _clear()


def test_a_rope_plan_splits_a_call_over_the_threads_numba_allows_at_the_call(monkeypatch):
    """``numba.set_num_threads`` after a signature's plan was built (a server lowering its
    threads after warm-up): the full path asks Numba's count on every call, a plan kept the
    count of its build, so planned calls went on using the threads taken back."""
    from posenc._kernels import _layout, rope_cpu

    monkeypatch.setattr(rope_cpu, "_ELEMENTS_PER_THREAD", 64)
    monkeypatch.setattr(_layout, "threads", lambda: 3)
    pe.rope.plans.clear()
    x = np.ones((1, 3, 61, 16), np.float32)
    want = pe.rope(x, offset=5)
    pe.rope(x, offset=5)  # the plan, built with 3 threads
    pieces = []
    split = _layout.run_tasks
    monkeypatch.setattr(_layout, "run_tasks", lambda kernel, args, tasks, workers: pieces.append(len(workers)) or split(kernel, args, tasks, workers))
    for threads, split_into in ((1, []), (2, [2]), (3, [2, 3])):
        monkeypatch.setattr(_layout, "threads", lambda: threads)
        np.testing.assert_array_equal(pe.rope(x, offset=5), want)
        assert pieces == split_into


def test_other_threads_calls_between_any_two_lines_of_a_plan_cache_step(monkeypatch):
    """Another thread's calls of new signatures, run between any two lines of the cache's
    ``get`` and ``put`` (a thread switch there), never make a call fail or change its numbers:
    one that drops the key a ``put`` has just stored, before it is made the most recent,
    made that call raise ``KeyError``."""
    import itertools
    import sys
    import threading

    _clear()
    monkeypatch.setattr(pe.rope.plans, "limit", 2)
    want = _cold(lambda: pe.rope(X, offset=5))
    lengths, inside = itertools.count(X.shape[-2] + 1), []

    def others():
        for _ in range(2):
            pe.rope(np.zeros((1, HEADS, next(lengths), DIM), np.float32))

    def switching(frame, event, arg):
        if event == "line" and not inside:
            inside.append(frame.f_lineno)
            thread = threading.Thread(target=others)
            thread.start()
            thread.join()
            inside.clear()
        return switching

    def tracer(frame, event, arg):
        steps = (_plans.PlanCache.get.__code__, _plans.PlanCache.put.__code__)
        return switching if frame.f_code in steps else None

    previous = sys.gettrace()
    for _ in range(4):  # seen, planned, served
        sys.settrace(tracer)
        try:
            found = pe.rope(X, offset=5)
        finally:
            sys.settrace(previous)
        _same(found, want)
    _clear()


def _freed(make, call):
    """Whether the arrays ``make()`` returns die once the caller drops them, after planned calls."""
    arrays = make()
    call(*arrays)
    call(*arrays)
    assert any(any(fn.plans.values()) for fn in PLANNED)
    refs = [weakref.ref(a) for a in arrays]
    del arrays
    gc.collect()
    return [ref() is None for ref in refs]


KEPT = {
    "rope offset": (lambda: (np.ones((1, HEADS, 2, DIM), np.float32),), lambda x: pe.rope(x, offset=3)),
    "rope positions": (lambda: (np.ones((1, HEADS, 2, DIM), np.float32), np.arange(2)), lambda x, p: pe.rope(x, p)),
    "rope torch positions": (lambda: (torch.ones(1, HEADS, 2, DIM), torch.arange(2)[None]), lambda x, p: pe.rope(x, p)),
    "apply_rope torch": (
        lambda: (torch.ones(1, HEADS, 2, DIM), *pe.rope_cos_sin(torch.arange(2), INV)),
        lambda x, c, s: pe.apply_rope(x, c, s),
    ),
    "apply_rope numpy": (lambda: (np.ones((1, HEADS, 2, DIM)), *pe.rope_cos_sin(np.arange(2), INV, dtype=np.float64)), pe.apply_rope),
    "hf apply_rotary_pos_emb": (
        lambda: (torch.ones(1, HEADS, 2, DIM), torch.ones(1, 2, 2, DIM), *(c[None] for c in pe.rope_cos_sin(torch.arange(2), INV))),
        _hf.apply_rotary_pos_emb,
    ),
    "rerotate": (lambda: (np.ones((1, HEADS, 2, DIM)), INV.copy()), lambda x, f: pe.rerotate(x, 2, f)),
    "rope_cos_sin": (lambda: (np.arange(2), INV.copy()), pe.rope_cos_sin),
    "t5_bias positions": (lambda: (TABLE.copy(), np.array([3]), np.arange(8)), lambda t, q, k: pe.t5_bias(t, 1, 8, query_positions=q, key_positions=k)),
    "alibi_bias offset": (lambda: (SLOPES.copy(),), lambda s: pe.alibi_bias(s, 1, 8)),
    "t5_bias per-row offsets": (lambda: (TABLE.copy(), np.array([7, 9])), lambda t, o: pe.t5_bias(t, 2, 8, offset=o)),
    "alibi_bias torch bfloat16 per-row offsets": (lambda: (T_SLOPES.bfloat16(), torch.tensor([7, 9])), lambda s, o: pe.alibi_bias(s, 1, 8, offset=o)),
    "t5_bias torch per-row offset of one row": (lambda: (T_TABLE.clone(), torch.tensor([7])), lambda t, o: pe.t5_bias(t, 1, 8, offset=o)),
    "shaw_logits offset": (lambda: (X1.copy(), SHAW_K[:1].copy(), SHAW_TABLE.copy()), lambda q, k, t: _shaw(q, k, t, offset=5)),
    "shaw_logits torch per-row offsets": (
        lambda: (T_X1.clone(), T_SHAW_K.clone(), T_SHAW_TABLE.clone(), torch.tensor([5, 9])), lambda q, k, t, o: _shaw(q, k, t, offset=o),
    ),  # fmt: skip
    "shaw_logits torch positions": (
        lambda: (T_X1.clone(), T_SHAW_K[:1].clone(), T_SHAW_TABLE.clone(), torch.tensor([[5]]), torch.arange(8)),
        lambda q, k, t, qp, kp: _shaw(q, k, t, query_positions=qp, key_positions=kp),
    ),
    "deberta_logits positions": (
        lambda: (X1.copy(), SHAW_K[:1].copy(), POS_Q.copy(), POS_K.copy(), np.array([5]), np.arange(8)),
        lambda q, k, pq, pk, qp, kp: _deberta(q, k, pq, pk, query_positions=qp, key_positions=kp, **BUCKETS),
    ),
}


@pytest.mark.parametrize("name", KEPT)
def test_a_plan_keeps_no_callers_array_alive(name):
    _clear()
    make, call = KEPT[name]
    assert all(_freed(make, call)), name
    _clear()


def test_a_plan_that_cannot_be_built_leaves_the_call_to_the_full_path(monkeypatch):
    """A signature whose plan build raises keeps its results (the full path's), says so once
    as a RuntimeWarning, and stays on the full path."""
    from posenc._kernels import rope_plan

    def broken(*args, **kwargs):
        raise AttributeError("a builder's bug")

    monkeypatch.setattr(rope_plan, "build_rotate", broken)
    _clear()
    want = _cold(lambda: pe.rope(X, offset=3))
    _same(pe.rope(X, offset=3), want)
    with pytest.warns(RuntimeWarning, match="no plan for this call signature .AttributeError: a builder's bug"):
        _same(pe.rope(X, offset=3), want)
    _same(pe.rope(X, offset=3), want)  # no second warning (filterwarnings = error)
    assert not _served(pe.rope)
    _clear()


def test_a_rerotate_plan_gives_each_thread_its_own_frequencies(monkeypatch):
    """A thread that brings new frequencies to a ``rerotate`` plan while another thread is
    between reading its own and rotating by them: each call rotates by the frequencies it
    was given (the second thread's call runs inside the first's, once the first has read
    its new frequencies)."""
    import threading

    from posenc._kernels import rope_plan

    other = INV * 0.5
    want = {f.tobytes(): _cold(lambda f=f: pe.rerotate(X, 3, f)) for f in (INV, other)}
    pe.rerotate(X, 3, INV), pe.rerotate(X, 3, INV)  # seen, planned
    found = []
    angles = rope_plan._angles

    def interrupted(*args):
        angles(*args)
        if not found:
            thread = threading.Thread(target=lambda: found.append(pe.rerotate(X, 3, INV)))
            thread.start()
            thread.join()

    monkeypatch.setattr(rope_plan, "_angles", interrupted)
    found.append(pe.rerotate(X, 3, other))
    assert _served(pe.rerotate) == ["RerotatePlan"]
    _same(found[0], want[INV.tobytes()])
    _same(found[1], want[other.tobytes()])
    _clear()
