"""The Toeplitz and T5 bucket CUDA kernels have no data race, whatever the schedule (``races``).

Scatter's block shares accumulators and a segmented scan's buffers between its threads,
ordered by barriers alone (no atomics); expand, gather and the buckets write each output
element from one thread. Each kernel runs here as Python, one thread per CUDA thread, on
shapes with grid tails (keys not a multiple of a warp, classes past one chunk, fewer blocks
than rows), and is compared with a plain sum or gather; a kernel with a barrier taken out is
caught, which the simulator does not promise.
"""

from __future__ import annotations

import inspect
import textwrap

import numpy as np
import pytest

from posenc._kernels import _arrays
from races import FAKE, Race, Tracked, python, run

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]

SCATTER_CASES = [  # q_len, k_len, classes, index, blocks along the rows
    (1, 5, 3, "monotone", 1),
    (3, 33, 9, "monotone", 2),
    (2, 64, 7, "random", 1),
    (1, 300, 40, "random", 1),
    (2, 257, 5, "constant", 1),
    (1, 520, 257, "monotone", 1),
    (1, 40, 2100, "random", 1),
    (2, 70, 4100, "monotone", 1),
]


@pytest.fixture
def toeplitz(monkeypatch):
    """``toeplitz_cuda`` with its kernels' device functions as Python and ``cuda`` the detector's."""
    from posenc._kernels import _codec, toeplitz_cuda

    for name, function in (("_walk_row", python(toeplitz_cuda._walk_row)), ("_column", python(toeplitz_cuda._column)), ("_load", _codec.load), ("_store", _codec.store)):
        monkeypatch.setattr(toeplitz_cuda, name, function)
    monkeypatch.setattr(toeplitz_cuda, "cuda", FAKE)
    return toeplitz_cuda


def _scatter_kernel(source):
    """Scatter's kernel of float64 elements, as Python, from ``source`` (``_scatter_source`` or an edit of it)."""
    from posenc._kernels import _codec, _family

    return source(_arrays.STORAGE["float64"], _family.source_digest(_codec))


def _scatter(toeplitz, kernel, q, k, m, pattern, blocks_y, rng):
    """Run ``kernel`` (scatter's) on float64 weights ``[q, k]`` into ``m`` classes; check its sums."""
    n = q + k - 1
    index = {
        "monotone": np.clip(np.arange(n) - (k - 1), -(m // 2), m - 1 - m // 2) + m // 2,
        "random": rng.integers(0, m, n),
        "constant": np.full(n, m // 2),
    }[pattern].astype(np.int64)
    weights, out = rng.random((q, k)), np.full(q * m, np.nan)
    (chunks, _), threads = toeplitz._scatter_grid((q, m), k)
    batch = (0,) * toeplitz._BATCH
    args = ((1,) * toeplitz._BATCH + (m,), q, k, weights.reshape(-1), (0, *batch, k, 1), index, (0, 1), Tracked(out, shared=False), (0, *batch, m, 1))
    run(kernel, (chunks, blocks_y), threads, args)
    want = np.zeros((q, m))
    for i in range(q):
        np.add.at(want[i], index[i + k - 1 - np.arange(k)], weights[i])
    np.testing.assert_allclose(out.reshape(q, m), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize(("q", "k", "m", "pattern", "blocks_y"), SCATTER_CASES)
def test_toeplitz_scatter_has_no_race(toeplitz, q, k, m, pattern, blocks_y):
    _scatter(toeplitz, _scatter_kernel(toeplitz._scatter_source), q, k, m, pattern, blocks_y, np.random.default_rng(q * k + m))


@pytest.mark.parametrize("barrier", range(4))
def test_the_detector_finds_a_barrier_taken_out_of_scatter(toeplitz, barrier):
    """Scatter's source with its ``barrier``-th ``cuda.syncthreads()`` taken out races (the
    fifth, after a row's stores, orders nothing: each thread zeroes the accumulators it stores)."""
    lines = textwrap.dedent(inspect.getsource(toeplitz._scatter_source)).splitlines()
    at = [i for i, line in enumerate(lines) if line.strip() == "cuda.syncthreads()"][barrier]
    namespace = dict(vars(toeplitz))
    exec("\n".join(lines[:at] + lines[at + 1 :]), namespace)  # noqa: S102  (the module's own source, edited)
    kernel = _scatter_kernel(namespace["_scatter_source"])
    rng = np.random.default_rng(0)
    with pytest.raises(Race):
        for case in SCATTER_CASES:
            _scatter(toeplitz, kernel, *case, rng)


@pytest.mark.parametrize("gather", [False, True], ids=["expand", "gather"])
@pytest.mark.parametrize(("b", "q", "k"), [(1, 1, 1), (2, 3, 5), (1, 7, 130), (3, 2, 600), (1, 9, 33)])
def test_toeplitz_copies_write_each_element_once(toeplitz, gather, b, q, k):
    rng = np.random.default_rng(b * q * k)
    n, m = q + k - 1, 11
    if gather:
        values, index, vg = rng.random((b, q, m)), rng.integers(0, m, n).astype(np.int64), (0, 0, 0, 0, q * m, m, 1)
    else:
        values, index, vg = rng.random((b, n)), np.empty(0, np.int64), (0, 0, 0, 0, n, 0, 1)
    out = np.full(b * q * k, np.nan)
    grid, block = toeplitz._grid((b, q, k))
    run(toeplitz._copy_source(gather), grid, block, ((1, 1, 1, b, k), q, k, values.reshape(-1), vg, index, (0, 1), Tracked(out, shared=False), (0, 0, 0, 0, q * k, k, 1)))
    t = np.arange(q)[:, None] + k - 1 - np.arange(k)[None, :]
    np.testing.assert_array_equal(out.reshape(b, q, k), values[:, np.arange(q)[:, None], index[t]] if gather else values[:, t])


@pytest.mark.parametrize("name", ["int32", "int64"])
@pytest.mark.parametrize(("n", "step"), [(1, 1), (300, 1), (257, 3)])
def test_the_t5_bucket_kernel_writes_each_distance_once(monkeypatch, name, n, step):
    from posenc._kernels import buckets_cuda
    from posenc.relative.buckets import t5_bucket_values, t5_starts_array

    monkeypatch.setattr(buckets_cuda, "cuda", FAKE)
    rel = np.random.default_rng(n).integers(-5000, 5000, n * step).astype(name)
    out = np.full(n, -1, name)
    args = (n, rel, step, t5_starts_array(64, 2000), 32, 64, 1, -int(np.iinfo(name).max), Tracked(out, shared=False))
    run(buckets_cuda._buckets, -(-n // 256), 256, args)
    want = t5_bucket_values(rel[::step].astype(np.int64), num_buckets=128, max_distance=2000, bidirectional=True)
    np.testing.assert_array_equal(out, want)
