"""posenc: Transformer positional encodings for any Array-API array.

Every encoding is a pure Array-API function (NumPy, CuPy, PyTorch, JAX, Dask,
array-api-strict in, the same kind of array out); the hot loops also have Numba CPU and
numba.cuda kernels, chosen by array type. ``import posenc`` imports no framework and no
numba: they load on first use.
"""

from . import _kernels  # noqa: F401  (registers the kernels, lazily)
from ._dispatch import get_backend, set_backend, use_backend
from ._kernels.warmup import warmup
from .absolute import *  # noqa: F403
from .absolute import __all__ as _absolute_all
from .attention import attention
from .relative import *  # noqa: F403
from .relative import __all__ as _relative_all
from .rotary import *  # noqa: F403
from .rotary import __all__ as _rotary_all

__version__ = "0.1.0"

__all__ = [
    "attention",
    "get_backend",
    "set_backend",
    "use_backend",
    "warmup",
    *_absolute_all,
    *_relative_all,
    *_rotary_all,
]


def __getattr__(name):
    # Framework adapters, the CLI and the figures import heavy packages: load them only when asked.
    if name in ("torch", "jax", "flax", "cli", "plots"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
