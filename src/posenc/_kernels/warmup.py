"""Compile (or load from Numba's cache) every kernel specialisation ahead of time: ``posenc.warmup``."""

from __future__ import annotations

from . import _arrays, _family

DTYPES = ("float16", "bfloat16", "float32", "float64")


def _families(gpu):
    from . import bias_rows_cpu, rope_cpu, toeplitz_cpu  # noqa: F401  (register their families)

    if gpu:
        from . import buckets_cuda, rope_cuda, toeplitz_cuda  # noqa: F401
    return [f for name, f in _family.FAMILIES.items() if gpu or not name.endswith("cuda")]


def plan(dtypes=None, *, gpu=None):
    """The ``(family, key)`` pairs ``warmup`` builds for ``dtypes`` (default: all)."""
    dtypes = _dtypes(dtypes)
    if gpu is not None and not isinstance(gpu, bool):
        raise TypeError(f"gpu must be None, True or False, got {gpu!r:.60}")
    gpu = _arrays.numba_cuda() and not _arrays.cuda_simulator() if gpu is None else gpu
    if gpu and not _arrays.numba_cuda():
        raise ValueError("gpu=True needs numba.cuda and a CUDA GPU, and none is usable here")
    return [(f, key) for f in _families(gpu) for key in f.keys if f.serves(key) & dtypes]


def _dtypes(dtypes):
    if dtypes is None:
        return set(DTYPES)
    names = [dtypes] if isinstance(dtypes, str) else list(dtypes) if isinstance(dtypes, (list, tuple, set, frozenset)) else None
    if names is None or not names or not all(isinstance(n, str) and n in DTYPES for n in names):
        raise ValueError(f"dtypes must be one or more of {', '.join(map(repr, DTYPES))}, got {dtypes!r:.60}")
    return set(names)


def warmup(dtypes=None, *, gpu=None, progress=None):
    """Compile, or load from Numba's on-disk cache, every kernel specialisation for ``dtypes``.

    A kernel is otherwise compiled the first time a call needs it (one or two seconds each,
    once per machine: later processes load it from the cache in milliseconds). Call this
    where that first-call pause must not happen: when building a container image or a CI
    cache, or before timing.

    Parameters
    ----------
    dtypes : str or iterable of {"float16", "bfloat16", "float32", "float64"}, optional
        The input dtypes to prepare kernels for (default: all four).
    gpu : bool, optional
        Also the numba.cuda kernels (default: when a CUDA GPU is usable).
    progress : callable, optional
        Called as ``progress(done, total, built)`` after each specialisation.

    Returns
    -------
    list of Built
        What was made ready: ``family``, ``key``, ``seconds`` and ``compiled`` (``False``:
        loaded from Numba's cache, in milliseconds; a compile takes one or two seconds).
        A specialisation this process had already built is listed with 0 seconds.

    Examples
    --------
    >>> import posenc as pe
    >>> built = pe.warmup("float32")
    >>> sorted({b.family for b in built})
    ['bias_rows_cpu', 'rope_cpu', 'toeplitz_cpu']
    """
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {type(progress).__name__}")
    todo = plan(dtypes, gpu=gpu)
    done = []
    for family, key in todo:
        count = len(_family.BUILDS)
        family.ready(key, announce=False)
        now = [b for b in _family.BUILDS[count:] if b.family == family.name and b.key == key]
        done.append(now[0] if now else _family.Built(family.name, key, 0.0, False))
        if progress is not None:
            progress(len(done), len(todo), done[-1])
    return done
