"""``posenc demo``: runs every encoding once on each installed array library.

Each family declares its demo steps in its own ``_demo.py`` with ``@step``; a step takes an
``Arrays`` helper (namespace + array maker) and returns a one-line description of what it
computed. The libraries are NumPy, torch, JAX, Dask and array-api-strict; one that is not
installed is named with the reason it is skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from dataclasses import dataclass
from typing import Callable

_STEPS: list[tuple[str, str, Callable, dict[str, str]]] = []
FAMILIES = ("absolute", "relative", "rotary")


def step(title: str, *, skip: dict[str, str] | None = None):
    """Register a demo step; ``skip`` maps a library's name to why the step does not run on it."""

    def wrap(fn):
        _STEPS.append((fn.__module__.split(".")[-2], title, fn, skip or {}))
        return fn

    return wrap


@dataclass
class Arrays:
    """What a demo step needs to make arrays of one library."""

    name: str
    xp: object
    asarray: Callable
    float32: object


def numpy_arrays() -> Arrays:
    import numpy as np
    from array_api_compat import numpy as xp

    return Arrays("numpy", xp, lambda a, dtype=None: np.asarray(a, dtype=dtype), np.float32)


def torch_arrays() -> Arrays:
    import numpy as np
    import torch
    from array_api_compat import torch as xp

    return Arrays("torch", xp, lambda a, dtype=None: torch.as_tensor(np.asarray(a), dtype=dtype), torch.float32)


def jax_arrays() -> Arrays:
    import jax.numpy as jnp
    import numpy as np

    return Arrays("jax", jnp, lambda a, dtype=None: jnp.asarray(np.asarray(a, dtype=dtype)), jnp.float32)


def dask_arrays() -> Arrays:
    import dask.array as da
    import numpy as np
    from array_api_compat.dask import array as xp

    return Arrays("dask", xp, lambda a, dtype=None: da.from_array(np.asarray(a, dtype=dtype)), np.float32)


def strict_arrays() -> Arrays:
    import array_api_strict as xp
    import numpy as np

    return Arrays("array-api-strict", xp, lambda a, dtype=None: xp.asarray(np.asarray(a), dtype=dtype), xp.float32)


# (name, module that must be importable, maker, how to install it)
LIBRARIES = (
    ("numpy", "numpy", numpy_arrays, None),
    ("torch", "torch", torch_arrays, "pip install 'posenc[torch]'"),
    ("jax", "jax", jax_arrays, "pip install 'posenc[jax]'"),
    ("dask", "dask.array", dask_arrays, "pip install 'posenc[dask]'"),
    ("array-api-strict", "array_api_strict", strict_arrays, "pip install array-api-strict"),
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package (e.g. dask for dask.array) is missing
        return False


def libraries() -> list[tuple[str, Callable | None, str]]:
    """Each library: ``(name, maker or None, why it is skipped or "")``."""
    return [
        (name, maker, "") if _installed(module) else (name, None, f"not installed ({install})")
        for name, module, maker, install in LIBRARIES
    ]


def describe(a) -> str:
    kind = {"jaxlib": "jax", "array_api_strict": "array-api-strict"}.get(type(a).__module__.split(".")[0], type(a).__module__.split(".")[0])
    return f"{kind} {tuple(a.shape)} {str(a.dtype).replace('torch.', '').replace('array_api_strict.', '')}"


def _compiled_since(count) -> str:
    """`` (includes compiling X once)`` when kernels were compiled since ``BUILDS[count]``
    (not loaded from Numba's cache), else ``""``."""
    from ._kernels import _family

    compiled = [b for b in _family.BUILDS[count:] if b.compiled]
    if not compiled:
        return ""
    names = ", ".join(map(str, compiled))
    return f"  (includes {sum(b.seconds for b in compiled):.1f} s compiling {names} once; `posenc warmup` does it ahead)"


def _run_steps(arrays: Arrays, write) -> int:
    from ._kernels import _family

    failures = 0
    family_now = None
    for family, title, fn, skip in _STEPS:
        if family != family_now:
            write(f"-- {family} --")
            family_now = family
        if arrays.name in skip:
            write(f"  {title:<28} skipped on {arrays.name}: {skip[arrays.name]}")
            continue
        builds = len(_family.BUILDS)
        start = time.perf_counter()
        try:
            text = fn(arrays)
        except Exception as exc:  # a demo reports every failure and goes on
            failures += 1
            write(f"  FAIL {title}: {type(exc).__name__}: {exc}")
            continue
        write(f"  {title:<28} {text}  [{(time.perf_counter() - start) * 1e3:.1f} ms]{_compiled_since(builds)}")
    return failures


def run(write=print, only=None) -> int:
    """Run every demo step on each installed library (or those named in ``only``); returns
    the number of failures."""
    from ._kernels import _family

    for family in FAMILIES:
        importlib.import_module(f"posenc.{family}._demo")
    found = [lib for lib in libraries() if only is None or lib[0] in only]
    write("libraries: " + "; ".join(name if maker else f"{name} skipped: {why}" for name, maker, why in found))
    # Numba's start-up is timed on its own: once per process, and no encoding's cost.
    start = time.perf_counter()
    _family.start_numba_cpu()
    write(f"Numba start-up (import, CPU target; once per process)  [{(time.perf_counter() - start) * 1e3:.1f} ms]")
    failures = 0
    for name, maker, _ in found:
        if maker is None:
            continue
        start = time.perf_counter()
        arrays = maker()
        write(f"== {name} ==  [import {(time.perf_counter() - start) * 1e3:.0f} ms]")
        failures += _run_steps(arrays, write)
    return failures
