"""Where the rotation's device time goes: its kernel's memory pattern without the arithmetic,
with the arithmetic but no angles, and the product itself, each beside the device's copy.

Usage (``tests/gpu/lease.sh probe``): ``PYTHONPATH=src python tests/gpu/probe_bounds.py``
(torch with CUDA, numba-cuda). On ``[4, 32, 8192, 128]`` in place, device time per call
(``_bench_gpu.device_timings``) over ``Tensor.copy_``'s of the same bytes:

* a plain Numba copy, one word a thread: what Numba's code of a copy reaches;
* probe kernels walking the rows as ``rope_cuda``'s kernel does (a block's ``x`` threads over
  the words of a row's first half, each with its partner ``half`` words on; ``y`` threads
  over the heads, two; ``z`` over positions; 256 threads; a thread loads ``unroll`` heads'
  pairs before storing any), in two modes: ``copy`` stores the loaded words back, XORed
  with 0 (the memory pattern alone), ``rotate`` rotates them by the product's per-pair arithmetic
  (``rope_cuda._pair``) with a ``cos``/``sin`` fixed for the call (no positions read, no
  angles computed);
* float32 in uint64 words (the product's), 4 and 8 heads loaded at once; bfloat16 in uint32
  words (the product's) and in uint64 words of four channels (copy only: the product's
  words of four were timed on an H200 and taken out, ``rope_cuda``); both in 16-byte words
  (copy only, ``probe_kernel16``: the vector loads and stores a plain CUDA copy makes), and
  a Numba flat copy of 16 bytes a thread;
* ``pe.rope`` of the same array in place, and its kernel compiled with launch bounds of 4
  and 5 blocks an SM (``product_kernel``; as built, the float32 kernel takes 80 registers a
  thread and the 16-bit ones are capped there: 3 blocks of 256 threads an SM; ptxas for
  sm_90 spills a few bytes at 4, in the prologue of a row, not in the loop over heads).

If ``copy`` is near 1 and ``rotate`` well below, the arithmetic bounds the kernel (and
``rotate32`` near ``copy`` names the conversions); if ``copy`` is already low, the memory
pattern does (then compare 4 against 8 heads, and 4-, 8- and 16-byte words); ``pe.rope``
below ``rotate``: the angles and the positions' loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic, overload

from posenc._kernels import _codec, _codec_cuda, rope_cuda

if str(Path(__file__).parent) not in sys.path:  # (the sibling script, when loaded from its file)
    sys.path.insert(0, str(Path(__file__).parent))
from compile_ptx import family_build  # noqa: E402

THREADS = 256
SIXTEEN = "16 bytes"  # a word of ``probe_kernel16``: two uint64 moved by one load or store


@cuda.jit(device=True)
def _walk(batch, heads, seq, half):
    """This thread's start in a probe's walk of ``[batch, heads, seq, 2 * half]`` words (see
    ``block``): ``(its first word, its first head, the words from one of its heads to the
    next)``, the first word -1 where the thread has no word (past a half or the last row)."""
    j = cuda.threadIdx.x
    row = cuda.blockIdx.x * cuda.blockDim.z + cuda.threadIdx.z
    if j >= half or row >= batch * seq:
        return -1, 0, 0
    head = cuda.threadIdx.y
    return ((row // seq * heads + head) * seq + row % seq) * 2 * half + j, head, cuda.blockDim.y * seq * 2 * half


def probe_kernel(storage, word, mode, unroll):
    """The probe kernel ``(x, batch, heads, seq, half, c, s, flip)`` of flat ``word`` array
    ``x`` (``[batch, heads, seq, 2 * half]`` words), in place (``launch``). ``mode``:
    ``"copy"`` (each word XORed with ``flip``: a store the compiler cannot drop, as it drops
    a word stored back unchanged), ``"rotate"`` (the product's arithmetic, the product's
    bits: words of two channels, uint64 of float32 and uint32 of 16-bit ``storage``), or
    ``"rotate32"`` (uint64
    words of float32 rotated in float32, two fused multiply-adds an element: no float64
    conversions; not the product's bits)."""
    floats, held, cast = storage == _codec.FLOAT, numba.from_dtype(np.dtype(word)), np.dtype(word).type
    rotate, rotate32 = mode == "rotate", mode == "rotate32"

    def kernel(x, batch, heads, seq, half, c, s, flip):
        at, head, stride = _walk(batch, heads, seq, half)
        if at < 0:
            return
        if floats:
            ch, cl, sh, sl = (c, c), (0.0, 0.0), (s, s), (0.0, 0.0)
        else:
            h, lo = rope_cuda._split(c, storage)
            hs, ls = rope_cuda._split(s, storage)
            ch, cl, sh, sl = (h, h), (lo, lo), (hs, hs), (ls, ls)
        step = cuda.blockDim.y
        a = cuda.local.array(unroll, held)
        o = cuda.local.array(unroll, held)
        while head + (unroll - 1) * step < heads:
            for u in range(unroll):
                a[u] = rope_cuda._get(x, at + u * stride)
                o[u] = rope_cuda._get(x, at + u * stride + half)
            for u in range(unroll):
                if rotate:
                    rope_cuda._pair(x, at + u * stride, at + u * stride + half, a[u], o[u], ch, cl, sh, sl, storage)
                elif rotate32:
                    _rotate32(x, at + u * stride, at + u * stride + half, a[u], o[u], np.float32(c), np.float32(s))
                else:
                    rope_cuda._put(x, at + u * stride, a[u] ^ cast(flip))
                    rope_cuda._put(x, at + u * stride + half, o[u] ^ cast(flip))
            at += unroll * stride
            head += unroll * step

    return cuda.jit(kernel)


@cuda.jit(device=True)
def _rotate32(x, ia, ib, a, b, c, s):
    """Store the float32 rotation by float32 ``c``, ``s`` of the two pairs in uint64 words ``a``, ``b``."""
    a0, a1 = _codec_cuda.float32_pair(a)
    b0, b1 = _codec_cuda.float32_pair(b)
    rope_cuda._put(x, ia, _codec_cuda.float32_word(cuda.fma(a0, c, -(b0 * s)), cuda.fma(a1, c, -(b1 * s))))
    rope_cuda._put(x, ib, _codec_cuda.float32_word(cuda.fma(b0, c, a0 * s), cuda.fma(b1, c, a1 * s)))


def probe_kernel16(unroll):
    """``probe_kernel``'s ``copy`` mode moving 16 bytes a load and a store (``load16``): ``x``
    a uint64 array, ``half`` counted in 16-byte words."""

    def kernel(x, batch, heads, seq, half, c, s, flip):
        at, head, stride = _walk(batch, heads, seq, half)
        if at < 0:
            return
        step = cuda.blockDim.y
        a0, a1 = cuda.local.array(unroll, numba.uint64), cuda.local.array(unroll, numba.uint64)
        o0, o1 = cuda.local.array(unroll, numba.uint64), cuda.local.array(unroll, numba.uint64)
        while head + (unroll - 1) * step < heads:
            for u in range(unroll):
                a0[u], a1[u] = load16(x, at + u * stride)
                o0[u], o1[u] = load16(x, at + u * stride + half)
            for u in range(unroll):
                store16(x, at + u * stride, a0[u] ^ flip, a1[u] ^ flip)
                store16(x, at + u * stride + half, o0[u] ^ flip, o1[u] ^ flip)
            at += unroll * stride
            head += unroll * step

    return cuda.jit(kernel)


def load16(x, i):
    """``(x[2 i], x[2 i + 1])`` of uint64 array ``x``: on the device one 16-byte load."""
    return x[2 * i], x[2 * i + 1]


def store16(x, i, low, high):
    """``x[2 i], x[2 i + 1] = low, high``: on the device one 16-byte store."""
    x[2 * i], x[2 * i + 1] = low, high


_PAIR = ir.VectorType(ir.IntType(64), 2)


def _pair_pointer(context, builder, signature, args):
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    at = builder.gep(data, [builder.shl(args[1], ir.Constant(ir.IntType(64), 1))])
    return builder.bitcast(at, _PAIR.as_pointer())


@intrinsic
def _load16(typingctx, x, i):
    result = types.UniTuple(types.uint64, 2)

    def codegen(context, builder, signature, args):
        v = builder.load(_pair_pointer(context, builder, signature, args), align=16)
        return context.make_tuple(builder, result, [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(2)])

    return result(x, types.int64), codegen


@intrinsic
def _store16(typingctx, x, i, low, high):
    def codegen(context, builder, signature, args):
        v = ir.Constant(_PAIR, ir.Undefined)
        for k, value in enumerate(args[2:]):
            v = builder.insert_element(v, value, ir.Constant(ir.IntType(32), k))
        builder.store(v, _pair_pointer(context, builder, signature, args), align=16)

    return types.void(x, types.int64, types.uint64, types.uint64), codegen


@overload(load16, target="cuda")
def _load16_typed(x, i):
    return lambda x, i: _load16(x, i)


@overload(store16, target="cuda")
def _store16_typed(x, i, low, high):
    return lambda x, i, low, high: _store16(x, i, low, high)


def product_kernel(op, dtype, layout, blocks=None):
    """``rope_cuda``'s kernel of ``(op, dtype, layout)`` as its family builds it, compiled here
    (not cached on disk) with launch bounds of ``rope_cuda._THREADS`` threads and ``blocks``
    blocks an SM (registers capped at 65536 / (256 * blocks)); ``None``: the family's own."""
    fn, signature, options = family_build(rope_cuda, (op, dtype, layout))
    bounds = options.get("launch_bounds") if blocks is None else (rope_cuda._THREADS, blocks)
    return cuda.jit(signature, **({"launch_bounds": bounds} if bounds else {}))(fn)


def product_rotation(x, positions, inv_freq, kernel, layout):
    """A callable rotating ``x`` in place as ``rope_cuda.rotate_positions`` does ("half"
    layout, in the words of ``layout``), each launch made with ``kernel`` (``product_kernel``
    of that layout) in place of the family's."""
    from posenc._kernels import _arrays, _device_flat

    stream, on_device, device = rope_cuda._context(x)
    with on_device:
        _, launches, _ = rope_cuda.rotation(x, positions, inv_freq, layout="half", inverse=False, scale=1.0, out=x, device=device, stream=stream)
    family = rope_cuda.FAMILY["rotate", _arrays.dtype_name(x.dtype), layout]
    if any([launched is not family for launched, *_ in launches]):
        raise ValueError(f"x is not rotated in the words of {layout!r}")

    def run():
        with on_device:
            for _, grid, block, arguments in launches:
                _device_flat.launch(kernel, device, grid, block, stream, *arguments)

    return run


@cuda.jit
def flat_copy(x, y):
    """``y[i] = x[i]``, one word a thread."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i]


@cuda.jit
def flat_copy16(x, y):
    """``flat_copy`` of uint64 arrays of an even size, 16 bytes a thread (``load16``)."""
    i = cuda.grid(1)
    if i < x.shape[0] // 2:
        low, high = load16(x, i)
        store16(y, i, low, high)


def block(half):
    """Threads of a block, as ``rope_cuda._block`` shapes them for ``half`` words (2 to 32,
    a power of two, so that ``z`` stays within the device's 64): ``x`` over the words, two
    over the heads, the rest over positions."""
    if not 2 <= half <= 32 or half & (half - 1):
        raise ValueError(f"the probe takes 2 to 32 words a half, a power of two, not {half}")
    return half, 2, THREADS // (2 * half)


def launch(kernel, x, shape, stream=0, flip=0):
    """Run ``kernel`` (``probe_kernel``) on flat words ``x`` of ``shape = (batch, heads, seq,
    half)``: the rotation by ``cos, sin = 0.6, 0.8``, or words XORed with ``flip``; ``heads``
    a multiple of twice the kernel's ``unroll``."""
    batch, heads, seq, half = shape
    threads = block(half)
    kernel[-(-batch * seq // threads[2]), threads, stream](x, batch, heads, seq, half, 0.6, 0.8, x.dtype.type(flip))


def main():
    import torch

    from posenc import _bench_gpu

    timer = _bench_gpu.device_timings(torch)
    print(torch.cuda.get_device_name(), torch.__version__)
    for dtype, storage, cases in (
        (torch.float32, _codec.FLOAT, [(np.uint64, "copy", 4), (np.uint64, "rotate", 4), (np.uint64, "rotate32", 4), (np.uint64, "copy", 8), (np.uint64, "rotate", 8), (SIXTEEN, "copy", 4)]),
        (torch.bfloat16, _codec.BFLOAT16, [(np.uint32, "copy", 8), (np.uint32, "rotate", 8), (np.uint64, "copy", 8), (SIXTEEN, "copy", 4)]),
    ):
        _rows(torch, lambda fn: timer(fn, 5, 10)[0] * 1e3, dtype, storage, cases)
        torch.cuda.empty_cache()


def _rows(torch, gpu_ms, dtype, storage, cases):
    """The rows of one dtype: ``cases`` are ``(word, mode, unroll)`` of ``probe_kernel``."""
    import posenc as pe

    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)

    def words(t, word):
        """``t``'s memory as a flat numba array of unsigned ``word``."""
        signed = {8: torch.int64, 4: torch.int32}[np.dtype(word).itemsize]
        return cuda.as_cuda_array(t.view(signed).reshape(-1)).view(np.dtype(word))

    batch, heads, seq, dim = 4, 32, 8192, 128
    x = torch.randn(batch, heads, seq, dim, device="cuda").to(dtype)
    y = torch.empty_like(x)
    copy = gpu_ms(lambda: y.copy_(x))
    flat_x, flat_y = words(x, np.uint64), words(y, np.uint64)
    n = flat_x.shape[0]
    plain = gpu_ms(lambda: flat_copy[-(-n // 256), 256, stream](flat_x, flat_y))
    wide = gpu_ms(lambda: flat_copy16[-(-n // 512), 256, stream](flat_x, flat_y))
    print(f"{dtype}: copy_ {copy:.3f} ms | Numba flat copy of uint64 words {plain:.3f} ({copy / plain:.2f}), of 16 bytes {wide:.3f} ({copy / wide:.2f})")
    for word, mode, unroll in cases:
        size = 16 if word == SIXTEEN else np.dtype(word).itemsize
        shape = (batch, heads, seq, dim // 2 // (size // x.element_size()))
        if word == SIXTEEN:
            kernel, flat = probe_kernel16(unroll), words(x, np.uint64)
        else:
            kernel, flat = probe_kernel(storage, word, mode, unroll), words(x, word)
        ms = gpu_ms(lambda: launch(kernel, flat, shape, stream))
        print(f"{dtype}: probe {mode} {size}-byte words, {unroll} heads loaded at once {ms:.3f} ms ({copy / ms:.2f})")
    pos = torch.arange(seq, device="cuda")
    ms = gpu_ms(lambda: pe.rope(x, pos, out=x))
    print(f"{dtype}: pe.rope in place {ms:.3f} ms ({copy / ms:.2f})")
    name, (inv_freq, _) = str(dtype).removeprefix("torch."), pe.rope_frequencies(dim)
    for blocks in (None, 4, 5) if dtype == torch.float32 else (None, 4):
        layout = rope_cuda.WORDS[name][0][0]  # (the widest words: what pe.rope takes here)
        kernel = product_kernel("rotate", name, layout, blocks)
        registers = kernel.get_regs_per_thread()
        ms = gpu_ms(product_rotation(x, pos, inv_freq, kernel, layout))
        print(f"{dtype}: the product's kernel, launch bounds {blocks or 'as built'} ({registers} registers) {ms:.3f} ms ({copy / ms:.2f})")


if __name__ == "__main__":
    main()
