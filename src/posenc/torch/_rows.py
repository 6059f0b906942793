"""The rows of fixed frequencies' ``cos``/``sin`` tables that ``HFRotaryEmbedding`` and the
torch table ops (``_ops``) share: a bounded cache of the rows computed once per set of
frequencies, scale and dtype, and the tables of positions looked up in it or computed afresh."""

from __future__ import annotations

import collections
import functools
import os
import threading

import numpy as np
import torch

import posenc as pe
from posenc import _validate as check


def fixed_tables(inv_freq, scale, dtype, position_ids):
    """``rope_cos_sin`` of integer ``position_ids`` for frequencies fixed in advance
    (``inv_freq`` a tuple of floats): the rows :func:`cached_rows` keeps, or computed afresh
    where it does not serve. The eager call."""
    rows = cached_rows(inv_freq, scale, dtype, position_ids)
    return rows if rows is not None else _afresh(inv_freq, scale, dtype, position_ids)


def stacked_tables(inv_freq, scale, dtype, position_ids):
    """:func:`fixed_tables` as one tensor, ``cos`` and ``sin`` stacked on axis -2
    (``position_ids.shape + (2, rotary_dim)``): the body of ``posenc::rope_cos_sin``, one
    gather from the kept rows where they serve."""
    kept = _kept_rows(inv_freq, scale, dtype, position_ids)
    if kept is not None:
        return _read(kept[0], position_ids)
    return torch.stack(_afresh(inv_freq, scale, dtype, position_ids), dim=-2)


def _afresh(inv_freq, scale, dtype, position_ids):
    with torch.no_grad():
        return pe.rope_cos_sin(position_ids, np.asarray(inv_freq, dtype=np.float64), dtype=dtype, scale=scale)


def cached_rows(inv_freq, scale, dtype, position_ids):
    """``(cos, sin)`` of ``rope_cos_sin`` for CPU integer ``position_ids``, read from rows
    kept between calls, or None where the rows do not serve (other devices, negative
    positions, positions from ``2**16``).

    The rows of positions ``0 .. n - 1`` are kept per ``(inv_freq, scale, dtype)`` (a tuple
    of floats, a float, a torch dtype; ``n`` doubles as larger positions come; the sets
    read last are kept, ``_MOST_CACHED_SETS`` and ``_MOST_CACHED_BYTES`` at most), ``cos``
    and ``sin`` stacked. Each row depends on its position
    only, so every value read is the one computing afresh gives
    (``tests/test_decode_step.py``). The rows hold no autograd history, nor do the rows
    read from them."""
    kept = _kept_rows(inv_freq, scale, dtype, position_ids)
    if kept is None:
        return None
    return _read(kept[1], position_ids), _read(kept[2], position_ids)


def _read(rows, position_ids):
    """The kept ``rows`` at ``position_ids``, a tensor of its own (indexing by a 0-d
    tensor gives a view, whose writes would change the rows every later call reads).
    Many positions by ``index_select``: indexing by a 2-D tensor is 1.6x its time at 64
    positions, 4x at 1,024, where a decode step's one position takes half its time."""
    if position_ids.ndim == 0:
        return rows[position_ids].clone()
    if position_ids.numel() < 64:
        return rows[position_ids]
    return rows.index_select(0, position_ids.reshape(-1)).view(*position_ids.shape, *rows.shape[1:])


def _kept_rows(inv_freq, scale, dtype, position_ids):
    """``(rows, cos, sin)`` kept for these frequencies with a row for every one of
    ``position_ids`` (``rows[p]`` is position ``p``'s ``[cos, sin]``; ``cos`` and ``sin`` are
    its two views), or None where they do not serve."""
    if position_ids.device.type != "cpu" or position_ids.dtype.is_floating_point or not check.is_eager(position_ids):
        return None  # (under torch.func.vmap the values cannot be read: computed afresh)
    count = position_ids.numel()
    if count == 1:  # a decode step: one position, one read of it
        low = high = position_ids.item()
    elif count:
        low, high = (int(v) for v in torch.aminmax(position_ids))
    else:
        return None
    if low < 0 or high >= _MOST_CACHED_ROWS:
        return None
    return _rows_through(inv_freq, scale, dtype, high)


def _rows_through(inv_freq, scale, dtype, high):
    """``(rows, cos, sin)`` kept for these frequencies, with the rows of positions ``0 ..
    high`` at least (grown to twice what was kept, at least, where fewer are kept; never
    beyond ``_MOST_CACHED_ROWS``, which ``high`` is below)."""
    key = (inv_freq, scale, dtype)
    kept = _ROWS.get(key)
    if kept is not None and high < kept[0].shape[0]:
        try:
            _ROWS.move_to_end(key)  # the least recently read set goes first
        except KeyError:  # (another thread evicted it meanwhile: these rows still serve this call)
            pass
        return kept
    count = min(max(high + 1, 2 * (0 if kept is None else kept[0].shape[0]), 64), _MOST_CACHED_ROWS)
    rows = torch.stack(_afresh(inv_freq, scale, dtype, torch.arange(count)), dim=1)
    kept = (rows, rows[:, 0], rows[:, 1])
    with _ROWS_LOCK:  # threads may grow the rows at once: each keeps its own, the last stays
        _ROWS.pop(key, None)
        _ROWS[key] = kept
        while len(_ROWS) > 1 and (len(_ROWS) > _MOST_CACHED_SETS or _kept_bytes() > _MOST_CACHED_BYTES):
            del _ROWS[next(iter(_ROWS))]
    return kept


def _kept_bytes():
    """The bytes of the kept rows, summed over a copy of the sets: a reader's ``move_to_end``
    (outside the lock) would end an iteration of ``_ROWS`` itself with ``RuntimeError``."""
    return sum(rows.nelement() * rows.element_size() for rows, _, _ in tuple(_ROWS.values()))


def frequencies_name(inv_freq, scale):
    """Fixed frequencies and scale as one string, every float in hexadecimal (exact): how
    the ops ``posenc::rope_cos_sin`` and ``rope_cos_sin_rows`` take them, read back by
    :func:`named_frequencies`."""
    return ",".join(v.hex() for v in inv_freq) + ";" + scale.hex()


@functools.lru_cache(maxsize=64)
def named_frequencies(name):
    """``(inv_freq, scale)`` of a :func:`frequencies_name`."""
    inv_freq, scale = name.split(";")
    return tuple(float.fromhex(v) for v in inv_freq.split(",")), float.fromhex(scale)


_ROWS = collections.OrderedDict()
_ROWS_LOCK = threading.Lock()


def _forget_lock():
    """In a forked child: a lock no parent thread holds (a thread growing the rows at the
    fork is not in the child, and would never release it there)."""
    global _ROWS_LOCK
    _ROWS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forget_lock)


# The row sets kept, the least recently read evicted first: a model's one or two (Gemma 3's
# layer types) in each dtype it runs in, for several models in one process (eight sets had
# made a ninth in use rebuild its rows on every call: 0.47 s a decode step at position
# 40000), and at most this many bytes together.
_MOST_CACHED_SETS = 32
_MOST_CACHED_BYTES = 1 << 30

# Positions beyond this compute their rows afresh (a cache of 2**16 rows of 128 float32 is 64 MiB for cos and sin).
_MOST_CACHED_ROWS = 1 << 16
