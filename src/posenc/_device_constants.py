"""Host constants (a table builder's frequencies) kept on a torch GPU between calls.

``torch.tensor(values, device="cuda")`` copies from host memory and waits for the copy: a
synchronisation on every call, and an operation a CUDA graph capture refuses. A constant
kept here is copied once per ``(device, dtype, values)`` and read where it is afterwards,
so a call whose positions are on the GPU neither copies nor waits, and can be captured
once a call outside the capture has made its constants.

The last ``_KEPT`` are kept (a dynamic-NTK decode loop brings a new set per step). Two
rules keep a dropped constant's memory from being reused while something may still read
it: a call on a stream other than the one that made the constant records that stream
(``Tensor.record_stream``: the allocator waits for its work before reusing the memory),
and a constant read while a graph is being captured is kept for good (a replay reads it
at any later time).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_KEPT = 64
_kept: OrderedDict = OrderedDict()  # (device, dtype, values) -> (tensor, the stream that made it)
_captured: dict = {}  # the same keys: constants read by a captured graph
_lock = threading.Lock()


def torch_constant(values, dtype, device):
    """``torch.tensor(values, dtype=dtype, device=device)`` (``values`` a tuple of floats,
    ``device`` a torch device), made once and kept; None under a torch dispatch mode (fake
    tensors, ...), whose tensors are no real memory. Not for a traced call: a kept tensor is
    no graph constant. Made outside inference mode, so that any later call may save it for
    a backward pass."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return None
    key = (device, dtype, values)
    stream = torch.cuda.current_stream(device)
    with _lock:
        found = _kept.get(key) or _captured.get(key)
        if found is None:
            with torch.inference_mode(False):
                found = (torch.tensor(values, dtype=dtype, device=device), stream)
            _kept[key] = found
            while len(_kept) > _KEPT:
                _kept.popitem(last=False)
        elif key in _kept:
            _kept.move_to_end(key)
    tensor, made_on = found
    if torch.cuda.is_current_stream_capturing():
        with _lock:
            _captured[key] = found
    elif stream != made_on:
        tensor.record_stream(stream)
    return tensor

