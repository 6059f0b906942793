"""Dask: the rotary and Toeplitz hot loops run block by block (ops ``rope_rotate``, ``toeplitz_expand``).

A chunked Dask array is a grid of NumPy (or CuPy) blocks. The functions here build a lazy
graph in which every task hands one block to the kernel registry (``_dispatch.call``), so
the Numba or numba.cuda kernel that accepts the block does the work, on the threads of one
machine or the workers of a ``dask.distributed`` cluster. They have the signatures of the
references they optimise and are registered as the ``dask_blocks`` kernels. ``accepts``
recognises Dask arrays through ``sys.modules``; Dask itself is imported only when a Dask
array reaches one of these ops. Arrays of unknown chunk sizes (NaN in the shape), which
the public functions refuse (``_validate.array``), are not accepted here either.
"""

from __future__ import annotations

import math

from . import _compat, _dispatch


def _known(*arrays) -> bool:
    """Every array given (``None`` skipped) is a Dask array of known shape."""
    return all(a is None or (_compat.is_dask_array(a) and not any(math.isnan(s) for s in a.shape)) for a in arrays)


def _write(result, out):
    """The result, or ``out`` holding it.

    Dask's ``out[...] = value`` ends by rebinding ``out`` to a new graph; its per-block
    assignment before that grows quadratically with the number of blocks (95 s for 6400
    blocks), so ``out`` is rebound here directly, to the result in ``out``'s chunks.
    """
    if out is None:
        return result
    result = result.rechunk(out.chunks)
    out._meta, out.dask, out._name, out._chunks = result._meta, result.dask, result.name, result.chunks
    return out


# ---------------------------------------------------------------- rope_rotate


def _rotate_block(x, positions, *, inv_freq, layout, inverse, scale):
    return _dispatch.call("rope_rotate", x, positions, inv_freq, layout=layout, inverse=inverse, scale=scale)


def _positions_like(positions, x):
    """``positions`` with one axis per batch axis of ``x``, chunked like ``x`` along each
    axis it spans; its length-1 axes stay single blocks and broadcast."""
    batch = x.ndim - 1
    pos = positions[(None,) * (batch - positions.ndim)]
    chunks = tuple((1,) if pos.shape[a] == 1 else x.chunks[a] for a in range(batch))
    return pos if pos.chunks == chunks else pos.rechunk(chunks)


def rope_rotate_blocks(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """``rope_rotate`` on Dask arrays: one registry call per block of ``x``.

    The feature axis is brought into one chunk (a rotated pair spans it); the result has
    the chunks of ``x`` along every other axis, and ``positions`` are rechunked to match.
    """
    import dask.array as da

    whole = x if x.numblocks[-1] == 1 else x.rechunk({x.ndim - 1: -1})
    pos = _positions_like(positions, whole)
    index = tuple(range(x.ndim))
    result = da.blockwise(
        _rotate_block,
        index,
        whole,
        index,
        pos,
        index[:-1],
        dtype=x.dtype,
        meta=whole._meta,
        inv_freq=inv_freq,
        layout=layout,
        inverse=inverse,
        scale=scale,
    )
    return _write(result, out)


# ---------------------------------------------------------------- rope_rotate_at_length


def _rotate_at_length_block(x, positions, seq_len, *, scaling, rotary_dim, base, layout, inverse):
    from ._xp import namespace
    from .rotary._rows import rotate_at_lengths
    from .rotary.scaling import frequency_table

    if not x.size:  # an empty chunk: no row to read a length for
        return x.copy()

    def rotate_at(x_rows, positions_rows, length):
        inv_freq, scale = frequency_table(scaling, rotary_dim, base, length)
        return _rotate_block(x_rows, positions_rows, inv_freq=inv_freq, layout=layout, inverse=inverse, scale=1.0 / scale if inverse else scale)

    return rotate_at_lengths(namespace(x), x, positions, seq_len, rotate_at)


def rope_rotate_at_length_blocks(x, positions, seq_len, *, scaling, rotary_dim, base, layout="half", inverse=False, out=None):
    """``rope_rotate_at_length`` on Dask arrays, a lazy length (0-d, or per row on ``x``'s
    token axes): each block reads its lengths when it runs and rotates as ``rope_rotate`` at
    their frequencies, the eager call's (chunks as :func:`rope_rotate_blocks`)."""
    import dask.array as da

    whole = x if x.numblocks[-1] == 1 else x.rechunk({x.ndim - 1: -1})
    index = tuple(range(x.ndim))
    lengths = (seq_len, ()) if seq_len.ndim == 0 else (_positions_like(seq_len, whole), index[:-1])
    options = {"scaling": scaling, "rotary_dim": rotary_dim, "base": base, "layout": layout, "inverse": inverse}
    result = da.blockwise(
        _rotate_at_length_block, index, whole, index, _positions_like(positions, whole), index[:-1], *lengths,
        dtype=x.dtype, meta=whole._meta, **options,
    )  # fmt: skip
    return _write(result, out)


# ---------------------------------------------------------------- toeplitz_expand


def _expand_block(vec, rows, cols, *, k_len):
    """The block of the expansion at rows ``rows`` and columns ``cols`` (contiguous ranges).

    Entry ``(i, j)`` reads ``vec[..., i - j + k_len - 1]``; over rows ``i0 .. i1 - 1`` and
    columns ``j0 .. j1 - 1`` that is the slice ``i0 - j1 + k_len .. i1 - j0 + k_len - 1``
    (end excluded), itself expanded as a ``qb x kb`` Toeplitz matrix.
    """
    if not (len(rows) and len(cols)):  # an empty chunk: no distance to read
        return _dispatch.call("toeplitz_expand", vec[..., :0], len(rows), len(cols))
    i0, i1, j0, j1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    piece = vec[..., i0 - j1 + k_len : i1 - j0 + k_len - 1]
    return _dispatch.call("toeplitz_expand", piece, i1 - i0, j1 - j0)


def bias_chunks(vec, q_len, k_len):
    """Default blocks of the expanded bias: the leading (head) axes chunked like ``vec``,
    the query and key axes by Dask's ``"auto"`` rule (``array.chunk-size``, 128 MiB)."""
    from dask.array.core import normalize_chunks

    lead = vec.ndim - 1
    if not q_len or not k_len:  # (an empty bias, one block: Dask's "auto" divides by its size)
        return (*vec.chunks[:lead], (q_len,), (k_len,))
    return normalize_chunks((*vec.chunks[:lead], "auto", "auto"), shape=(*vec.shape[:lead], q_len, k_len), dtype=vec.dtype)


def toeplitz_expand_blocks(vec, q_len, k_len, *, out=None):
    """``toeplitz_expand`` on a Dask ``vec``: a blocked ``[..., q_len, k_len]`` array.

    Blocks are ``out``'s chunks when ``out`` is given, else :func:`bias_chunks`. The
    distance axis of ``vec`` (``O(q_len + k_len)``) is one chunk that every block of its
    leading index reads its slice from; each task learns its rows and columns from the
    matching blocks of two lazy ``arange``s chunked like the query and key axes.
    """
    import dask.array as da
    from dask.array.utils import meta_from_array

    lead = vec.ndim - 1
    chunks = out.chunks if out is not None else bias_chunks(vec, q_len, k_len)
    whole = vec.rechunk({**{a: chunks[a] for a in range(lead)}, lead: -1})
    rows = da.arange(q_len, chunks=(chunks[lead],))
    cols = da.arange(k_len, chunks=(chunks[lead + 1],))
    index = tuple(range(lead))
    i, j, t = lead, lead + 1, lead + 2
    result = da.blockwise(
        _expand_block,
        (*index, i, j),
        whole,
        (*index, t),
        rows,
        (i,),
        cols,
        (j,),
        concatenate=True,
        align_arrays=False,  # aligned above; Dask's alignment warns of the chunks this creates
        dtype=vec.dtype,
        meta=meta_from_array(whole, ndim=lead + 2),
        k_len=k_len,
    )
    return _write(result, out)


def empty_blocked(like, shape, chunks):
    """An empty Dask array of ``like``'s dtype with ``chunks`` (a ``chunks=`` request
    turned into an ``out`` buffer); ``ValueError`` naming ``chunks`` when they do not fit."""
    import dask.array as da
    from dask.array.core import normalize_chunks

    try:
        blocks = normalize_chunks(chunks, shape=shape, dtype=like.dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"chunks {chunks!r} do not describe blocks of an array of shape {tuple(shape)}: {exc}") from None
    if any(sum(axis) != n or min(axis, default=0) < 0 for axis, n in zip(blocks, shape)):
        raise ValueError(f"chunks {chunks!r} do not describe blocks of an array of shape {tuple(shape)}: they give {blocks}")
    return da.empty(shape, chunks=blocks, dtype=like.dtype)


# ---------------------------------------------------------------- registry

_dispatch.register(
    "rope_rotate",
    "rope_rotate.dask_blocks",
    accepts=lambda a: _compat.is_dask_array(a["x"]) and _known(a["x"], a["positions"], a["out"]),
    loader="posenc._dask:rope_rotate_blocks",
)
_dispatch.register(
    "rope_rotate_at_length",
    "rope_rotate_at_length.dask_blocks",
    accepts=lambda a: _compat.is_dask_array(a["x"]) and _known(a["x"], a["positions"], a["seq_len"], a["out"]),
    loader="posenc._dask:rope_rotate_at_length_blocks",
)
_dispatch.register(
    "toeplitz_expand",
    "toeplitz_expand.dask_blocks",
    accepts=lambda a: _compat.is_dask_array(a["vec"]) and _known(a["vec"], a["out"]) and a["q_len"] > 0 and a["k_len"] > 0,
    loader="posenc._dask:toeplitz_expand_blocks",
)
