"""``posenc bench --gpu``: the rotation and bias rows on a CUDA GPU.

posenc's numba.cuda kernels on CuPy arrays and torch CUDA tensors, beside the plain formula
in torch eager (the ``vs plain`` baseline) and the device's own copy of the same bytes
(``cupy.copyto`` or ``Tensor.copy_``, and ``fill`` for the biases: the ``of copy``
reference). Every timed call ends with a device synchronisation.
"""

from __future__ import annotations

import importlib.util

import numpy as np

import posenc as pe

from . import _oracles
from ._bench_measure import Case, _measure, best
from ._kernels import _arrays


def requirements() -> str | None:
    """Why ``--gpu`` cannot run here, or None."""
    if _arrays.cuda_simulator() or not _arrays.numba_cuda():
        return "--gpu needs an NVIDIA GPU that numba.cuda can use (numba-cuda installed, a CUDA driver, not the simulator)"
    if importlib.util.find_spec("torch") is None:
        return "--gpu needs a CUDA build of torch (the plain formula and the bfloat16 rows are torch eager)"
    import torch

    if not torch.cuda.is_available():
        return f"--gpu needs a CUDA build of torch; this one ({torch.__version__}) sees no GPU"
    return None


def rows(quick, repeat, progress):
    problem = requirements()
    if problem:
        raise RuntimeError(problem)
    import torch

    def sync():
        torch.cuda.synchronize()

    shape = (1, 32, 1024, 128) if quick else (4, 32, 8192, 128)
    result = []
    for dtype in (torch.float32, torch.bfloat16):
        result += _rope_rows(torch, shape, dtype, repeat, progress, sync)
    for length in (512,) if quick else (2048, 8192):
        result += _t5_rows(torch, 16, length, repeat, progress, sync)
    return result


def _rope_rows(torch, shape, dtype, repeat, progress, sync):
    x = torch.randn(shape, device="cuda").to(dtype)
    buf = torch.empty_like(x)
    seq, dim = shape[-2], shape[-1]
    inv_freq, _ = pe.rope_frequencies(dim)
    cos, sin = (torch.from_numpy(a).to(device="cuda", dtype=dtype) for a in pe.rope_cos_sin(np.arange(seq), inv_freq))
    positions = torch.arange(seq, device="cuda")
    nbytes = 2 * x.numel() * x.element_size()  # read x, write the result
    copy = nbytes / best(lambda: buf.copy_(x), repeat, sync)
    name = str(dtype).rsplit(".", 1)[-1]
    with torch.no_grad():
        cases = [
            Case("torch eager plain formula", lambda: _oracles.rope_rotate_half(x, cos, sin), nbytes, name),
            Case("posenc rope (torch)", lambda: pe.rope(x, positions), nbytes, name),
            Case("posenc rope in place (torch)", lambda: pe.rope(buf, positions, out=buf), nbytes, name),
            Case("Tensor.copy_ (bandwidth)", lambda: buf.copy_(x), nbytes, name, comparable=False, bandwidth_row=True),
        ]
        if importlib.util.find_spec("cupy") is not None and dtype == torch.float32:
            import cupy

            cx = cupy.asarray(x)
            cbuf = cupy.empty_like(cx)
            cpos = cupy.arange(seq)
            cases[3:3] = [
                Case("posenc rope (cupy)", lambda: pe.rope(cx, cpos), nbytes, name),
                Case("posenc rope in place (cupy)", lambda: pe.rope(cbuf, cpos, out=cbuf), nbytes, name),
                Case("cupy.copyto (bandwidth)", lambda: cupy.copyto(cbuf, cx), nbytes, name, comparable=False, bandwidth_row=True),
            ]
        return _measure(f"rope {list(shape)} (GPU)", cases, copy, repeat, progress, sync)


def _t5_rows(torch, heads, length, repeat, progress, sync):
    table = torch.randn(32, heads, device="cuda")
    out = torch.empty(heads, length, length, device="cuda")
    nbytes = out.numel() * out.element_size()  # write the bias
    fill = nbytes / best(lambda: out.fill_(1.0), repeat, sync)
    embedding = torch.nn.Embedding.from_pretrained(table)
    with torch.no_grad():
        cases = [
            Case("torch eager plain formula", lambda: _oracles.t5_compute_bias(torch, embedding, length, length), nbytes),
            Case("posenc t5_bias (torch)", lambda: pe.t5_bias(table, length, length), nbytes),
            Case("posenc t5_bias out= (torch)", lambda: pe.t5_bias(table, length, length, out=out), nbytes),
            Case("Tensor.fill_ (bandwidth)", lambda: out.fill_(1.0), nbytes, comparable=False, bandwidth_row=True),
        ]
        return _measure(f"t5_bias h={heads} L={length} (GPU)", cases, fill, repeat, progress, sync)
