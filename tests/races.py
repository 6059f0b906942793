"""A race detector for posenc's CUDA kernels, run as Python with one thread per CUDA thread.

Numba's simulator runs a block's threads as Python threads too, but whether a missing
barrier shows depends on when the interpreter switches threads: a race can pass there and
corrupt results on a GPU. Here the answer does not depend on the schedule: every access to a
shared array is recorded with its thread and the count of barriers that thread has passed
(its epoch), and two accesses to one element in one epoch by two threads, one a write, are a
``Race``; so are two writes of one element of a global output (``Tracked(..., shared=False)``)
by two threads of any blocks. ``run`` launches a kernel whose module's ``cuda`` is ``FAKE``.
"""

from __future__ import annotations

import itertools
import threading
import types

import numpy as np


class Race(AssertionError):
    """Two threads' accesses to one element with no barrier between them, one a write."""


_here = threading.local()  # the running CUDA thread: .block, .t, .epoch, .shared_calls


class Tracked:
    """``array`` whose accesses are recorded: every one for a shared array, writes for a global one."""

    def __init__(self, array, *, shared):
        self.a, self.shared, self.shape = array, shared, array.shape
        self._log, self._lock = {}, threading.Lock()

    def _touch(self, k, op):
        key = tuple([int(v) for v in k]) if isinstance(k, tuple) else int(k)
        who, epoch = (_here.block.idx, _here.t), _here.epoch if self.shared else 0
        with self._lock:
            seen = self._log.setdefault(key, set())
            for e, other_who, other in seen:
                if other_who != who and e == epoch and "w" in (op, other):
                    kind = "shared" if self.shared else "global"
                    raise Race(f"{kind} element {key}: block, thread {who} {op} and {other_who} {other}, {e} barriers passed")
            seen.add((epoch, who, op))

    def __getitem__(self, k):
        if self.shared:
            self._touch(k, "r")
        return self.a[k]

    def __setitem__(self, k, v):
        self._touch(k, "w")
        self.a[k] = v


class _Block:
    def __init__(self, idx, dim, grid):
        self.idx, self.dim, self.grid = idx, dim, grid
        self.barrier = threading.Barrier(dim[0] * dim[1] * dim[2], timeout=60)
        self.shared, self.lock, self.votes = [], threading.Lock(), {}


class _Dim:
    def __init__(self, get):
        self._get = get

    x = property(lambda self: self._get()[0])
    y = property(lambda self: self._get()[1])
    z = property(lambda self: self._get()[2])


def _shared_array(shape, dtype):
    """The block's ``n``-th shared array for a thread's ``n``-th call (the same for every thread)."""
    b, n = _here.block, _here.shared_calls
    _here.shared_calls += 1
    with b.lock:
        while len(b.shared) <= n:
            b.shared.append(Tracked(np.zeros(shape, np.dtype(str(dtype))), shared=True))
    return b.shared[n]


def _syncthreads():
    _here.block.barrier.wait()
    _here.epoch += 1


def _syncthreads_and(predicate):
    b, epoch = _here.block, _here.epoch
    with b.lock:
        b.votes.setdefault(epoch, []).append(bool(predicate))
    b.barrier.wait()
    _here.epoch += 1
    return 1 if all(b.votes[epoch]) else 0


FAKE = types.SimpleNamespace(
    threadIdx=_Dim(lambda: _here.t),
    blockIdx=_Dim(lambda: _here.block.idx),
    blockDim=_Dim(lambda: _here.block.dim),
    gridDim=_Dim(lambda: _here.block.grid),
    shared=types.SimpleNamespace(array=_shared_array),
    syncthreads=_syncthreads,
    syncthreads_and=_syncthreads_and,
    grid=lambda ndim: _here.block.idx[0] * _here.block.dim[0] + _here.t[0],
)


def python(function):
    """The Python function of a numba CUDA device function (a GPU's dispatcher or the simulator's)."""
    return getattr(function, "py_func", None) or function.fn


def _three(v):
    return (*v, 1, 1)[:3] if isinstance(v, tuple) else (v, 1, 1)


def run(kernel, grid, block, args):
    """``kernel[grid, block](*args)``, a block at a time, its threads as Python threads; raises ``Race``."""
    grid, block = _three(grid), _three(block)
    for bz, by, bx in itertools.product(*[range(n) for n in grid[::-1]]):
        b, errors = _Block((bx, by, bz), block, grid), []

        def body(t, b=b, errors=errors):
            _here.block, _here.t, _here.epoch, _here.shared_calls = b, t, 0, 0
            try:
                kernel(*args)
            except BaseException as exc:  # noqa: BLE001  (raised below, a race first)
                errors.append(exc)
                b.barrier.abort()

        threads = [threading.Thread(target=body, args=((x, y, z),)) for z, y, x in itertools.product(*[range(n) for n in block[::-1]])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for exc in sorted(errors, key=lambda e: not isinstance(e, Race)):
            raise exc
