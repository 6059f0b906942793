"""Demo steps for the relative family (see ``posenc._demo``)."""

import numpy as np

import posenc as pe
from posenc._demo import describe, step


def _qkv(a, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [a.asarray(rng.standard_normal(s), a.float32) for s in shapes]


@step("clip_relative (Shaw index)")
def _clip(a):
    idx = pe.clip_relative(pe.relative_positions(3, 6, xp=a.xp), 2)
    return f"{describe(idx)}; row 0 = {[int(v) for v in idx[0, :]]}"


@step("t5_bucket")
def _t5_bucket(a):
    b = pe.t5_bucket(a.asarray(np.arange(31)))
    return f"rel 0..30 -> {[int(v) for v in b]}"


@step("t5_bias")
def _t5_bias(a):
    (table,) = _qkv(a, (32, 8))
    return f"table (32, 8) -> {describe(pe.t5_bias(table, 128, 128))}"


@step("deberta_bucket")
def _deberta_bucket(a):
    b = pe.deberta_bucket(a.asarray(np.array([0, 100, 128, 200, 511, -511])))
    return f"rel [0, 100, 128, 200, 511, -511] -> {[int(v) for v in b]}"


@step("alibi_slopes + alibi_bias")
def _alibi(a):
    slopes = pe.alibi_slopes(12, xp=a.xp)
    bias = pe.alibi_bias(slopes, 1, 1024)  # the query is the last key: no offset
    return f"12 heads, decode step -> {describe(bias)}; slope[0] = {float(slopes[0]):.4f}"


@step("relative_bias_vector")
def _vector(a):
    (table,) = _qkv(a, (32, 8))
    vec = pe.relative_bias_vector("t5", table, 512, 512)
    return f"T5 per-distance vector {describe(vec)} (O(L)), expands to [8, 512, 512]"


@step("shaw_logits / shaw_output")
def _shaw(a):
    q, k, v, tk, tv = _qkv(a, (8, 64, 32), (8, 64, 32), (8, 64, 32), (33, 32), (33, 32))
    logits = pe.shaw_logits(q, k, tk, max_distance=16)
    w = a.xp.exp(logits - a.xp.max(logits, axis=-1, keepdims=True))
    w = w / a.xp.sum(w, axis=-1, keepdims=True)
    return f"{describe(logits)}; output {describe(pe.shaw_output(w, v, tv, max_distance=16))}"


@step("NEZHA table")
def _nezha(a):
    return f"{describe(pe.nezha_table(64, 32, xp=a.xp))} fixed sinusoid rows for rel -64..64"


@step("rel_shift + xl_logits")
def _xl(a):
    q, k, r, u, v = _qkv(a, (4, 16, 32), (4, 48, 32), (4, 48, 32), (4, 1, 32), (4, 1, 32))
    return f"16 queries, 32 memory + 16 keys -> {describe(pe.xl_logits(q, k, r, u, v))}; rel_shift {describe(pe.rel_shift(q))}"


@step("segment_logits (XLNet)")
def _segment(a):
    q, s1, s2, b = _qkv(a, (4, 6, 8), (4, 1, 8), (4, 1, 8), (4, 1, 8))
    seg = a.asarray(np.array([0, 0, 0, 1, 1, 1]))
    return describe(pe.segment_logits(q, seg, seg, s1, s2, b))


@step("tener_logits")
def _tener(a):
    q, k, u, v = _qkv(a, (4, 20, 16), (4, 20, 16), (4, 1, 16), (4, 1, 16))
    return describe(pe.tener_logits(q, k, u, v))


@step("deberta_logits")
def _deberta(a):
    q, k, pq, pk = _qkv(a, (4, 64, 16), (4, 64, 16), (4, 512, 16), (4, 512, 16))
    return f"{describe(pe.deberta_logits(q, k, pq, pk, max_distance=256, bucket_size=256))} (c2p + p2c, / sqrt(3d))"


@step("tupe_logits")
def _tupe(a):
    q, k, p, uq, uk = _qkv(a, (4, 10, 16), (4, 10, 16), (10, 32), (4, 32, 16), (4, 32, 16))
    return describe(pe.tupe_logits(q, k, p, uq, uk, cls=(0.0, 0.0)))
