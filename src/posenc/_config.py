"""Backend selection (``set_backend``, ``use_backend``, ``POSENC_BACKEND``) and what
``torch.compile`` must not trace.

``"auto"`` (the default) lets the kernel registry pick a fast kernel where one accepts the
arguments; ``"reference"`` forces the pure Array-API reference everywhere.

``torch.compile`` (Dynamo) traces posenc's Python code. A few host-side helpers do things it
cannot trace (read a ``ContextVar``, read ``/proc``, compute float64 NumPy tables): they are
marked :func:`trace_constant`, so Dynamo calls them once while tracing, with Python values as
arguments, and keeps their result as a constant of the graph. :func:`torch_compiling` tells
posenc's dispatch that it is being traced, so calls go to the ``posenc::`` custom ops (opaque
to the compiler) instead of Numba kernels.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys

BACKENDS = ("auto", "reference")


def trace_constant(fn):
    """Mark ``fn`` as a host function whose result ``torch.compile`` treats as a constant.

    This is what ``torch.compiler.assume_constant_result`` does (it sets this attribute);
    setting it here keeps ``import posenc`` free of torch. ``fn`` must take Python values
    (numbers, strings, tuples, frozen dataclasses), never tensors. JAX and eager code just
    call ``fn``.
    """
    fn._dynamo_marked_constant = True
    return fn


def torch_compiling() -> bool:
    """Whether ``torch.compile`` (or ``torch.export``) is tracing the current call."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _checked(name):
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name


_default = _checked(os.environ.get("POSENC_BACKEND", "auto") or "auto")
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("posenc_backend", default=None)


@trace_constant
def get_backend() -> str:
    """The backend in force: the innermost ``use_backend``, else ``set_backend``'s."""
    return _override.get() or _default


def set_backend(name: str) -> None:
    """Set the process-wide backend: ``"auto"`` or ``"reference"``."""
    global _default
    _default = _checked(name)


@contextlib.contextmanager
def use_backend(name: str):
    """Use backend ``name`` inside a ``with`` block (per thread / async task)."""
    token = _override.set(_checked(name))
    try:
        yield
    finally:
        _override.reset(token)
