"""``posenc demo``: runs every encoding once on NumPy (and torch when installed).

Each family declares its demo steps in its own ``_demo.py`` with ``@step``; a step takes a
``Arrays`` helper (namespace + array maker) and returns a one-line description of what it
computed.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Callable

_STEPS: list[tuple[str, str, Callable]] = []
FAMILIES = ("absolute", "relative", "rotary")


def step(title: str):
    def wrap(fn):
        _STEPS.append((fn.__module__.split(".")[-2], title, fn))
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


def torch_arrays() -> Arrays | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import numpy as np
    import torch
    from array_api_compat import torch as xp

    return Arrays("torch", xp, lambda a, dtype=None: torch.as_tensor(np.asarray(a), dtype=dtype), torch.float32)


def describe(a) -> str:
    kind = type(a).__module__.split(".")[0]
    return f"{kind} {tuple(a.shape)} {str(a.dtype).replace('torch.', '')}"


def _compiled_since(count) -> str:
    """`` (includes compiling X once)`` when kernels were compiled since ``BUILDS[count]``
    (not loaded from Numba's cache), else ``""``."""
    from ._kernels import _family

    compiled = [b for b in _family.BUILDS[count:] if b.compiled]
    if not compiled:
        return ""
    names = ", ".join(map(str, compiled))
    return f"  (includes {sum(b.seconds for b in compiled):.1f} s compiling {names} once; `posenc warmup` does it ahead)"


def run(write=print) -> int:
    """Run every demo step on each available library; returns the number of failures."""
    from ._kernels import _family

    for family in FAMILIES:
        importlib.import_module(f"posenc.{family}._demo")
    # Numba's start-up is timed on its own: once per process, and no encoding's cost.
    start = time.perf_counter()
    _family.start_numba_cpu()
    write(f"Numba start-up (import, CPU target; once per process)  [{(time.perf_counter() - start) * 1e3:.1f} ms]")
    failures = 0
    for arrays in (numpy_arrays(), torch_arrays()):
        if arrays is None:
            write("torch is not installed: skipping the torch run (pip install 'posenc[torch]')")
            continue
        write(f"== {arrays.name} ==")
        family_now = None
        for family, title, fn in _STEPS:
            if family != family_now:
                write(f"-- {family} --")
                family_now = family
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
