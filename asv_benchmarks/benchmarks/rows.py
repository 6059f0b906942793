"""One ``offset`` per batch row: a batch of decode steps whose KV caches have different
lengths, as a serving engine's continuous batch holds them (offsets 3 apart below
``keys - 1``, 8 heads). ``time_`` rows run posenc's per-row call alone; the ``track_``
rows time it in turns with the loop of one call per row with its Python int offset, what a
caller writes without per-row offsets, and report per-row time over the loop's (the rows
keep the loop's bits, so this is the only cost that may differ). NumPy float32 rows need
only NumPy, torch rows skip without torch. ``python docs/rows_bench.py`` prints a wider
grid (16-bit dtypes, prefill chunks, offsets far apart).
"""

from __future__ import annotations

import numpy as np

import posenc as pe

from .common import Benchmark, one_thread, ratio, require

HEADS = 8
ROWS = 8


def _arrays(library):
    """NumPy float32 data -> the library's arrays (floats, integers)."""
    if library == "torch":
        torch = require("torch")
        return torch.from_numpy, torch.from_numpy
    return (lambda a: a), (lambda a: a)


def _offsets(keys):
    return np.arange(ROWS, dtype=np.int64) * 3 + keys - 1 - 3 * ROWS


class BiasRows(Benchmark):
    """``t5_bias`` / ``alibi_bias`` of ``[8, 8, 1, 4096]``: 8 one-query rows against 4096 keys."""

    params = [["t5", "alibi"], ["numpy", "torch"]]
    param_names = ["bias", "library"]
    keys = 4096

    def make(self, bias, library):
        floats, integers = _arrays(library)
        rng = np.random.default_rng(0)
        if bias == "t5":
            table = floats(rng.standard_normal((32, HEADS)).astype(np.float32))
            self.call = lambda offset: pe.t5_bias(table, 1, self.keys, offset=offset)
        else:
            slopes = floats(pe.alibi_slopes(HEADS))
            self.call = lambda offset: pe.alibi_bias(slopes, 1, self.keys, offset=offset)
        offsets = _offsets(self.keys)
        self.per_row, self.ints = integers(offsets), offsets.tolist()

    def time_bias_rows_posenc(self, bias, library):
        self.call(self.per_row)

    def track_bias_rows_time_over_loop(self, bias, library):
        with one_thread():
            return ratio(lambda: self.call(self.per_row), lambda: [self.call(o) for o in self.ints], repeat=20)

    track_bias_rows_time_over_loop.unit = "x loop time"


class LogitsRows(Benchmark):
    """``shaw_logits`` (``d = 64``, ``K = 64``) of ``q [8, 8, 1, 64]`` against ``k [8, 8, 2048, 64]``:
    the loop's calls are each row's ``q[b:b + 1]`` and ``k[b:b + 1]`` alone."""

    params = [["numpy", "torch"]]
    param_names = ["library"]
    keys = 2048

    def make(self, library):
        floats, integers = _arrays(library)
        rng = np.random.default_rng(0)
        table = floats(rng.standard_normal((129, 64)).astype(np.float32))
        self.q, self.k = (floats(rng.standard_normal((ROWS, HEADS, n, 64)).astype(np.float32)) for n in (1, self.keys))
        self.call = lambda q, k, offset: pe.shaw_logits(q, k, table, max_distance=64, offset=offset)
        offsets = _offsets(self.keys)
        self.per_row, self.ints = integers(offsets), offsets.tolist()

    def _loop(self):
        return [self.call(self.q[b : b + 1], self.k[b : b + 1], o) for b, o in enumerate(self.ints)]

    def time_shaw_logits_rows_posenc(self, library):
        self.call(self.q, self.k, self.per_row)

    def track_shaw_logits_rows_time_over_loop(self, library):
        with one_thread():
            return ratio(lambda: self.call(self.q, self.k, self.per_row), self._loop, repeat=20)

    track_shaw_logits_rows_time_over_loop.unit = "x loop time"


class PrefillRows(Benchmark):
    """A prefill chunk of 64 queries per row against 2048 keys (``d = 64``, ``K = 64``),
    past the logits plans' sizes: ``shaw_logits`` and ``deberta_logits`` of ``q [8, 8, 64,
    64]``, ``shaw_output`` of weights ``[8, 8, 64, 2048]``, each row's own Toeplitz kernel
    (``relative/_rows.py``) against the loop of one call per row."""

    params = [["shaw_logits", "deberta_logits", "shaw_output"], ["numpy", "torch"]]
    param_names = ["function", "library"]
    keys, queries = 2048, 64

    def make(self, function, library):
        floats, integers = _arrays(library)
        rng = np.random.default_rng(0)
        table = floats(rng.standard_normal((129, 64)).astype(np.float32))
        q, k = (floats(rng.standard_normal((ROWS, HEADS, n, 64)).astype(np.float32)) for n in (self.queries, self.keys))
        if function == "shaw_logits":
            self.args = (q, k)
            self.call = lambda a, b, offset: pe.shaw_logits(a, b, table, max_distance=64, offset=offset)
        elif function == "deberta_logits":
            self.args = (q, k)
            self.call = lambda a, b, offset: pe.deberta_logits(a, b, table[:128], table[:128], max_distance=64, offset=offset)
        else:
            weights = floats(rng.random((ROWS, HEADS, self.queries, self.keys)).astype(np.float32))
            self.args = (weights, k)
            self.call = lambda w, v, offset: pe.shaw_output(w, v, table, max_distance=64, offset=offset)
        offsets = _offsets(self.keys) - self.queries + 1
        self.per_row, self.ints = integers(offsets), offsets.tolist()

    def _loop(self):
        return [self.call(*(a[b : b + 1] for a in self.args), o) for b, o in enumerate(self.ints)]

    def time_prefill_rows_posenc(self, function, library):
        self.call(*self.args, self.per_row)

    def track_prefill_rows_time_over_loop(self, function, library):
        with one_thread():
            return ratio(lambda: self.call(*self.args, self.per_row), self._loop, repeat=5)

    track_prefill_rows_time_over_loop.unit = "x loop time"


class GrowingKeys(Benchmark):
    """A decode loop whose keys grow a token a step: 300 steps of ``alibi_bias`` (8 heads, 8
    rows) from 1,024 keys, with one offset per batch row or with per-token key positions
    ``[8, keys]`` (a padded batch's, as the patched BLOOM passes them). Every length is served
    by one plan (before, each new length took the full path; more lengths than a function
    keeps signatures of, so that the loop's rounds repeat none)."""

    params = [["offsets", "key_positions"], ["numpy", "torch"]]
    param_names = ["given", "library"]
    steps = range(1024, 1324)

    def make(self, given, library):
        floats, integers = _arrays(library)
        slopes = floats(pe.alibi_slopes(HEADS))
        if given == "offsets":
            offsets = {k: integers(_offsets(k)) for k in self.steps}
            self.call = lambda k: pe.alibi_bias(slopes, 1, k, offset=offsets[k])
        else:
            keys = {k: integers(np.arange(ROWS * k, dtype=np.int64).reshape(ROWS, k) % k) for k in self.steps}
            self.call = lambda k: pe.alibi_bias(slopes, 1, k, offset=0, key_positions=keys[k])

    def time_growing_keys_posenc_loop(self, given, library):
        for k in self.steps:
            self.call(k)
