"""One JAX primitive for every traced kernel op: a host call linear in its first argument.

Every kernel op is linear in its first array (``x`` of the rotations, ``vec``, ``scores``,
``weights`` of the Toeplitz ops), so one primitive, ``posenc_kernel``, serves them all,
its parameter ``op`` (a ``LinearOp``) saying which. Its rules:

* **evaluation**: eagerly (concrete arguments, as inside an eager ``jax.grad``), the op's
  host function on NumPy views of the arrays, into a new buffer JAX adopts (``cpu.py``'s
  eager path); compiled, an XLA FFI call to the same function (``ffi.host_call``, or
  ``native.py``'s compiled handler where the op has one);
* **JVP** (``jax.jvp``, ``jax.jacfwd``, and the forward half of ``jax.grad``): the op on
  the tangent of the first argument (the op is linear in it), plus ``op.tangent``, a
  ``jax.numpy`` formula for the tangents of the other float arguments (float positions,
  ``cos``/``sin``);
* **transpose** (reverse mode): ``op.transpose``, the op's adjoint (the inverse rotation,
  the Toeplitz scatter for the gather...), itself this primitive or ``jax.numpy``;
* **batching** (``jax.vmap``): every argument with its batch axis in front, size 1 where
  it is not batched, bound again: the host function lines them up (``cpu._batched``),
  so the batch is one kernel call. ``LinearOp.ranks`` are the unbatched ranks: the axes
  in front of them are batch axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax._src import dispatch as _jax_dispatch
from jax.interpreters import ad, batching, mlir

from .._xp import replicated_on_mesh, resplit, splits
from .ffi import host_call, kept
from .sharding import partitioned


@dataclass(frozen=True, eq=False)  # compared by identity: the constructors in cpu.py cache them
class LinearOp:
    """A kernel op as the primitive's parameter.

    ``host(*arrays, out=)``: the computation on NumPy views (batch axes in front);
    ``result(*unbatched shapes)``: the unbatched result shape; ``transpose(ct, x, *others)``:
    the adjoint applied to a cotangent (``x``: the first argument's abstract value); ``tangent(primals, tangents, out)``: the tangent
    from the arguments after the first, or None; ``native(*args)``: ``native.py``'s
    ``(target, plan)`` for these unbatched arguments, or None; ``reference(*args)``: the
    op's ``jax.numpy`` reference on the (batched) arguments, lowered where the host call
    cannot go (``jax.export``, platforms other than the CPU).
    """

    key: tuple
    host: object
    ranks: tuple
    result: object
    transpose: object
    tangent: object = None
    native: object = None
    reference: object = None

    def lead(self, shapes):
        """The batch shape: the axes in front of the unbatched ranks, broadcast over the arguments."""
        return np.broadcast_shapes(*(s[: len(s) - r] for s, r in zip(shapes, self.ranks)))

    def shape(self, shapes):
        unbatched = [s[len(s) - r :] for s, r in zip(shapes, self.ranks)]
        return tuple(self.lead(shapes)) + tuple(self.result(*unbatched))


_ALIGN = 64
kernel_p = Primitive("posenc_kernel")


def apply(op, *args):
    """``op`` on traced ``args``; inside ``shard_map``, each argument made to vary along every
    manual mesh axis one of them varies along (JAX's ``pcast``, whose transpose sums the
    cotangent of an argument that did not), as JAX's own operations do."""
    axes = frozenset().union(*map(_varying, args))
    if axes:
        args = [_vary(a, axes - _varying(a)) for a in args]
    return kernel_p.bind(*args, op=op)


def _varying(a):
    """The manual mesh axes (``shard_map``'s) along which ``a`` varies, where this JAX's types
    track them (``manual_axis_type``, earlier ``vma``)."""
    aval = getattr(a, "aval", a)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _vary(a, axes):
    if not axes:
        return a
    cast = getattr(jax.lax, "pcast", None)
    return cast(a, tuple(axes), to="varying") if cast is not None else jax.lax.pvary(a, tuple(axes))


def _abstract(*avals, op):
    shape = op.shape([a.shape for a in avals])
    sharding = _result_sharding(avals, shape)
    if not _varying(avals[0]):
        return jax.core.ShapedArray(shape, avals[0].dtype, sharding=sharding)
    # inside shard_map: on its manual mesh, varying as the arguments do (alike: apply)
    sharding = sharding or jax.sharding.NamedSharding(avals[0].sharding.mesh, jax.sharding.PartitionSpec())
    result = jax.core.ShapedArray(shape, avals[0].dtype, sharding=sharding)
    mat = getattr(avals[0], "manual_axis_type", None)
    return result.update(manual_axis_type=mat) if mat is not None else result.update(vma=avals[0].vma)


def _result_sharding(avals, shape):
    """The result's sharding in its type (what an explicit mesh's next operation reads): the
    first argument's where the result has its shape (a rotation, a bucketing); ``None`` (the
    mesh's default) otherwise. (Giving a Toeplitz expansion its heads' sharding made the
    partitioned host call hang under jit.)"""
    sharding = getattr(avals[0], "sharding", None)
    return sharding if tuple(shape) == tuple(avals[0].shape) and splits(sharding) else None


def aligned_empty(shape, dtype):
    """An uninitialised 64-byte aligned NumPy array: JAX adopts such a buffer through DLPack without a copy."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def adopt(result, like, *operands):
    """NumPy ``result`` as a JAX array on ``like``'s device, without a copy where DLPack allows
    (bfloat16, which DLPack lacks, travels as its ``uint16`` bits and is bit-cast: one copy);
    uncommitted where neither ``like`` nor ``operands`` is committed, as JAX's own results
    (``device_put`` of the aligned buffer aliases it)."""
    placement = _spread(like, result.shape)
    if placement is not None:
        return jax.device_put(result, placement)
    if not any(getattr(a, "committed", False) for a in (like, *operands)):
        return jax.device_put(result)
    devices = getattr(like, "devices", None)  # (a NumPy tangent or cotangent has none: the host's CPU)
    device = next(iter(devices())) if devices is not None else jax.devices("cpu")[0]
    if result.dtype.name == "bfloat16":
        return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(result.view(np.uint16), device=device), jnp.bfloat16)
    return jax.dlpack.from_dlpack(result, device=device)


def _spread(like, shape):
    """Where a result of ``shape`` computed for ``like`` goes when ``like`` spans several
    devices (an eager transform, ``jax.grad`` or ``jax.vmap`` outside ``jit``, runs the op
    on the concrete arrays): ``like``'s sharding for its own shape, else replicated on its
    mesh; ``None`` for an array on one device."""
    sharding = getattr(like, "sharding", None)
    if not isinstance(like, jax.Array) or len(getattr(sharding, "device_set", ())) < 2:
        return None
    return sharding if tuple(shape) == tuple(like.shape) else replicated_on_mesh(sharding)


def _eager(*args, op):
    views = [np.asarray(a) for a in args]  # (a 0-d argument may be a Python int: a literal of jax.checkpoint)
    out = aligned_empty(op.shape([v.shape for v in views]), args[0].dtype)
    op.host(*views, out=out)
    return adopt(out, *args)


def _lowered(*args, op):
    shapes = [a.shape for a in args]
    native = op.native(*args) if op.native is not None and not op.lead(shapes) else None
    return host_call(op.key, op.host, op.shape(shapes), args[0].dtype, *args, native=native)


def _sharded(*args, op):
    """The host call per shard (``sharding.py``) where the computation spans devices."""
    shapes = [tuple(a.shape) for a in args]
    return partitioned(op, lambda *local: _lowered(*local, op=op), shapes, tuple(op.shape(shapes)))(*args)


def _jvp(primals, tangents, *, op):
    out = apply(op, *primals)
    parts = []
    if type(tangents[0]) is not ad.Zero:
        parts.append(apply(op, tangents[0], *primals[1:]))
    if op.tangent is not None:
        extra = op.tangent(primals, tangents, out)
        if extra is not None:
            parts.append(jnp.broadcast_to(extra, out.shape).astype(out.dtype))
    if not parts:
        return out, ad.Zero.from_primal_value(out)
    return out, parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _sum_to(a, shape):
    """``a`` summed over the axes broadcasting added to ``shape`` (a cotangent back to its argument's shape)."""
    extra = a.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and a.shape[extra + i] != 1)
    return jnp.reshape(jnp.sum(a, axis=axes), shape) if axes else a


def _transpose(ct, *args, op):
    x, others = args[0], args[1:]
    if any(ad.is_undefined_primal(a) for a in others):
        raise NotImplementedError(f"{op.key[0]} is linear in its first argument only")
    if type(ct) is ad.Zero:
        return (None,) * len(args)
    # Under vmap, x may be broadcast over the batch of the other arguments: its cotangent sums over it.
    return (_as_sharded(_sum_to(op.transpose(ct, x.aval, *others), x.aval.shape), x.aval), *(None for _ in others))


def _as_sharded(ct, aval):
    """Cotangent ``ct`` with ``aval``'s sharding in its type, which an explicit mesh's
    transpose rules require (an adjoint of another shape, a Toeplitz scatter, has the
    mesh's default)."""
    sharding = getattr(aval, "sharding", None)
    return resplit(ct, sharding if splits(sharding) and jax.typeof(ct).sharding != sharding else None)


def _batch(args, dims, *, op):
    front = [jnp.expand_dims(a, 0) if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    return apply(op, *front), 0


def _reference(*args, op):
    return jnp.broadcast_to(op.reference(*args), op.shape([a.shape for a in args])).astype(args[0].dtype)


_host_rule = mlir.lower_fun(_lowered, multiple_results=False)
_sharded_rule = mlir.lower_fun(_sharded, multiple_results=False)
_reference_rule = mlir.lower_fun(_reference, multiple_results=False)


def _cpu_rule(ctx, *args, op):
    """The host call; the reference in a ``jax.export`` (portable), unless
    ``posenc.jax.export_with_kernels`` asks for the kernel."""
    from .. import jax as posenc_jax

    module = ctx.module_context
    export = module.lowering_parameters.for_export
    if export and not posenc_jax.export_kernels_state.value:
        return _reference_rule(ctx, *args, op=op)
    rule = _sharded_rule if getattr(module.axis_context, "num_devices", 1) > 1 else _host_rule
    if export:  # an export holds nothing alive: the host functions it names are kept for the process
        return rule(ctx, *args, op=op)
    with kept(module.add_keepalive):  # what the computation names, held while it lives
        return rule(ctx, *args, op=op)


kernel_p.def_impl(_eager)
kernel_p.def_abstract_eval(_abstract)
mlir.register_lowering(kernel_p, _reference_rule)  # every platform the kernel does not serve
mlir.register_lowering(kernel_p, _cpu_rule, platform="cpu")
# custom_partitioning's lowering needs the devices of a multi-device computation
_jax_dispatch.prim_requires_devices_during_lowering.add(kernel_p)
ad.primitive_jvps[kernel_p] = _jvp
ad.primitive_transposes[kernel_p] = _transpose
batching.primitive_batchers[kernel_p] = _batch
