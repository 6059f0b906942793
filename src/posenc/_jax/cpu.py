"""JAX CPU arrays through the Numba CPU kernels, eagerly and under ``jit``, ``grad`` and ``vmap``.

Each op calls the very function NumPy arrays get (the op's ``numba_cpu`` registry entry),
so a JAX CPU array and a NumPy array with the same values give the same bits:

* **eagerly** (concrete arrays): the kernel reads the JAX buffers through NumPy views
  (``np.asarray``, no copy) and writes a new 64-byte aligned NumPy buffer, which becomes
  the JAX result through DLPack without a copy (bfloat16, which DLPack lacks, travels as
  its ``uint16`` bits and is bit-cast back: one copy);
* **traced** (``jax.jit``, ``jax.grad``, ``jax.jvp``, ``jax.vmap``, eager or not): the
  primitive of ``primitive.py``, whose parameter is one of the ``LinearOp``s built here
  (every op is linear in its first array), compiled to a host call into the same kernel
  (``ffi.py``: an XLA FFI call that hands the kernel XLA's own buffers, where
  ``jax.pure_callback`` would copy both ways; a small rotation runs in ``native.py``'s
  compiled handler). Its transpose is the kernel's adjoint, itself such a host call: the
  inverse rotation (``rope_rotate``, and ``rope_apply`` with ``-sin``), the scatter for
  ``toeplitz_gather`` and the gather for ``toeplitz_scatter``; ``toeplitz_expand``'s sums
  the cotangent along each diagonal, in ``jax.numpy``. The tangents from float
  ``positions`` and from ``cos``/``sin`` are ``jax.numpy`` formulas (JAX transposes them
  for reverse mode, giving the gradients of ``posenc.torch._ops``, which the reference's
  equal): ``(-y_b, y_a)`` times the frequency and the position's tangent, and
  ``(a*dc - b*ds, b*dc + a*ds)`` from the first copy of each angle (the rotation does not
  read the second: its gradient is 0).

Under ``vmap`` a host call receives every argument with the batch axes in front (size 1
where an argument is not batched); ``_batched`` lines the per-position arguments up with ``x`` again, so the whole batch is one kernel
call. Values only known when the call runs (a traced ``offset`` in a Toeplitz index) meet
the launchers' own checks inside the host call, which raise there: nothing reaches a
kernel unchecked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from .. import _dispatch
from .._kernels.rope import guard_apply, guard_rotate
from .._kernels.toeplitz import guard_expand, guard_gather, guard_scatter
from . import native
from .primitive import LinearOp, adopt, aligned_empty, apply
from .register import tracer

@functools.lru_cache(maxsize=None)
def _numpy_kernel(op):
    """The function NumPy arrays get for ``op``: its ``numba_cpu`` registry entry."""
    (kernel,) = (k for k in _dispatch.kernels(op) if k.name == f"{op}.numba_cpu")
    return kernel.load()


# ---------------------------------------------------------------- eager: the arrays' memory


def _view(a):
    """A read-only NumPy view of a concrete JAX CPU array (no copy)."""
    return np.asarray(a)


def _eager(op, values, shape, *args, **kwargs):
    """``op``'s NumPy kernel on NumPy views of ``args``, into a new buffer of ``shape`` adopted by JAX."""
    out = aligned_empty(shape, values.dtype)
    _numpy_kernel(op)(*(_view(a) if isinstance(a, jax.Array) else a for a in args), out=out, **kwargs)
    return adopt(out, values, *args)


def _traced(*arrays):
    return any(tracer(a) for a in arrays)


def _spread(*arrays):
    """A concrete JAX array over several devices among ``arrays``."""
    return any(isinstance(a, jax.Array) and not tracer(a) and len(a.devices()) > 1 for a in arrays)


def _bound(op, *args):
    """``op`` on traced ``args``, or on concrete ones of which some span several devices:
    there under ``jit``, each device's kernel call on its own shard, as a jitted call's
    (the kernel's bits, where the reference's differ, and no gather)."""
    return apply(op, *args) if _traced(*args) else _jitted(op)(*args)


@functools.lru_cache(maxsize=256)
def _jitted(op):
    return jax.jit(functools.partial(apply, op))


# ---------------------------------------------------------------- traced: host calls


def _batched(x, ndim, *per_position):
    """Undo ``vmap``'s layout inside a host call: ``x`` has ``x.ndim - ndim`` batch axes in front,
    and so does each ``(array, width)`` of ``per_position``, whose unbatched form broadcasts
    against ``x``'s leading axes (``width`` 0) or its leading axes plus ``width`` channels.

    Returns ``x`` broadcast over the whole batch, and each array with ones inserted after
    its batch axes, so it broadcasts against ``x`` the way its unbatched form did.
    """
    lead = x.ndim - ndim
    if lead == 0:
        return (x, *(a for a, _ in per_position))
    batch = np.broadcast_shapes(x.shape[:lead], *(a.shape[:lead] for a, _ in per_position))
    x = np.broadcast_to(x, batch + x.shape[lead:])
    target = ndim - 1
    aligned = []
    for a, width in per_position:
        missing = target + (1 if width else 0) - (a.ndim - lead)
        aligned.append(a.reshape(a.shape[:lead] + (1,) * missing + a.shape[lead:]))
    return (x, *aligned)


def _aligned(a, lead, target, rank):
    """``a`` (``lead`` batch axes, then ``rank`` axes broadcasting against ``target`` ones)
    with ones inserted after its batch axes, so it broadcasts against the batched target."""
    return jnp.reshape(a, a.shape[:lead] + (1,) * (target - rank) + a.shape[lead:])


def _pairs(t, layout, half):
    """The two members ``(a, b)`` of the first ``half`` rotated pairs of ``t``."""
    if layout == "interleaved":
        return t[..., 0 : 2 * half : 2], t[..., 1 : 2 * half : 2]
    return t[..., :half], t[..., half : 2 * half]


def _from_pairs(a, b, layout, dim):
    """A ``[..., dim]`` array with pairs ``(a, b)`` where ``_pairs`` reads them and 0 in the channels after."""
    a, b = jnp.broadcast_arrays(a, b)
    if layout == "interleaved":
        rotated = jnp.reshape(jnp.stack([a, b], axis=-1), (*a.shape[:-1], 2 * a.shape[-1]))
    else:
        rotated = jnp.concatenate([a, b], axis=-1)
    rest = dim - rotated.shape[-1]
    return jnp.concatenate([rotated, jnp.zeros((*rotated.shape[:-1], rest), rotated.dtype)], axis=-1) if rest else rotated


def _zero(t):
    return type(t) is ad.Zero


def _work(*dtypes):
    return functools.reduce(jnp.promote_types, dtypes, jnp.float32)


@functools.lru_cache(maxsize=256)
def _rotation(inv_freq, layout, inverse, scale, ndim, positions_ndim):
    """``rope_rotate(x, positions)`` with these host options and unbatched ranks."""
    freqs = np.asarray(inv_freq, dtype=np.float64)

    def host(xv, pv, *, out):
        xv, pv = _batched(xv, ndim, (pv, 0))
        _numpy_kernel("rope_rotate")(xv, pv, freqs, layout=layout, inverse=inverse, scale=scale, out=out)

    def transpose(ct, x, positions):
        return apply(_rotation(inv_freq, layout, not inverse, scale, ndim, positions_ndim), ct, positions)

    def tangent(primals, tangents, y):
        # d (y_a, y_b) / d position = (-y_b, y_a) times the frequency (negated for the inverse).
        positions, dp = primals[1], tangents[1]
        if _zero(dp) or jnp.issubdtype(positions.dtype, jnp.integer):
            return None
        work = _work(y.dtype, dp.dtype)
        lead = positions.ndim - positions_ndim
        rate = _aligned(dp, lead, ndim - 1, positions_ndim)[..., None].astype(work) * jnp.asarray(-freqs if inverse else freqs, work)
        y_a, y_b = _pairs(y.astype(work), layout, freqs.size)
        return _from_pairs(-y_b * rate, y_a * rate, layout, y.shape[-1])

    return LinearOp(
        key=("rope_rotate", inv_freq, layout, inverse, scale, ndim),
        host=host,
        ranks=(ndim, positions_ndim),
        result=lambda x, positions: x,
        transpose=transpose,
        tangent=tangent,
        native=lambda x, positions: native.rotation(x, positions, freqs, layout, inverse, scale),
        reference=lambda xv, pv: _reference("rope_rotate")(
            xv, _aligned(pv, xv.ndim - ndim, ndim - 1, positions_ndim), freqs, layout=layout, inverse=inverse, scale=scale
        ),
    )


@functools.lru_cache(maxsize=256)
def _rotation_at_length(scaling, rotary_dim, base, layout, inverse, divide, ndim, positions_ndim, length_ndim):
    """``rope_rotate_at_length(x, positions, seq_len)``: the frequencies of the scaling named
    ``scaling`` (``scaling_name``) at the lengths the host call reads (0-d, or one per batch
    row placed like the positions), ``divide``: by the attention scale (the inverse's), these
    unbatched ranks."""
    from ..rotary.apply import rotate_at_traced_length
    from ..rotary.scaling import named_frequency_table, named_scaling

    kind = named_scaling(scaling)

    def frequencies(length):
        inv_freq, scale = named_frequency_table(scaling, rotary_dim, base, length)
        return inv_freq, 1.0 / scale if divide else scale

    def host(xv, pv, lv, *, out):
        if out.size == 0:
            return
        xv, pv, lv = _batched(xv, ndim, (pv, 0), (lv, 0))
        rotate = _numpy_kernel("rope_rotate")
        if lv.size == 1 or (lv == lv.flat[0]).all():  # one length for every row: one kernel call
            freqs, scale = frequencies(int(lv.flat[0]))
            rotate(xv, pv, freqs, layout=layout, inverse=inverse, scale=scale, out=out)
            return
        xv, pv = np.broadcast_to(xv, out.shape), np.broadcast_to(pv, out.shape[:-1])
        for row in np.ndindex(*lv.shape):  # rows of their own lengths (per-row seq_len, vmap over lengths)
            at = tuple(i if n > 1 else slice(None) for i, n in zip(row, lv.shape))
            freqs, scale = frequencies(int(lv[row]))
            rotate(xv[at], pv[at], freqs, layout=layout, inverse=inverse, scale=scale, out=out[at])

    def transpose(ct, x, positions, seq_len):
        adjoint = _rotation_at_length(scaling, rotary_dim, base, layout, not inverse, divide, ndim, positions_ndim, length_ndim)
        return apply(adjoint, ct, positions, seq_len)

    def tangent(primals, tangents, y):
        # As rope_rotate's, at the frequencies computed from the traced length (a derivative: no bits to keep).
        positions, seq_len = primals[1], jnp.asarray(primals[2])  # (a literal under jax.checkpoint: a Python int)
        dp = tangents[1]
        if _zero(dp) or jnp.issubdtype(positions.dtype, jnp.integer):
            return None
        work = _work(y.dtype, dp.dtype)
        lead = positions.ndim - positions_ndim
        freqs, _ = kind.traced_frequencies(jnp, rotary_dim, base, _aligned(seq_len, seq_len.ndim - length_ndim, ndim - 1, length_ndim)[..., None])
        rate = _aligned(dp, lead, ndim - 1, positions_ndim)[..., None].astype(work) * (-freqs if inverse else freqs).astype(work)
        y_a, y_b = _pairs(y.astype(work), layout, rotary_dim // 2)
        return _from_pairs(-y_b * rate, y_a * rate, layout, y.shape[-1])

    def reference(xv, pv, lv):
        lead = xv.ndim - ndim
        options = {"scaling": kind, "rotary_dim": rotary_dim, "base": base, "layout": layout}
        placed = _aligned(pv, lead, ndim - 1, positions_ndim), _aligned(lv, lead, ndim - 1, length_ndim)
        rotated = rotate_at_traced_length(xv, *placed, inverse=inverse, **options)
        return rotated if divide == inverse else rotated * _scale_ratio(kind, rotary_dim, base, divide)

    return LinearOp(
        key=("rope_rotate_at_length", scaling, rotary_dim, base, layout, inverse, divide, ndim),
        host=host,
        ranks=(ndim, positions_ndim, length_ndim),
        result=lambda x, positions, seq_len: x,
        transpose=transpose,
        tangent=tangent,
        reference=reference,
    )


def _scale_ratio(kind, rotary_dim, base, divide):
    """What turns the reference's scale for one direction into the other's: ``1/s**2`` to divide where it multiplied, ``s**2`` back."""
    from ..rotary.scaling import frequency_table

    scale = frequency_table(kind, rotary_dim, base, None)[1]  # (no scaling's attention scale depends on the length)
    return 1.0 / scale**2 if divide else scale**2


@functools.lru_cache(maxsize=256)
def _cos_sin_rotation(layout, ndim, width, table_ndim):
    """``rope_apply(x, cos, sin)`` in ``layout``, ``width`` rotated channels, these unbatched ranks."""
    half = width // 2

    def host(xv, cv, sv, *, out):
        xv, cv, sv = _batched(xv, ndim, (cv, width), (sv, width))
        _numpy_kernel("rope_apply")(xv, cv, sv, layout=layout, out=out)

    def transpose(ct, x, cos, sin):
        return apply(_cos_sin_rotation(layout, ndim, width, table_ndim), ct, cos, -sin)

    def tangent(primals, tangents, y):
        # y_a = a*c - b*s, y_b = b*c + a*s, with c and s the first copy of each angle.
        x, cos, _ = primals
        if _zero(tangents[1]) and _zero(tangents[2]):
            return None
        work = _work(x.dtype, cos.dtype)
        lead = cos.ndim - table_ndim
        a, b = _pairs(x.astype(work), layout, half)
        y_a = y_b = jnp.zeros((), work)
        for t, sign in ((tangents[1], None), (tangents[2], 1)):
            if not _zero(t):
                first, _ = _pairs(_aligned(t, lead, ndim, table_ndim).astype(work), layout, half)
                y_a, y_b = (y_a + a * first, y_b + b * first) if sign is None else (y_a - b * first, y_b + a * first)
        return _from_pairs(y_a, y_b, layout, x.shape[-1])

    return LinearOp(
        key=("rope_apply", layout, ndim, width),
        host=host,
        ranks=(ndim, table_ndim, table_ndim),
        result=lambda x, cos, sin: x,
        transpose=transpose,
        tangent=tangent,
        reference=lambda xv, cv, sv: _reference("rope_apply")(
            xv, *(_aligned(t, xv.ndim - ndim, ndim, table_ndim) for t in (cv, sv)), layout=layout
        ),
    )


def _diagonal_sums(g):
    """``out[..., t] = sum over i - j + k_len - 1 == t of g[..., i, j]``, ``toeplitz_expand``'s adjoint.

    Reversing the key axis turns diagonal ``t`` into anti-diagonal ``i + j'``; padding each
    row with ``q_len`` zeros and re-reading the flat buffer with rows one longer shifts row
    ``i`` right by ``i``, so the anti-diagonals line up as columns.
    """
    q_len, k_len = g.shape[-2], g.shape[-1]
    lead = g.shape[:-2]
    padded = jnp.pad(jnp.flip(g, axis=-1), [(0, 0)] * len(lead) + [(0, 0), (0, q_len)])
    flat = jnp.reshape(padded, (*lead, q_len * (k_len + q_len)))[..., : q_len * (k_len + q_len - 1)]
    return jnp.sum(jnp.reshape(flat, (*lead, q_len, k_len + q_len - 1)), axis=-2)


@functools.lru_cache(maxsize=256)
def _expansion(q_len, k_len, ndim):
    """``toeplitz_expand(vec)`` to ``[..., q_len, k_len]``, ``vec`` of unbatched rank ``ndim``."""

    def host(v, *, out):
        _numpy_kernel("toeplitz_expand")(v, q_len, k_len, out=out)

    def transpose(ct, vec):
        if q_len == 0 or k_len == 0:  # an empty bias, of an empty vec (expand_bias's count is 0 then)
            return jnp.zeros((*ct.shape[:-2], 0), ct.dtype)
        return _diagonal_sums(ct)

    return LinearOp(
        ("toeplitz_expand", q_len, k_len), host, (ndim,), lambda vec: (*vec[:-1], q_len, k_len), transpose,
        reference=lambda v: _reference("toeplitz_expand")(v, q_len, k_len),
    )  # fmt: skip


def _per_index(kernel, values, index, n, out):
    """``kernel(values, index, n)`` into ``out`` in a host call under ``vmap``: one call for the
    batch, or one per row of a batched ``index`` (a 1-D argument of the kernels)."""
    lead = index.ndim - 1
    if all(d == 1 for d in index.shape[:-1]):
        kernel(np.broadcast_to(values, out.shape[:-1] + values.shape[-1:]), index.reshape(index.shape[-1]), n, out=out)
        return
    batch = out.shape[:lead]
    values = np.broadcast_to(values, batch + values.shape[lead:])
    index = np.broadcast_to(index, batch + index.shape[-1:])
    for row in np.ndindex(*batch):
        kernel(values[row], index[row], n, out=out[row])


_ADJOINT = {"toeplitz_gather": "toeplitz_scatter", "toeplitz_scatter": "toeplitz_gather"}


@functools.lru_cache(maxsize=256)
def _indexed(op, n, ndim):
    """``toeplitz_gather``/``toeplitz_scatter(values, index)`` given ``n`` (``k_len`` / ``m``),
    ``values`` of unbatched rank ``ndim``; the transpose is the other op."""

    def host(vv, iv, *, out):
        _per_index(_numpy_kernel(op), vv, iv, n, out)

    def transpose(ct, values, index):
        return apply(_indexed(_ADJOINT[op], values.shape[-1], ndim), ct, index)

    return LinearOp((op, n), host, (ndim, 1), lambda values, index: (*values[:-1], n), transpose, reference=_per_index_reference(op, n))


def _per_index_reference(op, n):
    """``op``'s reference on ``(values, index)`` with ``vmap``'s batch axes in front: one call
    for a shared ``index``, the reference vmapped over a batched one."""

    def reference(vv, iv):
        lead = iv.ndim - 1
        if all(d == 1 for d in iv.shape[:lead]):
            return _reference(op)(vv, jnp.reshape(iv, iv.shape[-1:]), n)
        batch = tuple(np.broadcast_shapes(vv.shape[:lead], iv.shape[:lead]))
        rows = jax.vmap(lambda v, i: _reference(op)(v, i, n))
        flat = rows(
            jnp.reshape(jnp.broadcast_to(vv, batch + vv.shape[lead:]), (-1, *vv.shape[lead:])),
            jnp.reshape(jnp.broadcast_to(iv, batch + iv.shape[-1:]), (-1, iv.shape[-1])),
        )
        return jnp.reshape(flat, batch + flat.shape[1:])

    return reference


def _reference(op):
    return _dispatch.references()[op]


# ---------------------------------------------------------------- registry entries (the references' signatures)

# Each runs the launcher's shape checks first (at trace time under ``jit``: shapes are static).


def rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    freqs = guard_rotate(x, positions, inv_freq, None)
    if _traced(x, positions) or _spread(x, positions):
        return _bound(_rotation(tuple(freqs.tolist()), layout, bool(inverse), float(scale), x.ndim, positions.ndim), x, positions)
    return _eager("rope_rotate", x, x.shape, x, positions, freqs, layout=layout, inverse=inverse, scale=scale)


def rope_rotate_at_length(x, positions, seq_len, *, scaling, rotary_dim, base, layout="half", inverse=False, out=None):
    from ..rotary.scaling import scaling_name

    guard_rotate(x, positions, np.zeros(rotary_dim // 2), None)
    options = (scaling_name(scaling), rotary_dim, float(base), layout, bool(inverse), bool(inverse))
    op = _rotation_at_length(*options, x.ndim, positions.ndim, seq_len.ndim)
    return apply(op, x, positions, seq_len)


def rope_apply(x, cos, sin, *, layout="half", out=None):
    guard_apply(x, cos, sin, None)
    if _traced(x, cos, sin) or _spread(x, cos, sin):
        return _bound(_cos_sin_rotation(layout, x.ndim, cos.shape[-1], cos.ndim), x, cos, sin)
    return _eager("rope_apply", x, x.shape, x, cos, sin, layout=layout)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    shape = guard_expand(vec, q_len, k_len, None)
    q_len, k_len = shape[-2:]
    if _traced(vec) or _spread(vec):
        return _bound(_expansion(q_len, k_len, vec.ndim), vec)
    return _eager("toeplitz_expand", vec, shape, vec, q_len, k_len)


def toeplitz_gather(scores, index, k_len, *, out=None):
    shape = guard_gather(scores, index, k_len, None)
    if _traced(scores, index) or _spread(scores, index):
        return _bound(_indexed("toeplitz_gather", shape[-1], scores.ndim), scores, index)
    return _eager("toeplitz_gather", scores, shape, scores, index, shape[-1])


def toeplitz_scatter(weights, index, m, *, out=None):
    shape = guard_scatter(weights, index, m, None)
    if _traced(weights, index) or _spread(weights, index):
        return _bound(_indexed("toeplitz_scatter", shape[-1], weights.ndim), weights, index)
    return _eager("toeplitz_scatter", weights, shape, weights, index, shape[-1])
