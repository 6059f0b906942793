"""Backend selection: ``set_backend``, ``use_backend`` and ``POSENC_BACKEND``.

``"auto"`` (the default) lets the kernel registry pick a fast kernel where one accepts the
arguments; ``"reference"`` forces the pure Array-API reference everywhere.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

BACKENDS = ("auto", "reference")


def _checked(name):
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name


_default = _checked(os.environ.get("POSENC_BACKEND", "auto") or "auto")
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("posenc_backend", default=None)


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
