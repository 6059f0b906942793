"""Plans of the rotary CUDA kernel: ``rope``, ``apply_rope`` and ``rotate_pair`` on torch CUDA tensors launched without the front of a call.

A decode step on a GPU is bound by the host: its kernel runs in microseconds, while
validation, the kernel registry and the launcher's geometry take hundreds of microseconds
of Python (docs/benchmarks.md, "On a GPU"). ``posenc._plans`` keys a call (torch CUDA
tensors by shape, strides, dtype, device and gradient tracking); the second call of a key
builds here, from that call's own parse and launcher (``rope_cuda.rotation``), its launch
with every argument fixed but three addresses: ``x``, the result and the positions. A
planned call forms the positions the full path would (``rope_plan._Source``: the same torch
operations; without positions, the arange made on the call's own stream; an offset tensor,
or given positions with an int offset, summed in float64 on the device, unread, as
``rotary._args.shifted`` sums them: ``_Source.summed``), converts them as
the launcher does (``rope_cuda.kernel_positions``), allocates the result (or rotates ``x``
in place) and launches the same kernel with the same arguments on the caller's current
stream, so its numbers are the full path's. A plan keeps no device array of its own but
the constants its launch reads (``_device_flat.Prepared``).

Covered: one launch, a result that is new or ``x`` itself, positions and offsets that are
ints or CUDA tensors on ``x``'s device, no length-dependent scaling (its frequencies
depend on the positions' values, which the host would have to read); anything else keeps
the full path. A plan launches the kernel its building call chose: in words of two
channels (``rope_cuda.WORDS``) where that call's arrays allowed, and then a later call
whose array starts between words takes the full path (``_device_flat.Prepared``); one
channel at a time where they did not, for every later call of the key too.

``apply_rope(x, cos, sin)`` is planned the same way (``ApplyPlan``: the addresses of ``x``,
``cos``, ``sin`` and the result), and so is ``rotate_pair(q, k, cos, sin)`` (an attention
layer's query and key with its ``cos``/``sin`` tables: Hugging Face's
``apply_rotary_pos_emb``, every layer of every step; ``PairPlan``: the launch of
``rope_cuda.pair_rotation`` with every argument fixed but six addresses, q, k, cos, sin and
the two new results).
"""

from __future__ import annotations

from . import _arrays, _device_flat, rope_cuda


class RotatePlan:
    """``rope(x, positions, offset=...)`` on torch CUDA tensors, by the kernel's addresses."""

    def __init__(self, x, call, source, in_place, layout):
        import torch

        self.torch, self.source, self.in_place, self.arange = torch, source, in_place, None
        if source.base is not None:
            # The positions of a call without them (``arange`` along the sequence axis) are made
            # on each call's stream, never kept: a kept device array would be read by calls on
            # other streams before its writes, and by a captured graph after the plan is gone.
            self.arange = tuple(source.base.shape), int(source.base.numel())
            self.source = source.without_base()
        stream, on_device, device = rope_cuda._context(x)
        inv_freq = rope_cuda.guard_rotate(x, call.positions, call.inv_freq, None)  # as rotate_positions converts them
        with on_device:
            held = rope_cuda.kernel_positions(call.positions)
            operand, launches, positions_flat = rope_cuda.rotation(
                x, held, inv_freq, layout=layout, inverse=call.inverse, scale=call.scale,
                out=x if in_place else None, device=device, stream=stream,
            )  # fmt: skip
            roles = {positions_flat.ptr: "positions", operand.x_flat.ptr: "x"} if type(positions_flat) is _device_flat.Flat else {}
            if roles and not in_place:
                roles[operand.o_flat.ptr] = "out"
            self.prepared = _device_flat.Prepared(launches, device, roles)
        self.counting = _arrays.dtype_name(held.dtype) == "int64"
        self.positions_geometry = _geometry(held)
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, x.device
        # (distinct addresses: a new result, or x itself in place, never the positions' memory)
        self.ready = len(launches) == 1 and self.prepared.ready and len(roles) == (2 if in_place else 3)

    def __call__(self, args, kwargs):
        x = args[0]
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        offset = kwargs.get("offset", 0)
        torch = self.torch
        if self.in_place and _in(x, positions, offset):
            return NotImplemented  # positions or offset in x's own memory: the full path decides
        summed = self._summed(offset)
        if summed is None or not summed and self.source._must_check(offset):
            return NotImplemented  # sums that may leave int64: the full path reads their extremes
        if self.arange is not None:
            shape, n = self.arange
            if type(offset) is int:  # offset .. offset + n - 1 in one kernel: the int64 values of arange + offset
                positions, offset = torch.arange(offset, offset + n, device=self.device).reshape(shape), 0
            else:
                positions = torch.arange(n, device=self.device).reshape(shape)
        placed = self.source.summed(positions, offset) if summed else self.source(positions, offset)
        held = placed if self.counting else placed.detach().to(torch.float64)
        if _geometry(held) != self.positions_geometry:
            return NotImplemented
        result = x if self.in_place else torch.empty(self.shape, dtype=self.dtype, device=self.device)
        stream = _arrays._stream(_arrays.torch_stream(torch, self.device.index))
        if not self.prepared(stream, {"x": x.data_ptr(), "out": result.data_ptr(), "positions": held.data_ptr()}):
            return NotImplemented  # x not where the planned kernel's words may be read
        return result


    def _summed(self, offset):
        """Whether the full path sums this call's positions and offset in float64 on the device,
        unread (``rotary._args.shifted``: an offset tensor on the device, or given positions
        with an int offset other than 0), and the plan makes the same sums (``_Source.summed``);
        False for int64 sums (``_Source.__call__``, checked by ``_must_check``); None where the
        plan cannot give the full path's positions without a read (uint64 values, which the
        full path reads to widen; a kernel built for int64 positions, which serves such a
        call only where the int64 sums are the float64 ones: positions of at most 32 bits
        and an int offset within 2**53)."""
        if type(offset) is int:
            if self.arange is not None or offset == 0:
                return False
        elif offset.device.type != "cuda":
            return False  # (a CPU offset, which the full path reads: _must_check)
        if "uint64" in (self.source.positions_kind, self.source.offset_kind):
            return None
        if not self.counting:
            return True
        return False if self.source.positions_kind == "narrow" and type(offset) is int and abs(offset) <= 2**53 else None


def _in(x, *arrays):
    """Whether one of the tensors among ``arrays`` lies in ``x``'s storage."""
    start = x.untyped_storage().data_ptr()
    return any(type(a) is not int and a is not None and a.untyped_storage().data_ptr() == start for a in arrays)


def _geometry(a):
    """``(length, stride)`` of each axis of positions ``a`` longer than one: what the kernel
    reads them by. The caller's positions and the call's placed ones (the caller's with
    axes of length one inserted: ``rotary._args.place``) have the same."""
    return tuple([(n, step) for n, step in zip(a.shape, a.stride()) if n != 1])


def build(x, call, source, *, out, layout, scaling):
    """The plan of a ``rope`` call on torch CUDA tensors whose full path ended in
    ``rope_cuda.rotate_positions``, or None where the full path must serve it again."""
    if _arrays.cuda_simulator() or (out is not None and out is not x) or (scaling is not None and scaling.uses_seq_len):
        return None
    if call.kernel() is not rope_cuda.rotate_positions or _arrays.library(call.positions) != "torch" or call.positions.device != x.device:
        return None
    plan = RotatePlan(x, call, source, out is x, layout)
    return plan if plan.ready else None


class ApplyPlan:
    """``apply_rope(x, cos, sin)`` on torch CUDA tensors, into a new result or ``x`` itself, by the kernel's addresses."""

    def __init__(self, x, cos, sin, layout, in_place):
        import torch

        self.torch, self.in_place = torch, in_place
        stream, on_device, device = rope_cuda._context(x)
        with on_device:
            operand, launches = rope_cuda.apply_rotation(x, cos, sin, layout=layout, out=x if in_place else None, device=device, stream=stream)
            self.prepared = _by_address(launches, device, {"x": x, "cos": cos, "sin": sin} | ({} if in_place else {"out": operand.result}))
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, x.device
        self.ready = self.prepared is not None

    def __call__(self, args, kwargs):
        x, cos, sin = args
        if self.in_place and x.untyped_storage().data_ptr() in (cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()):
            return NotImplemented  # tables in the memory rotated in place: the full path decides
        result = x if self.in_place else self.torch.empty(self.shape, dtype=self.dtype, device=self.device)  # (as _arrays.empty)
        addresses = {"x": x.data_ptr(), "cos": cos.data_ptr(), "sin": sin.data_ptr(), "out": result.data_ptr()}
        if not self.prepared(_arrays._stream(_arrays.torch_stream(self.torch, self.device.index)), addresses):
            return NotImplemented
        return result


def build_apply(x, cos, sin, call, *, out, layout):
    """The plan of an ``apply_rope`` call on torch CUDA tensors whose full path ended in
    ``rope_cuda.rotate_cos_sin`` (``call``: its parse), into a new result or ``x`` itself,
    or None where the full path must serve it again."""
    if _arrays.cuda_simulator() or (out is not None and out is not x) or call.kernel() is not rope_cuda.rotate_cos_sin:
        return None
    plan = ApplyPlan(x, cos, sin, layout, out is x)
    return plan if plan.ready else None


class PairPlan:
    """``rotate_pair(q, k, cos, sin)`` on torch CUDA tensors: new results, by the kernel's addresses."""

    def __init__(self, q, k, cos, sin, layout):
        import torch

        self.torch = torch
        stream, on_device, device = rope_cuda._context(q)
        with on_device:
            operands, launches = rope_cuda.pair_rotation(q, k, cos, sin, layout=layout, out_q=None, out_k=None, device=device, stream=stream)
            arrays = {"q": q, "k": k, "cos": cos, "sin": sin, "q_out": operands[0].result, "k_out": operands[1].result}
            self.prepared = _by_address(launches, device, arrays)
        self.shapes, self.dtype, self.device = (tuple(q.shape), tuple(k.shape)), q.dtype, q.device
        self.ready = self.prepared is not None

    def __call__(self, args, kwargs):
        q, k, cos, sin = args
        torch = self.torch
        rotated = [torch.empty(shape, dtype=self.dtype, device=self.device) for shape in self.shapes]  # (as _arrays.empty)
        addresses = {"q": q.data_ptr(), "k": k.data_ptr(), "cos": cos.data_ptr(), "sin": sin.data_ptr()}
        addresses["q_out"], addresses["k_out"] = rotated[0].data_ptr(), rotated[1].data_ptr()
        if not self.prepared(_arrays._stream(_arrays.torch_stream(torch, self.device.index)), addresses):
            return NotImplemented
        return rotated[0], rotated[1]


def _by_address(launches, device, arrays):
    """The ``Prepared`` launches whose arguments are fixed but for the addresses of
    ``arrays`` (``{role: torch tensor}``, each at an address of its own, each an argument of
    some launch), or None where that does not hold (or nothing is launched)."""
    roles = {a.data_ptr(): role for role, a in arrays.items()}
    prepared = _device_flat.Prepared(launches, device, roles)
    return prepared if launches and prepared.ready and len(roles) == len(arrays) else None


def build_pair(q, k, cos, sin, *, layout):
    """The plan of a ``rotate_pair`` call on torch CUDA tensors whose full path ended in
    ``rope_cuda.rotate_cos_sin_pair``, or None where the full path must serve it again."""
    from ..rotary.apply import cuda_pair_launcher

    if _arrays.cuda_simulator() or layout not in ("half", "interleaved") or 0 in tuple(q.shape) or 0 in tuple(k.shape):
        return None
    if cuda_pair_launcher(q, k, cos, sin, layout) is None:
        return None
    plan = PairPlan(q, k, cos, sin, layout)
    return plan if plan.ready else None
