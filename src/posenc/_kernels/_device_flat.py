"""How a CUDA kernel sees its operands: flat device arrays, offsets and strides as integers.

A numba device array indexed on the host (``a[i]``) walks every element of a strided
view in Python (numba's ``dummyarray``), so the CUDA launchers never slice one: each
operand reaches its kernel as one 1-D device array over the memory it spans (``flat``,
built in a fixed number of steps from the array's pointer, shape and strides) and the
kernel computes every address from integer offsets and strides passed with it.

The rotary kernels walk ``AXES`` leading axes in their grid (``outer...``, ``G``, ``S`` of
``_layout.plan``, padded in front with axes of one element); the heads (``H``) loop inside
a thread. An array with more outer axes than that (eight or more leading axes that do not
merge) gets one launch per index of the extra ones (``launches``).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from numba import cuda

from . import _arrays, _layout

AXES = 5
BATCH_AXES = 4  # batch axes (merged) one Toeplitz launch walks


class NotAligned(ValueError):
    """A second operand's rows do not line up with the first's (``follow``)."""


def flat(view):
    """``(flat, strides)``: a 1-D device array over the memory numba device array ``view``
    spans from its first element (non-negative strides), and ``view``'s element strides."""
    steps = _arrays.element_strides(view)
    span = 0 if 0 in view.shape else 1 + sum([(n - 1) * st for n, st in zip(view.shape, steps)])
    return _arrays.strided(view, (span,), (1,)), steps


def broadcast_strides(shape, strides, lead):
    """Element strides over ``lead`` of an array of ``shape``/``strides`` broadcast to it
    (0 along new axes and along axes of one element)."""
    extra = len(lead) - len(shape)
    return (0,) * extra + tuple([st if n == lead[extra + k] and n != 1 else 0 for k, (n, st) in enumerate(zip(shape, strides))])


def _walked(found):
    """The plan's axes a launch walks, outermost first: ``outer...``, ``G``, ``S``."""
    return (*found.outer, found.g, found.s)


def launches(found):
    """``(sizes, index)`` per launch of ``_layout.plan`` ``found``: the ``AXES`` sizes the grid
    walks (padded in front with ones) and the index along the outer axes beyond them."""
    walked = _walked(found)
    extra = max(0, len(walked) - AXES)
    sizes = (1,) * (AXES - len(walked) + extra) + tuple([a.size for a in walked[extra:]])
    for index in itertools.product(*[range(a.size) for a in walked[:extra]]):
        yield sizes, index


def _split(strides, index):
    """``(offset, walked strides padded to AXES, head stride)`` of plan strides over
    ``outer + (G, H, S)`` for the launch at ``index``."""
    n = len(index)
    walked = strides[n:-2] + (strides[-1],)
    return sum([i * st for i, st in zip(index, strides)]), (0,) * (AXES - len(walked)) + walked, strides[-2]


def operand(strides, index, channel, heads):
    """An operand's geometry: ``(offset, *walked strides, head stride, channel stride, heads)``."""
    offset, walked, head = _split(strides, index)
    return (offset, *walked, head, channel, heads)


def table(strides, index, pair):
    """A per-position table's geometry: ``(offset, *walked strides, pair stride)``."""
    offset, walked, _ = _split(strides, index)
    return (offset, *walked, pair)


BLANK_TABLE = (0,) * (AXES + 2)


@lru_cache(maxsize=256)
def _batch_plan(shape, strides):
    """The merged batch axes (``_layout``'s rule) of arrays with ``strides`` over ``shape``."""
    return _layout._merged(_layout._axes(shape, strides))


def batch_launches(shape, strides):
    """``(sizes, geometries)`` per launch over batch axes ``shape`` of arrays with ``strides``
    (a tuple per array): the ``BATCH_AXES`` sizes the grid walks (merged, padded in front
    with ones) and per array ``(offset, *strides over them)``; one launch unless more than
    ``BATCH_AXES`` axes stay apart after merging."""
    axes = _batch_plan(shape, strides)
    extra = max(0, len(axes) - BATCH_AXES)
    pad = (1,) * (BATCH_AXES - len(axes) + extra)
    sizes = pad + tuple([a.size for a in axes[extra:]])
    walked = [(0,) * len(pad) + tuple([a.strides[n] for a in axes[extra:]]) for n in range(len(strides))]
    for index in itertools.product(*[range(a.size) for a in axes[:extra]]):
        offsets = [sum([i * a.strides[n] for i, a in zip(index, axes)]) for n in range(len(strides))]
        yield sizes, [(offset, *steps) for offset, steps in zip(offsets, walked)]


_KEPT = 64  # constant arrays kept on the devices
_constants: OrderedDict = OrderedDict()
_constants_lock = threading.Lock()


def constant(device, values, stream):
    """Host array ``values`` (frequencies, say) as a device array on ``device``, copied there
    once and kept (the last ``_KEPT``): a call with device inputs copies nothing."""
    key = (device, values.dtype.str, values.tobytes())
    with _constants_lock:
        found = _constants.get(key)
        if found is None:
            found = _constants[key] = cuda.to_device(values, stream=stream)
            while len(_constants) > _KEPT:
                _constants.popitem(last=False)
        else:
            _constants.move_to_end(key)
    return found


def empty(device, dtype, stream):
    """A kept empty device array (an operand a kernel does not read)."""
    return constant(device, np.empty(0, dtype), stream)


def _axis_stride(dims, shape, strides):
    """The one stride that steps through ``dims`` of an array as one axis, or ``None``."""
    for a, b in zip(dims, dims[1:]):
        if strides[a] != strides[b] * shape[b]:
            return None
    return strides[dims[-1]]


def follow(found, lead, second):
    """``(x strides, out strides, heads)`` of ``second`` (an operand of ``rope_cuda``) over
    the axes of plan ``found`` (made for leading axes ``lead``): ``second`` has the same
    sizes as the first operand but along the plan's ``H`` axis (k beside q: fewer heads).
    Raises ``NotAligned`` where it does not."""
    second_lead = tuple([int(n) for n in second.x.shape])[:-1]
    return _follow(found, lead, second_lead, *second.lead())


@lru_cache(maxsize=256)
def _follow(found, lead, second_lead, x_strides, out_strides):
    """``follow`` on tuples (cached: a decoding loop asks the same each step)."""
    if len(second_lead) != len(lead):
        raise NotAligned("k's leading axes differ from q's")
    h_dims = set(found.h.dims)
    covered = set().union(*(a.dims for a in (*found.outer, found.g, found.s, found.h)))
    for d, (n, m) in enumerate(zip(lead, second_lead)):
        if d not in h_dims and n != m or d not in covered and m != 1:
            raise NotAligned("k's rows do not line up with q's")
    result = []
    for steps in (x_strides, out_strides):
        strides = []
        heads_at = len(found.outer) + 1
        for k, axis in enumerate((*found.outer, found.g, found.h, found.s)):
            dims = tuple(d for d in axis.dims if second_lead[d] != 1) if k == heads_at else axis.dims
            st = _axis_stride(dims, second_lead, steps) if dims else 0
            if st is None:
                raise NotAligned("k's head axes do not merge")
            strides.append(st)
        result.append(tuple(strides))
    heads = 1
    for d in found.h.dims:
        heads *= int(second_lead[d])
    return result[0], result[1], heads


@cuda.jit
def _convert(source, target):
    i = cuda.grid(1)
    if i < source.shape[0]:
        target[i] = source[i]


def converted(a, dtype):
    """Numba device array ``a``'s values as ``dtype``, converted on the device (no host copy):
    the memory ``a`` spans, element by element, then viewed with ``a``'s own strides."""
    source, steps = flat(a)
    target = cuda.device_array(source.shape, dtype, stream=a.stream)
    if source.shape[0]:
        _convert[-(-source.shape[0] // 128), 128, a.stream](source, target)
    return _arrays.strided(target, tuple(a.shape), steps)


def device_values(a, dtype):
    """A numba device array of GPU array ``a``'s values as NumPy ``dtype`` (positions, indices:
    small arrays, converted on the device for torch and CuPy)."""
    lib = _arrays.library(a)
    if lib == "torch":
        import torch

        a = a.detach().to(getattr(torch, np.dtype(dtype).name))
    elif lib == "cupy":
        a = a.astype(dtype)
    elif a.dtype != dtype:
        a = converted(a, dtype)
    return _arrays.device_view(a, bits16=False)
