"""One rotary call, parsed once: what a public function was asked, validated, in the forms
its kernel takes.

``rope`` and ``apply_rope`` hand their arguments here as they were given; each argument is
checked once, in the order of the function's parameters (so a call with two bad arguments
names the first), by the checks of its kind (``posenc._validate`` for arrays, numbers and
``out``, ``rotary._args`` for the rotary kinds: layout, rotary_dim, positions and their
placing, per-row values). The description that comes back (``RopeCall``, ``ApplyCall``)
selects the kernel or the reference (``posenc._dispatch``) and is what a plan of the
call's signature is built from (``posenc._kernels.rope_plan``): the cold path and a plan
see one validation.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _compat, _dispatch
from .. import _validate as check
from .._xp import cast_pair, cos_sin, cos_sin_of_array, device_of, explicit_sharding, has_float64, host_constant_like, is_real_floating, namespace, on_accelerator, one_device, one_kind, result_dtype, split_as_first, torch_compiling, trace_constant, widest_float
from . import _args
from .scaling import check_scaling, frequency_table, nameable


@dataclass(frozen=True, slots=True)
class RopeCall:
    """A validated ``rope`` call.

    ``placed``: the positions before the offset, placed against the token axes of ``x``
    (the given ones, widened to the index dtype, or ``arange`` along the sequence axis);
    ``positions``: what the kernel reads, ``placed + offset``; ``offset``: an int, a 0-d
    integer array or per-row integers placed on the batch axes. ``carried``: float
    positions and an offset where the namespace has no float64 (the sum would round in
    float32): ``positions`` is then ``placed``, the offset carried apart into the angles'
    exact reduction (``path == "split"`` for the rotation by known frequencies; ``"offsets"``
    where they are read now, one a row: each row then rotated as a call of its own). ``seq_len``: None where
    the frequencies do not depend on it, else an int, or per-row lengths (``path ==
    "rows"``: each row rotated as a call of its own), or a length known only inside the
    computation (``path == "traced"``), or an int while torch compiles, which may be
    symbolic (``path == "length"``: the frequencies are computed when the op runs). On the ``"kernel"`` path ``inv_freq`` (host
    float64 numbers) and ``scale`` (inverted for ``inverse``) are the rotation's.
    """

    x: Any
    xp: Any
    device: Any
    placed: Any
    positions: Any
    offset: Any
    base: float
    scaling: Any
    layout: str
    rotary_dim: int
    inverse: bool
    seq_len: Any
    out: Any
    path: str
    inv_freq: tuple | None
    scale: float | None
    carried: bool = False

    def kernel(self):
        """The implementation that rotates this call (``path == "kernel"``): a kernel that accepts it, or the reference."""
        return _dispatch.select("rope_rotate", self.x, self.positions, self.inv_freq, **self._options())

    def run(self):
        """The rotation of ``path == "kernel"``."""
        return self.kernel()(self.x, self.positions, self.inv_freq, **self._options())

    def _options(self):
        return {"layout": self.layout, "inverse": self.inverse, "scale": self.scale, "out": self.out}

    def length_options(self):
        """The options of ``rope_rotate_at_length`` (the frequencies at a length read when it runs)."""
        return {"scaling": self.scaling, "rotary_dim": self.rotary_dim, "base": self.base, "layout": self.layout, "inverse": self.inverse}


def parse_rope(x, positions, *, base, scaling, layout, rotary_dim, offset, seq_axis, inverse, seq_len, out) -> RopeCall:
    """``rope``'s arguments as a ``RopeCall``; ``TypeError``/``ValueError`` naming the first bad one."""
    check.array("x", x)
    if positions is not None:
        _args.positions_array(positions)
    read = [(name, a) for name, a in (("positions", positions), ("offset", offset), ("seq_len", seq_len)) if check.is_array(a)]
    per_row = [a for name, a in read if name != "positions" and a.ndim > 0]
    xp = namespace(x, positions, *per_row)
    device = device_of(x, positions, *per_row)
    check.float_array("x", x, xp)
    check.ndim("x", x, minimum=1)
    base = check.real("base", base, positive=True)
    check_scaling(scaling)
    layout = _args.layout("layout", layout)
    rdim = _args.rotary_dim(rotary_dim, check.static_int(x.shape[-1]))
    # (an accelerator's positions and offset summed in float64 unread, where a read was a synchronisation)
    unread = (positions is not None or check.is_array(offset)) and _args.summed_on_device(x, xp, device, scaling, seq_len)
    offset = _args.per_row("offset", check.read_on_its_gpu("offset", offset, device), xp, unread=unread)
    check.flag("inverse", inverse)
    seq_len = _args.per_row("seq_len", check.read_on_its_gpu("seq_len", seq_len, device), xp)
    if read:  # (a 0-d offset or length still an array is computed with, beside x)
        check.computed_on("offset", offset, device)
        check.computed_on("seq_len", seq_len, device)
    _args.out_like(out, x, xp, *read)
    # positions offset + arange(length): a known largest, or one a row for a per-row offset
    counted = positions is None and not (check.is_array(offset) and offset.ndim == 0)
    given = positions is not None
    placed, offset, positions = _args.positions(xp, x, positions, seq_axis, offset, device, unread=unread)
    seq_len = _args.rows("seq_len", seq_len, x, seq_axis)
    path, inv_freq, scale = "kernel", None, None
    if scaling is not None and scaling.uses_seq_len:
        if seq_len is None and counted:
            # What sequence_length reads from the positions, known without them (an int, or a
            # symbolic one while torch compiles) where they are traced (jax.jit, torch.compile).
            length = math.prod(placed.shape)
            if not length:
                seq_len = None
            elif check.is_array(offset):  # (per row)
                seq_len = _args.length_past(xp, offset + (length - 1))
            else:
                seq_len = offset + length
        elif seq_len is None:
            seq_len = _args.sequence_length(xp, positions, offset)
        if check.is_array(seq_len) and seq_len.ndim > 0 and check.is_eager(seq_len) and check.is_eager(x):
            path = "rows"
        elif seq_len is not None and not isinstance(seq_len, int) and not check.symbolic_size(seq_len):
            path = "traced"
        elif seq_len is not None and torch_compiling():  # an int that torch.compile (or export) may keep symbolic
            path = "length" if _dispatch.get_backend() != "reference" and nameable(scaling) else "traced"
    else:
        seq_len = None
    if path == "kernel":
        inv_freq, scale = frequency_table(scaling, rdim, base, seq_len)
        if inverse:
            scale = 1.0 / scale
    carried = given and (type(offset) is not int or offset != 0) and is_real_floating(xp, placed.dtype) and not has_float64(xp, device)
    if carried:
        positions, path = placed, "split" if path == "kernel" else path
        if path == "split" and check.is_array(offset) and offset.ndim and check.is_eager(offset) and check.is_eager(x):
            path = "offsets"  # (each row the call of its own offset, an int: 0 is not carried)
    return RopeCall(x, xp, device, placed, positions, offset, base, scaling, layout, rdim, inverse, seq_len, out, path, inv_freq, scale, carried)


@dataclass(frozen=True, slots=True)
class ApplyCall:
    """A validated ``apply_rope`` call: ``cos``/``sin`` ``[..., r]`` broadcasting against
    ``x.shape[:-1] + (r,)``, ``r`` even and at most ``x.shape[-1]``."""

    x: Any
    cos: Any
    sin: Any
    xp: Any
    layout: str
    out: Any

    def kernel(self):
        """A kernel that accepts this call, or the reference."""
        return _dispatch.select("rope_apply", self.x, self.cos, self.sin, layout=self.layout, out=self.out)

    def run(self):
        return self.kernel()(self.x, self.cos, self.sin, layout=self.layout, out=self.out)


def parse_apply(x, cos, sin, *, layout, out) -> ApplyCall:
    """``apply_rope``'s arguments as an ``ApplyCall``; ``TypeError``/``ValueError`` naming the first bad one."""
    for name, a in (("x", x), ("cos", cos), ("sin", sin)):
        check.array(name, a)
    xp = namespace(x, cos, sin)
    device_of(x, cos, sin)
    check.float_array("x", x, xp)
    check.ndim("x", x, minimum=1)
    check.float_array("cos", cos, xp)
    check.float_array("sin", sin, xp)
    check.ndim("cos", cos, minimum=1)
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    width = check.static_int(cos.shape[-1])
    if width % 2 or width == 0:
        raise ValueError(f"cos.shape[-1] (the rotary dimension) must be a positive even integer, got {width}")
    if width > x.shape[-1]:
        raise ValueError(f"cos.shape[-1] (the rotary dimension) must be <= x.shape[-1] = {x.shape[-1]}, got {width}")
    check.broadcast_shape("cos", cos.shape, (*x.shape[:-1], width))
    layout = _args.layout("layout", layout)
    _args.out_like(out, x, xp, ("cos", cos), ("sin", sin))
    return ApplyCall(x, cos, sin, xp, layout, out)


@dataclass(frozen=True, slots=True)
class TablesCall:
    """The validated arguments of the ``cos``/``sin`` table builders (``rope_cos_sin``,
    ``mrope_cos_sin``, ``xdrope_cos_sin``), and the steps they share. ``freqs``: a tuple
    of host float64 numbers, or an in-graph array (traced, or carrying a gradient);
    ``split``: the sharding of a JAX ``inv_freq`` split over an explicit mesh, else ``None``;
    ``positions``: integer ones widened to the index dtype (:func:`posenc._validate.positions`:
    of a Dask array, the blocks that check their values when computed)."""

    xp: Any
    device: Any
    layout: str
    freqs: Any
    pairs: int
    scale: float
    dtype: Any
    split: Any
    positions: Any

    def cos_sin(self, positions, freqs):
        """Undoubled ``cos, sin`` of ``positions * freqs`` (host numbers or an in-graph array)."""
        compute = cos_sin if isinstance(freqs, tuple) else cos_sin_of_array
        return compute(positions, freqs, xp=self.xp, device=self.device)

    def tables(self, c, s):
        """Scaled, doubled in the layout's order, in the result dtype."""
        xp = self.xp
        if self.scale != 1.0:
            c, s = c * self.scale, s * self.scale
        return cast_pair(xp, duplicate(xp, c, self.layout), duplicate(xp, s, self.layout), self.dtype)

    def placed(self, c, s):
        """The tables' last axis split as ``inv_freq`` is (``split``), as JAX splits the
        product ``positions[..., None] * inv_freq`` (host frequencies, or ones gathered to
        be picked, would leave it whole); the other axes as they are. Unchanged where the
        positions' axes use that mesh axis."""
        if self.split is None:
            return c, s
        return split_as_first(c, self.split, -1), split_as_first(s, self.split, -1)


def table_positions(positions, inv_freq):
    """A table builder's ``positions``: NumPy ones beside an ``inv_freq`` array of another
    library converted into it (host constants); arrays of two device libraries the
    ``TypeError`` naming both."""
    positions = host_constant_like("positions", positions, inv_freq)
    if check.is_array(inv_freq) and not isinstance(inv_freq, np.ndarray):
        namespace(check.array("positions", positions), inv_freq)
    return positions


def parse_tables(positions, inv_freq, *, layout, dtype, scale) -> TablesCall:
    """A table builder's arguments as a ``TablesCall``; ``TypeError``/``ValueError`` naming the first bad one."""
    check.array("positions", positions)
    xp = namespace(positions)
    device = device_of(positions)
    positions = check.positions("positions", positions, xp)
    layout = _args.layout("layout", layout)
    freqs = check.computed_on("inv_freq", _args.inv_freq("inv_freq", inv_freq, xp, device), device)
    pairs = _args.pair_count(freqs)
    scale = check.real("scale", scale)
    if dtype is None:
        dtype = positions.dtype if is_real_floating(xp, positions.dtype) else xp.float32
    split = explicit_sharding(inv_freq) if _compat.is_jax_namespace(xp) else None  # (a list beside torch.compile's tensors is no array to ask)
    return TablesCall(xp, device, layout, freqs, pairs, scale, result_dtype(xp, dtype, device), split, positions)


def duplicate(xp, half_table, layout):
    """``[..., n] -> [..., 2n]`` in the layout's order: ``[f0..fn, f0..fn]`` or ``[f0, f0, f1, f1, ...]``."""
    if layout == "half":
        return xp.concat([half_table, half_table], axis=-1)
    stacked = xp.stack([half_table, half_table], axis=-1)
    return xp.reshape(stacked, (*half_table.shape[:-1], 2 * half_table.shape[-1]))


@dataclass(frozen=True, slots=True)
class RerotateCall:
    """A validated ``rerotate`` call: ``delta`` as an array placed against ``x``'s token
    axes; with ``scaling`` its ``base``, ``rotary_dim`` and ``seq_len`` (an int, or per-row
    lengths placed on the batch axes), else ``freqs`` and optional ``new_freqs`` ``[r/2]``:
    tuples of host float64 numbers, or float arrays on ``x``'s accelerator, unread
    (:func:`_args.kept_on_device`)."""

    x: Any
    xp: Any
    delta: Any
    layout: str
    out: Any
    freqs: Any
    new_freqs: Any
    scaling: Any
    base: float | None
    rotary_dim: int | None
    seq_len: Any

    def kernel(self):
        """The implementation of the plain shift (by ``freqs``): a kernel that accepts it, or the reference."""
        return _dispatch.select("rope_rotate", self.x, self.delta, self.freqs, layout=self.layout, out=self.out)

    def run(self, freqs):
        """``x`` rotated by ``delta`` at frequencies ``freqs``: host numbers (the kernel's
        constants), or an array on ``x``'s accelerator, whose float64 products give the
        ``cos``/``sin`` tables there (the same angles, nothing read back)."""
        if isinstance(freqs, tuple):
            return _dispatch.call("rope_rotate", self.x, self.delta, freqs, layout=self.layout, out=self.out)
        c, s = cos_sin_of_array(self.delta, freqs, xp=self.xp, device=device_of(self.x))
        return rotate_by(self.x, c, s, 1.0, self.layout, self.out)

    def step(self):
        """``new_freqs - freqs``, in float64: host numbers, or an array on the accelerator."""
        if isinstance(self.freqs, tuple):
            return difference(self.new_freqs, self.freqs)
        return self.xp.astype(self.new_freqs, self.xp.float64) - self.xp.astype(self.freqs, self.xp.float64)


def rotate_by(x, c, s, scale, layout, out):
    """``x`` rotated by the undoubled ``cos``/``sin`` tables times ``scale`` (``rope_apply``)."""
    xp = namespace(x)
    if scale != 1.0:
        c, s = c * scale, s * scale
    tables = duplicate(xp, c, layout), duplicate(xp, s, layout)
    return _dispatch.call("rope_apply", x, *tables, layout=layout, out=out)


@trace_constant
def difference(new, old):
    """``new - old`` of two tuples of host frequencies, in float64 (a tuple: a constant of a
    ``torch.compile`` graph, where NumPy arithmetic would be traced)."""
    return tuple((np.asarray(new, dtype=np.float64) - np.asarray(old, dtype=np.float64)).tolist())


def parse_rerotate(x, delta, inv_freq, *, layout, new_inv_freq, scaling, base, seq_len, rotary_dim, seq_axis, out) -> RerotateCall:
    """``rerotate``'s arguments as a ``RerotateCall``; ``TypeError``/``ValueError`` naming the first bad one."""
    check.array("x", x)
    for like in (delta, seq_len):  # (NumPy keys beside a device delta or seq_len: converted, as rope converts them)
        x = host_constant_like("x", x, like)
    delta, seq_len = host_constant_like("delta", delta, x), host_constant_like("seq_len", seq_len, x)
    read = [(name, a) for name, a in (("delta", delta), ("inv_freq", inv_freq), ("new_inv_freq", new_inv_freq), ("seq_len", seq_len)) if check.is_array(a)]
    per_row = {name: a for name, a in (("delta", delta), ("seq_len", seq_len)) if check.is_array(a)}
    one_kind(x=x, **per_row)
    xp = namespace(x, *per_row.values())
    check.float_array("x", x, xp)
    check.ndim("x", x, minimum=1)
    device = one_device(x=x, **per_row)
    if not check.is_array(delta):
        delta = _scalar_array(xp, "delta", delta, device)
    delta = check.positions("delta", delta, xp, device, finite=not (check.is_eager(delta) and on_accelerator(delta)))  # (as rope's positions)
    if delta.ndim:
        axis = _args.sequence_axis(seq_axis, x)[0] if x.ndim > 1 or seq_axis is not None else 0
        delta = _args.place("delta", delta, tuple(x.shape[:-1]), axis, xp)
    elif seq_axis is not None:  # a single delta uses no axis, but a seq_axis given must be one
        _args.sequence_axis(seq_axis, x)
    _args.out_like(out, x, xp, *read)
    layout = _args.layout("layout", layout)
    if scaling is not None:
        if inv_freq is not None or new_inv_freq is not None:
            raise ValueError("pass either inv_freq (and new_inv_freq) or scaling=, not both")
        check_scaling(scaling)
        base = check.real("base", base, positive=True)
        rdim = _args.rotary_dim(rotary_dim, check.static_int(x.shape[-1]))
        if seq_len is None:
            raise TypeError("rerotate with scaling= needs seq_len: the length whose frequencies the keys move to")
        if check.concrete_jax(seq_len) and not check.is_eager(seq_len):  # closed over by a jitted function: read now, as eagerly
            seq_len = check.integer("seq_len", seq_len, minimum=0) if seq_len.ndim == 0 else np.asarray(seq_len)
        seq_len = _args.per_row("seq_len", seq_len, namespace(seq_len) if isinstance(seq_len, np.ndarray) else xp)
        if check.is_array(seq_len) and not check.is_eager(seq_len):
            raise TypeError("rerotate's seq_len must be readable now (an int or an eager integer array), got a traced value")
        seq_len = _args.rows("seq_len", seq_len, x, seq_axis)
        return RerotateCall(x, xp, delta, layout, out, None, None, scaling, base, rdim, seq_len)
    if inv_freq is None:
        raise TypeError("rerotate needs inv_freq (the frequencies x was rotated with), or scaling= and seq_len=")
    if seq_len is not None or rotary_dim is not None:
        raise ValueError("seq_len and rotary_dim are read with scaling= only; with inv_freq the frequencies say both")
    for name, f in (("inv_freq", inv_freq), ("new_inv_freq", new_inv_freq)):
        check.read_on_its_gpu(name, f, device)  # (both, before either is read)
    # (both kept on the accelerator, unread, or both read: their difference is of two of a kind)
    kept = all(_args.kept_on_device(f, xp, device) for f in (inv_freq, new_inv_freq) if f is not None)
    freqs = _args.rerotation_inv_freq("inv_freq", inv_freq, xp, device, kept)
    pairs = _args.pair_count(freqs)
    if 2 * pairs > x.shape[-1]:
        raise ValueError(f"inv_freq has {pairs} frequencies, more than x.shape[-1] / 2 = {x.shape[-1] // 2}")
    new = None
    if new_inv_freq is not None:
        new = _args.rerotation_inv_freq("new_inv_freq", new_inv_freq, xp, device, kept)
        if _args.pair_count(new) != pairs:
            raise ValueError(f"new_inv_freq must have the shape of inv_freq {(pairs,)}, got {(_args.pair_count(new),)}")
    return RerotateCall(x, xp, delta, layout, out, freqs, new, None, None, None, None)


def _scalar_array(xp, name, value, device):
    """A Python int or real number as a 0-d array (index dtype or the widest float)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        dtype, bits, low, high = check.index_bounds(xp, device)
        value = check.integer(name, value)
        if not low <= value <= high:
            raise ValueError(f"{name} must fit in int{bits} ({low} .. {high}), got {value}")
        return xp.asarray(value, dtype=dtype, device=device)
    value = check.real(name, value)
    return xp.asarray(value, dtype=widest_float(xp, device), device=device)
