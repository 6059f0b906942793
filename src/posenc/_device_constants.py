"""Host constants (a table builder's frequencies) kept on a torch GPU between calls
(:func:`torch_constant`), and on a CuPy device (:func:`kept_array`).

``torch.tensor(values, device="cuda")`` copies from host memory and waits for the copy: a
synchronisation on every call, and an operation a CUDA graph capture refuses. A constant
kept here is copied once per ``(device, dtype, values)`` (the values' bytes: 0.0 is not
-0.0) and read where it is afterwards, so a call whose positions are on the GPU neither
copies nor waits, and can be captured once a call outside the capture has made its
constants (a call that needs a new one while capturing raises ``RuntimeError``).

A constant is made by a thread of its own, on the device's default stream: torch's CUDA
graph trees (``torch.compile(mode="reduce-overhead")``) send every allocation of the
thread that runs their warm-up to the graphs' private memory pool, whose bookkeeping
knows nothing of a tensor kept beyond the warm-up and may hand its memory to a later
recording.

The last ``_KEPT`` are kept (a dynamic-NTK decode loop brings a new set per step). Two
rules keep a dropped constant's memory from being reused while something may still read
it: a call on a stream other than the default one records that stream
(``Tensor.record_stream``: the allocator waits for its work before reusing the memory),
and a constant read while a graph is being captured is kept for good (a replay reads it
at any later time).
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict

from . import _compat

_KEPT = 64
_kept: OrderedDict = OrderedDict()  # (device, dtype, bytes of the values) -> tensor
_kept_arrays: OrderedDict = OrderedDict()  # (namespace, device, dtype, bytes of the values) -> array
_captured: dict = {}  # the same keys: constants read by a captured graph
_lock = threading.Lock()


def torch_constant(values, dtype, device, what="rotary tables of new frequencies"):
    """``torch.tensor(values, dtype=dtype, device=device)`` (``values`` a tuple of floats, of
    ints for an integer ``dtype``; ``device`` a torch CUDA device), made once and kept; None
    under a torch dispatch mode (fake tensors, ...), whose tensors are no real memory. Not
    for a traced call: a kept tensor is no graph constant. ``what`` names the values in the
    ``RuntimeError`` of a new constant while a CUDA graph is being captured."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return None
    key = (device, dtype, struct.pack(f"{len(values)}{'d' if dtype.is_floating_point else 'q'}", *values))
    capturing = _capturing(torch, device)
    with _lock:
        tensor = _kept.get(key)
        if tensor is not None:
            _kept.move_to_end(key)
        else:
            tensor = _captured.get(key)
    if tensor is None:
        if capturing:
            raise RuntimeError(
                f"{what} while a CUDA graph is being captured: their copy to "
                "the device cannot be captured; call once outside the capture first (a warm-up call)"
            )
        tensor = _made_apart(torch, values, dtype, device)
        with _lock:
            tensor = _kept.setdefault(key, tensor)  # (another thread's, made meanwhile, wins)
            while len(_kept) > _KEPT:
                _kept.popitem(last=False)
    if capturing:
        with _lock:
            _captured[key] = tensor
    else:
        stream = torch.cuda.current_stream(device)
        if stream != torch.cuda.default_stream(device):
            tensor.record_stream(stream)
    return tensor


def _capturing(torch, device):
    """Whether ``device``'s current stream is capturing a CUDA graph."""
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _made_apart(torch, values, dtype, device):
    """``torch.tensor(values, ...)`` made by a new thread (out of any memory pool the
    caller's thread allocates to; outside inference mode, so that later calls may save it
    for a backward pass), complete when this returns."""
    made = []

    def make():
        try:
            made.append(torch.tensor(values, dtype=dtype, device=device))
        except BaseException as exc:  # (raised again in the caller's thread)
            made.append(exc)

    thread = threading.Thread(target=make, name="posenc-device-constant")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def kept_array(xp, values, dtype, device):
    """``xp.asarray(values, dtype=dtype, device=device)`` (``values`` a NumPy array) for an
    accelerator that is not torch's (CuPy): made once per ``(namespace, device, dtype,
    values)`` and kept (the last ``_KEPT``), so a call neither copies host memory onto the
    device nor waits for it. The one copy is waited for on the stream that made it, so that
    a call on any stream reads it complete; one dropped past ``_KEPT`` is released after
    its device has finished the work queued so far (``_released``: CuPy has no
    ``record_stream``, and its pool could hand the memory to the stream that made it while
    another stream's queued call still reads it). The caller does not write into it."""
    key = (xp.__name__, str(device), str(dtype), values.dtype.str, values.tobytes())
    with _lock:
        array = _kept_arrays.get(key)
        if array is not None:
            _kept_arrays.move_to_end(key)
            return array
    array = xp.asarray(values, dtype=dtype, device=device, copy=True)
    _copied(array)
    with _lock:
        array = _kept_arrays.setdefault(key, array)  # (another thread's, made meanwhile, wins)
        dropped = [_kept_arrays.popitem(last=False)[1] for _ in range(len(_kept_arrays) - _KEPT)]
    for old in dropped:
        _released(old)
    return array


def _released(array):
    """Waits for every stream of the CuPy ``array``'s device before its last reference goes
    (rare: a constant dropped past ``_KEPT``)."""
    if _compat.is_cupy_array(array):
        array.device.synchronize()


def _copied(array):
    """Waits for the copy that made the CuPy ``array`` (on the current stream)."""
    if _compat.is_cupy_array(array):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
