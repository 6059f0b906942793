"""The plan of ``rope_cos_sin`` for integer positions of NumPy or torch CPU (``posenc._plans``).

The full path validates, reads the frequencies as float64 host numbers and computes
``cos``/``sin`` of ``float64(positions)[..., None] * freqs`` with the namespace's own
operations, scales, doubles the columns in the layout's order and rounds once to the
result dtype. A planned call does those operations with the library's own functions (no
namespace wrapper, no validation), doubling the frequencies rather than the tables (each
column's value is the same function of the same float64 angle), and reads the
frequencies' bytes each call: new or rewritten values are converted and checked again,
and non-finite ones send the call to the full path and its error.
"""

from __future__ import annotations

import math

import numpy as np


class TablesPlan:
    def __init__(self, positions, inv_freq, layout, dtype):
        self.torch = not isinstance(positions, np.ndarray)
        self.host = _host_reader(inv_freq)
        if self.torch:
            import torch

            self.lib = torch
            self.dtype = torch.float32 if dtype is None else dtype
        else:
            self.lib = None
            self.dtype = np.dtype(np.float32 if dtype is None else dtype)
        self.half = layout == "half"
        self.freqs = (None, None)  # (the frequencies' bytes, their float64 values doubled in the layout's order)

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
        self.freqs = (raw, doubled)
        return doubled

    def __call__(self, args, kwargs):
        positions, inv_freq = args
        freqs = self._doubled(inv_freq)
        if freqs is None:
            return NotImplemented
        # Integer positions times float64 frequencies: the positions promote to float64, as
        # the full path converts them.
        angle = positions[..., None] * freqs
        scale = float(kwargs.get("scale", 1.0))  # the call's own: 0.0 and -0.0 share a key
        if self.torch:
            c, s = self.lib.cos(angle), self.lib.sin(angle)
        else:
            c, s = np.cos(angle), np.sin(angle)
        if scale != 1.0:
            c, s = c * scale, s * scale
        if c.dtype != self.dtype:
            c, s = (c.to(self.dtype), s.to(self.dtype)) if self.torch else (c.astype(self.dtype), s.astype(self.dtype))
        return c, s


def _host_reader(inv_freq):
    """How to read ``inv_freq``'s bytes in place: NumPy's own, a torch tensor's (bfloat16 as int16 bits)."""
    if isinstance(inv_freq, np.ndarray):
        return lambda a: a
    import torch

    if inv_freq.dtype == torch.bfloat16:
        return lambda a: a.detach().view(torch.int16).numpy()
    return lambda a: a.detach().numpy()


def _float64(inv_freq):
    if isinstance(inv_freq, np.ndarray):
        return np.asarray(inv_freq, dtype=np.float64)
    import torch

    return inv_freq.detach().to(torch.float64).numpy()


def build_tables(positions, inv_freq, *, layout, dtype, scale):
    from .._xp import is_integer, namespace

    xp = namespace(positions)
    if not is_integer(xp, positions.dtype) or getattr(inv_freq, "requires_grad", False):
        return None
    if not isinstance(inv_freq, np.ndarray) and type(inv_freq) is not type(positions):
        return None
    if inv_freq.ndim != 1:
        return None
    return TablesPlan(positions, inv_freq, layout, dtype)
