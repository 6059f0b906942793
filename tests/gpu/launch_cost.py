"""Host cost of a CUDA launch's arguments, without a GPU: the rotary kernel's parameters as
``_device_flat``'s writers lay them out, packed by ``cuda.core``'s ``ParamHolder`` (what
``cuda.core.launch`` builds on every call), beside the same values as ctypes objects (how
posenc passed its integers and floats before).

Usage: ``PYTHONPATH=src python tests/gpu/launch_cost.py`` (numba-cuda and cuda-core
installed; no GPU or driver needed). Prints microseconds per launch, best of 5.
"""

from __future__ import annotations

import ctypes
import timeit


def main():
    import numpy as np
    from cuda.core._kernel_arg_handler import ParamHolder
    from numba import types

    from posenc._kernels import _device_flat, rope_cuda

    signature = rope_cuda._signature("float32", None).args
    writers = _device_flat.parameter_writers(signature)

    def array(dtype):
        return _device_flat.Flat(1 << 20, 4096, np.dtype(dtype))

    geometry, blank = (0, 0, 0, 0, 4096, 128, 8192, 1, 32), (0,) * rope_cuda._TABLE
    arguments = (
        (1, 1, 1, 1, 8192), 64, 64, *(array(np.float32), geometry) * 4, array(np.float64), array(np.int64), blank,
        array(np.float64), 1.0, 1.0, array(np.float32), blank, array(np.float32), blank,
    )  # fmt: skip
    params = []
    for write, a in zip(writers, arguments):
        write(a, params)
    as_ctypes = []  # the same values, the arrays' fields as ints, every other integer and float as ctypes
    for t, write, a in zip(signature, writers, arguments):
        laid = []
        write(a, laid)
        as_ctypes += laid if isinstance(t, types.Array) else [ctypes.c_double(v) if type(v) is float else ctypes.c_int64(v) for v in laid]

    def full():
        laid = []
        for write, a in zip(writers, arguments):
            write(a, laid)
        return ParamHolder(laid)

    def best(fn, n=20000):
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    print(f"rotary kernel, {len(params)} parameters (us a launch):")
    print(f"  packing as ints and floats (posenc): {best(lambda: ParamHolder(list(params))):.1f}")
    print(f"  packing as ctypes objects:           {best(lambda: ParamHolder(list(as_ctypes))):.1f}")
    print(f"  writers + packing (an unplanned launch): {best(full):.1f}")


if __name__ == "__main__":
    main()
