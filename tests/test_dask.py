"""What only Dask has: the block kernels, blocked biases, chunks and schedulers.

Every public function stays lazy on chunked arrays in the ordinary tests, through the
``backend`` fixture (``Backend.call`` in tests/arrays.py counts what Dask computes).
``rope_rotate`` and ``toeplitz_expand`` have ``dask_blocks`` kernels: a graph whose tasks
call the kernel registry on each NumPy block (so Numba runs per block). Results are
compared with the NumPy path and with float64 transcriptions of the formulas; ``lazily``
checks that building each graph computes nothing.
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import posenc as pe
from arrays import lazily
from formulas import exact_rope, rel_matrix
from posenc import _dispatch

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")


def test_registry_sends_dask_arrays_to_the_block_kernels():
    x, pos, vec = da.ones((4, 8), chunks=2), da.arange(4, chunks=2), da.ones((2, 7), chunks=3)
    inv_freq = pe.rope_frequencies(8)[0]
    assert _dispatch.select("rope_rotate", x, pos, inv_freq).__name__ == "rope_rotate_blocks"
    assert _dispatch.select("toeplitz_expand", vec, 3, 5).__name__ == "toeplitz_expand_blocks"
    assert _dispatch.select("rope_rotate", np.ones((4, 8)), np.arange(4), inv_freq).__name__ != "rope_rotate_blocks"
    with pe.use_backend("reference"):
        assert _dispatch.select("toeplitz_expand", vec, 3, 5) is _dispatch.references()["toeplitz_expand"]


def test_rope_runs_the_registry_once_per_numpy_block(rng, monkeypatch):
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    pos = rng.integers(0, 2**20, 1000)
    lazy = lazily(pe.rope, da.from_array(x, chunks=(128, 64)), da.from_array(pos, chunks=128))
    assert lazy.chunks == ((128,) * 7 + (104,), (64,))
    seen = []
    call = _dispatch.call

    def spy(op, *args, **kwargs):
        seen.append((op, type(args[0]), args[0].shape))
        return call(op, *args, **kwargs)

    monkeypatch.setattr(_dispatch, "call", spy)
    got = lazy.compute(scheduler="threads")
    assert sorted(seen, key=lambda s: s[2]) == [("rope_rotate", np.ndarray, (104, 64))] + [("rope_rotate", np.ndarray, (128, 64))] * 7
    np.testing.assert_allclose(got, exact_rope(x, pos), atol=3e-6)


def test_rope_on_batched_chunks_with_default_positions(rng):
    x = rng.standard_normal((2, 3, 10, 16))
    chunked = da.from_array(x, chunks=(1, 2, 4, 8))  # the feature axis split too
    got = lazily(lambda a: pe.rope(a, offset=5, layout="interleaved"), chunked)
    assert got.chunks[:-1] == chunked.chunks[:-1] and got.numblocks[-1] == 1
    np.testing.assert_allclose(got.compute(), pe.rope(x, offset=5, layout="interleaved"), atol=1e-12)
    half = lazily(lambda a: pe.rope(a, offset=5), chunked)
    np.testing.assert_allclose(half.compute(), exact_rope(x, np.arange(5, 15)), atol=1e-12)


def test_rope_positions_are_rechunked_like_x(rng):
    x = rng.standard_normal((3, 12, 8))
    pos = rng.integers(-100, 100, (3, 12))
    got = lazily(pe.rope, da.from_array(x, chunks=(2, 5, 8)), da.from_array(pos, chunks=(3, 4)))
    assert got.chunks == ((2, 1), (5, 5, 2), (8,))
    np.testing.assert_allclose(got.compute(), exact_rope(x, pos), atol=1e-12)


def test_rope_out_and_inverse_on_dask(rng):
    x_np = rng.standard_normal((6, 8))
    x = da.from_array(x_np, chunks=(4, 8))
    pos = da.arange(100, 106, chunks=4)
    for backend in ("auto", "reference"):
        with pe.use_backend(backend):
            buffer = da.zeros_like(x)
            returned = lazily(lambda: pe.rope(x, pos, out=buffer))
            assert returned is buffer
            np.testing.assert_allclose(buffer.compute(), exact_rope(x_np, np.arange(100, 106)), atol=1e-12)
            back = pe.rope(buffer, pos, inverse=True)
            np.testing.assert_allclose(back.compute(), x_np, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_lazy_length_gives_the_numpy_bits(rng, dtype):
    """``DynamicNTK``/``LongRoPE`` at a lazy length (a lazy offset, the largest of lazy
    positions, per-row lengths): each block reads it when it runs and rotates at the eager
    call's frequencies. float64 used to differ in 5-14 % of the elements (the frequencies
    and cos/sin tables computed in the graph)."""
    x = rng.standard_normal((3, 4, 32, 16)).astype(dtype)
    dx = da.from_array(x, chunks=(2, 2, 8, 16))
    positions = rng.integers(0, 5000, (3, 1, 32))
    lengths = np.array([10, 5000, 300])
    for scaling in (pe.scaling.DynamicNTK(2.0, 16), pe.scaling.LongRoPE([1.0] * 8, np.linspace(1, 4, 8).tolist(), 16, factor=4.0)):
        calls = (
            (lambda a, offset: pe.rope(a, offset=offset, scaling=scaling), np.asarray(1000), lambda v: da.from_array(v)),
            (lambda a, p: pe.rope(a, p, scaling=scaling), positions, lambda v: da.from_array(v, chunks=(1, 1, 8))),
            (lambda a, n: pe.rope(a, scaling=scaling, seq_len=n, seq_axis="bhsd"), lengths, lambda v: da.from_array(v, chunks=2)),
        )
        for fn, value, lazy in calls:
            got = lazily(lambda: fn(dx, lazy(value)))
            np.testing.assert_array_equal(got.compute(), fn(x, value))


def test_a_lazy_length_with_empty_chunks(rng):
    """Chunks of length 0 (as ``compute_chunk_sizes`` leaves after boolean indexing) in
    lazy positions or per-row lengths: ``DynamicNTK``/``LongRoPE`` give the NumPy bits (the
    length's ``max`` raised inside Dask, and so did a block of ``x`` with no row)."""
    x = rng.standard_normal((3, 2, 8, 8)).astype(np.float32)
    rows = da.from_array(rng.integers(0, 500, (6, 8)), chunks=2)[da.from_array(np.array([1, 0, 0, 0, 1, 1], bool), chunks=2)]
    positions = rows.compute_chunk_sizes()
    assert positions.chunks[0] == (1, 0, 2)
    lengths = np.array([[[3], [40]], [[9], [500]], [[1], [70]]])
    for scaling in (pe.scaling.DynamicNTK(2.0, 16), pe.scaling.LongRoPE([1.0] * 4, [2.0, 3.0, 4.0, 5.0], 16, factor=4.0)):
        got = lazily(lambda a, p: pe.rope(a, p, scaling=scaling), da.from_array(x, chunks=(1, 1, 4, 8)), positions)
        np.testing.assert_array_equal(got.compute(), pe.rope(x, positions.compute(), scaling=scaling))
        chunked = da.from_array(x, chunks=((1, 0, 2), (1, 0, 1), (8,), (8,)))
        got = lazily(lambda a, n: pe.rope(a, scaling=scaling, seq_len=n), chunked, da.from_array(lengths, chunks=((1, 0, 2), (1, 0, 1), (1,))))
        np.testing.assert_array_equal(got.compute(), pe.rope(x, scaling=scaling, seq_len=lengths))


def test_arrays_of_unknown_chunk_sizes_are_refused_by_name(rng):
    """A Dask array of unknown chunk sizes (NaN in its shape, as boolean indexing leaves it)
    gets a ValueError naming it and ``compute_chunk_sizes``, not a failure from inside
    (``int()`` of NaN, shapes that do not match)."""
    x = da.from_array(rng.standard_normal((4, 2, 8, 8)), chunks=(2, 2, 4, 8))
    picked = x[da.from_array(np.array([True, False, True, True]), chunks=2)]
    assert np.isnan(picked.shape[0])
    calls = {
        "x": lambda: pe.rope(picked),
        "mask": lambda: pe.positions_from_mask(picked[..., 0] > 0),
        "rel": lambda: pe.t5_bucket(da.arange(10)[da.arange(10) > 3]),
        "q": lambda: pe.shaw_logits(picked, x, np.ones((7, 8)), max_distance=3),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"{name} has chunks of unknown size .*compute_chunk_sizes"):
            call()
    np.testing.assert_array_equal(pe.rope(picked.compute_chunk_sizes()).compute(), pe.rope(picked.compute()))


def test_reductions_over_empty_chunks(rng):
    """``attention``, causal ``linear_attention`` and ``positions_from_mask`` of Dask arrays
    with a chunk of length 0 along the axis they reduce give NumPy's values (Dask's ``max``
    and ``cumsum`` raised inside Dask)."""
    q, k, v = (rng.standard_normal((2, 3, 7, 8)) for _ in range(3))
    mask = (rng.random((2, 7)) > 0.3).astype(np.int64)
    tokens = (3, 0, 4)
    calls = {
        "attention": lambda q, k, v: pe.attention(q, k, v, causal=True),
        "linear_attention": lambda q, k, v: pe.linear_attention(q, k, v, positions=np.arange(7), causal=True),
    }
    for name, call in calls.items():
        got = lazily(call, *(da.from_array(a, chunks=(1, 3, tokens, 8)) for a in (q, k, v)))
        np.testing.assert_allclose(got.compute(), call(q, k, v), rtol=1e-12, atol=1e-12, err_msg=name)
    got = lazily(pe.positions_from_mask, da.from_array(mask, chunks=(1, tokens)))
    np.testing.assert_array_equal(got.compute(), pe.positions_from_mask(mask))


def test_rerotate_and_axial_rope_use_the_block_kernel(rng):
    x = rng.standard_normal((6, 8))
    chunked = da.from_array(x, chunks=(4, 8))
    inv_freq = pe.rope_frequencies(8)[0]
    np.testing.assert_allclose(pe.rerotate(chunked, 7, inv_freq).compute(), exact_rope(x, np.full(6, 7)), atol=1e-12)
    grid = np.stack([np.arange(6) // 3, np.arange(6) % 3], axis=-1)
    got = pe.axial_rope(chunked, da.from_array(grid, chunks=(4, 2)))
    np.testing.assert_allclose(got.compute(), pe.axial_rope(x, grid), atol=1e-12)


# --- blocked biases -------------------------------------------------------------------------


def _block_bounds(chunks):
    edges = np.cumsum((0, *chunks))
    return list(zip(edges[:-1], edges[1:]))


def test_t5_bias_blocks_are_toeplitz_slices(rng):
    table = rng.standard_normal((32, 4)).astype(np.float32)
    q_len, k_len, offset = 37, 53, 11
    bias = lazily(lambda t: pe.t5_bias(t, q_len, k_len, offset=offset, chunks=(2, 10, 16)), da.from_array(table, chunks=(32, 2)))
    assert bias.chunks == ((2, 2), (10, 10, 10, 7), (16, 16, 16, 5))
    np.testing.assert_array_equal(bias.compute(), pe.t5_bias(table, q_len, k_len, offset=offset))
    # Each block is the bias of its own rows and columns: relative offset i0 - j0.
    for bi, (i0, i1) in enumerate(_block_bounds(bias.chunks[1])):
        for bj, (j0, j1) in enumerate(_block_bounds(bias.chunks[2])):
            block = bias.blocks[0, bi, bj].compute()
            np.testing.assert_array_equal(block, pe.t5_bias(table[:, :2], i1 - i0, j1 - j0, offset=offset + i0 - j0))


def test_cope_logits_graph_does_not_grow_with_the_table(rng):
    """cope_logits gathers each block of positions from its rows of ``q @ pos_emb.T``, whole
    along the table: as many tasks for 1,025 table rows as for 5, NumPy's bits. Its hat
    weights had added one term per table row, a graph of every block times every row (a
    minute to build for 4,097 rows)."""
    q, k = rng.standard_normal((2, 2, 32, 8)), rng.standard_normal((2, 2, 32, 8))
    tasks = []
    for npos in (5, 1025):
        e = rng.standard_normal((2, npos, 8))
        logits = lazily(lambda a, b, c: pe.cope_logits(a, b, c, scale=2.0), da.from_array(q, chunks=(1, 2, 8, 8)), da.from_array(k), da.from_array(e))
        tasks.append(len(logits.__dask_graph__()))
        np.testing.assert_array_equal(logits.compute(), pe.cope_logits(q, k, e, scale=2.0))
    assert tasks[0] == tasks[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cope_with_keys_in_several_chunks_gives_numpys_bits(rng, dtype):
    """CoPE's positions sum the gates over the keys in one order, whatever the keys' chunks:
    Dask's cumulative sum across chunks (each chunk's sums plus the totals before it) was
    9e-5 off NumPy's float32 positions at 256 keys in chunks of 64, and cope_logits 2e-3."""
    q, k = (rng.standard_normal((1, 2, 256, 16)).astype(dtype) for _ in range(2))
    e = rng.standard_normal((257, 16)).astype(dtype)
    chunked = [da.from_array(a, chunks=(1, 2, 64, 16)) for a in (q, k)]
    positions = lazily(pe.cope_positions, *chunked)
    assert positions.chunks[-1] == (256,)
    np.testing.assert_array_equal(positions.compute(), pe.cope_positions(q, k))
    np.testing.assert_array_equal(lazily(pe.cope_logits, *chunked, da.from_array(e)).compute(), pe.cope_logits(q, k, e))


def test_blocked_bias_runs_the_registry_once_per_numpy_block(rng, monkeypatch):
    table = da.from_array(rng.standard_normal((32, 3)).astype(np.float32), chunks=(32, 2))
    bias = lazily(lambda: pe.t5_bias(table, 20, 30, chunks=(2, 8, 16)))
    seen = []
    call = _dispatch.call

    def spy(op, *args, **kwargs):
        if op == "toeplitz_expand":
            seen.append((type(args[0]), args[0].shape, args[1:]))
        return call(op, *args, **kwargs)

    monkeypatch.setattr(_dispatch, "call", spy)
    bias.compute(scheduler="threads")
    # One NumPy slice of qb + kb - 1 distances per [heads, qb, kb] block.
    want = [(np.ndarray, (h, qb + kb - 1), (qb, kb)) for h in (2, 1) for qb in (8, 8, 4) for kb in (16, 14)]
    assert sorted(seen, key=repr) == sorted(want, key=repr)


def test_blocked_bias_default_chunks_follow_the_table_and_dask_config(rng):
    table = da.from_array(rng.standard_normal((32, 6)), chunks=(32, 4))
    with dask.config.set({"array.chunk-size": "4KiB"}):
        bias = lazily(lambda: pe.t5_bias(table, 40, 30, bidirectional=False))
    assert bias.chunks[0] == (4, 2)
    assert bias.numblocks[1] > 1 and bias.numblocks[2] > 1
    assert max(bias.chunks[0]) * max(bias.chunks[1]) * max(bias.chunks[2]) * 8 <= 4096
    np.testing.assert_array_equal(bias.compute(), pe.t5_bias(table.compute(), 40, 30, bidirectional=False))


def test_huge_blocked_bias_builds_lazily_and_computes_one_block(rng):
    table = rng.standard_normal((32, 2)).astype(np.float32)
    n = 1_000_000  # 8 TB as one float32 array
    bias = lazily(lambda: pe.t5_bias(da.from_array(table), n, n, chunks=(2, 1024, 1024)))
    assert bias.shape == (2, n, n) and bias.numblocks == (1, 977, 977)
    block = bias.blocks[0, 100, 3].compute()
    np.testing.assert_array_equal(block, pe.t5_bias(table, 1024, 1024, offset=(100 - 3) * 1024))


def test_a_blocked_bias_whose_per_distance_vector_cannot_fit_is_refused(rng):
    """Every block of a blocked bias reads the per-distance vector ``[heads, q_len + k_len - 1]``,
    one chunk, whole: one that cannot fit in memory is a ``ValueError`` before the graph is
    built (a key length of 2**62 had raised MemoryError inside Dask's ``arange``, and 2**40
    built a graph of 3 million tasks that no block of could compute)."""
    table, slopes = da.from_array(rng.standard_normal((32, 3)).astype(np.float32)), da.from_array(np.array([0.5, 0.25, 0.125]))
    for k_len in (2**40, 2**62):
        for call in (lambda: pe.t5_bias(table, 4, k_len), lambda: pe.alibi_bias(slopes, k_len, 4), lambda: pe.relative_bias("shaw", table[:9], 4, k_len, max_distance=4)):
            with pytest.raises(ValueError, match="per-distance vector"):
                lazily(call)
        # The vector itself, and one given to expand_bias (2**62 had raised MemoryError inside Dask).
        vec = da.ones((3, 4 + k_len - 1), chunks=2**60)
        refused = (
            (lambda: pe.relative_bias_vector("alibi", slopes, 4, k_len), "relative_bias_vector"),
            (lambda: pe.expand_bias(vec, 4, k_len), "per-distance vector of the blocked bias"),
        )
        for call, name in refused:
            with pytest.raises(ValueError, match=f"{name} of shape .* more than the memory"):
                lazily(call)


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_bias_blocked(symmetric):
    slopes = pe.alibi_slopes(6)
    rel = rel_matrix(9, 14, offset=3)
    want = -slopes.astype(np.float64)[:, None, None] * (np.abs(rel) if symmetric else rel)
    bias = lazily(
        lambda s: pe.alibi_bias(s, 9, 14, offset=3, symmetric=symmetric, chunks=(4, 4, 5)), da.from_array(slopes, chunks=3)
    )
    assert bias.chunks == ((4, 2), (4, 4, 1), (5, 5, 4))
    np.testing.assert_allclose(bias.compute(), want, rtol=1e-7)


def test_expand_bias_blocked_with_leading_axes_and_out(rng):
    vec = rng.standard_normal((2, 3, 6 + 9 - 1))
    want = pe.expand_bias(vec, 6, 9)
    for chunks in ((1, 3, 2, 4), {-1: 4}, "auto"):
        got = lazily(lambda v: pe.expand_bias(v, 6, 9, chunks=chunks), da.from_array(vec, chunks=(1, 2, 5)))
        np.testing.assert_array_equal(got.compute(), want)
    out = da.zeros((2, 3, 6, 9), chunks=(2, 1, 5, 5))
    assert pe.expand_bias(da.from_array(vec), 6, 9, out=out) is out
    assert out.chunks == ((2,), (1, 1, 1), (5, 1), (5, 4))
    np.testing.assert_array_equal(out.compute(), want)


def test_empty_blocked_bias(rng):
    table = da.from_array(rng.standard_normal((32, 2)))
    for q_len, k_len in ((0, 5), (4, 0)):
        bias = pe.t5_bias(table, q_len, k_len, chunks=(1, 2, 2))
        assert bias.shape == (2, q_len, k_len) and bias.compute().shape == (2, q_len, k_len)
    # Empty chunks among full ones.
    bias = pe.t5_bias(table, 3, 4, chunks=(2, (0, 3), (4, 0)))
    np.testing.assert_array_equal(bias.compute(), pe.t5_bias(table.compute(), 3, 4))


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_empty_lengths_give_empty_biases(rng, backend):
    """``q_len`` or ``k_len`` 0 with Dask tables: the empty bias NumPy gives (the reference's
    reshape of an empty Dask array raised inside Dask)."""
    tables = {"alibi": np.array([0.5, 0.25]), "t5": rng.standard_normal((32, 2)), "shaw": rng.standard_normal((9, 2)), "deberta": rng.standard_normal((8, 2))}
    options = {"shaw": {"max_distance": 4}, "deberta": {"max_distance": 4}}
    with pe.use_backend(backend):
        for kind, table in tables.items():
            for q_len, k_len in ((0, 2), (3, 0), (0, 0)):
                got = pe.relative_bias(kind, da.from_array(table, chunks=1), q_len, k_len, **options.get(kind, {}))
                assert got.shape == (2, q_len, k_len) and got.compute().shape == (2, q_len, k_len), (kind, q_len, k_len)


@pytest.mark.parametrize("q_len, k_len", [(0, 5), (5, 0), (0, 0)])
def test_empty_query_or_key_logits_are_numpys(rng, q_len, k_len):
    """Logits and attention of Dask queries or keys of length 0, chunked along every axis,
    give NumPy's empty arrays (attention's row maximum and the toeplitz gather of Shaw's,
    DeBERTa's, TENER's and Transformer-XL's position terms had raised inside Dask)."""
    heads, d = 2, 8
    q, k = rng.standard_normal((1, heads, q_len, d)), rng.standard_normal((1, heads, k_len, d))
    u, v = rng.standard_normal((heads, 1, d)), rng.standard_normal((heads, 1, d))
    table, pos = rng.standard_normal((9, d)), rng.standard_normal((1, heads, 8, d))
    calls = {
        "attention": lambda q, k, *_: pe.attention(q, k, k),
        "shaw": lambda q, k, table, *_: pe.shaw_logits(q, k, table, max_distance=4),
        "deberta": lambda q, k, _, pos, *__: pe.deberta_logits(q, k, pos, pos, max_distance=4),
        "tener": lambda q, k, _, __, u, v: pe.tener_logits(q, k, u, v),
        "xl": lambda q, k, _, __, u, v: pe.xl_logits(q, k, k[0] if q_len <= k_len else q[0], u, v),
    }
    arrays = (q, k, table, pos, u, v)
    for name, call in calls.items():
        if name == "xl" and q_len > k_len:
            continue  # (k_len >= q_len)
        expected = call(*arrays)
        got = lazily(call, *(da.from_array(a, chunks=2) for a in arrays))
        assert got.shape == expected.shape, name
        np.testing.assert_array_equal(got.compute(), expected, err_msg=name)


@pytest.mark.parametrize("q_len, k_len", [(0, 5), (5, 0), (0, 0)])
def test_empty_lengths_with_per_token_positions_or_row_offsets(rng, q_len, k_len):
    """The per-token path (positions, or one offset per batch row) and FIRE with a query or
    key length of 0 on Dask, chunked along every axis but the tables': NumPy's empty biases
    and logits (the reshapes of the empty distances and per-pair values and the gather of
    the empty scores had raised inside Dask: NotImplementedError, TypeError,
    ZeroDivisionError)."""
    heads, d = 2, 8
    q, k = rng.standard_normal((2, heads, q_len, d)), rng.standard_normal((2, heads, k_len, d))
    table, slopes, pos = rng.standard_normal((32, heads)), np.array([0.5, 0.25]), rng.standard_normal((16, d))
    rows, qpos, kpos = np.array([3, 100]), np.arange(q_len)[None] + np.array([[0], [7]]), np.arange(k_len)[None] + np.array([[2], [0]])

    def calls(q, k, table, slopes, pos, rows, qpos, kpos):
        lib = np if isinstance(q, np.ndarray) else da
        return {
            "t5 rows": pe.t5_bias(table, q_len, k_len, offset=rows),
            "t5 tokens": pe.t5_bias(table, q_len, k_len, query_positions=qpos, key_positions=kpos),
            "alibi tokens": pe.alibi_bias(slopes, q_len, k_len, query_positions=qpos, key_positions=kpos),
            "kerple rows": pe.kerple_bias(slopes, slopes, q_len, k_len, offset=rows),
            "fire": pe.fire_bias(lambda x: lib.concatenate([x, -x], axis=-1), q_len, k_len, xp=lib),
            "fire rows": pe.fire_bias(lambda x: lib.concatenate([x, -x], axis=-1), q_len, k_len, offset=rows),
            "shaw rows": pe.shaw_logits(q, k, pos[:9], max_distance=4, offset=rows),
            "shaw tokens": pe.shaw_logits(q, k, pos[:9], max_distance=4, query_positions=qpos),
            "deberta rows": pe.deberta_logits(q, k, pos, pos, max_distance=8, offset=rows),
            "deberta tokens": pe.deberta_logits(q, k, pos, pos, max_distance=8, key_positions=kpos),
        }

    arrays = (q, k, table, slopes, pos, rows, qpos, kpos)
    expected = calls(*arrays)
    lazy = (da.from_array(a, chunks=a.shape if a.ndim == 2 and a.dtype.kind == "f" else 1) for a in arrays)
    got = dict(zip(expected, lazily(lambda *a: tuple(calls(*a).values()), *lazy)))
    for name, want in expected.items():
        assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(got[name].compute(), want, err_msg=name)


def test_bfloat16_dask_arrays_and_an_empty_rel_shift(rng):
    """Dask arrays of ml_dtypes' bfloat16 give NumPy's bits (a table of them had been refused
    as not floating: Dask's isdtype says False for it), and ``rel_shift`` of an empty Dask
    array is empty (Dask's reshape had raised)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    table = rng.standard_normal((32, 2)).astype(ml_dtypes.bfloat16)
    got = pe.t5_bias(da.from_array(table, chunks=(8, 1)), 5, 7)
    assert np.array_equal(np.asarray(got.compute()).view(np.uint16), pe.t5_bias(table, 5, 7).view(np.uint16))
    x = rng.standard_normal((2, 3, 5, 8)).astype(ml_dtypes.bfloat16)
    got = pe.rope(da.from_array(x, chunks=(1, 3, 5, 8)), offset=3)
    assert np.array_equal(np.asarray(got.compute()).view(np.uint16), pe.rope(x, offset=3).view(np.uint16))
    for shape in ((0, 3), (2, 0), (4, 0, 3)):
        assert pe.rel_shift(da.zeros(shape)).compute().shape == shape


_TOP, _TABLE = 2**63 - 1, np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(32, 2)
_SECTIONS = [np.array([[1, 2], [3, 4], [5, 2**63]], np.uint64), np.array([[1, 2], [3, 4], [5, 2**60]], np.uint64)]
_WRAPPING = {  # name: (call of NumPy or Dask arrays, arrays whose integers leave int64, arrays where none do)
    "rope uint64 positions": (lambda x, p: pe.rope(x, p), [np.array([3, 2**63 + 5, 1, 2], np.uint64)], [np.array([3, 2**62, 1, 2], np.uint64)]),
    "rope offset + positions": (lambda x, p: pe.rope(x, p, offset=10), [np.array([0, _TOP - 3, 1, 2])], [np.array([0, _TOP - 10, 1, 2])]),
    "rope per-row offset": (lambda x, o: pe.rope(x.reshape(2, 2, 8), offset=o), [np.array([0, _TOP])], [np.array([0, _TOP - 1])]),
    "rope lazy 0-d offset": (lambda x, o: pe.rope(x, offset=o), [np.array(_TOP - 2)], [np.array(_TOP - 3)]),
    "rerotate uint64 delta": (lambda x, d: pe.rerotate(x, d, pe.rope_frequencies(8)[0]), [np.array([1, 2, 2**63, 3], np.uint64)], [np.array([1, 2, _TOP, 3], np.uint64)]),
    "sinusoidal uint64 positions": (lambda x, p: pe.sinusoidal(p, 8), [np.array([1, 2**64 - 1, 2, 3], np.uint64)], [np.array([1, _TOP, 2, 3], np.uint64)]),
    "rope_cos_sin uint64 positions": (lambda x, p: pe.rope_cos_sin(p, pe.rope_frequencies(8)[0]), [np.array([1, 2, 3, 2**63], np.uint64)], [np.array([1, 2, 3, 2**50], np.uint64)]),
    "mrope_cos_sin uint64 positions": (lambda x, p: pe.mrope_cos_sin(p, pe.rope_frequencies(8)[0], [2, 1, 1]), _SECTIONS[:1], _SECTIONS[1:]),
    "xdrope_cos_sin uint64 positions": (lambda x, p: pe.xdrope_cos_sin(p, pe.rope_frequencies(8)[0], [2, 1, 1]), _SECTIONS[:1], _SECTIONS[1:]),
    "t5_bias uint64 query positions": (lambda x, p: pe.t5_bias(_TABLE, 4, 4, query_positions=p), [np.array([2**63, 1, 2, 3], np.uint64)], [np.array([2**40, 1, 2, 3], np.uint64)]),
    "t5_bias query - key positions": (lambda x, p: pe.t5_bias(_TABLE, 4, 4, query_positions=p, key_positions=-p), [np.array([2**62, 1, 2, 3])], [np.array([2**61, 1, 2, 3])]),
    "t5_bias per-row offset": (lambda x, o: pe.t5_bias(_TABLE, 4, 4, offset=o), [np.array([0, _TOP - 2])], [np.array([0, _TOP - 3])]),
    "t5_bias lazy 0-d offset": (lambda x, o: pe.t5_bias(_TABLE, 4, 4, offset=o), [np.array(_TOP - 2)], [np.array(_TOP - 3)]),
    "shaw_output per-row offset": (lambda x, o: pe.shaw_output((x[:2, None, None, :4] > x[:4, :4]) * np.float32(1), np.round(x[2:, None, None, :4] * 4) + x[:4, 4:] * 0, np.round(x[:3, :4] * 4), max_distance=1, offset=o), [np.array([0, _TOP - 2])], [np.array([0, _TOP - 3])]),
    "alibi_bias uint64 per-row offset": (lambda x, o: pe.alibi_bias(pe.alibi_slopes(2), 4, 4, offset=o), [np.array([0, 2**63], np.uint64)], [np.array([0, 2**40], np.uint64)]),
    "alibi_bias query - key positions": (lambda x, p: pe.alibi_bias(pe.alibi_slopes(2), 4, 4, query_positions=p, key_positions=p[::-1] - _TOP), [np.array([0, 1, 2, 3])], [np.array([0, 0, 0, 0])]),
}


@pytest.mark.parametrize("name", _WRAPPING)
def test_integers_beyond_int64_raise_when_computed(rng, name):
    """Integer positions and offsets of Dask arrays that leave int64 (uint64 ones past its
    largest, ``offset + positions``, ``query - key``) raise the eager call's ``ValueError``
    when the result is computed (their values cannot be read before); building the graph
    computes nothing, and where nothing wraps the result is NumPy's. (They had wrapped in
    the graph, giving wrong numbers: a rotation at position 2**63 + 5 taken for -2**63 + 5.)"""
    call, wrapping, fine = _WRAPPING[name]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(ValueError) as eager:
        call(x, *wrapping)
    message = re.split(r": |, got", str(eager.value))[0]  # (the values it names are the block's)
    lazy = lazily(call, da.from_array(x, chunks=2), *(da.from_array(a, chunks=2) for a in wrapping))
    with pytest.raises(ValueError, match=re.escape(message)):
        dask.compute(lazy, scheduler="synchronous")
    got = lazily(call, da.from_array(x, chunks=2), *(da.from_array(a, chunks=2) for a in fine))
    want = call(x, *fine)
    for g, w in zip(*((r if isinstance(r, tuple) else (r,)) for r in (got, want)), strict=True):
        np.testing.assert_array_equal(g.compute(), w)


def test_apply_absolute_offsets_per_row_outside_the_table_raise_when_computed(rng):
    """One Dask offset per row whose rows leave the table (negative, or past its end) raises
    the eager call's ``ValueError`` when computed, as ``rope``'s offsets do; the rows had
    been taken anyway, without an error (a negative offset's from the table's end)."""
    x, table = rng.standard_normal((4, 1, 8)).astype(np.float32), _TABLE.reshape(8, 8)
    for offsets in (np.array([0, -1, 2, 3]), np.array([0, 1, 7, 8])):
        with pytest.raises(ValueError, match=r"offset must be >= 0 with offset \+ L <= 8 \(the table's rows\) in every row"):
            pe.apply_absolute(x, table, offset=offsets)
        lazy = lazily(lambda x, o: pe.apply_absolute(x, table, offset=o), da.from_array(x, chunks=2), da.from_array(offsets, chunks=2))
        with pytest.raises(ValueError, match=r"offset must be >= 0 with offset \+ L <= 8 \(the table's rows\) in every row"):
            dask.compute(lazy, scheduler="synchronous")
    fine = np.array([0, 1, 7, 6])
    got = pe.apply_absolute(da.from_array(x, chunks=2), table, offset=da.from_array(fine, chunks=2))
    np.testing.assert_array_equal(got.compute(), pe.apply_absolute(x, table, offset=fine))


def test_tupe_offsets_outside_p_raise_when_computed(rng):
    """A Dask offset (one per row, or a lazy 0-d one) whose query rows leave ``p`` (negative,
    or past its rows) raises the eager call's ``ValueError`` when computed; the rows had been
    taken anyway, without an error."""
    q, k = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 5, 4))
    p, u = rng.standard_normal((10, 6)), rng.standard_normal((2, 6, 4))
    call = lambda q, k, o: pe.tupe_logits(q, k, p, u, u, offset=o)  # noqa: E731
    for offsets in (np.array([-2, 0]), np.array([8, 0]), np.array(-1), np.array(8)):
        with pytest.raises(ValueError) as eager:
            call(q, k, offsets)
        lazy = lazily(call, da.from_array(q, chunks=1), da.from_array(k, chunks=1), da.from_array(offsets, chunks=1))
        said = re.escape(str(eager.value)) if offsets.ndim or offsets > 0 else r"offset must be >= 0, got -1"  # (eagerly: not a non-negative integer)
        with pytest.raises(ValueError, match=said):
            dask.compute(lazy, scheduler="synchronous")
    for fine in (np.array([2, 5]), np.array(3)):
        got = call(da.from_array(q, chunks=1), da.from_array(k, chunks=1), da.from_array(fine, chunks=1)).compute()
        np.testing.assert_allclose(got, call(q, k, fine), rtol=1e-14, atol=1e-14)  # (Dask's blocked products)


def test_reference_and_block_kernels_agree(rng):
    x = da.from_array(rng.standard_normal((5, 7, 8)).astype(np.float32), chunks=(2, 3, 8))
    table = da.from_array(rng.standard_normal((32, 3)).astype(np.float32), chunks=(32, 1))
    fast = pe.rope(x), pe.t5_bias(table, 7, 9, chunks=(1, 3, 4))
    with pe.use_backend("reference"):
        slow = pe.rope(x), pe.t5_bias(table, 7, 9, chunks=(1, 3, 4))
    assert fast[1].chunks == slow[1].chunks
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f.compute(), s.compute(), rtol=2e-6, atol=2e-6)


# --- schedulers ---------------------------------------------------------------------------


def _workload(rng):
    x = rng.standard_normal((400, 32)).astype(np.float32)
    pos = rng.integers(0, 10**6, 400)
    table = rng.standard_normal((32, 4)).astype(np.float32)
    lazy = (
        pe.rope(da.from_array(x, chunks=(64, 32)), da.from_array(pos, chunks=64)),
        pe.t5_bias(da.from_array(table, chunks=(32, 2)), 50, 70, offset=20, chunks=(2, 16, 32)),
    )
    want = (exact_rope(x, pos), pe.t5_bias(table, 50, 70, offset=20))
    return lazy, want


@pytest.mark.parametrize("scheduler", ["threads", "synchronous"])
def test_local_schedulers(scheduler, rng):
    lazy, want = _workload(rng)
    for got, w in zip(dask.compute(*lazy, scheduler=scheduler), want):
        np.testing.assert_allclose(got, w, atol=3e-6)


def test_distributed_client(rng):
    distributed = pytest.importorskip("distributed")
    lazy, want = _workload(rng)
    before = {t.ident for t in threading.enumerate()}
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            got = client.compute(list(lazy), sync=True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=3e-6)
    # Closed: no thread of the cluster is left (distributed keeps one offload pool per process).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.ident not in before and not t.name.startswith("Dask-Offload")]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"threads left running: {left}"


@pytest.mark.parametrize("cu", [[0, 3, 2, 4], [1, 4], [0, 2**62, 4], [0, 2, 3]])
def test_positions_from_cu_seqlens_checks_dask_boundaries_when_computed(cu):
    """Dask ``cu_seqlens`` that do not run non-decreasing from 0 to ``total`` raise the eager
    call's ``ValueError`` when the positions are computed (the check reads them whole, across
    its blocks); building the graph computes nothing. They had not been checked: ``[1, 4]``
    gave positions [-4, 0, 1, 2], ``[0, 3, 2, 4]`` [0, 1, 0, 1], ``[0, 2**62, 4]`` [0, 1, 2, 3]."""
    cu = np.array(cu)
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing from 0 to total = 4") as eager:
        pe.positions_from_cu_seqlens(cu, 4)
    lazy = lazily(lambda c: pe.positions_from_cu_seqlens(c, 4), da.from_array(cu, chunks=1))
    with pytest.raises(ValueError, match=re.escape(str(eager.value))):
        lazy.compute(scheduler="synchronous")
    fine = np.array([0, 1, 1, 4])
    got = lazily(lambda c: pe.positions_from_cu_seqlens(c, 4), da.from_array(fine, chunks=1))
    np.testing.assert_array_equal(got.compute(), pe.positions_from_cu_seqlens(fine, 4))


def test_a_dask_result_whose_blocks_memory_cannot_list_is_a_value_error():
    """A Dask result so long that Dask could not list its blocks' sizes (``total = 2**62``
    int64 positions: 2**38 blocks of 128 MiB) is a ``ValueError`` naming the function and
    its shape, as the eager call's, before Dask is asked: Dask's ``arange`` had raised
    ``MemoryError``. A long one that Dask can list stays lazy."""
    message = "positions_from_cu_seqlens of shape (4611686018427387904,) needs"
    with pytest.raises(ValueError, match=re.escape(message)):
        pe.positions_from_cu_seqlens(np.array([0, 2**62]), 2**62)
    with pytest.raises(ValueError, match=re.escape(message) + " 274877906944 Dask blocks"):
        pe.positions_from_cu_seqlens(da.from_array(np.array([0, 2**62])), 2**62)
    assert lazily(lambda c: pe.positions_from_cu_seqlens(c, 2**40), da.from_array(np.array([0, 2**40]))).shape == (2**40,)


def test_a_blocked_bias_of_no_queries_or_no_keys_is_numpys_empty_result():
    """A Dask bias with ``q_len = 0`` or ``k_len = 0`` and a long other length has an empty
    per-distance vector: it is NumPy's empty result (lazy, one block). It had been refused
    as a per-distance vector of ``q_len + k_len - 1`` entries ("the per-distance vector of
    the blocked bias of shape (2, 1099511627775) needs 16384.0 GiB") that it does not have,
    and ``expand_bias`` of the empty vector raised ZeroDivisionError inside Dask's
    chunking of an empty array."""
    table = np.linspace(-1.0, 1.0, 64).reshape(32, 2)
    for q_len, k_len in ((0, 2**40), (2**40, 0), (0, 3), (0, 0)):
        calls = (
            lambda t: pe.t5_bias(t, q_len, k_len),
            lambda t: pe.alibi_bias(t[0], q_len, k_len),
            lambda t: pe.relative_bias("shaw", t[:9], q_len, k_len, max_distance=4),
            lambda t: pe.expand_bias(pe.relative_bias_vector("t5", t, q_len, k_len), q_len, k_len),
        )
        for call in calls:
            got, want = lazily(call, da.from_array(table)), call(table)
            assert got.shape == want.shape == (2, q_len, k_len) and got.dtype == want.dtype
            assert got.npartitions == 1
        if q_len + k_len < 10:
            np.testing.assert_array_equal(got.compute(), want)


@pytest.mark.parametrize("chunks", [(1, 7, 8), (2, 20, 8), (1, 3, 5)])
def test_conv_positions_keeps_the_chunks_of_x(rng, chunks):
    """Each tap added a slice of the zero-padded ``x`` shifted by ``t``, whose chunks are
    offset by ``t``: their sum was cut at every shifted boundary, ``x`` of chunks ``(7, 7, 6)``
    along the sequence gave ``(1, 1, 3, 1, 1, 1, 1, 3, 1, 1, 1, 1, 2, 1, 1)``, and 4096 rows in
    chunks of 1024 gave 20 chunks, 16 of them one row. Each slice is in ``x``'s chunks now:
    the result has ``x``'s chunks (and the NumPy call's bits)."""
    x, kernel = rng.standard_normal((2, 20, 8)), rng.standard_normal((5, 8))
    lazy = da.from_array(x, chunks=chunks)
    got = lazily(pe.conv_positions, lazy, da.from_array(kernel))
    assert got.chunks == lazy.chunks
    assert np.array_equal(got.compute(), pe.conv_positions(x, kernel))


def test_floater_of_a_dask_p0_keeps_its_state_in_one_chunk():
    """The default dynamics swapped each (sin, cos) pair with a stack and a reshape, which
    on Dask split the state further at every RK4 stage: ``floater(4, 8, p0=<one chunk>,
    substeps=2)`` gave 8 chunks of one value per row (``floater(16, 64, p0=...)`` a graph
    of a million tasks: 226 s to build, 313 s to compute). A flip swaps them now: one chunk
    per row, the NumPy call's bits (the same products)."""
    p0 = np.asarray(pe.sinusoidal(1, 8))[0]
    got = lazily(lambda p: pe.floater(4, 8, p0=p, substeps=2), da.from_array(p0))
    assert got.chunks == ((1, 1, 1, 1), (8,))
    assert np.array_equal(got.compute(), pe.floater(4, 8, p0=p0, substeps=2))


@pytest.mark.parametrize("chunks", [(1, 1, 8, 16), (1, 1, 32, 16), (1, 2, 10, 12)])
def test_rel_shift_keeps_the_chunks_of_x(rng, chunks):
    """Dask's reshapes of the padded, flattened rows chose their own chunks: one chunk of
    1024 x 1024 came back as query chunks (511, 256, 257), chunks of 256 queries as
    (127, 128, ..., 64, 65), and (300, 500) as 16 query chunks of 31 to 75 with the keys
    merged. The result is in ``x``'s chunks now (the NumPy call's bits)."""
    x = rng.standard_normal((1, 2, 32, 24))
    lazy = da.from_array(x, chunks=chunks)
    got = lazily(pe.rel_shift, lazy)
    assert got.chunks == lazy.chunks
    assert np.array_equal(got.compute(), pe.rel_shift(x))
