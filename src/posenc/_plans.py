"""Plans: a public function validated once per call signature, then launched straight.

At the size of a decode step, validation, namespace resolution and kernel selection cost
more than the work (docs/benchmarks.md, "A decode step"). ``@planned(Signature)`` puts a
cache in front of a public function:

* ``Signature.key(*args, **kwargs)``: a cheap hashable key of everything validation looks
  at, without reading array values: each array's library, shape, strides, dtype, device and
  gradient tracking, the options' types and values, the backend in force (``array_key``).
  It returns None, or a tuple with a None part, for a call no plan serves (another
  library, a traced value, an unhashable option ...); when it raises, the call takes the
  full path too;
* the first call with a key runs the public function itself (full validation, the kernel
  registry); only when it returns normally is ``Signature.build(*args, **kwargs)`` asked
  for a plan of that key (None: the key is remembered as served by the full path);
* later calls with the key call ``plan(*args, **kwargs)``, which launches the same kernel
  with the same arithmetic on the values the full path would have computed, or returns
  ``NotImplemented`` for values the plan does not cover (an angle beyond the fast
  reduction, an offset near the integer limits), which then take the full path.

So a plan is only ever used for a call that the full path has accepted with the same key,
and bad input always meets the full validation and its error. Keyword defaults come from
the public function itself, so a plan sees what the function sees.
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
            named = {**defaults, **kwargs}
            try:
                key = signature.key(*args, **named)
                if key is not None and None in key:  # a part no plan serves
                    key = None
                hash(key)
            except Exception:  # any argument a key cannot describe (unhashable ...): the full path judges it
                key = None
            if key is not None:
                plan = plans.get(key)
                if plan:
                    result = plan(*args, **named)
                    if result is not NotImplemented:
                        return result
            result = fn(*args, **kwargs)
            if key is not None and key not in plans and len(plans) < MAX_PLANS:
                plans[key] = signature.build(*args, **named) or False
            return result

        public.plans = plans
        return public

    return wrap


def array_key(a):
    """What validation and kernel selection read from array ``a``: None for a library no plan serves."""
    kind = type(a)
    if kind is np.ndarray:
        flags = a.flags
        return (kind, a.shape, a.strides, a.dtype, flags.writeable, flags.aligned)
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


def context_key():
    """The state outside the arguments that a call's path depends on: backend, grad mode, tracing."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (_dispatch.get_backend(),)
    if torch.compiler.is_compiling():
        return None
    return (_dispatch.get_backend(), torch.is_grad_enabled(), torch.is_inference_mode_enabled())


# ---------------------------------------------------------------- signatures of the planned functions


class Rope:
    """``rope``: default positions, no scaling; the offset's value is the plan's argument."""

    @staticmethod
    def key(x, positions=None, *, base, scaling, layout, rotary_dim, offset, seq_axis, inverse, seq_len, out):
        if positions is not None or scaling is not None or seq_len is not None or type(offset) is not int:
            return None
        options = (type(base), base, type(layout), layout, type(rotary_dim), rotary_dim, type(seq_axis), seq_axis, type(inverse), inverse)
        return ("rope", array_key(x), context_key(), options, out_key(out, x))

    @staticmethod
    def build(*args, **kwargs):
        from ._kernels.rope_plan import build_rotate

        return build_rotate(*args, **kwargs)


class ApplyRope:
    @staticmethod
    def key(x, cos, sin, *, layout, out):
        return ("apply_rope", array_key(x), array_key(cos), array_key(sin), context_key(), type(layout), layout, out_key(out, x))

    @staticmethod
    def build(*args, **kwargs):
        from ._kernels.rope_plan import build_apply

        return build_apply(*args, **kwargs)


def _bias_key(name, kind, params, q_len, k_len, offset, options):
    if type(q_len) is not int or q_len != 1 or type(k_len) is not int or (offset is not None and type(offset) is not int):
        return None
    return (name, kind, array_key(params), context_key(), type(offset), tuple((n, type(v), v) for n, v in sorted(options.items())))


class RelativeBias:
    """``relative_bias`` (``t5_bias``, ``alibi_bias``) of one query row; ``k_len`` and ``offset`` are the plan's arguments."""

    @staticmethod
    def key(kind, params, q_len, k_len, *, offset, out, chunks, query_positions=None, key_positions=None, **options):
        if out is not None or chunks is not None or query_positions is not None or key_positions is not None:
            return None
        return _bias_key("relative_bias", kind, params, q_len, k_len, offset, options)

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_bias

        return build_bias(*args, **kwargs)


class RelativeBiasVector:
    @staticmethod
    def key(kind, params, q_len, k_len, *, offset, **options):
        return _bias_key("relative_bias_vector", kind, params, q_len, k_len, offset, options)

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_vector

        return build_vector(*args, **kwargs)


class ExpandBias:
    @staticmethod
    def key(vec, q_len, k_len, *, out, chunks):
        if out is not None or chunks is not None or type(q_len) is not int or q_len != 1 or type(k_len) is not int:
            return None
        return ("expand_bias", array_key(vec), context_key(), q_len, k_len)

    @staticmethod
    def build(*args, **kwargs):
        from .relative._decode import build_expand

        return build_expand(*args, **kwargs)


class RopeCosSin:
    """``rope_cos_sin`` of integer positions; the frequencies' values are read by the plan on every call."""

    @staticmethod
    def key(positions, inv_freq, *, layout, dtype, scale):
        freqs = array_key(inv_freq)
        if freqs is None or (type(positions) is not type(inv_freq) and type(inv_freq) is not np.ndarray):
            return None
        return ("rope_cos_sin", array_key(positions), freqs, context_key(), type(layout), layout, type(dtype), dtype, type(scale), scale)

    @staticmethod
    def build(*args, **kwargs):
        from .rotary._tables_plan import build_tables

        return build_tables(*args, **kwargs)
