"""Shared base for posenc benchmarks.

Benchmarks parametrise over implementations and put posenc beside the plain formula in
NumPy and in torch eager. ``setup`` makes the inputs and calls the timed function once, so
Numba compilation and first-call caches are never timed. A missing optional library
raises ``NotImplementedError`` in ``setup``, which asv reports as skipped.

Sizes: by default every benchmark runs on small shapes, so ``asv run --quick`` finishes in a
few minutes on a 2-core machine; ``POSENC_ASV_LARGE=1`` adds the model-sized shapes (up to
``4x32x8192x128``), for the numbers quoted in ``docs/benchmarks.md``.

Timing settings: on a shared, noisy 2-core machine a single sample is noise. ``Benchmark``
takes several samples in two rounds after a warm-up, and ``make bench-continuous`` runs
``asv continuous`` with interleaved rounds (both commits see the same load) and a 1.5x
factor, which the plain-NumPy baselines (identical code on both sides) stay within.
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np

LARGE = os.environ.get("POSENC_ASV_LARGE", "") not in ("", "0")

if importlib.util.find_spec("torch") is not None:
    # Imported with the suite, so asv's forkserver (``launch_method`` in asv.conf.json)
    # pays the ~2 s once instead of in every benchmark's process.
    import torch  # noqa: F401


def sizes(small: list, large: list) -> list:
    """``small``, plus ``large`` when ``POSENC_ASV_LARGE`` is set."""
    return small + large if LARGE else small


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


def interleaved_best(fns, repeat: int = 7) -> list:
    """Best time of each of ``fns``, timed in turns (one round times each once), so the load
    of a shared machine hits every one of them alike: ratios between them stay fair."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


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
    warmup_time = 0.2
    rounds = 2
    repeat = (3, 10, 10.0)
    min_run_count = 3

    def setup(self, *params):
        self.make(*params)
        self.warm_up(*params)

    def make(self, *params):  # pragma: no cover - overridden
        raise NotImplementedError

    def warm_up(self, *params):
        """Call every posenc variant once: Numba compiles or loads its kernels here."""
        for name in dir(self):
            if name.startswith("time_") and "posenc" in name:
                getattr(self, name)(*params)
