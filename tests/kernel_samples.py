"""The argument sets every registered kernel is compared with its reference on, by kernel name.

``SAMPLES[name](rng)`` yields ``(args, kwargs)`` the kernel accepts: host arrays (NumPy,
torch CPU) for CPU kernels and the torch autograd entries, Dask arrays for the Dask
blocks, and host arrays that ``on_gpu`` moves to the device for CUDA kernels (numba device
arrays on the CUDA simulator, keeping each view's strides; CuPy arrays on a real GPU).
``tests/test_kernels_match_reference.py`` fails for a registered kernel without samples.
Shared: the rotary samples cover both layouts, partial rotary, ``inverse``, ``scale``,
``out`` (``None``, a buffer, ``x`` itself), strided and transposed views, every dtype and
positions ``[S]``, ``[B, 1, S]`` and per token; the Toeplitz samples batch axes, one
query (decoding), one key, and transposed torch views whose batch axes do not merge.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np

from posenc import _dispatch

HOST_DTYPES = ("float16", "float32", "float64")
TORCH_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32", "torch.float64")


def _installed(module) -> bool:
    return importlib.util.find_spec(module) is not None


def _host_dtypes():
    return HOST_DTYPES + (TORCH_DTYPES if _installed("torch") else ())


def _make(data, dtype):
    """NumPy data as a NumPy array or torch tensor of ``dtype`` (``"torch.<name>"`` for torch)."""
    if dtype.startswith("torch."):
        import torch

        return torch.from_numpy(np.ascontiguousarray(data)).to(getattr(torch, dtype[6:]))
    return np.asarray(data).astype(dtype)


# ---------------------------------------------------------------- rotary


def _frequencies(half):
    return 10000.0 ** (-np.arange(half) / max(half, 1))


def _views(rng, dtype):
    """Contiguous ``[B, H, S, D]``, a strided slice and a transposed view."""
    b, h, s, d = 2, 3, 5, 10
    yield _make(rng.standard_normal((b, h, s, d)), dtype)
    big = _make(rng.standard_normal((b, h, 2 * s, d + 3)), dtype)
    yield big[:, :, ::2, 1 : d + 1]
    bshd = _make(rng.standard_normal((b, s, h, d)), dtype)
    yield bshd.permute(0, 2, 1, 3) if dtype.startswith("torch.") else bshd.transpose(0, 2, 1, 3)


def _positions(rng, x, like):
    """Positions ``[S]`` (int64), ``[B, 1, S]`` (int32) and per token (float32)."""
    b, h, s = x.shape[:3]
    yield _make(np.arange(s) + 7, like + "int64")
    yield _make(rng.integers(0, 1000, (b, 1, s)), like + "int32")
    yield _make(rng.integers(0, 1000, (b, h, s)).astype(np.float32), like + "float32")


def _out(x, kind):
    if kind == "none":
        return None
    if kind == "self":
        return x
    return x.clone() * 0 if hasattr(x, "clone") else np.zeros_like(x)


def _rotate(rng, dtypes):
    options = itertools.cycle(
        [
            dict(layout="half"),
            dict(layout="interleaved", inverse=True),
            dict(layout="half", scale=1.5),
            dict(layout="interleaved", scale=0.75, inverse=True),
        ]
    )
    outs = itertools.cycle(["none", "buffer", "self"])
    for dtype in dtypes:
        like = "torch." if dtype.startswith("torch.") else ""
        for x in _views(rng, dtype):
            for positions in _positions(rng, x, like):
                for rotary in (10, 4):  # full and partial rotary
                    yield (x, positions, _frequencies(rotary // 2)), dict(next(options), out=_out(x, next(outs)))


def _cos_sin(rng, x, rotary, layout, dtype, per_token):
    b, h, s = x.shape[:3]
    angle = rng.uniform(-50, 50, ((b, h, s) if per_token else (b, 1, s)) + (rotary // 2,))
    pairs = np.repeat(angle, 2, axis=-1) if layout == "interleaved" else np.concatenate([angle, angle], axis=-1)
    return _make(np.cos(pairs), dtype), _make(np.sin(pairs), dtype)


def _apply(rng, dtypes):
    layouts = itertools.cycle(["half", "interleaved"])
    outs = itertools.cycle(["none", "buffer", "self"])
    for dtype in dtypes:
        for x in _views(rng, dtype):
            for rotary, per_token in ((10, False), (6, True)):
                layout = next(layouts)
                cos, sin = _cos_sin(rng, x, rotary, layout, dtype, per_token)
                yield (x, cos, sin), dict(layout=layout, out=_out(x, next(outs)))


# ---------------------------------------------------------------- Toeplitz

# (leading batch shape, q_len, k_len): batch axes, one query (decoding), one key.
_SHAPES = (((3,), 4, 5), ((), 1, 6), ((2, 2), 5, 1), ((2,), 3, 3))
# The CUDA simulator runs every GPU thread as a Python thread: keep device samples small.
_DEVICE_SHAPES = (((2,), 3, 4), ((), 1, 5), ((2, 1), 4, 1))


def _clipped_index(q_len, k_len, max_distance):
    """Shaw's index ``clip(i - j, -K, K) + K`` per distance ``t = i - j + k_len - 1``."""
    rel = np.arange(q_len + k_len - 1) - (k_len - 1)
    return np.clip(rel, -max_distance, max_distance) + max_distance


def _toeplitz(op, rng, as_array, as_index, shapes):
    m = 5
    for lead, q_len, k_len in shapes:
        n = q_len + k_len - 1
        if op == "expand":
            vec = as_array(rng.standard_normal((*lead, n)))
            yield (vec, q_len, k_len), {}
            yield (vec, q_len, k_len), {"out": as_array(np.zeros((*lead, q_len, k_len)))}
        elif op == "gather":
            scores = as_array(rng.standard_normal((*lead, q_len, m)))
            yield (scores, as_index(_clipped_index(q_len, k_len, 2)), k_len), {}
            yield (scores, as_index(rng.integers(0, m, n)), k_len), {"out": as_array(np.zeros((*lead, q_len, k_len)))}
        else:
            # Attention weights are non-negative; the reference sums in the input dtype.
            weights = as_array(rng.random((*lead, q_len, k_len)))
            yield (weights, as_index(_clipped_index(q_len, k_len, 2)), m), {}
            yield (weights, as_index(rng.integers(0, m, n)), m), {"out": as_array(np.zeros((*lead, q_len, m)))}


def _numpy_makers():
    for dtype in HOST_DTYPES:
        yield (lambda a, dtype=dtype: np.asarray(a, dtype=dtype)), (lambda i: np.asarray(i, dtype=np.int64))
    yield (lambda a: np.asarray(a, dtype=np.float32)), (lambda i: np.asarray(i, dtype=np.int32))


def _torch_makers():
    if not _installed("torch"):
        return
    import torch

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        yield (lambda a, dtype=dtype: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)), (lambda i: torch.from_numpy(np.asarray(i, dtype=np.int64)))


def _torch_unmergeable(op, rng):
    """Transposed torch views (``clone`` keeps their strides) with batch axes that do not merge."""
    if not _installed("torch"):
        return
    import torch

    q_len, k_len, m = 3, 4, 5
    if op == "expand":
        vec = torch.from_numpy(rng.standard_normal((q_len + k_len - 1, 3))).T
        yield (vec, q_len, k_len), {"out": torch.zeros(k_len, q_len, 3, dtype=torch.float64).permute(2, 1, 0)}
        out = torch.zeros(3, 2, q_len, k_len, dtype=torch.float64).transpose(0, 1)
        yield (torch.from_numpy(rng.standard_normal((2, 3, q_len + k_len - 1))), q_len, k_len), {"out": out}
        return
    index = torch.from_numpy(rng.integers(0, m, q_len + k_len - 1))
    if op == "gather":
        scores = torch.from_numpy(rng.standard_normal((m, q_len, 2))).permute(2, 1, 0)
        yield (scores, index, k_len), {"out": torch.zeros(2, k_len, q_len, dtype=torch.float64).transpose(1, 2)}
    else:
        weights = torch.from_numpy(rng.random((k_len, q_len, 2))).permute(2, 1, 0)
        yield (weights, index, m), {"out": torch.zeros(2, m, q_len, dtype=torch.float64).transpose(1, 2)}


def _toeplitz_host(op):
    def samples(rng):
        for as_array, as_index in [*_numpy_makers(), *_torch_makers()]:
            yield from _toeplitz(op, rng, as_array, as_index, _SHAPES)
        yield from _torch_unmergeable(op, rng)

    return samples


def _toeplitz_device(op):
    def samples(rng):
        for as_array, as_index in _numpy_makers():
            yield from _toeplitz(op, rng, as_array, as_index, _DEVICE_SHAPES)

    return samples


# ---------------------------------------------------------------- T5 buckets


def _t5_buckets(rng):
    """Distances of a bias's per-distance vector (an arange across 0), random ones over the
    whole range of their dtype (its least and greatest included), a strided view and an
    empty one, under T5's own maps and small and large ones, both ways."""
    maps = [(32, 128, True), (32, 128, False), (2, 3, False), (4, 3, True), (64, 1000, True), (320, 10**6, False)]
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        arange = np.arange(-700, 300, dtype=dtype)
        spread = np.concatenate([rng.integers(info.min, info.max, 300, dtype=dtype, endpoint=True), [info.min, info.min + 1, info.max, 0, -1]]).astype(dtype)
        for num_buckets, max_distance, bidirectional in maps:
            for rel in (arange, spread, spread[::3] if bidirectional else arange[:0]):
                yield (rel,), {"num_buckets": num_buckets, "max_distance": max_distance, "bidirectional": bidirectional}


# ---------------------------------------------------------------- Dask blocks


def _dask_rotate(rng):
    import dask.array as da

    def inv_freq(dim, base):
        return 1.0 / base ** (np.arange(0, dim, 2) / dim)

    for dtype in (np.float64, np.float32, np.float16):
        # [N, d] with positions chunked alike; a feature axis split in two chunks.
        x = rng.standard_normal((10, 8)).astype(dtype)
        pos = rng.integers(0, 5000, 10)
        yield (da.from_array(x, chunks=(3, 8)), da.from_array(pos, chunks=3), inv_freq(8, 10000.0)), {}
        yield (da.from_array(x, chunks=(4, 4)), da.from_array(pos, chunks=5), inv_freq(8, 10000.0)), {"layout": "interleaved"}
    # [batch, heads, seq, d]: positions [seq] broadcast; partial rotary, inverse, a scale.
    xs = da.from_array(rng.standard_normal((2, 3, 7, 12)), chunks=(1, 2, 3, 12))
    yield (xs, da.from_array(np.arange(100, 107), chunks=4), inv_freq(8, 500.0)), {"inverse": True, "scale": 1.25}
    # Per-token float positions [batch, 1, seq] and a 0-d shift.
    fpos = da.from_array(rng.uniform(-50.0, 50.0, (2, 1, 7)), chunks=(1, 1, 4))
    yield (xs, fpos, inv_freq(12, 10000.0)), {"layout": "interleaved"}
    yield (xs, da.from_array(np.asarray(-3)), inv_freq(12, 10000.0)), {}


def _dask_rotate_at_length(rng):
    import dask.array as da

    import posenc as pe

    xs = da.from_array(rng.standard_normal((2, 3, 7, 12)), chunks=(1, 2, 3, 12))
    scalings = (pe.scaling.DynamicNTK(2.0, 4), pe.scaling.LongRoPE([1.0, 2.0, 3.0, 4.0], [4.0, 5.0, 6.0, 7.0], 4, factor=4.0))
    for scaling, layout, length in zip(scalings, ("half", "interleaved"), (9, 3)):
        positions = da.from_array(np.arange(7) * 3, chunks=4)
        options = {"scaling": scaling, "rotary_dim": 8, "base": 100.0, "layout": layout, "inverse": layout == "half"}
        yield (xs, positions, da.from_array(np.asarray(length))), options


def _dask_expand(rng):
    import dask.array as da

    for dtype in (np.float64, np.float32, np.float16):
        heads, q_len, k_len = 3, 7, 5
        vec = da.from_array(rng.standard_normal((heads, q_len + k_len - 1)).astype(dtype), chunks=(2, 4))
        yield (vec, q_len, k_len), {}
        yield (vec, q_len, k_len), {"out": da.zeros((heads, q_len, k_len), chunks=(1, 3, 2), dtype=dtype)}
    yield (da.from_array(rng.standard_normal(9), chunks=3), 1, 9), {"out": da.zeros((1, 9), chunks=(1, 4))}
    vec = da.from_array(rng.standard_normal((2, 2, 11)), chunks=(1, 2, 5))
    yield (vec, 6, 6), {"out": da.zeros((2, 2, 6, 6), chunks=(2, 1, 4, 1))}


# ---------------------------------------------------------------- torch autograd entries


def _grad_tensor(rng, shape, dtype="float64"):
    import torch

    return torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype), requires_grad=True)


def _autograd(op):
    def samples(rng):
        import torch

        if op == "rope_rotate":
            inv = 10000.0 ** (-np.arange(0, 6, 2) / 6)
            for layout in ("half", "interleaved"):
                for dtype in ("float32", "float64"):
                    x = _grad_tensor(rng, (2, 3, 5, 8), dtype)
                    yield (x, torch.arange(5), inv), {"layout": layout, "inverse": layout == "half", "scale": 1.25}
        elif op == "rope_rotate_at_length":
            import posenc as pe

            scalings = (pe.scaling.DynamicNTK(2.0, 4), pe.scaling.LongRoPE([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 4, factor=4.0))
            for scaling, layout, length in zip(scalings, ("half", "interleaved"), (9, 3)):
                options = {"scaling": scaling, "rotary_dim": 6, "base": 100.0, "layout": layout, "inverse": layout == "half"}
                yield (_grad_tensor(rng, (2, 3, 5, 8)), torch.arange(5), length), options
                yield (_grad_tensor(rng, (2, 3, 5, 8)), torch.arange(5), torch.tensor(length)), options  # computed in a compiled graph
        elif op == "rope_frequencies_at_length":
            import posenc as pe

            for scaling in (pe.scaling.DynamicNTK(2.0, 4), pe.scaling.LongRoPE([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 4, factor=4.0)):
                for lengths in (9, [[3], [40], [9]]):
                    yield (torch.tensor(lengths),), {"scaling": scaling, "rotary_dim": 6, "base": 100.0}
        elif op == "rope_apply":
            angles = rng.uniform(-3, 3, (5, 2))
            for layout in ("half", "interleaved"):
                dup = np.concatenate([angles, angles], -1) if layout == "half" else np.repeat(angles, 2, -1)
                yield (_grad_tensor(rng, (3, 5, 6)), torch.tensor(np.cos(dup)), torch.tensor(np.sin(dup))), {"layout": layout}
        elif op == "tupe_row_terms":
            every = torch.tensor(rng.integers(0, 6, (3, 1)) + np.arange(4))
            yield (_grad_tensor(rng, (10, 6)), every, _grad_tensor(rng, (2, 6, 5)), _grad_tensor(rng, (2, 6, 5)), 7, 0.25), {}
            yield (_grad_tensor(rng, (10, 6), "float32"), every, _grad_tensor(rng, (6, 5), "float32"), _grad_tensor(rng, (6, 5), "float32"), 7, 0.25), {}
        elif op == "tener_row_terms":
            yield (_grad_tensor(rng, (3, 2, 4, 6)), _grad_tensor(rng, (3, 7, 6))), {}
            yield (_grad_tensor(rng, (2, 1, 6), "float32"), _grad_tensor(rng, (2, 5, 6), "float32")), {}
        elif op == "toeplitz_expand":
            yield (_grad_tensor(rng, (2, 4 + 6 - 1)), 4, 6), {}
            yield (_grad_tensor(rng, (3, 1)), 1, 1), {}
        else:
            q, k, m = 4, 6, 5
            index = torch.tensor(rng.integers(0, m, q + k - 1))
            if op.endswith("_rows"):  # one index per row of the first axis
                index = torch.tensor(rng.integers(0, m, (3, q + k - 1)))
            if op.startswith("toeplitz_gather"):
                yield (_grad_tensor(rng, (3, 2, q, m)), index, k), {}
            else:
                yield (_grad_tensor(rng, (3, 2, q, k)), index, m), {}

    return samples


# ---------------------------------------------------------------- JAX CPU arrays


def _jax_cpu(op):
    """The NumPy samples of ``op``'s Numba CPU kernel as JAX CPU arrays: those without ``out``
    (JAX arrays are immutable), float64 only with x64; ``rope_rotate``'s frequencies stay host numbers."""

    def samples(rng):
        if not _installed("jax"):
            return
        import jax

        if op == "rope_rotate_at_length":  # a 0-d length on the CPU, read by the host call
            cpu = jax.devices("cpu")[0]
            for args, kwargs in SAMPLES["rope_rotate_at_length.torch_autograd"](rng):
                x, positions, length = args
                yield [jax.device_put(np.asarray(a.detach()), cpu) for a in (x.float(), positions)] + [jax.device_put(np.int32(length), cpu)], kwargs
            return
        host = {2} if op == "rope_rotate" else set()
        for args, kwargs in SAMPLES[f"{op}.numba_cpu"](rng):
            arrays = [a for i, a in enumerate(args) if hasattr(a, "shape") and i not in host]
            if kwargs.get("out") is not None or not all(isinstance(a, np.ndarray) for a in arrays):
                continue  # an out buffer, or torch tensors
            if any(a.dtype == np.float64 for a in arrays) and not jax.config.jax_enable_x64:
                continue
            # On JAX's CPU device: its default device is the GPU where JAX has one.
            cpu = jax.devices("cpu")[0]
            yield [jax.device_put(a, cpu) if i not in host and isinstance(a, np.ndarray) else a for i, a in enumerate(args)], dict(kwargs)

    return samples


SAMPLES = {
    "rope_rotate.numba_cpu": lambda rng: _rotate(rng, _host_dtypes()),
    "rope_apply.numba_cpu": lambda rng: _apply(rng, _host_dtypes()),
    "rope_rotate.numba_cuda": lambda rng: _rotate(rng, HOST_DTYPES),
    "rope_apply.numba_cuda": lambda rng: _apply(rng, HOST_DTYPES),
    **{f"toeplitz_{op}.numba_cpu": _toeplitz_host(op) for op in ("expand", "gather", "scatter")},
    **{f"toeplitz_{op}.numba_cuda": _toeplitz_device(op) for op in ("expand", "gather", "scatter")},
    "rope_rotate.dask_blocks": _dask_rotate,
    "rope_rotate_at_length.dask_blocks": _dask_rotate_at_length,
    "t5_buckets.numba_cuda": _t5_buckets,
    "toeplitz_expand.dask_blocks": _dask_expand,
    **{f"{op}.torch_autograd": _autograd(op) for op in ("rope_rotate", "rope_rotate_at_length", "rope_frequencies_at_length", "rope_apply", "toeplitz_expand", "toeplitz_gather", "toeplitz_scatter", "toeplitz_gather_rows", "toeplitz_scatter_rows", "tupe_row_terms", "tener_row_terms")},
    **{f"{op}.jax_cpu": _jax_cpu(op) for op in ("rope_rotate", "rope_rotate_at_length", "rope_apply", "toeplitz_expand", "toeplitz_gather", "toeplitz_scatter")},
}


# ---------------------------------------------------------------- moving samples to the GPU


def gpu_libraries():
    """The GPU array libraries the CUDA kernels are tested with here: numba device arrays on
    the CUDA simulator; CuPy arrays and torch CUDA tensors on a GPU (those installed)."""
    if _simulator():
        return ["numba"]
    found = []
    if _installed("cupy"):
        found.append("cupy")
    if _installed("torch"):
        import torch

        if torch.cuda.is_available():
            found.append("torch")
    return found or ["numba"]


def _simulator():
    import os

    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _device_copy(a, library):
    """A device copy of NumPy array ``a`` in ``library``, keeping ``a``'s strides where it is a view."""
    base = a if a.base is None else a.base
    if not (isinstance(base, np.ndarray) and base.dtype == a.dtype and base.flags.c_contiguous):
        base = a = np.ascontiguousarray(a)
    offset = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // a.itemsize
    steps = tuple(st // a.itemsize for st in a.strides)
    flat = base.reshape(-1)
    if library == "cupy":
        import cupy

        return cupy.lib.stride_tricks.as_strided(cupy.asarray(flat)[offset:], a.shape, tuple(st * a.itemsize for st in steps))
    if library == "torch":
        import torch

        return torch.from_numpy(flat).cuda().as_strided(a.shape, steps, offset)
    from numba import cuda

    from posenc._kernels import _arrays

    if flat.dtype.name == "bfloat16":  # (numba's copy to a GPU exports a buffer, which NumPy refuses for ml_dtypes' bfloat16)
        device = cuda.to_device(flat.view(np.uint16)).view(flat.dtype)
    else:
        device = cuda.to_device(flat)
    return _arrays.strided(device[offset:], a.shape, steps)


# Arguments that stay on the host by contract: rope_rotate's frequencies.
_HOST_ARGUMENTS = {"rope_rotate": (2,)}


def on_gpu(op, args, kwargs, library="numba"):
    """The sample's host arrays as ``library``'s device arrays, each object once (so ``out=x`` stays in place)."""
    copies = {}

    def move(a):
        if not isinstance(a, np.ndarray):
            return a
        if id(a) not in copies:
            copies[id(a)] = _device_copy(a, library)
        return copies[id(a)]

    keep = _HOST_ARGUMENTS.get(op, ())
    return [a if k in keep else move(a) for k, a in enumerate(args)], {k: move(v) for k, v in kwargs.items()}


def kernel(name):
    """The registered kernel ``name`` (e.g. ``"rope_rotate.numba_cpu"``)."""
    (found,) = [k for k in _dispatch.kernels() if k.name == name]
    return found
