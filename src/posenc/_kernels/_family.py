"""What every kernel family shares: specialisations built on first use, and the CPU threads.

A *family* is one kernel source compiled for several keys (say, the CPU rotation for
``("rotate", "bfloat16", "half")``): ``Family(name, build, keys)`` builds a key's kernel
the first time it is asked for, when Numba compiles it or loads it from its on-disk
cache, and keeps it. A build that takes longer than ``NOTICE_AFTER`` seconds (a compile,
not a cache load) is announced once, as a ``logging`` warning of the ``"posenc"``
logger, which reaches stderr when the application configured no logging. Every family
registers itself in ``FAMILIES``, which is what ``posenc.warmup`` walks.

The CPU kernels are serial ``nogil`` loops over a range of tasks; ``run_tasks`` splits
the range over a few threads. (Numba's ``parallel=True`` compiles the same loop in
several times the time: its parfor passes and gufunc wrapper were most of a 10 s first
call.)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger("posenc")

NOTICE_AFTER = 1.0  # seconds
FAMILIES: dict[str, Family] = {}
# Every build so far, as (family name, key, seconds): a compile takes about a second, a
# cache load milliseconds (``posenc demo`` marks the times that include one).
BUILDS: list[tuple[str, tuple, float]] = []


class Family:
    """Kernels ``build(*key)`` for every ``key`` in ``keys``, each built once, on first use.

    ``serves(key)``: the input dtype names a key's kernel handles (for ``warmup``).
    """

    def __init__(self, name, build, keys, serves):
        self.name, self.build, self.keys, self.serves = name, build, tuple(keys), serves
        self._built = {}
        self._lock = threading.Lock()
        FAMILIES[name] = self

    def __getitem__(self, key):
        kernel = self._built.get(key)
        return kernel if kernel is not None else self.get(key)

    def get(self, key, *, announce=True):
        """The kernel of ``key``, built now if it is not yet (announced if slow, unless told not to)."""
        with self._lock:
            if key not in self._built:
                what = f"{self.name}[{', '.join(map(str, key))}]"
                notice = threading.Timer(NOTICE_AFTER, _announce, (what,))
                notice.daemon = True
                start = time.perf_counter()
                if announce:
                    notice.start()
                try:
                    self._built[key] = self.build(*key)
                finally:
                    notice.cancel()
                BUILDS.append((self.name, key, time.perf_counter() - start))
        return self._built[key]


def _announce(what):
    logger.warning("posenc: compiling the Numba kernel %s (once: later runs load it from Numba's cache; `posenc warmup` compiles ahead)", what)


# ---------------------------------------------------------------- CPU threads

_pool = None
_pool_lock = threading.Lock()


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
    """``kernel(*args, first, last)`` over ``range(tasks)`` in contiguous pieces, one per worker.

    ``workers``: a number, or a list with the extra arguments of each worker (its scratch
    buffers), passed after ``args``. ``kernel`` is a ``nogil`` Numba function, so the
    pieces run at once; the calling thread runs the first piece itself.
    """
    extras = [()] * workers if isinstance(workers, int) else list(workers)
    count = max(1, min(len(extras), tasks))
    edges = [tasks * w // count for w in range(count + 1)]
    if count == 1:
        kernel(*args, *extras[0], 0, tasks)
        return
    pool = _executor(count - 1)
    pending = [pool.submit(kernel, *args, *extras[w], edges[w], edges[w + 1]) for w in range(1, count)]
    try:
        kernel(*args, *extras[0], edges[0], edges[1])
    finally:
        for future in pending:
            future.result()
