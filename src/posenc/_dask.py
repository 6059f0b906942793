"""Dask fast paths: the rotary and Toeplitz hot loops, run block by block.

A chunked Dask array is a grid of NumPy (or CuPy) blocks. The functions here build a
graph in which every task hands one block to the kernel registry (``_dispatch.call``),
so the Numba or numba.cuda kernel that accepts the block does the work, block by block,
on the threads of one machine or the workers of a ``dask.distributed`` cluster. They
have the signatures of the references they optimise and are registered as the
``dask_blocks`` kernels (``posenc._kernels.dask_blocks``). This module imports Dask; it
is loaded only when a Dask array reaches one of these ops.
"""

from __future__ import annotations

import dask.array as da
from dask.array.core import normalize_chunks
from dask.array.utils import meta_from_array

from . import _dispatch


def _write(result, out):
    """The result, or ``out`` holding it (Dask's lazy ``out[...] = result``)."""
    if out is None:
        return result
    out[...] = result
    return out


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


def _expand_block(vec, *, q_len, k_len, block_info=None):
    """The ``[..., qb, kb]`` block at rows ``i0:i1``, columns ``j0:j1`` of the expansion.

    Entry ``(i, j)`` reads ``vec[..., i - j + k_len - 1]``; over the block that is the
    slice ``i0 - (j1 - 1) + k_len - 1 .. (i1 - 1) - j0 + k_len - 1`` (inclusive), itself
    expanded as a ``qb x kb`` Toeplitz matrix.
    """
    (i0, i1), (j0, j1) = block_info[None]["array-location"][-2:]
    piece = vec[..., i0 - j1 + k_len : i1 - j0 + k_len - 1]
    return _dispatch.call("toeplitz_expand", piece, i1 - i0, j1 - j0)


def bias_chunks(vec, q_len, k_len):
    """Default blocks of the expanded bias: the leading (head) axes chunked like ``vec``,
    the query and key axes by Dask's ``"auto"`` rule (``array.chunk-size``, 128 MiB)."""
    lead = vec.ndim - 1
    return normalize_chunks((*vec.chunks[:lead], "auto", "auto"), shape=(*vec.shape[:lead], q_len, k_len), dtype=vec.dtype)


def toeplitz_expand_blocks(vec, q_len, k_len, *, out=None):
    """``toeplitz_expand`` on a Dask ``vec``: a blocked ``[..., q_len, k_len]`` array.

    Blocks are ``out``'s chunks when ``out`` is given, else :func:`bias_chunks`. The
    distance axis of ``vec`` (``O(q_len + k_len)``) is one chunk that every block of its
    leading index reads its slice from; no task holds more than one output block.
    """
    lead = vec.ndim - 1
    chunks = out.chunks if out is not None else bias_chunks(vec, q_len, k_len)
    whole = vec.rechunk({**{a: chunks[a] for a in range(lead)}, lead: -1})
    result = da.map_blocks(
        _expand_block,
        whole,
        q_len=q_len,
        k_len=k_len,
        chunks=chunks,
        drop_axis=lead,
        new_axis=[lead, lead + 1],
        dtype=vec.dtype,
        meta=meta_from_array(whole, ndim=lead + 2),
    )
    return _write(result, out)


def empty_blocked(like, shape, chunks):
    """An empty Dask array of ``like``'s dtype with ``chunks`` (a ``chunks=`` request
    turned into an ``out`` buffer); ``ValueError`` naming ``chunks`` when they do not fit."""
    try:
        chunks = normalize_chunks(chunks, shape=shape, dtype=like.dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"chunks {chunks!r} do not describe blocks of an array of shape {tuple(shape)}: {exc}") from None
    return da.empty(shape, chunks=chunks, dtype=like.dtype)
