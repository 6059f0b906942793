"""The kernel registry: fast kernels registered against the reference they optimise.

A reference is the readable Array-API definition of an operation (``@reference(op)``).
A kernel is a faster implementation with exactly the reference's signature, registered
with ``register(op, name, accepts=, loader=)``:

* ``accepts(args)``: a cheap check (types, dtypes, devices, strides) of one call, given
  its arguments once, by name, defaults filled in (``args["x"]``, ``args["out"]``); it
  never imports numba or a framework;
* ``loader``: ``"module:function"``, imported on first use, so numba loads only when a
  kernel really runs.

``call(op, *args, **kwargs)`` runs the first kernel that accepts the arguments, or the
reference when none does or the backend is ``"reference"``: ``set_backend``,
``use_backend`` or the environment variable ``POSENC_BACKEND`` choose ``"auto"`` (the
default, kernels where one accepts) or ``"reference"`` (the pure Array-API reference
everywhere). The samples each kernel is tested on live with the tests
(``tests/kernel_samples.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from ._xp import torch_compiling as _compiling
from ._xp import torch_transforming
from ._xp import trace_constant

BACKENDS = ("auto", "reference")


def _checked(name, what="backend"):
    if name not in BACKENDS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name


_default = _checked(os.environ.get("POSENC_BACKEND", "auto") or "auto", "the environment variable POSENC_BACKEND")
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("posenc_backend", default=None)


@trace_constant
def get_backend() -> str:
    """The backend in force: the innermost ``use_backend``, else ``set_backend``'s."""
    return _override.get() or _default


def process_backend() -> str:
    """``set_backend``'s backend (or ``POSENC_BACKEND``'s), whatever ``use_backend`` block is open."""
    return _default


def set_backend(name: str) -> None:
    """Set the process-wide backend: ``"auto"`` or ``"reference"``."""
    global _default
    _default = _checked(name)
    if "jax" in sys.modules:  # in jax.jit's cache key: functions jitted before trace again
        adapter("jax.jit").backend_state.set_global(name)


@contextlib.contextmanager
def use_backend(name: str):
    """Use backend ``name`` inside a ``with`` block (per thread / async task).

    Once JAX is loaded the choice is also part of ``jax.jit``'s cache key
    (:mod:`posenc.jax`): a function jitted before the block is traced again inside it.
    """
    token = _override.set(_checked(name))
    try:
        if "jax" in sys.modules:
            with adapter("jax.jit").backend_state(name):
                yield
        else:
            yield
    finally:
        _override.reset(token)


@dataclass
class Kernel:
    op: str
    name: str
    accepts: Callable[[dict], bool]
    loader: str
    _impl: Callable | None = field(default=None, repr=False)

    def accepts_call(self, *args, **kwargs) -> bool:
        """``accepts`` of one call's arguments as written (named as ``call`` names them)."""
        return self.accepts(_parameters[self.op].bind(args, kwargs))

    def load(self) -> Callable:
        if self._impl is None:
            module, _, attr = self.loader.partition(":")
            self._impl = getattr(importlib.import_module(module), attr)
        return self._impl


@dataclass(frozen=True)
class _Parameters:
    """A reference's parameter names, read once, to name a call's arguments cheaply."""

    op: str
    positional: tuple
    defaults: dict
    required: frozenset

    @classmethod
    def of(cls, op, fn):
        params = inspect.signature(fn).parameters.values()
        positional = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
        defaults = {p.name: p.default for p in params if p.default is not p.empty}
        required = frozenset(p.name for p in params if p.default is p.empty)
        return cls(op, positional, defaults, required)

    def bind(self, args, kwargs) -> dict:
        if len(args) > len(self.positional):
            raise TypeError(f"{self.op} takes {len(self.positional)} positional arguments, got {len(args)}")
        named = dict(self.defaults)
        named.update(zip(self.positional, args))
        named.update(kwargs)
        missing = self.required.difference(named)
        if missing:
            raise TypeError(f"{self.op} is missing argument(s) {', '.join(sorted(missing))}")
        return named


_references: dict[str, Callable] = {}
_parameters: dict[str, _Parameters] = {}
_kernels: dict[str, list[Kernel]] = {}


def reference(op: str):
    """Decorator: register ``fn`` as the reference implementation of ``op``."""

    def wrap(fn):
        _references[op] = fn
        _parameters[op] = _Parameters.of(op, fn)
        return fn

    return wrap


def register(op, name, *, accepts, loader):
    """Register a kernel ``name`` for reference ``op``; kernels are tried in registration order."""
    kernel = Kernel(op, name, accepts, loader)
    _kernels.setdefault(op, []).append(kernel)
    return kernel


def references() -> dict[str, Callable]:
    return dict(_references)


# The framework adapters that register kernels here, by name. The registry imports none of
# them: an adapter is imported, and so registers itself, the first time a call holds an
# array of its library (``select``), when every kernel is listed (``kernels``), or when a
# layer below it needs it ready (``adapter``: the torch custom ops before torch.compile
# traces a call to them).
ADAPTERS = {
    "torch": "posenc.torch._ops",
    "dask": "posenc._dask",
    "jax": "posenc._jax.register",
    "jax.jit": "posenc.jax",  # the backend's part of jax.jit's cache key (set_backend, use_backend)
}
_SELF_REGISTERING = {"dask": "dask", "jax": "jax", "jaxlib": "jax"}  # an array type's top module -> its adapter
_registered: set = set()


def adapter(name: str):
    """The adapter module of library ``name`` (a key of ``ADAPTERS``), imported on first use.
    ``name`` counts as registered once the import is done: another thread's call meanwhile
    imports it too (waiting for the first import), rather than find no kernel of its library."""
    module = importlib.import_module(ADAPTERS[name])
    _registered.add(name)
    return module


@trace_constant
def ready(name: str) -> bool:
    """Import (register) the adapter of library ``name``; under ``torch.compile`` this runs
    eagerly while tracing, not traced."""
    adapter(name)
    return True


def _register_adapters(values):
    if _compiling():  # torch.compile traces torch tensors alone (and cannot trace str methods)
        return
    for value in values:
        name = _SELF_REGISTERING.get(type(value).__module__.partition(".")[0])
        if name is not None and name not in _registered:
            adapter(name)


def kernels(op: str | None = None) -> list[Kernel]:
    """Registered kernels, all or those of ``op`` (every adapter's included)."""
    for name in sorted(set(_SELF_REGISTERING.values()) - _registered):  # (one order in every process: xdist)
        adapter(name)
    if op is not None:
        return list(_kernels.get(op, ()))
    return [k for ks in _kernels.values() for k in ks]


def select(op, *args, **kwargs) -> Callable:
    """The implementation ``call`` would run for these arguments."""
    if get_backend() != "reference" and (_compiling() or not torch_transforming()):
        _register_adapters((*args, *kwargs.values()))
        candidates = _kernels.get(op, ())
        if candidates:
            named = _parameters[op].bind(args, kwargs)
            for kernel in candidates:
                if kernel.accepts(named):
                    return kernel.load()
            if any(_swapped(a) for a in named.values()):
                return _in_native_order(op, named)
    return _references[op]


def _swapped(a) -> bool:
    """A NumPy array whose bytes are not in this machine's order (``>f8`` on x86)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(a, numpy.ndarray) and not a.dtype.isnative


def _in_native_order(op, named):
    """``op`` for arguments of which some are NumPy arrays in the other byte order, which no
    kernel reads: run on native-order copies (what a kernel reads) and copy the result into
    a swapped ``out``, so the numbers are those of the same values in native order (the
    reference's could differ from the kernel's by an ulp)."""

    def run(*args, **kwargs):
        out = named.get("out")
        native = {n: a.astype(a.dtype.newbyteorder("=")) if _swapped(a) and n != "out" else a for n, a in named.items()}
        if _swapped(out) or any(native[n] is not a and a is out for n, a in named.items() if n != "out"):
            native["out"] = None
        result = call(op, **native)
        if native.get("out", out) is out:
            return result
        out[...] = result
        return out

    return run


def call(op, *args, **kwargs):
    return select(op, *args, **kwargs)(*args, **kwargs)
