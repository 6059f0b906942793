"""Relative indices, buckets and biases against the paper formulas and the original code."""

from __future__ import annotations

import math

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close

DTYPES = ["float16", "bfloat16", "float32", "float64"]


def rel_matrix(q_len, k_len, offset=0):
    return (offset + np.arange(q_len))[:, None] - np.arange(k_len)[None, :]


def hf_t5_bucket(key_minus_query, **kwargs):
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    return t5.T5Attention._relative_position_bucket(torch.as_tensor(key_minus_query), **kwargs).numpy()


def hf_deberta_bucket(rel, bucket_size, max_position):
    torch = pytest.importorskip("torch")
    deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    return deberta.make_log_bucket_position(torch.as_tensor(rel), bucket_size, max_position).numpy().astype(np.int64)


# --- clip_relative ------------------------------------------------------------------


def test_clip_relative_formula(backend):
    rel = rel_matrix(4, 7, offset=2)
    out = pe.clip_relative(backend.asarray(rel), 3)
    assert_close(out, np.clip(rel, -3, 3) + 3, backend=backend, dtype=backend.asarray(rel).dtype)


@pytest.mark.parametrize(
    "rel, k, error",
    [(np.array([0.5]), 2, TypeError), (np.array([1]), -1, ValueError), (np.array([1]), 2.0, TypeError), ([1, 2], 2, TypeError)],
)
def test_clip_relative_bad_input(rel, k, error):
    with pytest.raises(error, match="rel|max_distance"):
        pe.clip_relative(rel, k)


# --- t5_bucket ----------------------------------------------------------------------


def test_t5_bucket_reproduces_the_docs_table():
    # Bidirectional, 32 buckets: 16 per direction, 8 exact; distance n >= 8 goes to
    # 8 + floor(ln(n/8) / ln(128/8) * 8) = 8 + floor(2 * log2(n/8)), so bucket 8 holds
    # 8..11 (log2 < 0.5), 9 holds 12..15 (n < 8*2**1), 10 holds 16..22 (n < 8*2**1.5 = 22.6),
    # 11 holds 23..31 (n < 32).
    expected = list(range(8)) + [8] * 4 + [9] * 4 + [10] * 7 + [11] * 8
    assert pe.t5_bucket(np.arange(31), bidirectional=True).tolist() == expected


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    "num_buckets, max_distance",
    [(32, 128), (4, 3), (8, 5), (16, 9), (32, 20), (64, 100), (64, 1000), (128, 128), (128, 2048), (320, 4096), (6, 4)],
)
def test_t5_bucket_equals_original_on_key_minus_query(bidirectional, num_buckets, max_distance):
    if max_distance <= num_buckets // 2:
        pytest.skip("not a valid configuration")
    rel = np.concatenate([np.arange(-5000, 5001), [-(2**40), 2**40, 123456789, -987654321]])
    ours = pe.t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    original = hf_t5_bucket(-rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    np.testing.assert_array_equal(ours, original)


def test_t5_bucket_on_every_backend(backend):
    rel = rel_matrix(9, 40, offset=20) * 3
    out = pe.t5_bucket(backend.asarray(rel), bidirectional=True, num_buckets=32, max_distance=50)
    expected = hf_t5_bucket(-rel, bidirectional=True, num_buckets=32, max_distance=50)
    assert_close(out, expected, backend=backend, dtype=backend.asarray(rel).dtype)


def test_t5_bucket_int32_input_keeps_dtype():
    rel = np.arange(-300, 300, dtype=np.int32)
    out = pe.t5_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, hf_t5_bucket(-rel.astype(np.int64), bidirectional=False))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_buckets": 1}, ValueError, "num_buckets"),
        ({"num_buckets": 31}, ValueError, "num_buckets"),
        ({"num_buckets": 2}, ValueError, "num_buckets"),
        ({"num_buckets": 32.0}, TypeError, "num_buckets"),
        ({"num_buckets": 32, "max_distance": 16}, ValueError, "max_distance"),
        ({"bidirectional": False, "num_buckets": 32, "max_distance": 16}, ValueError, "max_distance"),
        ({"max_distance": 0}, ValueError, "max_distance"),
        ({"bidirectional": 1}, TypeError, "bidirectional"),
    ],
)
def test_t5_bucket_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        pe.t5_bucket(np.arange(5), **kwargs)


def test_t5_bucket_rejects_non_integer_rel():
    with pytest.raises(TypeError, match="rel"):
        pe.t5_bucket(np.arange(5.0))


# --- deberta_bucket -----------------------------------------------------------------


@pytest.mark.parametrize("bucket_size, max_position", [(256, 512), (8, 16), (16, 100), (64, 512), (32, 1000), (4, 6), (2, 10)])
def test_deberta_bucket_equals_original(bucket_size, max_position):
    rel = np.arange(-4 * max_position, 4 * max_position + 1)
    ours = pe.deberta_bucket(rel, bucket_size=bucket_size, max_position=max_position)
    np.testing.assert_array_equal(ours, hf_deberta_bucket(rel, bucket_size, max_position))


# max_position <= bucket_size // 2 + 1: a negative log span, ln(0) (P = 1), a division by zero
# (P = m + 1, whose +-inf the model casts to int64 with .long(), as here).
@pytest.mark.parametrize("bucket_size, max_position", [(16, 9), (16, 5), (8, 4), (8, 2), (8, 1), (2, 2), (4, 1), (256, 100)])
def test_deberta_bucket_small_max_position_as_the_released_code(bucket_size, max_position):
    torch = pytest.importorskip("torch")
    deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    rel = np.arange(-3 * bucket_size, 3 * bucket_size + 1)
    want = deberta.make_log_bucket_position(torch.as_tensor(rel), bucket_size, max_position).long().numpy()
    np.testing.assert_array_equal(pe.deberta_bucket(rel, bucket_size=bucket_size, max_position=max_position), want)


def test_deberta_bucket_formula_on_every_backend(backend):
    rel = rel_matrix(6, 50, offset=20) * 5
    out = pe.deberta_bucket(backend.asarray(rel), bucket_size=16, max_position=64)
    mid, n = 8, np.abs(rel)
    log_bucket = mid + np.ceil(np.log(np.maximum(n, 1) / mid) / np.log(63 / mid) * (mid - 1))
    expected = np.where(n <= mid, rel, np.sign(rel) * log_bucket).astype(np.int64)
    assert_close(out, expected, backend=backend, dtype=backend.asarray(rel).dtype)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"bucket_size": 1}, ValueError, "bucket_size"),
        ({"bucket_size": 8.0}, TypeError, "bucket_size"),
        ({"max_position": 0}, ValueError, "max_position"),
    ],
)
def test_deberta_bucket_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        pe.deberta_bucket(np.arange(5), **kwargs)
    with pytest.raises(TypeError, match="rel"):
        pe.deberta_bucket(np.arange(5.0))


# --- t5_bias --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bidirectional, offset", [(True, 0), (True, 7), (False, 30)])
def test_t5_bias_formula(backend, rng, dtype, bidirectional, offset):
    table = backend.asarray(rng.standard_normal((16, 3)), dtype=dtype)
    out = pe.t5_bias(table, 5, 40, bidirectional=bidirectional, max_distance=20, offset=offset)
    bucket = hf_t5_bucket(-rel_matrix(5, 40, offset), bidirectional=bidirectional, num_buckets=16, max_distance=20)
    expected = np.moveaxis(backend.to_numpy(table).astype(np.float64)[bucket], -1, 0)
    assert_close(out, expected, backend=backend, dtype=dtype)


def test_t5_bias_matches_transformers_compute_bias():
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    config = t5.T5Config(d_model=8, d_kv=4, num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=20, is_decoder=True)
    attention = t5.T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(attention.relative_attention_bias.weight)
    with torch.no_grad():
        want = attention.compute_bias(6, 30)[0]  # decoder: unidirectional
        got = pe.t5_bias(attention.relative_attention_bias.weight, 6, 30, bidirectional=False, max_distance=20)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_t5_bias_writes_out(name, rng):
    if name == "torch":
        torch = pytest.importorskip("torch")
        table, out = torch.randn(32, 2), torch.empty(2, 3, 4)
    else:
        table, out = rng.standard_normal((32, 2)).astype(np.float32), np.empty((2, 3, 4), np.float32)
    result = pe.t5_bias(table, 3, 4, out=out)
    assert result is out
    np.testing.assert_array_equal(np.asarray(out), np.asarray(pe.t5_bias(table, 3, 4)))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((np.zeros(32), 3, 4), {}, ValueError, "table"),
        ((np.zeros((32, 2), dtype=np.int64), 3, 4), {}, TypeError, "table"),
        ((np.zeros((31, 2)), 3, 4), {}, ValueError, "num_buckets"),
        ((np.zeros((32, 2)), -1, 4), {}, ValueError, "q_len"),
        ((np.zeros((32, 2)), 3, 4.0), {}, TypeError, "k_len"),
        ((np.zeros((32, 2)), 3, 4), {"offset": 0.5}, TypeError, "offset"),
        ((np.zeros((32, 2)), 3, 4), {"max_distance": 8}, ValueError, "max_distance"),
        ((np.zeros((32, 2)), 3, 4), {"out": np.zeros((2, 4, 3))}, ValueError, "out"),
        ((np.zeros((32, 2)), 3, 4), {"out": np.zeros((2, 3, 4), np.float32)}, ValueError, "out"),
        ((np.zeros((32, 2)), 10**6, 10**6), {}, ValueError, "memory"),
        (([0.0] * 32, 3, 4), {}, TypeError, "table"),
    ],
)
def test_t5_bias_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        pe.t5_bias(*args, **kwargs)


# --- ALiBi ----------------------------------------------------------------------------


def test_alibi_slopes_power_of_two_formula():
    np.testing.assert_array_equal(pe.alibi_slopes(8, dtype=np.float64), 2.0 ** (-np.arange(1, 9)))


@pytest.mark.parametrize("num_heads", list(range(1, 41)) + [64, 80, 96, 112])
def test_alibi_slopes_equal_bloom(num_heads):
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    alibi = bloom.build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)  # slope * key position
    # BLOOM raises a float32-rounded base to integer powers k <= num_heads in float32: its
    # relative error grows like k * 2**-24. Ours is the exact value rounded once.
    rtol = (num_heads + 2) * 2.0**-24
    np.testing.assert_allclose(pe.alibi_slopes(num_heads), alibi[:, 0, 1].numpy(), rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi_slopes_namespace_and_dtype(backend, dtype):
    out = pe.alibi_slopes(12, xp=backend.xp, dtype=backend.dtype(dtype))
    p = 8  # largest power of two <= 12, then every other slope of 16 heads
    expected = [2.0 ** (-8 * h / p) for h in range(1, 9)] + [2.0 ** (-4 * (2 * h - 1) / p) for h in range(1, 5)]
    assert_close(out, np.array(expected), backend=backend, dtype=dtype)


@pytest.mark.parametrize("num_heads, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_alibi_slopes_bad_input(num_heads, error):
    with pytest.raises(error, match="num_heads"):
        pe.alibi_slopes(num_heads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric, offset", [(False, 0), (False, 9), (True, 3)])
def test_alibi_bias_formula(backend, dtype, symmetric, offset):
    slopes = backend.asarray(pe.alibi_slopes(6, dtype=np.float64), dtype=dtype)
    out = pe.alibi_bias(slopes, 4, 13, offset=offset, symmetric=symmetric)
    rel = rel_matrix(4, 13, offset)
    expected = -backend.to_numpy(slopes).astype(np.float64)[:, None, None] * (np.abs(rel) if symmetric else rel)
    assert_close(out, expected, backend=backend, dtype=dtype)


def test_alibi_bias_equals_bloom_up_to_a_per_query_constant():
    # BLOOM adds slope * key_position; softmax ignores the per-row constant slope * query_position.
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    heads, length = 5, 9
    bloom_bias = bloom.build_alibi_tensor(torch.ones(1, length), heads, torch.float64)  # [heads, 1, length]
    slopes = pe.alibi_slopes(heads, xp=pe._xp.namespace(torch.ones(1)), dtype=torch.float64)
    ours = pe.alibi_bias(slopes, length, length)
    torch.testing.assert_close(ours + slopes[:, None, None] * torch.arange(length, dtype=torch.float64)[:, None], bloom_bias.expand(-1, length, -1))


@pytest.mark.parametrize("num_heads", [1, 3, 4, 6, 12, 16, 24])
@pytest.mark.parametrize("max_bias", [8.0, 4.0, 16.0, 2.5])
def test_alibi_slopes_max_bias_equal_mpt(num_heads, max_bias):
    torch = pytest.importorskip("torch")
    mpt = pytest.importorskip("transformers.models.mpt.modeling_mpt")
    # MPT's tensor is (key - last query) * slope for keys 0..L-1: the key one before gives -slope.
    alibi = mpt.build_mpt_alibi_tensor(num_heads, 2, alibi_bias_max=max_bias)  # [heads, 1, 2]
    np.testing.assert_allclose(pe.alibi_slopes(num_heads, max_bias=max_bias), -alibi[:, 0, 0].numpy(), rtol=4 * 2.0**-24)


@pytest.mark.parametrize("max_bias", [0.0, -1.0, float("nan")])
def test_alibi_slopes_bad_max_bias(max_bias):
    with pytest.raises(ValueError, match="max_bias"):
        pe.alibi_slopes(4, max_bias=max_bias)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_alibi_bias_per_token_positions_formula(backend, dtype, rng):
    # Left-padded keys of a batch of two, queries the last 3 tokens (a cache of 5), batch axes broadcast.
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
    keys = np.asarray(pe.positions_from_mask(mask))
    queries = keys[:, -3:]
    slopes = pe.alibi_slopes(4, dtype=np.float64)
    for symmetric in (False, True):
        out = pe.alibi_bias(backend.asarray(slopes, dtype=dtype), 3, 8, symmetric=symmetric, offset=1,
                            query_positions=backend.asarray(queries), key_positions=backend.asarray(keys))
        rel = (queries + 1)[:, :, None] - keys[:, None, :]
        expected = -slopes[None, :, None, None] * (np.abs(rel) if symmetric else rel)[:, None]
        assert_close(out, expected, backend=backend, dtype=dtype)
    # Only the keys per token (queries at offset + arange), float positions, broadcast batch axes.
    out = pe.alibi_bias(backend.asarray(slopes, dtype=dtype), 2, 3, offset=4, key_positions=backend.asarray(np.array([[[0.5, 1.0, 3.0]]])))
    rel = np.array([4.0, 5.0])[:, None] - np.array([0.5, 1.0, 3.0])[None, :]
    assert_close(out, (-slopes[:, None, None] * rel[None])[None, None], backend=backend, dtype=dtype)


def test_alibi_bias_per_token_equals_bloom_padded():
    # BLOOM's ALiBi for a padded batch: slope * key position from the mask, i.e. queries at 0.
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    heads = 6
    want = bloom.build_alibi_tensor(mask, heads, torch.float32).view(2, heads, 1, 7)
    keys = pe.positions_from_mask(mask)
    got = pe.alibi_bias(pe.alibi_slopes(heads, xp=torch), 1, 7, query_positions=torch.zeros(2, 1, dtype=torch.int64), key_positions=keys)
    real = mask.bool()[:, None, None, :].expand_as(want)
    torch.testing.assert_close(got[real], want[real], rtol=(heads + 2) * 2.0**-24, atol=0)


def test_sizes_are_checked_before_any_allocation():
    # The per-distance vector of 2**41 entries would be the first allocation: refused first.
    with pytest.raises(ValueError, match="memory"):
        pe.alibi_bias(np.ones(4), 2**40, 2**40)
    with pytest.raises(ValueError, match="memory"):
        pe.relative_bias_vector("t5", np.ones((32, 4)), 2**40, 2**40)
    with pytest.raises(ValueError, match="memory"):
        pe.alibi_bias(np.ones(4), 2**20, 2**20, key_positions=np.zeros((2**20,), dtype=np.int64))
    huge = np.broadcast_to(np.arange(2**21), (3, 2**21, 2**21))  # a view: nothing allocated yet
    with pytest.raises(ValueError, match="memory"):
        pe.rope_cos_sin(huge[0], [1.0] * 8)
    with pytest.raises(ValueError, match="memory"):
        pe.mrope_cos_sin(huge, [1.0] * 8, [4, 2, 2])


@pytest.mark.parametrize(
    "slopes, kwargs, error, match",
    [
        (np.ones((2, 2)), {}, ValueError, "slopes"),
        (np.ones(2, dtype=np.int64), {}, TypeError, "slopes"),
        (np.ones(2), {"symmetric": "yes"}, TypeError, "symmetric"),
        (np.ones(2), {"offset": 1.5}, TypeError, "offset"),
        (np.ones(2), {"out": np.ones((2, 3))}, ValueError, "out"),
        (np.ones(2), {"query_positions": np.zeros((2, 4), dtype=int)}, ValueError, "query_positions"),
        (np.ones(2), {"key_positions": np.zeros((2, 3), dtype=int), "query_positions": np.zeros((3, 3), dtype=int)}, ValueError, "broadcast"),
        (np.ones(2), {"key_positions": np.array([0.0, np.nan, 1.0])}, ValueError, "key_positions"),
        (np.ones(2), {"key_positions": np.zeros(3, dtype=bool)}, TypeError, "key_positions"),
        (np.ones(2), {"key_positions": np.zeros(3, dtype=int), "chunks": (1, 1, 1)}, ValueError, "chunks"),
    ],
)
def test_alibi_bias_bad_input(slopes, kwargs, error, match):
    with pytest.raises(error, match=match):
        pe.alibi_bias(slopes, 3, 3, **kwargs)


# --- relative_bias_vector, relative_bias, expand_bias ------------------------------------


def _kind_params(kind, rng):
    if kind == "t5":
        return rng.standard_normal((8, 3)), {"bidirectional": True, "max_distance": 10}
    if kind == "alibi":
        return pe.alibi_slopes(3, dtype=np.float64), {"symmetric": True}
    if kind == "shaw":
        return rng.standard_normal((7, 3)), {"max_distance": 3}
    return rng.standard_normal((8, 3)), {"max_distance": 4, "bucket_size": 4, "max_position": 12}


def _naive_bias(kind, params, rel, options):
    if kind == "t5":
        index = hf_t5_bucket(-rel, num_buckets=params.shape[0], **options)
    elif kind == "alibi":
        return -params[:, None, None] * np.abs(rel)
    elif kind == "shaw":
        k = options["max_distance"]
        index = np.clip(rel, -k, k) + k
    else:
        k = options["max_distance"]
        index = np.clip(hf_deberta_bucket(rel, options["bucket_size"], options["max_position"]) + k, 0, 2 * k - 1)
    return np.moveaxis(params[index], -1, 0)


@pytest.mark.parametrize("kind", ["t5", "alibi", "shaw", "deberta"])
def test_relative_bias_vector_expands_to_the_naive_bias(backend, rng, kind):
    params, options = _kind_params(kind, rng)
    q_len, k_len, offset = 6, 17, 5
    vec = pe.relative_bias_vector(kind, backend.asarray(params, dtype="float32"), q_len, k_len, offset=offset, **options)
    assert tuple(vec.shape) == (3, q_len + k_len - 1)
    expected = _naive_bias(kind, params.astype(np.float32).astype(np.float64), rel_matrix(q_len, k_len, offset), options)
    assert_close(pe.expand_bias(vec, q_len, k_len), expected, backend=backend, dtype="float32")
    bias = pe.relative_bias(kind, backend.asarray(params, dtype="float32"), q_len, k_len, offset=offset, **options)
    assert_close(bias, expected, backend=backend, dtype="float32")


def test_relative_bias_vector_entries_are_distances():
    vec = pe.relative_bias_vector("alibi", np.array([-1.0]), 3, 4, offset=2)
    np.testing.assert_array_equal(vec[0], 2 + np.arange(6) - 3)  # rel = offset + t - (k_len - 1)


def test_relative_bias_empty_lengths():
    assert pe.t5_bias(np.ones((32, 2)), 0, 5).shape == (2, 0, 5)
    assert pe.alibi_bias(np.ones(2), 4, 0).shape == (2, 4, 0)
    assert pe.relative_bias_vector("alibi", np.ones(2), 0, 3).shape == (2, 0)


@pytest.mark.parametrize(
    "kind, params, kwargs, error, match",
    [
        ("rope", np.ones((3, 2)), {}, ValueError, "kind"),
        ("shaw", np.ones((5, 2)), {}, TypeError, "max_distance"),
        ("shaw", np.ones((6, 2)), {"max_distance": 2}, ValueError, "table"),
        ("shaw", np.ones((5, 2)), {"max_distance": 2, "bucket_size": 4}, TypeError, "bucket_size"),
        ("deberta", np.ones((5, 2)), {"max_distance": 2}, ValueError, "table"),
        ("deberta", np.ones((4, 2)), {"max_distance": 2, "max_position": 8}, ValueError, "max_position"),
        ("deberta", np.ones((4, 2)), {"max_distance": 0}, ValueError, "max_distance"),
        ("t5", np.ones((4, 0)), {}, ValueError, "table"),
        ("alibi", [1.0], {}, TypeError, "slopes"),
    ],
)
def test_relative_bias_vector_bad_input(kind, params, kwargs, error, match):
    with pytest.raises(error, match=match):
        pe.relative_bias_vector(kind, params, 3, 4, **kwargs)


def test_expand_bias_bad_input():
    with pytest.raises(ValueError, match="vec"):
        pe.expand_bias(np.ones((2, 5)), 3, 4)
    with pytest.raises(TypeError, match="vec"):
        pe.expand_bias([1.0] * 6, 3, 4)
    with pytest.raises(ValueError, match="memory"):
        pe.expand_bias(np.ones((8, 2 * 10**6 - 1)), 10**6, 10**6)


def test_bias_plugs_into_attention(rng):
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    bias = pe.alibi_bias(pe.alibi_slopes(2, dtype=np.float64), 5, 5)
    out = pe.attention(q, k, v, bias=bias, causal=True)
    logits = q @ k.transpose(0, 2, 1) / 2.0 + bias + np.where(rel_matrix(5, 5) >= 0, 0.0, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (w / w.sum(-1, keepdims=True)) @ v, atol=1e-12)
    assert math.isfinite(float(out.sum()))
