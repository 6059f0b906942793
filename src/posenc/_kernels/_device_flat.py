"""How a CUDA kernel sees its operands, and how it is launched.

A numba device array indexed on the host (``a[i]``) walks every element of a strided
view in Python (numba's ``dummyarray``), and numba's launch prepares each argument in
Python (tens of microseconds a call, more than a decode step's whole kernel work), so the
CUDA launchers do neither: each operand is read once from its library's own metadata
(``span``: address, shape, element strides), reaches its kernel as one 1-D array over the
memory it spans (``flat``), and the kernel computes every address from integer offsets and
strides passed with it. ``launch`` hands those arguments to the driver as numba's calling
convention lays them out, checked once per kernel against its signature. The CUDA
simulator has no addresses: there a span keeps the numba device view and ``launch`` is
numba's own.

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
from typing import NamedTuple

import numpy as np

from numba import cuda

from .. import _validate
from . import _arrays, _family, _layout

AXES = 5
BATCH_AXES = 4  # batch axes (merged) one Toeplitz launch walks


class NotAligned(ValueError):
    """A second operand's rows do not line up with the first's (``follow``)."""


class Span(NamedTuple):
    """A GPU array as a kernel reads it: the byte address of its first element, its shape,
    its element strides and the element type the kernel sees (16-bit floats as ``uint16``);
    ``view``: in the CUDA simulator, the numba device view itself (``None`` on a GPU)."""

    ptr: int
    shape: tuple
    strides: tuple
    dtype: np.dtype
    view: object = None


class Flat(NamedTuple):
    """A kernel's 1-D C-contiguous array argument on a GPU: ``size`` elements of ``dtype`` from
    ``ptr``; ``owner``: the device array whose memory it is, where posenc holds one (a constant)."""

    ptr: int
    size: int
    dtype: np.dtype
    owner: object = None


def _element(name, bits16):
    return np.dtype(_arrays.ELEMENT[name] if bits16 and name in _arrays.ELEMENT else name)


def span(a, *, bits16=True, unsigned=False):
    """``a`` (a torch CUDA tensor, CuPy or numba device array) as a ``Span``, its 16-bit floats
    as ``uint16`` bits when ``bits16``, or every element as the unsigned integer of its width
    when ``unsigned`` (kernels that move bits)."""
    lib = _arrays.library(a)
    if lib == "torch":
        ptr, shape, strides = a.data_ptr(), tuple(a.shape), tuple(a.stride())
        element = _element(_arrays.dtype_name(a.dtype), bits16)
    elif lib == "cupy":
        ptr, shape, element = a.data.ptr, tuple(a.shape), _element(a.dtype.name, bits16)
        strides = tuple([st // a.dtype.itemsize for st in a.strides])
    elif type(a).__module__.startswith("numba.cuda.simulator"):
        view = _arrays.device_view(a, bits16=bits16)
        if unsigned:
            view = view.view(np.dtype(f"u{view.dtype.itemsize}"))
        ptr = view._ary.__array_interface__["data"][0]
        return Span(ptr, tuple(view.shape), _arrays.element_strides(view), view.dtype, view)
    else:  # a numba device array on a GPU (its __cuda_array_interface__ costs more Python, by its layout)
        ptr, shape, element = a.device_ctypes_pointer.value or 0, tuple(a.shape), _element(a.dtype.name, bits16)
        strides = _arrays.element_strides(a)
    return Span(ptr, shape, strides, np.dtype(f"u{element.itemsize}") if unsigned else element)


def extent(s):
    """``(lowest, highest + 1)`` byte addresses that ``Span`` ``s`` touches."""
    if 0 in s.shape:
        return s.ptr, s.ptr
    size = s.dtype.itemsize
    low = sum([(n - 1) * st for n, st in zip(s.shape, s.strides) if st < 0])
    high = sum([(n - 1) * st for n, st in zip(s.shape, s.strides) if st > 0])
    return s.ptr + low * size, s.ptr + (high + 1) * size


def overlap(a, b) -> bool:
    """Whether spans ``a`` and ``b`` touch any common byte range."""
    (al, ah), (bl, bh) = extent(a), extent(b)
    return al < bh and bl < ah


def _addresses(s):
    """A NumPy array over the addresses of ``Span`` ``s``'s elements (never read)."""
    size = s.dtype.itemsize
    return _validate.address_view(s.ptr, s.shape, tuple([st * size for st in s.strides]), size)


def separate(out, out_name="out", **inputs):
    """A ``ValueError`` where an element of ``out`` (called ``out_name``) shares memory with
    one of ``inputs`` (``None`` ones are passed over; disjoint views of one buffer are fine):
    the kernels write while they read (a launcher check; the public functions refuse such an
    ``out`` first)."""
    if out is None:
        return
    written = span(out)
    for name, a in inputs.items():
        read = None if a is None else span(a)
        if read is not None and overlap(written, read) and _validate._shares_memory(_addresses(written), _addresses(read)):
            raise ValueError(f"{out_name} shares memory with {name}: the kernel would read what it writes (kernel launcher check)")


def _spanned(shape, strides):
    """Elements from an array's first to its last, for non-negative element ``strides``."""
    return 0 if 0 in shape else 1 + sum([(k - 1) * st for k, st in zip(shape, strides)])


def flat(s):
    """``(flat, strides)``: the 1-D kernel argument over the memory ``Span`` ``s`` spans from
    its first element (non-negative strides), and ``s``'s element strides."""
    n = _spanned(s.shape, s.strides)
    if s.view is not None:
        return _arrays.strided(s.view, (n,), (1,)), s.strides
    return Flat(s.ptr, n, s.dtype), s.strides


def words(a, word):
    """Flat kernel argument ``a`` (``flat``'s) read as ``word``s, each several of its
    elements: its address and its size in bytes multiples of the word's size (the caller
    checked; ``ValueError`` where not, rather than a kernel reading past them)."""
    if type(a) is Flat:
        if a.ptr % word.itemsize or a.size * a.dtype.itemsize % word.itemsize:
            raise ValueError(f"{a.size} elements at {a.ptr:#x} are not whole words of {word.itemsize} bytes (posenc internal error)")
        return Flat(a.ptr, a.size * a.dtype.itemsize // word.itemsize, word, a.owner)
    return type(a)(a._ary.view(word), stream=a.stream)  # (the CUDA simulator's device array; its view checks the same)


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
_captured: dict = {}  # address -> constant that a launch read while its stream was capturing a CUDA graph


def _argument(array):
    """A numba device array as a kernel argument: itself in the simulator, a ``Flat`` on a GPU."""
    if _arrays.cuda_simulator():
        return array
    return Flat(array.device_ctypes_pointer.value or 0, array.shape[0], array.dtype, array)


def constant(device, values, stream):
    """Host array ``values`` (frequencies, say) as a 1-D kernel argument on ``device``, copied
    there once and kept (the last ``_KEPT``): a call with device inputs copies nothing.
    The copy is complete when this returns (``stream`` synchronised, once per constant): a
    copy from host memory is queued behind ``stream``'s work, and the constant serves calls
    on every stream. A new non-empty constant while ``stream`` captures a CUDA graph is a
    ``RuntimeError`` before any driver call (an allocation, a copy from host memory and a
    synchronisation are what a capture refuses, and the refusal ends the capture): a call
    outside the capture makes it first, as ``_device_constants`` asks of torch's.

    A constant dropped from the last ``_KEPT`` is freed once nothing else holds it, so whatever
    launches it later holds it: a plan (``Prepared``), and for a launch recorded into a CUDA
    graph (which may replay it at any time) the process, from that launch on (``_keep_captured``)."""
    key = (device, values.dtype.str, values.tobytes())
    with _constants_lock:
        found = _constants.get(key)
        if found is None:
            if values.size and _capture_under_way(stream):
                raise RuntimeError(
                    f"a new constant of {values.size} values (frequencies, T5 bucket starts) for a CUDA kernel while a CUDA graph is being "
                    "captured: its copy to the device cannot be captured; call once outside the capture first (a warm-up call)"
                )
            array = cuda.to_device(values, stream=stream)
            if values.size:
                stream.synchronize()
            found = _constants[key] = _argument(array)  # (a Flat keeps its array: a plan may outlive the entry)
            while len(_constants) > _KEPT:
                _constants.popitem(last=False)
        else:
            _constants.move_to_end(key)
    return found


def empty(device, dtype, stream):
    """A kept empty kernel argument (an operand a kernel does not read)."""
    return constant(device, np.empty(0, dtype), stream)


def _held(args):
    """The constants among kernel arguments ``args``: ``Flat`` arguments over memory posenc holds."""
    return tuple([a for a in args if type(a) is Flat and a.owner is not None and a.size])


def capturing(stream) -> bool:
    """Whether cuda.core ``stream`` is capturing a CUDA graph (the driver's ``cuStreamIsCapturing``)."""
    from cuda.bindings import driver

    status, state = driver.cuStreamIsCapturing(stream.handle)
    return status == driver.CUresult.CUDA_SUCCESS and state != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _capture_under_way(stream) -> bool:
    """Whether numba ``stream`` is capturing a CUDA graph (never in the simulator, which has none)."""
    return not _arrays.cuda_simulator() and capturing(_core_stream(stream))


def _keep_captured(stream, held):
    """Keep constants ``held`` for good where ``stream`` is capturing: the graph reads their
    memory at every replay, long after they may have left the last ``_KEPT``."""
    if held and capturing(stream):
        with _constants_lock:
            _captured.update([(a.ptr, a) for a in held])


# ---------------------------------------------------------------- launch


def _array_parameters(want):
    def convert(a, params):
        if a.dtype != want:
            raise TypeError(f"kernel argument of {a.dtype}, the kernel reads {want} (posenc internal error)")
        itemsize = want.itemsize
        params += (0, 0, a.size, itemsize, a.ptr, a.size, itemsize)  # numba's layout of a 1-D C array

    return convert


def _tuple_parameters(count):
    def convert(a, params):
        if len(a) != count:
            raise TypeError(f"kernel argument of {len(a)} integers, the kernel reads {count} (posenc internal error)")
        params += [int(v) for v in a]

    return convert


def _int_parameter(a, params):
    params.append(int(a))


def _float_parameter(a, params):
    params.append(float(a))


def parameter_writers(argument_types):
    """Per argument of a kernel of ``argument_types`` (numba types), a function that appends
    it to the driver's parameter list as numba lays it out: a 1-D C-contiguous array as
    ``(meminfo, parent, size, itemsize, data, shape, stride)``, a tuple of int64 element by
    element, an int64 or a float64 as itself. Any other type: ``TypeError``.

    Every parameter is a Python ``int`` or ``float``: ``cuda.core.launch`` passes an int as a
    pointer-sized integer and a float as a double, the bytes of an int64 and a float64 on the
    64-bit hosts CUDA runs on, and reads them far faster than ctypes objects (the rotary
    kernel's 129 parameters: 21 us a launch as ctypes integers, 2 us as ints)."""
    from numba import types

    writers = []
    for t in argument_types:
        if isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C":
            writers.append(_array_parameters(np.dtype(str(t.dtype))))
        elif isinstance(t, types.UniTuple) and t.dtype == types.int64:
            writers.append(_tuple_parameters(t.count))
        elif t == types.int64:
            writers.append(_int_parameter)
        elif t == types.float64:
            writers.append(_float_parameter)
        else:
            raise TypeError(f"no direct launch for a kernel argument of type {t}")
    return writers


_direct: dict = {}


def _direct_launch(kernel, device):
    """``(driver kernel, parameter writers, launch, LaunchConfig)`` of numba dispatcher ``kernel``
    (compiled for one signature) on GPU ``device``, or ``None`` where numba's launch must do
    (the simulator; anything that is not such a dispatcher)."""
    key = (id(kernel), device)
    found = _direct.get(key, False)
    if found is False:
        found = None
        overloads = getattr(kernel, "overloads", None)
        if not _arrays.cuda_simulator() and isinstance(overloads, dict) and len(overloads) == 1:
            from cuda.core import LaunchConfig, launch

            (compiled,) = overloads.values()
            found = (compiled._codelibrary.get_cufunc().kernel, parameter_writers(compiled.argument_types), launch, LaunchConfig, kernel)
        _direct[key] = found  # (the dispatcher is kept alive with its entry: its id stays its own)
    return found


@lru_cache(maxsize=64)
def _core_stream(stream):
    from numba.cuda.cudadrv import driver

    return driver._to_core_stream(stream)


class Prepared:
    """Launches whose arguments are fixed but for the addresses of some arrays: a plan's
    (``posenc._kernels.rope_cuda_plan``). ``launches``: ``(kernel, grid, block, arguments)``;
    ``roles``: ``{address: name}`` of the arrays (``Flat`` arguments at those addresses)
    whose address each call gives by name, under GPU ``device``'s ``_arrays.on_device``.
    Built only where the driver is launched directly and every role is an argument of some
    launch (``ready``: a role never found would leave the build's address in place).
    ``held``: the constants its launches read, alive as long as it is (a plan outlives their
    place among the last ``_KEPT``). A call launches nothing where an address is not a
    multiple of the size of what its kernel reads there (``__call__``)."""

    def __init__(self, launches, device, roles):
        self.steps, self.ready, self.device, self.held = [], True, device, ()
        for kernel, grid, block, args in launches:
            direct = _direct_launch(kernel, device)
            if direct is None:
                self.ready = False
                return
            function, writers, core_launch, config, _ = direct
            params, slots = [], []
            for write, a in zip(writers, args):
                if type(a) is Flat and a.ptr in roles:
                    slots.append((len(params) + 4, roles[a.ptr], a.dtype.itemsize))  # the data pointer of numba's array layout
                write(a, params)
            self.steps.append((function, config(grid=grid, block=block), params, slots, core_launch))
            self.held += _held(args)  # (its parameters hold their addresses only)
        self.ready = {role for step in self.steps for _, role, _ in step[3]} == set(roles.values())

    def __call__(self, stream, addresses) -> bool:
        """Launch with ``addresses`` (by role) on ``stream``; ``False``, launching nothing, where
        an address is not a multiple of the size of what the kernel reads there (a word of
        two elements, ``rope_cuda.WORDS``, where the build's was)."""
        if any([addresses[role] % size for step in self.steps for _, role, size in step[3]]):
            return False
        core = _core_stream(stream)
        with _arrays.on_device(self.device):
            _keep_captured(core, self.held)
            for function, config, params, slots, core_launch in self.steps:
                params = list(params)
                for slot, role, _ in slots:
                    params[slot] = addresses[role]
                core_launch(core, config, function, *params)
        return True


def launch(kernel, device, grid, block, stream, *args):
    """``kernel[grid, block, stream](*args)`` on GPU ``device``: on a GPU straight to the driver
    (arguments: ``Flat``, tuples of ints, ints, floats, as the signature reads them)."""
    direct = _direct_launch(kernel, device)
    if direct is None:
        kernel[grid, block, stream](*args)
        return
    function, writers, core_launch, config, _ = direct
    params = []
    for write, a in zip(writers, args):
        write(a, params)
    core = _core_stream(stream)
    _keep_captured(core, _held(args))
    core_launch(core, config(grid=grid, block=block), function, *params)


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


@_family.cached(cuda.jit)
def _convert(source, target):
    i = cuda.grid(1)
    if i < source.shape[0]:
        target[i] = source[i]


def converted(a, dtype):
    """Numba device array ``a``'s values as ``dtype``, converted on the device (no host copy):
    the memory ``a`` spans, element by element, then viewed with ``a``'s own strides."""
    steps = _arrays.element_strides(a)
    n = _spanned(a.shape, steps)
    target = cuda.device_array((n,), dtype, stream=a.stream)
    if n:
        _convert[-(-n // 128), 128, a.stream](_arrays.strided(a, (n,), (1,)), target)
    return _arrays.strided(target, tuple(a.shape), steps)


def device_values(a, dtype):
    """GPU array ``a``'s values as NumPy ``dtype`` (positions, indices: small arrays, converted on
    the device for torch and CuPy), as an array of ``a``'s library or a numba device array."""
    lib = _arrays.library(a)
    if lib == "torch":
        import torch

        return a.detach().to(getattr(torch, np.dtype(dtype).name))
    if lib == "cupy":
        return a.astype(dtype)
    return a if a.dtype == dtype else converted(a, dtype)
