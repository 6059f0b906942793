"""Which optional kernel toolchains can be used here, answered without importing them."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache


@lru_cache(maxsize=None)
def numba_cpu() -> bool:
    return importlib.util.find_spec("numba") is not None


def cuda_simulator() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@lru_cache(maxsize=None)
def numba_cuda() -> bool:
    """numba.cuda is importable and (outside the simulator) a GPU is usable."""
    if not numba_cpu():
        return False
    try:
        from numba import cuda
    except ImportError:  # pragma: no cover - numba without its cuda target
        return False
    return cuda_simulator() or bool(cuda.is_available())
