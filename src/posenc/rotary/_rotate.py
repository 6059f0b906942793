"""The two rotary hot loops, as references the kernels optimise.

``rotate_positions`` (op ``"rope_rotate"``) is ``rope``'s core: angles from positions and
host float64 frequencies, computed in float64 (or the exact split reduction), applied to
the first ``2*len(inv_freq)`` channels. ``rotate_cos_sin`` (op ``"rope_apply"``) is
``apply_rope``'s core: the same rotation from caller-given ``cos``/``sin``.

Both take already validated arguments; the public functions in ``rotary`` validate.
"""

from __future__ import annotations

from .._dispatch import reference
from .._xp import cast, cos_sin, device_of, kept_for_gradient, namespace, resplit, unsplit, widest_float
from .scaling import frequency_table


def _pairs(xp, x, rotary_dim, layout):
    """The two halves ``(a, b)`` of every rotated pair, and the pass-through channels (``None``
    where there are none: an empty slice of an array sharded over an explicit JAX mesh
    raises outside ``jit``)."""
    if layout == "half":
        a, b = x[..., : rotary_dim // 2], x[..., rotary_dim // 2 : rotary_dim]
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    return a, b, x[..., rotary_dim:] if rotary_dim != x.shape[-1] else None


def _join(xp, ra, rb, rest, layout):
    if layout == "half":
        rotated = xp.concat([ra, rb], axis=-1)
    else:
        rotated = xp.reshape(xp.stack([ra, rb], axis=-1), (*ra.shape[:-1], 2 * ra.shape[-1]))
    return xp.concat([rotated, rest], axis=-1) if rest is not None and rest.shape[-1] else rotated


def _write(xp, result, out):
    if out is None:
        return result
    out[...] = result
    return out


def _rotate(xp, x, c, s, layout, scale, out):
    """``(a*c - b*s, b*c + a*s) * scale`` on the rotated pairs, rest passed through."""
    rotary_dim = 2 * c.shape[-1]
    x, split = unsplit(kept_for_gradient(x, out, (c, s)), -1)  # (a pair's channels may lie on two devices)
    a, b, rest = _pairs(xp, x, rotary_dim, layout)
    a, b = cast(xp, a, c.dtype), cast(xp, b, c.dtype)
    if scale != 1.0:
        c, s = c * scale, s * scale
    ra = cast(xp, a * c - b * s, x.dtype)
    rb = cast(xp, b * c + a * s, x.dtype)
    result = _join(xp, ra, rb, rest, layout)
    return _write(xp, resplit(result, split), out)


@reference("rope_rotate")
def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """Rotate the first ``2*len(inv_freq)`` channels of ``x`` by ``positions * inv_freq``.

    ``x``: ``[..., d]`` real floating; ``positions``: integer or float array broadcasting
    against ``x.shape[:-1]``; ``inv_freq``: host float64 numbers ``[r/2]`` (a NumPy array or a
    tuple of floats);
    ``layout``: ``"half"`` or ``"interleaved"``; ``inverse``: rotate by ``-angle``;
    ``scale``: multiplies the rotated channels (a scaling's attention scale); ``out``:
    ``None``, ``x`` itself or a buffer like ``x``.
    """
    xp = namespace(x, positions)
    c, s = cos_sin(positions, inv_freq, xp=xp, device=device_of(x))
    if inverse:
        s = -s
    return _rotate(xp, x, c, s, layout, scale, out)


@reference("rope_rotate_at_length")
def rotate_at_length(x, positions, seq_len, *, scaling, rotary_dim, base, layout="half", inverse=False, out=None):
    """``rope_rotate`` at the frequencies and attention scale that the length-dependent
    ``scaling`` gives at ``seq_len`` (an int, or a 0-d array of a whole number read now),
    divided by the scale for ``inverse``. ``rope`` calls it where the length cannot be read
    now: an int while ``torch.compile`` traces (maybe symbolic: the torch adapter's op reads
    it when it runs), a traced 0-d JAX array (the JAX CPU host call reads it)."""
    inv_freq, scale = frequency_table(scaling, rotary_dim, base, seq_len if isinstance(seq_len, int) else int(seq_len))
    return rotate_positions(x, positions, inv_freq, layout=layout, inverse=inverse, scale=1.0 / scale if inverse else scale, out=out)


@reference("rope_apply")
def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """Rotate the first ``cos.shape[-1]`` channels of ``x`` with caller-given ``cos``/``sin``.

    ``cos``/``sin``: ``[..., r]`` in the layout's order (each angle twice), broadcasting
    against ``x.shape[:-1] + (r,)``. Computed in float64 where available.
    """
    xp = namespace(x, cos, sin)
    work = widest_float(xp, device_of(x))
    rotary_dim = cos.shape[-1]
    c, _, _ = _pairs(xp, cos, rotary_dim, layout)
    s, _, _ = _pairs(xp, sin, rotary_dim, layout)
    return _rotate(xp, x, cast(xp, c, work), cast(xp, s, work), layout, 1.0, out)
