"""Shared base for posenc benchmarks.

Benchmarks parametrise over implementations and put posenc beside the plain formula in
NumPy and in torch eager. ``setup`` makes the inputs and calls the timed function once, so
Numba compilation and first-call caches are never timed. A missing optional library
raises ``NotImplementedError`` in ``setup``, which asv reports as skipped.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np


def require(module: str):
    if importlib.util.find_spec(module) is None:
        raise NotImplementedError(f"{module} is not installed")
    return __import__(module)


def copy_bandwidth(nbytes: int, repeat: int = 5) -> float:
    """Bytes per second of ``np.copyto`` reading and writing ``nbytes`` each (best of ``repeat``)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def best_time(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class Benchmark:
    """Base: subclasses set ``params``/``param_names`` and implement ``make``."""

    timeout = 120

    def setup(self, *params):
        self.make(*params)
        self.warm_up(*params)

    def make(self, *params):  # pragma: no cover - overridden
        raise NotImplementedError

    def warm_up(self, *params):
        for name in dir(self):
            if name.startswith("time_"):
                getattr(self, name)(*params)
