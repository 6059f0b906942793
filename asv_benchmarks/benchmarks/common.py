"""Shared base for posenc benchmarks.

What the rows are. ``time_`` and ``peakmem_`` rows run posenc's code and nothing else, so
a change in one of them is a change in posenc. The code posenc is compared with (the plain
formula in NumPy or torch eager, T5's own code, a copy or fill of the same bytes) runs only
inside ``track_`` ratios: posenc and the other code timed in turns in one process
(``interleaved_best``), posenc's time over the other's. A load that slows the machine slows
both sides of a ratio alike, and the other side's code is the same on every commit, so a
ratio that moves names posenc too; lower is better, as asv assumes of every row.

Libraries. posenc's own rows need only NumPy. A row on another library's arrays (torch,
JAX, CuPy) or against another library's code is a parameter or a class whose ``setup``
raises ``NotImplementedError`` where that library is missing, which asv reports as
skipped (``n/a``); ``setup_cache`` and ``teardown`` never raise for a missing library.

Sizes are ordinary parameters, recorded by asv with each result: a small shape and a
model-sized (prefill) one. ``setup`` makes the inputs and calls every timed function
once, so Numba compilation and first-call caches are never timed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time

import numpy as np

if importlib.util.find_spec("torch") is not None:
    # Imported with the suite, so asv's forkserver (``launch_method`` in asv.conf.json)
    # pays the ~2 s once instead of in every benchmark's process.
    import torch  # noqa: F401


def require(module: str):
    """The module, or ``NotImplementedError`` (asv: skipped) when it is not installed."""
    if importlib.util.find_spec(module) is None:
        raise NotImplementedError(f"{module} is not installed")
    return __import__(module)


def interleaved_best(fns, repeat: int = 7, seconds: float = 0.0, calls: int = 1) -> list:
    """Best time per call of each of ``fns``, timed in turns (one round times each ``calls``
    times), over at least ``repeat`` rounds and at least ``seconds`` of rounds: a load that
    comes and goes hits every one of them alike, so ratios between them stay fair. Each
    function is called once before the rounds (compilation, plans, caches)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    start, rounds = time.perf_counter(), 0
    while rounds < repeat or time.perf_counter() - start < seconds:
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t0) / calls)
        rounds += 1
    return best


def ratio(ours, theirs, repeat: int = 7, seconds: float = 0.0, calls: int = 1) -> float:
    """``ours``' best time over ``theirs``', timed in turns (``interleaved_best``)."""
    theirs_time, ours_time = interleaved_best([theirs, ours], repeat, seconds, calls)
    return ours_time / theirs_time


@contextlib.contextmanager
def one_thread():
    """posenc's kernels (Numba's thread count) and torch on one thread. The regression
    check's ratios run so: on a machine that other jobs load, a kernel on two threads
    waits for whichever runs last, and its time over a one-thread floor moves with
    the load (by 40 % between runs at load average 10), not with the code."""
    import numba

    torch = sys.modules.get("torch")
    before = numba.get_num_threads(), torch.get_num_threads() if torch else None
    numba.set_num_threads(1)
    if torch:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before[0])
        if torch:
            torch.set_num_threads(before[1])


def floor_ratio(ours, floor, seconds: float = 2.0, calls: int = 1) -> float:
    """A regression-check row: ``ours``' best time over ``floor``'s, both on one thread
    (``one_thread``), timed in turns for at least ``seconds`` (short rounds of ``calls``
    calls, so that many rounds run undisturbed on a loaded machine, and the best of each
    side is one of those)."""
    with one_thread():
        return ratio(ours, floor, repeat=20, seconds=seconds, calls=calls)


def best_time(fn, repeat: int = 5) -> float:
    return interleaved_best([fn], repeat)[0]


def shape(text: str) -> tuple:
    """``"1x8x256x128"`` -> ``(1, 8, 256, 128)``."""
    return tuple(int(n) for n in text.split("x"))


class Benchmark:
    """Base: subclasses set ``params``/``param_names`` and implement ``make``.

    ``repeat`` keeps at least 5 samples in each of 2 rounds, so the decode-step rows mean
    something under ``--quick`` too (asv's quick mode takes one sample of every row)."""

    timeout = 180
    warmup_time = 0.2
    rounds = 2
    repeat = (5, 20, 10.0)
    min_run_count = 5

    def __init_subclass__(cls, **kwargs):
        # A ``track_`` row's value is one number (asv keeps the last round's): one round,
        # which does its own rounds in turns.
        super().__init_subclass__(**kwargs)
        for name, fn in vars(cls).items():
            if name.startswith("track_"):
                fn.rounds = getattr(fn, "rounds", 1)

    def setup(self, *params):
        self.make(*params)
        for name in dir(self):
            if name.startswith("time_"):  # every timed row is posenc's: compile and plan it here
                getattr(self, name)(*params)

    def make(self, *params):  # pragma: no cover - overridden
        raise NotImplementedError


def floor_copy(like):
    """``np.copyto`` of NumPy array ``like``'s bytes into a second buffer: the time of one read and one
    write of them, the floor of a pass over ``like``."""
    target = np.empty_like(like)
    return lambda: np.copyto(target, like)
