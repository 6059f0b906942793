"""Plans of the rotary CUDA kernel: ``rope`` on torch CUDA tensors launched without the front of a call.

A decode step on a GPU is bound by the host: its kernel runs in microseconds, while
validation, the kernel registry and the launcher's geometry take hundreds of microseconds
of Python (docs/benchmarks.md, "On a GPU"). ``posenc._plans`` keys a call (torch CUDA
tensors by shape, strides, dtype, device and gradient tracking); the second call of a key
builds here, from that call's own parse and launcher (``rope_cuda.rotation``), its launch
with every argument fixed but three addresses: ``x``, the result and the positions. A
planned call forms the positions the full path would (``rope_plan._Source``: the same torch
operations), converts them as the launcher does (``rope_cuda.kernel_positions``), allocates
the result (or rotates ``x`` in place) and launches the same kernel with the same
arguments on the caller's current stream, so its numbers are the full path's.

Covered: one launch, a result that is new or ``x`` itself, positions and offsets that are
ints or CUDA tensors on ``x``'s device, no length-dependent scaling (its frequencies
depend on the positions' values, which the host would have to read); anything else keeps
the full path.
"""

from __future__ import annotations

from . import _arrays, _device_flat, rope_cuda


class RotatePlan:
    """``rope(x, positions, offset=...)`` on torch CUDA tensors, by the kernel's addresses."""

    def __init__(self, x, call, source, in_place, layout):
        import torch

        self.torch, self.source, self.in_place = torch, source, in_place
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
        if self.source._must_check(offset):
            return NotImplemented  # sums that may leave int64: the full path reads their extremes
        placed = self.source(positions, offset)
        torch = self.torch
        held = placed if self.counting else placed.detach().to(torch.float64)
        if _geometry(held) != self.positions_geometry:
            return NotImplemented
        if self.in_place and held.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return NotImplemented  # positions in x's own memory: the full path decides
        result = x if self.in_place else torch.empty(self.shape, dtype=self.dtype, device=self.device)
        stream = _arrays._stream(_arrays.torch_stream(torch, self.device.index))
        self.prepared(stream, {"x": x.data_ptr(), "out": result.data_ptr(), "positions": held.data_ptr()})
        return result


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
