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
recording it; a torch tensor's record also holds its version counter, so that one written
in place since (the op's result in a caller's hands: ``_traced``) meets the check again.

While ``torch.compile`` traces, the tensor posenc forms is not the one the compiled graph
will pass, so the graph forms it through the op ``posenc::index_in_range`` (``_traced``),
whose run clamps it into ``[0, m)`` on the device (no read-back: a no-op on posenc's
values, and what makes any tensor given to the op safe to take unread) and records its
result, the very tensor the graph passes on to the Toeplitz op.
"""

from __future__ import annotations

import sys
import weakref

import numpy as np

from . import _compat, _dispatch
from ._xp import torch_compiling, torch_tensor

_RECORDED: dict = {}  # id(index) -> (weak reference to it, m, its version, made in a compiled graph)


def built_in_range(index, m, *, in_graph=False):
    """``index``, which posenc's own arithmetic made with every value in ``[0, m)``, recorded
    as such where a CUDA launcher may read it (:func:`launchable`; while ``torch.compile``
    traces, the graph's tensor in its place: ``_traced``). ``in_graph``: recorded while a
    compiled graph runs (:func:`clamped_at_launch`)."""
    if type(index) is np.ndarray or not launchable(index):
        return index
    if torch_compiling():
        return _traced(index, m)
    if m <= 0:  # (no value lies in [0, 0): the launcher's check refuses a non-empty index)
        return index
    key = id(index)

    def forget(ref):
        if _RECORDED.get(key, (None,))[0] is ref:
            del _RECORDED[key]

    _RECORDED[key] = (weakref.ref(index, forget), m, version(index), in_graph)
    return index


def version(a):
    """A torch tensor's version counter (bumped by each in-place write), else None (other
    libraries', and torch's inference tensors, which keep none)."""
    return a._version if torch_tensor(a) and not a.is_inference() else None


def _traced(index, m):
    """``posenc::index_in_range(index, m)`` in the graph ``torch.compile`` traces: at run time,
    ``index`` clamped into ``[0, m)`` (the same values: posenc built them there) and recorded."""
    _dispatch.ready("torch")  # (registers the op; run once while tracing, not traced)
    return sys.modules["torch"].ops.posenc.index_in_range(index, m)


def known_in_range(index, m) -> bool:
    """Whether ``index`` itself was recorded by ``built_in_range`` with a bound of at most ``m``."""
    found = _RECORDED.get(id(index))
    return found is not None and found[0]() is index and found[1] <= m and found[2] == version(index)


def clamped_at_launch(index) -> bool:
    """Whether the record of ``index`` was made while a compiled graph ran: inductor reuses a
    buffer once its last reader in the graph is done, writing other values into the same
    tensor object without a version bump (a caller's index, possibly out of range), so the
    launcher clamps such an index into its range on the device instead of trusting it (the
    same values where posenc's own still lie there; in bounds whatever was written)."""
    found = _RECORDED.get(id(index))
    return found is not None and found[3]


def launchable(a) -> bool:
    """An array the CUDA launchers may read: a torch tensor off the CPU, a CuPy array or a
    numba device array (the simulator's too)."""
    if torch_tensor(a):
        return a.device.type != "cpu"
    return _compat.is_cupy_array(a) or type(a).__module__.startswith("numba.")
