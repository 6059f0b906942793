"""How kernels walk their arrays: one axis-merging rule, the rotary ``(G, H, S)`` plan, and the CPU threads.

Adjacent batch axes *merge* when every array steps through them as through one axis
(``_merged``). The Toeplitz kernels take their batch axes merged into one
(``batch_views``); the rotary kernels regroup them as below. The CPU kernels are serial
``nogil`` loops over a range of tasks (blocks of rows), and ``run_tasks`` splits the
range over a few threads. (Numba's ``parallel=True`` compiles the same loop in several
times the time: its parfor passes and gufunc wrapper were most of a 10 s first call.)

A rotary kernel walks the rows of ``x`` (every index of ``x.shape[:-1]``). Rows that share
one position (or one ``cos``/``sin`` row) should share one computation of the angles, so
the batch axes are regrouped as

* ``H``: the largest axis along which the per-position arrays (positions, or cos and sin)
  do not change, i.e. have stride 0 once broadcast (heads, usually);
* ``S`` and ``G``: two more axes, any strides (sequence and batch, usually);
* ``outer``: whatever else does not merge into those, looped over by the launcher.

Adjacent axes merge when every array steps through them as through one axis, so the
common layouts (``[B, H, S, D]`` with positions ``[S]``, ``[B, 1, S]`` or per token) need
no outer loop. Strides are in elements and may be negative or zero. Nothing here touches
data but ``batch_views`` and ``rotary_views``, which build views (``_arrays.strided``).
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from . import _arrays


class Axis(NamedTuple):
    size: int
    strides: tuple  # one stride (in elements) per array
    dims: tuple = ()  # the original axes it stands for


class Plan(NamedTuple):
    outer: tuple  # Axis, ...
    g: Axis
    h: Axis
    s: Axis

    # (List comprehensions, not generators: the CUDA launchers' host work is the same
    # count of Python calls whatever the number of axes, tests/test_cuda_host_work.py.)
    def shape(self):
        return tuple([a.size for a in self.outer]) + (self.g.size, self.h.size, self.s.size)

    def strides(self, array):
        """Strides (in elements) of array number ``array`` over ``outer + (G, H, S)``."""
        return tuple([a.strides[array] for a in (*self.outer, self.g, self.h, self.s)])


def _merged(axes):
    """``axes`` (outer first) with each run of axes that every array steps through as one axis made one."""
    merged = []
    for axis in axes:
        if merged:
            prev = merged[-1]
            if all(p == s * axis.size for p, s in zip(prev.strides, axis.strides)):
                merged[-1] = Axis(prev.size * axis.size, axis.strides, prev.dims + axis.dims)
                continue
        merged.append(axis)
    return merged


@lru_cache(maxsize=256)
def plan(shape, strides, shared):
    """Group batch axes ``shape`` of arrays with ``strides`` (a tuple per array; all tuples,
    the plan is cached: a decoding loop asks for the same one every step).

    ``shared``: indices of the per-position arrays, whose stride must be 0 along ``H``.
    """
    count = len(strides)
    axes = _merged(_axes(shape, strides))
    unit = Axis(1, (0,) * count)
    candidates = [a for a in axes if all(a.strides[i] == 0 for i in shared)]
    h = max(candidates, key=lambda a: a.size, default=unit)
    rest = [a for a in axes if a is not h]
    # S: the axis with the smallest step through x (array 0), so a block of S rows is
    # close in memory; G: the largest of the others; the remaining ones loop outside.
    s = min(rest, key=lambda a: abs(a.strides[0]), default=unit)
    rest = [a for a in rest if a is not s]
    g = max(rest, key=lambda a: a.size, default=unit)
    outer = tuple(a for a in rest if a is not g)
    return Plan(outer, g, h, s)


def rotary_views(x, out, per_position):
    """The plan of a rotary kernel and its per-position arrays as the kernel reads them.

    ``x`` and ``out`` are NumPy or numba device arrays with the channels last;
    ``per_position`` are arrays broadcast to ``x.shape[:-1] + (trailing...)``, shared over
    ``H``. Returns ``(plan, views)``: each per-position array viewed as
    ``outer + (G, S) + trailing`` (``H`` dropped: their stride along it is 0).
    """
    lead = len(x.shape) - 1
    arrays = [x, out, *per_position]
    found = plan(tuple(x.shape[:lead]), tuple(_arrays.element_strides(a)[:lead] for a in arrays), tuple(range(2, len(arrays))))
    shape = found.shape()
    views = []
    for k, a in enumerate(per_position, start=2):
        st = found.strides(k)
        views.append(_arrays.strided(a, shape[:-2] + (shape[-1],) + tuple(a.shape[lead:]), st[:-2] + (st[-1],) + _arrays.element_strides(a)[lead:]))
    return found, views


def _axes(shape, strides):
    """The axes of ``shape`` longer than one, with the ``strides`` of each array along them."""
    return [Axis(int(n), tuple(int(st[k]) for st in strides), (k,)) for k, n in enumerate(shape) if n != 1]


def batch_views(arrays, lead):
    """Views of non-empty ``arrays`` (NumPy or numba device arrays sharing their first ``lead``
    axes) with those axes as one: one tuple of views per index of the axes that do not
    merge (a single tuple when every batch axis merges)."""
    shape = tuple(int(n) for n in arrays[0].shape[:lead])
    steps = [_arrays.element_strides(a) for a in arrays]
    axes = _merged(_axes(shape, steps))
    batch = axes[-1] if axes else Axis(1, (0,) * len(arrays))
    outer = [k for axis in axes[:-1] for k in axis.dims]
    for values in np.ndindex(*(shape[k] for k in outer)):
        at = dict(zip(outer, values))
        index = tuple(at.get(k, 0) for k in range(lead))
        yield tuple(
            _arrays.strided(a[index], (batch.size, *a.shape[lead:]), (batch.strides[n], *steps[n][lead:]))
            for n, a in enumerate(arrays)
        )


_pool = None
_pool_lock = threading.Lock()


def _forget_pool():
    """In a forked child: no pool (the parent's has no threads here, and would never run a
    task given to it) and a lock no parent thread holds."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forget_pool)


def threads() -> int:
    """Threads the CPU kernels may use: Numba's setting (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``), read without starting Numba's own thread pool."""
    import numba

    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and parallel._is_initialized:
        return numba.get_num_threads()
    return numba.config.NUMBA_NUM_THREADS


def _executor(workers):
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers:
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="posenc")
        return _pool


def run_tasks(kernel, args, tasks, workers):
    """``kernel(*args, first, last)`` over ``range(tasks)`` in contiguous pieces, one per worker;
    the list of what each piece returned, in order.

    ``workers``: a number, or a list with the extra arguments of each worker (its scratch
    buffers), passed after ``args``. ``kernel`` is a ``nogil`` Numba function, so the
    pieces run at once; the calling thread runs the first piece itself, and the pieces the
    pool refuses: once the interpreter has begun to exit (a thread still serving calls
    while the main thread has returned), ``concurrent.futures`` takes no new work.
    """
    extras = [()] * workers if isinstance(workers, int) else list(workers)
    count = max(1, min(len(extras), tasks))
    edges = [tasks * w // count for w in range(count + 1)]
    if count == 1:
        return [kernel(*args, *extras[0], 0, tasks)]
    pool = _executor(count - 1)
    pending = []
    try:
        for w in range(1, count):
            try:
                pending.append(pool.submit(kernel, *args, *extras[w], edges[w], edges[w + 1]))
            except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
                break
        mine = (0, *range(len(pending) + 1, count))
        ran = [kernel(*args, *extras[w], edges[w], edges[w + 1]) for w in mine]
    finally:
        rest = [future.result() for future in pending]
    return [ran[0], *rest, *ran[1:]]
