"""What every kernel family shares: one specialisation per key, built on first use.

A *family* is one kernel source compiled for several keys (say, the CPU rotation for
``("rotate", "bfloat16", "half")``): ``family[key]`` is the key's kernel, built the first
time it is asked for, when Numba compiles it or loads it from its on-disk cache, and kept
(a ``Family`` is a dict: a built kernel costs one dict lookup). A build that takes longer
than ``NOTICE_AFTER`` seconds (a compile, not a cache load) is announced once, as a
``logging`` warning of the ``"posenc"`` logger, which reaches stderr when the
application configured no logging. Every family registers itself in ``FAMILIES``, which
is what ``posenc.warmup`` walks. All four families (rotary and Toeplitz, CPU and CUDA)
are specialised this one way.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("posenc")

NOTICE_AFTER = 1.0  # seconds
FAMILIES: dict[str, Family] = {}
# Every build so far, as (family name, key, seconds): a compile takes one or two seconds, a
# cache load milliseconds (``posenc demo`` marks the times that include one).
BUILDS: list[tuple[str, tuple, float]] = []


class Family(dict):
    """Kernels ``build(*key)`` for every ``key`` in ``keys``, each built once, on first use.

    ``serves(key)``: the input dtype names a key's kernel handles (for ``warmup``).
    """

    def __init__(self, name, build, keys, serves):
        super().__init__()
        self.name, self.build, self.keys, self.serves = name, build, tuple(keys), serves
        self._lock = threading.Lock()
        FAMILIES[name] = self

    def __missing__(self, key):
        return self.ready(key)

    def ready(self, key, *, announce=True):
        """The kernel of ``key``, built now if it is not yet (announced if slow, unless told not to)."""
        with self._lock:
            if key not in self:
                what = f"{self.name}[{', '.join(map(str, key))}]"
                notice = threading.Timer(NOTICE_AFTER, _announce, (what,))
                notice.daemon = True
                start = time.perf_counter()
                if announce:
                    notice.start()
                try:
                    self[key] = self.build(*key)
                finally:
                    notice.cancel()
                BUILDS.append((self.name, key, time.perf_counter() - start))
        return dict.__getitem__(self, key)


def _announce(what):
    logger.warning("posenc: compiling the Numba kernel %s (once: later runs load it from Numba's cache; `posenc warmup` compiles ahead)", what)
