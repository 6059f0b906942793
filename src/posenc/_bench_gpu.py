"""``posenc bench --gpu``: the rotation and bias rows on a CUDA GPU, with their anchors.

posenc's numba.cuda kernels on torch CUDA tensors (and CuPy arrays where CuPy is installed)
beside what a GPU user would run instead: the plain formula in torch eager (the ``vs framework``
baseline), ``torch.compile`` of the same formula, Liger-Kernel's Triton RoPE where
``liger_kernel`` is installed, and the device's own ``Tensor.copy_`` / ``fill_`` of the same
bytes (the ``of copy`` reference: 1.00 = the device's copy bandwidth). A row's time is per
call. The bandwidth rows take the device's time (``device_timings``): ``BACK_TO_BACK`` calls
between two CUDA events, enqueued behind a device-side wait longer than the host takes to
enqueue them, so that they run back to back whatever each call's host work, as the calls of
a model's forward do once the host is ahead. The decode step's rows take the wall time of
``DECODE_CALLS`` calls and a synchronisation: there a call's host time is what it costs.

Rows: ``rope`` and ``apply_rope`` on ``[4, 32, 8192, 128]`` (``--quick``: ``[1, 32, 1024,
128]``) in float32 and bfloat16, allocating and in place; Hugging Face's ``q [4, 4096, 32,
128]`` and ``k [4, 4096, 8, 128]`` bfloat16 as transposed views of ``[b, s, h, d]``, rotated
together (posenc's one launch for both, in place and as ``apply_rotary_pos_emb``); a decode
step ``[1, 32, 1, 128]`` with its position on the device, and one of Hugging Face's q and k
(``apply_rotary_pos_emb``); ``t5_bias`` and ``alibi_bias`` of 16
heads over ``L x L``; ``pe.rope`` on a JAX GPU array under ``jax.jit`` where JAX runs on the GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import time

import numpy as np

import posenc as pe

from . import _oracles
from ._bench_measure import Case, Row, _measure, best
from ._kernels import _arrays

DECODE_CALLS = 200
BACK_TO_BACK = 10  # calls a sample of a bandwidth row enqueues between its two events


def device_timings(torch):
    """``timings(fn, repeat, calls)``: the device's seconds per call of ``fn`` in each of
    ``repeat`` samples, sorted (after one warm-up call). A sample is ``calls`` calls between
    two CUDA events on the current stream, enqueued behind ``torch.cuda._sleep`` for twice
    the host's time to enqueue them (measured on the warm-up, plus a millisecond): the device
    then runs them back to back and the events see its work alone. Where a call waits for
    the device on the host, the wait is spent and the time includes the host's: never less
    than the device's."""
    cycles_per_second = _sleep_rate(torch)

    def timings(fn, repeat, calls=BACK_TO_BACK):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(cycles_per_second * (2 * host + 1e-3)))
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        return sorted(times)

    return timings


def _sleep_rate(torch, cycles=10_000_000):
    """Cycles a second of ``torch.cuda._sleep`` (the device's clock), timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def requirements() -> str | None:
    """Why ``--gpu`` cannot run here, or None."""
    problem = _arrays.cuda_problem()
    if problem is not None or _arrays.cuda_simulator():
        return f"--gpu needs an NVIDIA GPU that numba.cuda can use ({problem or 'the CUDA simulator is on'})"
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

    progress(f"  device: {torch.cuda.get_device_name()}")
    shape = (1, 32, 1024, 128) if quick else (4, 32, 8192, 128)
    timer = device_timings(torch)
    result = []
    for dtype in (torch.float32, torch.bfloat16):
        result += _rope_rows(torch, shape, dtype, repeat, progress, timer)
    result += _hf_pair_rows(torch, (1, 1024) if quick else (4, 4096), repeat, progress, timer)
    for dtype in (torch.float32, torch.bfloat16):
        result += _decode_rows(torch, dtype, repeat, progress, sync)
    for length in (512,) if quick else (2048, 8192):
        result += _bias_rows(torch, 16, length, repeat, progress, timer)
    if importlib.util.find_spec("jax") is not None:
        result += _jax_rows(shape, repeat, progress)
    return result


def _jax_rows(shape, repeat, progress):
    """``pe.rope`` on a JAX GPU array under ``jax.jit`` (traced offset) beside the plain ``jnp``
    formula under ``jit`` and a negation under ``jit`` (XLA's read-and-write of the same
    bytes: the copy anchor; a copy itself is elided). A sample is ``BACK_TO_BACK`` calls
    dispatched without waiting, then a wait for the last: JAX dispatches asynchronously, so
    the device runs them back to back as long as dispatching a call is the shorter."""
    found = jax_gpu_rope(shape)
    if found is None:
        progress("  (JAX sees no GPU: no JAX row)")
        return []
    calls, negate = found
    last = [None]

    def dispatched(fn):
        def call():
            last[0] = fn()

        return call

    def wait():
        last[0].block_until_ready()

    rope = dispatched(lambda: calls.jitted(calls.jx, calls.traced_offset))
    plain = dispatched(lambda: calls.plain(calls.jx, calls.cos, calls.sin))
    copy_fn = dispatched(lambda: negate(calls.jx))
    nbytes = 2 * calls.x.nbytes
    cases = [
        Case("jnp plain formula, jax.jit", plain, nbytes),
        Case("posenc rope (JAX, jax.jit)", rope, nbytes),
        Case("jnp negation, jax.jit (bandwidth)", copy_fn, nbytes, comparable=False, bandwidth_row=True),
    ]
    return _measure(f"JAX rope {list(shape)} (GPU)", cases, repeat, progress, wait, BACK_TO_BACK)


def jax_gpu_rope(shape):
    """``(calls, negate)`` of the JAX row on JAX's first GPU, or None where JAX sees none:
    ``calls`` a ``_bench_jax.RopeCalls`` whose arrays are on the GPU, ``negate`` XLA's
    negation under ``jit`` (the copy anchor; the asv class ``GPUJaxRope`` times them too)."""
    import jax

    from ._bench_jax import RopeCalls

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return None
    with jax.default_device(gpus[0]):
        calls = RopeCalls(shape)
    return calls, jax.jit(lambda x: -x)


def _compiled(torch, fn):
    """``torch.compile(fn)``, compiled on its first (warm-up) call."""
    return torch.compile(fn, dynamic=False)


def _tables(torch, seq, dim, dtype, device="cuda"):
    inv_freq, _ = pe.rope_frequencies(dim)
    return (torch.from_numpy(a).to(device=device, dtype=dtype) for a in pe.rope_cos_sin(np.arange(seq), inv_freq))


def _rope_rows(torch, shape, dtype, repeat, progress, timer):
    x = torch.randn(shape, device="cuda").to(dtype)
    buf = x.clone()
    seq, dim = shape[-2], shape[-1]
    cos, sin = _tables(torch, seq, dim, dtype)
    positions = torch.arange(seq, device="cuda")
    nbytes = 2 * x.numel() * x.element_size()  # read x, write the result
    name = str(dtype).rsplit(".", 1)[-1]
    formula = _compiled(torch, functools.partial(_oracles.hf_rope, torch))
    with torch.no_grad():
        cases = [
            Case("torch eager plain formula", lambda: _oracles.hf_rope(torch, x, cos, sin), nbytes, name),
            Case("torch.compile plain formula", lambda: formula(x, cos, sin), nbytes, name),
            Case("posenc rope (torch)", lambda: pe.rope(x, positions), nbytes, name),
            Case("posenc rope in place (torch)", lambda: pe.rope(buf, positions, out=buf), nbytes, name),
            Case("posenc apply_rope in place (torch)", lambda: pe.apply_rope(buf, cos, sin, out=buf), nbytes, name),
            Case("Tensor.copy_ (bandwidth)", lambda: buf.copy_(x), nbytes, name, comparable=False, bandwidth_row=True),
        ]
        if importlib.util.find_spec("cupy") is not None and dtype == torch.float32:
            import cupy

            cx = cupy.asarray(x)
            cbuf = cupy.empty_like(cx)
            cpos = cupy.arange(seq)
            cases += [  # (after Tensor.copy_: the first bandwidth row of a dtype is its rows' anchor)
                Case("posenc rope (cupy)", lambda: pe.rope(cx, cpos), nbytes, name),
                Case("posenc rope in place (cupy)", lambda: pe.rope(cbuf, cpos, out=cbuf), nbytes, name),
                Case("cupy.copyto (bandwidth)", lambda: cupy.copyto(cbuf, cx), nbytes, name, comparable=False, bandwidth_row=True),
            ]
        return _measure(f"rope {list(shape)} (GPU)", cases, repeat, progress, timer=timer)


def _hf_apply(q, k, cos, sin):
    """transformers' ``apply_rotary_pos_emb`` (``unsqueeze_dim=1``)."""
    import torch

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _oracles.hf_rope(torch, q, cos, sin), _oracles.hf_rope(torch, k, cos, sin)


def liger_rope():
    """Liger-Kernel's ``liger_rotary_pos_emb(q, k, cos, sin)`` (in place on q and k), or None."""
    if importlib.util.find_spec("liger_kernel") is None:
        return None
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    return liger_rotary_pos_emb


def _hf_pair_rows(torch, batch_seq, repeat, progress, timer):
    from ._kernels import rope_cuda
    from .torch.hf import apply_rotary_pos_emb

    b, s = batch_seq
    dtype = torch.bfloat16
    q = torch.randn(b, s, 32, 128, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(b, s, 8, 128, device="cuda", dtype=dtype).transpose(1, 2)
    cos, sin = (t.expand(b, s, 128) for t in _tables(torch, s, 128, dtype))
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    source = torch.empty(q.numel() + k.numel(), device="cuda", dtype=dtype)  # the same bytes, for the copy
    target = torch.empty_like(source)
    formula = _compiled(torch, _hf_apply)
    cases = [
        Case("torch eager plain formula (HF apply_rotary_pos_emb)", lambda: _hf_apply(q, k, cos, sin), nbytes, "bfloat16"),
        Case("torch.compile plain formula", lambda: formula(q, k, cos, sin), nbytes, "bfloat16"),
        Case("posenc apply_rotary_pos_emb (one launch)", lambda: apply_rotary_pos_emb(q, k, cos, sin), nbytes, "bfloat16"),
        Case(
            "posenc q+k in place (one launch)",
            lambda: rope_cuda.rotate_cos_sin_pair(q, k, cos[:, None], sin[:, None], out_q=q, out_k=k),
            nbytes,
            "bfloat16",
        ),
    ]
    liger = liger_rope()
    if liger is not None:
        cases.append(Case("Liger-Kernel liger_rotary_pos_emb (in place)", lambda: liger(q, k, cos, sin), nbytes, "bfloat16"))
    else:
        progress("  (liger_kernel not installed: no Liger-Kernel row)")
    cases.append(Case("Tensor.copy_ (bandwidth)", lambda: target.copy_(source), nbytes, "bfloat16", comparable=False, bandwidth_row=True))
    with torch.no_grad():
        return _measure(f"HF q {list(q.shape)} + k {list(k.shape)} (GPU)", cases, repeat, progress, timer=timer)


def _decode_rows(torch, dtype, repeat, progress, sync, device="cuda"):
    """One token of 32 heads at a position held on the device: the eager formula from the
    position (the angles, cos and sin, the rotation: about ten small kernels) against
    ``pe.rope``; and an attention layer's q (32 heads) and k (8) of one token rotated by given
    ``cos``/``sin``, transformers' ``apply_rotary_pos_emb`` against posenc's drop-in. Each row
    is the time of one call, ``DECODE_CALLS`` calls back to back."""
    x = torch.randn(1, 32, 1, 128, device=device).to(dtype)
    position = torch.tensor([4095], device=device)
    q = torch.randn(1, 1, 32, 128, device=device).to(dtype).transpose(1, 2)
    k = torch.randn(1, 1, 8, 128, device=device).to(dtype).transpose(1, 2)
    cos, sin = (t[None] for t in _tables(torch, 1, 128, dtype, device))
    from .torch.hf import apply_rotary_pos_emb

    name = str(dtype).rsplit(".", 1)[-1]
    ops = (
        ("decode step rope [1, 32, 1, 128], position on the device (GPU)", x.numel(), decode_formula(torch, x, position), "posenc rope (torch)", lambda: pe.rope(x, position)),
        (
            "decode step HF q [1, 32, 1, 128] + k [1, 8, 1, 128] (GPU)", q.numel() + k.numel(), lambda: _hf_apply(q, k, cos, sin),
            "posenc apply_rotary_pos_emb (torch)", lambda: apply_rotary_pos_emb(q, k, cos, sin),
        ),
    )  # fmt: skip
    rows = []
    with torch.no_grad():
        for op, elements, formula, impl, ours in ops:
            pair = []
            for label, fn in (("torch eager plain formula", formula), (impl, ours)):
                progress(f"  {op}: {label} ...")
                pair.append(Row(op, label, name, best(fn, repeat, sync, DECODE_CALLS), 2 * elements * x.element_size()))
            pair[1].plain_seconds = pair[0].seconds
            rows += pair
    return rows


def decode_formula(torch, x, position):
    """The eager decode step of ``x [..., 1, d]`` at ``position`` (a device tensor): angles,
    ``cos``/``sin`` in ``x``'s dtype, the rotation (transformers' rotary embedding and
    ``apply_rotary_pos_emb``), as a function of no arguments."""
    inv_freq = torch.from_numpy(pe.rope_frequencies(int(x.shape[-1]))[0]).to(x.device, torch.float32)

    def formula():
        freqs = position[:, None].float() * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return _oracles.hf_rope(torch, x, emb.cos().to(x.dtype), emb.sin().to(x.dtype))

    return formula


def alibi_formula(slopes, positions):
    """The symmetric ALiBi bias ``-slope[h] * |j - i|`` in torch eager."""
    return -slopes[:, None, None] * (positions[None, :] - positions[:, None]).abs().float()[None]


def _bias_rows(torch, heads, length, repeat, progress, timer):
    table = torch.randn(32, heads, device="cuda")
    slopes = torch.from_numpy(pe.alibi_slopes(heads)).to("cuda", torch.float32)
    out = torch.empty(heads, length, length, device="cuda")
    nbytes = out.numel() * out.element_size()  # write the bias
    embedding = torch.nn.Embedding.from_pretrained(table)
    positions = torch.arange(length, device="cuda")

    with torch.no_grad():
        t5 = [
            Case("torch eager plain formula", lambda: _oracles.t5_compute_bias(torch, embedding, length, length), nbytes),
            Case("posenc t5_bias (torch)", lambda: pe.t5_bias(table, length, length), nbytes),
            Case("posenc t5_bias out= (torch)", lambda: pe.t5_bias(table, length, length, out=out), nbytes),
            Case("Tensor.fill_ (bandwidth)", lambda: out.fill_(1.0), nbytes, comparable=False, bandwidth_row=True),
        ]
        alibi = [
            Case("torch eager plain formula (symmetric)", lambda: alibi_formula(slopes, positions), nbytes),
            Case("posenc alibi_bias symmetric (torch)", lambda: pe.alibi_bias(slopes, length, length, symmetric=True), nbytes),
            Case("posenc alibi_bias symmetric out= (torch)", lambda: pe.alibi_bias(slopes, length, length, symmetric=True, out=out), nbytes),
            Case("Tensor.fill_ (bandwidth)", lambda: out.fill_(1.0), nbytes, comparable=False, bandwidth_row=True),
        ]
        return _measure(f"t5_bias h={heads} L={length} (GPU)", t5, repeat, progress, timer=timer) + _measure(
            f"alibi_bias h={heads} L={length} (GPU)", alibi, repeat, progress, timer=timer
        )
