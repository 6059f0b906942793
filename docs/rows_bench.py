"""One offset per batch row against the loop of one call per row.

``python docs/rows_bench.py [close|far] [biases|logits]`` prints, for NumPy float32/float16
and torch float32/bfloat16 (one thread), 8 heads, and each ``rows x q_len x keys``, the best
per-call time of the call with ``offset`` an array of one offset per row, of the loop of
one call per row with its offset (a Python int), and of one call of one offset, in
microseconds, and the first's ratio to the loop (biases: wall time; logits: process CPU
time, steadier on a loaded machine, NumPy's BLAS on one thread too). ``close``: offsets 3 apart below ``keys -
q_len`` (caches of about one length); ``far``: 0, 100000, 200000, ...

``biases``: ``t5_bias`` and ``alibi_bias`` (the loop's calls are the rows' biases).
``logits``: ``shaw_logits`` (``d = 64``, ``K = 64``) and ``deberta_logits`` (``d = 64``,
DeBERTa-v3's ``K = 256``, 256 buckets up to 512; both terms, or ``c2p`` alone), ``q [rows,
heads, q_len, d]`` and ``k [rows, heads, keys, d]``: the loop's calls are each row's ``q``
and ``k`` alone (``q[b:b + 1]``), the one call the whole batch's of one offset.
"""

from __future__ import annotations

import os
import sys
import time
import timeit

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (before NumPy loads its BLAS)

import numpy as np  # noqa: E402

import posenc as pe  # noqa: E402

HEADS = 8
SHAPES = {"close": [(8, 1, 4096), (1, 1, 4096), (64, 1, 512), (64, 1, 8192), (8, 4, 4096), (8, 64, 512)], "far": [(8, 1, 4096), (64, 1, 512)]}
LOGITS = {
    "close": [
        ("shaw_logits", (8, 1, 2048)), ("shaw_logits", (1, 1, 4096)), ("shaw_logits", (64, 1, 512)), ("shaw_logits", (64, 1, 8192)),
        ("shaw_logits", (8, 4, 4096)), ("shaw_logits", (8, 8, 512)), ("deberta_logits", (8, 1, 512)), ("deberta_logits", (1, 1, 512)),
        ("deberta_logits c2p", (8, 1, 4096)), ("deberta_logits c2p", (64, 1, 512)),
    ],
    "far": [("shaw_logits", (8, 1, 4096)), ("shaw_logits", (64, 1, 512)), ("deberta_logits c2p", (8, 1, 4096))],
}  # fmt: skip


def best(fn, clock=time.perf_counter):
    """Microseconds a call: the best of 5 rounds of about 30 ms."""
    fn(), fn(), fn()
    timer = timeit.Timer(fn, timer=clock)
    number = max(1, int(0.03 / max(timer.timeit(1), 1e-7)))
    return min(timer.repeat(5, number)) / number * 1e6


def offsets_of(spread, rows, q_len, keys):
    if spread == "close":
        return np.arange(rows, dtype=np.int64) * 3 + keys - q_len - 3 * rows
    return np.arange(rows, dtype=np.int64) * 100000


def libraries():
    import torch

    torch.set_num_threads(1)
    for library, dtype in [("torch", "float32"), ("torch", "bfloat16"), ("numpy", "float32"), ("numpy", "float16")]:
        if library == "torch":
            yield library, dtype, lambda a, dtype=dtype: torch.from_numpy(a).to(getattr(torch, dtype)), torch.from_numpy
        else:
            yield library, dtype, lambda a, dtype=dtype: a.astype(dtype), np.asarray


def row(library, dtype, name, shape, together, loop, one):
    rows, q_len, keys = shape
    print(f"| {library} {dtype} | `{name}` | {rows} x {q_len} x {keys} | {together:.0f} | {loop:.0f} | {one:.0f} | {together / loop:.2f} |", flush=True)


def biases(spread):
    rng = np.random.default_rng(0)
    for library, dtype, floats, integers in libraries():
        table, slopes = floats(rng.standard_normal((32, HEADS)).astype("float32")), floats(np.asarray(pe.alibi_slopes(HEADS), dtype="float32"))
        for rows, q_len, keys in SHAPES[spread]:
            offsets = offsets_of(spread, rows, q_len, keys)
            per_row, ints = integers(offsets), offsets.tolist()
            for name, call in (
                ("t5_bias", lambda offset: pe.t5_bias(table, q_len, keys, offset=offset)),
                ("alibi_bias", lambda offset: pe.alibi_bias(slopes, q_len, keys, offset=offset)),
            ):
                together = best(lambda: call(per_row))
                loop = best(lambda: [call(offset) for offset in ints])
                row(library, dtype, name, (rows, q_len, keys), together, loop, best(lambda: call(ints[0])))


def logits(spread):
    rng = np.random.default_rng(0)
    for library, dtype, floats, integers in libraries():
        shaw_table = floats(rng.standard_normal((129, 64)).astype("float32"))
        pos_q, pos_k = (floats(rng.standard_normal((HEADS, 512, 64)).astype("float32")) for _ in range(2))
        for name, (rows, q_len, keys) in LOGITS[spread]:
            q, k = (floats(rng.standard_normal((rows, HEADS, n, 64)).astype("float32")) for n in (q_len, keys))
            if name == "shaw_logits":
                call = lambda q, k, offset: pe.shaw_logits(q, k, shaw_table, max_distance=64, offset=offset)  # noqa: E731
            else:
                terms = ("c2p",) if name.endswith("c2p") else ("c2p", "p2c")
                call = lambda q, k, offset, terms=terms: pe.deberta_logits(  # noqa: E731
                    q, k, pos_q, pos_k, max_distance=256, bucket_size=256, max_position=512, terms=terms, offset=offset
                )
            offsets = offsets_of(spread, rows, q_len, keys)
            per_row, ints = integers(offsets), offsets.tolist()
            together = best(lambda: call(q, k, per_row), time.process_time)
            loop = best(lambda: [call(q[b : b + 1], k[b : b + 1], offset) for b, offset in enumerate(ints)], time.process_time)
            row(library, dtype, name, (rows, q_len, keys), together, loop, best(lambda: call(q, k, ints[0]), time.process_time))


def main(spread="close", which="biases"):
    print("| arrays | call | rows x q_len x keys | per-row offsets (us) | loop of scalar calls | one scalar call | per-row / loop |")
    print("|---|---|---|---|---|---|---|")
    {"biases": biases, "logits": logits}[which](spread)


if __name__ == "__main__":
    main(*sys.argv[1:])
