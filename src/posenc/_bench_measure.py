"""How ``posenc bench`` times a row: ``best`` of repeated calls, ``Case`` and ``Row``, ``_measure``.

Shared by the CPU table (``_bench``) and the GPU one (``_bench_gpu``), which imports this
module and not ``_bench`` (``_bench`` runs ``_bench_gpu`` for ``--gpu``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Case:
    """One implementation of an operation: ``nbytes`` moved, and whether ``vs plain`` applies."""

    impl: str
    fn: object
    nbytes: int
    dtype: str = "float32"
    comparable: bool = True
    bandwidth_row: bool = False


@dataclass
class Row:
    op: str
    impl: str
    dtype: str
    seconds: float
    nbytes: int
    copy_rate: float | None = None
    plain_seconds: float | None = None

    def cells(self):
        rate = self.nbytes / self.seconds
        frac = f"{rate / self.copy_rate:.2f}" if self.copy_rate else ""
        speed = f"{self.plain_seconds / self.seconds:.1f}x" if self.plain_seconds else ""
        return [self.op, self.dtype, self.impl, f"{self.seconds * 1e3:.2f}", f"{rate / 1e9:.1f}", frac, speed]


def best(fn, repeat, sync=lambda: None):
    """The best of ``repeat`` timed calls of ``fn`` after one warm-up call; ``sync`` waits
    for the device (GPU work is asynchronous)."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def _measure(op, cases, copy_rate, repeat, progress, sync=lambda: None):
    """Time every case; the first, a plain formula, is the baseline of ``vs plain``."""
    assert "plain formula" in cases[0].impl
    rows = []
    for case in cases:
        progress(f"  {op}: {case.impl} ...")
        rows.append(Row(op, case.impl, case.dtype, best(case.fn, repeat, sync), case.nbytes))
    plain = rows[0].seconds
    for case, row in zip(cases, rows):
        row.copy_rate = None if case.bandwidth_row else copy_rate
        row.plain_seconds = plain if case.comparable and row is not rows[0] else None
    return rows
