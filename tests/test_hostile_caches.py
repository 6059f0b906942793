"""Issue 35: caches that stay bounded in a long decode loop (their sizes, which are
deterministic, rather than the process's RSS), and random differential tests of the
``out=`` aliasing rule and of the integer rule against float64 formulas."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from arrays import child_pythonpath
from formulas import exact_rope, hf_t5_bucket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc import _xp
from posenc._kernels import rope_plan
from posenc.relative import _decode

STEPS = 3000


def _bias_plans():
    return [plan for plan in pe.relative_bias.plans.values() if plan]


def test_9_decode_loop_of_the_one_query_biases_keeps_a_bounded_window():
    pe.relative_bias.plans.clear()
    table = np.arange(32.0)[:, None] * np.array([1.0, -1.0])
    slopes = np.array([0.5, 0.25])
    for step in range(1, STEPS + 1):
        t5 = pe.t5_bias(table, 1, step)
        alibi = pe.alibi_bias(slopes, 1, step)
        if step in (1, 7, 1000, STEPS):  # every distance step - 1 .. 0 against the formulas
            distances = step - 1 - np.arange(step)
            buckets = hf_t5_bucket(-distances, num_buckets=32, max_distance=128)
            np.testing.assert_array_equal(t5[:, 0], (buckets[None, :] * np.array([1.0, -1.0])[:, None]))
            np.testing.assert_array_equal(alibi[:, 0], -slopes[:, None] * distances[None, :])
    # A far offset moves the window, it does not fill every distance below it.
    for offset in (2**24, 2**24 + 1, 2**40, -(2**40)):
        far = pe.t5_bias(table, 1, 2, offset=offset)
        np.testing.assert_array_equal(far[0, 0], hf_t5_bucket(-np.array([offset, offset - 1]), num_buckets=32, max_distance=128))
        assert pe.alibi_bias(slopes, 1, 2, offset=offset)[0, 0].tolist() == [-0.5 * offset, -0.5 * (offset - 1)]
    plans = _bias_plans()
    assert plans, "the decode loop was served by no plan"
    for plan in plans:
        hi, lo, sources = plan.row.held
        assert hi - lo < _decode.HELD and (sources is None or sources.shape[0] <= _decode.HELD)
        assert plan.row.keys.shape[0] <= _decode.HELD
        assert plan.launcher is not None and plan.launcher.row_keys.shape[1] <= _decode.HELD  # the kernel's key indices


def test_a_decode_rows_keys_grown_by_two_threads_at_once_are_each_calls_own(monkeypatch):
    """A Shaw (or DeBERTa) decode step's plan grows its key indices for a longer row. Thread
    B, asking for 10 keys, read the short keys and was building its 10 when the main thread
    grew them to 100 and, before it read them back, B stored its 10: the main thread's row
    had 10 keys, not 100 (``relative_bias(..., 1, 100)`` of shape ``[heads, 1, 10]``)."""
    import threading

    row = _decode.Row("shaw", np.zeros((9, 2)), {"max_distance": 4})
    waiting, stored = threading.Event(), threading.Event()

    class Namespace:  # NumPy, but B's arange waits until the main thread has stored its keys
        def __getattr__(self, name):
            return getattr(np, name)

        def arange(self, n, **kwargs):
            if n == 10:
                waiting.set()
                stored.wait(5)
            return np.arange(n, **kwargs)

    def keep(self, keys):
        self.__dict__["kept"] = keys
        if len(keys) == 100:  # B stores its keys between the main thread's store and its read
            stored.set()
            other.join(5)

    monkeypatch.setattr(_decode.Row, "keys", property(lambda self: self.__dict__["kept"], keep), raising=False)
    row.keys, row.xp = np.arange(0), Namespace()
    found = {}
    other = threading.Thread(target=lambda: found.update(b=row._keys(10)))
    other.start()
    assert waiting.wait(5)
    assert row._keys(100).tolist() == list(range(100))
    assert found["b"].tolist() == list(range(10))


def test_10_split_chunks_cache_is_bounded():
    jnp = pytest.importorskip("jax.numpy")
    import jax

    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on: no split reduction")
    positions = jnp.arange(3)
    for step in range(80):  # a dynamic-NTK loop: new frequencies every step (more than the 64 kept)
        pe.rope_cos_sin(positions, [1.0 / (step + 2), 0.5 / (step + 2)])
    info = _xp._split_chunks_cache.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize <= 64


def test_12_hf_rows_stay_at_their_documented_bound():
    torch = pytest.importorskip("torch")
    from posenc.torch import hf

    inv_freq, bound = (1.0, 0.5), hf._MOST_CACHED_ROWS
    for high in (40000, 40001, bound - 1):
        rows, cos, sin = hf._rows_through(inv_freq, 1.0, torch.float32, high)
        assert high < rows.shape[0] <= bound
        angle = np.arange(rows.shape[0])[:, None] * np.array(inv_freq)
        np.testing.assert_allclose(cos[:, :2].numpy(), np.cos(angle), atol=1e-6)
    assert hf.cached_rows(inv_freq, 1.0, torch.float32, torch.tensor([bound])) is None  # beyond: computed afresh


def test_12_hf_row_sets_in_use_stay_kept_least_recently_read_evicted_first(monkeypatch):
    """Ten row sets read in turn (five models of two layer types, say) are built once each:
    the least recently read set is evicted first, and more than eight sets are kept (eight,
    evicted in insertion order, had rebuilt a ninth set in use on every call). A bound in
    bytes evicts the oldest too, never the set just built."""
    torch = pytest.importorskip("torch")
    from posenc.torch import _rows, hf

    built = []
    afresh = _rows._afresh
    monkeypatch.setattr(_rows, "_afresh", lambda *a: built.append(a[0]) or afresh(*a))
    monkeypatch.setattr(_rows, "_ROWS", __import__("collections").OrderedDict())
    sets = [(1.0 / (i + 2), 0.5 / (i + 2)) for i in range(10)]
    for _ in range(3):
        for inv_freq in sets:
            cos, _ = hf.cached_rows(inv_freq, 1.0, torch.float32, torch.tensor([[500]]))
            assert torch.equal(cos, pe.rope_cos_sin(torch.tensor([[500]]), np.array(inv_freq), dtype=torch.float32)[0])
    assert len(built) == len(sets)
    hf.cached_rows(sets[0], 1.0, torch.float32, torch.tensor([[1]]))  # read last: kept when the others go
    one = _rows._ROWS[sets[0], 1.0, torch.float32][0]
    monkeypatch.setattr(_rows, "_MOST_CACHED_BYTES", 2 * one.nelement() * one.element_size())
    hf.cached_rows((3.0, 1.0), 1.0, torch.float32, torch.tensor([[500]]))
    assert list(_rows._ROWS) == [(sets[0], 1.0, torch.float32), ((3.0, 1.0), 1.0, torch.float32)]


def test_12_a_set_read_by_another_thread_while_the_kept_bytes_are_summed(monkeypatch):
    """A thread that reads a kept set (moving it to the end of ``_ROWS``, outside the lock)
    while another, having built a set, sums the bytes kept: both get their rows, no
    ``RuntimeError: OrderedDict mutated during iteration`` (the reader runs inside the sum)."""
    import threading

    torch = pytest.importorskip("torch")
    from posenc.torch import _rows

    monkeypatch.setattr(_rows, "_ROWS", __import__("collections").OrderedDict())
    sets = [(1.0 / (i + 2), 0.5 / (i + 2)) for i in range(3)]
    for inv_freq in sets:
        _rows._rows_through(inv_freq, 1.0, torch.float32, 3)
    read = []
    nelement = torch.Tensor.nelement

    def interrupted(self):
        if not read:
            thread = threading.Thread(target=lambda: read.append(_rows._rows_through(sets[0], 1.0, torch.float32, 3)))
            thread.start()
            thread.join()
        return nelement(self)

    monkeypatch.setattr(torch.Tensor, "nelement", interrupted)
    built = _rows._rows_through((3.0, 1.0), 1.0, torch.float32, 3)
    assert len(read) == 1 and read[0][0].shape[0] >= 4 and built[0].shape[0] >= 4
    assert list(_rows._ROWS)[-2:] == [((3.0, 1.0), 1.0, torch.float32), (sets[0], 1.0, torch.float32)]  # read last


FORKED_WHILE_ROWS_GROW = """
import os, signal, threading
import torch
from posenc.torch import _rows

holding, release = threading.Event(), threading.Event()

def grow():
    with _rows._ROWS_LOCK:  # as a thread adding a row set holds it
        holding.set()
        release.wait()

grower = threading.Thread(target=grow)
grower.start()
holding.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child that waits on the lock of a thread it does not have ends here
    cos, _ = _rows.fixed_tables((1.0, 0.5), 1.0, torch.float32, torch.tensor([[5]]))
    os._exit(0 if cos[0, 0, 0] == torch.cos(torch.tensor(5.0, dtype=torch.float64)).float() else 1)
release.set()
grower.join()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_12_a_process_forked_while_another_thread_adds_a_row_set_can_add_one():
    """``os.fork`` (a DataLoader's workers) while another thread holds the kept rows' lock:
    the child, which has no such thread, gets a lock of its own; its first new row set had
    waited forever."""
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": child_pythonpath(Path(pe.__file__).parent.parent)}
    proc = subprocess.run([sys.executable, "-c", FORKED_WHILE_ROWS_GROW], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "child 0", (proc.stdout, proc.stderr[-3000:])


def test_12_rows_kept_for_compile_are_their_own_tensor():
    """A module's rows for compiled calls are a copy of the shared rows' first ``count``, not
    a view holding all of them (up to 2**16 rows) alive and in every pickle of the model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from posenc.torch import hf

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=16)
    module = hf.HFRotaryEmbedding(config)
    module(torch.zeros(1), torch.tensor([[60000]]))  # the shared rows grow past 60000
    module.keep_rows_for_compile(torch.float32)
    (rows,) = module._rows_for_compile.values()
    assert rows.shape[0] == 16 and rows.untyped_storage().nbytes() == rows.nelement() * rows.element_size()


def test_rope_decode_loop_keeps_one_plan():
    x = np.random.default_rng(0).standard_normal((2, 1, 8))
    pe.rope(x, offset=0)
    before = len(pe.rope.plans)
    for step in range(STEPS):
        result = pe.rope(x, offset=step)
    assert len(pe.rope.plans) == before
    np.testing.assert_allclose(result, exact_rope(x, [STEPS - 1]), atol=1e-12)


def _held_arrays(plan):
    """The NumPy arrays a plan (or a ``_SEEN`` marker) holds: reachable from its attributes
    through posenc's own objects, tuples, lists and dicts (not through compiled kernels)."""
    found, seen, todo = [], set(), [plan]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            found.append(obj)
        elif isinstance(obj, (tuple, list)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif type(obj).__module__.startswith("posenc") and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return found


def _held_bytes(plans):
    return sum(a.nbytes for plan in plans for a in _held_arrays(plan))


def _holds_none_of(plans, *arrays):
    return not any(np.may_share_memory(held, a) for plan in plans for held in _held_arrays(plan) for a in arrays)


@pytest.mark.parametrize("kind", ["t5", "alibi"])
def test_per_token_bias_decode_loop_keeps_bounded_plans(kind):
    """Per-token positions in a decode loop: with every key so far (``k_len`` grows: one
    signature, its plan keeping per-token plans of the last few lengths and one window), then
    with a sliding window of ``WINDOW`` keys (one signature, one plan)."""
    window = 64
    table = np.arange(32.0)[:, None] * np.array([1.0, -1.0])
    slopes = np.array([0.5, 0.25])

    def bias(q, k):
        if kind == "t5":
            return pe.t5_bias(table, 1, k.shape[0], query_positions=q, key_positions=k)
        return pe.alibi_bias(slopes, 1, k.shape[0], query_positions=q, key_positions=k)

    def formula(q, k):
        rel = q[:, None] - k[None, :]
        if kind == "t5":
            return hf_t5_bucket(-rel, num_buckets=32, max_distance=128)[None] * np.array([1.0, -1.0])[:, None, None]
        return -slopes[:, None, None] * rel[None].astype(np.float64)

    for keys in (lambda step: np.arange(step + 1), lambda step: np.arange(max(0, step - window + 1), step + 1)):
        pe.relative_bias.plans.clear()
        for step in range(STEPS):
            q, k = np.array([step]), keys(step)
            result = bias(q, k)
            if step in (0, 1, 2, window - 1, window, 300, 1000, STEPS - 1):
                np.testing.assert_array_equal(result, formula(q, k))
            if step == 2 * window:
                held = _held_bytes([plan for plan in pe.relative_bias.plans.values() if plan])
        plans = [plan for plan in pe.relative_bias.plans.values() if plan]
        assert len(pe.relative_bias.plans) == 1 and [type(plan) for plan in plans] == [_decode.PerTokenPlans]
        assert _held_bytes(plans) <= max(held, 2 * _decode.HELD * 8)
        assert _holds_none_of(plans, table, slopes, q, k)


@pytest.mark.parametrize("placed", ["[1]", "[batch, 1]", "torch [batch, 1]"])
def test_rope_decode_loop_with_positions_arrays_keeps_one_plan(placed):
    """``rope(x, positions)`` of one new token a step, positions as an array (the HF
    ``position_ids`` shape among them): one signature, one ``PositionsPlan`` of constant
    size holding none of the caller's arrays."""
    x = np.random.default_rng(1).standard_normal((2, 4, 1, 16))
    if placed == "torch [batch, 1]":
        torch = pytest.importorskip("torch")
        x = torch.from_numpy(x)

    def positions(step):
        if placed == "[1]":
            return np.array([step])
        if placed == "[batch, 1]":
            return np.array([[step], [step]])
        return torch.tensor([[step], [step]])

    def bits(a):
        return a.numpy() if placed.startswith("torch") else a

    pe.rope.plans.clear()
    for step in range(STEPS):
        p = positions(step)
        result = pe.rope(x, p)
        if step == 2:  # built after step 1's call; its scratch allocated by its first run
            (plan,) = pe.rope.plans.values()
            assert isinstance(plan, rope_plan.PositionsPlan)
            held = _held_bytes([plan])
        if step in (0, 1, 2, 1000, STEPS - 1):
            np.testing.assert_allclose(bits(result), exact_rope(bits(x), [step]), atol=1e-12)
    assert list(pe.rope.plans.values()) == [plan]
    assert _held_bytes([plan]) == held
    assert _holds_none_of([plan], bits(x), bits(p), bits(result))


# ---------------------------------------------------------------- random differential tests

BUFFER = 160


def _view(buffer, start, row_stride, column_stride):
    size = buffer.itemsize
    return np.lib.stride_tricks.as_strided(buffer[start:], (4, 8), (row_stride * size, column_stride * size))


def _addresses(start, row_stride, column_stride):
    return [start + r * row_stride + c * column_stride for r in range(4) for c in range(8)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x_at=st.integers(0, 40), out_at=st.integers(0, 40), x_rows=st.sampled_from([8, 9, 16]), out_rows=st.sampled_from([8, 9, 16, 20]),
    out_columns=st.sampled_from([1, 2]), positions_at=st.one_of(st.none(), st.integers(0, 150)),
)  # fmt: skip
def test_out_aliasing_rule_differentially(x_at, out_at, x_rows, out_rows, out_columns, positions_at):
    buffer = np.random.default_rng(x_at * 1000 + out_at).standard_normal(BUFFER)
    x = _view(buffer, x_at, x_rows, 1)
    out = _view(buffer, out_at, out_rows, out_columns)
    positions = np.arange(4.0) * 3 if positions_at is None else buffer[positions_at : positions_at + 4]
    if positions.shape[0] < 4:
        return
    x_copy, positions_copy, before = x.copy(), positions.copy(), buffer.copy()
    same = x.__array_interface__ == out.__array_interface__
    written = _addresses(out_at, out_rows, out_columns)
    folded = len(set(written)) < len(written)  # two elements of out at one address
    refused = folded or (np.shares_memory(out, x) and not same) or np.shares_memory(out, positions)
    if refused:
        with pytest.raises(ValueError, match="out (overlaps|shares memory|of shape)"):
            pe.rope(x, positions, out=out)
        np.testing.assert_array_equal(buffer, before)  # refused before anything was written
        return
    result = pe.rope(x, positions, out=out)
    assert result is out
    np.testing.assert_allclose(out, exact_rope(x_copy, positions_copy), atol=1e-9)
    written = np.zeros(BUFFER, bool)
    _view(written, out_at, out_rows, out_columns)[...] = True
    np.testing.assert_array_equal(buffer[~written], before[~written])  # no stray write


DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
EDGES = [0, 1, -1, 200, -300, 2**31, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63)]


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(DTYPES), offset=st.sampled_from(EDGES), values=st.lists(st.integers(-(2**64), 2**64), min_size=1, max_size=4))
def test_integer_rule_differentially(dtype, offset, values):
    info = np.iinfo(dtype)
    values = [min(max(v, int(info.min)), int(info.max)) for v in values]
    positions = np.array(values, dtype=dtype)
    x = np.random.default_rng(len(values)).standard_normal((len(values), 8))
    sums = [v + offset for v in values]
    fits = all(-(2**63) <= v <= 2**63 - 1 for v in values) and all(-(2**63) <= s <= 2**63 - 1 for s in sums)
    if not fits:
        with pytest.raises(ValueError, match="positions|offset"):
            pe.rope(x, positions, offset=offset)
        return
    np.testing.assert_allclose(pe.rope(x, positions, offset=offset), exact_rope(x, np.array(sums, dtype=np.float64)), atol=1e-9)
    keys = np.array(values[::-1], dtype=dtype)
    differences = [[q - k for k in values[::-1]] for q in sums]
    if all(-(2**63) <= d <= 2**63 - 1 for row in differences for d in row):
        alibi = pe.alibi_bias(np.array([1.0]), len(values), len(values), offset=offset, query_positions=positions, key_positions=keys)
        np.testing.assert_array_equal(alibi[0], -np.array(differences, dtype=np.float64))
    else:
        with pytest.raises(ValueError, match="query_positions - key_positions"):
            pe.alibi_bias(np.array([1.0]), len(values), len(values), offset=offset, query_positions=positions, key_positions=keys)
