"""numba.cuda kernels of the rotary ops ``rope_rotate`` and ``rope_apply``: one launch a call.

Same regrouping as the CPU kernels (``_layout.plan``: the rows of ``x`` as ``outer + [G, H,
S]``, positions shared over ``H``). The kernel sees every operand as one flat device array
over the memory it spans plus integer offsets and strides (``_device_flat``), never a view
sliced on the host: the host work of a call is a fixed number of steps whatever the size of
``x`` (numba's host-side indexing of a strided device array walks every element in Python),
and the grid covers every leading axis, so a call is a single launch.

A block's ``z`` threads walk rows (of outer/G/S), its ``x`` threads the pairs of a row and
its ``y`` threads the heads (two for float32 and float64 elements, one for 16-bit ones:
``_block``): a thread computes its pair's float64 angle, ``cos`` and ``sin`` once (one
``sincos``) or reads them, and rotates that pair in every ``blockDim.y``-th head of ``x``
and, for ``rotate_cos_sin_pair``, of a second array (``k`` beside ``q``: one launch for
both), loading four heads before storing any (eight loads in flight a thread rather than
two: a memory-bound kernel needs many bytes in flight to reach the device's bandwidth),
eight heads for 16-bit elements alone or in words of two channels (the same bytes), their
registers capped at three 256-thread blocks an SM (all dtypes: on an H200 the float32
kernel reached 0.91 of the device's copy with the cap, 0.87 without it, at the same 80
registers). ``rope_apply`` of 16-bit words issues its first eight heads' loads before
those of its tables, so the two wait together (an H200, bfloat16 ``[4, 32, 8192, 128]`` in
place: 0.80 -> 0.83 of the device's copy; one thread a pair took it to 0.85).
Neighbouring threads touch neighbouring channels, so loads and stores coalesce along the
last axis, and a row's index arithmetic is done once per thread, not per element. Extra
``x`` threads copy the pass-through channels when ``out`` is not ``x``. Where every operand
allows (``_in_words``), a "half"-layout kernel reads and writes words of adjacent
channels (``WORDS``) and a thread rotates as many pairs by the same arithmetic: two float32
channels a uint64 word, two 16-bit channels a uint32 word. A warp's access of 16-bit
elements in uint32 words moves 128 bytes, not 64 (on an H200, bfloat16 went from 0.38 to
0.65 of the device's copy rate; float32, in uint64 words, did not change). Words of four
16-bit channels (uint64) were built and timed on an H200 too: ``rope`` of bfloat16 in place
0.162 ms against 0.152 in words of two, ``apply_rope`` 0.156 against 0.160, the Hugging
Face q+k pair 0.105 against 0.103 (``[4, 32, 8192, 128]``), so they were taken out.
The angle and its ``cos`` and ``sin`` are float64, as the CPU kernels' contract says.
float32 and float64 elements rotate in float64, rounded once on store. 16-bit elements
(``uint16`` bits, ``_codec``) rotate in float32 with the CPU kernel's arithmetic
(``_rotated16``): ``cos`` and ``sin`` cut into a head whose products with the elements are
exact (in float32's normal range) and a float32 rest, four fused multiply-adds, one
rounding to 16 bits; within one ulp of the float64 result wherever ``a*cos - b*sin``
cancels by fewer than 24 bits. (On an H200 that float32 arithmetic, in place of float64's,
gained about a tenth for bfloat16; the words, about 1.7x.) Elements are widened and
rounded by the device's own conversions, the two results of a pair or of a word at once
(``_codec_cuda``), and read and written at unsigned indices (``_get``, ``_put``), which
spares Numba's negative-index test: together they took the bfloat16 loop from 872 to 417
SASS instructions per 32 elements, float32's from 268 to 150 per 16 (ptxas, sm_90).

Nothing in a call copies between host and device once the constants are on the device: the
frequencies are kept per ``(device, frequencies)`` (``_device_flat.constant``), positions and tables
already on the device are read where they are, and nothing synchronises. Operands are read
from their library's metadata and launched straight to the driver (``_device_flat.launch``). Each ``(op,
dtype, layout)`` is one specialisation (``FAMILY``; the layout "half, words" for the
words), compiled on first use and cached; a
call launches on the caller's current stream (``_arrays.launch_context``): torch's or
CuPy's current stream, which is what a CUDA graph capture records.
"""

from __future__ import annotations

import math
import numba
import numpy as np
from numba import cuda, types
from numba.cuda import libdevice
from numba.cuda.extending import overload

from . import _arrays, _codec, _codec_cuda, _codec_f32, _device_flat, _family, _layout
from .rope import SPECIALISATIONS, guard_apply, guard_rotate


@_family.cached(cuda.jit, device=True)
def _get(a, i):
    """``a[i]``, ``i`` in bounds (the launch's geometry): read at an unsigned index, which
    spares every access Numba's test for a negative index."""
    return a[np.uint64(i)]


@_family.cached(cuda.jit, device=True)
def _put(a, i, v):
    """``a[i] = v``, ``i`` in bounds (see ``_get``)."""
    a[np.uint64(i)] = v


_HIGHEST = np.float32(np.finfo(np.float32).max)
_LOWEST = -_HIGHEST
# Masks keeping a float64's sign, exponent and first 15 (bfloat16) or 12 (float16) mantissa bits.
_HEAD_BFLOAT16 = np.uint64(((1 << 64) - 1) ^ ((1 << 37) - 1))
_HEAD_FLOAT16 = np.uint64(((1 << 64) - 1) ^ ((1 << 40) - 1))

_THREADS = 256
_BLOCKS = 3  # blocks an SM holds at least (80 registers a thread)
_AXES = _device_flat.AXES  # leading axes (outer..., G, S) one launch walks
# An operand's geometry: offset, strides over the _AXES axes, head stride, channel stride, heads.
_OPERAND = _AXES + 4
# A per-position table's: offset, strides over the _AXES axes, pair stride.
_TABLE = _AXES + 2


def _pair(out, oa, ob, a, b, ch, cl, sh, sl, storage):
    """Store the rotation of loaded ``a``, ``b`` at ``oa``, ``ob``: two elements
    (``_pair_elements``), or where ``cos`` and ``sin`` come in pairs, two words of two
    adjacent channels each, by the words' type (``_pair_float32_words`` for uint64,
    ``_pair16_words`` for uint32). Chosen by type when compiled (``_pair_typed``:
    any other type is a typing error); called as it is in the CUDA simulator."""
    if not isinstance(ch, tuple):
        _pair_elements(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    elif isinstance(a, np.uint64):
        _pair_float32_words(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    elif isinstance(a, np.uint32):
        _pair16_words(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    else:
        raise TypeError(f"no rotation of words of {type(a).__name__} (posenc internal error)")


@overload(_pair, target="cuda")
def _pair_typed(out, oa, ob, a, b, ch, cl, sh, sl, storage):
    if not isinstance(ch, types.BaseTuple):
        return lambda out, oa, ob, a, b, ch, cl, sh, sl, storage: _pair_elements(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    if a == types.uint64:
        return lambda out, oa, ob, a, b, ch, cl, sh, sl, storage: _pair_float32_words(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    if a == types.uint32:
        return lambda out, oa, ob, a, b, ch, cl, sh, sl, storage: _pair16_words(out, oa, ob, a, b, ch, cl, sh, sl, storage)
    return None


@_family.cached(cuda.jit, device=True)
def _pair_elements(out, oa, ob, a, b, ch, cl, sh, sl, storage):
    """Store the rotation of stored elements ``a``, ``b`` at ``oa``, ``ob``. float32 and
    float64 elements: in float64 by ``(cos, sin) = (ch, sh)``. 16-bit elements: in float32
    (``_rotated16``), both results rounded together."""
    if storage == _codec.FLOAT:
        wa, wb = np.float64(a), np.float64(b)
        _put(out, oa, wa * ch - wb * sh)
        _put(out, ob, wb * ch + wa * sh)
        return
    ra, rb = _rotated16(_codec_cuda.widen_one(a, storage), _codec_cuda.widen_one(b, storage), ch, cl, sh, sl)
    both = _codec_cuda.narrow_pair(ra, rb, storage)
    _put(out, oa, np.uint16(both & np.uint32(0xFFFF)))
    _put(out, ob, np.uint16(both >> np.uint32(16)))


@_family.cached(cuda.jit, device=True)
def _rotated16(a, b, ch, cl, sh, sl):
    """The float32 rotation of float32 ``a``, ``b`` (16-bit elements, widened) by ``cos = ch
    + cl``, ``sin = sh + sl`` (``_split``): the CPU kernel's four fused multiply-adds
    (``_pairs``), operands clamped to finite values in the rests' terms; the caller rounds
    once to 16 bits."""
    af, bf = _finite(a), _finite(b)
    ra = cuda.fma(a, ch, -(b * sh)) + cuda.fma(af, cl, -(bf * sl))
    rb = cuda.fma(b, ch, a * sh) + cuda.fma(bf, cl, af * sl)
    return ra, rb


@_family.cached(cuda.jit, device=True)
def _pair_float32_words(out, oa, ob, a, b, ch, cl, sh, sl, storage):
    """``_pair_elements`` of the two float32 pairs in uint64 words ``a`` and ``b`` (channel
    ``2i`` in the low half, ``2i + 1`` in the high half), by ``ch[0]``, ``sh[0]`` and
    ``ch[1]``, ``sh[1]``: the same float64 arithmetic and rounding, one load and one store
    of eight bytes for every two elements."""
    a0, a1 = _codec_cuda.float32_pair(a)
    b0, b1 = _codec_cuda.float32_pair(b)
    a0, a1, b0, b1 = np.float64(a0), np.float64(a1), np.float64(b0), np.float64(b1)
    _put(out, oa, _codec_cuda.float32_word(a0 * ch[0] - b0 * sh[0], a1 * ch[1] - b1 * sh[1]))
    _put(out, ob, _codec_cuda.float32_word(b0 * ch[0] + a0 * sh[0], b1 * ch[1] + a1 * sh[1]))


@_family.cached(cuda.jit, device=True)
def _rotated16_words(a, b, c0, c1, l0, l1, s0, s1, m0, m1, storage):
    """``_rotated16`` of the two 16-bit pairs in uint32 words ``a`` and ``b`` (channel ``2i``
    in the low half), each by its own cut ``cos`` (``c``, ``l``) and ``sin`` (``s``, ``m``):
    the two rotated words, each word's two results rounded together."""
    a0, a1 = _codec_cuda.widen_pair(a, storage)
    b0, b1 = _codec_cuda.widen_pair(b, storage)
    ra0, rb0 = _rotated16(a0, b0, c0, l0, s0, m0)
    ra1, rb1 = _rotated16(a1, b1, c1, l1, s1, m1)
    return _codec_cuda.narrow_pair(ra0, ra1, storage), _codec_cuda.narrow_pair(rb0, rb1, storage)


@_family.cached(cuda.jit, device=True)
def _pair16_words(out, oa, ob, a, b, ch, cl, sh, sl, storage):
    """``_rotated16_words`` of uint32 words ``a`` and ``b`` by ``ch`` .. ``sl`` (two each):
    one load and one store of four bytes for every two elements."""
    wa, wb = _rotated16_words(a, b, ch[0], ch[1], cl[0], cl[1], sh[0], sh[1], sl[0], sl[1], storage)
    _put(out, oa, wa)
    _put(out, ob, wb)


@_family.cached(cuda.jit, device=True)
def _finite(v):
    """float32 ``v`` clamped to the finite range (an infinite operand stays out of the rest's term)."""
    v = v if v > _LOWEST else _LOWEST
    return v if v < _HIGHEST else _HIGHEST


@_family.cached(cuda.jit, device=True)
def _split(v, storage):
    """float64 ``v`` as float32 ``(head, rest)``: ``v`` cut to 16 significant bits (13 for
    float16), so that its product with a 16-bit float is exact in float32 (unless it
    leaves float32's normal range), and the rest ``v - head`` rounded once. Cut by a mask,
    not Veltkamp's product, which the compiler may fuse into a multiply-add."""
    if not math.isfinite(v):  # (an infinite table entry: its rest is 0, not inf - inf)
        return np.float32(v), np.float32(0.0)
    mask = _HEAD_BFLOAT16 if storage == _codec.BFLOAT16 else _HEAD_FLOAT16
    head = (np.float64(v).view(np.uint64) & mask).view(np.float64)
    return np.float32(head), np.float32(v - head)


@_family.cached(cuda.jit, device=True)
def _turn(x, at, g, out, to, og, ia, ib, ch, cl, sh, sl, storage, eight, skip):
    """Rotate pair ``(ia, ib)`` of one row by ``cos`` and ``sin`` (``_pair``'s ``ch`` ..
    ``sl``) in this thread's heads (every ``blockDim.y``-th from ``threadIdx.y``), the
    first ``skip`` of them passed over, addresses stepped from head to head. Four heads
    at a time are loaded before any is stored (eight loads in flight a thread, not two);
    eight heads where ``eight`` (16-bit elements, in words of two channels or alone: the
    same bytes in flight as four heads of float32)."""
    first, step = cuda.threadIdx.y, cuda.blockDim.y
    xa, oa = at + first * g[_AXES + 1] + ia * g[_AXES + 2], to + first * og[_AXES + 1] + ia * og[_AXES + 2]
    xd, od = (ib - ia) * g[_AXES + 2], (ib - ia) * og[_AXES + 2]
    xs, os_ = step * g[_AXES + 1], step * og[_AXES + 1]
    head, heads = first + skip * step, g[_AXES + 3]
    xa += skip * xs
    oa += skip * os_
    while eight and head + 7 * step < heads:
        a0, b0 = _get(x, xa), _get(x, xa + xd)
        a1, b1 = _get(x, xa + xs), _get(x, xa + xs + xd)
        a2, b2 = _get(x, xa + 2 * xs), _get(x, xa + 2 * xs + xd)
        a3, b3 = _get(x, xa + 3 * xs), _get(x, xa + 3 * xs + xd)
        a4, b4 = _get(x, xa + 4 * xs), _get(x, xa + 4 * xs + xd)
        a5, b5 = _get(x, xa + 5 * xs), _get(x, xa + 5 * xs + xd)
        a6, b6 = _get(x, xa + 6 * xs), _get(x, xa + 6 * xs + xd)
        a7, b7 = _get(x, xa + 7 * xs), _get(x, xa + 7 * xs + xd)
        _pair(out, oa, oa + od, a0, b0, ch, cl, sh, sl, storage)
        _pair(out, oa + os_, oa + os_ + od, a1, b1, ch, cl, sh, sl, storage)
        _pair(out, oa + 2 * os_, oa + 2 * os_ + od, a2, b2, ch, cl, sh, sl, storage)
        _pair(out, oa + 3 * os_, oa + 3 * os_ + od, a3, b3, ch, cl, sh, sl, storage)
        _pair(out, oa + 4 * os_, oa + 4 * os_ + od, a4, b4, ch, cl, sh, sl, storage)
        _pair(out, oa + 5 * os_, oa + 5 * os_ + od, a5, b5, ch, cl, sh, sl, storage)
        _pair(out, oa + 6 * os_, oa + 6 * os_ + od, a6, b6, ch, cl, sh, sl, storage)
        _pair(out, oa + 7 * os_, oa + 7 * os_ + od, a7, b7, ch, cl, sh, sl, storage)
        xa += 8 * xs
        oa += 8 * os_
        head += 8 * step
    while head + 3 * step < heads:
        a0, b0 = _get(x, xa), _get(x, xa + xd)
        a1, b1 = _get(x, xa + xs), _get(x, xa + xs + xd)
        a2, b2 = _get(x, xa + 2 * xs), _get(x, xa + 2 * xs + xd)
        a3, b3 = _get(x, xa + 3 * xs), _get(x, xa + 3 * xs + xd)
        _pair(out, oa, oa + od, a0, b0, ch, cl, sh, sl, storage)
        _pair(out, oa + os_, oa + os_ + od, a1, b1, ch, cl, sh, sl, storage)
        _pair(out, oa + 2 * os_, oa + 2 * os_ + od, a2, b2, ch, cl, sh, sl, storage)
        _pair(out, oa + 3 * os_, oa + 3 * os_ + od, a3, b3, ch, cl, sh, sl, storage)
        xa += 4 * xs
        oa += 4 * os_
        head += 4 * step
    while head < heads:
        _pair(out, oa, oa + od, _get(x, xa), _get(x, xa + xd), ch, cl, sh, sl, storage)
        xa += xs
        oa += os_
        head += step


@_family.cached(cuda.jit, device=True)
def _first_eight(x, at, g, ia, ib):
    """The words of pair ``(ia, ib)`` in this thread's first eight heads of a row of
    ``x`` (uint32 words of two 16-bit channels): ``(8, (a0, b0, .., a7, b7))``, or ``(0,
    zeros)`` where the row gives this thread fewer heads."""
    first, step = cuda.threadIdx.y, cuda.blockDim.y
    xa = at + first * g[_AXES + 1] + ia * g[_AXES + 2]
    xd, xs = (ib - ia) * g[_AXES + 2], step * g[_AXES + 1]
    if first + 7 * step < g[_AXES + 3]:
        return 8, (
            _get(x, xa), _get(x, xa + xd), _get(x, xa + xs), _get(x, xa + xs + xd),
            _get(x, xa + 2 * xs), _get(x, xa + 2 * xs + xd), _get(x, xa + 3 * xs), _get(x, xa + 3 * xs + xd),
            _get(x, xa + 4 * xs), _get(x, xa + 4 * xs + xd), _get(x, xa + 5 * xs), _get(x, xa + 5 * xs + xd),
            _get(x, xa + 6 * xs), _get(x, xa + 6 * xs + xd), _get(x, xa + 7 * xs), _get(x, xa + 7 * xs + xd),
        )  # fmt: skip
    z = np.uint32(0)
    return 0, (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)


@_family.cached(cuda.jit, device=True)
def _rotate_eight(out, to, og, ia, ib, n, w, ch, cl, sh, sl, storage):
    """Store the rotation of ``_first_eight``'s ``(n, w)`` (nothing where ``n`` is 0) at
    pair ``(ia, ib)`` of this thread's first eight heads of a row of ``out``."""
    if n:
        first, step = cuda.threadIdx.y, cuda.blockDim.y
        oa = to + first * og[_AXES + 1] + ia * og[_AXES + 2]
        od, os_ = (ib - ia) * og[_AXES + 2], step * og[_AXES + 1]
        _pair(out, oa, oa + od, w[0], w[1], ch, cl, sh, sl, storage)
        _pair(out, oa + os_, oa + os_ + od, w[2], w[3], ch, cl, sh, sl, storage)
        _pair(out, oa + 2 * os_, oa + 2 * os_ + od, w[4], w[5], ch, cl, sh, sl, storage)
        _pair(out, oa + 3 * os_, oa + 3 * os_ + od, w[6], w[7], ch, cl, sh, sl, storage)
        _pair(out, oa + 4 * os_, oa + 4 * os_ + od, w[8], w[9], ch, cl, sh, sl, storage)
        _pair(out, oa + 5 * os_, oa + 5 * os_ + od, w[10], w[11], ch, cl, sh, sl, storage)
        _pair(out, oa + 6 * os_, oa + 6 * os_ + od, w[12], w[13], ch, cl, sh, sl, storage)
        _pair(out, oa + 7 * os_, oa + 7 * os_ + od, w[14], w[15], ch, cl, sh, sl, storage)


@_family.cached(cuda.jit, device=True)
def _copy(x, at, g, out, to, og, channel):
    """Copy pass-through ``channel`` of one row in this thread's heads."""
    head, step = cuda.threadIdx.y, cuda.blockDim.y
    xa, oa = at + head * g[_AXES + 1] + channel * g[_AXES + 2], to + head * og[_AXES + 1] + channel * og[_AXES + 2]
    while head < g[_AXES + 3]:  # (a stepped range would cost a 64-bit division a thread)
        _put(out, oa, _get(x, xa))
        xa += step * g[_AXES + 1]
        oa += step * og[_AXES + 1]
        head += step


@_family.cached(cuda.jit, device=True)
def _value(element, storage):
    """The float64 value of a stored table element (``_codec.load``, by the device's conversions)."""
    if storage == _codec.FLOAT:
        return np.float64(element)
    return np.float64(_codec_cuda.widen_one(element, storage))


def _sin_cos(angle):
    """``(sin, cos)`` of float64 ``angle``: on the device one libdevice ``sincos``, which
    reduces the angle once for both; in the CUDA simulator, Python's ``sin`` and ``cos``
    (NaN for an infinite angle, as on the device, where Python's raise).
    On an H200 ``rope`` gave the same bits with it as with libdevice's ``sin`` and ``cos``
    (float32 and bfloat16, 8,192 positions up to 8.2 million, 64 frequencies), and ran
    faster: bfloat16 in place 0.844 -> 0.858 of the device's copy, float32 0.903 -> 0.907."""
    if math.isinf(angle):
        return math.nan, math.nan
    return math.sin(angle), math.cos(angle)


@overload(_sin_cos, target="cuda")
def _sin_cos_typed(angle):
    return lambda angle: libdevice.sincos(angle)


@_family.cached(cuda.jit, device=True)
def _cos_sin(rotate, pair, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage):
    """float64 ``(cos, sin)`` of channel pair ``pair`` of a row: of its angle ``position *
    inv_freq[pair]`` (times ``scale``, the sine's sign ``sign``) where ``rotate``, else read
    from the row's tables."""
    if rotate:
        s, c = _sin_cos(position * _get(inv_freq, pair))
        return c * scale, sign * s * scale
    return _value(_get(cos, ci + pair * cg[_AXES + 1]), storage), _value(_get(sin, si + pair * sg[_AXES + 1]), storage)


def _kernel_source(rotate, storage, interleaved, channels, helpers):
    """One specialisation: a closure over constants (see ``rope_cpu._kernel_source``).
    ``channels`` 2: ``x`` and ``out`` (and ``x2``, ``out2``) are read and written as words
    of two adjacent channels (``WORDS``), in "half" layout, their geometry and ``columns``
    and ``half`` counted in words; a thread rotates two pairs. 1: elements. ``rope_apply``
    of 16-bit words loads its first eight heads (``_first_eight``) before the tables, whose
    loads, conversions and cuts then wait behind them rather than in front."""
    floats = storage == _codec.FLOAT  # (closures' constants: Numba prunes the branches they decide)
    words, eight = channels > 1, not floats
    early = words and not (floats or rotate)

    def kernel(sizes, columns, half, x, xg, out, og, x2, xg2, out2, og2, positions, counts, pg, inv_freq, sign, scale, cos, cg, sin, sg):
        helpers  # noqa: B018  (in the closure: Numba's cache key follows _codec)
        # The row's index along each leading axis, S first, in 32-bit arithmetic (the launcher
        # keeps rows below 2**31); an axis of one element is passed over.
        rest = np.uint32(cuda.blockIdx.x * cuda.blockDim.z + cuda.threadIdx.z)
        xi, oi, xi2, oi2, pi, ci, si = xg[0], og[0], xg2[0], og2[0], pg[0], cg[0], sg[0]
        for k in range(_AXES - 1, -1, -1):
            n = np.uint32(sizes[k])
            if n == 1:
                continue
            i = np.int64(rest % n)
            rest = rest // n
            xi += i * xg[k + 1]
            oi += i * og[k + 1]
            xi2 += i * xg2[k + 1]
            oi2 += i * og2[k + 1]
            pi += i * pg[k + 1]
            ci += i * cg[k + 1]
            si += i * sg[k + 1]
        if rest:  # past the last row
            return
        j = np.int64(cuda.threadIdx.x) - cuda.blockDim.x
        while j + cuda.blockDim.x < columns:  # (see _copy)
            j += cuda.blockDim.x
            if j >= half:  # a pass-through channel (word)
                _copy(x, xi, xg, out, oi, og, j + half)
                _copy(x2, xi2, xg2, out2, oi2, og2, j + half)
                continue
            position = 0.0
            if rotate:
                # int64 positions are read as they are (``counts``), others converted to float64
                # (``positions``): whichever is not empty.
                position = np.float64(_get(counts, pi)) if counts.shape[0] else _get(positions, pi)
            skip = 0
            if words:
                ia, ib = j, j + half
                if early:
                    skip, first = _first_eight(x, xi, xg, ia, ib)
                c0, s0 = _cos_sin(rotate, 2 * j, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)
                c1, s1 = _cos_sin(rotate, 2 * j + 1, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)
                if floats:
                    ch, cl, sh, sl = (c0, c1), (0.0, 0.0), (s0, s1), (0.0, 0.0)
                else:
                    ch0, cl0 = _split(c0, storage)
                    ch1, cl1 = _split(c1, storage)
                    sh0, sl0 = _split(s0, storage)
                    sh1, sl1 = _split(s1, storage)
                    ch, cl, sh, sl = (ch0, ch1), (cl0, cl1), (sh0, sh1), (sl0, sl1)
                if early:
                    _rotate_eight(out, oi, og, ia, ib, skip, first, ch, cl, sh, sl, storage)
            else:
                c, sn = _cos_sin(rotate, j, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)
                if floats:
                    ch, cl, sh, sl = c, 0.0, sn, 0.0
                else:
                    ch, cl = _split(c, storage)
                    sh, sl = _split(sn, storage)
                ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
            _turn(x, xi, xg, out, oi, og, ia, ib, ch, cl, sh, sl, storage, eight, skip)
            _turn(x2, xi2, xg2, out2, oi2, og2, ia, ib, ch, cl, sh, sl, storage, eight, 0)

    return kernel


WORDS_LAYOUT = "half, words"  # words of two adjacent channels
# The words the "half"-layout kernels move where ``x`` and ``out`` allow (``_in_words``),
# widest first: (layout, word).
WORDS = {
    "float32": [(WORDS_LAYOUT, np.dtype(np.uint64))],
    "float16": [(WORDS_LAYOUT, np.dtype(np.uint32))],
    "bfloat16": [(WORDS_LAYOUT, np.dtype(np.uint32))],
}


def _word(dtype, layout):
    """The word ``dtype``'s kernel of ``layout`` reads and writes, or ``None`` (elements)."""
    return next((word for name, word in WORDS.get(dtype, ()) if name == layout), None)


def _channels(dtype, word):
    """Channels of ``dtype`` in a ``word`` (1 without one)."""
    return 1 if word is None else word.itemsize // np.dtype(_arrays.ELEMENT[dtype]).itemsize


def _signature(dtype, word):
    """The numba signature of every kernel of ``dtype`` (the kernel's arguments, in order),
    ``x`` and ``out`` read as ``word``s (or elements: ``None``)."""
    t = numba.from_dtype(np.dtype(_arrays.ELEMENT[dtype]))
    f64, i64 = types.float64, types.int64
    flat, operand, table = types.Array(t, 1, "C"), types.UniTuple(i64, _OPERAND), types.UniTuple(i64, _TABLE)
    rotated = types.Array(numba.from_dtype(word), 1, "C") if word is not None else flat
    return types.void(
        types.UniTuple(i64, _AXES),
        i64,
        i64,
        *(rotated, operand) * 4,
        types.Array(f64, 1, "C"),
        types.Array(i64, 1, "C"),
        table,
        types.Array(f64, 1, "C"),
        f64,
        f64,
        flat,
        table,
        flat,
        table,
    )


def _build(op, dtype, layout):
    storage, word = _arrays.STORAGE[dtype], _word(dtype, layout)
    source = _kernel_source(op == "rotate", storage, layout == "interleaved", _channels(dtype, word), _family.source_digest(_codec, _codec_f32, _codec_cuda))
    # Registers capped so that three blocks fit on an SM: 16-bit kernels hold eight heads'
    # loads (84 registers uncapped); float32 ones take 80 either way, yet ptxas told of three
    # blocks schedules them faster (an H200, [4, 32, 8192, 128] in place: 0.87 -> 0.91 of
    # the device's copy). The simulator takes no launch bounds.
    bounds = {} if _arrays.cuda_simulator() else {"launch_bounds": (_THREADS, _BLOCKS)}
    return _family.jitted(cuda.jit, source, _signature(dtype, word), **bounds)


FAMILY = _family.Family(
    "rope_cuda",
    _build,
    SPECIALISATIONS + [(op, dtype, layout) for op in ("rotate", "apply") for dtype, words in WORDS.items() for layout, _ in words],
    lambda key: {key[1]},
)

# ---------------------------------------------------------------- launch


class _Operand:
    """An array the kernel rotates (``x``) and where the result goes (``out``): flat kernel
    arguments, their element strides, and whether ``out`` is ``x`` itself."""

    def __init__(self, x, out):
        self.x, xs = x, _device_flat.span(x)
        self.result = _arrays.empty(x) if out is None else out
        os_ = xs if out is x else _device_flat.span(self.result)
        # A new result shares nothing with x; a caller's buffer may be x's memory, or part of it.
        given = out is not None and out is not x
        self.in_place = out is x or (given and _device_flat.extent(os_) == _device_flat.extent(xs) and os_.strides == xs.strides)
        self.temporary = None
        if given and not self.in_place and _device_flat.overlap(os_, xs):  # overlapping but not the same elements
            if _arrays.library(out) == "numba" and not out.is_c_contiguous():  # (numba copies only into contiguous memory)
                raise ValueError("out overlaps x and is a non-contiguous numba device array: the result cannot be copied into it (kernel launcher check)")
            self.temporary = _arrays.empty(x)
            os_ = _device_flat.span(self.temporary)
        self.x_flat, self.x_strides = _device_flat.flat(xs)
        self.o_flat, self.o_strides = (self.x_flat, self.x_strides) if self.in_place else _device_flat.flat(os_)
        self.addresses = (xs.ptr, os_.ptr)

    def lead(self):
        """Strides of ``x`` and ``out`` over the leading axes (the plan's arrays 0 and 1)."""
        return self.x_strides[:-1], self.o_strides[:-1]

    def finish(self):
        if self.temporary is not None:
            _arrays.copy_into(self.result, self.temporary)
        return self.result


def _tables(a, lead, step=None):
    """Per-position ``Span`` ``a`` broadcast to ``lead`` axes (plus its pairs axis when
    ``step`` is given, reading every ``step``-th channel): ``(flat, lead strides, pair stride)``."""
    flat, steps = _device_flat.flat(a)
    trailing = 1 if step is not None else 0
    own = tuple(a.shape)[: len(a.shape) - trailing]
    return flat, _device_flat.broadcast_strides(own, steps[: len(own)], lead), (steps[-1] * step if step is not None else 0)


def _block(columns, heads, split):
    """Threads of a block: ``x`` over a row's columns, ``y`` over its heads, ``z`` over rows.
    A row of 32 columns or fewer takes the power of two at or above its count (4 at least, so
    that ``z`` stays within the device's 64), so a warp's threads all have a column (a head
    dim of 64 in words, or a partial rotary dim: 16 columns or fewer); longer rows take
    whole warps. Where ``split`` (float32 and float64 elements), two ``y`` threads share a
    pair's heads; otherwise (16-bit elements) one thread rotates them all, so a pair's angle
    or tables are worked once a row, not twice (on an H200, ``[4, 32, 8192, 128]`` bfloat16
    ``rope`` in place: 0.873 of the device's copy against 0.858; float32's 0.907 went to
    0.895 with one thread)."""
    bx = min(32 * -(-columns // 32), _THREADS) if columns > 32 else max(4, 1 << (columns - 1).bit_length())
    by = 2 if split and heads > 1 and 2 * bx <= _THREADS else 1
    return bx, by, _THREADS // (bx * by)


def _in_words(layout, x, walks, half):
    """The widest of ``WORDS`` (``(layout, word)``) as which the launch over ``walks`` may read
    and write ``x`` and ``out``, or ``None``: "half" layout, pairs and channels a multiple of
    the word's channels, and for every operand channels one element apart, other strides
    multiples of the word's channels and addresses multiples of its size."""
    name = _arrays.dtype_name(x.dtype)
    if layout != "half":
        return None
    for chosen in WORDS.get(name, ()):
        n, size = _channels(name, chosen[1]), chosen[1].itemsize
        if half % n or tuple(x.shape)[-1] % n:
            continue
        if all([_words_fit(operand, xs, os_, n, size) for operand, xs, os_, _ in walks]):
            return chosen
    return None


def _words_fit(operand, xs, os_, channels, size):
    """Whether ``operand``'s ``x`` and ``out`` (leading strides ``xs``, ``os_``) hold whole
    words of ``channels`` elements and ``size`` bytes along their rows."""
    if operand.x_strides[-1] != 1 or operand.o_strides[-1] != 1 or any([st % channels for st in (*xs, *os_)]):
        return False
    return not any([address % size for address in operand.addresses])


def _in_word_units(geometry, channels):
    """An operand's geometry (``_device_flat.operand``) counted in words of ``channels`` elements."""
    return (*[v // channels for v in geometry[: _AXES + 2]], 1, geometry[-1])


def _launches(op, layout, x, operands, tables, arguments, half):
    """``(kernel, grid, block, arguments)`` of each launch of ``op``'s kernel over ``operands``
    (one ``_Operand``, or q and k sharing the tables), reading ``tables`` (positions, or cos
    and sin: ``(flat, lead strides, pair stride)``); ``arguments(views)`` completes the
    kernel's arguments. One launch but for eight or more leading axes that do not merge.
    Where ``_in_words`` allows, the kernel moves words of two channels (``WORDS``)."""
    shape = tuple(x.shape)  # (the CUDA simulator's shapes take no negative index)
    lead = shape[:-1]
    first = operands[0]
    found = _layout.plan(lead, (*first.lead(), *[t[1] for t in tables]), tuple(range(2, 2 + len(tables))))
    walks = [(first, found.strides(0), found.strides(1), found.h.size)]
    if len(operands) == 2:
        second = operands[1]
        if tuple(second.x.shape)[-1:] != shape[-1:]:
            raise _device_flat.NotAligned("k's channels differ from q's")
        walks.append((second, *_device_flat.follow(found, lead, second)))
    else:
        walks.append((first, found.strides(0), found.strides(1), 0))  # no second operand: no heads
    columns = half + (0 if all([o.in_place for o in operands]) else shape[-1] - 2 * half)
    if 0 in found.shape() or not columns:
        return []
    chosen = _in_words(layout, x, walks, half)
    name = _arrays.dtype_name(x.dtype)
    kernel = FAMILY[op, name, chosen[0] if chosen else layout]
    flats = [(operand.x_flat, operand.o_flat) for operand, *_ in walks]
    channels = _channels(name, chosen[1] if chosen else None)
    if chosen:
        columns, half = columns // channels, half // channels
        flats = [(_device_flat.words(xf, chosen[1]), _device_flat.words(of, chosen[1])) for xf, of in flats]
    table_strides = [found.strides(2 + k) for k in range(len(tables))]
    block = _block(columns, max(found.h.size, walks[1][3]), _arrays.STORAGE[name] == _codec.FLOAT)
    found_launches = []
    for sizes, index in _device_flat.launches(found):
        rows = int(np.prod(sizes))
        if rows >= 2**31:
            raise ValueError(f"x has {rows} rows of positions: the CUDA kernel takes fewer than 2**31 a launch")
        ops = []
        for (operand, xs, os_, heads), (x_flat, o_flat) in zip(walks, flats):
            x_geometry = _device_flat.operand(xs, index, operand.x_strides[-1], heads)
            o_geometry = _device_flat.operand(os_, index, operand.o_strides[-1], heads)
            if chosen:
                x_geometry, o_geometry = _in_word_units(x_geometry, channels), _in_word_units(o_geometry, channels)
            ops += [x_flat, x_geometry, o_flat, o_geometry]
        views = [(t[0], _device_flat.table(st, index, t[2])) for t, st in zip(tables, table_strides)]
        found_launches.append((kernel, -(-rows // block[2]), block, (sizes, columns, half, *ops, *arguments(views))))
    return found_launches


def _run(launches, device, stream):
    for kernel, grid, block, arguments in launches:
        _device_flat.launch(kernel, device, grid, block, stream, *arguments)


def _context(x):
    stream, on_device = _arrays.launch_context(x)
    return stream, on_device, _arrays.device_index(x)


def kernel_positions(positions):
    """The positions array the rotation kernel reads: int64 positions (torch.arange,
    position_ids) as they are, others as float64 (converted on the device)."""
    if _arrays.dtype_name(positions.dtype) == "int64":
        return positions
    return _device_flat.device_values(positions, np.float64)


def rotation(x, positions, inv_freq, *, layout, inverse, scale, out, device, stream):
    """``(operand, launches, positions argument)`` of ``rotate_positions`` (checked, on
    ``device``'s context): what it launches, not yet launched."""
    operand = _Operand(x, out)
    held = kernel_positions(positions)
    counting = _arrays.dtype_name(held.dtype) == "int64"
    positions_table = _tables(_device_flat.span(held, bits16=False), tuple(x.shape)[:-1])
    freqs = _device_flat.constant(device, inv_freq, stream)
    none = _device_flat.empty(device, _arrays.ELEMENT[_arrays.dtype_name(x.dtype)], stream)
    blank = _device_flat.BLANK_TABLE
    no_floats, no_counts = _device_flat.empty(device, np.float64, stream), _device_flat.empty(device, np.int64, stream)

    def arguments(views):
        ((p, pg),) = views
        p, c = (no_floats, p) if counting else (p, no_counts)
        return (p, c, pg, freqs, -1.0 if inverse else 1.0, float(scale), none, blank, none, blank)

    return operand, _launches("rotate", layout, x, [operand], [positions_table], arguments, inv_freq.shape[0]), positions_table[0]


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """numba.cuda ``rope_rotate`` (reference: ``posenc.rotary._rotate.rotate_positions``)."""
    inv_freq = guard_rotate(x, positions, inv_freq, out)
    _arrays.guard_gpu_operands(x, out, positions=positions)
    _device_flat.separate(out, positions=positions)
    stream, on_device, device = _context(x)
    with on_device:
        operand, launches, _ = rotation(x, positions, inv_freq, layout=layout, inverse=inverse, scale=scale, out=out, device=device, stream=stream)
        _run(launches, device, stream)
        return operand.finish()


def _cos_sin_tables(x, cos, sin, layout):
    half = tuple(cos.shape)[-1] // 2
    # Each angle appears twice in the layout's order; the kernel reads it once per pair:
    # the first half of the channels ("half") or every other channel ("interleaved").
    step = 2 if layout == "interleaved" else 1
    lead = tuple(x.shape)[:-1]
    return half, [_tables(_device_flat.span(t), lead, step) for t in (cos, sin)]


def _apply_arguments(device, stream):
    positions, counts, blank = _device_flat.empty(device, np.float64, stream), _device_flat.empty(device, np.int64, stream), _device_flat.BLANK_TABLE

    def arguments(views):
        (c, cg), (s, sg) = views
        return (positions, counts, blank, positions, 1.0, 1.0, c, cg, s, sg)

    return arguments


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """numba.cuda ``rope_apply`` (reference: ``posenc.rotary._rotate.rotate_cos_sin``)."""
    guard_apply(x, cos, sin, out)
    _arrays.guard_gpu_operands(x, out, cos=cos, sin=sin)
    _device_flat.separate(out, cos=cos, sin=sin)
    stream, on_device, device = _context(x)
    with on_device:
        operand, launches = apply_rotation(x, cos, sin, layout=layout, out=out, device=device, stream=stream)
        _run(launches, device, stream)
        return operand.finish()


def apply_rotation(x, cos, sin, *, layout, out, device, stream):
    """``(operand, launches)`` of ``rotate_cos_sin`` on checked arguments, on ``device``'s
    context: what it launches, not yet launched."""
    operand = _Operand(x, out)
    half, tables = _cos_sin_tables(x, cos, sin, layout)
    return operand, _launches("apply", layout, x, [operand], tables, _apply_arguments(device, stream), half)


def rotate_cos_sin_pair(q, k, cos, sin, *, layout="half", out_q=None, out_k=None):
    """``rope_apply`` of ``q`` and of ``k`` with the same ``cos``/``sin``, in one launch where
    their rows line up (Hugging Face's ``apply_rotary_pos_emb``: ``q [b, hq, s, d]`` and
    ``k [b, hk, s, d]``, transposed views of ``[b, s, h, d]`` included), else one each.

    ``q`` and ``k`` are GPU arrays of one library, dtype and device that ``rope_apply``'s
    CUDA kernel accepts with these ``cos``/``sin`` (the caller checked); ``out_q``/``out_k``:
    ``None`` (new arrays), the array itself (in place) or a buffer. Returns ``(q', k')``.
    """
    guard_apply(q, cos, sin, out_q)
    guard_apply(k, cos, sin, out_k)
    _arrays.guard_gpu_operands(q, out_q, k=k, cos=cos, sin=sin, out_k=out_k)
    _device_flat.separate(out_q, "out_q", k=k, cos=cos, sin=sin)
    _device_flat.separate(out_k, "out_k", q=q, cos=cos, sin=sin, out_q=out_q)
    stream, on_device, device = _context(q)
    with on_device:
        operands, launches = pair_rotation(q, k, cos, sin, layout=layout, out_q=out_q, out_k=out_k, device=device, stream=stream)
        _run(launches, device, stream)
        return tuple(operand.finish() for operand in operands)


def pair_rotation(q, k, cos, sin, *, layout, out_q, out_k, device, stream):
    """``(operands, launches)`` of ``rotate_cos_sin_pair`` on checked arguments, on
    ``device``'s context: what it launches, not yet launched."""
    operands = [_Operand(q, out_q), _Operand(k, out_k)]
    half, tables = _cos_sin_tables(q, cos, sin, layout)
    try:
        return operands, _launches("apply", layout, q, operands, tables, _apply_arguments(device, stream), half)
    except _device_flat.NotAligned:  # rows of k that do not line up with q's: one launch each
        launches = []
        for x, operand in zip((q, k), operands):
            _, own = _cos_sin_tables(x, cos, sin, layout)
            launches += _launches("apply", layout, x, [operand], own, _apply_arguments(device, stream), half)
        return operands, launches
