"""One convention across the relative family (issue 22).

Query alignment: with ``offset`` left out, the queries are the last ``q_len`` positions of
the keys, so a one-query call (a decode step) and a chunk of queries (a chunked prefill)
equal the last rows of the full call, exactly. Inputs are small integers (and one-hot
queries where a table is not), so every sum is exact and any difference is a misalignment,
not rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close

H, N, D = 2, 7, 4
RNG = np.random.default_rng(22)


def _ints(*shape):
    return RNG.integers(-3, 4, shape).astype(np.float64)


def _one_hot(*shape):
    return np.eye(shape[-1])[RNG.integers(0, shape[-1], shape[:-1])]


Q, K, V = _ints(H, N, D), _ints(H, N, D), _ints(H, N, D)
ONE_HOT = _one_hot(H, N, D)
WEIGHTS = _ints(H, N, N)
POS = pe.positions_from_cu_seqlens(np.array([0, 3, N]), N)  # two packed documents


# Each case: f(m) -> the result for the last m queries of N, offset left out; axis -2 is the query axis.
CASES = {
    "relative_positions": lambda m: pe.relative_positions(m, N),
    "relative_bias_vector t5 (expanded)": lambda m: pe.expand_bias(pe.relative_bias_vector("t5", _ints(32, H), m, N), m, N),
    "relative_bias t5": lambda m: pe.relative_bias("t5", np.arange(64.0).reshape(32, H), m, N),
    "relative_bias alibi": lambda m: pe.relative_bias("alibi", np.array([1.0, 0.5]), m, N),
    "relative_bias shaw": lambda m: pe.relative_bias("shaw", np.arange(10.0).reshape(5, H), m, N, max_distance=2),
    "relative_bias deberta": lambda m: pe.relative_bias("deberta", np.arange(8.0).reshape(4, H), m, N, max_distance=2),
    "t5_bias": lambda m: pe.t5_bias(np.arange(64.0).reshape(32, H), m, N),
    "t5_bias decoder": lambda m: pe.t5_bias(np.arange(32.0).reshape(16, H), m, N, bidirectional=False, max_distance=20),
    "alibi_bias": lambda m: pe.alibi_bias(pe.alibi_slopes(H, dtype=np.float64), m, N),
    "alibi_bias symmetric": lambda m: pe.alibi_bias(pe.alibi_slopes(H, dtype=np.float64), m, N, symmetric=True),
    "t5_bias per-token keys": lambda m: pe.t5_bias(np.arange(64.0).reshape(32, H), m, N, key_positions=POS),
    "shaw_logits": lambda m: pe.shaw_logits(Q[:, N - m :], K, _ints(5, D), max_distance=2),
    "shaw_output": lambda m: pe.shaw_output(WEIGHTS[:, N - m :], V, _ints(5, D), max_distance=2),
    "deberta_logits": lambda m: pe.deberta_logits(Q[:, N - m :], K, _ints(H, 6, D), _ints(H, 6, D), max_distance=3),
    "deberta_logits bucketed": lambda m: pe.deberta_logits(
        Q[:, N - m :], K, _ints(H, 8, D), _ints(H, 8, D), max_distance=4, bucket_size=4, max_position=12
    ),
    "tener_logits": lambda m: pe.tener_logits(ONE_HOT[:, N - m :], K, _ints(H, 1, D), np.zeros((H, 1, D))),
    "xl_logits": lambda m: pe.xl_logits(Q[:, N - m :], K, _ints(H, N + N, D), _ints(H, 1, D), _ints(H, 1, D)),
}


def _fixed(case):
    """The case with its random inputs drawn once, so both calls see the same arrays."""
    state = RNG.bit_generator.state

    def call(m):
        RNG.bit_generator.state = state
        return case(m)

    return call


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_last_queries_equal_the_last_rows_of_the_full_call(name, chunk):
    call = _fixed(CASES[name])
    full, part = np.asarray(call(N)), np.asarray(call(chunk))
    assert part.shape[-2] == chunk
    np.testing.assert_array_equal(part, full[..., N - chunk :, :])


@pytest.mark.parametrize("chunk", [1, 3])
def test_attention_with_a_bias_decodes_as_it_prefills(chunk):
    """The causal mask and the bias share the alignment: no offset anywhere. (The softmax's
    products are not exact: within rounding; a misaligned row would be off by far more.)"""
    table = RNG.standard_normal((32, H))

    def call(m):
        return pe.attention(Q[:, N - m :], K, V, bias=pe.t5_bias(table, m, N, bidirectional=False, max_distance=20), causal=True)

    np.testing.assert_allclose(call(chunk), call(N)[:, N - chunk :], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind, params, options", [
    ("t5", np.arange(64.0).reshape(32, H), {}),
    ("alibi", np.array([1.0, 0.5]), {}),
    ("shaw", np.arange(10.0).reshape(5, H), {"max_distance": 2}),
    ("deberta", np.arange(8.0).reshape(4, H), {"max_distance": 2}),
])  # fmt: skip
def test_score_mod_one_query_is_the_last_row(kind, params, options):
    torch = pytest.importorskip("torch")
    from posenc.torch import score_mod

    def grid(q_len):
        mod = score_mod(kind, torch.from_numpy(params), q_len, N, **options)
        zero = torch.tensor(0.0, dtype=torch.float64)
        return np.array(
            [[[float(mod(zero, 0, h, torch.tensor(i), torch.tensor(j))) for j in range(N)] for i in range(q_len)] for h in range(H)]
        )

    np.testing.assert_array_equal(grid(1), grid(N)[:, -1:])
    np.testing.assert_array_equal(grid(N), pe.relative_bias(kind, params, N, N, **options))


def test_per_token_decode_step_is_the_last_row():
    table = np.arange(64.0).reshape(32, H)
    full = pe.t5_bias(table, N, N, query_positions=POS, key_positions=POS)
    step = pe.t5_bias(table, 1, N, query_positions=POS[-1:], key_positions=POS)
    np.testing.assert_array_equal(step, full[..., -1:, :])


def test_explicit_offsets_still_count_from_the_given_position():
    table = np.arange(64.0).reshape(32, H)
    # offset=0: the queries are the first q_len keys (the alignment before the change).
    np.testing.assert_array_equal(pe.t5_bias(table, 2, N, offset=0), pe.t5_bias(table, N, N)[:, :2])
    np.testing.assert_array_equal(pe.t5_bias(table, 2, N, offset=np.asarray(3)), pe.t5_bias(table, N, N)[:, 3:5])


# --- pe.attention: mask=, and rows with no key to attend to -----------------------------------


def _naive_attention(q, k, v, allowed, bias=0.0):
    """Softmax over the allowed keys only, written out; a row with none gives zeros."""
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for index in np.ndindex(*logits.shape[:-1]):
        keep = np.broadcast_to(allowed, logits.shape)[index] & np.isfinite(logits[index])
        if keep.any():
            w = np.exp(logits[index][keep] - logits[index][keep].max())
            out[index] = (w / w.sum()) @ v[index[:-1]][keep]
    return out


def test_attention_mask_true_attends(backend):
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    mask = RNG.random((2, 3, 5)) < 0.6
    mask[:, :, 0] = True
    got = backend.call(lambda *a: pe.attention(*a[:3], mask=a[3]), *(backend.asarray(x) for x in (q, k, v, mask)))
    assert_close(got, _naive_attention(q, k, v, mask), backend=backend, dtype=backend.asarray(q).dtype)


def test_attention_mask_and_causal_combine():
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    padding = np.array([False, True, True, True, True])  # key 0 is padding
    causal = pe.relative_positions(3, 5) >= 0
    got = pe.attention(q, k, v, mask=padding, causal=True)
    np.testing.assert_allclose(got, _naive_attention(q, k, v, padding & causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how", ["mask", "-inf bias"])
def test_attention_fully_masked_row_gives_zeros_not_nan(backend, how):
    """A left-padding query may attend to nothing: its output is zeros (documented), the
    other rows are unchanged."""
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    allowed = np.ones((3, 5), dtype=bool)
    allowed[0] = False
    if how == "mask":
        call, extra = (lambda *a: pe.attention(*a[:3], mask=a[3])), allowed
    else:
        call, extra = (lambda *a: pe.attention(*a[:3], bias=a[3])), np.where(allowed, 0.0, -np.inf)
    result = backend.call(call, *(backend.asarray(x) for x in (q, k, v, extra)))
    got = backend.to_numpy(result)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got[:, 0], 0.0)
    assert_close(result, _naive_attention(q, k, v, allowed), backend=backend, dtype=backend.asarray(q).dtype)


def test_attention_fully_masked_row_has_finite_gradients():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.zeros(3, 3, dtype=torch.float64)
    bias[0] = -torch.inf
    pe.attention(q, k, v, bias=bias).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_mask_bad_input():
    q = np.zeros((2, 3, 4))
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        pe.attention(q, q, q, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"mask of shape \(4,\) does not broadcast"):
        pe.attention(q, q, q, mask=np.ones(4, dtype=bool))
