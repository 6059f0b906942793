"""How ``posenc bench`` times a row: ``timings`` of repeated calls, ``Case`` and ``Row``, ``_measure``.

Shared by the CPU table (``_bench``) and the GPU one (``_bench_gpu``), which imports this
module and not ``_bench`` (``_bench`` runs ``_bench_gpu`` for ``--gpu``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass
class Case:
    """One implementation of an operation: ``nbytes`` moved, whether ``vs framework`` applies,
    and against which case: ``against`` names the implementation of the row in the same dtype
    that is its baseline (default: the first case, a plain formula)."""

    impl: str
    fn: object
    nbytes: int
    dtype: str = "float32"
    comparable: bool = True
    bandwidth_row: bool = False
    against: str | None = None


@dataclass
class Row:
    op: str
    impl: str
    dtype: str
    seconds: float
    nbytes: int
    copy_rate: float | None = None
    plain_seconds: float | None = None
    median: float | None = None

    def cells(self):
        rate = self.nbytes / self.seconds
        frac = f"{rate / self.copy_rate:.2f}" if self.copy_rate else ""
        speed = f"{self.plain_seconds / self.seconds:.1f}x" if self.plain_seconds else ""
        median = f"{self.median * 1e3:.2f}" if self.median is not None else ""
        return [self.op, self.dtype, self.impl, f"{self.seconds * 1e3:.2f}", median, f"{rate / 1e9:.1f}", frac, speed]


def timings(fn, repeat, sync=lambda: None, calls=1):
    """Seconds a call of ``fn`` took in each of ``repeat`` samples after one warm-up call,
    sorted: a sample is ``calls`` calls back to back and then ``sync``, which waits for the
    device (GPU work is asynchronous; with several calls the host's work on the next one
    overlaps the device's on this one, as in a pipeline)."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return sorted(times)


def best(fn, repeat, sync=lambda: None, calls=1):
    """The best of ``timings``."""
    return timings(fn, repeat, sync, calls)[0]


def _measure(op, cases, repeat, progress, sync=lambda: None, calls=1, timer=None):
    """Time every case (best and median) by ``timings`` or, given, by ``timer(fn, repeat)``
    (sorted seconds a call, as ``timings``); ``vs framework`` is over the time of the case
    it names in ``against`` in its dtype, by default the first, a plain formula; ``of copy``
    over the rate of the first bandwidth row of its dtype in the same table (the figure that
    row prints; none where the dtype has no bandwidth row)."""
    assert "plain formula" in cases[0].impl
    rows = []
    for case in cases:
        progress(f"  {op}: {case.impl} ...")
        times = timer(case.fn, repeat) if timer else timings(case.fn, repeat, sync, calls)
        rows.append(Row(op, case.impl, case.dtype, times[0], case.nbytes, median=statistics.median(times)))
    found = {(row.impl, row.dtype): row for row in reversed(rows)}
    anchors = {}
    for case, row in zip(cases, rows):
        if case.bandwidth_row:
            anchors.setdefault(case.dtype, row.nbytes / row.seconds)
    for case, row in zip(cases, rows):
        row.copy_rate = None if case.bandwidth_row else anchors.get(case.dtype)
        base = found[(case.against, case.dtype)] if case.against else rows[0]
        row.plain_seconds = base.seconds if case.comparable and base is not row else None
    return rows
