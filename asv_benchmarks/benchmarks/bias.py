"""Relative biases: the Toeplitz expand/gather kernels against the models' own formulas.

Every bias is a function of ``i - j``: posenc computes its ``[heads, q + k - 1]``
per-distance vector once (``O(L)``) and expands it with one write pass over the
``[heads, q, k]`` output. The baselines are the formulas as the original code writes them
(T5's bucket on the full ``[q, k]`` relative matrix, an embedding lookup and a permute;
ALiBi's ``-slopes[:, None, None] * rel``; Shaw's ``einsum`` over ``table[idx]``), and a
plain ``fill`` of the output's bytes, the bandwidth ceiling of any method. ``track_``
methods give times as multiples of a baseline's (``out=`` over ``fill``, posenc over T5's
code) and the peak memory in units of the output (``tracemalloc``, which sees NumPy's
allocations): all lower is better, as asv assumes of every benchmark.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

import posenc as pe
from posenc import _dispatch

from posenc._oracles import t5_compute_bias

from .common import Benchmark, best_time, interleaved_best, require, sizes

HEADS = 16
NUM_BUCKETS = 32
MAX_DISTANCE = 128
LENGTHS = sizes([512], [2048, 4096])


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
    """16-head T5 bias ``[16, L, L]`` float32."""

    params = [LENGTHS]
    param_names = ["length"]

    def make(self, n):
        self.torch = require("torch")
        rng = np.random.default_rng(0)
        self.table = rng.standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
        self.embedding = self.torch.nn.Embedding(NUM_BUCKETS, HEADS)
        self.embedding.requires_grad_(False)
        self.out = np.empty((HEADS, n, n), dtype=np.float32)

    def time_t5_posenc(self, n):
        posenc_t5(self.table, n, n)

    def time_t5_posenc_out(self, n):
        posenc_t5(self.table, n, n, out=self.out)

    def time_t5_compute_bias(self, n):
        t5_compute_bias(self.torch, self.embedding, n, n)

    def time_t5_plain_fill(self, n):
        self.out.fill(1.0)

    def track_t5_out_time_over_fill(self, n):
        fill, posenc = interleaved_best([lambda: self.out.fill(1.0), lambda: posenc_t5(self.table, n, n, out=self.out)], 5)
        return posenc / fill

    track_t5_out_time_over_fill.unit = "x fill time"

    def track_t5_time_over_original_torch(self, n):
        original = best_time(lambda: t5_compute_bias(self.torch, self.embedding, n, n), repeat=3)
        return best_time(lambda: posenc_t5(self.table, n, n)) / original

    track_t5_time_over_original_torch.unit = "x original time"

    def track_t5_peak_memory_over_output(self, n):
        return peak_over(self.out.nbytes, lambda: posenc_t5(self.table, n, n))

    track_t5_peak_memory_over_output.unit = "x output"


class AlibiBias(Benchmark):
    """16-head ALiBi bias ``[16, L, L]`` float32."""

    params = [LENGTHS]
    param_names = ["length"]

    def make(self, n):
        self.torch = require("torch")
        self.slopes = pe.alibi_slopes(HEADS)
        self.slopes_torch = self.torch.from_numpy(self.slopes)
        self.out = np.empty((HEADS, n, n), dtype=np.float32)

    def time_alibi_posenc(self, n):
        posenc_alibi(self.slopes, n, n)

    def time_alibi_posenc_out(self, n):
        posenc_alibi(self.slopes, n, n, out=self.out)

    def time_alibi_naive_numpy(self, n):
        alibi_naive_numpy(self.slopes, n, n)

    def time_alibi_naive_torch(self, n):
        torch = self.torch
        rel = torch.arange(n, dtype=torch.float32)[:, None] - torch.arange(n, dtype=torch.float32)[None, :]
        -self.slopes_torch[:, None, None] * rel

    def time_alibi_plain_fill(self, n):
        self.out.fill(1.0)

    def track_alibi_out_time_over_fill(self, n):
        fill, posenc = interleaved_best([lambda: self.out.fill(1.0), lambda: posenc_alibi(self.slopes, n, n, out=self.out)], 5)
        return posenc / fill

    track_alibi_out_time_over_fill.unit = "x fill time"

    def track_alibi_peak_memory_over_output(self, n):
        return peak_over(self.out.nbytes, lambda: posenc_alibi(self.slopes, n, n))

    track_alibi_peak_memory_over_output.unit = "x output"

    def track_alibi_naive_peak_memory_over_output(self, n):
        return peak_over(self.out.nbytes, lambda: alibi_naive_numpy(self.slopes, n, n))

    track_alibi_naive_peak_memory_over_output.unit = "x output"


class BiasPeakMemory:
    """Peak resident memory of one bias, in a process that did nothing else large.

    asv's ``peakmem_`` is the process's maximum resident size, setup included, so this
    class only warms the kernel on a tiny input. The ``[16, L, L]`` float32 output is
    16 MiB at 512, 64 MiB at 1024 and 256 MiB at 2048.
    """

    params = [sizes([512], [1024, 2048])]
    param_names = ["length"]
    timeout = 120

    def setup(self, n):
        self.torch = require("torch")
        self.table = np.random.default_rng(0).standard_normal((NUM_BUCKETS, HEADS)).astype(np.float32)
        self.embedding = self.torch.nn.Embedding(NUM_BUCKETS, HEADS)
        self.embedding.requires_grad_(False)
        self.slopes = pe.alibi_slopes(HEADS)
        posenc_t5(self.table, 4, 4)

    def peakmem_t5_posenc(self, n):
        posenc_t5(self.table, n, n)

    def peakmem_t5_compute_bias(self, n):
        t5_compute_bias(self.torch, self.embedding, n, n)

    def peakmem_alibi_posenc(self, n):
        posenc_alibi(self.slopes, n, n)

    def peakmem_alibi_naive_numpy(self, n):
        alibi_naive_numpy(self.slopes, n, n)


class ShawGather(Benchmark):
    """Shaw's position term ``q_i . table[clip(i - j)]`` for 16 heads, ``d = 64``, ``K = 128``."""

    params = [sizes([512], [2048])]
    param_names = ["length"]

    def make(self, n):
        torch = self.torch = require("torch")
        gen = torch.Generator().manual_seed(0)
        self.q = torch.randn(HEADS, n, 64, generator=gen)
        self.table = torch.randn(2 * MAX_DISTANCE + 1, 64, generator=gen)
        rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        self.idx = torch.clamp(rel, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        self.index = torch.clamp(torch.from_numpy(_distances(n, n)), -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        self.out = torch.empty(HEADS, n, n)

    def _posenc(self, n, out=None):
        scores = self.q @ self.table.T  # [heads, q, 2K + 1]: O(L) per head
        return _dispatch.call("toeplitz_gather", scores, self.index, n, out=out)

    def time_shaw_posenc_gather(self, n):
        self._posenc(n)

    def time_shaw_posenc_gather_out(self, n):
        self._posenc(n, out=self.out)

    def time_shaw_naive_einsum_torch(self, n):
        self.torch.einsum("hqd,qkd->hqk", self.q, self.table[self.idx])

    def time_shaw_plain_fill(self, n):
        self.out.fill_(1.0)


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
        bench.make(n)
        naive = bench.torch.einsum("hqd,qkd->hqk", bench.q, bench.table[bench.idx])
        torch.testing.assert_close(bench._posenc(n), naive, rtol=1e-4, atol=1e-3)
        del naive
        t_alloc, t_out, fill = interleaved_best(
            [lambda: bench._posenc(n), lambda: bench._posenc(n, out=bench.out), lambda: bench.out.fill_(1.0)], repeat
        )
        t_base = best_time(lambda: bench.torch.einsum("hqd,qkd->hqk", bench.q, bench.table[bench.idx]), 3)
        print(f"| {n} | shaw gather vs einsum torch | {t_alloc * 1e3:.1f} ms | {t_out * 1e3:.1f} ms | {t_base * 1e3:.1f} ms | "
              f"{fill * 1e3:.1f} ms | {t_base / t_alloc:.1f}x | {fill / t_out:.2f} | - |")


if __name__ == "__main__":
    _report()
