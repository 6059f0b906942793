"""Plans: a public function validated once per call signature, then launched straight.

At the size of a decode step, validation, namespace resolution and kernel selection cost
more than the work (docs/benchmarks.md, "A decode step"). ``@planned(Signature)`` puts a
cache in front of a public function:

* ``Signature.key(args, kwargs)``: a cheap hashable key of everything validation looks
  at, never an array's values, from the call's positional arguments and keywords as
  given: each array's library, shape, strides, dtype, flags (NumPy), device and gradient
  tracking (``array_key``), the static keywords' names, types and values
  (``keywords_key``), the backend in force and torch's modes (``context_key``). Arrays
  (``x``, ``positions``, an array ``offset``, frequencies, tables) are keyed by that
  metadata and passed to the plan as they are, with their values of this call. The key
  is None for a call no plan serves (another library, a traced value, an object among
  the options ...); when it raises (an unhashable option), the call takes the full path too;
* the first call with a key runs the public function itself (full validation, the kernel
  registry) and is only remembered (a one-off call costs what it did without plans); the
  second runs it too and, when it returns normally, asks ``Signature.build(*args,
  **kwargs)`` (the function's keyword defaults filled in) for a plan of that key (None:
  the key is remembered as served by the full path; a build that raises does the same and
  warns once, ``RuntimeWarning``). ``build`` is a ``"module:function"`` string,
  imported on first use (a family's signature names the kernel module that plans it
  without importing it);
* later calls with the key call ``plan(args, kwargs)``, which launches the same kernel
  with the same arithmetic on the values the full path would have computed, or returns
  ``NotImplemented`` for values the plan does not cover or the contract refuses (an angle
  beyond the fast reduction, an offset near the integer limits, a non-finite float
  position): those take the full path, and meet its checks and its error word for word.

So a plan is only ever used for a call whose metadata the full path has accepted, the
values the contract constrains are checked by the plan in one vectorised pass (a refusal
is the full path's own), and bad input always meets the full validation and its error.
A keyword left to its default and the same value given explicitly are two keys (each
validated once); a plan reads a keyword the key leaves out (``offset``) with the
function's own default.

Each function keeps at most ``MAX_PLANS`` plans (``public.plans``, a ``PlanCache``): past
it the least recently used one is dropped. A plan holds metadata and its own buffers,
never a caller's array, so a dropped signature frees nothing of the caller's and a kept
one keeps nothing of it alive.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import warnings
from collections import OrderedDict

import numpy as np

from . import _dispatch
from ._xp import NDARRAY_OR_PLAIN, PLAIN, torch_transforming

MAX_PLANS = 256  # per function; past it, the least recently used plan is dropped


class PlanCache(OrderedDict):
    """At most ``limit`` plans by key, least recently used first (``get`` of a key makes it the most recent)."""

    def __init__(self, limit=MAX_PLANS):
        super().__init__()
        self.limit = limit
        self.last = None  # the plan used last, already the most recent (a decode loop asks for it again and again)

    def get(self, key, default=None):
        plan = super().get(key, self)
        if plan is self:
            return default
        if not (plan and plan is self.last):  # (a built plan is its key's alone; _SEEN and False are shared)
            try:
                self.move_to_end(key)
            except KeyError:  # another thread's put dropped it meanwhile: still this call's plan
                return plan
            self.last = plan
        return plan

    def put(self, key, plan):
        self.pop(key, None)  # (then stored as the most recent in one step: no moment another thread's put could drop it)
        self[key] = plan
        self.last = plan
        while len(self) > self.limit:
            self.popitem(last=False)

    def clear(self):
        super().clear()
        self.last = None  # (a cleared cache keeps no plan alive)


def planned(signature):
    def wrap(fn):
        defaults = dict(inspect.unwrap(fn).__kwdefaults__ or {})  # (fn may be another decorator's: host_constants)
        plans = PlanCache()
        build = _loader(signature.build)

        @functools.wraps(fn)
        def public(*args, **kwargs):
            if _tracing():  # torch.compile traces the full path (its custom ops), never a plan
                return fn(*args, **kwargs)
            try:
                key = signature.key(args, kwargs)
                plan = None if key is None else plans.get(key)
            except Exception:  # any argument a key cannot describe (unhashable ...): the full path judges it
                key = plan = None
            if plan:
                result = plan(args, kwargs)
                if result is not NotImplemented:
                    return result if result is not kwargs.get("out") else _written(result)
            result = fn(*args, **kwargs)
            if key is not None:
                if plan is None:  # the first call of a signature pays for no plan
                    plans.put(key, _SEEN)
                elif plan is _SEEN:
                    plans.put(key, _built(build, args, {**defaults, **kwargs}))
            return result if result is not kwargs.get("out") else _written(result)

        public.plans = plans
        return public

    return wrap


def _written(out):
    """The ``out`` a call returned, after telling autograd that a torch one has been written:
    a kernel writes through a NumPy or device view, which torch's version counter does not
    see, so a tensor saved for another op's backward and then overwritten would give that
    backward the new values instead of torch's error. Inference tensors keep no counter."""
    if out is not None and type(out) is not np.ndarray:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(out, torch.Tensor) and not out.is_inference():
            torch.autograd.graph.increment_version(out)
    return out


def _built(build, args, kwargs):
    """The plan ``build`` makes for a call the full path has just served, or False. A build
    that raises leaves the signature on the full path (the call's result stands) and says so
    once, as a ``RuntimeWarning``: a plan is only ever a faster way to the same numbers."""
    try:
        return build()(*args, **kwargs) or False
    except Exception as exc:  # noqa: BLE001 (reported)
        warnings.warn(f"posenc: no plan for this call signature ({type(exc).__name__}: {exc}); its calls keep the full path", RuntimeWarning, stacklevel=4)
        return False


class _Seen:
    """A signature called once, whose plan the next call builds (falsy: no plan to run)."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "<seen once>"


_SEEN = _Seen()


def _loader(target):
    """``target`` itself, or for ``"module:function"`` a function that imports it on first use."""
    if not isinstance(target, str):
        return lambda: target
    module, _, name = target.partition(":")
    return lambda: getattr(importlib.import_module(module), name)


def _tracing():
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def array_key(a, *, cuda=False):
    """What validation and kernel selection read from array ``a``: None for a library no plan
    serves. ``cuda``: a torch CUDA tensor too (by its device as well), for a signature whose
    plan serves one (``rope``)."""
    kind = type(a)
    if kind is np.ndarray:  # its flags as one int: writeable, aligned, owning its memory ...
        return (kind, a.shape, a.strides, a.dtype, a.flags.num)
    torch = sys.modules.get("torch")
    if torch is not None and (kind is torch.Tensor or kind is torch.nn.Parameter) and a.layout is torch.strided:
        if torch_transforming(fake=False) or a.is_neg():  # dual or functorch-wrapped tensors, jit.trace, a negated view: the full path
            return None
        if a.is_cpu:
            return (kind, a.shape, a.stride(), a.dtype, a.requires_grad, a.is_inference())
        if cuda and a.is_cuda:
            return (kind, a.shape, a.stride(), a.dtype, a.requires_grad, a.is_inference(), a.device)
    return None


def arrays_key(arrays, *, cuda=False):
    """``tuple(array_key(a, cuda=cuda) for a in arrays)``, or None where one is None or where
    NumPy arrays are among another library's (``one_library``): one pass, torch's transforms
    asked once for all (a planned call's key in fewer steps)."""
    torch = sys.modules.get("torch")
    keys, numpy = [], 0
    for a in arrays:
        kind = type(a)
        if kind is np.ndarray:
            numpy += 1
            keys.append((kind, a.shape, a.strides, a.dtype, a.flags.num))
        elif torch is not None and (kind is torch.Tensor or kind is torch.nn.Parameter) and a.layout is torch.strided and not a.is_neg():
            if a.is_cpu:
                keys.append((kind, a.shape, a.stride(), a.dtype, a.requires_grad, a.is_inference()))
            elif cuda and a.is_cuda:
                keys.append((kind, a.shape, a.stride(), a.dtype, a.requires_grad, a.is_inference(), a.device))
            else:
                return None
        else:
            return None
    if numpy != len(keys) and (numpy or torch_transforming(fake=False)):
        return None
    return tuple(keys)


def value_key(value, *, cuda=False):
    """An argument that is an array (its ``array_key``, None where no plan serves it) or a
    plain value (None, an int ...: its type, the value itself being the plan's argument)."""
    kind = type(value)
    if kind in _PLAIN:
        return kind
    return array_key(value, cuda=cuda)


def one_library(*values) -> bool:
    """Whether the arrays among ``values`` are all NumPy's or none is (a key of arrays of two
    libraries would pass a NumPy constant to the plan as it is: ``host_constants`` converts
    it on the full path). A NumPy scalar is no array of either."""
    numpy = [type(v) is np.ndarray for v in values if type(v) not in _PLAIN and not isinstance(v, np.generic)]
    return all(numpy) or not any(numpy)


def out_key(out, x):
    """An ``out`` argument's part of a key: allocating, in place (``out is x``), or the buffer's array key."""
    if out is None:
        return ("new",)
    if out is x:
        return ("x",)
    return array_key(out)


def context_key(*arrays):
    """The state outside the arguments that a call's path depends on: the backend, and
    torch's grad mode where ``arrays`` are not all NumPy's (plain values among ``arrays``
    are passed over). A signature's key is only asked for outside ``torch.compile``'s
    tracing (``planned`` sends a traced call to the full path first)."""
    torch = sys.modules.get("torch")
    if torch is None or NDARRAY_OR_PLAIN.issuperset(map(type, arrays)):
        return (_dispatch.get_backend(),)
    return (_dispatch.get_backend(), torch.is_grad_enabled(), torch.is_inference_mode_enabled())


def keywords_key(kwargs, *varying):
    """The keywords but ``varying`` as flat ``(name, value, type, ...)`` triples (True and 1
    are two keys); None where one is not a plain value (None, bool, int, float, str, a
    dtype): an array, an object."""
    key = []
    for name, value in kwargs.items():
        if name in varying:
            continue
        kind = type(value)
        if kind not in _PLAIN:
            if not _dtype_type(kind):
                return None
            _PLAIN.add(kind)
        key += (name, value, kind)
    return tuple(key)


_PLAIN = set(PLAIN | {type})  # grows by the dtype classes met (NumPy's, torch.dtype)


def _dtype_type(kind):
    return kind in _PLAIN or issubclass(kind, np.dtype) or (kind.__module__ == "torch" and kind.__name__ == "dtype")
