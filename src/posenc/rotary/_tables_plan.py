"""The plan of ``rope_cos_sin`` for integer positions of NumPy or torch CPU (``posenc._plans``).

The full path validates, reads the frequencies as float64 host numbers and computes
``cos``/``sin`` of ``float64(positions)[..., None] * freqs`` with the namespace's own
operations, scales, doubles the columns in the layout's order and rounds once to the
result dtype. A planned call does those operations with the library's own functions (no
namespace wrapper, no validation), doubling the angles rather than the tables (each
column's value is the same function of the same float64 angle), and reads the
frequencies' values afresh each call: non-finite ones send the call to the full path and
its error.
"""

from __future__ import annotations

import math

import numpy as np


class TablesPlan:
    def __init__(self, positions, layout, dtype):
        self.torch = not isinstance(positions, np.ndarray)
        if self.torch:
            import torch

            self.lib = torch
            self.dtype = torch.float32 if dtype is None else dtype
        else:
            self.lib = None
            self.dtype = np.dtype(np.float32 if dtype is None else dtype)
        self.half = layout == "half"

    def _freqs(self, inv_freq):
        if isinstance(inv_freq, np.ndarray):
            return np.asarray(inv_freq, dtype=np.float64)
        return inv_freq.detach().to(self.lib.float64).numpy()

    def _doubled(self, t):
        n = int(t.shape[-1])
        if self.torch:
            torch = self.lib
            return torch.cat([t, t], dim=-1) if self.half else torch.stack([t, t], dim=-1).reshape(*t.shape[:-1], 2 * n)
        return np.concatenate([t, t], axis=-1) if self.half else np.stack([t, t], axis=-1).reshape(*t.shape[:-1], 2 * n)

    def __call__(self, positions, inv_freq, *, scale, **_):
        freqs = self._freqs(inv_freq)
        if not math.isfinite(freqs.sum()):  # a sum that overflows only sends a finite call the long way
            return NotImplemented
        if self.torch:
            torch = self.lib
            angle = self._doubled(positions.to(torch.float64)[..., None] * torch.from_numpy(freqs))
            c, s = torch.cos(angle), torch.sin(angle)
        else:
            angle = self._doubled(positions.astype(np.float64)[..., None] * freqs)
            c, s = np.cos(angle), np.sin(angle)
        scale = float(scale)  # the call's own: 0.0 and -0.0 share a key
        if scale != 1.0:
            c, s = c * scale, s * scale
        if c.dtype != self.dtype:
            c, s = (c.to(self.dtype), s.to(self.dtype)) if self.torch else (c.astype(self.dtype), s.astype(self.dtype))
        return c, s


def build_tables(positions, inv_freq, *, layout, dtype, scale):
    from .._xp import is_integer, namespace

    xp = namespace(positions)
    if not is_integer(xp, positions.dtype) or getattr(inv_freq, "requires_grad", False):
        return None
    if not isinstance(inv_freq, np.ndarray) and type(inv_freq) is not type(positions):
        return None
    if inv_freq.ndim != 1:
        return None
    return TablesPlan(positions, layout, dtype)
