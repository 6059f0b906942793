"""GPU benchmarks (torch CUDA tensors): posenc's numba.cuda kernels beside their anchors.

The anchors are what a GPU user would run instead, timed on the same inputs: the plain formula
in torch eager, ``torch.compile`` of it, Liger-Kernel's Triton RoPE (``liger_kernel``, where
installed), and ``Tensor.copy_`` / ``fill_`` of the same bytes, the floor of a pass that
reads and writes each element once. ``track_time_over_copy`` reports a variant's time in units
of that copy's, both the device's own time (CUDA events around ``BACK_TO_BACK`` calls
enqueued behind a device-side wait; lower is better: 1.11 is 0.9 of the device's copy
bandwidth). A ``time_*`` row is asv's wall time of ``BACK_TO_BACK`` calls enqueued and then
``torch.cuda.synchronize()``, the host's work on a call overlapping the device's. Without a CUDA GPU (or with a numba.cuda that
cannot run) ``setup`` raises ``NotImplementedError``, which asv reports as skipped.
``posenc bench --gpu`` prints the same rows as one table.
"""

from __future__ import annotations

import functools

import numpy as np

from .common import interleaved_best, require

# A small size and a model-sized one of each, ordinary parameters that asv records.
ROPE_SHAPES = ["1x32x1024x128", "4x32x8192x128"]
BIAS_LENGTHS = [512, 8192]
HF_SIZES = ["1x1024", "4x4096"]  # batch x tokens


def _cuda():
    """torch, after checking that a GPU and the numba.cuda kernels are usable."""
    torch = require("torch")
    if not torch.cuda.is_available():
        raise NotImplementedError("no CUDA GPU for torch")
    from posenc._kernels import _arrays

    problem = _arrays.cuda_problem()
    if problem is not None or _arrays.cuda_simulator():
        raise NotImplementedError(f"numba.cuda kernels unusable: {problem or 'the CUDA simulator is on'}")
    return torch


BACK_TO_BACK = 10  # calls a timing enqueues before it synchronises


def _enqueued(torch, fn):
    """``BACK_TO_BACK`` calls of ``fn``, then one synchronisation: the host prepares the next
    call while the device runs this one, so what is timed is the device's work."""
    for _ in range(BACK_TO_BACK):
        fn()
    torch.cuda.synchronize()


def _best(torch, fn, repeat=10):
    """The device's seconds per call, best of ``repeat`` samples of ``BACK_TO_BACK`` calls
    between CUDA events, enqueued behind a device-side wait (``posenc._bench_gpu.device_timings``):
    the device's work alone, whatever the host's per call."""
    from posenc import _bench_gpu

    return _bench_gpu.device_timings(torch)(fn, repeat, BACK_TO_BACK)[0]


class _GPUBenchmark:
    """A variant ``self.fn`` and its copy ``self.copy`` (made by ``make``), timed with a sync."""

    timeout = 600
    warmup_time = 0.2
    repeat = (3, 10, 10.0)

    def setup(self, *params):
        self.torch = _cuda()
        self.make(*params)
        self.fn()  # compiles (Numba, torch.compile, Triton) outside the timing
        self.torch.cuda.synchronize()

    def timed(self):
        _enqueued(self.torch, self.fn)

    def track_time_over_copy(self, *params):
        return _best(self.torch, self.fn) / _best(self.torch, self.copy)

    track_time_over_copy.unit = "copy times"


def _tables(torch, seq, dim, dtype):
    import posenc as pe

    inv_freq, _ = pe.rope_frequencies(dim)
    return [torch.from_numpy(a).to(device="cuda", dtype=dtype) for a in pe.rope_cos_sin(np.arange(seq), inv_freq)]


class GPURope(_GPUBenchmark):
    """``rope`` of ``[B, H, S, D]`` (positions on the device) against torch eager/compile and copy."""

    params = (ROPE_SHAPES, ["float32", "bfloat16"], ["torch eager", "torch.compile", "posenc", "posenc in place", "Tensor.copy_"])
    param_names = ["shape", "dtype", "variant"]

    def make(self, shape, dtype, variant):
        import posenc as pe
        from posenc._oracles import hf_rope

        torch = self.torch
        formula = functools.partial(hf_rope, torch)
        shape = tuple(int(n) for n in shape.split("x"))
        x = torch.randn(shape, device="cuda").to(getattr(torch, dtype))
        buf = torch.empty_like(x)
        cos, sin = _tables(torch, shape[-2], shape[-1], x.dtype)
        positions = torch.arange(shape[-2], device="cuda")
        self.copy = lambda: buf.copy_(x)
        compiled = torch.compile(formula, dynamic=False) if variant == "torch.compile" else None
        self.fn = {
            "torch eager": lambda: formula(x, cos, sin),
            "torch.compile": lambda: compiled(x, cos, sin),
            "posenc": lambda: pe.rope(x, positions),
            "posenc in place": lambda: pe.rope(buf, positions, out=buf),
            "Tensor.copy_": self.copy,
        }[variant]

    def time_rope(self, *params):
        self.timed()


class GPUHFPair(_GPUBenchmark):
    """Hugging Face's q ``[b, 32, s, 128]`` and k ``[b, 8, s, 128]`` bfloat16 (``b x s`` 1x1024, 4x4096; transposed
    views of ``[b, s, h, d]``) rotated together: eager, compiled, Liger-Kernel, posenc."""

    params = (HF_SIZES, ["torch eager", "torch.compile", "Liger-Kernel in place", "posenc", "posenc in place", "Tensor.copy_"])
    param_names = ["batch x tokens", "variant"]

    def make(self, size, variant):
        from posenc import _bench_gpu
        from posenc._kernels import rope_cuda
        from posenc.torch.hf import apply_rotary_pos_emb

        torch = self.torch
        b, s = (int(n) for n in size.split("x"))
        q = torch.randn(b, s, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        cos, sin = (t.expand(b, s, 128) for t in _tables(torch, s, 128, torch.bfloat16))
        source = torch.empty(q.numel() + k.numel(), device="cuda", dtype=torch.bfloat16)
        target = torch.empty_like(source)
        self.copy = lambda: target.copy_(source)
        liger = _bench_gpu.liger_rope()
        if variant == "Liger-Kernel in place" and liger is None:
            raise NotImplementedError("liger_kernel is not installed")
        compiled = torch.compile(_bench_gpu._hf_apply, dynamic=False) if variant == "torch.compile" else None
        self.fn = {
            "torch eager": lambda: _bench_gpu._hf_apply(q, k, cos, sin),
            "torch.compile": lambda: compiled(q, k, cos, sin),
            "Liger-Kernel in place": lambda: liger(q, k, cos, sin),
            "posenc": lambda: apply_rotary_pos_emb(q, k, cos, sin),
            "posenc in place": lambda: rope_cuda.rotate_cos_sin_pair(q, k, cos[:, None], sin[:, None], out_q=q, out_k=k),
            "Tensor.copy_": self.copy,
        }[variant]

    def time_pair(self, size, variant):
        self.timed()


class GPUBias(_GPUBenchmark):
    """``t5_bias`` / ``alibi_bias`` of 16 heads over ``L x L`` float32 against the eager formula and ``fill_``."""

    params = (BIAS_LENGTHS, ["t5 eager", "t5 posenc out=", "alibi eager", "alibi posenc out=", "Tensor.fill_"])
    param_names = ["length", "variant"]

    def make(self, length, variant):
        import posenc as pe
        from posenc import _bench_gpu
        from posenc._oracles import t5_compute_bias

        torch = self.torch
        table = torch.randn(32, 16, device="cuda")
        slopes = torch.from_numpy(pe.alibi_slopes(16)).to("cuda", torch.float32)
        out = torch.empty(16, length, length, device="cuda")
        embedding = torch.nn.Embedding.from_pretrained(table)
        positions = torch.arange(length, device="cuda")
        self.copy = lambda: out.fill_(1.0)
        self.fn = {
            "t5 eager": lambda: t5_compute_bias(torch, embedding, length, length),
            "t5 posenc out=": lambda: pe.t5_bias(table, length, length, out=out),
            "alibi eager": lambda: _bench_gpu.alibi_formula(slopes, positions),
            "alibi posenc out=": lambda: pe.alibi_bias(slopes, length, length, symmetric=True, out=out),
            "Tensor.fill_": self.copy,
        }[variant]

    def time_bias(self, length, variant):
        self.timed()

    def track_time_over_copy(self, length, variant):
        """Time in units of ``fill_`` of the same bytes (a bias is written, not read)."""
        return super().track_time_over_copy(length, variant)

    track_time_over_copy.unit = "fill times"


class GPUDecode(_GPUBenchmark):
    """A decode step ``[1, 32, 1, 128]`` with its position on the device: the eager formula from
    the position (about ten small kernels) against ``pe.rope`` (one launch); the copy is of the
    same bytes (a decode step is launch-bound: its time over the copy's is large for both)."""

    params = (["float32", "bfloat16"], ["torch eager", "posenc"])
    param_names = ["dtype", "variant"]

    def make(self, dtype, variant):
        import posenc as pe
        from posenc import _bench_gpu

        torch = self.torch
        x = torch.randn(1, 32, 1, 128, device="cuda").to(getattr(torch, dtype))
        buf = torch.empty_like(x)
        position = torch.tensor([4095], device="cuda")
        self.copy = lambda: buf.copy_(x)
        self.fn = {"torch eager": _bench_gpu.decode_formula(torch, x, position), "posenc": lambda: pe.rope(x, position)}[variant]

    def time_decode_step(self, dtype, variant):
        self.timed()


class GPUDecodePair(_GPUBenchmark):
    """A decode step of an attention layer's q ``[1, 32, 1, 128]`` and k ``[1, 8, 1, 128]``
    (transposed ``[b, s, h, d]`` views) by given ``cos``/``sin``: transformers' eager
    ``apply_rotary_pos_emb`` against posenc's drop-in (planned: one launch); the copy is of
    the same bytes."""

    params = (["float32", "bfloat16"], ["torch eager", "posenc"])
    param_names = ["dtype", "variant"]

    def make(self, dtype, variant):
        from posenc import _bench_gpu
        from posenc.torch.hf import apply_rotary_pos_emb

        torch = self.torch
        kind = getattr(torch, dtype)
        q = torch.randn(1, 1, 32, 128, device="cuda").to(kind).transpose(1, 2)
        k = torch.randn(1, 1, 8, 128, device="cuda").to(kind).transpose(1, 2)
        cos, sin = (t[None] for t in _bench_gpu._tables(torch, 1, 128, kind))
        source = torch.empty(q.numel() + k.numel(), device="cuda", dtype=kind)
        target = torch.empty_like(source)
        self.copy = lambda: target.copy_(source)
        self.fn = {"torch eager": lambda: _bench_gpu._hf_apply(q, k, cos, sin), "posenc": lambda: apply_rotary_pos_emb(q, k, cos, sin)}[variant]

    def time_decode_step(self, dtype, variant):
        self.timed()


class GPUJaxRope:
    """``rope`` under ``jax.jit`` on a JAX GPU array ``[B, H, S, D]`` float32 (a traced offset)
    beside the plain ``jnp`` formula under ``jit`` and XLA's own read and write of the same
    bytes (a negation under ``jit``: a copy would be elided); every call waits for its result
    (``block_until_ready``). Without JAX on a GPU ``setup`` raises ``NotImplementedError``."""

    timeout = 600
    warmup_time = 0.2
    params = (ROPE_SHAPES, ["jnp plain formula", "posenc", "jnp negation"])
    param_names = ["shape", "variant"]

    def setup(self, shape, variant):
        require("jax")
        from posenc import _bench_gpu

        found = _bench_gpu.jax_gpu_rope(tuple(int(n) for n in shape.split("x")))
        if found is None:
            raise NotImplementedError("JAX sees no GPU")
        calls, negate = found
        self.copy = lambda: negate(calls.jx).block_until_ready()
        self.fn = {"jnp plain formula": calls.plain_jit, "posenc": calls.jit, "jnp negation": self.copy}[variant]
        self.fn()  # compiles outside the timing

    def time_rope(self, shape, variant):
        self.fn()

    def track_time_over_copy(self, shape, variant):
        rope, copy = interleaved_best([self.fn, self.copy])
        return rope / copy

    track_time_over_copy.unit = "copy times"
