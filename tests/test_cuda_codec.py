"""The device's conversions of the CUDA rotation (``_codec_cuda``) against their software definitions.

On a GPU (``make test-gpu``) the compiled functions are the device's instructions
(``cvt.rn.bf16x2.f32`` from compute capability 8.0, ``cvt`` to and from float16, a word
split and joined by moves) and every float32 bit pattern, every 16-bit pattern and every
word of two is checked against the software rounding of ``_codec`` (compiled on the device
too): the same bits, or NaN for NaN. Under the CUDA simulator (``make test``) the kernels
run as Python on a sample of patterns, which checks the definitions and the sweep itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from posenc._kernels import _arrays, _codec

cuda = pytest.importorskip("numba.cuda")
_codec_cuda = pytest.importorskip("posenc._kernels._codec_cuda")

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]

_STEP = 2654435761  # odd: a sample of patterns spread over the whole range under the simulator


def _sweep():
    """``(count, step)``: every 32-bit pattern on a GPU, 2,000 spread ones in the simulator."""
    return (2000, _STEP) if _arrays.cuda_simulator() else (2**32, 1)


@cuda.jit(device=True)
def nan16(bits, storage):
    exponent = np.uint32(0x7F80) if storage == _codec.BFLOAT16 else np.uint32(0x7C00)
    return (bits & exponent) == exponent and (bits & (exponent ^ np.uint32(0x7FFF))) != 0


@cuda.jit(device=True)
def same16(a, b, storage):
    return a == b or (nan16(a, storage) and nan16(b, storage))


@cuda.jit(device=True)
def same32(a, b):
    fa, fb = np.uint32(a).view(np.float32), np.uint32(b).view(np.float32)
    return a == b or (fa != fa and fb != fb)


@cuda.jit(device=True)
def report(found, pattern):
    if cuda.atomic.add(found, 0, 1) == 0:
        found[1] = pattern


@cuda.jit
def narrow(count, step, storage, found):
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        p = np.uint32((i * step) & 0xFFFFFFFF)
        low, high = p.view(np.float32), np.uint32(p ^ np.uint32(0xFFFFFFFF)).view(np.float32)
        got = np.uint32(_codec_cuda.narrow_pair(low, high, storage))
        want = np.uint32(_codec_cuda._narrow_pair_software(low, high, storage))
        low_ok = same16(got & np.uint32(0xFFFF), want & np.uint32(0xFFFF), storage)
        if not (low_ok and same16(got >> np.uint32(16), want >> np.uint32(16), storage)):
            report(found, p)


@cuda.jit
def widen(count, step, storage, found):
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        p = np.uint32((i * step) & 0xFFFFFFFF)
        low, high = _codec_cuda.widen_pair(p, storage)
        one = _codec_cuda.widen_one(np.uint16(p & np.uint32(0xFFFF)), storage)
        want_low = _codec.widen16(p, storage).view(np.uint32)
        want_high = _codec.widen16(p >> np.uint32(16), storage).view(np.uint32)
        got_low, got_high, got_one = np.float32(low).view(np.uint32), np.float32(high).view(np.uint32), np.float32(one).view(np.uint32)
        if storage == _codec.BFLOAT16:  # a shift: every bit kept, NaN payloads too
            ok = got_low == want_low and got_high == want_high and got_one == want_low
        else:
            ok = same32(got_low, want_low) and same32(got_high, want_high) and same32(got_one, want_low)
        if not ok:
            report(found, p)


@cuda.jit
def float32_words(count, step, found):
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        p = np.uint32((i * step) & 0xFFFFFFFF)
        word = np.uint64(p) | (np.uint64(p ^ np.uint32(0xFFFFFFFF)) << np.uint64(32))
        low, high = _codec_cuda.float32_pair(word)  # (moves: every bit kept)
        ok = np.float32(low).view(np.uint32) == p and np.float32(high).view(np.uint32) == p ^ np.uint32(0xFFFFFFFF)
        back = np.uint64(_codec_cuda.float32_word(np.float64(low), np.float64(high)))
        both_numbers = low == low and high == high
        if not ok or (both_numbers and back != word):
            report(found, p)


def _run(kernel, *args):
    found = cuda.to_device(np.zeros(2, np.uint64))
    blocks = 8 if _arrays.cuda_simulator() else 4096
    kernel[blocks, 256](*args, found)
    count, example = found.copy_to_host()
    assert count == 0, f"{count} patterns differ from the software conversion, the first {int(example):#010x}"


# (the simulator's NumPy scalars wrap the rounding increment of a NaN with every bit set, as
# the device's 64-bit arithmetic does not: the NaN is selected either way)
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")
@pytest.mark.parametrize("storage", [_codec.BFLOAT16, _codec.FLOAT16], ids=["bfloat16", "float16"])
def test_two_float32_round_to_16_bits_as_the_software_rounding(storage):
    _run(narrow, *_sweep(), storage)


@pytest.mark.parametrize("storage", [_codec.BFLOAT16, _codec.FLOAT16], ids=["bfloat16", "float16"])
def test_16_bit_elements_widen_to_float32_as_the_software_widening(storage):
    _run(widen, *_sweep(), storage)


def test_a_word_of_two_float32_splits_and_joins_unchanged():
    _run(float32_words, *_sweep())


def test_the_simulator_and_the_device_name_the_same_software_rounding():
    """The Python definitions the simulator runs are ``_codec``'s, half by half."""
    rng = np.random.default_rng(3)
    for storage in (_codec.BFLOAT16, _codec.FLOAT16):
        for low, high in rng.standard_normal((50, 2)).astype(np.float32) * np.float32(1e3):
            word = _codec_cuda.narrow_pair(low, high, storage)
            assert word & 0xFFFF == _codec.narrow16(low.view(np.uint32), storage)
            assert word >> 16 == _codec.narrow16(high.view(np.uint32), storage)
            assert _codec_cuda.widen_pair(word, storage) == (_codec.widen16(word, storage), _codec.widen16(word >> 16, storage))


@pytest.mark.skipif(_arrays.cuda_simulator(), reason="the simulator compiles nothing")
def test_bfloat16_pairs_round_by_one_instruction_from_compute_capability_8():
    """On this GPU the compiled conversion is the hardware's (``cvt.rn.bf16x2.f32``) from
    compute capability 8.0, the software rounding below: a lost compute capability would
    keep the numbers but quietly lose the instruction."""
    from numba import types

    signature = (types.int64, types.int64, types.int64, types.Array(types.uint64, 1, "C"))
    narrow.compile(signature)
    ptx = narrow.inspect_asm(signature)
    assert ("cvt.rn.bf16x2.f32" in ptx) == (cuda.get_current_device().compute_capability >= (8, 0))
