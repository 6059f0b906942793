"""The per-token bias kernels (``posenc._kernels.bias_rows_cpu``) against the reference.

A planned ``t5_bias`` / ``alibi_bias`` call with int64 positions reads its plan's kept
per-distance sources through one kernel pass. Hypothesis draws batch shapes (broadcast
query and key batches, empty axes left to the general path), lengths, strided and
broadcast positions, offsets and dtypes, for NumPy arrays and torch CPU tensors: every
result the kernel gives is bit-identical to the reference's (the full path under the
``"reference"`` backend, which runs no kernel), and the test checks the kernel did give
it. The launcher's refusals (values outside the kept window, positions near the integer
limits) are called directly: each gives None, never a value read out of bounds (``make
test`` runs this file again with Numba's bounds checking compiled in).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc import use_backend
from posenc._kernels import _layout, bias_rows_cpu

pytestmark = pytest.mark.kernels

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")  # NumPy's bfloat16

DTYPES = {"t5": ("float16", "bfloat16", "float32", "float64"), "alibi": ("float32", "float64")}


@pytest.fixture
def pieces(monkeypatch):
    """The count of pieces each call of a bias kernel on ``_layout.run_tasks`` ran, in order."""
    counts = []
    run = _layout.run_tasks

    def spy(kernel, *args):
        results = run(kernel, *args)
        if kernel in bias_rows_cpu.FAMILY.values():  # (not the Toeplitz expansion of a call before its plan)
            counts.append(len(results))
        return results

    monkeypatch.setattr(_layout, "run_tasks", spy)
    return counts


@pytest.fixture
def split(monkeypatch, pieces):
    """``pieces``, with every kernel call on three workers (the bytes per thread lowered to one)."""
    monkeypatch.setattr(bias_rows_cpu, "_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(_layout, "threads", lambda: 3)
    return pieces


@pytest.fixture
def launches(monkeypatch):
    """The results the kernel gave (None: it declined the call), in order."""
    given_back = []
    run = bias_rows_cpu.Launcher._run

    def spy(self, *args):
        given_back.append(result := run(self, *args))
        return result

    monkeypatch.setattr(bias_rows_cpu.Launcher, "_run", spy)
    return given_back


def _params(kind, library, dtype, heads, rng, strided=False):
    """The table or slopes; ``strided``: a view whose elements are not contiguous (column-major, every other one)."""
    values = rng.standard_normal((32, heads) if kind == "t5" else (heads,))
    if kind == "alibi":
        values = np.abs(values) / 4
    if library == "numpy":
        params = values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        return (np.asfortranarray(params) if kind == "t5" else np.repeat(params, 2)[::2]) if strided else params
    params = torch.tensor(values).to(getattr(torch, dtype))
    return (params.T.contiguous().T if kind == "t5" else params.repeat_interleave(2)[::2]) if strided else params


def _positions(values, stride, library):
    """int64 positions with ``values`` along the last axis, as a strided view when ``stride > 1``."""
    spread = np.repeat(values, stride, axis=-1)[..., ::stride] if stride > 1 else values
    if library == "numpy":
        return spread
    tensor = torch.from_numpy(np.repeat(values, stride, axis=-1).copy())
    return tensor[..., ::stride] if stride > 1 else tensor


@st.composite
def problems(draw):
    kind = draw(st.sampled_from(("t5", "alibi")))
    library = draw(st.sampled_from(("numpy", "torch")))
    dtype = draw(st.sampled_from(DTYPES[kind]))
    batch = draw(st.sampled_from(((), (2,), (1, 3), (2, 1))))
    query_batch = draw(st.sampled_from([batch, batch[1:], ()] if batch else [()]))
    key_batch = draw(st.sampled_from([batch, (1,) * len(batch)] if batch else [()]))
    q_len, k_len = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    start = draw(st.integers(-(2**40), 2**40) | st.integers(-300, 300))
    spread = draw(st.integers(0, 600))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    queries = start + rng.integers(0, spread + 1, (*query_batch, q_len))
    keys = start + rng.integers(0, spread + 1, (*key_batch, k_len))
    return {
        "kind": kind, "library": library, "dtype": dtype, "heads": draw(st.integers(1, 5)), "seed": seed,
        "queries": queries, "keys": keys, "strides": (draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        "offset": draw(st.none() | st.integers(-50, 50)), "symmetric": draw(st.booleans()),
        "bidirectional": draw(st.booleans()), "max_distance": draw(st.sampled_from((20, 128))), "strided": draw(st.booleans()),
    }  # fmt: skip


def _call(problem, params, queries, keys):
    q_len, k_len = queries.shape[-1], keys.shape[-1]
    options = {"query_positions": queries, "key_positions": keys, "offset": problem["offset"]}
    if problem["kind"] == "t5":
        return pe.t5_bias(params, q_len, k_len, bidirectional=problem["bidirectional"], max_distance=problem["max_distance"], **options)
    return pe.alibi_bias(params, q_len, k_len, symmetric=problem["symmetric"], **options)


def _bits(a):
    if isinstance(a, np.ndarray):
        return a.view(f"u{a.dtype.itemsize}"), a.dtype.name
    return a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.dtype.itemsize]).numpy(), str(a.dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # (cleared per example)
@given(problem=problems())
@example(  # one query without batch axes beside batched keys: still one row per batch entry
    problem={
        "kind": "t5", "library": "numpy", "dtype": "float16", "heads": 1, "seed": 0, "queries": np.array([0]),
        "keys": np.array([[0], [0]]), "strides": (1, 1), "offset": None, "symmetric": False, "bidirectional": False, "max_distance": 20,
        "strided": False,
    },
)  # fmt: skip
def test_the_kernel_gives_the_references_bits(problem, launches):
    _check_against_the_reference(problem, launches)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # (cleared per example)
@given(problem=problems())
def test_rows_split_over_threads_give_the_references_bits(problem, launches, split):
    """Every call's query rows in three pieces on three threads (fewer rows: a piece each): the
    same bits, each piece's checks its own."""
    split.clear()
    _check_against_the_reference(problem, launches)
    rows = math.prod(np.broadcast_shapes(problem["queries"].shape[:-1], problem["keys"].shape[:-1])) * problem["queries"].shape[-1]
    assert split[-1] == min(3, rows)


def _check_against_the_reference(problem, launches):
    rng = np.random.default_rng(problem["seed"])
    params = _params(problem["kind"], problem["library"], problem["dtype"], problem["heads"], rng, problem["strided"])
    queries, keys = (_positions(p, s, problem["library"]) for p, s in zip((problem["queries"], problem["keys"]), problem["strides"]))
    with use_backend("reference"):
        expected = _call(problem, params, queries, keys)
    pe.relative_bias.plans.clear()
    launches.clear()
    for step in range(4):  # seen, planned, then the plan: its first call keeps the window the next ones read
        got = _call(problem, params, queries, keys)
        assert type(got) is type(expected) and tuple(got.shape) == tuple(expected.shape)
        (got_bits, got_dtype), (bits, dtype) = _bits(got), _bits(expected)
        assert got_dtype == dtype
        np.testing.assert_array_equal(got_bits, bits, err_msg=f"step {step}")
    assert launches and launches[-1] is not None, "the last call did not reach the kernel"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # (cleared per example)
@given(
    kind=st.sampled_from(("t5", "alibi")), library=st.sampled_from(("numpy", "torch")), data=st.data(),
    offsets=st.lists(st.integers(-(2**40), 2**40) | st.integers(-100, 700), min_size=1, max_size=4),
    lengths=st.lists(st.integers(1, 700), min_size=1, max_size=4),
)  # fmt: skip
def test_one_query_row_by_offset_gives_the_references_bits(kind, library, data, offsets, lengths, launches):
    """``BiasPlan``: a decode step's row by a scalar offset, every step of a drawn sequence."""
    dtype = data.draw(st.sampled_from(DTYPES[kind]))
    params = _params(kind, library, dtype, data.draw(st.integers(1, 5)), np.random.default_rng(len(offsets)))
    steps = [(o, k) for o in offsets for k in lengths]
    call = (lambda o, k: pe.t5_bias(params, 1, k, offset=o)) if kind == "t5" else (lambda o, k: pe.alibi_bias(params, 1, k, offset=o))
    with use_backend("reference"):
        expected = [call(*step) for step in steps]
    pe.relative_bias.plans.clear()
    call(*steps[0]), call(*steps[0])  # seen, planned
    launches.clear()
    for _ in range(2):
        for step, want in zip(steps, expected):
            got = call(*step)
            (got_bits, got_dtype), (bits, dtype_name) = _bits(got), _bits(want)
            assert got_dtype == dtype_name and got_bits.shape == bits.shape
            np.testing.assert_array_equal(got_bits, bits, err_msg=f"step {step}")
    assert any(result is not None for result in launches), "no row reached the kernel"


def test_a_torch_table_that_requires_grad_reaches_the_kernel_under_no_grad_only(launches):
    table = torch.nn.Parameter(torch.randn(32, 4))
    queries, keys = torch.tensor([[9], [3]]), torch.arange(12)
    with torch.no_grad():
        expected = pe.t5_bias(table, 1, 12, query_positions=queries, key_positions=keys)
        for _ in range(4):
            assert torch.equal(pe.t5_bias(table, 1, 12, query_positions=queries, key_positions=keys), expected)
    assert launches[-1] is not None
    launches.clear()
    for _ in range(4):
        result = pe.t5_bias(table, 1, 12, query_positions=queries, key_positions=keys)
        assert result.requires_grad and torch.equal(result.detach(), expected)
    assert not launches  # autograd records it: the reference's operations


def test_the_reference_backend_plans_without_the_kernel(launches):
    slopes = pe.alibi_slopes(4)
    with use_backend("reference"):
        for _ in range(4):
            pe.alibi_bias(slopes, 1, 16, query_positions=np.array([20]), key_positions=np.arange(16))
    assert not launches


# --- the launcher's refusals, called directly --------------------------------------------------


def _launcher(kind="alibi", heads=2, q_len=1, k_len=4, params=None):
    params = np.array([0.5, 0.25], np.float32) if params is None else params
    return bias_rows_cpu.Launcher(kind, params, heads, (), q_len, k_len, (q_len,), (k_len,)), params


def _window(hi, lo):
    """ALiBi's kept sources of the distances ``hi .. lo``: each negated, float32."""
    return (0.0 - np.arange(hi, lo - 1, -1).astype(np.float32)).astype(np.float32)


def test_the_launcher_reads_the_window_at_hi_minus_rel():
    launcher, slopes = _launcher()
    sources = _window(10, -5)  # distances 10 .. -5
    result = launcher(slopes, sources, 10 - 3, 3, np.array([4]), np.array([0, 2, 7, 12]))  # rel = 3 + 4 - k
    rel = np.array([7, 5, 0, -5], np.float32)
    np.testing.assert_array_equal(result, slopes[:, None, None] * -rel)


def test_a_value_outside_in_the_last_piece_declines_the_whole_call(split):
    launcher, slopes = _launcher(q_len=3)
    sources, keys = _window(10, -5), np.array([0, 2, 7, 12])
    whole = launcher(slopes, sources, 10 - 3, 3, np.array([4, 5, 6]), keys)  # rel = 3 + q - k
    rel = 3 + np.array([4, 5, 6])[:, None] - keys
    np.testing.assert_array_equal(whole, slopes[:, None, None] * -rel.astype(np.float32))
    assert launcher(slopes, sources, 10 - 3, 3, np.array([4, 5, 40]), keys) is None  # rel = 43 - k: past the window
    assert split == [3, 3]


def test_a_large_call_is_split_over_numbas_threads_and_a_decode_row_is_not(pieces):
    """At the module's own bytes per thread: an 8 MiB prefill bias on ``min(threads, 4)``
    pieces, the reference's bits; a decode step's row never reaches ``run_tasks``."""
    slopes, positions = pe.alibi_slopes(8).astype(np.float32), np.arange(512) % 200
    call = lambda: pe.alibi_bias(slopes, 512, 512, query_positions=positions, key_positions=positions)  # noqa: E731
    with use_backend("reference"):
        expected = call()
    for _ in range(4):  # seen, planned, then the plan
        np.testing.assert_array_equal(call(), expected)
    assert pieces and pieces[-1] == min(_layout.threads(), 4)
    pieces.clear()
    for k in range(1, 2048, 97):
        pe.alibi_bias(slopes, 1, k)
    assert not pieces


@pytest.mark.parametrize(
    "shift, offset, queries, keys",
    [
        (7, 3, [4], [0, 2, 7, 13]),  # rel = -6: below the window's least distance
        (7, 3, [4], [-4, 0, 1, 2]),  # rel = 11: above its greatest
        (7, 3, [2**62], [0, 1, 2, 3]),  # a query position at 2**62
        (7, 3, [4], [0, 1, 2, -(2**62)]),  # a key position at -2**62
        (2**62, 3, [4], [0, 1, 2, 3]),  # the window's shift at 2**62
        (7, 2**63 - 3, [4], [0, 1, 2, 3]),  # offset + query past int64's greatest
        (7, -(2**63) + 3, [-4], [0, 1, 2, 3]),  # offset + query past int64's least
    ],
)
def test_the_launcher_declines_what_it_does_not_cover(shift, offset, queries, keys):
    launcher, slopes = _launcher()
    assert launcher(slopes, _window(10, -5), shift, offset, np.array(queries), np.array(keys)) is None


def test_a_t5_bucket_outside_the_table_is_declined():
    table = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    launcher, _ = _launcher("t5", params=table)
    buckets = np.array([0, 1, 2, 3, 4, 0], np.int64)  # 4: past the table's rows
    assert launcher(table, buckets, 0, 0, np.array([0]), np.array([0, 1, 2, 3])) is not None
    assert launcher(table, buckets, 0, 0, np.array([0]), np.array([1, 2, 3, 4])) is None


def test_threads_that_move_one_plans_window_each_get_their_own_rows():
    """Four threads through one plan, each at queries far from the others' (the window moves
    back and forth, the kernel runs without the GIL): every result is the reference's."""
    from concurrent.futures import ThreadPoolExecutor

    table = np.random.default_rng(3).standard_normal((32, 4)).astype(np.float32)
    keys = np.arange(64)

    def call(q):
        return pe.t5_bias(table, 1, 64, query_positions=np.array([q]), key_positions=keys + (q - 63))

    starts = [63, 10**6, 10**9, 2**40]
    with use_backend("reference"):
        expected = {q + step: call(q + step) for q in starts for step in range(25)}
    call(63), call(63)  # seen, planned

    def steps(q):
        return [(q + step, call(q + step)) for step in range(25) for _ in range(4)]

    with ThreadPoolExecutor(4) as pool:
        for found in pool.map(steps, starts):
            for q, got in found:
                np.testing.assert_array_equal(got, expected[q], err_msg=f"query {q}")


@pytest.mark.parametrize("kind", ["t5", "alibi"])
def test_a_kernel_given_shapes_that_disagree_reads_nothing(kind):
    params = np.ones((4, 2) if kind == "t5" else (2,), np.float32)
    element = bias_rows_cpu.element(kind, "float32")
    kernel = bias_rows_cpu.FAMILY[(kind, element)]
    params = params.view(element)
    sources = np.zeros(8, np.int64 if kind == "t5" else np.float32)
    queries, keys = np.zeros((2, 1), np.int64), np.zeros((2, 3), np.int64)
    for out_shape, q, k in [((3, 2, 1, 3), queries, keys), ((2, 3, 1, 3), queries, keys), ((2, 2, 1, 3), queries[:1], keys), ((2, 2, 1, 3), queries, keys[:, :2])]:
        assert not kernel(params, sources, 0, 0, q, k, np.zeros(out_shape, element), 0, 2)
    assert not kernel(params, sources, 0, 0, queries, keys, np.zeros((2, 2, 1, 3), element), -1, 2)  # a row before the first
    for first, last, written in [(0, 2, [True, True]), (1, 2**63 - 1, [False, True]), (2, 3, [False, False])]:  # (up to the last row)
        out = np.full((2, 2, 1, 3), -1, element)
        assert kernel(params, sources, 0, 0, queries, keys, out, first, last)
        assert (out != -1).all(axis=(1, 2, 3)).tolist() == written and ((out == -1).all(axis=(1, 2, 3)) != written).all()
