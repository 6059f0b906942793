"""Compile every numba.cuda kernel specialisation of posenc to PTX, without a GPU.

The CUDA simulator runs the kernels as Python, so it cannot catch what only Numba's CUDA
target rejects (typing, unsupported constructs). This compiles each specialisation of the
``rope_cuda``, ``toeplitz_cuda`` and ``buckets_cuda`` families, and the device-side
conversion kernel, for a compute capability (default 9.0: H100/H200) with NVIDIA's NVVM,
which needs no GPU or driver: ``pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12``
and put their library folders on ``LD_LIBRARY_PATH`` (``.../nvidia/cuda_nvcc/nvvm/lib64`` and
``.../nvidia/cuda_nvrtc/lib``). Each line counts the instructions, those converting to or
from float64 among them (the slow ones on an H100), and the local loads (spills); where
``ptxas`` is on the ``PATH`` (of a CUDA toolkit at least as new as the NVVM), also the registers a
thread and the spilled bytes of the machine code it assembles (what bounds a kernel's
occupancy). Usage: ``PYTHONPATH=src python tests/gpu/compile_ptx.py [MAJOR.MINOR]``;
exits 1 if a specialisation fails to compile.
"""

from __future__ import annotations

import sys


def main(argv) -> int:
    import numba.cuda.dispatcher
    from numba import cuda, types

    cc = tuple(int(n) for n in (argv[0] if argv else "9.0").split("."))

    class Device:  # a device function compiles for the current device's capability: this one
        compute_capability = cc

    numba.cuda.dispatcher.get_current_device = lambda: Device()

    from posenc._kernels import _device_flat, buckets_cuda, rope_cuda, toeplitz_cuda

    failures = 0
    for family, module in ((rope_cuda.FAMILY, rope_cuda), (toeplitz_cuda.FAMILY, toeplitz_cuda), (buckets_cuda.FAMILY, buckets_cuda)):
        for key in family.keys:
            fn, signature, options = family_build(module, key)
            failures += _compile(cuda, f"{family.name}{key}", fn, signature, cc, options.get("launch_bounds"))
    flat = types.Array(types.float64, 1, "C")
    for source in (types.int32, types.int64, types.float32):
        failures += _compile(cuda, f"_device_flat._convert({source})", _device_flat._convert.py_func, (types.Array(source, 1, "C"), flat), cc)
    print(f"{failures} failed")
    return 1 if failures else 0


def family_build(module, key):
    """``(function, signature, options)`` that kernel family ``module``'s ``_build(*key)``
    hands ``cuda.jit``: what the family compiles, taken without compiling it."""
    from numba import cuda

    jit, built = cuda.jit, {}

    def capture(signature=None, **options):
        def keep(fn):
            built.update(fn=fn, signature=signature, options=options)

        return keep

    cuda.jit = capture
    try:
        module._build(*key)
    finally:
        cuda.jit = jit
    return built["fn"], built["signature"], built["options"]


def _compile(cuda, name, fn, signature, cc, launch_bounds=None) -> int:
    try:
        ptx, _ = cuda.compile_ptx(fn, signature, cc=cc, launch_bounds=launch_bounds)
    except Exception as exc:  # noqa: BLE001 (reported, counted)
        print(f"FAIL {name}: {type(exc).__name__}: {exc}")
        return 1
    bounds = f", launch bounds {launch_bounds}" if launch_bounds else ""
    ops = _instructions(ptx)
    wide = sum([1 for op in ops if op.startswith("cvt") and "f64" in op])
    print(f"ok   {name}: {len(ops)} PTX instructions ({wide} conversions to or from float64), {ptx.count('ld.local')} local loads{bounds}{_assembled(ptx, cc)}")
    return 0


def _assembled(ptx, cc):
    """``ptxas -v``'s registers and spilled bytes of the kernel in ``ptx`` (its first
    function: the entry), as ``", N registers, S bytes spilled"``; empty without ptxas."""
    import re
    import shutil
    import subprocess
    import tempfile

    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return ""
    with tempfile.TemporaryDirectory() as folder:
        source = f"{folder}/kernel.ptx"
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", source, "-o", f"{folder}/kernel.cubin"], capture_output=True, text=True)
    if done.returncode:  # (a ptxas older than the NVVM that wrote the PTX refuses its version)
        return f", ptxas failed: {(done.stderr.strip().splitlines() or ['?'])[0]}"
    registers = re.search(r"Used (\d+) registers", done.stderr)
    spilled = re.search(r"(\d+) bytes spill stores", done.stderr)
    return f", {registers.group(1)} registers, {spilled.group(1)} bytes spilled"


def _instructions(ptx):
    """The opcodes of ``ptx``'s instructions (a predicate's guard left out)."""
    ops = []
    for line in ptx.splitlines():
        words = line.split()
        if not words or words[0].startswith(("//", ".", "{", "}", "$")) or words[0].endswith(":"):
            continue
        ops.append(words[1] if words[0].startswith("@") and len(words) > 1 else words[0])
    return ops


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
