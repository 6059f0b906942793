"""Relative indices, buckets and biases against the paper formulas and the original code
(bad input: test_bad_inputs.py)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import posenc as pe
from arrays import DTYPES, assert_close
from formulas import hf_deberta_bucket, hf_t5_attention, hf_t5_bucket, rel_matrix


# --- clip_relative ------------------------------------------------------------------


def test_clip_relative_formula(backend):
    rel = rel_matrix(4, 7, offset=2)
    out = backend.call(lambda r: pe.clip_relative(r, 3), backend.asarray(rel))
    assert_close(out, np.clip(rel, -3, 3) + 3, backend=backend, dtype=backend.asarray(rel).dtype)


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
    [(32, 128), (4, 3), (8, 5), (16, 9), (32, 20), (64, 100), (64, 1000), (128, 128), (128, 2048), (320, 4096), (6, 4),
     (32, 12), (9, 5), (33, 40), (64, 20), (4096, 10**6), (2**16, 10**6)],
)  # fmt: skip
def test_t5_bucket_equals_original_on_key_minus_query(bidirectional, num_buckets, max_distance):
    """Every map the original computes (bidirectional: ``num_buckets // 2`` buckets a
    direction, odd counts too, and ``max_distance`` beyond their exact range of
    ``num_buckets // 4``), out to distances of 2**40."""
    side = num_buckets // 2 if bidirectional else num_buckets
    if max_distance <= side // 2:
        with pytest.raises(ValueError, match=f"max_distance must be > {side // 2} "):
            pe.t5_bucket(np.arange(3), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        return
    rel = np.concatenate([np.arange(-5000, 5001), [-(2**40), 2**40, 123456789, -987654321]])
    ours = pe.t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    original = hf_t5_bucket(-rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    np.testing.assert_array_equal(ours, original)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_on_every_backend(backend, bidirectional):
    rel = rel_matrix(9, 40, offset=20) * 3
    out = backend.call(lambda r: pe.t5_bucket(r, bidirectional=bidirectional, num_buckets=32, max_distance=50), backend.asarray(rel))
    expected = hf_t5_bucket(-rel, bidirectional=bidirectional, num_buckets=32, max_distance=50)
    assert_close(out, expected, backend=backend, dtype=backend.asarray(rel).dtype)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_of_many_buckets_on_every_backend(backend, bidirectional):
    """1022 log-spaced boundaries a direction, searched (``searchsorted``) rather than compared in turn."""
    rel = (rel_matrix(9, 40, offset=20) * 3) ** 3
    out = backend.call(lambda r: pe.t5_bucket(r, bidirectional=bidirectional, num_buckets=4096, max_distance=10**5), backend.asarray(rel))
    expected = hf_t5_bucket(-rel, bidirectional=bidirectional, num_buckets=4096, max_distance=10**5)
    assert_close(out, expected, backend=backend, dtype=backend.asarray(rel).dtype)


class _CountingNamespace:
    """An Array-API namespace that counts the calls of its functions (without ``searchsorted``
    where ``searching`` is False)."""

    def __init__(self, xp, searching):
        self.xp, self.searching, self.calls = xp, searching, 0

    def __getattr__(self, name):
        if name == "searchsorted" and not self.searching:
            raise AttributeError(name)
        value = getattr(self.xp, name)
        if not callable(value) or isinstance(value, type):
            return value

        def counted(*args, **kwargs):
            self.calls += 1
            return value(*args, **kwargs)

        return counted


@pytest.mark.parametrize("searching", [True, False])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_t5_buckets_of_many_boundaries_take_a_few_array_operations(searching, bidirectional, dtype):
    """The reference searches the 32767 boundaries of 65536 buckets: a few array operations
    with ``searchsorted``, a few for each of their 15 binary digits without it (it compared
    every distance with each boundary in turn, a pass over the array per boundary: 27 s for
    2M distances), and the same buckets."""
    from posenc.relative.buckets import t5_buckets

    xp = _CountingNamespace(np, searching)
    far = np.unique(np.geomspace(1, 2 * 10**6, 1000).astype(np.int64))
    rel = np.concatenate([-far, np.arange(-50, 50), far, [np.iinfo(dtype).min, np.iinfo(dtype).max]]).astype(dtype)
    got = t5_buckets(xp, rel, 2**16, 10**6, bidirectional)
    assert xp.calls <= (12 if searching else 12 + 4 * 15)
    assert got.dtype == dtype
    wide = np.clip(rel.astype(np.int64), -np.iinfo(dtype).max, None)
    np.testing.assert_array_equal(got, hf_t5_bucket(-wide, bidirectional=bidirectional, num_buckets=2**16, max_distance=10**6))


@pytest.mark.parametrize("searching", [True, False])
def test_t5_buckets_of_int32_search_the_starts_it_reaches(searching):
    """58 of the 63 starts of 128 causal buckets to 10**10 fit int32 (JAX's index dtype
    without x64): those are searched, and the largest int32 is in the last bucket but one."""
    from posenc.relative.buckets import t5_buckets

    info = np.iinfo(np.int32)
    rel = np.concatenate([np.geomspace(1, info.max, 3000).astype(np.int64), [0, info.max - 1, info.max]]).astype(np.int32)
    got = t5_buckets(_CountingNamespace(np, searching), rel, 128, 10**10, False)
    want = hf_t5_bucket(-rel.astype(np.int64), bidirectional=False, num_buckets=128, max_distance=10**10)
    assert got.dtype == np.int32 and want.max() == 122
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("side, max_distance", [(96, 10**10), (200, 10**11)])
def test_t5_starts_past_float32_integers_take_a_few_evaluations_each(monkeypatch, side, max_distance):
    """Each bucket's start is the first distance of the original's bucket, found from its
    estimate in a few evaluations of the float32 formula where float32 distances past 2**24
    are steps of many (it walked one distance at a time: 25925 evaluations for 47 starts
    at 10**10, 10 s for 127 at 10**12)."""
    from posenc.relative import buckets

    logs = []

    class CountedLog:  # (a module whose log is counted)
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            return getattr(self.module, name)

        def log(self, x):
            logs.append(x)
            return self.module.log(x)

    monkeypatch.setattr(buckets, "np", CountedLog(np))
    monkeypatch.setattr(buckets, "math", CountedLog(math))
    starts = buckets._t5_starts.__wrapped__(side, max_distance)
    assert len(starts) == side - side // 2 - 1 and len(logs) <= 16 * len(starts)
    got = [(_t5_map(side, max_distance, n - 1), _t5_map(side, max_distance, n)) for n in starts]
    assert got == [(b - 1, b) for b in range(side // 2 + 1, side)]


def _t5_map(side, max_distance, n):
    """The original's float32 bucket of distance ``n >= side // 2`` (an int64, as a float32),
    its log correctly rounded."""
    exact, f32 = side // 2, np.float32
    return exact + int(f32(math.log(np.int64(n).astype(f32) / f32(exact))) / f32(math.log(max_distance / exact)) * f32(side - exact))


@pytest.mark.parametrize("side, max_distance", [(2852, 840075), (2975, 741807), (96, 10**10)])
def test_t5_starts_are_those_of_a_correctly_rounded_float32_log(side, max_distance):
    """Every bucket's start is the first distance of that bucket in the original's float32
    arithmetic with the log correctly rounded (from float64), whatever the host: NumPy's
    own float32 log, an ulp off for 2.7% of values on an AVX-512 CPU, had moved 7, 5 and
    7 of these maps' starts there."""
    from posenc.relative.buckets import _t5_starts

    starts = _t5_starts.__wrapped__(side, max_distance)
    got = [(_t5_map(side, max_distance, n - 1), _t5_map(side, max_distance, n)) for n in starts]
    assert got == [(b - 1, b) for b in range(side // 2 + 1, side)]


@pytest.mark.parametrize("side, max_distance", [(258, 10**18), (130, 2**62), (77, 42028401853637367)])
def test_t5_starts_past_2_53_are_those_of_distances_rounded_once_to_float32(side, max_distance):
    """The original rounds an int64 distance to float32 once (``.float()``): 16, 10 and 1 of
    these maps' starts had moved, their distances past 2**53 rounded to float64 first
    (``np.float32`` of a Python int), and with them t5_bucket's buckets there."""
    from posenc.relative.buckets import _t5_starts

    starts = _t5_starts.__wrapped__(side, max_distance)
    got = [(_t5_map(side, max_distance, n - 1), _t5_map(side, max_distance, n)) for n in starts]
    assert got == [(b - 1, b) for b in range(side // 2 + 1, side)]


def test_t5_bucket_int32_input_keeps_dtype():
    rel = np.arange(-300, 300, dtype=np.int32)
    out = pe.t5_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, hf_t5_bucket(-rel.astype(np.int64), bidirectional=False))


def _narrow_values(dtype):
    info = np.iinfo(dtype)
    inner = np.arange(max(int(info.min), -300), min(int(info.max), 300) + 1)
    return np.unique(np.concatenate([inner, [info.min, info.min + 1, info.max - 1, info.max]])).astype(dtype)


NARROW = [np.int8, np.uint8, np.int16, np.uint16, np.int32]
BUCKET_MAPS = [  # (the function of rel, its int64 oracle: the same map of the values widened first)
    (lambda r: pe.clip_relative(r, 50), lambda r: np.clip(r, -50, 50) + 50),
    (lambda r: pe.clip_relative(r, 100), lambda r: np.clip(r, -100, 100) + 100),
    (lambda r: pe.t5_bucket(r, num_buckets=32, max_distance=128), lambda r: hf_t5_bucket(-r)),
    (lambda r: pe.t5_bucket(r, num_buckets=320, max_distance=1000), lambda r: hf_t5_bucket(-r, num_buckets=320, max_distance=1000)),
    (lambda r: pe.deberta_bucket(r, bucket_size=8, max_position=64), lambda r: hf_deberta_bucket(r, 8, 64)),
    (lambda r: pe.deberta_bucket(r), lambda r: hf_deberta_bucket(r, 256, 512)),
]


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("which", range(len(BUCKET_MAPS)))
def test_index_maps_of_narrow_integers_are_those_of_the_values_or_refused(which, dtype):
    """Narrow and unsigned ``rel`` are computed in int64 (they wrapped in their own dtype:
    ``clip_relative(int8 100, 100)`` gave -56) and returned in their dtype where every
    index the map can give fits it, else refused before any work."""
    fn, oracle = BUCKET_MAPS[which]
    rel = _narrow_values(dtype)
    want = oracle(rel.astype(np.int64))
    info = np.iinfo(dtype)
    largest_index = {0: 100, 1: 200, 2: 31, 3: 319}.get(which)  # 2K, num_buckets - 1 (DeBERTa's: within rel's range here)
    if largest_index is not None and largest_index > info.max:
        with pytest.raises(ValueError, match="pass a wider integer dtype"):
            fn(rel)
        return
    got = fn(rel)
    assert got.dtype == dtype
    assert want.min() >= info.min and want.max() <= info.max
    np.testing.assert_array_equal(got.astype(np.int64), want)


def test_deberta_rows_of_distances_near_the_index_dtypes_end_are_clipped_not_wrapped():
    """``delta = clip(rel + K, 0, 2K - 1)``, taken as ``clip(rel, -K, K - 1) + K``: a distance
    within K of int64's (JAX without x64: int32's) largest reads row 2K - 1, not row 0
    (``rel + K`` had wrapped to a negative number), in the bias and in ``deberta_logits``."""
    K, top = 2, 2**63 - 1
    table = np.arange(2 * K, dtype=np.float64)[:, None]  # row r holds r
    np.testing.assert_array_equal(pe.relative_bias("deberta", table, 1, 3, max_distance=K, offset=top), [[[3.0, 3.0, 3.0]]])
    q, k, pos_k = np.ones((1, 1, 1)), np.zeros((1, 3, 1)), np.arange(2 * K, dtype=np.float64)[None, :, None]
    got = pe.deberta_logits(q, k, None, pos_k, max_distance=K, terms=("c2p",), offset=top) * math.sqrt(2)
    np.testing.assert_allclose(got, [[[3.0, 3.0, 3.0]]])
    jnp = pytest.importorskip("jax.numpy")
    got32 = pe.relative_bias("deberta", jnp.asarray(table, dtype=jnp.float32), 1, 3, max_distance=K, offset=2**31 - 1)
    np.testing.assert_array_equal(np.asarray(got32), [[[3.0, 3.0, 3.0]]])


def test_deberta_bucket_at_m_plus_one_gives_the_dtypes_most_negative_integer():
    """``max_position = m + 1``: the original's +-inf cast to rel's integer dtype."""
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        rel = np.array([0, 3, 4, 5, -9, np.iinfo(dtype).min], dtype=dtype)
        got = pe.deberta_bucket(rel, bucket_size=8, max_position=5)
        assert got.dtype == dtype
        low = np.iinfo(dtype).min
        np.testing.assert_array_equal(got, np.array([0, 3, 4, low, low, low], dtype=dtype))


def test_deberta_bucket_of_the_most_negative_integer_is_bucketed():
    """``|int64 min|`` does not exist (abs wraps to itself, which passed as a small distance);
    it is bucketed as its neighbour, as the original's float arithmetic does."""
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        low = np.iinfo(dtype).min
        got = pe.deberta_bucket(np.array([low, low + 1], dtype=dtype), bucket_size=8, max_position=64)
        np.testing.assert_array_equal(got, hf_deberta_bucket(np.array([low + 1, low + 1], dtype=np.int64), 8, 64))


def test_relative_positions_of_a_narrow_dtype_must_fit_it():
    np.testing.assert_array_equal(pe.relative_positions(1, 3, offset=200, dtype=np.uint8), np.array([[200, 199, 198]], dtype=np.uint8))
    with pytest.raises(ValueError, match="-1 .. 2, beyond uint8"):
        pe.relative_positions(2, 3, dtype=np.uint8)
    with pytest.raises(ValueError, match="beyond int8"):
        pe.relative_positions(2, 300, dtype=np.int8)
    assert pe.relative_positions(2, 100, dtype=np.int8).dtype == np.int8


# --- deberta_bucket -----------------------------------------------------------------


# (128, 513): (P - 1) / m = 8 is a power of 2, so |rel| = 128, 256 are exact steps whose
# float64 log ratio lands above a whole number (a bucket past the original's float32 one).
@pytest.mark.parametrize("bucket_size, max_position", [(256, 512), (8, 16), (16, 100), (64, 512), (32, 1000), (4, 6), (2, 10), (128, 513), (194, 2048)])
def test_deberta_bucket_equals_original(bucket_size, max_position):
    rel = np.arange(-4 * max_position, 4 * max_position + 1)
    ours = pe.deberta_bucket(rel, bucket_size=bucket_size, max_position=max_position)
    np.testing.assert_array_equal(ours, hf_deberta_bucket(rel, bucket_size, max_position))


# max_position <= bucket_size // 2 + 1: a negative log span, ln(0) (P = 1), a division by zero
# (P = m + 1, whose +-inf the model casts to int64 with .long(), as here).
@pytest.mark.parametrize("bucket_size, max_position", [(16, 9), (16, 5), (8, 4), (8, 2), (8, 1), (2, 2), (4, 1), (256, 100)])
def test_deberta_bucket_small_max_position_as_the_released_code(bucket_size, max_position):
    rel = np.arange(-3 * bucket_size, 3 * bucket_size + 1)
    want = hf_deberta_bucket(rel, bucket_size, max_position)
    np.testing.assert_array_equal(pe.deberta_bucket(rel, bucket_size=bucket_size, max_position=max_position), want)


def test_deberta_bucket_of_exact_steps_is_the_originals_on_every_backend(backend):
    """Distances whose log ratio is a whole number of steps (``|rel| / m = 2, 4, 8`` for
    ``(P - 1) / m = 8``) get the original's bucket on every namespace, JAX without x64 too."""
    rel = np.array([128, 256, 512, -128, -256, 1024, 129, 255])
    out = backend.call(lambda r: pe.deberta_bucket(r, bucket_size=128, max_position=513), backend.asarray(rel))
    want = hf_deberta_bucket(rel, 128, 513)
    assert_close(out, want, backend=backend, dtype=backend.asarray(rel).dtype)


def test_deberta_bucket_formula_on_every_backend(backend):
    rel = rel_matrix(6, 50, offset=20) * 5
    out = backend.call(lambda r: pe.deberta_bucket(r, bucket_size=16, max_position=64), backend.asarray(rel))
    mid, n = 8, np.abs(rel)
    log_bucket = mid + np.ceil(np.log(np.maximum(n, 1) / mid) / np.log(63 / mid) * (mid - 1))
    expected = np.where(n <= mid, rel, np.sign(rel) * log_bucket).astype(np.int64)
    assert_close(out, expected, backend=backend, dtype=backend.asarray(rel).dtype)


# --- t5_bias --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bidirectional, offset", [(True, 0), (True, 7), (False, 30)])
def test_t5_bias_formula(backend, rng, dtype, bidirectional, offset):
    table = backend.asarray(rng.standard_normal((16, 3)), dtype=dtype)
    out = backend.call(lambda t: pe.t5_bias(t, 5, 40, bidirectional=bidirectional, max_distance=20, offset=offset), table)
    bucket = hf_t5_bucket(-rel_matrix(5, 40, offset), bidirectional=bidirectional, num_buckets=16, max_distance=20)
    expected = np.moveaxis(backend.to_numpy(table).astype(np.float64)[bucket], -1, 0)
    assert_close(out, expected, backend=backend, dtype=dtype)


def test_t5_bias_matches_transformers_compute_bias():
    torch = pytest.importorskip("torch")
    attention = hf_t5_attention(8, 20, is_decoder=True)
    with torch.no_grad():
        want = attention.compute_bias(6, 30)[0]  # decoder: unidirectional; queries counted from 0 (no cache)
        got = pe.t5_bias(attention.relative_attention_bias.weight, 6, 30, bidirectional=False, max_distance=20, offset=0)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_bias_of_token_positions_has_transformers_compute_bias_gradient(is_decoder):
    """Per-token positions read the table once per pair, as T5's embedding lookup does: the
    gradient is transformers' bit for bit in float32 (it summed each distance first, which
    regrouped the sums), on every call (the third on is planned)."""
    torch = pytest.importorskip("torch")
    attention = hf_t5_attention(32, 128, is_decoder=is_decoder)
    weights = torch.randn(1, 2, 150, 150, generator=torch.Generator().manual_seed(1))
    (attention.compute_bias(150, 150) * weights).sum().backward()
    positions = torch.arange(150)[None]
    for _ in range(4):
        table = attention.relative_attention_bias.weight.detach().clone().requires_grad_()
        bias = pe.t5_bias(table, 150, 150, bidirectional=not is_decoder, query_positions=positions, key_positions=positions)
        (bias * weights).sum().backward()
        assert torch.equal(table.grad, attention.relative_attention_bias.weight.grad)


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
    namespace_dtype = backend.dtype(dtype)
    out = backend.call(lambda: pe.alibi_slopes(12, xp=backend.xp, dtype=namespace_dtype))
    p = 8  # largest power of two <= 12, then every other slope of 16 heads
    expected = [2.0 ** (-8 * h / p) for h in range(1, 9)] + [2.0 ** (-4 * (2 * h - 1) / p) for h in range(1, 5)]
    assert_close(out, np.array(expected), backend=backend, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric, offset", [(False, 0), (False, 9), (True, 3)])
def test_alibi_bias_formula(backend, dtype, symmetric, offset):
    slopes = backend.asarray(pe.alibi_slopes(6, dtype=np.float64), dtype=dtype)
    out = backend.call(lambda s: pe.alibi_bias(s, 4, 13, offset=offset, symmetric=symmetric), slopes)
    rel = rel_matrix(4, 13, offset)
    expected = -backend.to_numpy(slopes).astype(np.float64)[:, None, None] * (np.abs(rel) if symmetric else rel)
    assert_close(out, expected, backend=backend, dtype=dtype)


def test_float16_biases_past_its_range_are_inf_without_a_numpy_warning():
    """Past float16's 65,504 an ALiBi or KERPLE-power entry is -inf, the float32 value's
    rounding (docs/precision.md); NumPy's cast warned "overflow encountered in cast" (an
    error under -W error), planned or not, per distance or per token."""
    slopes = pe.alibi_slopes(4).astype(np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            bias = pe.alibi_bias(slopes, 1, 300_000)
            assert bias.dtype == np.float16 and bias[0, 0, 0] == -np.inf and bias[0, 0, -1] == 0
            per_token = pe.alibi_bias(slopes, 1, 300_000, query_positions=np.array([299_999]), key_positions=np.arange(300_000))
            np.testing.assert_array_equal(per_token, bias)
        r = np.ones(4, np.float16)
        assert np.isneginf(pe.kerple_bias(r, 2 * r, 1, 3000, kind="power")[:, 0, :10]).all()


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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_alibi_bias_per_token_positions_formula(backend, dtype, rng):
    # Left-padded keys of a batch of two, queries the last 3 tokens (a cache of 5), batch axes broadcast.
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
    keys = np.asarray(pe.positions_from_mask(mask))
    queries = keys[:, -3:]
    slopes = pe.alibi_slopes(4, dtype=np.float64)
    for symmetric in (False, True):
        out = backend.call(
            lambda s, q, k: pe.alibi_bias(s, 3, 8, symmetric=symmetric, offset=1, query_positions=q, key_positions=k),
            backend.asarray(slopes, dtype=dtype), backend.asarray(queries), backend.asarray(keys),
        )
        rel = (queries + 1)[:, :, None] - keys[:, None, :]
        expected = -slopes[None, :, None, None] * (np.abs(rel) if symmetric else rel)[:, None]
        assert_close(out, expected, backend=backend, dtype=dtype)
    # Only the keys per token (queries at offset + arange), float positions, broadcast batch axes.
    out = backend.call(
        lambda s, k: pe.alibi_bias(s, 2, 3, offset=4, key_positions=k), backend.asarray(slopes, dtype=dtype), backend.asarray(np.array([[[0.5, 1.0, 3.0]]]))
    )
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
    table = backend.asarray(params, dtype="float32")
    vec = backend.call(lambda t: pe.relative_bias_vector(kind, t, q_len, k_len, offset=offset, **options), table)
    assert tuple(vec.shape) == (3, q_len + k_len - 1)
    expected = _naive_bias(kind, params.astype(np.float32).astype(np.float64), rel_matrix(q_len, k_len, offset), options)
    assert_close(backend.call(lambda v: pe.expand_bias(v, q_len, k_len), vec), expected, backend=backend, dtype="float32")
    bias = backend.call(lambda t: pe.relative_bias(kind, t, q_len, k_len, offset=offset, **options), table)
    assert_close(bias, expected, backend=backend, dtype="float32")


def test_relative_bias_vector_entries_are_distances():
    vec = pe.relative_bias_vector("alibi", np.array([-1.0]), 3, 4, offset=2)
    np.testing.assert_array_equal(vec[0], 2 + np.arange(6) - 3)  # rel = offset + t - (k_len - 1)


def test_relative_bias_empty_lengths():
    assert pe.t5_bias(np.ones((32, 2)), 0, 5).shape == (2, 0, 5)
    assert pe.alibi_bias(np.ones(2), 4, 0).shape == (2, 4, 0)
    assert pe.relative_bias_vector("alibi", np.ones(2), 0, 3).shape == (2, 0)


def test_bias_plugs_into_attention(rng):
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    bias = pe.alibi_bias(pe.alibi_slopes(2, dtype=np.float64), 5, 5)
    out = pe.attention(q, k, v, bias=bias, causal=True)
    logits = q @ k.transpose(0, 2, 1) / 2.0 + bias + np.where(rel_matrix(5, 5) >= 0, 0.0, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (w / w.sum(-1, keepdims=True)) @ v, atol=1e-12)
    assert math.isfinite(float(out.sum()))


# --- the docs' T5 bucket statements, read from the page and checked against t5_bucket ----------


def _docs_t5_section():
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "relative.md").read_text()
    return text[text.index("## The T5 bucket map") :].split("\n## ", 1)[0]


def _cell_range(cell):
    """A table cell as the distances it names: ``a..b``, ``>= a`` (a thousand beyond) or ``a``."""
    cell = cell.strip()
    if cell.startswith(">="):
        start = int(cell[2:])
        return list(range(start, start + 1000))
    if ".." in cell:
        a, b = (int(x) for x in cell.split(".."))
        return list(range(a, b + 1)) if a <= b else list(range(a, b - 1, -1))
    return [int(cell)]


def test_docs_future_bucket_range_is_what_t5_bucket_gives():
    import re

    section = _docs_t5_section()
    stated = re.search(r"keys after the\s+query \(`rel < 0`\) use buckets (\d+)\.\.(\d+)", section)
    assert stated, "the T5 section no longer states the future buckets' range"
    future = pe.t5_bucket(-np.arange(1, 100_000))
    assert (int(future.min()), int(future.max())) == (int(stated[1]), int(stated[2]))


def test_docs_t5_table_is_what_t5_bucket_gives():
    rows = [line for line in _docs_t5_section().splitlines() if line.startswith("| `rel`") or line.startswith("| bucket")]
    rel_cells, bucket_cells = (row.strip("|").split("|")[1:] for row in rows)
    checked = 0
    for rel_cell, bucket_cell in zip(rel_cells, bucket_cells):
        if rel_cell.strip() == "...":
            continue
        rel, buckets = _cell_range(rel_cell), _cell_range(bucket_cell)
        want = buckets if len(buckets) == len(rel) else buckets * len(rel)
        assert pe.t5_bucket(np.array(rel)).tolist() == want, (rel_cell, bucket_cell)
        checked += 1
    assert checked >= 9


def test_relative_positions_reach_the_int64_edges_exactly():
    """Offsets whose relative positions just fit in int64 are computed, without wrapping."""
    low = pe.relative_positions(1, 8, offset=-(2**63) + 7)
    assert low.dtype == np.int64 and low.tolist() == [[-(2**63) + 7 - j for j in range(8)]]
    high = pe.relative_positions(3, 1, offset=2**63 - 3)
    assert high.tolist() == [[2**63 - 3 + i] for i in range(3)]


@pytest.mark.parametrize(
    "build",
    [
        lambda o, xp: pe.relative_positions(4, 6, offset=o, xp=xp),
        lambda o, xp: pe.sandwich_bias(4, 6, 8, heads=2, offset=o, xp=xp),
        lambda o, xp: pe.sandwich_vector(4, 6, 8, heads=2, offset=o, xp=xp),
        lambda o, xp: pe.fire_distances(4, 6, offset=o, xp=xp),
    ],
    ids=["relative_positions", "sandwich_bias", "sandwich_vector", "fire_distances"],
)
def test_an_array_offset_sets_the_namespace_of_what_is_built_from_lengths(backend, build):
    """Without ``xp=``, a 0-d ``offset`` array (traced under ``jax.jit`` too) gives the result
    its namespace and device, as positions do, and the values of the same call with an int
    offset and ``xp=`` that namespace: a torch offset had given a NumPy result and a traced
    one failed inside NumPy."""
    offset = backend.asarray(np.array([3]))[0]
    want = backend.to_numpy(build(3, backend.xp))
    assert_close(backend.call(lambda o: build(o, None), offset), want, backend=backend, dtype=str(want.dtype), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "build",
    [
        lambda o: pe.relative_bias_vector("t5", np.linspace(-1.0, 1.0, 64).reshape(32, 2), 4, 6, offset=o),
        lambda o: pe.relative_bias("t5", np.linspace(-1.0, 1.0, 64).reshape(32, 2), 4, 6, offset=o),
        lambda o: pe.cope_positions(np.linspace(-1.0, 1.0, 24).reshape(2, 3, 4), np.linspace(1.0, -1.0, 40).reshape(2, 5, 4), offset=o),
        lambda o: pe.cope_logits(np.linspace(-1.0, 1.0, 24).reshape(2, 3, 4), np.linspace(1.0, -1.0, 40).reshape(2, 5, 4), np.ones((3, 4)), offset=o),
    ],
    ids=["relative_bias_vector", "relative_bias", "cope_positions", "cope_logits"],
)
def test_an_array_offset_beside_numpy_arrays_sets_the_namespace(backend, build):
    """A 0-d ``offset`` of another library (traced under ``jax.jit``, lazy on Dask) makes
    the NumPy arrays beside it host constants: the result is of its namespace and holds the
    int offset's values. ``relative_bias_vector`` and ``cope_positions`` had returned NumPy,
    computing a Dask offset on the spot (``relative_bias`` and ``cope_logits`` did not)."""
    offset = backend.asarray(np.array([3]))[0]
    want = build(3)
    got = backend.call(build, offset)
    assert_close(got, want, backend=backend, dtype=str(backend.to_numpy(got).dtype), rtol=1e-6, atol=1e-7)
