"""The plan keys of the rotary functions (``posenc._plans``), and the kernel modules that build their plans.

Each key holds what validation reads: every array's ``array_key`` (library, shape,
strides, dtype, device, gradient tracking), never its values, which the plan is called
with; the static options by value; ``context_key``'s state. A builder is named as
``"module:function"``: the kernel layer plans these calls without the family importing it.
"""

from __future__ import annotations

import numpy as np

from .. import _dispatch
from .._plans import array_key, arrays_key, context_key, keywords_key, one_library, out_key, value_key
from .scaling import NTK, YaRN, Axial, DynamicNTK, Linear, Llama3, LongRoPE, Proportional

# posenc's frozen scalings, whose frequencies are functions of their fields (and of the
# length for DynamicNTK and LongRoPE); any other class (a user's may change between
# calls) takes the full path.
_SCALINGS = frozenset((Linear, NTK, YaRN, Llama3, Proportional, Axial, DynamicNTK, LongRoPE))


class Rope:
    """``rope(x[, positions], offset=..., ...)``: ``positions`` None or an array, ``offset``
    an int, a NumPy integer scalar or an array, ``seq_len`` None or an int (the plan's arguments); torch CUDA tensors
    too (``rope_cuda_plan``); ``scaling`` None
    or one of posenc's scalings (keyed by its class and field values, which fix its
    frequencies, at each length for dynamic NTK and LongRoPE: ``scaling.frequency_table``)."""

    build = "posenc._kernels.rope_plan:build_rotate"

    @staticmethod
    def key(args, kwargs):
        if len(args) == 1:
            positions = kwargs.get("positions")
        elif len(args) == 2 and "positions" not in kwargs:
            positions = args[1]
        else:
            return None
        x, offset, scaling, seq_len = args[0], kwargs.get("offset", 0), kwargs.get("scaling"), kwargs.get("seq_len")
        if not one_library(x, positions, offset) or not (scaling is None or type(scaling) in _SCALINGS):
            return None
        if seq_len is not None and (type(seq_len) is not int or seq_len < 0):
            return None  # an array (per row, or traced), or a length the full path refuses
        parts = (
            array_key(x, cuda=True), context_key(x, positions, offset), value_key(positions, cuda=True), value_key(offset, cuda=True) or _integer_scalar(offset),
            keywords_key(kwargs, "positions", "offset", "out", "scaling", "seq_len"), out_key(kwargs.get("out"), x),
        )  # fmt: skip
        return None if None in parts else ("rope", *parts, seq_len is None, type(scaling), scaling)


def _integer_scalar(value):
    """A NumPy integer scalar's type (an ``offset`` the full path and the plan read as its int), else None."""
    return type(value) if isinstance(value, np.integer) else None


class Rerotate:
    """``rerotate(x, delta, inv_freq, ...)``: an int ``delta`` and NumPy frequencies, both the
    plan's arguments (it reads the frequencies' values again when their bytes change)."""

    build = "posenc._kernels.rope_plan:build_rerotate"

    @staticmethod
    def key(args, kwargs):
        if len(args) != 3 or type(args[1]) is not int or type(args[2]) is not np.ndarray:
            return None
        x, _, inv_freq = args
        key = ("rerotate", array_key(x), array_key(inv_freq), context_key(x), keywords_key(kwargs, "out"), out_key(kwargs.get("out"), x))
        return None if None in key else key


class RotatePositions:
    """``rope_rotate``'s kernel call made inside the torch custom op (the op's forward and
    backward: autograd and compiled graphs): ``(x, positions, inv_freq)``, the frequencies a
    tuple of host floats (held by the key), ``layout``/``inverse``/``scale`` by value."""

    build = "posenc._kernels.rope_plan:build_rotate_positions"

    @staticmethod
    def key(args, kwargs):
        if len(args) != 3 or type(args[2]) is not tuple or not one_library(*args[:2]):
            return None
        x, positions, inv_freq = args
        key = ("rope_rotate", array_key(x), array_key(positions), context_key(x, positions), inv_freq, keywords_key(kwargs))
        return None if None in key else key


class ApplyRope:
    """``apply_rope(x, cos, sin, ...)``: torch CUDA tensors too (``rope_cuda_plan``: a new
    result or ``x`` itself)."""

    build = "posenc._kernels.rope_plan:build_apply"

    @staticmethod
    def key(args, kwargs):
        arrays = arrays_key(args, cuda=True) if len(args) == 3 else None
        if arrays is None:
            return None
        key = ("apply_rope", *arrays, context_key(*args), keywords_key(kwargs, "out"), out_key(kwargs.get("out"), args[0]))
        return None if None in key else key


class RotatePair:
    """``rotate_pair(q, k, cos, sin, layout=...)``: an attention layer's q and k, on a CPU by
    the plans of its two ``apply_rope`` calls, on torch CUDA tensors by the one launch of
    both (``rope_cuda_plan``)."""

    build = "posenc._kernels.rope_plan:build_pair"

    @staticmethod
    def key(args, kwargs):
        arrays = arrays_key(args, cuda=True) if len(args) == 4 else None
        if arrays is None:
            return None
        key = ("rotate_pair", *arrays, context_key(*args), keywords_key(kwargs))
        return None if None in key else key


class RopeCosSin:
    """``rope_cos_sin`` of integer positions; the frequencies' values are read by the plan on
    every call. Its validation and plan read no NumPy array's strides or flags, which the
    key of two NumPy arrays leaves out (a decode loop's key costs the least)."""

    build = "posenc.rotary._tables_plan:build_tables"

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
