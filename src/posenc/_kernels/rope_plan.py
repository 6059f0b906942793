"""Plans of the rotary CPU kernels: ``rope`` and ``apply_rope`` launched without the front of a call.

``posenc._plans`` keys a call; the first call with a key takes the full path (validation,
the registry, ``rope_cpu``'s launcher) and, where that path ends in ``rope_cpu``'s kernel,
``build_rotate`` / ``build_apply`` precompute here what the key fixes: the compiled
specialisation, the ``(G, H, S)`` grouping and every offset and stride, the block and
task split. A planned call then only views ``x``, allocates the result (or takes the caller's
``out``: ``x`` itself, or a buffer sharing no memory with ``x``) and launches the
same kernel on the same values (positions: the float64 positions of ``offset=0``, as the
launcher converts them, plus the offset, exact below 2**52; ``cos``/``sin`` rows read in
place), so its numbers are the full path's.
Plans cover a single ``(G, H, S)`` group (no outer loop) and a unit-stride channel axis.
"""

from __future__ import annotations

import copy
import math
import sys
import threading

import numpy as np

from .. import _dispatch
from .._xp import length_through
from . import _arrays, _layout, rope_cpu
from .rope_cpu import FAST_ANGLE_LIMIT

# How NumPy holds a torch result's elements (``_arrays.empty``): bfloat16 as int16 bits.
_TORCH_STORAGE = {"bfloat16": np.int16, "float16": np.float16}
_EXACT = 2**52  # offsets whose float64 positions are exact integers


class _Launch:
    """The kernel launch of one signature: ``x``'s host view in; out, a new array of ``x``'s kind,
    ``x`` itself, or the caller's buffer of the layout the plan was built for."""

    def __init__(self, op, layout, x, xv, per_position, half, out=None):
        dtype = _arrays.dtype_name(x.dtype)
        self.torch = _arrays.library(x) == "torch"
        self.shape, self.dtype = tuple(xv.shape), x.dtype
        self.storage = _TORCH_STORAGE.get(dtype, _arrays.ELEMENT[dtype]) if self.torch else x.dtype
        self.element = _arrays.ELEMENT[dtype]
        self.in_place, self.into = out is x, out is not None and out is not x
        # The layout written: x's own (in place), the caller's buffer's, or a new result's C order.
        ov = xv if self.in_place else _arrays.host_view(out) if self.into else np.empty(xv.shape, xv.dtype)
        self.out_contiguous = ov.flags.c_contiguous  # (a key fixes out's strides)
        # Proofs that a buffer is not x's memory, from what the key fixes: two distinct NumPy
        # arrays that each own their memory (the key holds that flag) cannot overlap; a torch
        # buffer's bytes lie at fixed offsets from its data pointer, as x's do.
        self.owned = not self.torch and self.into and x.flags.owndata and out.flags.owndata
        self.extents = (_extent(xv), _extent(ov)) if self.torch and self.into else None
        # (The per-position views are the plan's to read once: a launch keeps none of the caller's arrays.)
        self.grouping, views = _layout.rotary_views(xv, ov, per_position)
        self.view_geometry = tuple((v.shape, v.strides) for v in views)
        plan = self.grouping
        x_flat, x_offset = _arrays.flat_span(xv)
        o_flat, o_offset = _arrays.flat_span(ov)
        self.xs = (x_offset, *plan.strides(0))
        self.os = (o_offset, *plan.strides(1))
        self.heads, self.dim = plan.h.size, xv.shape[-1]
        most = max(1, xv.size // rope_cpu._ELEMENTS_PER_THREAD)
        rows = plan.g.size * plan.s.size
        self.block = max(1, min(rope_cpu._BLOCK, rows // (4 * min(_layout.threads(), most))))
        self.tasks = plan.g.size * -(-plan.s.size // self.block)
        self.most = min(most, self.tasks)  # workers the size allows; Numba's thread count is read per call
        self.kernel = rope_cpu.FAMILY[op, dtype, layout]
        self.lib = sys.modules["torch"] if self.torch else np
        self.host = _arrays.host_reader(x)
        self.contiguous = xv.flags.c_contiguous  # (a key fixes x's strides)
        # A torch view's span, in elements from its first (torch strides are not negative): a
        # planned call views it in one step (Tensor.as_strided), not through flat_span's NumPy
        # slicing (10 us of a 33 us rotate_pair of q and k [1, h, 2, 128] views of [1, 2, h, 128]).
        self.x_span = x_flat.size if self.torch and not self.contiguous else None
        self.o_span = o_flat.size if self.torch and self.into and not self.out_contiguous else None
        self.half = half  # pairs rotated per row: the width of the scratch tables
        self._scratch, self._busy = None, threading.Lock()

    def scratch(self, workers=1):
        return [
            (np.empty((self.block, self.half)), np.empty((self.block, self.half)), np.empty((4, self.block, self.half), np.float32))
            for _ in range(workers)
        ]

    def viewable(self):
        return not self.grouping.outer and 0 not in self.grouping.shape() and self.dim > 0

    def result(self):
        """``(result, its flat NumPy view)``: as ``_arrays.empty`` allocates it."""
        held = np.empty(self.shape, self.storage)
        if self.torch:
            torch = self.lib
            result = torch.from_numpy(held)
            if self.dtype == torch.bfloat16:
                result = result.view(torch.bfloat16)
            return result, held.view(self.element).reshape(-1)
        return held, held.view(self.element).reshape(-1)

    def _flat(self, a, span, contiguous):
        """The 1-D host view of the memory ``a`` spans (``x`` or ``out``, of the layout the key fixes)."""
        if span is not None:
            return self.host(a.as_strided((span,), (1,)))
        view = self.host(a)
        return view.ravel() if contiguous else _arrays.flat_span(view)[0]

    def run(self, x, arguments, out=None):
        """The kernel over every task; one worker runs on the calling thread, in the plan's own
        scratch unless another thread holds it (then in fresh buffers). ``NotImplemented`` for
        an ``out`` that shares memory with ``x`` without being ``x`` (the full path computes
        that one aside and copies it in)."""
        x_flat = self._flat(x, self.x_span, self.contiguous)
        if self.in_place:
            result, o_flat = x, x_flat
        elif self.into:
            if self.torch:
                (x_low, x_high), (o_low, o_high) = self.extents
                at, to = x.data_ptr(), out.data_ptr()
                if at + x_low < to + o_high and to + o_low < at + x_high:
                    return NotImplemented
            result, o_flat = out, self._flat(out, self.o_span, self.out_contiguous)
            if not self.torch and not self.owned and np.may_share_memory(o_flat, x_flat):  # (a flat view spans what its array spans)
                return NotImplemented
        else:
            result, o_flat = self.result()
        arguments = (x_flat, self.xs, o_flat, self.os, self.heads, self.dim, not self.in_place, *arguments)
        workers = min(self.most, _layout.threads()) if self.most > 1 else 1  # (numba.set_num_threads since the plan was built)
        if workers > 1:
            _layout.run_tasks(self.kernel, arguments, self.tasks, self.scratch(workers))
        elif self._busy.acquire(blocking=False):
            try:
                if self._scratch is None:
                    self._scratch = self.scratch()[0]
                self.kernel(*arguments, *self._scratch, 0, self.tasks)
            finally:
                self._busy.release()
        else:
            self.kernel(*arguments, *self.scratch()[0], 0, self.tasks)
        return result


def _extent(view):
    """The bytes NumPy array ``view`` spans, as ``(low, high)`` offsets from its first element."""
    low = sum((n - 1) * st for n, st in zip(view.shape, view.strides) if st < 0)
    high = sum((n - 1) * st for n, st in zip(view.shape, view.strides) if st > 0)
    return low, high + view.itemsize


def _host_kernel(impl, name):
    return impl is getattr(rope_cpu, name)


def _writable_directly(xv, out):
    """The kernel reads ``x`` and writes ``out`` (or ``x`` itself) with unit-stride channels and
    whole strides, as ``rope_cpu._destination`` requires of the memory it writes directly."""
    return all(rope_cpu._unit_channels(v) and _arrays.whole_strides(v) for v in (xv, *(() if out is None else (_arrays.host_view(out),))))


class RotatePlan:
    """``rope(x, offset=n)`` with default positions: the positions of ``offset=0``, plus ``n``
    (an int, or where ``read``, the one integer of an offset array: ``_read_as_int``)."""

    def __init__(self, x, xv, layout, sample, inv_freq, sign, scale, out, lengths=None, read=False):
        # As rope_cpu.rotate_positions converts and lays them out, for offset 0.
        pv = np.broadcast_to(_arrays.host_values(sample).astype(np.float64, copy=False), xv.shape[:-1])
        self.launch = _Launch("rotate", layout, x, xv, [pv], len(inv_freq), out)
        self.grid = _grid(pv, self.launch)  # [G, S]: no outer axes in a plan
        self.low, self.high = (float(v) for v in (pv.min(), pv.max()))
        self.read = read
        _angles(self, x, inv_freq, sign, scale, lengths)

    def __call__(self, args, kwargs):
        offset, out = kwargs.get("offset", 0), kwargs.get("out")
        if self.read:
            if out is not None and _overlaps(out, offset):
                return NotImplemented  # the full path refuses an out over the offset it reads
            offset = offset.item()
        if not -_EXACT < offset < _EXACT:
            return NotImplemented
        angles = self.angles_of(kwargs, self.high + offset)
        # rope_cpu.rotate_positions leaves larger angles to the reference: so does the plan.
        if angles is None or not max(abs(self.low + offset), abs(self.high + offset)) * angles[1] <= FAST_ANGLE_LIMIT:
            return NotImplemented
        return self.launch.run(args[0], (self.grid + float(offset), *angles[0], *self.tables), out)


def _angles(plan, x, inv_freq, sign, scale, lengths):
    """A rotation plan's frequencies and the kernel's angle arguments: the parse's, or for a
    length-dependent scaling (``lengths``) those of each call's length."""
    fixed = _angle_arguments(inv_freq, sign, scale)
    plan.lengths = lengths
    plan.angles_of = (lambda kwargs, top: fixed) if lengths is None else lengths.angles_of
    plan.tables = (rope_cpu._NO_TABLES[_arrays.dtype_name(x.dtype)],) * 2


def _angle_arguments(inv_freq, sign, scale):
    """``((inv_freq, sign, scale), largest frequency)``: the kernel's angle arguments, the
    frequencies in float64, and the bound the fast angle reduction is checked against."""
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    return (inv_freq, sign, float(scale)), float(np.abs(inv_freq).max())


class _LengthAngles:
    """The kernel's angle arguments under a scaling whose frequencies depend on the length
    (dynamic NTK, LongRoPE), for each call's length: its ``seq_len`` (an int >= 0: the key
    refuses others), else ``ceil(largest position) + 1`` as the full path reads it
    (``rotary._args.sequence_length``). The frequencies are the scaling's own at that length
    in float64, as the full path's ``scaling.frequency_table`` gives them, kept for the last
    ``KEPT`` lengths."""

    KEPT = 64

    def __init__(self, scaling, rotary_dim, base, sign, inverse):
        self.scaling, self.rotary_dim, self.base, self.sign, self.inverse = scaling, rotary_dim, base, sign, inverse
        self.kept = {}

    def angles_of(self, kwargs, top):
        """``(angles, largest frequency)`` of the call, or None where the full path must decide
        (a largest position that is not finite, a length the scaling refuses)."""
        seq_len = kwargs.get("seq_len")
        if seq_len is None:
            if not math.isfinite(top):
                return None
            seq_len = length_through(top)
        found = self.kept.get(seq_len)
        if found is None:
            try:
                inv_freq, scale = self.scaling.frequencies(self.rotary_dim, self.base, seq_len)
            except Exception:  # the full path raises its own error
                return None
            found = _angle_arguments(inv_freq, self.sign, 1.0 / float(scale) if self.inverse else scale)
            if len(self.kept) >= self.KEPT:
                self.kept.clear()
            self.kept[seq_len] = found
        return found


def _grid(pv, launch):
    """The kernel's ``[G, S]`` float64 positions: ``pv`` (broadcast to ``x.shape[:-1]``) as the launch reads it."""
    shape, strides = launch.view_geometry[0]
    return np.ascontiguousarray(np.lib.stride_tricks.as_strided(pv, shape, strides))


class PositionsPlan:
    """``rope(x, positions, offset=...)`` with positions or an offset given as arrays: each
    call forms the full path's positions from its own arrays, read as NumPy values
    (``host_values``: the same int64 or float64 sums as the arrays' library makes, at a
    fraction of a torch operation's cost; an offset of one integer, ``read``, as the int it
    holds: ``_read_as_int``), converts them to float64 as the launcher does, and
    launches the kernel. The values are checked by the integer rule (``_Source``) and the
    launcher's angle bound, which also catches a non-finite float position: such a call
    takes the full path (its error, or the reference for angles beyond the fast reduction)."""

    def __init__(self, x, xv, layout, placed, source, inv_freq, sign, scale, out, lengths=None, positions=None, offset=0, read=False):
        self.source = source
        pv = _contiguous_float64(placed)
        self.launch = _Launch("rotate", layout, x, xv, [np.broadcast_to(pv, xv.shape[:-1])], len(inv_freq), out)
        # The view the kernel reads of a C-contiguous float64 copy of the positions, in its
        # bytes: placing positions only adds axes of length 1, so their order is the same.
        self.view = self.launch.view_geometry[0]
        self.size = pv.size
        # One position the kernel may read at several cells (x's batch and head axes unmerged).
        self.cells = math.prod(self.view[0])
        self.host = None if positions is None else _values_reader(positions)
        self.read = read
        self.offset_host = None if read or type(offset) is int else _values_reader(offset)
        _angles(self, x, inv_freq, sign, scale, lengths)

    def __call__(self, args, kwargs):
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        out, offset = kwargs.get("out"), kwargs.get("offset", 0)
        if out is not None and _overlaps(out, positions, offset):
            return NotImplemented  # the full path decides by elements (and refuses a true overlap)
        if self.read:
            offset = offset.item()
        elif self.offset_host is not None:
            offset = self.offset_host(offset)
        pv = self.source(None if self.host is None else self.host(positions), offset)
        if pv is None:
            return NotImplemented  # a sum beyond int64: the full path's error
        if pv.dtype != np.float64 or not pv.flags.c_contiguous:
            pv = np.ascontiguousarray(pv, dtype=np.float64)
        angles = self.angles_of(kwargs, float(pv.max()) if self.lengths is not None and self.size else math.nan)
        if angles is None:
            return NotImplemented
        if self.size == 1:
            if not abs(pv.item()) * angles[1] <= FAST_ANGLE_LIMIT:
                return NotImplemented
            grid = pv.reshape(self.view[0]) if self.cells == 1 else np.full(self.view[0], pv.item())
        else:
            if self.size and not float(np.abs(pv).max()) * angles[1] <= FAST_ANGLE_LIMIT:
                return NotImplemented
            grid = np.ascontiguousarray(np.ndarray(self.view[0], np.float64, pv, 0, self.view[1]))
        return self.launch.run(args[0], (grid, *angles[0], *self.tables), kwargs.get("out"))


def _contiguous_float64(positions):
    """``positions`` as rope_cpu.rotate_positions converts them (``host_values``, float64), C-contiguous."""
    return np.ascontiguousarray(_arrays.host_values(positions), dtype=np.float64)


def _values_reader(positions):
    """``_arrays.host_values`` for arrays of ``positions``' signature (NumPy, or a torch tensor NumPy can view)."""
    if isinstance(positions, np.ndarray):
        return lambda p: p
    if positions.dtype.is_floating_point and positions.dtype.itemsize == 2 or positions.requires_grad:
        return _arrays.host_values
    return lambda p: p.numpy()


class _Source:
    """The positions ``rope`` hands its kernel, from a call's ``positions`` and ``offset``
    whose metadata the plan's key fixes: the given positions or ``arange`` along the
    sequence axis, plus the offset (an int, or per-row values reshaped onto the batch
    axes, with the positions reshaped as ``rotary._args`` places them), by the arrays' own
    operations. Without per-row values the positions keep their shape: placing them only
    adds axes of length 1."""

    def __init__(self, given_shape, base, offset_shape, positions_kind, offset_kind):
        self.given_shape, self.base, self.offset_shape = given_shape, base, offset_shape
        # The integer rule: integer values widened to int64, every value and sum within int64.
        # The key fixes the dtypes: their kinds ("narrow": at most 32 bits, "int64", "uint64",
        # "small": the plan's own arange, None: float or no array) say which calls must
        # read extremes first.
        self.positions_kind, self.offset_kind = positions_kind, offset_kind
        self.known = None if base is None else (0, math.prod(base.shape) - 1)  # (an arange from 0)

    def without_base(self):
        """This source for positions given as its ``base`` would be (an arange a caller makes
        for each call: a CUDA plan keeps no device array)."""
        return _Source(tuple(self.base.shape), None, self.offset_shape, "small", self.offset_kind)

    def _must_check(self, offset):
        if "uint64" in (self.positions_kind, self.offset_kind) or self.offset_kind == "int64":
            return True
        if type(offset) is not int:  # an array (or scalar) of at most 32 bits: only int64 positions may leave int64 with it
            return self.positions_kind == "int64"
        return offset != 0 and (self.positions_kind == "int64" or abs(offset) >= 2**62)

    def _placed(self, positions, offset):
        """``(positions, offset)`` placed as ``rotary._args`` places them: the plan's own
        arange, or the given positions and per-row offsets reshaped onto the batch axes."""
        if self.base is not None:
            positions = self.base
        elif self.offset_shape is not None and tuple(positions.shape) != self.given_shape:
            positions = positions.reshape(self.given_shape)
        if self.offset_shape is not None and tuple(offset.shape) != self.offset_shape:
            offset = offset.reshape(self.offset_shape)
        return positions, offset

    def __call__(self, positions, offset):
        positions, offset = self._placed(positions, offset)
        if self._must_check(offset):
            parts = [(offset, 1)] + ([(self.known or positions, 1)] if self.positions_kind else [])
            if not _arrays.int64_extremes_fit(*parts):
                return None  # the full path checks them one by one
        if self.positions_kind in ("narrow", "uint64"):
            positions = _int64(positions)
        if self.offset_kind in ("narrow", "uint64"):
            offset = _int64(offset)
        if self.positions_kind is None:  # float positions: summed with the offset in float64, as check.shifted does
            positions = _float64(positions)
        return positions if type(offset) is int and offset == 0 else positions + offset

    def summed(self, positions, offset):
        """``float64(positions) + float64(offset)``, placed as ``__call__`` places them: the
        sums ``rotary._args.shifted`` makes on a device unread (an offset array, or given
        positions with an int offset other than 0), which need no check of their values."""
        positions, offset = self._placed(positions, offset)
        return _float64(positions) + (offset if type(offset) is int else _float64(offset))


def _int64(a):
    """Integer array ``a`` as int64 (as ``posenc._validate.widened``), in its own library."""
    if isinstance(a, np.ndarray):
        return a.astype(np.int64)
    return a.to(sys.modules["torch"].int64)


def _float64(a):
    """Float array ``a`` as float64, in its own library."""
    if isinstance(a, np.ndarray):
        return a.astype(np.float64, copy=False)
    return a.to(sys.modules["torch"].float64)


def _source(call, positions, offset, *, host=False, read=False):
    """The ``_Source`` of a parsed call (``rotary._call.RopeCall``) whose arguments were
    ``positions`` and ``offset``: the shapes the parse gave its arrays. ``host``: for a
    CPU plan, which sums NumPy views (its arange one too); ``read``: the offset is read as
    an int (``_read_as_int``)."""
    rows = None if read or isinstance(call.offset, int) or not call.offset.ndim else tuple(call.offset.shape)
    kinds = _arrays.integer_kind(positions), None if read else _arrays.integer_kind(offset)
    if positions is None:  # the parse's own arange (no array of the caller's)
        return _Source(None, _arrays.host_values(call.placed) if host else call.placed, rows, "small", kinds[1])
    return _Source(tuple(call.placed.shape), None, rows, *kinds)


def _read_as_int(offset, lengths):
    """Whether a CPU plan reads array ``offset`` as the int it holds (``.item()``): a NumPy
    integer scalar or a 0-d array, which the full path reads so itself, or a per-row offset
    of one row, whose sums are those of its one value in the same order (but under a
    length-dependent scaling, whose lengths the full path then takes per row)."""
    if type(offset) is int:
        return False
    return isinstance(offset, np.integer) or not offset.ndim or lengths is None and math.prod(offset.shape) == 1


def build_rotate(x, positions=None, *, scaling, layout, offset, out, **options):
    """The plan of a ``rope`` call that the full path served, or None where it must serve it
    again. Built from the call's own parse (``rotary._call.parse_rope``)."""
    from ..rotary._call import parse_rope

    if layout not in _LAYOUTS or x.ndim < 2 or 0 in tuple(x.shape):
        return None
    call = parse_rope(x, positions, scaling=scaling, layout=layout, offset=offset, out=out, **options)
    if call.path != "kernel":
        return None
    if _arrays.torch_tensor(x) and x.device.type == "cuda":
        from . import rope_cuda_plan

        if isinstance(offset, np.integer):
            return None
        return rope_cuda_plan.build(x, call, _source(call, positions, offset), out=out, layout=layout, scaling=scaling)
    xv = _arrays.host_view(x)
    if not _host_kernel(call.kernel(), "rotate_positions") or not _writable_directly(xv, out):
        return None
    sign = -1.0 if call.inverse else 1.0
    lengths = _LengthAngles(scaling, call.rotary_dim, call.base, sign, call.inverse) if scaling is not None and scaling.uses_seq_len else None
    read = _read_as_int(offset, lengths)
    if positions is None and (type(offset) is int or read):  # the positions of offset 0, plus each call's
        plan = RotatePlan(x, xv, layout, call.placed, call.inv_freq, sign, call.scale, out, lengths, read)
    else:
        source = _source(call, positions, offset, host=True, read=read)
        plan = PositionsPlan(x, xv, layout, call.positions, source, call.inv_freq, sign, call.scale, out, lengths, positions, offset, read)
    return plan if plan.launch.viewable() else None


def build_rotate_positions(x, positions, inv_freq, *, layout, inverse, scale):
    """The plan of ``rope_rotate``'s kernel call (its positions in hand, already offset: the
    torch custom op's), or None: a ``PositionsPlan`` with no offset."""
    if layout not in _LAYOUTS or x.ndim < 2 or 0 in tuple(x.shape) or _arrays.torch_tensor(x) and x.device.type != "cpu":
        return None
    freqs = np.asarray(inv_freq, dtype=np.float64)
    kernel = _dispatch.select("rope_rotate", x, positions, freqs, layout=layout, inverse=inverse, scale=scale)
    xv = _arrays.host_view(x)
    if not _host_kernel(kernel, "rotate_positions") or not _writable_directly(xv, None):
        return None
    source = _Source(tuple(positions.shape), None, None, _arrays.integer_kind(positions), None)
    plan = PositionsPlan(x, xv, layout, positions, source, freqs, -1.0 if inverse else 1.0, scale, None, positions=positions)
    return plan if plan.launch.viewable() else None


# Layouts by their own names: a call that names one by an earlier name ("split") takes the
# full path every time, and its FutureWarning with it.
_LAYOUTS = ("half", "interleaved")


class ApplyPlan:
    """``apply_rope(x, cos, sin)``: the kernel reads the first entry of each pair of ``cos``/``sin`` in place."""

    def __init__(self, x, xv, cos, sin, layout, out):
        rotary = int(cos.shape[-1])
        target = xv.shape[:-1] + (rotary,)
        pairs = slice(None, rotary // 2) if layout == "half" else slice(0, None, 2)
        views = [np.broadcast_to(_arrays.host_view(t), target)[..., pairs] for t in (cos, sin)]
        self.launch = _Launch("apply", layout, x, xv, views, rotary // 2, out)
        lead = xv.ndim - 1
        self.tables = []
        for k, (table, view) in enumerate(zip((cos, sin), views), start=2):
            st = self.launch.grouping.strides(k)
            steps = (st[-3], st[-1], _arrays.element_strides(view)[lead])
            _, first = _arrays.flat_span(_arrays.host_view(table))
            self.tables.append((first, steps))
        self.tables = tuple(self.tables)
        plan = self.launch.grouping
        self.table_shape = (plan.g.size, plan.s.size, rotary // 2)
        self.half = rotary // 2
        # Per table: how its memory is read, and the view's byte offset and strides in it.
        self.readers = tuple(_flat_reader(t) for t in (cos, sin))
        size = _arrays.host_view(cos).dtype.itemsize
        self.geometry = tuple((first * size, tuple(st * size for st in steps)) for first, steps in self.tables)

    def cos_sin(self, cos, sin):
        """The kernel's views of ``cos`` and ``sin`` (a pair of plans that read them alike share them: ``shares``)."""
        (cr, sr), (cg, sg) = self.readers, self.geometry
        c, s = cr(cos), sr(sin)
        return np.ndarray(self.table_shape, c.dtype, c, *cg), np.ndarray(self.table_shape, s.dtype, s, *sg)

    def shares(self, other):
        """Whether ``other`` reads ``cos``/``sin`` of its key through the same views (q and k of one layer)."""
        return (self.table_shape, self.geometry, self.launch.torch) == (other.table_shape, other.geometry, other.launch.torch)

    def rotate(self, x, tables, out=None):
        return self.launch.run(x, (*rope_cpu._NO_ANGLES, *tables), out)

    def __call__(self, args, kwargs):
        x, cos, sin = args
        out = kwargs.get("out")
        if out is not None and (_may_meet(out, cos) or _may_meet(out, sin)):
            return NotImplemented  # the full path decides by elements (and refuses a true overlap)
        return self.rotate(x, self.cos_sin(cos, sin), out)


class PairPlan:
    """``rotate_pair(q, k, cos, sin)`` on a CPU: q's and k's ``apply_rope`` plans, the views of
    ``cos``/``sin`` made once for both where they read them alike (an attention layer's q and k)."""

    def __init__(self, q_plan, k_plan):
        self.q_plan, self.k_plan = q_plan, k_plan
        self.shared = q_plan.shares(k_plan)

    def __call__(self, args, kwargs):
        q, k, cos, sin = args
        tables = self.q_plan.cos_sin(cos, sin)
        rotated_q = self.q_plan.rotate(q, tables)
        if rotated_q is NotImplemented:
            return NotImplemented
        rotated_k = self.k_plan.rotate(k, tables if self.shared else self.k_plan.cos_sin(cos, sin))
        return NotImplemented if rotated_k is NotImplemented else (rotated_q, rotated_k)


def build_pair(q, k, cos, sin, *, layout):
    """The plan of a ``rotate_pair`` call that the full path served: on torch CUDA tensors
    ``rope_cuda_plan``'s (one launch), else the ``apply_rope`` plans its two calls made
    (``PairPlan``), or None."""
    if _arrays.torch_tensor(q) and q.device.type == "cuda":
        from . import rope_cuda_plan

        return rope_cuda_plan.build_pair(q, k, cos, sin, layout=layout)
    if layout not in _LAYOUTS:
        return None
    from ..rotary import _signatures, apply

    plans = [apply.apply_rope.plans.get(_signatures.ApplyRope.key((x, cos, sin), {"layout": layout})) for x in (q, k)]
    return PairPlan(*plans) if all(plans) else None


def _overlaps(out, *arrays):
    """Whether ``out`` may share memory with one of ``arrays`` (Nones, ints and NumPy scalars passed over)."""
    return any(a is not None and type(a) is not int and not isinstance(a, np.generic) and _may_meet(out, a) for a in arrays)


def _may_meet(a, b):
    """Whether arrays ``a`` and ``b`` of one library may share memory (NumPy's byte ranges,
    torch's storages' byte ranges: two storages may hold one memory, e.g. ``torch.from_numpy``
    of two views of one NumPy array)."""
    if type(a) is np.ndarray:
        return np.may_share_memory(a, b)
    mine, theirs = a.untyped_storage(), b.untyped_storage()
    start, other = mine.data_ptr(), theirs.data_ptr()
    return start < other + theirs.nbytes() and other < start + mine.nbytes()


def _flat_reader(table):
    """``t ->`` the memory ``_arrays.flat_span(_arrays.host_view(t))[0]`` spans, as an array
    ``np.ndarray`` can take as its buffer, for a ``t`` of ``table``'s signature: a
    C-contiguous table's host view itself."""
    if not _arrays.host_view(table).flags.c_contiguous:
        return lambda t: _arrays.flat_span(_arrays.host_view(t))[0]
    return _arrays.host_reader(table)


def build_apply(x, cos, sin, *, layout, out, **_):
    """The plan of an ``apply_rope`` call that the full path served (from its parse,
    ``rotary._call.parse_apply``), or None."""
    from ..rotary._call import parse_apply

    if layout not in _LAYOUTS or 0 in tuple(x.shape) or 0 in tuple(cos.shape):
        return None
    call = parse_apply(x, cos, sin, layout=layout, out=out)
    if _arrays.torch_tensor(x) and x.device.type == "cuda":
        from . import rope_cuda_plan

        return rope_cuda_plan.build_apply(x, cos, sin, call, out=out, layout=layout)
    xv = _arrays.host_view(x)
    if not _host_kernel(call.kernel(), "rotate_cos_sin") or not _writable_directly(xv, out):
        return None
    if not all(_arrays.whole_strides(_arrays.host_view(t)) for t in (cos, sin)):
        return None  # (the plan reads the tables in place, by elements)
    plan = ApplyPlan(x, xv, cos, sin, layout, out)
    return plan if plan.launch.viewable() else None


class RerotatePlan:
    """``rerotate(x, delta, inv_freq)``: ``rope``'s rotation of a zero position grid moved by
    ``delta``, by the frequencies of the call: their float64 values are read again when
    their bytes change (non-finite ones take the full path and its error), into a rotation
    of their own, kept with their bytes as one value (a thread reads both at once, whatever
    frequencies another thread brings meanwhile)."""

    def __init__(self, rotate, inv_freq):
        self.held = (inv_freq.tobytes(), rotate)

    def __call__(self, args, kwargs):
        x, delta, inv_freq = args
        out = kwargs.get("out")
        if out is not None and np.may_share_memory(_arrays.host_view(out), inv_freq):
            return NotImplemented  # the full path refuses an out over the frequencies it reads
        raw = inv_freq.tobytes()
        held, rotate = self.held
        if raw != held:
            freqs = np.asarray(inv_freq, dtype=np.float64)  # as rotary._args.host_inv_freq reads them
            if not np.isfinite(freqs).all():
                return NotImplemented
            rotate = copy.copy(rotate)
            _angles(rotate, x, freqs, 1.0, 1.0, None)
            self.held = (raw, rotate)
        return rotate((x,), {"offset": delta, "out": out})


def build_rerotate(x, delta, inv_freq, *, layout, new_inv_freq, scaling, seq_len, rotary_dim, out, **options):
    """The plan of a ``rerotate`` by an int ``delta`` with NumPy ``inv_freq`` that the full
    path served, from its parse (``rotary._call.parse_rerotate``), or None."""
    from ..rotary._call import parse_rerotate

    if new_inv_freq is not None or scaling is not None or seq_len is not None or rotary_dim is not None:
        return None
    if layout not in _LAYOUTS or x.ndim < 1 or 0 in tuple(x.shape):
        return None
    call = parse_rerotate(
        x, delta, inv_freq, layout=layout, new_inv_freq=None, scaling=None, seq_len=None, rotary_dim=None, out=out, **options
    )  # fmt: skip
    xv = _arrays.host_view(x)
    if not _host_kernel(call.kernel(), "rotate_positions") or not _writable_directly(xv, out):
        return None
    zero = call.xp.zeros_like(call.delta)  # the 0-d delta of the call, at 0: the plan adds each call's
    rotate = RotatePlan(x, xv, layout, zero, call.freqs, 1.0, 1.0, out)
    return RerotatePlan(rotate, inv_freq) if rotate.launch.viewable() else None
