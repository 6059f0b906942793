"""Plans: a public function validated once per call signature, then launched straight.

At the size of a decode step, validation, namespace resolution and kernel selection cost
more than the work (docs/benchmarks.md, "A decode step"). ``@planned(Signature)`` puts a
cache in front of a public function:

* ``Signature.key(args, kwargs)``: a cheap hashable key of everything validation looks
  at, without reading array values, from the call's positional arguments and keywords as
  given: each array's library, shape, strides, dtype, flags (NumPy), device and gradient tracking, the
  keywords' names, types and values, the backend in force (``array_key``,
  ``keywords_key``). It returns None for a call no plan serves (another library, a traced
  value, an array or object among the options ...); when it raises (an unhashable
  option), the call takes the full path too;
* the first call with a key runs the public function itself (full validation, the kernel
  registry); only when it returns normally is ``Signature.build(*args, **kwargs)`` (the
  function's keyword defaults filled in) asked for a plan of that key (None: the key is
  remembered as served by the full path);
* later calls with the key call ``plan(args, kwargs)``, which launches the same kernel
  with the same arithmetic on the values the full path would have computed, or returns
  ``NotImplemented`` for values the plan does not cover (an angle beyond the fast
  reduction, an offset near the integer limits), which then take the full path.

So a plan is only ever used for a call that the full path has accepted with the same key,
and bad input always meets the full validation and its error. A keyword left to its
default and the same value given explicitly are two keys (each validated once); a plan
reads a keyword the key leaves out (``offset``) with the function's own default.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from . import _dispatch

MAX_PLANS = 256  # per function; past it, new signatures take the full path


def planned(signature):
    def wrap(fn):
        defaults = dict(fn.__kwdefaults__ or {})
        plans = {}

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
                    return result
            result = fn(*args, **kwargs)
            if key is not None and key not in plans and len(plans) < MAX_PLANS:
                plans[key] = signature.build(*args, **{**defaults, **kwargs}) or False
            return result

        public.plans = plans
        return public

    return wrap


def _tracing():
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def array_key(a):
    """What validation and kernel selection read from array ``a``: None for a library no plan serves."""
    kind = type(a)
    if kind is np.ndarray:  # its flags as one int: writeable, aligned, owning its memory ...
        return (kind, a.shape, a.strides, a.dtype, a.flags.num)
    torch = sys.modules.get("torch")
    if torch is not None and (kind is torch.Tensor or kind is torch.nn.Parameter) and a.is_cpu and a.layout is torch.strided:
        return (kind, a.shape, a.stride(), a.dtype, a.requires_grad)
    return None


def out_key(out, x):
    """An ``out`` argument's part of a key: allocating, in place (``out is x``), or the buffer's array key."""
    if out is None:
        return ("new",)
    if out is x:
        return ("x",)
    return array_key(out)


def context_key(*arrays):
    """The state outside the arguments that a call's path depends on: the backend, and
    torch's grad mode and tracing where ``arrays`` are not all NumPy's."""
    torch = sys.modules.get("torch")
    if torch is None or _NUMPY.issuperset(map(type, arrays)):
        return (_dispatch.get_backend(),)
    if torch.compiler.is_compiling():
        return None
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


_NUMPY = frozenset((np.ndarray,))
_PLAIN = {type(None), bool, int, float, str, type}  # grows by the dtype classes met (NumPy's, torch.dtype)


def _dtype_type(kind):
    return kind in _PLAIN or issubclass(kind, np.dtype) or (kind.__module__ == "torch" and kind.__name__ == "dtype")


# ---------------------------------------------------------------- signatures of the planned functions


class Rope:
    """``rope(x, offset=n, ...)``: default positions, no scaling; the offset is the plan's argument."""

    @staticmethod
    def key(args, kwargs):
        offset = kwargs.get("offset", 0)
        if len(args) != 1 or type(offset) is not int:
            return None
        x = args[0]
        key = ("rope", array_key(x), context_key(x), keywords_key(kwargs, "offset", "out"), out_key(kwargs.get("out"), x))
        return None if None in key else key

    @staticmethod
    def build(*args, **kwargs):
        from ._kernels.rope_plan import build_rotate

        return build_rotate(*args, **kwargs)


class Rerotate:
    """``rerotate(x, delta, inv_freq, ...)``: an int ``delta`` (the plan's argument) and NumPy
    frequencies, whose values the plan compares with those it was built with on every call."""

    @staticmethod
    def key(args, kwargs):
        if len(args) != 3 or type(args[1]) is not int or type(args[2]) is not np.ndarray:
            return None
        x, _, inv_freq = args
        key = ("rerotate", array_key(x), array_key(inv_freq), context_key(x), keywords_key(kwargs, "out"), out_key(kwargs.get("out"), x))
        return None if None in key else key

    @staticmethod
    def build(*args, **kwargs):
        from ._kernels.rope_plan import build_rerotate

        return build_rerotate(*args, **kwargs)


class ApplyRope:
    @staticmethod
    def key(args, kwargs):
        if len(args) != 3:
            return None
        key = ("apply_rope", *map(array_key, args), context_key(*args), keywords_key(kwargs, "out"), out_key(kwargs.get("out"), args[0]))
        return None if None in key else key

    @staticmethod
    def build(*args, **kwargs):
        from ._kernels.rope_plan import build_apply

        return build_apply(*args, **kwargs)


class HFApplyRotary:
    """``posenc.torch.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``: q's and k's
    ``apply_rope`` plans, under one key of the four arrays."""

    @staticmethod
    def key(args, kwargs):
        if len(args) != 5 or type(args[4]) is not int:
            return None
        arrays = args[:4]
        key = ("hf_apply_rotary", *map(array_key, arrays), context_key(*arrays), args[4])
        return None if None in key else key

    @staticmethod
    def build(q, k, cos, sin, unsqueeze_dim):
        import posenc

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        plans = [posenc.apply_rope.plans.get(ApplyRope.key((x, cos, sin), {})) for x in (q, k)]
        return all(plans) and _PairPlan(*plans, unsqueeze_dim)


class _PairPlan:
    def __init__(self, q_plan, k_plan, dim):
        self.q_plan, self.k_plan, self.dim = q_plan, k_plan, dim

    def __call__(self, args, kwargs):
        q, k, cos, sin = args[:4]
        cos, sin = cos.unsqueeze(self.dim), sin.unsqueeze(self.dim)
        rotated_q = self.q_plan((q, cos, sin), {})
        rotated_k = NotImplemented if rotated_q is NotImplemented else self.k_plan((k, cos, sin), {})
        return NotImplemented if rotated_k is NotImplemented else (rotated_q, rotated_k)


def _bias_key(name, args, kwargs):
    """``(kind, params, 1, k_len)`` with an int ``k_len``, and ``offset`` None or an int: both the plan's arguments."""
    if len(args) != 4:
        return None
    kind, params, q_len, k_len = args
    offset = kwargs.get("offset")
    if type(kind) is not str or type(q_len) is not int or q_len != 1 or type(k_len) is not int or (offset is not None and type(offset) is not int):
        return None
    key = (name, kind, array_key(params), context_key(params), offset is None, keywords_key(kwargs, "offset"))
    return None if None in key else key


class RelativeBias:
    """``relative_bias`` (``t5_bias``, ``alibi_bias``) of one query row; ``k_len`` and ``offset`` are the plan's arguments."""

    @staticmethod
    def key(args, kwargs):
        return _bias_key("relative_bias", args, kwargs)

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_bias

        return build_bias(*args, **kwargs)


class RelativeBiasVector:
    @staticmethod
    def key(args, kwargs):
        return _bias_key("relative_bias_vector", args, kwargs)

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_vector

        return build_vector(*args, **kwargs)


class ExpandBias:
    @staticmethod
    def key(args, kwargs):
        if len(args) != 3:
            return None
        vec, q_len, k_len = args
        if type(q_len) is not int or q_len != 1 or type(k_len) is not int:
            return None
        key = ("expand_bias", array_key(vec), context_key(vec), k_len, keywords_key(kwargs))  # vec's shape fixes k_len
        return None if None in key else key

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_expand

        return build_expand(*args, **kwargs)


class RopeCosSin:
    """``rope_cos_sin`` of integer positions; the frequencies' values are read by the plan on
    every call. Its validation and plan read no NumPy array's strides or flags, which the
    key of two NumPy arrays leaves out (a decode loop's key costs the least)."""

    @staticmethod
    def key(args, kwargs):
        if len(args) != 2:
            return None
        positions, inv_freq = args
        if type(positions) is np.ndarray and type(inv_freq) is np.ndarray:
            key = ("rope_cos_sin", positions.shape, positions.dtype, inv_freq.shape, inv_freq.dtype, _dispatch.get_backend(), keywords_key(kwargs))
            return None if key[-1] is None else key
        if type(positions) is not type(inv_freq) and type(inv_freq) is not np.ndarray:
            return None
        key = ("rope_cos_sin", array_key(positions), array_key(inv_freq), context_key(positions, inv_freq), keywords_key(kwargs))
        return None if None in key else key

    @staticmethod
    def build(*args, **kwargs):
        from .rotary._tables_plan import build_tables

        return build_tables(*args, **kwargs)
