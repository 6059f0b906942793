"""Relative biases as ``score_mod`` callables for ``torch.nn.attention.flex_attention``."""

from __future__ import annotations

import posenc as pe
from posenc import _validate as check
from posenc._xp import is_integer, namespace

KINDS = ("t5", "alibi", "shaw", "deberta", "vector")


def score_mod(kind: str, params, q_len: int, k_len: int, *, offset=None, **options):
    """A flex-attention ``score_mod`` adding a relative bias, without a ``[q, k]`` tensor.

    ``score_mod(kind, params, q_len, k_len, offset=None, **options)`` builds the per-distance
    vector ``vec [heads, q_len + k_len - 1]`` (:func:`posenc.relative_bias_vector` with the
    same ``kind``, ``params``, ``offset`` and options; or ``kind="vector"`` with ``params``
    the vector itself) and returns ``f(score, b, h, q_idx, kv_idx) = score + vec[h, q_idx -
    kv_idx + k_len - 1]``: memory ``O(heads * L)`` instead of ``O(heads * L^2)``, and
    gradients flow to ``params`` through the captured vector. ``offset`` is the first query
    position, ``k_len - q_len`` by default (the queries are the last ``q_len`` keys, as in
    :func:`posenc.attention`'s causal mask; a flex-attention ``mask_mod`` for such queries
    compares ``q_idx + k_len - q_len >= kv_idx``).

    Examples
    --------
    >>> import torch, posenc as pe
    >>> from posenc.torch import score_mod
    >>> mod = score_mod("alibi", torch.from_numpy(pe.alibi_slopes(2)), 3, 3)
    >>> float(mod(torch.tensor(0.0), 0, 0, torch.tensor(2), torch.tensor(0)))   # -slope[0] * (2 - 0)
    -0.125
    >>> step = score_mod("alibi", torch.from_numpy(pe.alibi_slopes(2)), 1, 3)  # one query: rel = 2 - j
    >>> float(step(torch.tensor(0.0), 0, 0, torch.tensor(0), torch.tensor(0)))
    -0.125
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    if kind == "vector":
        if options:
            raise TypeError(f"score_mod('vector') takes no options, got {', '.join(sorted(options))}")
        if offset is not None:
            raise TypeError("score_mod('vector') takes no offset: the vector already holds the distances it was built for")
        check.array("params", params)
        q_len = check.integer("q_len", q_len, minimum=0)
        k_len = check.integer("k_len", k_len, minimum=0)
        vec = params
        want = q_len + k_len - 1
        if vec.ndim != 2 or vec.shape[-1] != want:
            raise ValueError(f"params must be a vector [heads, q_len + k_len - 1 = {want}], got shape {tuple(vec.shape)}")
    else:
        vec = pe.relative_bias_vector(kind, params, q_len, k_len, offset=_read(offset), **options)
    shift = k_len - 1

    def mod(score, b, h, q_idx, kv_idx):
        return score + vec[h, q_idx - kv_idx + shift]

    return mod


def _read(offset):
    """An eager 0-d integer array ``offset`` (a cache length held as a tensor) as the int the
    full path reads from it (``_validate.integer_or_traced``), so the call meets
    ``relative_bias_vector``'s plan of int offsets; anything else as it is, for the full
    path to compute with (a traced value) or to refuse with its own error."""
    if check.is_array(offset) and offset.ndim == 0 and check.is_eager(offset) and is_integer(namespace(offset), offset.dtype):
        return int(offset)
    return offset
