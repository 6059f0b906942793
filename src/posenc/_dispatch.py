"""The kernel registry: fast kernels registered against the reference they optimise.

A reference is the readable Array-API definition of an operation. A kernel is a faster
implementation of exactly the same signature, registered with

* ``accepts(*args, **kwargs)``: a cheap check (types, dtype, device, strides) that never
  imports numba or a framework;
* ``loader``: ``"module:function"``, imported on first use, so numba loads only when a
  kernel really runs;
* ``samples(rng)``: host (NumPy or torch CPU) argument sets, used by the test that compares
  every registered kernel with its reference;
* ``to_device(args, kwargs)`` (device kernels only): the same arguments as the kernel
  takes them (device arrays), so the reference runs on the host samples and the kernel on
  their device copies;
* ``rtol``: tolerances by dtype name where the default few-ulp ones do not fit.

``call(op, *args, **kwargs)`` runs the first kernel that accepts the arguments, or the
reference when none does or the backend is ``"reference"``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from ._config import get_backend


@dataclass
class Kernel:
    op: str
    name: str
    accepts: Callable[..., bool]
    loader: str
    samples: Callable
    rtol: dict = field(default_factory=dict)
    to_device: Callable | None = None
    _impl: Callable | None = field(default=None, repr=False)

    def load(self) -> Callable:
        if self._impl is None:
            module, _, attr = self.loader.partition(":")
            self._impl = getattr(importlib.import_module(module), attr)
        return self._impl


_references: dict[str, Callable] = {}
_kernels: dict[str, list[Kernel]] = {}


def reference(op: str):
    """Decorator: register ``fn`` as the reference implementation of ``op``."""

    def wrap(fn):
        _references[op] = fn
        return fn

    return wrap


def register(op, name, *, accepts, loader, samples, rtol=None, to_device=None):
    """Register a kernel ``name`` for reference ``op``."""
    kernel = Kernel(op, name, accepts, loader, samples, dict(rtol or {}), to_device)
    _kernels.setdefault(op, []).append(kernel)
    return kernel


def references() -> dict[str, Callable]:
    return dict(_references)


def kernels(op: str | None = None) -> list[Kernel]:
    """Registered kernels, all or those of ``op``."""
    if op is not None:
        return list(_kernels.get(op, ()))
    return [k for ks in _kernels.values() for k in ks]


def select(op, *args, **kwargs) -> Callable:
    """The implementation ``call`` would run for these arguments."""
    if get_backend() != "reference":
        for kernel in _kernels.get(op, ()):
            if kernel.accepts(*args, **kwargs):
                return kernel.load()
    return _references[op]


def call(op, *args, **kwargs):
    return select(op, *args, **kwargs)(*args, **kwargs)
