"""Relative attention logits against naive O(L^2 d) float64 transcriptions and original code
(bad input: test_bad_inputs.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import posenc as pe
from arrays import DTYPES, assert_close, assert_kind, tolerance
from formulas import hf_deberta_bucket, rel_matrix, sinusoid

H, Q, K, D = 2, 5, 7, 4  # heads, q_len, k_len, head dim


# --- naive transcriptions of each paper's formula (loops over i, j: O(L^2 d)) -----------------


def naive_shaw_logits(q, k, table, kmax, offset=0):
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            a = table[np.clip(offset + i - j, -kmax, kmax) + kmax]
            out[..., i, j] = np.sum(q[..., i, :] * (k[..., j, :] + a), axis=-1)
    return out


def naive_shaw_output(w, v, table, kmax, offset=0):
    out = np.zeros(w.shape[:-1] + (v.shape[-1],))
    for i in range(w.shape[-2]):
        for j in range(w.shape[-1]):
            a = table[np.clip(offset + i - j, -kmax, kmax) + kmax]
            out[..., i, :] += w[..., i, j, None] * (v[..., j, :] + a)
    return out


def naive_xl(q, k, r, u, v):
    """Transformer-XL Eq. (3) terms (a)-(d); r[c] is distance k_len - 1 - c; NaN where r has no row."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    out = np.full(np.broadcast_shapes(q.shape[:-1], k.shape[:-2] + (1,)) + (k_len,), np.nan)
    for i in range(q_len):
        for j in range(k_len):
            c = k_len - 1 - ((k_len - q_len + i) - j)
            if 0 <= c < r.shape[-2]:
                qi, kj, rd = q[..., i, :], k[..., j, :], r[..., c, :]
                terms = qi * kj + qi * rd + u[..., 0, :] * kj + v[..., 0, :] * rd
                out[..., i, j] = np.sum(terms, axis=-1)
    return out


def naive_tener(q, k, u, v, base=10000.0, offset=0):
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            r = sinusoid(offset + i - j, q.shape[-1], base)
            qi, kj = q[..., i, :], k[..., j, :]
            out[..., i, j] = np.sum(qi * kj + qi * r + u[..., 0, :] * kj + v[..., 0, :] * r, axis=-1)
    return out


def naive_segment(q, seg_q, seg_k, s_same, s_diff, b):
    out = np.zeros(q.shape[:-1] + (seg_k.shape[-1],))
    for i in range(q.shape[-2]):
        for j in range(seg_k.shape[-1]):
            s = s_same if seg_q[i] == seg_k[j] else s_diff
            out[..., i, j] = np.sum((q[..., i, :] + b[..., 0, :]) * s[..., 0, :], axis=-1)
    return out


def naive_deberta(q, k, pos_q, pos_k, kmax, bucket=None, offset=0):
    """Released DeBERTa: c2p q_i.P^K[delta(i,j)], p2c k_j.P^Q[delta(i,j)], over sqrt(3d)."""
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            rel = offset + i - j
            if bucket is not None:
                rel = int(hf_deberta_bucket(np.array([rel]), *bucket)[0])
            delta = min(max(rel + kmax, 0), 2 * kmax - 1)
            qi, kj = q[..., i, :], k[..., j, :]
            out[..., i, j] = np.sum(qi * kj + qi * pos_k[..., delta, :] + kj * pos_q[..., delta, :], axis=-1)
    return out / math.sqrt(3 * q.shape[-1])


def naive_tupe(q, k, p, uq, uk, bias=None, cls=None, offset=0):
    d = q.shape[-1]
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            position = np.sum((p[offset + i] @ uq) * (p[j] @ uk), axis=-1) / math.sqrt(2 * d)
            if bias is not None:  # TUPE-R: the [CLS] reset replaces the relative term too (Eq. 11)
                position = position + bias[..., i, j]
            if cls is not None and offset + i == 0:
                position = cls[0] + 0 * position
            elif cls is not None and j == 0:
                position = cls[1] + 0 * position
            out[..., i, j] = np.sum(q[..., i, :] * k[..., j, :], axis=-1) / math.sqrt(2 * d) + position
    return out


# --- each function on every backend and dtype ------------------------------------------------


def _inputs(rng, backend, dtype, *shapes):
    arrays = [backend.asarray(rng.standard_normal(s), dtype=dtype) for s in shapes]
    return arrays, [backend.to_numpy(a).astype(np.float64) for a in arrays]


def case_shaw_logits(rng, backend, dtype):
    (q, k, t), (q64, k64, t64) = _inputs(rng, backend, dtype, (3, H, Q, D), (3, H, K, D), (7, D))
    return backend.call(lambda *a: pe.shaw_logits(*a, max_distance=3, offset=2), q, k, t), naive_shaw_logits(q64, k64, t64, 3, offset=2)


def case_shaw_output(rng, backend, dtype):
    (w, v, t), (w64, v64, t64) = _inputs(rng, backend, dtype, (H, Q, K), (H, K, 3), (5, 3))
    return backend.call(lambda *a: pe.shaw_output(*a, max_distance=2, offset=1), w, v, t), naive_shaw_output(w64, v64, t64, 2, offset=1)


def case_xl_logits(rng, backend, dtype):
    arrays, (q, k, r, u, v) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (H, K + Q, D), (H, 1, D), (H, 1, D))
    return backend.call(pe.xl_logits, *arrays), naive_xl(q, k, r, u, v)


def case_tener_logits(rng, backend, dtype):
    arrays, (q, k, u, v) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (H, 1, D), (H, 1, D))
    return backend.call(lambda *a: pe.tener_logits(*a, base=100.0, offset=1), *arrays), naive_tener(q, k, u, v, base=100.0, offset=1)


def case_segment_logits(rng, backend, dtype):
    (q, s1, s2, b), (q64, s164, s264, b64) = _inputs(rng, backend, dtype, (H, Q, D), (H, 1, D), (H, 1, D), (H, 1, D))
    seg_q, seg_k = np.array([0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1, 1, 1])
    out = backend.call(pe.segment_logits, q, backend.asarray(seg_q), backend.asarray(seg_k), s1, s2, b)
    return out, naive_segment(q64, seg_q, seg_k, s164, s264, b64)


def case_deberta_logits(rng, backend, dtype):
    arrays, (q, k, pq, pk) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (H, 6, D), (H, 6, D))
    return backend.call(lambda *a: pe.deberta_logits(*a, max_distance=3, offset=1), *arrays), naive_deberta(q, k, pq, pk, 3, offset=1)


def case_deberta_logits_bucketed(rng, backend, dtype):
    arrays, (q, k, pq, pk) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (H, 6, D), (H, 6, D))
    got = backend.call(lambda *a: pe.deberta_logits(*a, max_distance=3, bucket_size=4, max_position=8), *arrays)
    return got, naive_deberta(q, k, pq, pk, 3, bucket=(4, 8), offset=K - Q)  # the default: queries are the last keys


def case_tupe_logits(rng, backend, dtype):
    arrays, (q, k, p, uq, uk, bias) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (K, 3), (H, 3, D), (H, 3, D), (H, Q, K))
    got = backend.call(lambda *a: pe.tupe_logits(*a[:5], bias=a[5]), *arrays)
    return got, naive_tupe(q, k, p, uq, uk, bias=bias, offset=K - Q)  # the default: queries are the last keys


def case_tupe_logits_cls(rng, backend, dtype):
    arrays, (q, k, p, uq, uk, bias) = _inputs(rng, backend, dtype, (H, Q, D), (H, K, D), (K, 3), (H, 3, D), (H, 3, D), (H, Q, K))
    got = backend.call(lambda *a: pe.tupe_logits(*a[:5], bias=a[5], cls=(1.0, -1.0), offset=0), *arrays)
    return got, naive_tupe(q, k, p, uq, uk, bias=bias, cls=(1.0, -1.0))


CASES = {
    f.__name__[5:]: f
    for f in (
        case_shaw_logits, case_shaw_output, case_xl_logits, case_tener_logits, case_segment_logits, case_deberta_logits,
        case_deberta_logits_bucketed, case_tupe_logits, case_tupe_logits_cls,
    )
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_naive_formula(backend, rng, name, dtype):
    result, expected = CASES[name](rng, backend, dtype)
    valid = ~np.isnan(expected)  # xl_logits: distances r has no row for
    expected = np.where(valid, expected, 0.0)
    for got in backend.each_run(result):
        assert_kind(got, backend=backend, dtype=dtype, shape=expected.shape)
        got_np = np.where(valid, backend.to_numpy(got).astype(np.float64), 0.0)
        np.testing.assert_allclose(got_np, expected, rtol=tolerance(dtype), atol=tolerance(dtype))


# --- Shaw / NEZHA -------------------------------------------------------------------------------


def naive_shaw_logits_per_table(q, k, table, kmax, offset):
    out = np.zeros(np.broadcast_shapes(q.shape[:-1], k.shape[:-2] + (1,)) + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            a = table[..., np.clip(offset + i - j, -kmax, kmax) + kmax, :]
            out[..., i, j] = np.sum(q[..., i, :] * (k[..., j, :] + a), axis=-1)
    return out


def test_shaw_logits_per_head_tables_broadcast_over_batch(rng):
    q, k = rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((1, 3, 9, 6))
    table = rng.standard_normal((3, 5, 6))  # one table per head
    expected = naive_shaw_logits_per_table(q, k, table, 2, 5)
    np.testing.assert_allclose(pe.shaw_logits(q, k, table, max_distance=2, offset=5), expected, atol=1e-12)


def test_nezha_released_table_reproduces_the_released_lookup(rng):
    # NEZHA's code: distance_mat = key - query, index = clip(distance_mat, -K, K) + K, and
    # row c of its table is the interleaved sinusoid of c itself.
    kmax, dim, n = 3, 8, 9
    released_table = sinusoid(np.arange(2 * kmax + 1), dim)
    index = np.clip(np.arange(n)[None, :] - np.arange(n)[:, None], -kmax, kmax) + kmax
    q, k = rng.standard_normal((2, n, dim)), rng.standard_normal((2, n, dim))
    expected = q @ k.transpose(0, 2, 1) + np.einsum("hid,ijd->hij", q, released_table[index])
    got = pe.shaw_logits(q, k, pe.nezha_table(kmax, dim, dtype=np.float64), max_distance=kmax)
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_nezha_paper_table_is_the_sinusoid_of_key_minus_query():
    kmax, dim = 4, 6
    table = pe.nezha_table(kmax, dim, form="paper", dtype=np.float64)
    rel = np.arange(-kmax, kmax + 1)  # row c is rel = c - K = query - key
    np.testing.assert_allclose(table, sinusoid(-rel, dim), atol=1e-15)


def test_nezha_table_namespace(backend):
    dtype = backend.dtype("float32")
    t = backend.call(lambda: pe.nezha_table(2, 4, xp=backend.xp, dtype=dtype))
    assert_close(t, sinusoid(np.arange(4, -1, -1), 4), backend=backend, dtype="float32")


def test_shaw_output_against_explicit_attention(rng):
    # The documented use: softmax of shaw_logits, then shaw_output with the value table.
    q, k, v = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 6, 6)), rng.standard_normal((2, 6, 3))
    tk, tv = rng.standard_normal((5, 6)), rng.standard_normal((5, 3))
    logits = pe.shaw_logits(q, k, tk, max_distance=2, offset=2) / math.sqrt(6)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(pe.shaw_output(w, v, tv, max_distance=2, offset=2), naive_shaw_output(w, v, tv, 2, offset=2), atol=1e-12)


# --- Transformer-XL / XLNet ------------------------------------------------------------------


def txl_rel_shift(x):
    """Transcription of Transformer-XL's ``_rel_shift`` (layout [q_len, n, batch, heads])."""
    zero_pad = np.zeros((x.shape[0], 1) + x.shape[2:], dtype=x.dtype)
    x_padded = np.concatenate([zero_pad, x], axis=1)
    x_padded = x_padded.reshape((x.shape[1] + 1, x.shape[0]) + x.shape[2:])
    return x_padded[1:].reshape(x.shape)


def test_rel_shift_equals_transformer_xl(backend, rng):
    x = rng.standard_normal((2, 3, 5, 8))  # [batch, heads, q_len, n]
    expected = np.transpose(txl_rel_shift(np.transpose(x, (2, 3, 0, 1))), (2, 3, 0, 1))
    out = backend.call(pe.rel_shift, backend.asarray(x, dtype="float32"))
    assert_close(out, expected.astype(np.float32), backend=backend, dtype="float32", rtol=0, atol=0)


def test_rel_shift_matches_xlnet_rel_shift_bnij(rng):
    torch = pytest.importorskip("torch")
    xlnet = pytest.importorskip("transformers.models.xlnet.modeling_xlnet")
    q_len, k_len = 4, 6
    x = torch.as_tensor(rng.standard_normal((2, 3, q_len, k_len + q_len)))
    want = xlnet.XLNetRelativeAttention.rel_shift_bnij(x, klen=k_len)
    torch.testing.assert_close(pe.rel_shift(x[..., 1:])[..., :k_len], want, rtol=0, atol=0)


def test_xl_logits_equals_transformer_xl_with_memory(rng):
    # AC + rel_shift(BD) with r for distances k_len-1..0, as Transformer-XL computes it.
    q_len, k_len = 4, 9
    q, k, r = rng.standard_normal((3, q_len, 8)), rng.standard_normal((3, k_len, 8)), rng.standard_normal((3, k_len, 8))
    u, v = rng.standard_normal((3, 1, 8)), rng.standard_normal((3, 1, 8))
    ac = (q + u) @ k.transpose(0, 2, 1)
    bd = pe.rel_shift((q + v) @ r.transpose(0, 2, 1))
    past = rel_matrix(q_len, k_len, k_len - q_len) >= 0
    got = pe.xl_logits(q, k, r, u, v)
    np.testing.assert_allclose(np.where(past, got, 0.0), np.where(past, ac + bd, 0.0), atol=1e-12)


def test_xl_logits_equals_xlnet_bidirectional(rng):
    torch = pytest.importorskip("torch")
    xlnet = pytest.importorskip("transformers.models.xlnet.modeling_xlnet")
    q_len, k_len = 5, 8
    q, k = rng.standard_normal((2, 3, q_len, 4)), rng.standard_normal((2, 3, k_len, 4))
    r_xlnet = rng.standard_normal((3, k_len + q_len, 4))  # XLNet: distances k_len .. -q_len + 1
    u, v = rng.standard_normal((3, 1, 4)), rng.standard_normal((3, 1, 4))
    bd = xlnet.XLNetRelativeAttention.rel_shift_bnij(torch.as_tensor((q + v) @ r_xlnet.swapaxes(-1, -2)), klen=k_len).numpy()
    expected = (q + u) @ k.swapaxes(-1, -2) + bd
    ours_r = np.concatenate([r_xlnet[:, 1:], rng.standard_normal((3, 1, 4))], axis=1)  # k_len-1 .. -q_len
    np.testing.assert_allclose(pe.xl_logits(q, k, ours_r, u, v), expected, atol=1e-12)


def xlnet_segment_term(q, seg_q, seg_k, seg_embed, r_s_bias):
    """Transcription of XLNet's segment term: one-hot of 'different segment', then two einsums."""
    seg_mat = np.eye(2)[(seg_q[:, None] != seg_k[None, :]).astype(int)]  # [i, j, 2]
    ef = np.einsum("nid,snd->nis", q + r_s_bias, seg_embed)
    return np.einsum("ijs,nis->nij", seg_mat, ef)


def test_segment_logits_equals_xlnet(rng):
    q = rng.standard_normal((3, 5, 4))
    seg_embed, bias = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 1, 4))
    seg_q, seg_k = np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 2, 2, 2])
    got = pe.segment_logits(q, seg_q, seg_k, seg_embed[0][:, None], seg_embed[1][:, None], bias)
    np.testing.assert_allclose(got, xlnet_segment_term(q, seg_q, seg_k, seg_embed, bias), atol=1e-12)


def test_segment_logits_batched_segments(rng):
    q = rng.standard_normal((2, 3, 4, 5))
    seg_q, seg_k = np.array([[0, 0, 1, 1], [0, 1, 1, 1]]), np.array([[0, 1, 1], [1, 1, 0]])
    s1, s2, b = (rng.standard_normal((3, 1, 5)) for _ in range(3))
    got = pe.segment_logits(q, seg_q, seg_k, s1, s2, b)
    for n in range(2):
        np.testing.assert_allclose(got[n], naive_segment(q[n], seg_q[n], seg_k[n], s1, s2, b), atol=1e-12)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_segment_logits_do_not_depend_on_the_memory_layout_of_q(rng, library):
    """Each logit is the sum of its own d products in one order: a Fortran-ordered or
    transposed q (the same values) gave other bits where the sum followed q's memory
    layout (9.5e-7 apart in float32, NumPy and torch)."""
    q = rng.standard_normal((3, 2, 10, 8)).astype(np.float32)
    s1, s2, b = (rng.standard_normal((2, 1, 8)).astype(np.float32) for _ in range(3))
    seg = np.array([0, 0, 1, 1, 1, 2, 2, 0, 1, 2])
    layouts = [q, np.asfortranarray(q), np.swapaxes(np.swapaxes(q, -1, -2).copy(), -1, -2), q[..., ::-1].copy()[..., ::-1]]
    if library == "torch":
        torch = pytest.importorskip("torch")
        s1, s2, b, seg = (torch.from_numpy(a) for a in (s1, s2, b, seg))
        layouts = [torch.from_numpy(q), torch.from_numpy(q).permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0), torch.from_numpy(q).mT.contiguous().mT]
    want = np.asarray(pe.segment_logits(layouts[0], seg, seg, s1, s2, b))
    for q_layout in layouts[1:]:
        np.testing.assert_array_equal(np.asarray(pe.segment_logits(q_layout, seg, seg, s1, s2, b)), want)


def test_tener_direction_aware(rng):
    q, k = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4))
    u = v = np.zeros((1, 1, 4))
    half = pe.tener_logits(q, k, u, v, layout="half")
    r = sinusoid(rel_matrix(3, 3), 4)[..., [0, 2, 1, 3]]  # half: sines first
    np.testing.assert_allclose(half[0], np.einsum("id,ijd->ij", q[0], r) + q[0] @ k[0].T, atol=1e-12)


# --- DeBERTa --------------------------------------------------------------------------------------


def test_deberta_logits_bucketed_matches_naive(rng):
    q, k = rng.standard_normal((2, 30, 4)), rng.standard_normal((2, 30, 4))
    pq, pk = rng.standard_normal((2, 8, 4)), rng.standard_normal((2, 8, 4))
    got = pe.deberta_logits(q, k, pq, pk, max_distance=4, bucket_size=4, max_position=12)
    np.testing.assert_allclose(got, naive_deberta(q, k, pq, pk, 4, bucket=(4, 12)), atol=1e-12)


@pytest.mark.parametrize(
    "buckets, max_relative, terms",
    [
        (-1, 6, ["p2c", "c2p"]),
        (8, 32, ["p2c", "c2p"]),
        (8, 32, ["c2p"]),
        (8, 32, ["p2c"]),
        (-1, 6, []),
        # max_position <= bucket_size // 2 + 1: a negative log span, and a division by zero (5 = 4 + 1)
        (8, 3, ["c2p", "p2c"]),
        (8, 5, ["c2p", "p2c"]),
    ],
)
def test_deberta_logits_equal_released_code(rng, buckets, max_relative, terms):
    torch = pytest.importorskip("torch")
    deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    config = deberta.DebertaV2Config(
        hidden_size=16, num_attention_heads=2, relative_attention=True, pos_att_type=terms,
        position_buckets=buckets, max_relative_positions=max_relative, share_att_key=False,
    )
    attention = deberta.DisentangledSelfAttention(config).double().eval()
    span = buckets if buckets > 0 else max_relative
    hidden = torch.as_tensor(rng.standard_normal((3, 40, 16)))
    rel_embeddings = torch.as_tensor(rng.standard_normal((2 * span, 16)))
    with torch.no_grad():
        split = lambda x: attention.transpose_for_scores(x, 2)  # noqa: E731  ([batch*heads, L, d])
        q, k = split(attention.query_proj(hidden)), split(attention.key_proj(hidden))
        factor = 1 + len(terms)
        scale = math.sqrt(q.shape[-1] * factor)
        want = q @ k.transpose(-1, -2) / scale + attention.disentangled_attention_bias(q, k, None, rel_embeddings, factor)
        pos_k = split(attention.pos_key_proj(rel_embeddings[None])) if "c2p" in terms else None
        pos_q = split(attention.pos_query_proj(rel_embeddings[None])) if "p2c" in terms else None
        bucket = {"bucket_size": buckets, "max_position": max_relative} if buckets > 0 else {}
        got = pe.deberta_logits(q.view(3, 2, 40, 8), k.view(3, 2, 40, 8), pos_q, pos_k, max_distance=span, terms=terms, **bucket)
    torch.testing.assert_close(got, want.view(3, 2, 40, 40), rtol=1e-6, atol=1e-6)


# --- TUPE -----------------------------------------------------------------------------------------


def test_tupe_cls_untying(rng):
    q, k = rng.standard_normal((3, 6, 4)), rng.standard_normal((3, 6, 4))
    p, uq, uk = rng.standard_normal((8, 5)), rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 5, 4))
    theta = (np.array([1.0, 2.0, 3.0]), -0.5)
    got = pe.tupe_logits(q, k, p, uq, uk, cls=theta)
    for h in range(3):
        want = naive_tupe(q[h], k[h], p, uq[h], uk[h], cls=(theta[0][h], theta[1]))
        np.testing.assert_allclose(got[h], want, atol=1e-12)


def test_tupe_r_with_untied_cls_equals_the_released_code(rng):
    """TUPE-R with an untied [CLS] (Eq. 11: ``reset_theta(positional + b_{j-i}, i, j)``) as
    guolinke/TUPE computes it (fairseq/modules/transformer_sentence_encoder.py): the [CLS]
    row and column take their own relative buckets (``rel_pos_bins // 2`` and
    ``rel_pos_bins``), so the whole positional term there, relative bias included, is one
    learned value per head; the T5 bias of the actual distance had been added on top."""
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    heads, length, d, bins = 3, 9, 4, 32
    weight = rng.standard_normal((length + 1, 6))  # pos_ln(pos.weight[:seq_len + 1]): row 0 is [CLS]'s own
    uq, uk = rng.standard_normal((heads, 6, d)), rng.standard_normal((heads, 6, d))
    rel_table = rng.standard_normal((bins + 1, heads))  # relative_attention_bias: rel_pos_bins + 1 rows
    q, k = rng.standard_normal((heads, length, d)), rng.standard_normal((heads, length, d))
    # the released code, transcribed
    abs_pos_bias = (weight @ uq) / math.sqrt(2 * d) @ (weight @ uk).transpose(0, 2, 1)
    cls_2_other, other_2_cls = abs_pos_bias[:, 0, 0].copy(), abs_pos_bias[:, 1, 1].copy()
    abs_pos_bias = abs_pos_bias[:, 1:, 1:]
    abs_pos_bias[:, :, 0] = other_2_cls[:, None]
    abs_pos_bias[:, 0, :] = cls_2_other[:, None]
    memory_minus_context = np.arange(length)[None, :] - np.arange(length)[:, None]
    rp_bucket = t5.T5Attention._relative_position_bucket(torch.as_tensor(memory_minus_context), num_buckets=bins).numpy()
    rp_bucket[:, 0] = bins
    rp_bucket[0, :] = bins // 2
    want = q @ k.transpose(0, 2, 1) / math.sqrt(2 * d) + abs_pos_bias + rel_table[rp_bucket].transpose(2, 0, 1)
    bias = pe.t5_bias(rel_table[:bins], length, length, num_buckets=bins)
    cls = (cls_2_other + rel_table[bins // 2], other_2_cls + rel_table[bins])
    got = pe.tupe_logits(q, k, weight[1:], uq, uk, bias=bias, cls=cls)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_deberta_logits_unused_table_may_be_none():
    # (a needed one may not: test_bad_inputs.py)
    q, k, table = np.ones((2, 3, 4)), np.ones((2, 5, 4)), np.ones((2, 4, 4))
    assert pe.deberta_logits(q, k, None, table, max_distance=2, terms=("c2p",)).shape == (2, 3, 5)
    assert pe.deberta_logits(q, k, None, None, max_distance=2, terms=()).shape == (2, 3, 5)


def test_tupe_cls_arrays_are_host_constants_beside_torch_and_refused_from_a_third_library():
    """``cls``'s arrays sit inside a pair, where ``host_constants`` does not look: a NumPy
    ``[heads]`` array beside torch tensors is converted as the other arguments would be (the
    same logits as torch's own), a JAX one gets the two-libraries TypeError (both had raised
    an AttributeError about NumPy's dtype)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q, k, p, u = torch.randn(1, 2, 4, 4, generator=g), torch.randn(1, 2, 4, 4, generator=g), torch.randn(4, 4, generator=g), torch.randn(2, 4, 4, generator=g)
    cls = np.array([0.5, -1.0], np.float32)
    got = pe.tupe_logits(q, k, p, u, u, cls=(cls, cls))
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, pe.tupe_logits(q, k, p, u, u, cls=(torch.from_numpy(cls), torch.from_numpy(cls))))
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="arrays of different kinds"):
        pe.tupe_logits(q, k, p, u, u, cls=(jnp.asarray(cls), jnp.asarray(cls)))



def test_tupe_logits_are_the_same_bits_whether_autograd_records_the_tables_or_not():
    """torch's matmul of ``p``'s rows (2-d) by per-head ``uq``/``uk`` took another kernel
    when ``p`` recorded a gradient: at each of these 20 offsets, 2 in 3 float32 logits an
    ulp or so off the same call's under ``no_grad`` (678.3666 by 1.8e-4), the TUPE module's alike."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(168)
    q, k = torch.randn(3, 2, 2, 8, generator=g), torch.randn(3, 2, 3, 8, generator=g)
    p, uq, uk = torch.randn(32, 8, generator=g) * 3, torch.randn(2, 8, 8, generator=g) * 3, torch.randn(2, 8, 8, generator=g) * 3
    leaves = tuple(t.clone().requires_grad_() for t in (p, uq, uk))
    for offset in (*range(20), torch.tensor([6, 17, 16])):
        recorded = pe.tupe_logits(q, k, *leaves, offset=offset)
        assert recorded.requires_grad
        with torch.no_grad():
            assert torch.equal(recorded.detach(), pe.tupe_logits(q, k, p, uq, uk, offset=offset)), offset

def test_logits_of_q_and_k_without_a_heads_axis_equal_those_of_one_head(rng):
    """``[q_len, d]`` q and k, as every logits function takes them: xl_logits and
    deberta_logits raised IndexError from ``_xp.heads_like`` (it read a heads axis)."""
    q, k = rng.standard_normal((5, 8)), rng.standard_normal((7, 8))
    r, u, v = rng.standard_normal((11, 8)), rng.standard_normal(8), rng.standard_normal(8)
    np.testing.assert_array_equal(pe.xl_logits(q, k, r, u, v), pe.xl_logits(q[None], k[None], r, u, v)[0])
    pos = rng.standard_normal((8, 8))
    np.testing.assert_array_equal(pe.deberta_logits(q, k, pos, pos, max_distance=4), pe.deberta_logits(q[None], k[None], pos, pos, max_distance=4)[0])
