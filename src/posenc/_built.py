"""Index arrays posenc built itself, whose range the CUDA Toeplitz launchers need not read back.

A ``toeplitz_gather``/``toeplitz_scatter`` index from a caller is checked to lie in ``[0,
m)`` before a kernel reads it (``toeplitz.guard_index_values``): on a GPU a reduction and
a read-back, which waits for the device and cannot be captured in a CUDA graph. The
indices posenc forms for its own calls (Shaw's clipped distances, DeBERTa's clipped
buckets, Transformer-XL's capped rows, TENER's ``arange``) lie there by construction; the
function that forms one records it here (``built_in_range``), and the CUDA launcher takes
the range of that very array as known (``known_in_range``). A record is the array's
identity, held by a weak reference: a caller's array, another array of the same values or
a copy is never recorded, and meets the check. posenc writes no recorded array after
recording it.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import _compat
from ._xp import torch_compiling, torch_tensor

_RECORDED: dict = {}  # id(index) -> (weak reference to it, m)


def built_in_range(index, m):
    """``index``, which posenc's own arithmetic made with every value in ``[0, m)``, recorded
    as such where a CUDA launcher may read it (:func:`launchable`; not while ``torch.compile``
    traces, whose tensors are not the ones the compiled graph passes)."""
    if type(index) is np.ndarray or not launchable(index) or torch_compiling():
        return index
    key = id(index)

    def forget(ref):
        if _RECORDED.get(key, (None,))[0] is ref:
            del _RECORDED[key]

    _RECORDED[key] = (weakref.ref(index, forget), m)
    return index


def known_in_range(index, m) -> bool:
    """Whether ``index`` itself was recorded by ``built_in_range`` with a bound of at most ``m``."""
    found = _RECORDED.get(id(index))
    return found is not None and found[0]() is index and found[1] <= m


def launchable(a) -> bool:
    """An array the CUDA launchers may read: a torch tensor off the CPU, a CuPy array or a
    numba device array (the simulator's too)."""
    if torch_tensor(a):
        return a.device.type != "cpu"
    return _compat.is_cupy_array(a) or type(a).__module__.startswith("numba.")
