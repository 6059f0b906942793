"""The plan keys of the relative biases and of ``shaw_logits`` (``posenc._plans``), whose
builders are ``relative._decode`` and ``relative._logits_plan``.

A key holds the parameters' and per-token positions' ``array_key`` (never their values,
which the plan is called with), the kind and static options by value, ``q_len``/``k_len``
(not ``k_len`` with one offset per batch row, or with per-token positions whose keys are
left out or C-contiguous: their plans check it and serve any) and the
``offset``'s type (its value is the plan's argument).
"""

from __future__ import annotations

import numpy as np

from .._plans import array_key, arrays_key, context_key, keywords_key, value_key

_POSITIONS = ("query_positions", "key_positions")


def _bias_key(name, args, kwargs, rows=1, per_row=False):
    """``(kind, params, q_len, k_len)``: ``rows`` query rows by ``offset`` (None, an int, a
    NumPy integer or a 0-d array in the parameters' library and memory, which the plan reads
    as the int it holds: ``_decode.scalar``; ``rows=None``: any count), or any
    ``q_len``/``k_len`` with per-token positions (arrays) or, with ``per_row``, one offset
    per batch row (an array with axes, no positions)."""
    if len(args) != 4:
        return None
    kind, params, q_len, k_len = args
    offset = kwargs.get("offset")
    if type(kind) is not str or type(q_len) is not int or type(k_len) is not int:
        return None
    query, keys = kwargs.get("query_positions"), kwargs.get("key_positions")
    scalar = offset is None or type(offset) is int or isinstance(offset, np.integer)
    if not scalar and getattr(offset, "ndim", 0):
        if not (per_row and query is None and keys is None):
            return None
        parts = (arrays_key((params, offset)), context_key(params, offset), keywords_key(kwargs, "offset"))
        return None if None in parts else (name, kind, q_len, "rows", *parts)  # (any k_len: a plan of any length of keys)
    held = type(offset) if scalar else arrays_key((params, offset))  # (a 0-d array: its key, beside the parameters')
    if query is None and keys is None:
        if rows is not None and q_len != rows:
            return None
        parts = (array_key(params), held, context_key(params, offset), keywords_key(kwargs, "offset"))
        return None if None in parts else (name, kind, *parts)
    arrays = (array_key(params), value_key(query), value_key(keys)) if query is None or keys is None else arrays_key((params, query, keys))
    if arrays is None or None in arrays:
        return None
    parts = (*arrays, held, context_key(params, query, keys, offset), keywords_key(kwargs, "offset", *_POSITIONS))
    if None in parts:
        return None
    if keys is None or _contiguous(keys):  # (any k_len: a decode loop's keys grow a step at a time)
        return (name, kind, q_len, "keys", *parts[:2], parts[2] if keys is None else _lengthless(parts[2]), *parts[3:])
    return (name, kind, q_len, k_len, *parts)


def _contiguous(a):
    return a.flags.c_contiguous if type(a) is np.ndarray else a.is_contiguous()


def _lengthless(key):
    """A C-contiguous array's ``array_key`` without its last axis's length and its strides,
    which follow from the rest: the plan checks the length and serves any."""
    kind, shape, _, *rest = key
    return (kind, tuple(shape[:-1]), *rest)


class RelativeBias:
    """``relative_bias`` (``t5_bias``, ``alibi_bias``) of one query row, of per-token
    positions, or of one offset per batch row."""

    build = "posenc.relative._decode:build_bias"

    @staticmethod
    def key(args, kwargs):
        return _bias_key("relative_bias", args, kwargs, per_row=True)


class RelativeBiasVector:
    build = "posenc.relative._decode:build_vector"

    @staticmethod
    def key(args, kwargs):
        return _bias_key("relative_bias_vector", args, kwargs, rows=None)


class ExpandBias:
    build = "posenc.relative._decode:build_expand"

    @staticmethod
    def key(args, kwargs):
        if len(args) != 3:
            return None
        vec, q_len, k_len = args
        if type(q_len) is not int or q_len != 1 or type(k_len) is not int:
            return None
        key = ("expand_bias", array_key(vec), context_key(vec), k_len, keywords_key(kwargs))  # vec's shape fixes k_len
        return None if None in key else key


def _offset_key(kwargs):
    """A logits call's ``offset``: None or an int (its type), or one per batch row without
    per-token positions (an array with axes: its ``array_key``); else None (no plan)."""
    offset = kwargs.get("offset")
    if offset is None or type(offset) is int:
        return type(offset)
    if getattr(offset, "ndim", 0) and all(kwargs.get(n) is None for n in _POSITIONS):
        return array_key(offset)
    return None


class ShawLogits:
    """``shaw_logits(q, k, table_k, max_distance=K)`` with an ``offset`` (None, an int or one
    per batch row) or per-token positions."""

    build = "posenc.relative._logits_plan:build_shaw"

    @staticmethod
    def key(args, kwargs):
        if len(args) != 3:
            return None
        positions = tuple(kwargs.get(n) for n in _POSITIONS)
        key = (
            "shaw_logits", *map(array_key, args), *map(value_key, positions), context_key(*args, *positions, kwargs.get("offset")),
            _offset_key(kwargs), keywords_key(kwargs, "offset", *_POSITIONS),
        )  # fmt: skip
        return None if None in key else key


class DebertaLogits:
    """``deberta_logits(q, k, pos_q, pos_k, max_distance=K, ...)`` with an ``offset`` (None,
    an int or one per batch row) or per-token positions; ``terms`` by value (a tuple or list
    of names)."""

    build = "posenc.relative._logits_plan:build_deberta"

    @staticmethod
    def key(args, kwargs):
        terms = kwargs.get("terms", ())
        if len(args) != 4 or type(terms) not in (tuple, list):
            return None
        positions = tuple(kwargs.get(n) for n in _POSITIONS)
        tables = tuple(a for a in args if a is not None)
        key = (
            "deberta_logits", *map(value_key, args), *map(value_key, positions), context_key(*tables, *positions, kwargs.get("offset")),
            _offset_key(kwargs), "terms" in kwargs, type(terms), *((type(t), t) for t in terms), keywords_key(kwargs, "offset", "terms", *_POSITIONS),
        )  # fmt: skip
        return None if None in key else key
