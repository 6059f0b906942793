"""Relative biases: the Toeplitz expand/gather kernels against the models' own formulas.

Every bias is a function of ``i - j``: posenc computes its ``[heads, q + k - 1]``
per-distance vector once (``O(L)``) and expands it with one write pass over the
``[heads, q, k]`` output. The baselines are the formulas as the original code writes them
(T5's bucket on the full ``[q, k]`` relative matrix, an embedding lookup and a permute;
ALiBi's ``-slopes[:, None, None] * rel``; Shaw's ``einsum`` over ``table[idx]``), and a
plain ``fill`` of the output's bytes, the bandwidth ceiling of any method. ``time_`` and
``peakmem_`` rows run posenc alone; the baselines run only inside ``track_`` ratios, timed
in turns with posenc (``out=`` over ``fill``, posenc over T5's code or the formula). The
peak memory is in units of the output (``tracemalloc``, which sees NumPy's allocations):
all lower is better, as asv assumes of every benchmark. Lengths 256 (a 4 MiB bias, in
the caches: the regression check's size) and a model-sized 2048 (256 MiB);
``python -m benchmarks.bias`` has 512, 2048 and 4096.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

import posenc as pe
from posenc import _dispatch

from posenc._oracles import t5_compute_bias

from .common import Benchmark, best_time, floor_ratio, interleaved_best, ratio, require

HEADS = 16
NUM_BUCKETS = 32
MAX_DISTANCE = 128
LENGTHS = [256, 2048]


def _distances(q_len, k_len):
    """``rel = i - j`` of per-distance entry ``t = i - j + k_len - 1`` (posenc's sign)."""
    return np.arange(q_len + k_len - 1) - (k_len - 1)


def posenc_t5(table, q_len, k_len, out=None):
    return pe.t5_bias(table, q_len, k_len, max_distance=MAX_DISTANCE, out=out)


def posenc_alibi(slopes, q_len, k_len, out=None):
    return pe.alibi_bias(slopes, q_len, k_len, out=out)


def alibi_naive_numpy(slopes, q_len, k_len):
    rel = np.arange(q_len, dtype=np.float32)[:, None] - np.arange(k_len, dtype=np.float32)[None, :]
    return -slopes[:, None, None] * rel


def peak_over(nbytes, fn):
    """Peak traced allocation while ``fn`` runs, in units of ``nbytes``."""
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / nbytes


class T5Bias(Benchmark):
    """16-head T5 bias ``[16, L, L]`` float32 (NumPy)."""

    params = [LENGTHS]
    param_names = ["length"]

    def make(self, n):
        self.table = np.random.default_rng(0).standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
        self.out = np.empty((HEADS, n, n), dtype=np.float32)

    def time_t5_posenc(self, n):
        posenc_t5(self.table, n, n)

    def time_t5_posenc_out(self, n):
        posenc_t5(self.table, n, n, out=self.out)

    def track_t5_out_time_over_fill(self, n):
        return floor_ratio(lambda: posenc_t5(self.table, n, n, out=self.out), lambda: self.out.fill(1.0))

    track_t5_out_time_over_fill.unit = "x fill time"

    def track_t5_peak_memory_over_output(self, n):
        return peak_over(self.out.nbytes, lambda: posenc_t5(self.table, n, n))

    track_t5_peak_memory_over_output.unit = "x output"


class T5VsOriginal(Benchmark):
    """posenc's ``t5_bias`` over T5's own ``compute_bias`` (torch), same table, in turns."""

    params = [LENGTHS]
    param_names = ["length"]

    def make(self, n):
        torch = require("torch")
        self.table = np.random.default_rng(0).standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
        embedding = torch.nn.Embedding.from_pretrained(torch.from_numpy(self.table))
        self.original = lambda: t5_compute_bias(torch, embedding, n, n)

    def track_t5_time_over_original_torch(self, n):
        return ratio(lambda: posenc_t5(self.table, n, n), self.original, repeat=3)

    track_t5_time_over_original_torch.unit = "x original time"


class AlibiBias(Benchmark):
    """16-head ALiBi bias ``[16, L, L]`` float32 (NumPy)."""

    params = [LENGTHS]
    param_names = ["length"]

    def make(self, n):
        self.slopes = pe.alibi_slopes(HEADS)
        self.out = np.empty((HEADS, n, n), dtype=np.float32)

    def time_alibi_posenc(self, n):
        posenc_alibi(self.slopes, n, n)

    def time_alibi_posenc_out(self, n):
        posenc_alibi(self.slopes, n, n, out=self.out)

    def track_alibi_out_time_over_fill(self, n):
        return floor_ratio(lambda: posenc_alibi(self.slopes, n, n, out=self.out), lambda: self.out.fill(1.0))

    track_alibi_out_time_over_fill.unit = "x fill time"

    def track_alibi_peak_memory_over_output(self, n):
        return peak_over(self.out.nbytes, lambda: posenc_alibi(self.slopes, n, n))

    track_alibi_peak_memory_over_output.unit = "x output"


class AlibiVsFormula(Benchmark):
    """posenc's ``alibi_bias`` over ``-slopes[:, None, None] * (i - j)`` in NumPy or torch eager, in turns."""

    params = [LENGTHS, ["numpy", "torch"]]
    param_names = ["length", "formula"]

    def make(self, n, formula):
        self.slopes = pe.alibi_slopes(HEADS)
        if formula == "numpy":
            self.formula = lambda: alibi_naive_numpy(self.slopes, n, n)
            return
        torch = require("torch")
        slopes = torch.from_numpy(self.slopes)

        def formula_torch():
            rel = torch.arange(n, dtype=torch.float32)[:, None] - torch.arange(n, dtype=torch.float32)[None, :]
            return -slopes[:, None, None] * rel

        self.formula = formula_torch

    def track_alibi_time_over_formula(self, n, formula):
        return ratio(lambda: posenc_alibi(self.slopes, n, n), self.formula, repeat=3)

    track_alibi_time_over_formula.unit = "x formula time"


class BiasPeakMemory:
    """Peak resident memory of one bias, in a process that did nothing else large.

    asv's ``peakmem_`` is the process's maximum resident size, setup included, so this
    class only warms the kernel on a tiny input. The ``[16, L, L]`` float32 output is
    4 MiB at 256 and 256 MiB at 2048.
    """

    params = [LENGTHS]
    param_names = ["length"]
    timeout = 120

    def setup(self, n):
        self.table = np.random.default_rng(0).standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
        self.slopes = pe.alibi_slopes(HEADS)
        posenc_t5(self.table, 4, 4)
        posenc_alibi(self.slopes, 4, 4)

    def peakmem_t5_posenc(self, n):
        posenc_t5(self.table, n, n)

    def peakmem_alibi_posenc(self, n):
        posenc_alibi(self.slopes, n, n)


class ShawGather(Benchmark):
    """Shaw's position term ``q_i . table[clip(i - j)]`` for 16 heads, ``d = 64``, ``K = 128``:
    posenc's Toeplitz gather of the ``[heads, q, 2K + 1]`` scores, on NumPy arrays or torch
    tensors; the ratio is over the ``einsum`` of ``q`` with the gathered ``[q, k, d]`` table
    in the same library."""

    params = [[512, 1024], ["numpy", "torch"]]
    param_names = ["length", "library"]

    def make(self, n, library):
        rng = np.random.default_rng(0)
        q = rng.standard_normal((HEADS, n, 64), dtype=np.float32)
        table = rng.standard_normal((2 * MAX_DISTANCE + 1, 64), dtype=np.float32)
        rel = np.arange(n)[:, None] - np.arange(n)[None, :]
        idx = np.clip(rel, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        index = np.clip(_distances(n, n), -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        if library == "torch":
            torch = require("torch")
            q, table, idx, index = (torch.from_numpy(a) for a in (q, table, idx, index))
            self.einsum = torch.einsum
        else:
            self.einsum = np.einsum
        self.q, self.table, self.idx, self.index = q, table, idx, index
        self.out = self._posenc(n)
        self.n = n

    def _posenc(self, n, out=None):
        scores = self.q @ self.table.T  # [heads, q, 2K + 1]: O(L) per head
        return _dispatch.call("toeplitz_gather", scores, self.index, n, out=out)

    def _naive(self):
        return self.einsum("hqd,qkd->hqk", self.q, self.table[self.idx])

    def time_shaw_posenc_gather(self, n, library):
        self._posenc(n)

    def time_shaw_posenc_gather_out(self, n, library):
        self._posenc(n, out=self.out)

    def track_shaw_time_over_einsum(self, n, library):
        return ratio(lambda: self._posenc(n), self._naive, repeat=3)

    track_shaw_time_over_einsum.unit = "x einsum time"


def _report(lengths=(512, 2048, 4096), repeat=7):
    """Best-of-``repeat`` table: ``cd asv_benchmarks && python -m benchmarks.bias``."""
    import torch

    rng = np.random.default_rng(0)
    table = rng.standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
    embedding = torch.nn.Embedding(NUM_BUCKETS, HEADS)
    embedding.requires_grad_(False)
    embedding.weight.copy_(torch.from_numpy(table))
    slopes = pe.alibi_slopes(HEADS)
    print("| L | op | posenc | posenc out= | baseline | fill | speedup vs baseline | out= / fill bandwidth | peak / output |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in lengths:
        out = np.empty((HEADS, n, n), dtype=np.float32)
        posenc_t5(table, 4, 4)
        check = min(n, 512)
        assert np.array_equal(posenc_t5(table, check, check), t5_compute_bias(torch, embedding, check, check).numpy())
        rows = [
            ("t5 vs original torch", lambda: posenc_t5(table, n, n), lambda: posenc_t5(table, n, n, out=out),
             lambda: t5_compute_bias(torch, embedding, n, n)),
            ("alibi vs naive numpy", lambda: posenc_alibi(slopes, n, n), lambda: posenc_alibi(slopes, n, n, out=out),
             lambda: alibi_naive_numpy(slopes, n, n)),
        ]
        for name, alloc, into, baseline in rows:
            t_alloc, t_out, fill = interleaved_best([alloc, into, lambda: out.fill(1.0)], repeat)
            t_base = best_time(baseline, 3)
            peak = peak_over(out.nbytes, alloc)
            print(f"| {n} | {name} | {t_alloc * 1e3:.1f} ms | {t_out * 1e3:.1f} ms | {t_base * 1e3:.1f} ms | "
                  f"{fill * 1e3:.1f} ms | {t_base / t_alloc:.1f}x | {fill / t_out:.2f} | {peak:.3f} |")
        del out
    for n in (512, 2048):
        bench = ShawGather()
        bench.make(n, "torch")
        naive = bench._naive()
        torch.testing.assert_close(bench._posenc(n), naive, rtol=1e-4, atol=1e-3)
        del naive
        t_alloc, t_out, fill = interleaved_best(
            [lambda: bench._posenc(n), lambda: bench._posenc(n, out=bench.out), lambda: bench.out.fill_(1.0)], repeat
        )
        t_base = best_time(bench._naive, 3)
        print(f"| {n} | shaw gather vs einsum torch | {t_alloc * 1e3:.1f} ms | {t_out * 1e3:.1f} ms | {t_base * 1e3:.1f} ms | "
              f"{fill * 1e3:.1f} ms | {t_base / t_alloc:.1f}x | {fill / t_out:.2f} | - |")

if __name__ == "__main__":
    _report()


class PerTokenVsFormula(Benchmark):
    """``t5_bias`` / ``alibi_bias`` with per-token positions (``[2, 16, 1024, 1024]`` float32,
    torch: a packed or padded batch's ``position_ids``) over the originals' formula on the same
    positions in torch eager (T5's bucket of ``key - query`` and its embedding lookup; ALiBi's
    ``-slopes * (query - key)``), in turns. posenc's rows are its Numba row kernel's, split over
    the threads from 4 MiB; ``time_`` the call alone."""

    params = [["t5", "alibi"]]
    param_names = ["bias"]
    length = 1024

    def make(self, bias):
        torch = require("torch")
        from posenc._oracles import t5_relative_position_bucket

        positions = torch.arange(self.length)[None].repeat(2, 1)
        rel = positions[:, None, :] - positions[:, :, None]  # key - query
        if bias == "t5":
            table = torch.from_numpy(np.random.default_rng(0).standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32))
            self.posenc = lambda: pe.t5_bias(table, self.length, self.length, max_distance=MAX_DISTANCE, query_positions=positions, key_positions=positions)
            self.formula = lambda: table[t5_relative_position_bucket(torch, rel, True, NUM_BUCKETS, MAX_DISTANCE)].permute(0, 3, 1, 2).contiguous()
        else:
            slopes = torch.from_numpy(pe.alibi_slopes(HEADS))
            self.posenc = lambda: pe.alibi_bias(slopes, self.length, self.length, query_positions=positions, key_positions=positions)
            self.formula = lambda: slopes[None, :, None, None] * rel[:, None].to(torch.float32)

    def time_per_token_posenc(self, bias):
        self.posenc()

    def track_per_token_time_over_formula_torch(self, bias):
        return ratio(self.posenc, self.formula, repeat=3)

    track_per_token_time_over_formula_torch.unit = "x formula time"
