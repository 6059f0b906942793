"""The numba.cuda kernels compiled for a GPU on a machine without one.

The CUDA simulator runs the kernels' Python (``make test``'s cudasim pass), not what a GPU
compiles: the ``overload`` and ``intrinsic`` definitions that replace that Python on a
device (``_codec_cuda``'s conversions, ``rope_cuda._pair_typed`` and ``_sin_cos_typed``),
the kernels' typing against their signatures and the launch bounds are met only by Numba's
CUDA compiler. Here that compiler types and lowers every kernel family to LLVM IR (no
driver, no PTX: those need a GPU's libraries), at a compute capability given rather than
read from a device, so that a change a GPU would refuse to compile fails here too. Where
the kernels can run (a GPU, or the simulator), they compile for real and this is skipped.
"""

from __future__ import annotations

import types as pytypes

import numpy as np
import pytest

from posenc._kernels import _arrays

pytestmark = pytest.mark.skipif(_arrays.numba_cuda() or not _arrays.numba_cpu(), reason="the kernels compile and run here (a GPU or the CUDA simulator), or numba is missing")


@pytest.fixture(scope="module")
def compile_ir():
    """``compile_ir(function, signature, cc=(9, 0))``: the LLVM IR of kernel ``function``
    compiled by numba-cuda for compute capability ``cc``; a skip where numba-cuda cannot
    compile here (it does not import, or finds no NVVM)."""
    try:
        from numba import types
        from numba.cuda import dispatcher
        from numba.cuda.compiler import compile_cuda
        from numba.cuda.cudadrv import nvvm
    except Exception as exc:  # (numba-cuda missing, or its import failing: posenc says why elsewhere)
        pytest.skip(f"numba.cuda does not import: {exc}")
    if not nvvm.is_available():
        pytest.skip("no NVVM (the CUDA toolkit's libnvvm)")
    # A device function compiles for the current device's compute capability: a stand-in
    # device of 9.0 answers while this module's tests run (none of them launches anything).
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))

    def compiled(function, signature, cc=(9, 0)):
        return compile_cuda(function, signature.return_type, signature.args, cc=cc).library.get_llvm_str()

    try:
        compiled(lambda out: None, types.void(types.Array(types.float32, 1, "C")))
    except Exception as exc:  # (a toolkit numba-cuda cannot use: no kernel compiles)
        dispatcher.get_current_device = saved
        pytest.skip(f"numba-cuda compiles no kernel here: {exc}")
    yield compiled
    dispatcher.get_current_device = saved


# Each kind of kernel once: the rotary kernels of 16-bit words (the early loads of apply),
# of 16-bit elements (the angle's sincos), of float32 words and of float64 elements; the
# Toeplitz copy and scatter; T5's buckets. (All 34 specialisations take two and a half
# times as long.)
KEYS = [
    ("rope_cuda", ("apply", "bfloat16", "half, words")),
    ("rope_cuda", ("rotate", "float16", "interleaved")),
    ("rope_cuda", ("rotate", "float32", "half, words")),
    ("rope_cuda", ("apply", "float64", "half")),
    ("toeplitz_cuda", ("gather", "uint16")),
    ("toeplitz_cuda", ("scatter", "bfloat16")),
    ("buckets_cuda", ("int32",)),
]


@pytest.mark.parametrize("module, key", KEYS, ids=[f"{m}[{', '.join(k)}]" for m, k in KEYS])
def test_every_kernel_family_compiles_for_a_gpu(compile_ir, monkeypatch, module, key):
    """A family's build for ``key`` (its source, signature and options, as on a GPU)
    compiles for compute capability 9.0; the rotary kernels with their launch bounds, those
    of 16-bit elements rounding pairs by the device's own conversions (its instruction for
    bfloat16, LLVM's of a vector for float16)."""
    import importlib

    from posenc._kernels import _family

    kernels = importlib.import_module(f"posenc._kernels.{module}")
    built = []
    monkeypatch.setattr(_family, "jitted", lambda jit, function, signature, **options: built.append((compile_ir(function, signature), options)))
    kernels.FAMILY.build(*key)
    ((ir, options),) = built
    assert "define" in ir
    assert options == ({"launch_bounds": (256, 3)} if module == "rope_cuda" else {})
    if module == "rope_cuda" and key[1] in ("bfloat16", "float16"):
        assert "cvt.rn.bf16x2.f32" in ir and "fptrunc <2 x float>" in ir


def test_the_device_conversion_kernel_compiles_for_a_gpu(compile_ir):
    """``_device_flat._convert`` (positions and indices of a numba device array converted on
    the device): int32 to float64 and int64."""
    from numba import types

    from posenc._kernels import _device_flat

    for target in (types.float64, types.int64):
        assert "define" in compile_ir(_device_flat._convert.py_func, types.void(types.Array(types.int32, 1, "C"), types.Array(target, 1, "C")))


@pytest.mark.parametrize("cc, hardware", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bfloat16_pairs_round_by_the_device_instruction_from_compute_capability_8(compile_ir, cc, hardware):
    """``_codec_cuda``'s rounding of two float32 to a bfloat16 word: one ``cvt.rn.bf16x2.f32``
    where the device has it (compute capability 8.0 on), else the software rounding (a T4 or
    a V100 would refuse the instruction); float16 pairs by the LLVM conversion everywhere."""
    from numba import types

    from posenc._kernels import _codec_cuda

    f32, word = types.Array(types.float32, 1, "C"), types.Array(types.uint32, 1, "C")

    def bfloat16(low, high, out):
        out[0] = _codec_cuda._narrow_pair_bfloat16(low[0], high[0])

    def float16(low, high, out):
        out[0] = _codec_cuda._narrow_pair_float16(low[0], high[0])

    assert ("cvt.rn.bf16x2.f32" in compile_ir(bfloat16, types.void(f32, f32, word), cc)) is hardware
    assert "fptrunc <2 x float>" in compile_ir(float16, types.void(f32, f32, word), cc)


def test_the_device_conversions_compile_to_their_instructions(compile_ir):
    """Each of ``_codec_cuda``'s conversions as its kernel code compiles it: a uint64 word to
    two float32 and back by bit casts, 16-bit elements widened one at a time and in pairs."""
    from numba import types

    from posenc._kernels import _codec_cuda

    def words(a, out):
        low, high = _codec_cuda.float32_pair(a[0])
        out[0] = _codec_cuda.float32_word(high, low)

    def widened(a, storage, out):
        low, high = _codec_cuda.widen_pair(a[0], storage)
        out[0] = low + high + _codec_cuda.widen_one(np.uint16(a[1]), storage)

    u64 = types.Array(types.uint64, 1, "C")
    assert "bitcast i64" in compile_ir(words, types.void(u64, u64))
    assert "define" in compile_ir(widened, types.void(types.Array(types.uint32, 1, "C"), types.int64, types.Array(types.float32, 1, "C")))  # (both storages: a run-time argument)
