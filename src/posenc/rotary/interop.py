"""Moving rotated keys and checkpoints between positions, frequency sets and layouts."""

from __future__ import annotations

import numpy as np

from .. import _dispatch, _plans
from . import _signatures
from .. import _validate as check
from .._xp import device_of, host_plain, namespace, resplit, unsplit
from . import _args, _call, _chain, _rows
from ._rotate import _join, _pairs
from .scaling import frequency_table


@_plans.planned(_signatures.Rerotate)
def rerotate(
    x,
    delta,
    inv_freq=None,
    *,
    layout="half",
    new_inv_freq=None,
    scaling=None,
    base=10000.0,
    seq_len=None,
    rotary_dim=None,
    seq_axis=None,
    out=None,
):
    r"""Re-rotate already rotated keys (a KV cache) instead of recomputing them.

    Rotations compose, :math:`R_{m+\delta} = R_\delta R_m`, so a cached key rotated at
    position ``m`` becomes the key at ``m + delta`` by one more rotation by ``delta``
    (a context shift: drop the first tokens of a cache with ``delta = -n_dropped``). With
    ``new_inv_freq``, ``delta`` is the position ``m`` each key was rotated at and the
    key moves from frequencies :math:`\theta` to :math:`\theta'`: pair ``i`` is rotated
    by :math:`m(\theta'_i - \theta_i)` (a LongRoPE short-to-long switch, a dynamic-NTK
    base change). Attention scales are not touched.

    With ``scaling`` (and ``seq_len``) instead of frequencies, the keys are those rotated
    at the scaling's original length (``rope(k, scaling=scaling)`` with ``seq_len`` at
    most the original length: dynamic NTK's original frequencies, LongRoPE's short
    factors) and move in one step to the frequencies of ``seq_len``: the exact recipe for
    a growing cache (one rounding, however many steps), which cannot chain.

    **Chained rerotations.** Moving keys that were already moved to new frequencies on to
    the next ones rounds once more at every step (a bfloat16 cache drifts by 21% in 1000
    dynamic-NTK steps). The keys do not say which frequencies they hold, so rerotate
    cannot see a chain in general; it can tell when ``x`` is memory that a
    frequency-changing rerotate wrote itself (in place, or into the same buffer), and
    then warns (``RuntimeWarning``). A chain through a copy (a concatenation) is not seen.

    Parameters
    ----------
    x : array ``[..., d]``, real floating, already rotated with ``inv_freq``
    delta : int or array
        Shift in positions, or the positions the keys sit at when ``new_inv_freq`` or
        ``scaling`` is given; an array is placed as :func:`rope` places ``positions``
        (last axis along the sequence axis, leading axes along the batch axes).
    inv_freq : array or sequence ``[r/2]``, ``r <= d``
        The frequencies ``x`` was rotated with (not with ``scaling``).
    layout : {"half", "interleaved"}
    new_inv_freq : array or sequence ``[r/2]``, optional
    scaling : posenc.scaling object, optional
        Instead of ``inv_freq``/``new_inv_freq``: from the scaling's frequencies at its
        original length to those of ``seq_len``, with ``base`` and ``rotary_dim`` as in
        :func:`rope`.
    base : float
    seq_len : int or integer array of one value per batch row
        With ``scaling``: the length whose frequencies the keys move to; per row (placed
        as :func:`rope` places it) each row moves to its own, bit-identical to a
        single-row call. Read now: a traced or lazy value (``jax.jit``, ``torch.compile``,
        Dask) is a ``TypeError`` (``rope`` takes one; ``rerotate`` does not).
    rotary_dim : int, optional
        With ``scaling``: the rotated channels (default ``d``).
    seq_axis : int or str, optional
        The sequence axis of the cache, or its named layout (``"bhsd"``, ``"bshd"``,
        ``"thd"``...), as in :func:`rope`; default -2.
    out : array like ``x``, optional
        Written with the result and returned; ``out=x`` shifts the cache in place, with
        no second cache allocated.

    Returns
    -------
    array like ``x``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> k = np.random.default_rng(0).standard_normal((4, 8))
    >>> inv_freq, _ = pe.rope_frequencies(8)
    >>> at_10 = pe.rope(k, np.full(4, 10))
    >>> bool(np.allclose(pe.rerotate(at_10, 5, inv_freq), pe.rope(k, np.full(4, 15))))
    True
    >>> cache = pe.rope(k)                                # keys at positions 0..3
    >>> _ = pe.rerotate(cache, -1, inv_freq, out=cache)   # in place: now at -1..2
    >>> bool(np.allclose(cache, pe.rope(k, offset=-1)))
    True
    >>> dynamic = pe.scaling.DynamicNTK(2.0, original_max_position=2)
    >>> moved = pe.rerotate(pe.rope(k), np.arange(4), scaling=dynamic, seq_len=9)
    >>> bool(np.allclose(moved, pe.rope(k, scaling=dynamic, seq_len=9)))
    True
    """
    call = _call.parse_rerotate(
        x, delta, inv_freq, layout=layout, new_inv_freq=new_inv_freq, scaling=scaling, base=base, seq_len=seq_len,
        rotary_dim=rotary_dim, seq_axis=seq_axis, out=out,
    )  # fmt: skip
    if call.scaling is not None:
        return _rerotate_scaled(call)
    if call.new_freqs is None:
        return call.run(call.freqs)
    _chain.warn_if_chained(x)
    result = call.run(call.step())
    _chain.note(result)
    return result


def _rerotate_scaled(call):
    """``rerotate`` from a scaling's frequencies at its original length to those of ``seq_len``."""
    scaling, rdim, base, layout = call.scaling, call.rotary_dim, call.base, call.layout
    first = frequency_table(scaling, rdim, base, None)[0]

    def move(x_rows, delta_rows, length, out=None):  # from the first frequencies to those of `length`
        step = _call.difference(frequency_table(scaling, rdim, base, length)[0], first)
        return _dispatch.call("rope_rotate", x_rows, delta_rows, step, layout=layout, out=out)

    _chain.warn_if_chained(call.x)
    if isinstance(call.seq_len, int):
        result = move(call.x, call.delta, call.seq_len, call.out)
    else:
        result = _rows.rotate_each_row(call.xp, call.x, call.delta, call.seq_len, move)
        if call.out is not None:
            call.out[...] = result
            result = call.out
    _chain.note(result)
    return result


def convert_layout(x, src, dst, *, rotary_dim=None):
    """Reorder the rotary channels of ``x`` from layout ``src`` to layout ``dst``.

    ``"interleaved"`` keeps pair ``i`` in channels ``(2i, 2i+1)``, ``"half"`` in
    ``(i, i + r/2)``. Rotating converted activations equals converting rotated ones:
    ``rope(convert_layout(x, "half", "interleaved"), layout="interleaved") ==
    convert_layout(rope(x, layout="half"), "half", "interleaved")``. Channels after
    ``rotary_dim`` (default: all) pass through.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.convert_layout(np.arange(6.0), "half", "interleaved").tolist()
    [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    """
    check.array("x", x)
    xp = namespace(x)
    check.ndim("x", x, minimum=1)
    src = _args.layout("src", src)
    dst = _args.layout("dst", dst)
    width = int(x.shape[-1])
    rdim = _args.rotary_dim(rotary_dim, width)
    if src == dst:
        return x
    x, split = unsplit(x, -1)  # (a pair's channels may lie on two devices)
    a, b, rest = _pairs(xp, x, rdim, src)
    return resplit(_join(xp, a, b, rest, dst), split)


def _row_permutation(head_dim, rotary_dim, src, dst):
    """Host index ``p`` with ``converted[..., j] = x[..., p[j]]`` for one head."""
    index = np.arange(head_dim)
    n = rotary_dim // 2
    pair_a = index[:n] if src == "half" else index[0:rotary_dim:2]
    pair_b = index[n:rotary_dim] if src == "half" else index[1:rotary_dim:2]
    rotated = np.concatenate([pair_a, pair_b]) if dst == "half" else np.stack([pair_a, pair_b], axis=-1).reshape(-1)
    return np.concatenate([rotated, index[rotary_dim:]])


def permute_qk_weight(w, src, dst, *, head_dim, rotary_dim=None):
    """Permute the output rows of a q or k projection from layout ``src`` to ``dst``.

    ``w`` is ``[heads * head_dim, ...]`` (a ``Linear`` weight ``[out, in]`` or its bias
    ``[out]``); the rows of each head are reordered as :func:`convert_layout` reorders
    features, so ``x @ permuted.T == convert_layout(x @ w.T)`` and a checkpoint trained
    with one layout gives the same attention scores with the other (Meta's interleaved
    LLaMA weights -> Hugging Face's half layout is ``src="interleaved", dst="half"``).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> w = np.arange(8.0)[:, None]                       # 2 heads of 4 rows
    >>> pe.permute_qk_weight(w, "interleaved", "half", head_dim=4)[:, 0].tolist()
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    check.array("w", w)
    xp = namespace(w)
    check.ndim("w", w, minimum=1)
    w = host_plain(w)  # (its rows taken as they are would keep a subclass and the other byte order)
    src = _args.layout("src", src)
    dst = _args.layout("dst", dst)
    head_dim = check.even_dim("head_dim", head_dim)
    rows = int(w.shape[0])
    if rows % head_dim:
        raise ValueError(f"w.shape[0] must be a multiple of head_dim = {head_dim}, got shape {tuple(w.shape)}")
    rdim = _args.rotary_dim(rotary_dim, head_dim, what="head_dim")
    per_head = _row_permutation(head_dim, rdim, src, dst)
    index = (np.arange(rows // head_dim)[:, None] * head_dim + per_head).reshape(-1)
    if not rows:  # (an empty list is a float array to asarray, which take refuses)
        return w[:0, ...]
    w, split = unsplit(w, 0)  # (JAX takes no rows of a split axis)
    return resplit(xp.take(w, xp.asarray(index.tolist(), device=device_of(w)), axis=0), split)
