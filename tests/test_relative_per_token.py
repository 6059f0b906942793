"""Per-token positions (issue 23 item 3) for every bias and relative-logits function, against
the formulas written out here: ``rel = query_positions[..., i] - key_positions[..., j]``.
Covers padded batches (batch axes), packed documents and a packed decode step."""

from __future__ import annotations

import math

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close, without_float64
from formulas import hf_deberta_bucket, hf_t5_bucket

RNG = np.random.default_rng(23)
CU = np.array([0, 3, 7, 12])  # three packed documents of 3, 4 and 5 tokens
PACKED = pe.positions_from_cu_seqlens(CU, 12)
LEFT_PADDED = pe.positions_from_mask(np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]))  # [2, 6]


def _rel(qpos, kpos):
    return np.asarray(qpos)[..., :, None] - np.asarray(kpos)[..., None, :]


def _t5(table, rel, bidirectional=True, max_distance=128):
    # T5's own bucket of key - query, then table[bucket, h] with heads before (q, k).
    bucket = hf_t5_bucket(-rel, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance)
    return np.moveaxis(table[bucket], -1, -3)


def test_t5_bias_per_token_is_the_table_at_the_bucket_of_each_pair():
    table = RNG.standard_normal((32, 3))
    got = pe.t5_bias(table, 12, 12, query_positions=PACKED, key_positions=PACKED)
    np.testing.assert_array_equal(got, _t5(table, _rel(PACKED, PACKED)))
    np.testing.assert_array_equal(got, np.moveaxis(table[pe.t5_bucket(PACKED[:, None] - PACKED[None, :])], -1, 0))


def test_t5_bias_per_token_with_batch_axes():
    table = RNG.standard_normal((16, 2))
    queries = LEFT_PADDED[:, -2:]
    got = pe.t5_bias(table, 2, 6, bidirectional=False, max_distance=20, query_positions=queries, key_positions=LEFT_PADDED)
    assert got.shape == (2, 2, 2, 6)
    np.testing.assert_array_equal(got, _t5(table, _rel(queries, LEFT_PADDED), bidirectional=False, max_distance=20))


def test_packed_t5_decode_step_equals_a_full_recompute():
    """The newest token of the last document, after a cache of the others: its row of the
    bias and its attention output equal those of recomputing the whole packed batch."""
    torch = pytest.importorskip("torch")
    table = torch.randn(32, 4, dtype=torch.float64)
    grown = np.array([0, 3, 7, 13])  # one more token in the last document
    pos = torch.from_numpy(pe.positions_from_cu_seqlens(grown, 13))
    doc = torch.from_numpy(np.repeat(np.arange(3), np.diff(grown)))
    q, k, v = (torch.randn(4, 13, 8, dtype=torch.float64) for _ in range(3))
    same_doc = doc[:, None] == doc[None, :]

    full_bias = pe.t5_bias(table, 13, 13, query_positions=pos, key_positions=pos)
    full = pe.attention(q, k, v, bias=full_bias, mask=same_doc, causal=True)
    step_bias = pe.t5_bias(table, 1, 13, query_positions=pos[-1:], key_positions=pos)
    step = pe.attention(q[:, -1:], k, v, bias=step_bias, mask=same_doc[-1:], causal=True)

    torch.testing.assert_close(step_bias, full_bias[:, -1:], rtol=0, atol=0)
    torch.testing.assert_close(step, full[:, -1:], rtol=1e-14, atol=1e-14)
    # And both are the formula: table[t5_bucket(qpos - kpos)].
    want = table[torch.from_numpy(pe.t5_bucket(pos.numpy()[-1:, None] - pos.numpy()[None, :]))].movedim(-1, 0)
    torch.testing.assert_close(step_bias, want, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["t5", "alibi", "shaw", "deberta"])
def test_relative_bias_per_token_every_kind(kind):
    rel = _rel(LEFT_PADDED[:, -3:], LEFT_PADDED)
    if kind == "t5":
        params, options, want = RNG.standard_normal((32, 2)), {}, None
        want = _t5(params, rel)
    elif kind == "alibi":
        params, options = np.array([0.5, 0.25]), {"symmetric": True}
        want = -params[:, None, None] * np.abs(rel)[..., None, :, :]
    elif kind == "shaw":
        params, options = RNG.standard_normal((5, 2)), {"max_distance": 2}
        want = np.moveaxis(params[np.clip(rel, -2, 2) + 2], -1, -3)
    else:
        params, options = RNG.standard_normal((4, 2)), {"max_distance": 2}
        want = np.moveaxis(params[np.clip(rel + 2, 0, 3)], -1, -3)
    got = pe.relative_bias(kind, params, 3, 6, query_positions=LEFT_PADDED[:, -3:], key_positions=LEFT_PADDED, **options)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


def test_offset_shifts_given_query_positions_and_defaults_to_zero_with_them():
    table = RNG.standard_normal((32, 2))
    keys = np.arange(6)
    base = pe.t5_bias(table, 2, 6, query_positions=np.array([1, 2]), key_positions=keys)
    np.testing.assert_array_equal(base, _t5(table, _rel([1, 2], keys)))
    shifted = pe.t5_bias(table, 2, 6, query_positions=np.array([1, 2]), key_positions=keys, offset=3)
    np.testing.assert_array_equal(shifted, _t5(table, _rel([4, 5], keys)))
    # Keys only: the queries take the default positions, the last q_len of arange(k_len).
    np.testing.assert_array_equal(pe.t5_bias(table, 2, 6, key_positions=keys), pe.t5_bias(table, 2, 6))


def naive_shaw(q, k, table, kmax, rel):
    """``q_i . (k_j + table[clip(rel_ij) + K])``, rel ``[batch, q, k]``, q/k ``[batch, heads, n, d]``."""
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for b in range(q.shape[0]):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                a = table[np.clip(rel[b, i, j], -kmax, kmax) + kmax]
                out[b, :, i, j] = np.sum(q[b, :, i] * (k[b, :, j] + a), axis=-1)
    return out


def naive_deberta(q, k, pos_q, pos_k, kmax, rel, bucket=None):
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for b in range(q.shape[0]):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                r = int(rel[b, i, j]) if bucket is None else int(hf_deberta_bucket(np.array([rel[b, i, j]]), *bucket)[0])
                delta = min(max(r + kmax, 0), 2 * kmax - 1)
                qi, kj = q[b, :, i], k[b, :, j]
                out[b, :, i, j] = np.sum(qi * kj + qi * pos_k[:, delta] + kj * pos_q[:, delta], axis=-1)
    return out / math.sqrt(3 * q.shape[-1])


def test_shaw_logits_per_token_with_batch_axes(backend):
    q, k, table = RNG.standard_normal((2, 3, 4, 8)), RNG.standard_normal((2, 3, 6, 8)), RNG.standard_normal((7, 8))
    qpos = LEFT_PADDED[:, -4:]
    got = backend.call(
        lambda *a: pe.shaw_logits(*a[:3], max_distance=3, query_positions=a[3], key_positions=a[4]),
        *(backend.asarray(x) for x in (q, k, table, qpos, LEFT_PADDED)),
    )
    assert_close(got, naive_shaw(q, k, table, 3, _rel(qpos, LEFT_PADDED)), backend=backend, dtype=backend.asarray(q).dtype)


@pytest.mark.parametrize("bucket", [None, (4, 12)])
def test_deberta_logits_per_token_with_batch_axes(backend, bucket):
    q, k = RNG.standard_normal((2, 3, 4, 8)), RNG.standard_normal((2, 3, 6, 8))
    pq, pk = RNG.standard_normal((3, 8, 8)), RNG.standard_normal((3, 8, 8))
    qpos = LEFT_PADDED[:, -4:]
    options = {} if bucket is None else {"bucket_size": bucket[0], "max_position": bucket[1]}
    got = backend.call(
        lambda *a: pe.deberta_logits(*a[:4], max_distance=4, query_positions=a[4], key_positions=a[5], **options),
        *(backend.asarray(x) for x in (q, k, pq, pk, qpos, LEFT_PADDED)),
    )
    want = naive_deberta(q, k, pq, pk, 4, _rel(qpos, LEFT_PADDED), bucket)
    assert_close(got, want, backend=backend, dtype=backend.asarray(q).dtype)


def test_per_token_positions_must_be_integers_for_a_table():
    with pytest.raises(TypeError, match="query_positions must have an integer dtype"):
        pe.t5_bias(np.ones((32, 2)), 1, 3, query_positions=np.array([0.5]))
    with pytest.raises(ValueError, match="key_positions must have k_len = 6 entries"):
        pe.shaw_logits(np.ones((2, 3, 8)), np.ones((2, 6, 8)), np.ones((5, 8)), max_distance=2, key_positions=np.arange(5))
    with pytest.raises(ValueError, match="do not broadcast against the batch axes of q and k"):
        pe.deberta_logits(
            np.ones((2, 1, 3, 8)), np.ones((2, 1, 6, 8)), np.ones((4, 8)), np.ones((4, 8)), max_distance=2,
            key_positions=np.zeros((3, 6), dtype=int),
        )  # fmt: skip


def naive_shaw_output(weights, v, table, kmax, rel):
    """``z_i = sum_j w_ij (v_j + table[clip(rel_ij) + K])``, rel ``[batch, q, k]``, weights ``[batch, heads, q, k]``."""
    out = np.zeros(weights.shape[:-1] + (v.shape[-1],))
    for b in range(weights.shape[0]):
        for i in range(weights.shape[-2]):
            for j in range(weights.shape[-1]):
                a = table[np.clip(rel[b, i, j], -kmax, kmax) + kmax]
                out[b, :, i] += weights[b, :, i, j, None] * (v[b, :, j] + a)
    return out


def test_shaw_output_per_token_with_batch_axes(backend):
    weights, v, table = RNG.random((2, 3, 4, 6)), RNG.standard_normal((2, 3, 6, 5)), RNG.standard_normal((7, 5))
    qpos = LEFT_PADDED[:, -4:]
    got = backend.call(
        lambda *a: pe.shaw_output(*a[:3], max_distance=3, query_positions=a[3], key_positions=a[4]),
        *(backend.asarray(x) for x in (weights, v, table, qpos, LEFT_PADDED)),
    )
    assert_close(got, naive_shaw_output(weights, v, table, 3, _rel(qpos, LEFT_PADDED)), backend=backend, dtype=backend.asarray(v).dtype)


def test_shaw_output_packed_decode_step_is_the_last_row_of_the_full_call():
    weights, v, table = RNG.random((3, 12, 12)), RNG.standard_normal((3, 12, 4)), RNG.standard_normal((5, 4))
    full = pe.shaw_output(weights, v, table, max_distance=2, query_positions=PACKED, key_positions=PACKED)
    np.testing.assert_allclose(full, naive_shaw_output(weights[None], v[None], table, 2, _rel(PACKED, PACKED)[None])[0], rtol=1e-14, atol=1e-14)
    step = pe.shaw_output(weights[:, -1:], v, table, max_distance=2, query_positions=PACKED[-1:], key_positions=PACKED)
    np.testing.assert_allclose(step, full[:, -1:], rtol=1e-14, atol=1e-14)  # one row through BLAS: rounding only
    # Without positions (arange, queries the last q_len): the Toeplitz path's numbers.
    plain = np.arange(12)
    np.testing.assert_allclose(
        pe.shaw_output(weights, v, table, max_distance=2, query_positions=plain, key_positions=plain),
        pe.shaw_output(weights, v, table, max_distance=2), rtol=1e-14, atol=1e-14,
    )  # fmt: skip


# KERPLE, Sandwich and FIRE: functions of the distance (FIRE also of the query position), so
# per-token positions give their formulas at rel = query_positions[..., i] - key_positions[..., j].


def _kerple(r1, r2, rel, kind):
    d = np.abs(rel)[..., None, :, :].astype(float)
    a, b = r1[:, None, None], r2[:, None, None]
    return -a * np.log1p(b * d) if kind == "log" else -a * d**b


def _sandwich(rel, dim, heads, base=10000.0):
    omega = base ** (-2.0 * np.arange(1, dim // 2 + 1) / dim)
    inner = np.cos(rel[..., None] * omega).sum(-1) - dim / 2
    return np.array([heads / (8.0 * h) for h in range(1, heads + 1)])[:, None, None] * inner[..., None, :, :]


def _fire_distances(qpos, kpos, c, threshold, eps):
    qpos = np.asarray(qpos, dtype=float)
    psi = lambda x: np.log(np.abs(c * x) + 1)  # noqa: E731
    return psi(_rel(qpos, kpos)) / (psi(np.maximum(qpos, threshold)) + eps)[..., :, None]


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_bias_per_token_with_batch_axes(backend, kind):
    r1, r2 = np.array([0.7, 1.3, 0.2]), np.array([0.4, 1.5, 1.9])
    qpos = LEFT_PADDED[:, -3:]
    got = backend.call(
        lambda *a: pe.kerple_bias(a[0], a[1], 3, 6, kind=kind, query_positions=a[2], key_positions=a[3]),
        *(backend.asarray(x) for x in (r1, r2, qpos, LEFT_PADDED)),
    )
    assert_close(got, _kerple(r1, r2, _rel(qpos, LEFT_PADDED), kind), backend=backend, dtype=backend.asarray(r1).dtype)


def test_sandwich_bias_per_token_with_batch_axes(backend):
    qpos = LEFT_PADDED[:, -3:]
    got = backend.call(lambda q, k: pe.sandwich_bias(3, 6, 8, heads=3, query_positions=q, key_positions=k), backend.asarray(qpos), backend.asarray(LEFT_PADDED))
    assert_close(got, _sandwich(_rel(qpos, LEFT_PADDED), 8, 3), backend=backend, dtype=backend.asarray(np.zeros(1, np.float32)).dtype, rtol=1e-6, atol=1e-6)


def test_fire_bias_per_token_with_batch_axes(backend):
    qpos = LEFT_PADDED[:, -3:]
    weights = np.array([[1.0, -2.0]])

    def bias(q, k, w):
        return pe.fire_bias(lambda x: x * w, 3, 6, c=0.5, threshold=2.0, eps=1e-3, query_positions=q, key_positions=k, dtype=w.dtype)

    got = backend.call(bias, *(backend.asarray(x) for x in (qpos, LEFT_PADDED, weights)))
    x = _fire_distances(qpos, LEFT_PADDED, 0.5, 2.0, 1e-3)
    assert_close(got, np.stack([x, -2 * x], axis=-3), backend=backend, dtype=backend.asarray(weights).dtype)


@pytest.mark.parametrize("name", ["kerple", "sandwich", "fire"])
def test_distance_bias_per_token_packed_and_as_the_toeplitz_form(name):
    """Packed documents (each counted from its own start) give the formula; ``arange``
    positions (the queries the last keys, or shifted by ``offset``) give the bits of the
    call without positions; a decode step is the last row of the full call."""
    r1, r2 = np.array([0.7, 1.3]), np.array([0.4, 1.5])
    calls = {
        "kerple": lambda q_len, k_len, **kw: pe.kerple_bias(r1, r2, q_len, k_len, **kw),
        "sandwich": lambda q_len, k_len, **kw: pe.sandwich_bias(q_len, k_len, 8, heads=2, dtype=np.float64, **kw),
        "fire": lambda q_len, k_len, **kw: pe.fire_bias(lambda x: x * np.array([[1.0, -2.0]]), q_len, k_len, c=0.5, threshold=2.0, dtype=np.float64, **kw),
    }
    bias = calls[name]
    full = bias(12, 12, query_positions=PACKED, key_positions=PACKED)
    rel = _rel(PACKED, PACKED)
    if name == "kerple":
        want = _kerple(r1, r2, rel, "log")
    elif name == "sandwich":
        want = _sandwich(rel, 8, 2)
    else:
        x = _fire_distances(PACKED, PACKED, 0.5, 2.0, 1e-6)
        want = np.stack([x, -2 * x])
    np.testing.assert_allclose(full, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(bias(1, 12, query_positions=PACKED[-1:], key_positions=PACKED), full[:, -1:])
    np.testing.assert_array_equal(bias(3, 7, query_positions=np.arange(4, 7), key_positions=np.arange(7)), bias(3, 7))
    np.testing.assert_array_equal(bias(3, 7, key_positions=np.arange(7)), bias(3, 7))
    np.testing.assert_array_equal(bias(3, 7, query_positions=np.arange(3), offset=2), bias(3, 7, offset=2))


def test_distance_bias_per_token_positions_are_checked():
    with pytest.raises(TypeError, match="query_positions must have an integer dtype"):
        pe.kerple_bias(np.ones(2), np.ones(2), 1, 3, query_positions=np.array([0.5]))
    with pytest.raises(ValueError, match="key_positions must have k_len = 6 entries"):
        pe.sandwich_bias(2, 6, 8, key_positions=np.arange(5))
    with pytest.raises(ValueError, match="must have leading"):
        pe.fire_bias(lambda x: x, 2, 3, query_positions=np.zeros((2, 2), dtype=int), key_positions=np.zeros((3, 3), dtype=int))
    with pytest.raises(TypeError, match="but xp=numpy"):
        torch = pytest.importorskip("torch")
        pe.sandwich_bias(1, 3, 8, key_positions=torch.arange(3), xp=np)


ROW_OFFSETS = np.array([0, 3, 11, -1])
ROW_Q, ROW_K = RNG.standard_normal((4, 2, 2, 8)), RNG.standard_normal((4, 2, 5, 8))
# (call of an offset and arrays, its arrays); the logits' q and k have one batch row per offset.
ROW_CALLS = {
    "relative_positions": (lambda o, xp: pe.relative_positions(2, 5, offset=o, xp=xp), ()),
    "t5_bias": (lambda o, xp, t: pe.t5_bias(t, 2, 5, offset=o), (RNG.standard_normal((32, 2)),)),
    "alibi_bias": (lambda o, xp, s: pe.alibi_bias(s, 2, 5, offset=o), (np.array([0.5, 0.25], dtype=np.float32),)),
    "alibi_bias decode": (lambda o, xp, s: pe.alibi_bias(s, 1, 5, offset=o, symmetric=True), (np.array([0.5, 0.25]),)),
    "relative_bias deberta": (
        lambda o, xp, t: pe.relative_bias("deberta", t, 2, 5, max_distance=2, bucket_size=2, max_position=8, offset=o),
        (RNG.standard_normal((4, 2)),),
    ),
    "kerple_bias": (lambda o, xp, r1, r2: pe.kerple_bias(r1, r2, 2, 5, kind="power", offset=o), (np.array([0.5, 1.0]), np.array([1.0, 0.5]))),
    "sandwich_bias": (lambda o, xp: pe.sandwich_bias(2, 5, 8, heads=2, offset=o, xp=xp), ()),
    "fire_distances": (lambda o, xp: pe.fire_distances(2, 5, c=0.5, threshold=4.0, offset=o, xp=xp), ()),
    "shaw_logits": (lambda o, xp, q, k, t: pe.shaw_logits(q, k, t, max_distance=3, offset=o), (ROW_Q, ROW_K, RNG.standard_normal((7, 8)))),
    "deberta_logits": (
        lambda o, xp, q, k, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=3, offset=o),
        (ROW_Q, ROW_K, RNG.standard_normal((6, 8)), RNG.standard_normal((6, 8))),
    ),
    "tupe_logits": (  # (its offsets are >= 0)
        lambda o, xp, q, k, p, u, b: pe.tupe_logits(q, k, p, u[0, ...], u[1, ...], offset=o + 1, bias=b, cls=(0.5, -0.25)),
        (ROW_Q, ROW_K, RNG.standard_normal((20, 6)), RNG.standard_normal((2, 2, 6, 8)), RNG.standard_normal((2, 2, 5))),
    ),
    "tupe_logits shared by the heads": (
        lambda o, xp, q, k, p, u: pe.tupe_logits(q, k, p, u, u, offset=o + 1),
        (ROW_Q, ROW_K, RNG.standard_normal((20, 6)), RNG.standard_normal((6, 8))),
    ),
    "shaw_output logits": (  # (the output of attention weights [batch, heads, q_len, k_len])
        lambda o, xp, w, v, t: pe.shaw_output(w, v, t, max_distance=3, offset=o),
        (RNG.random((4, 2, 2, 5)), RNG.standard_normal((4, 2, 5, 8)), RNG.standard_normal((7, 8))),
    ),
    "cope_logits": (lambda o, xp, q, k, e: pe.cope_logits(q, k, e, offset=o), (ROW_Q, ROW_K, RNG.standard_normal((6, 8)))),
    "cope_logits not causal": (lambda o, xp, q, k, e: pe.cope_logits(q, k, e, causal=False, offset=o), (ROW_Q, ROW_K, RNG.standard_normal((6, 8)))),
    "cope_positions of q and k": (lambda o, xp, q, k: pe.cope_positions(q, k, offset=o), (ROW_Q, ROW_K)),
}


@pytest.mark.parametrize("name", list(ROW_CALLS))
def test_one_offset_per_batch_row_gives_each_row_the_bits_of_its_own_call(backend, name):
    """API.md: ``offset`` takes one value per batch row (the query positions
    ``offset[:, None] + arange(q_len)``, which the result's leading axes follow), and row
    ``b`` is the call with ``offset[b]`` to the bit (a logits function's of the same q/k).
    It had been a ``TypeError``."""
    fn, arrays = ROW_CALLS[name]
    arrays = tuple(backend.asarray(a) for a in arrays)
    rows = backend.to_numpy(backend.call(lambda o, *a: fn(o, backend.xp, *a), backend.asarray(ROW_OFFSETS), *arrays))
    q_len = 1 if name.endswith("decode") else 2
    assert rows.shape[0] == len(ROW_OFFSETS) and rows.shape[-2:] == (q_len, 8 if name.startswith("shaw_output") else 5)
    row = (lambda one, b: one[b]) if "logits" in name or name.endswith("of q and k") else (lambda one, b: one)
    for b, offset in enumerate(ROW_OFFSETS.tolist()):
        zero_d = backend.asarray([offset])[0]  # (traced under jax.jit as the rows' are, not folded into constants)
        np.testing.assert_array_equal(rows[b], row(backend.to_numpy(backend.call(lambda o, *a: fn(o, backend.xp, *a), zero_d, *arrays)), b))
        if backend.name != "jax":  # a Python int too, three times: a decode step's plan serves the third
            for _ in range(3):
                np.testing.assert_array_equal(rows[b], row(backend.to_numpy(fn(offset, backend.xp, *arrays)), b))


# Offsets of a decode loop's rows: close (caches of about one length), far apart (their
# distances span more than a plan keeps: relative._decode.HELD), negative, int32.
ROW_SPREADS = {
    "close": np.array([4095, 4093, 4090, 4094]),
    "far apart": np.array([0, 70000, 5, -3]),
    "negative": np.array([-1, -9, -4, -100]),
    "int32": np.array([300, 2**31 - 8, 7], np.int32),
}


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("spread", list(ROW_SPREADS))
def test_one_offset_per_batch_row_at_every_step_of_a_loop_gives_each_row_its_own_calls_bits(backend, spread, q_len):
    """Steps of a decode loop with one offset per row (planned on NumPy and torch CPU from
    the third call on, as the per-token plan of ``offset[:, None] + arange(q_len)``): each
    row the bits of the call with its offset, for T5 (bfloat16 where the library has it)
    and ALiBi, whatever the offsets' spread and dtype."""
    table = backend.asarray(RNG.standard_normal((32, 3)), "bfloat16" if backend.name in ("torch", "jax") else "float32")
    slopes = backend.asarray(np.array([0.5, 0.25, 2.0**-9], np.float32))
    calls = (
        lambda o, t, s: pe.t5_bias(t, q_len, 40, offset=o, bidirectional=False),
        lambda o, t, s: pe.alibi_bias(s, q_len, 40, offset=o),
    )
    for fn in calls:
        for step in range(4):
            offsets = ROW_SPREADS[spread] + step
            rows = backend.to_numpy(backend.call(fn, backend.asarray(offsets), table, slopes))
            assert rows.shape == (len(offsets), 3, q_len, 40)
            for b, offset in enumerate(offsets.tolist()):
                one = backend.call(fn, backend.asarray(offsets[b : b + 1])[0], table, slopes) if backend.name == "jax" else fn(offset, table, slopes)
                np.testing.assert_array_equal(rows[b], backend.to_numpy(one))


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("spread", list(ROW_SPREADS))
def test_logits_of_one_offset_per_batch_row_at_every_step_of_a_loop_give_each_row_its_own_calls_bits(backend, spread, q_len):
    """``shaw_logits`` and ``deberta_logits`` of one offset per row, called at every step of
    a decode loop (planned on NumPy and torch CPU from the third call on: each row's table
    rows windows of one per-distance index for close offsets, each pair's for offsets far
    apart): row ``b`` the bits of the call with ``offset[b]`` on the same ``q``/``k``, for
    bfloat16 where the library has it."""
    dtype = "bfloat16" if backend.name in ("torch", "jax") else "float32"
    rows = len(ROW_SPREADS[spread])
    q, k = (backend.asarray(RNG.standard_normal((rows, 3, n, 8)), dtype) for n in (q_len, 40))
    table, pos_q, pos_k = (backend.asarray(RNG.standard_normal(shape), dtype) for shape in ((13, 8), (3, 12, 8), (12, 8)))
    calls = (
        lambda o, q, k, t, pq, pk: pe.shaw_logits(q, k, t, max_distance=6, offset=o),
        lambda o, q, k, t, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=6, bucket_size=4, max_position=64, offset=o),
    )
    for fn in calls:
        for step in range(4):
            offsets = ROW_SPREADS[spread] + step
            logits = backend.to_numpy(backend.call(fn, backend.asarray(offsets), q, k, table, pos_q, pos_k))
            assert logits.shape == (rows, 3, q_len, 40)
            for b, offset in enumerate(offsets.tolist()):
                scalar = backend.asarray(offsets[b : b + 1])[0] if backend.name == "jax" else offset
                one = backend.call(fn, scalar, q, k, table, pos_q, pos_k) if backend.name == "jax" else fn(scalar, q, k, table, pos_q, pos_k)
                np.testing.assert_array_equal(logits[b], backend.to_numpy(one)[b])


def test_a_per_row_offset_is_the_per_token_recipe_and_shifts_given_query_positions():
    """``offset [...]`` is ``query_positions = offset[..., None] + arange(q_len)`` (the recipe
    its refusal used to give, each row's bits still the one-offset call's), its axes
    broadcasting against the positions' leading axes; with ``query_positions`` it shifts
    them row by row. ``offset=None`` stays one for every row."""
    table, offsets = RNG.standard_normal((32, 2)), np.array([0, 3, 11])
    for call in (
        lambda **kw: pe.t5_bias(table, 2, 5, **kw),
        lambda **kw: pe.alibi_bias(np.array([0.5, 0.25]), 2, 5, **kw),
        lambda **kw: pe.kerple_bias(np.array([0.5, 1.0]), np.array([1.0, 0.5]), 2, 5, **kw),
    ):
        rows = call(offset=offsets)
        np.testing.assert_array_equal(rows, call(query_positions=offsets[:, None] + np.arange(2), key_positions=np.arange(5)))
        np.testing.assert_array_equal(call(offset=offsets, key_positions=np.arange(5)), rows)
        for b, offset in enumerate(offsets):
            np.testing.assert_array_equal(rows[b], call(offset=int(offset)))
        grid = call(offset=np.array([[0, 3], [11, 2]]))
        assert grid.shape == (2, 2, 2, 2, 5)
        np.testing.assert_array_equal(grid[1, 0], rows[2])
        queries = np.array([[4, 9], [0, 1], [7, 7]])
        shifted = call(offset=offsets, query_positions=queries)
        for b, offset in enumerate(offsets):
            np.testing.assert_array_equal(shifted[b], call(offset=int(offset), query_positions=queries[b]))
        with pytest.raises(ValueError, match=r"offset of shape \(3,\) \(one per batch row\) and the positions' leading \(batch\) axes \(2,\)"):
            call(offset=offsets, query_positions=queries[:2])
        np.testing.assert_array_equal(call(), call(offset=3))
    with pytest.raises(ValueError, match=r"offset \(one per batch row\) and query_positions/key_positions with leading \(batch\) axes \(3,\)"):
        pe.shaw_logits(ROW_Q, ROW_K, np.ones((7, 8)), max_distance=3, offset=offsets)


def test_cope_with_one_offset_per_row_is_checked_before_any_work_and_keeps_the_gradients():
    """CoPE's causal gates of one offset per batch row (``key j <= offset[b] + i``): a
    wrong shape, a float or boolean dtype, another library's array, a position past int64
    and a ``mask`` not broadcasting against the widened logits are refused before any
    work; torch's gradients are the loop of one-offset calls'."""
    q, k, e, offsets = ROW_Q, ROW_K, RNG.standard_normal((6, 8)), np.array([0, 3, 11, -1])
    cases = (
        (np.array([1, 2, 3]), ValueError, r"offset \(one per batch row\) and query_positions/key_positions with leading \(batch\) axes \(3,\)"),
        (np.array([1.0, 2.0, 3.0, 4.0]), TypeError, "offset must have an integer dtype, got float64"),
        (np.array([True, False, True, True]), TypeError, "offset must have an integer dtype, got bool"),
        (np.array([2**63 - 1, 0, 0, 0]), ValueError, r"offset \+ i - j must stay within int64"),
        (np.array([2**63, 0, 0, 0], np.uint64), ValueError, "offset must fit in int64"),
    )
    for fn in (lambda o, **kw: pe.cope_logits(q, k, e, offset=o, **kw), lambda o, **kw: pe.cope_positions(q, k, offset=o, **kw)):
        for offset, error, says in cases:
            with pytest.raises(error, match=says):
                fn(offset)
        with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 2, 5\) does not broadcast against the logits \(3, 4, 2, 2, 5\)"):
            fn(np.arange(3)[:, None], mask=np.ones((3, 1, 2, 5), dtype=bool))
        assert fn(np.arange(3)[:, None]).shape == (3, 4, 2, 2, 5)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds in one call"):
        pe.cope_logits(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(e), offset=jnp.asarray(offsets))
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, e)]
    rows = pe.cope_logits(*leaves, offset=torch.from_numpy(offsets))
    weights = torch.from_numpy(RNG.standard_normal(rows.shape))
    got = torch.autograd.grad((rows * weights).sum(), leaves)
    loop = sum((pe.cope_logits(*leaves, offset=offset)[b] * weights[b]).sum() for b, offset in enumerate(offsets.tolist()))
    for grad, want in zip(got, torch.autograd.grad(loop, leaves)):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q_shape, u_shape", [((2, 8), (2, 6, 8)), ((2, 8), (6, 8)), ((3, 2, 2, 8), (6, 8)), ((1, 2, 2, 8), (2, 6, 8))])
def test_tupe_with_one_offset_per_row_puts_the_rows_before_the_heads_of_q_or_of_the_tables(q_shape, u_shape):
    """The offsets' axes lead the heads axis, ``q``'s or the projections' (``q`` without
    one: its row and column of ``[CLS]`` too); each row the bits of its offset's call."""
    offsets, p = np.array([0, 2, 5]), RNG.standard_normal((12, 6))
    q, u = RNG.standard_normal(q_shape), RNG.standard_normal(u_shape)
    k = RNG.standard_normal((*q_shape[:-2], 5, 8))
    for cls in (None, (0.5, -1.0)):
        rows = pe.tupe_logits(q, k, p, u, u, offset=offsets, cls=cls)
        assert rows.shape == (3, *(2,) * (len(u_shape) == 3 or len(q_shape) == 4), 2, 5)
        for b, offset in enumerate(offsets.tolist()):
            one = pe.tupe_logits(q, k, p, u, u, offset=offset, cls=cls)
            np.testing.assert_array_equal(rows[b], one[min(b, len(one) - 1)] if one.ndim == rows.ndim else one)


def test_tupe_with_one_offset_per_row_is_checked_before_any_work_and_keeps_the_gradients():
    """TUPE's queries of one offset per batch row take their rows of ``p`` at ``offset[b] +
    arange(q_len)``, one product per row beside tables shared by the rows: tables with
    batch axes, negative offsets, offsets past ``p``, a wrong shape or dtype and another
    library's array are refused before any work; torch's gradients are the loop's."""
    q, k, offsets = ROW_Q, ROW_K, np.array([1, 3, 11, 0])
    p, u = RNG.standard_normal((16, 6)), RNG.standard_normal((2, 6, 8))
    for args, kwargs, error, says in (
        ((p, u, u), {"offset": np.array([1, 3, -1, 0])}, ValueError, "offset must be >= 0, got -1"),
        ((p, u, u), {"offset": np.array([1, 3, 15, 0])}, ValueError, r"p must have at least max\(offset \+ q_len, k_len\) = 17 rows"),
        ((p, u, u), {"offset": np.array([1, 3, 11])}, ValueError, r"offset of shape \(3,\) \(one per batch row\) does not broadcast against the batch axes of q and k \(4, 2\)"),
        ((p, u, u), {"offset": np.array([1.0, 3.0, 11.0, 0.0])}, TypeError, "offset must have an integer dtype, got float64"),
        ((np.stack([p] * 4), u, u), {"offset": offsets}, ValueError, r"one offset per batch row takes p \[n, d_p\] and uq, uk \[heads, d_p, e\]"),
        ((p, np.stack([u] * 4), u), {"offset": offsets}, ValueError, r"tables shared by the batch rows\), got p \(16, 6\), uq \(4, 2, 6, 8\)"),
        ((p, u, u), {"offset": offsets, "bias": np.ones((3, 1, 2, 5))}, ValueError, "bias"),
    ):
        with pytest.raises(error, match=says):
            pe.tupe_logits(q, k, *args, **kwargs)
    assert pe.tupe_logits(q[:1], k[:1], p, u, u, offset=np.zeros(0, dtype=np.int64)).shape == (0, 2, 2, 5)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds in one call"):
        pe.tupe_logits(*(torch.from_numpy(a) for a in (q, k, p, u, u)), offset=jnp.asarray(offsets))
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, p, u, u[::-1].copy())]
    rows = pe.tupe_logits(*leaves, offset=torch.from_numpy(offsets), cls=(0.5, -0.25))
    weights = torch.from_numpy(RNG.standard_normal(rows.shape))
    got = torch.autograd.grad((rows * weights).sum(), leaves)
    loop = sum((pe.tupe_logits(*leaves, offset=offset, cls=(0.5, -0.25))[b] * weights[b]).sum() for b, offset in enumerate(offsets.tolist()))
    for grad, want in zip(got, torch.autograd.grad(loop, leaves)):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


TENER_Q, TENER_K, TENER_U = RNG.standard_normal((4, 2, 3, 8)), RNG.standard_normal((4, 2, 9, 8)), RNG.standard_normal((2, 2, 1, 8))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tener_with_one_offset_per_row_gives_each_row_the_bits_of_its_call_on_that_row_alone(backend, dtype):
    """``tener_logits`` of one offset per batch row (far apart and negative; close, whose
    rows share most distances, each sinusoid computed once on the host): row ``b`` is the
    call on row ``b`` alone with ``offset[b]`` (traced under ``jax.jit`` as the rows' are),
    to the bit: each row's sinusoids and their product with its queries are that call's.
    With ``q``/``k`` without batch axes each row is the one-offset call, and equal offsets
    give it on every row. It had been a ``TypeError``."""
    fn = lambda o, q, k, u, v: pe.tener_logits(q, k, u, v, offset=o, base=100.0)  # noqa: E731
    q, k, u, v = (backend.asarray(a, dtype) for a in (TENER_Q, TENER_K, TENER_U[0], TENER_U[1]))
    for offsets in (np.array([6, 0, 70000, -5]), np.array([6, 4, 7, 5])):
        rows = backend.to_numpy(backend.call(fn, backend.asarray(offsets), q, k, u, v))
        assert rows.shape == (4, 2, 3, 9)
        for b, offset in enumerate(offsets.tolist()):
            zero_d = backend.asarray(offsets[b : b + 1])[0]
            np.testing.assert_array_equal(rows[b], backend.to_numpy(backend.call(fn, zero_d, q[b : b + 1, ...], k[b : b + 1, ...], u, v))[0])
            if backend.name != "jax":
                np.testing.assert_array_equal(rows[b], backend.to_numpy(fn(offset, q[b : b + 1, ...], k[b : b + 1, ...], u, v))[0])
    shared = backend.to_numpy(backend.call(fn, backend.asarray(offsets), q[0, ...], k[0, ...], u, v))
    for b in range(len(offsets)):
        np.testing.assert_array_equal(shared[b], backend.to_numpy(backend.call(fn, backend.asarray(offsets[b : b + 1])[0], q[0, ...], k[0, ...], u, v)))
    same = backend.to_numpy(backend.call(fn, backend.asarray(np.full(4, 6)), q[0, ...], k[0, ...], u, v))
    np.testing.assert_array_equal(same, np.broadcast_to(backend.to_numpy(backend.call(fn, backend.asarray(offsets[:1])[0], q[0, ...], k[0, ...], u, v)), same.shape))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_tener_with_equal_offsets_per_row_is_the_one_offset_call(library, dtype):
    """Equal offsets, one per row, give the bits of one 0-d offset (an int, a 0-d array) for
    the whole batch on NumPy (its product of a batch is one product per matrix, as the
    rows'); torch folds a whole batch's queries into one matrix product, whose rows MKL may
    round apart from those of one batch row's: there a batch of one row, and rows sharing
    ``q``/``k`` without batch axes."""
    offsets = np.array([[3], [3], [3], [3]])  # (axes of their own, broadcasting against the batch)
    arrays = [a.astype(dtype) for a in (TENER_Q, TENER_K, TENER_U[0], TENER_U[1])]
    if library == "torch":
        torch = pytest.importorskip("torch")
        arrays, offsets = [torch.from_numpy(a) for a in arrays], torch.from_numpy(offsets)
    q, k, u, v = arrays
    calls = [(q[:1], k[:1]), (q[0], k[0])] + ([(q, k)] if library == "numpy" else [])
    for q, k in calls:
        rows = np.asarray(pe.tener_logits(q, k, u, v, offset=offsets[: len(q) if q.ndim == 4 else None, 0]))
        for one in (3, offsets[0, 0]):
            whole = np.asarray(pe.tener_logits(q, k, u, v, offset=one))
            np.testing.assert_array_equal(rows, np.broadcast_to(whole, rows.shape))


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_tener_decode_steps_of_one_offset_per_row_are_the_last_rows_of_the_prefill(library, chunk):
    """Each row's last ``chunk`` queries at ``offset[b] + n - chunk`` equal the last rows of
    its prefill at ``offset[b]`` (exact products: one-hot queries, integer keys, as in
    ``test_conventions``; unexact ones round apart with the product's shape, for one offset
    as for several)."""
    n, d = 7, 8
    q = np.eye(d)[RNG.integers(0, d, (3, 2, n))]
    k, u = RNG.integers(-4, 5, (3, 2, n + 5, d)).astype(float), RNG.integers(-4, 5, (2, 1, d)).astype(float)
    offsets = np.array([5, 0, 40])
    arrays = [q, k, u, np.zeros_like(u)]
    if library == "torch":
        torch = pytest.importorskip("torch")
        arrays, offsets = [torch.from_numpy(a) for a in arrays], torch.from_numpy(offsets)
    q, k, u, v = arrays
    full = np.asarray(pe.tener_logits(q, k, u, v, offset=offsets))
    step = np.asarray(pe.tener_logits(q[..., n - chunk :, :], k, u, v, offset=offsets + n - chunk))
    np.testing.assert_array_equal(step, full[..., n - chunk :, :])


def test_tener_with_one_offset_per_row_is_checked_before_any_work_and_keeps_the_gradients():
    """TENER's offsets per row: a wrong shape or dtype, a distance past int64 and another
    library's array are refused naming ``offset`` before any work; torch's float64
    gradients pass gradcheck and are the loop of single-row calls'."""
    q, k, u, v = TENER_Q, TENER_K, TENER_U[0], TENER_U[1]
    for offset, error, says in (
        (np.array([1, 2, 3]), ValueError, r"offset \(one per batch row\) and .* \(3,\) do not broadcast against the batch axes of q and k \(4,\)"),
        (np.array([1.0, 2.0, 3.0, 4.0]), TypeError, "offset must have an integer dtype, got float64"),
        (np.array([True, False, True, True]), TypeError, "offset must have an integer dtype, got bool"),
        (np.array([2**63 - 1, 0, 0, 0]), ValueError, r"offset \+ i - j must stay within int64|offset \+ query_positions must stay within int64"),
        (np.array([2**63, 0, 0, 0], np.uint64), ValueError, "offset must fit in int64"),
    ):
        with pytest.raises(error, match=says):
            pe.tener_logits(q, k, u, v, offset=offset)
    assert pe.tener_logits(q, k, u, v, offset=np.zeros((0, 1), dtype=np.int64)).shape == (0, 4, 2, 3, 9)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds in one call"):
        pe.tener_logits(*(torch.from_numpy(a) for a in (q, k, u, v)), offset=jnp.asarray([0, 1, 2, 3]))
    offsets = torch.tensor([6, 0, 70000, -5])
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, u, v)]
    assert torch.autograd.gradcheck(lambda *a: pe.tener_logits(*a, offset=offsets), tuple(leaves))
    rows = pe.tener_logits(*leaves, offset=offsets)
    weights = torch.from_numpy(RNG.standard_normal(rows.shape))
    got = torch.autograd.grad((rows * weights).sum(), leaves)
    loop = sum((pe.tener_logits(leaves[0][b : b + 1], leaves[1][b : b + 1], *leaves[2:], offset=o)[0] * weights[b]).sum() for b, o in enumerate(offsets.tolist()))
    for grad, want in zip(got, torch.autograd.grad(loop, leaves)):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def test_shaw_output_with_one_offset_per_row_is_checked_before_any_work_and_keeps_the_gradients():
    """``shaw_output`` makes one Toeplitz scatter per batch row of ``weights``, whose axes
    before the heads must be the offsets': other shapes, a float dtype, a position past
    int64 and another library's array are refused before any work; torch's gradients are
    the loop of one-offset calls'. It had been a ``TypeError``."""
    offsets, table = np.array([0, 3, 11, -1]), RNG.standard_normal((7, 8))
    weights, v = RNG.random((4, 2, 2, 5)), RNG.standard_normal((4, 2, 5, 8))
    for args, offset, error, says in (
        ((weights[:1], v), offsets, ValueError, r"whose axes before the heads are the offset's \(4,\) \(one Toeplitz scatter per row\), got weights of shape \(1, 2, 2, 5\)"),
        ((weights[0, 0], v[0, 0]), offsets, ValueError, r"got weights of shape \(2, 5\)"),
        ((weights, v), offsets[:3], ValueError, r"the offset's \(3,\) \(one Toeplitz scatter per row\), got weights of shape \(4, 2, 2, 5\)"),
        ((weights, v), offsets.astype(float), TypeError, "offset must have an integer dtype, got float64"),
        ((weights, v), np.array([0, 3, -(2**63), 1]), ValueError, r"offset \+ i - j must stay within int64"),
    ):
        with pytest.raises(error, match=says):
            pe.shaw_output(*args, table, max_distance=3, offset=offset)
    assert pe.shaw_output(weights[:0], v[:0], table, max_distance=3, offset=offsets[:0]).shape == (0, 2, 2, 8)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds in one call"):
        pe.shaw_output(torch.from_numpy(weights), torch.from_numpy(v), torch.from_numpy(table), max_distance=3, offset=jnp.asarray(offsets))
    leaves = [torch.tensor(a, requires_grad=True) for a in (weights, v, table)]
    rows = pe.shaw_output(*leaves, max_distance=3, offset=torch.from_numpy(offsets))
    cotangent = torch.from_numpy(RNG.standard_normal(rows.shape))
    got = torch.autograd.grad((rows * cotangent).sum(), leaves)
    loop = sum((pe.shaw_output(*leaves, max_distance=3, offset=offset)[b] * cotangent[b]).sum() for b, offset in enumerate(offsets.tolist()))
    for grad, want in zip(got, torch.autograd.grad(loop, leaves)):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def test_a_per_row_offset_is_checked_before_any_work():
    with pytest.raises(ValueError, match=r"the relative positions can be -4 .. 201, beyond int8"):
        pe.relative_positions(2, 5, offset=np.array([200, 0]), dtype=np.int8)
    assert pe.relative_positions(2, 5, offset=np.array([[122, 0]]), dtype=np.int8).shape == (1, 2, 2, 5)
    with pytest.raises(ValueError, match=r"offset \+ i - j must stay within int64"):
        pe.relative_positions(2, 5, offset=np.array([2**63 - 1, 0]))
    table = np.ones((32, 2))
    with pytest.raises(TypeError, match="offset must have an integer dtype, got float64"):
        pe.t5_bias(table, 2, 5, offset=np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="offset must have an integer dtype, got bool"):
        pe.alibi_bias(np.ones(2), 2, 5, offset=np.array([True, False]))
    with pytest.raises(ValueError, match="offset must fit in int64"):
        pe.t5_bias(table, 2, 5, offset=np.array([2**63, 1], dtype=np.uint64))
    with pytest.raises(ValueError, match="offset \\+ query_positions must stay within int64"):
        pe.t5_bias(table, 2, 5, offset=np.array([2**63 - 1, 1]))
    with pytest.raises(ValueError, match="chunks applies to the per-distance form, not with query_positions/key_positions or one offset per batch row"):
        pe.alibi_bias(np.ones(2), 2, 5, offset=np.array([1, 2]), chunks=2)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds in one call"):
        pe.t5_bias(jnp.ones((32, 2)), 2, 5, offset=torch.tensor([1, 2]))
    rows = pe.t5_bias(torch.ones(32, 2), 2, 5, offset=np.array([1, 2]))  # a NumPy offset is a host constant
    assert isinstance(rows, torch.Tensor) and rows.shape == (2, 2, 2, 5)


def test_functions_of_one_offset_for_every_row_say_what_to_do_with_one_per_row():
    """The functions whose result has no batch axes refuse one per row with a ``TypeError``
    that fits them."""
    offsets = np.array([0, 3, 11, -1])
    for call, says in (
        (lambda: pe.relative_bias_vector("alibi", np.ones(2), 2, 5, offset=offsets), r"no batch axes; relative_bias \(t5_bias, alibi_bias\) takes one"),
        (lambda: pe.sandwich_vector(2, 5, 8, offset=offsets), "no batch axes; sandwich_bias takes one"),
    ):
        with pytest.raises(TypeError, match="offset must be an integer or a 0-d integer array here, got an array of shape \\(4,\\): .*" + says):
            call()


@pytest.mark.parametrize("slopes_dtype", ["float16", "float32"])
def test_alibi_float_positions_are_subtracted_before_rounding_to_the_slopes_dtype(slopes_dtype):
    """Float per-token positions: ``q - k`` in the widest float, then the one rounding of the
    distance and of the product (they had been rounded to the slopes' float32 first, so
    2**24 + 1 - 2**24 read 0, and 1e6 + 0.3 - 1e6 read 0.25). The planned repeat call alike."""
    torch = pytest.importorskip("torch")
    slopes = np.array([0.5, 0.25], slopes_dtype)  # (powers of two: the product is exact)
    for q, k in (([2.0**24 + 1], [2.0**24 - 1, 2.0**24, 2.0**24 + 1]), ([1e6 + 0.3, 1e6 + 1], [1e6, 1e6 - 2.5, 1e6 + 1])):
        q, k = np.array(q), np.array(k)
        want = (-slopes.astype(np.float64)[:, None, None] * (q[:, None] - k[None, :])).astype(slopes_dtype)
        for _ in range(3):  # (the second call on is planned)
            got = pe.alibi_bias(slopes, len(q), len(k), query_positions=q, key_positions=k)
            np.testing.assert_array_equal(got, want)
        got = pe.alibi_bias(torch.asarray(slopes), len(q), len(k), query_positions=torch.asarray(q), key_positions=torch.asarray(k))
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("make", ["array_api_strict_no_float64", "jax_without_x64"])
def test_alibi_float_positions_and_an_offset_without_float64_take_one_rounding(make):
    """Without float64 the distance ``(offset + q) - k`` of float positions was two float32
    roundings, ``offset + q`` first: ``(10**6 + 0.1) - 10**6`` read 0.125 (off by 25%); now
    the float64 distance rounded once to float32 (the offset carried apart, double-float),
    with a Python int, a 0-d offset and one per batch row (eagerly and under ``jax.jit``),
    and with integer query positions beside float keys. Row ``b`` keeps the bits of
    ``offset[b]``."""
    rng = np.random.default_rng(7)
    slopes = np.array([0.5, 0.25], np.float32)  # (powers of two: the product is exact)
    q = rng.uniform(0, 1e7, (3, 6)).astype(np.float32)
    q[:, :3] = rng.uniform(0, 1, (3, 3)).astype(np.float32)
    q[0, 0] = 0.1
    k = rng.uniform(0, 1e7, (3, 5)).astype(np.float32)
    k[0, 0] = 1e6
    offsets = np.array([10**6, *rng.integers(2**30, 2**31 - 2**25, 2)], np.int32)
    to, back, jit = without_float64(make)
    call = lambda s, o, a, b: pe.alibi_bias(s, 6, 5, offset=o, query_positions=a, key_positions=b)  # noqa: E731
    for qpos in (q, np.round(q).astype(np.int32)):
        want = -slopes[:, None, None] * (((qpos.astype(np.float64) + offsets[:, None])[:, None, :, None] - k.astype(np.float64)[:, None, None, :])).astype(np.float32)
        for run in (call, jit(call)):
            rows = back(run(to(slopes), to(offsets), to(qpos), to(k)))
            np.testing.assert_array_equal(rows, want)
            for b in range(3):
                for offset in (int(offsets[b]), to(offsets[b : b + 1])[0]):
                    np.testing.assert_array_equal(back(run(to(slopes), offset, to(qpos[b]), to(k[b]))), rows[b])
    one = pe.alibi_bias(to(slopes), 1, 1, offset=10**6, query_positions=to(np.array([0.1], np.float32)), key_positions=to(np.array([1e6], np.float32)))
    assert back(one)[0, 0, 0] == np.float32(-0.05)  # (slope 0.5)


def test_alibi_int64_positions_and_offsets_past_2_to_the_36_without_float64_stay_exact():
    """array-api-strict's ``no_float64`` device has int64: an int64 query position or offset
    enters the double-float distance as ``fl(n) + (n - fl(n))``. Cut into ``n // 4096`` and
    a remainder, the top part lost its low bits past 2**36 (``2**36 + 4097`` read
    ``2**36 + 1``: ALiBi gave -0.5 for -2048.5); now exact below 2**48."""
    to, back, _ = without_float64("array_api_strict_no_float64")
    slopes = np.array([0.5, 0.25], np.float32)
    q = np.array([2**36 + 4097, 2**40 + 12345, 2**47 - 3, -(2**45) - 7])
    k = np.array([2**36, 2**40, 2**47 - 2**24, -(2**45)], np.float32)
    dist = q.astype(object)[:, None] - k.astype(np.float64).astype(int).astype(object)[None, :]
    want = (-slopes.astype(np.float64)[:, None, None] * dist.astype(np.float64)).astype(np.float32)
    got = pe.alibi_bias(to(slopes), 4, 4, query_positions=to(q), key_positions=to(k))
    np.testing.assert_array_equal(back(got), want)
    fq = np.array([0.5, 4097.25, 1.0, -7.75], np.float32)
    for offset in (2**36, to(np.array(2**36)), to(np.full(1, 2**36))):
        want = (-slopes.astype(np.float64)[:, None, None] * ((2**36 + fq.astype(np.float64))[:, None] - k.astype(np.float64)[None, :])).astype(np.float32)
        got = back(pe.alibi_bias(to(slopes), 4, 4, offset=offset, query_positions=to(fq), key_positions=to(k)))
        np.testing.assert_array_equal(got.reshape(want.shape), want)


# Calls past the logits plans' sizes (relative._logits_plan.LARGEST query-key pairs): the full path's.
BIG_ROW_CALLS = {
    "shaw_logits": lambda o, q, k, w, t, pq, pk: pe.shaw_logits(q, k, t, max_distance=6, offset=o),
    "shaw_logits of q without rows": lambda o, q, k, w, t, pq, pk: pe.shaw_logits(q[0], k[0], t, max_distance=6, offset=o),
    "deberta_logits": lambda o, q, k, w, t, pq, pk: pe.deberta_logits(q, k, pq, pk, max_distance=6, bucket_size=4, max_position=64, offset=o),
    "deberta_logits p2c": lambda o, q, k, w, t, pq, pk: pe.deberta_logits(q, k, pq, None, max_distance=6, terms=("p2c",), offset=o),
    "shaw_output": lambda o, q, k, w, t, pq, pk: pe.shaw_output(w, k, t, max_distance=6, offset=o),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("name", list(BIG_ROW_CALLS))
def test_large_calls_of_one_offset_per_row_take_each_rows_toeplitz_kernel_with_its_bits_and_gradients(name, library, dtype, monkeypatch):
    """NumPy and torch CPU calls of one offset per batch row past the plans' sizes gather (or
    scatter) each row at its one-offset call's per-distance index (``relative._rows``), into
    one result: no ``[rows, q_len, k_len]`` distances, whose int64 index had made torch's
    ``shaw_logits`` of 8 x 16 heads x 512 x 2048 2.4 times a loop of one-offset calls' time
    (``deberta_logits`` 1.3 times, taking its buckets' logarithms at every pair). Row ``b``
    is the one-offset call's, to the bit, and torch's float64 gradients the loop's."""
    from posenc.relative import _per_token

    offsets, q_len, k_len = np.array([0, 3, 17, -1]), 9, 8000
    q, k, table, pos = (RNG.standard_normal(s).astype(dtype) for s in ((4, 2, q_len, 8), (4, 2, k_len, 8), (13, 8), (2, 12, 8)))
    weights = RNG.random((4, 2, q_len, k_len)).astype(dtype)
    arrays = (q, k, weights, table, pos, pos[0])
    if library == "torch":
        torch = pytest.importorskip("torch")
        arrays, offsets = tuple(torch.from_numpy(a) for a in arrays), torch.from_numpy(offsets)
    fn = BIG_ROW_CALLS[name]
    ones = [fn(int(o), *arrays) for o in offsets.tolist()]
    with monkeypatch.context() as patch:
        patch.setattr(_per_token, "relative", lambda *a, **kw: pytest.fail("per-token distances formed"))
        rows = fn(offsets, *arrays)
    assert tuple(rows.shape)[0] == len(ones)
    for b, one in enumerate(ones):
        np.testing.assert_array_equal(np.asarray(rows[b]), np.asarray(one[b] if one.ndim == rows.ndim else one))
    if library == "torch" and dtype == "float64":
        leaves = [a.clone().requires_grad_(True) for a in arrays]
        cotangent = torch.from_numpy(RNG.standard_normal(tuple(rows.shape)))
        got = torch.autograd.grad((fn(offsets, *leaves) * cotangent).sum(), leaves, allow_unused=True)
        loop = sum((fn(int(o), *leaves)[b] * cotangent[b]).sum() if fn(int(o), *leaves).ndim == rows.ndim else (fn(int(o), *leaves) * cotangent[b]).sum() for b, o in enumerate(offsets.tolist()))
        want = torch.autograd.grad(loop, leaves, allow_unused=True)
        assert any(g is not None and g.abs().sum() > 0 for g in got)
        for grad, expected in zip(got, want):
            assert (grad is None) == (expected is None)
            if grad is not None:  # (sums over 8,000 keys and the rows in another order: ulps of the largest)
                torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-13 * max(1.0, float(expected.abs().max())))
