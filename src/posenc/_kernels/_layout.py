"""Canonical ``(G, H, S)`` row blocks for the rotary kernels, from shapes and strides alone.

A rotary kernel walks the rows of ``x`` (every index of ``x.shape[:-1]``). Rows that share
one position (or one ``cos``/``sin`` row) should share one computation of the angles, so
the batch axes are regrouped as

* ``H``: the largest axis along which the per-position arrays (positions, or cos and sin)
  do not change, i.e. have stride 0 once broadcast (heads, usually);
* ``S`` and ``G``: two more axes, any strides (sequence and batch, usually);
* ``outer``: whatever else does not merge into those, looped over by the launcher.

Adjacent axes merge when every array steps through them as through one axis, so the
common layouts (``[B, H, S, D]`` with positions ``[S]``, ``[B, 1, S]`` or per token) need
no outer loop. Strides are in elements and may be negative or zero. Nothing here touches
data: the launchers build views (NumPy ``as_strided`` or device array views) from a plan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    size: int
    strides: tuple  # one stride (in elements) per array


@dataclass(frozen=True)
class Plan:
    outer: tuple  # Axis, ...
    g: Axis
    h: Axis
    s: Axis

    def shape(self):
        return tuple(a.size for a in self.outer) + (self.g.size, self.h.size, self.s.size)

    def strides(self, array):
        """Strides (in elements) of array number ``array`` over ``outer + (G, H, S)``."""
        return tuple(a.strides[array] for a in (*self.outer, self.g, self.h, self.s))


def _merged(axes):
    merged = []
    for axis in axes:
        if merged:
            prev = merged[-1]
            if all(p == s * axis.size for p, s in zip(prev.strides, axis.strides)):
                merged[-1] = Axis(prev.size * axis.size, axis.strides)
                continue
        merged.append(axis)
    return merged


def plan(shape, strides, *, shared):
    """Group batch axes ``shape`` of arrays with ``strides`` (one tuple per array).

    ``shared``: indices of the per-position arrays, whose stride must be 0 along ``H``.
    """
    count = len(strides)
    axes = [Axis(int(n), tuple(int(st[k]) for st in strides)) for k, n in enumerate(shape) if n != 1]
    axes = _merged(axes)
    unit = Axis(1, (0,) * count)
    candidates = [a for a in axes if all(a.strides[i] == 0 for i in shared)]
    h = max(candidates, key=lambda a: a.size, default=unit)
    rest = [a for a in axes if a is not h]
    # S: the axis with the smallest step through x (array 0), so a block of S rows is
    # close in memory; G: the largest of the others; the remaining ones loop outside.
    s = min(rest, key=lambda a: abs(a.strides[0]), default=unit)
    rest = [a for a in rest if a is not s]
    g = max(rest, key=lambda a: a.size, default=unit)
    outer = tuple(a for a in rest if a is not g)
    return Plan(outer, g, h, s)
