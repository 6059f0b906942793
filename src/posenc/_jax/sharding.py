"""Sharded JAX arrays through the CPU kernel's host call: one call per shard.

XLA cannot look inside a host call, so a plain custom call makes the SPMD partitioner
gather every operand onto every device and replicate the result. Under ``jax.jit`` on
several devices the host call is wrapped in ``jax.experimental.custom_partitioning`` with
a Shardy sharding rule: the result's axes are factors, each operand axis that lines up
with a result axis of the same size shares its factor, and the partition is the host call
on each device's shard (its shapes read from the local buffers). Which axes may stay
sharded (the others are ``need_replication`` factors, gathered by XLA: one all-gather of
that operand, the cost of a replicated call):

* the rotations (``rope_rotate``, ``rope_apply``, and ``rope_rotate_at_length``, a
  length-dependent scaling at a traced length): every axis of ``x`` but the last (batch,
  heads and the sequence: each position is rotated on its own, its position, length or
  ``cos``/``sin`` row sharded alongside it);
* the Toeplitz ops (``toeplitz_expand``/``gather``/``scatter``): every axis but the last
  two (a bias row needs every distance).
"""

from __future__ import annotations

import string

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

# op -> (how many trailing result axes must stay whole, each operand's alignment): "same" (the
# result's axes), or (skip, drop): the operand's unbatched axes but its last ``drop`` line up
# with the result's, right-aligned, ending ``skip`` axes before the result's end; batch axes
# (vmap's, in front) line up with the result's first ones; the rest match nothing.
_ALIGNMENT = {
    "rope_rotate": (1, ("same", (1, 0))),
    "rope_rotate_at_length": (1, ("same", (1, 0), (1, 0))),  # the lengths: 0-d, or placed like the positions
    "rope_apply": (1, ("same", (0, 0), (0, 0))),
    "toeplitz_expand": (2, ((2, 1),)),
    "toeplitz_gather": (2, ((1, 1), (0, 1))),
    "toeplitz_scatter": (2, ((1, 1), (0, 1))),
}


def sharding_rule(op, shapes, result):
    """The Shardy rule of ``op`` on operands of ``shapes`` giving ``result``: the factor
    names of each operand's and of the result's axes, and the factors that must stay whole."""
    whole, alignment = _ALIGNMENT[op.key[0]]
    lead = len(shapes[0]) - op.ranks[0]
    letters = iter(string.ascii_lowercase)
    out = [next(letters) for _ in result]
    replicated = set(out[len(out) - whole :])
    operands = []
    for shape, rank, how in zip(shapes, op.ranks, alignment):
        if how == "same":
            targets = list(range(len(result)))
        else:
            skip, drop = how
            end = len(result) - skip
            targets = list(range(lead)) + list(range(end - (rank - drop), end))
            targets += [None] * (len(shape) - len(targets))
        factors = []
        for size, target in zip(shape, targets):
            if target is not None and 0 <= target < len(result) and result[target] == size:
                factors.append(out[target])
            else:
                name = next(letters)
                replicated.add(name)
                factors.append(name)
        operands.append(factors)
    return operands, out, replicated


def _whole(sharding, factors, replicated, mesh):
    """``sharding`` with the axes of ``replicated`` factors gathered."""
    spec = tuple(sharding.spec) + (None,) * (len(factors) - len(sharding.spec))
    return NamedSharding(mesh, PartitionSpec(*(None if f in replicated else s for s, f in zip(spec, factors))))


def partitioned(op, lowered, shapes, result):
    """``lowered(*args)`` (the host call) as a ``custom_partitioning`` function whose
    partition is the same host call on every device's shards."""

    @custom_partitioning
    def call(*args):
        return lowered(*args)

    operands, out, replicated = sharding_rule(op, shapes, result)

    def partition(mesh, arg_shapes, result_shape):
        # Every operand sharded as the result is, factor by factor (an operand's own sharding
        # may disagree: x sharded on the sequence, per-row lengths on the batch, each shard's
        # call would have read another shard's rows); need_replication factors whole, so that
        # no shard of a whole axis reaches the kernel (it would read a shorter row).
        result = _whole(result_shape.sharding, out, replicated, mesh)
        spec = tuple(result.spec) + (None,) * (len(out) - len(result.spec))
        axis_of = dict(zip(out, spec))
        args = tuple(NamedSharding(mesh, PartitionSpec(*(axis_of.get(f) for f in factors))) for factors in operands)
        return mesh, lowered, result, args

    def infer(mesh, arg_shapes, result_shape):  # GSPMD (Shardy off): the result's factors from the operands'
        specs = {}
        for a, factors in zip(arg_shapes, operands):
            given = () if a.sharding is None else tuple(a.sharding.spec)  # (None: an operand of no sharding, a constant)
            spec = given + (None,) * (len(factors) - len(given))
            for f, s in zip(factors, spec):
                specs.setdefault(f, s)
        return NamedSharding(mesh, PartitionSpec(*(None if f in replicated else specs.get(f) for f in out)))

    rule = f"{', '.join(' '.join(f) for f in operands)} -> {' '.join(out)}"
    call.def_partition(
        partition, infer_sharding_from_operands=infer, sharding_rule=rule, need_replication_factors=_in_rule_order(replicated, out, operands)
    )
    return call


def _in_rule_order(factors, out, operands):
    """``factors`` in the order Shardy numbers them (first appearance: operands, then the result)."""
    order = list(dict.fromkeys([*(f for names in operands for f in names), *out]))
    return tuple(sorted(factors, key=order.index))
