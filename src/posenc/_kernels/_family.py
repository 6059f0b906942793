"""What every kernel family shares: one specialisation per key, built on first use.

A *family* is one kernel source compiled for several keys (say, the CPU rotation for
``("rotate", "bfloat16", "half")``): ``family[key]`` is the key's kernel, built the first
time it is asked for, when Numba compiles it or loads it from its on-disk cache, and kept
(a ``Family`` is a dict: a built kernel costs one dict lookup). A build that takes longer
than ``NOTICE_AFTER`` seconds (a compile, not a cache load) is announced once, as a
``logging`` warning of the ``"posenc"`` logger, which reaches stderr when the
application configured no logging. A family may name a ``prepare`` step run before its
builds are timed: the CPU families start Numba's CPU target there (its typing and
lowering registries, about half a second once per process), so that start-up is neither
announced nor taken for a compile. Every family registers itself in ``FAMILIES``, which
is what ``posenc.warmup`` walks. All four families (rotary and Toeplitz, CPU and CUDA)
are specialised this one way. ``os.fork`` waits for the builds under way in other
threads, so that a forked child (multiprocessing, DataLoader workers) never inherits a
build's lock held by a thread it does not have.

Numba's on-disk cache knows a kernel's own file only: it drops a cached kernel when that
file's timestamp changes, not when a helper module the kernel inlines (``_codec``,
``_codec_f32``, ``_pairs``) does. It does key a cached closure on its cells' contents,
so each kernel source is a closure holding ``source_digest`` of its helpers, and an edit
to a helper (a ``git pull`` into an editable install, say) recompiles instead of
silently running the old arithmetic.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("posenc")

NOTICE_AFTER = 1.0  # seconds
FAMILIES: dict[str, Family] = {}


@dataclass(frozen=True)
class Built:
    """One specialisation made ready: its family and key, the seconds it took and whether
    Numba compiled it (``False``: loaded from Numba's on-disk cache, in milliseconds)."""

    family: str
    key: tuple
    seconds: float
    compiled: bool

    def __str__(self):
        return f"{self.family}[{', '.join(map(str, self.key))}]"


# Every build so far (``posenc demo`` marks the steps that include a compile).
BUILDS: list[Built] = []


@functools.cache
def source_digest(*modules) -> int:
    """A digest of the source files of ``modules``, the helpers a kernel inlines (see above):
    an integer, a constant every Numba target (CPU and CUDA) can hold. Read once per
    process: a loaded module does not change."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return int.from_bytes(digest.digest()[:7], "little")


def start_numba_cpu():
    """Numba's CPU target, ready: its registries load once per process, on the first compile
    or cache load, unless done here first."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:  # as Numba's own compiles and cache loads refresh it
        cpu_target.target_context.refresh()


def _compiled(kernel):
    """Whether building ``kernel`` (a Numba dispatcher compiled for its signature) compiled
    it rather than loading it from the on-disk cache."""
    stats = getattr(kernel, "stats", None)
    return bool(stats.cache_misses) if stats is not None else True


class Family(dict):
    """Kernels ``build(*key)`` for every ``key`` in ``keys``, each built once, on first use.

    ``serves(key)``: the input dtype names a key's kernel handles (for ``warmup``).
    ``prepare()``: run before a build is timed (see the module docstring).
    """

    def __init__(self, name, build, keys, serves, prepare=None):
        super().__init__()
        self.name, self.build, self.keys, self.serves, self.prepare = name, build, tuple(keys), serves, prepare
        self._lock = threading.Lock()
        FAMILIES[name] = self

    def __missing__(self, key):
        return self.ready(key)

    def ready(self, key, *, announce=True):
        """The kernel of ``key``, built now if it is not yet (announced if slow, unless told not to)."""
        with self._lock:
            if key not in self:
                if self.prepare is not None:
                    self.prepare()
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
                BUILDS.append(Built(self.name, key, time.perf_counter() - start, _compiled(self[key])))
        return dict.__getitem__(self, key)


def _hold_compiles():
    """Before ``os.fork``: wait for the builds under way in other threads (every family's lock,
    then Numba's compiler lock, the order a build takes them), so that the child inherits no
    lock held by a thread it does not have (its first compile would wait forever)."""
    global _held
    _held = [family._lock for family in FAMILIES.values()]
    compiler = _numba_compiler_lock()
    if compiler is not None:
        _held.append(compiler)
    for lock in _held:
        lock.acquire()


def _release_compiles():
    """After ``os.fork``, in the parent and in the child: the locks ``_hold_compiles`` took."""
    for lock in reversed(_held):
        lock.release()


_held = []  # the locks taken before a fork, released after it


def _numba_compiler_lock():
    """Numba's global compiler lock where Numba is imported (posenc imports it on first use only)."""
    module = sys.modules.get("numba.core.compiler_lock")
    return None if module is None else module.global_compiler_lock


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(before=_hold_compiles, after_in_parent=_release_compiles, after_in_child=_release_compiles)


def jitted(jit, function, *args, **options):
    """``jit(*args, cache=True, **options)(function)``: a Numba kernel kept in Numba's on-disk
    cache, or where Numba finds no directory to keep it in (the package's read-only, no
    ``NUMBA_CACHE_DIR``, no writable user cache directory) the same kernel without the
    cache, compiled in every process, said once as a ``"posenc"`` logging warning."""
    try:
        return jit(*args, cache=True, **options)(function)
    except RuntimeError as exc:  # Numba's "cannot cache function ...: no locator available for file ..."
        if "no locator available" not in str(exc):
            raise
        _uncached()
    return jit(*args, **options)(function)


def cached(jit, *args, **options):
    """``jitted`` as a decorator: ``@cached(cuda.jit, device=True)``."""
    return lambda function: jitted(jit, function, *args, **options)


@functools.cache
def _uncached():
    logger.warning(
        "posenc: Numba finds no writable cache directory (the package's, the user's, NUMBA_CACHE_DIR): "
        "kernels compile in every process; set NUMBA_CACHE_DIR to a writable directory"
    )


def _announce(what):
    logger.warning("posenc: compiling the Numba kernel %s (once: later runs load it from Numba's cache; `posenc warmup` compiles ahead)", what)
