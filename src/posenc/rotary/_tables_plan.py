"""The plan of ``rope_cos_sin`` for positions of NumPy or torch CPU (``posenc._plans``).

The full path validates, reads the frequencies as float64 host numbers and computes
``cos``/``sin`` of ``float64(positions)[..., None] * freqs`` with the namespace's own
operations, scales, doubles the columns in the layout's order and rounds once to the
result dtype. A planned call does those operations with the library's own functions (no
namespace wrapper, no validation), doubling the frequencies rather than the tables (each
column's value is the same function of the same float64 angle), and reads the
frequencies' bytes each call: new or rewritten values are converted and checked again,
and non-finite ones send the call to the full path and its error, as do non-finite float
positions and uint64 positions beyond int64 (checked in one pass per call).
"""

from __future__ import annotations

import math

import numpy as np

from .._kernels import _arrays
from .._xp import cast_pair, namespace

BLOCK = 32  # rows computed ahead in a sequential NumPy decode loop
_EXACT = 2**52  # positions whose float64 values are exact


class TablesPlan:
    def __init__(self, positions, inv_freq, layout, dtype, floating):
        self.torch = not isinstance(positions, np.ndarray)
        self.host = _arrays.host_reader(inv_freq)  # (its bytes: bfloat16 as bits)
        self.floating = floating  # float positions: checked finite on every call, as the full path does
        self.unsigned = _arrays.integer_kind(positions) == "uint64"  # checked within int64 on every call, likewise
        if dtype is None:
            dtype = positions.dtype if floating else None
        if self.torch:
            import torch

            self.lib, self.xp = torch, namespace(xp=torch)
            self.dtype = torch.float32 if dtype is None else dtype
            self.single = None
        else:
            self.lib, self.xp = None, np
            self.dtype = np.dtype(np.float32 if dtype is None else dtype)
            # The key fixes the positions' shape: NumPy's frequencies are shaped to
            # broadcast against ``positions[..., None]``, one position's to be its row
            # (integer positions: the rows ahead are of the next integers).
            self.single = positions.shape if positions.size == 1 and not floating else None
        self.half = layout == "half"
        self.freqs = (None, None)  # (the frequencies' bytes, their float64 values doubled in the layout's order)
        self.last = None  # the position of the last one-position NumPy call
        self.ahead = (None, 0, None, None)  # (the frequencies they were computed with, first position, cos rows, sin rows)

    def _doubled(self, inv_freq):
        """The float64 frequencies of every column, or None for non-finite ones; kept while
        the frequencies' bytes stay the same (an in-place write is seen: the bytes are read)."""
        raw = self.host(inv_freq).tobytes()
        held, doubled = self.freqs
        if raw == held:
            return doubled
        freqs = _float64(inv_freq)
        if not math.isfinite(freqs.sum()):  # a sum that overflows only sends a finite call the long way
            return None
        doubled = np.concatenate([freqs, freqs]) if self.half else np.repeat(freqs, 2)
        if self.torch:
            doubled = self.lib.from_numpy(doubled)
        elif self.single is not None:
            doubled = doubled.reshape(self.single + doubled.shape)
        self.freqs = (raw, doubled)
        return doubled

    def __call__(self, args, kwargs):
        positions, inv_freq = args
        if self.floating and not bool((self.lib or np).isfinite(positions).all()):
            return NotImplemented
        if self.unsigned and not _arrays.int64_extremes_fit((positions, 1)):
            return NotImplemented
        freqs = self._doubled(inv_freq)
        if freqs is None:
            return NotImplemented
        scale = float(kwargs.get("scale", 1.0))  # the call's own: 0.0 and -0.0 share a key
        if self.single is not None and scale == 1.0:
            return self._single(positions, freqs)
        return self._tables(positions, freqs, scale)

    def _single(self, positions, freqs):
        """One position ``p``: a copy of its rows when the rows ahead hold them, else its
        own; the call after position ``p - 1`` computes the rows of ``p .. p + BLOCK - 1``."""
        p = positions.item(0)
        last, self.last = self.last, p
        held, first, cos, sin = self.ahead
        if held is freqs and 0 <= p - first < BLOCK:
            return cos[p - first].copy(), sin[p - first].copy()
        if not -_EXACT < p < _EXACT - BLOCK:
            return self._tables(positions, freqs, 1.0)
        if last != p - 1:
            angle = float(p) * freqs  # float(p): the exact float64 the array product converts p to
            return cast_pair(np, np.cos(angle), np.sin(angle), self.dtype)
        cos, sin = self._tables(np.arange(p, p + BLOCK).reshape((BLOCK, *self.single)), freqs, 1.0)
        self.ahead = (freqs, p, cos, sin)
        return cos[0].copy(), sin[0].copy()

    def _tables(self, positions, freqs, scale):
        # Integer positions times float64 frequencies: the positions promote to float64, as
        # the full path converts them.
        angle = positions[..., None] * freqs
        if self.torch:
            c, s = self.lib.cos(angle), self.lib.sin(angle)
        else:
            c, s = np.cos(angle), np.sin(angle)
        if scale != 1.0:
            c, s = c * scale, s * scale
        # (rounded once to a 16-bit dtype, as the full path's cast rounds them)
        return cast_pair(self.xp, c, s, self.dtype)


def _float64(inv_freq):
    if isinstance(inv_freq, np.ndarray):
        return np.asarray(inv_freq, dtype=np.float64)
    import torch

    return inv_freq.detach().to(torch.float64).numpy()


def build_tables(positions, inv_freq, *, layout, dtype, scale):
    """The plan of a ``rope_cos_sin`` call that the full path served, from its parse
    (``rotary._call.parse_tables``), or None. A layout named by an earlier name
    (``"split"``) takes the full path every time, and its ``FutureWarning`` with it."""
    from .._xp import is_integer
    from ._call import parse_tables

    if getattr(inv_freq, "requires_grad", False) or getattr(positions, "requires_grad", False):
        return None
    if not isinstance(inv_freq, np.ndarray) and type(inv_freq) is not type(positions):
        return None
    if inv_freq.ndim != 1 or layout not in ("half", "interleaved"):
        return None
    call = parse_tables(positions, inv_freq, layout=layout, dtype=dtype, scale=scale)
    return TablesPlan(positions, inv_freq, call.layout, dtype, not is_integer(call.xp, positions.dtype))
