"""One offset per batch row against the loop of one call per row, for ``t5_bias`` and ``alibi_bias``.

``python docs/rows_bench.py [close|far]`` prints, for NumPy float32/float16 and torch
float32/bfloat16 (one thread), 8 heads, and each ``rows x q_len x keys``, the best
per-call wall time of the call with ``offset`` an array of one offset per row, of the loop
of the same calls with each row's offset (a Python int), and of one of those calls, in
microseconds, and the first's ratio to the loop. ``close``: offsets 3 apart below ``keys -
q_len`` (caches of about one length); ``far``: 0, 100000, 200000, ...
"""

from __future__ import annotations

import sys
import timeit

import numpy as np

import posenc as pe

HEADS = 8
SHAPES = {"close": [(8, 1, 4096), (1, 1, 4096), (64, 1, 512), (64, 1, 8192), (8, 4, 4096), (8, 64, 512)], "far": [(8, 1, 4096), (64, 1, 512)]}


def best(fn):
    """Microseconds a call: the best of 5 rounds of about 30 ms."""
    fn(), fn(), fn()
    timer = timeit.Timer(fn)
    number = max(1, int(0.03 / max(timer.timeit(1), 1e-7)))
    return min(timer.repeat(5, number)) / number * 1e6


def main(spread="close"):
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("| arrays | call | rows x q_len x keys | per-row offsets (us) | loop of scalar calls | one scalar call | per-row / loop |")
    print("|---|---|---|---|---|---|---|")
    for library, dtype in [("torch", "float32"), ("torch", "bfloat16"), ("numpy", "float32"), ("numpy", "float16")]:
        table = rng.standard_normal((32, HEADS)).astype("float32")
        slopes = np.asarray(pe.alibi_slopes(HEADS), dtype="float32")
        if library == "torch":
            table, slopes, array = torch.from_numpy(table).to(getattr(torch, dtype)), torch.from_numpy(slopes).to(getattr(torch, dtype)), torch.from_numpy
        else:
            table, slopes, array = table.astype(dtype), slopes.astype(dtype), np.asarray
        for rows, q_len, keys in SHAPES[spread]:
            if spread == "close":
                offsets = np.arange(rows, dtype=np.int64) * 3 + keys - q_len - 3 * rows
            else:
                offsets = np.arange(rows, dtype=np.int64) * 100000
            per_row, ints = array(offsets), offsets.tolist()
            for name, call in (
                ("t5_bias", lambda offset: pe.t5_bias(table, q_len, keys, offset=offset)),
                ("alibi_bias", lambda offset: pe.alibi_bias(slopes, q_len, keys, offset=offset)),
            ):
                together = best(lambda: call(per_row))
                loop = best(lambda: [call(offset) for offset in ints])
                one = best(lambda: call(ints[0]))
                print(f"| {library} {dtype} | `{name}` | {rows} x {q_len} x {keys} | {together:.0f} | {loop:.0f} | {one:.0f} | {together / loop:.2f} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
