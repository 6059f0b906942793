"""Bad input, one named table per family, all driving one test.

Each case is ``name: (call, error, fragments)``: ``call()`` must raise ``error`` (a ValueError
or TypeError, never anything else) whose message contains every fragment (the argument it
names, and the reason where the case states one), before any kernel is chosen (the public
functions validate; the kernel launchers' own checks have their table) and without Dask
computing anything. Sizes are refused before anything is allocated: the "too large" cases
would need terabytes. The kernel launchers' table runs again under the CUDA simulator and
with bounds checking (its cases carry the ``kernels`` mark).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import posenc as pe
from arrays import no_dask_compute
from kernel_samples import kernel
from posenc import _dispatch
from posenc._kernels import _arrays

S = pe.scaling
Z = np.zeros
X4 = Z((2, 3, 5, 8), dtype=np.float32)  # [batch, heads, seq, d]
X = Z((2, 3, 8), dtype=np.float32)
Q, K = Z((2, 4, 8)), Z((2, 6, 8))
T5_TABLE, SLOPES = Z((32, 2)), np.ones(2)
INV_FREQ = 10000.0 ** (-np.arange(4) / 4)
COS, SIN = pe.rope_cos_sin(np.arange(3), INV_FREQ)
GRID = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 2)  # 2 x 3 tokens


class _PlainScaling(pe.scaling.Scaling):
    """A user's scaling that is no dataclass: frequencies / factor."""

    def __init__(self, factor):
        self.factor = factor

    def frequencies(self, dim, base, seq_len=None):
        return pe.rope_frequencies(dim, base=base)[0] / self.factor, 1.0


def _torch():
    return pytest.importorskip("torch")


def _jax():
    return pytest.importorskip("jax")


def _da():
    return pytest.importorskip("dask.array")


def _within(context):
    with context:
        pass


def _readonly(a):
    a.flags.writeable = False
    return a


def _nested_torch():
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (torch: nested tensors of the strided layout are a prototype)
        return torch.nested.nested_tensor([torch.ones(3, 8), torch.ones(5, 8)])


def _overlapping_torch_rope():
    t = _torch().zeros(2, 6, 8)
    return pe.rope(t[:, :5], out=t[:, 1:])


def _strict_on_two_devices():
    strict = pytest.importorskip("array_api_strict")
    a = strict.asarray(Z((4, 2)), device=strict.Device("CPU_DEVICE"))
    return pe.apply_absolute(a, strict.asarray(Z((4, 2)), device=strict.Device("device1")))


def _float64_on_no_float64(build):
    """``build(strict, device, strict.float64)`` on array-api-strict's ``no_float64`` device."""
    strict = pytest.importorskip("array_api_strict")
    return build(strict, strict.Device("no_float64"), strict.float64)


def _int64_on_no_x64(build):
    """``build(strict, device, strict.int64)`` on array-api-strict's ``no_x64`` device."""
    strict = pytest.importorskip("array_api_strict")
    return build(strict, strict.Device("no_x64"), strict.int64)


def _cpu(name, *args, **kwargs):
    return kernel(f"{name}.numba_cpu").load()(*args, **kwargs)


def _cuda(name, *args, **kwargs):
    if not _arrays.numba_cuda():
        pytest.skip("no GPU and no CUDA simulator (NUMBA_ENABLE_CUDASIM=1) here")
    from numba import cuda

    args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    return kernel(f"{name}.numba_cuda").load()(*args, **kwargs)


def _no_gpu_warmup():
    if _arrays.numba_cuda():
        pytest.skip("a GPU (or the CUDA simulator) is here")
    pe.warmup(gpu=True)


def _hf_model(name):
    pytest.importorskip("transformers")
    from hf_models import build

    return build(name)


def _nested_rotary(**kwargs):
    return _posenc_torch().HFRotaryEmbedding(_hf_model("gemma3_text[nested]").config, **kwargs)


def _gpt2():
    _torch()
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0))


def _posenc_torch():
    _torch()
    import posenc.torch

    return posenc.torch


def _torch_module(name, *args, **kwargs):
    return getattr(_posenc_torch(), name)(*args, **kwargs)


ABSOLUTE = {
    "sinusoidal odd dim": (lambda: pe.sinusoidal(4, 7), ValueError, "dim"),
    "sinusoidal zero dim": (lambda: pe.sinusoidal(4, 0), ValueError, "dim"),
    "sinusoidal float dim": (lambda: pe.sinusoidal(4, 4.0), TypeError, "dim"),
    "sinusoidal negative length": (lambda: pe.sinusoidal(-3, 8), ValueError, "positions"),
    "sinusoidal float length": (lambda: pe.sinusoidal(4.5, 4), TypeError, "positions"),
    "sinusoidal nan positions": (lambda: pe.sinusoidal(np.array([1.0, np.nan]), 8), ValueError, "positions"),
    "sinusoidal string positions": (lambda: pe.sinusoidal(np.array(["a"]), 4), TypeError, "positions"),
    "sinusoidal unknown layout": (lambda: pe.sinusoidal(4, 8, layout="diagonal"), ValueError, "layout"),
    "sinusoidal zero base": (lambda: pe.sinusoidal(4, 8, base=0.0), ValueError, "base"),
    "sinusoidal negative base": (lambda: pe.sinusoidal(4, 4, base=-2.0), ValueError, "base"),
    "sinusoidal integer dtype": (lambda: pe.sinusoidal(4, 8, dtype=np.int32), TypeError, "dtype"),
    "hierarchical beyond n*n": (lambda: pe.hierarchical_extend(Z((4, 2)), 17), ValueError, "length"),
    "hierarchical negative length": (lambda: pe.hierarchical_extend(np.ones((5, 2)), -1), ValueError, "length"),
    "hierarchical alpha 1": (lambda: pe.hierarchical_extend(Z((4, 2)), 8, alpha=1.0), ValueError, "alpha"),
    "hierarchical negative alpha": (lambda: pe.hierarchical_extend(np.ones((5, 2)), 4, alpha=-0.1), ValueError, "alpha"),
    "hierarchical integer table": (lambda: pe.hierarchical_extend(np.ones((5, 2), dtype=np.int64), 4), TypeError, "table"),
    # (NumPy's MemoryError, torch's RuntimeError)
    "hierarchical too long": (lambda: pe.hierarchical_extend(np.broadcast_to(np.ones(1), (2**20, 4)), 2**40), ValueError, "memory"),
    "hierarchical torch too long": (lambda: pe.hierarchical_extend(_torch().zeros(2**16, 4), 2**32), ValueError, "memory"),
    "floater negative length": (lambda: pe.floater(-1, 4), ValueError, "length"),
    "floater odd dim": (lambda: pe.floater(4, 3), ValueError, "dim"),
    "floater too wide": (lambda: pe.floater(4, 2**40), ValueError, "memory"),
    "floater too long": (lambda: pe.floater(2**40, 4), ValueError, "memory"),
    "complex_order too large": (lambda: pe.complex_order(*[np.broadcast_to(np.ones(1), (2**20, 2**18))] * 3, np.zeros((2**20, 1))), ValueError, "memory"),
    "apply_absolute too large": (lambda: pe.apply_absolute(np.broadcast_to(np.ones(1), (2**20, 2**20, 8)), np.ones((2**20, 8))), ValueError, "memory"),
    "floater zero step": (lambda: pe.floater(4, 4, step=0.0), ValueError, "step"),
    "floater zero substeps": (lambda: pe.floater(4, 8, substeps=0), ValueError, "substeps"),
    "floater dynamics a string": (lambda: pe.floater(4, 8, dynamics="rk4"), TypeError, "dynamics"),
    "floater dynamics a number": (lambda: pe.floater(4, 4, dynamics=3), TypeError, "dynamics"),
    "floater p0 of another width": (lambda: pe.floater(4, 4, p0=Z(3)), ValueError, "p0"),
    # dynamics returning another shape than p: the state grew an axis per RK4 stage (IndexError
    # at 65 axes) or hit NumPy's broadcast error, neither naming dynamics
    "floater dynamics adds an axis": (lambda: pe.floater(3, 4, dynamics=lambda p, t: p[None, :]), ValueError, "dynamics"),
    "floater dynamics of another width": (lambda: pe.floater(3, 4, dynamics=lambda p, t: p[:2]), ValueError, "dynamics"),
    "floater dynamics returns a list": (lambda: pe.floater(3, 2, dynamics=lambda p, t: [0.0, 1.0]), TypeError, "dynamics"),
    # a complex derivative made the state complex, returned as its real part (a ComplexWarning only)
    "floater dynamics returns complex": (lambda: pe.floater(3, 2, dynamics=lambda p, t: 1j * p, p0=np.ones(2)), TypeError, "must return a real array"),
    "apply_absolute table too short": (lambda: pe.apply_absolute(Z((5, 8)), Z((6, 8)), offset=2), ValueError, "table"),
    "apply_absolute table width": (lambda: pe.apply_absolute(Z((4, 6)), Z((10, 5))), ValueError, "table"),
    "apply_absolute negative offset": (lambda: pe.apply_absolute(Z((4, 6)), Z((10, 6)), offset=-1), ValueError, "offset"),
    # (an offset of None was taken for no offset at all: AttributeError here, int()'s TypeError in rope)
    "apply_absolute offset None": (lambda: pe.apply_absolute(Z((4, 6)), Z((10, 6)), offset=None), TypeError, "offset"),
    "apply_absolute unknown mode": (lambda: pe.apply_absolute(Z((5, 8)), Z((6, 8)), mode="concat"), ValueError, "mode"),
    "apply_absolute integer x": (lambda: pe.apply_absolute(Z((5, 8), dtype=int), Z((6, 8))), TypeError, "x"),
    "apply_absolute torch 0-d offset on the meta device": (
        lambda: pe.apply_absolute(_torch().ones(1, 3, 8), _torch().ones(8, 8), offset=_torch().tensor(2, device="meta")), ValueError, ("offset", "meta"),
    ),  # fmt: skip
    "apply_absolute JAX x, torch table": (lambda: pe.apply_absolute(_jax().numpy.zeros((5, 8)), _torch().zeros(6, 8)), TypeError, "different kinds"),
    "apply_absolute torch x, JAX table": (lambda: pe.apply_absolute(_torch().zeros(4, 6), _jax().numpy.zeros((4, 6))), TypeError, "different kinds"),
    "complex_order parameters do not broadcast": (
        lambda: pe.complex_order(np.ones(4), np.ones(3), np.ones(4), np.arange(2)), ValueError, "broadcast",
    ),
    "complex_order positions do not broadcast": (
        lambda: pe.complex_order(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), np.arange(5)), ValueError, "broadcast",
    ),
    "complex_order integer amplitude": (
        lambda: pe.complex_order(np.ones(4, dtype=int), np.ones(4), np.ones(4), np.arange(5)), TypeError, "amplitude",
    ),
    # A list or a number where an array goes is named (it had been "arrays of different kinds
    # in one call: builtins.list", naming no argument).
    "apply_absolute list table": (lambda: pe.apply_absolute(Z((4, 6)), [[0.0] * 6] * 10), TypeError, "table must be an array"),
    "complex_order list positions": (lambda: pe.complex_order(Z(4), Z(4), Z(4), [[0], [1]]), TypeError, "positions must be an array"),
    "conv_positions list kernel": (lambda: pe.conv_positions(Z((5, 4)), [[1.0] * 4] * 3), TypeError, "kernel must be an array"),
    "hierarchical_extend list table": (lambda: pe.hierarchical_extend([[0.0] * 4] * 4, 8), TypeError, "table must be an array"),
    "conv_positions even kernel width": (lambda: pe.conv_positions(Z((5, 4)), Z((2, 4))), ValueError, ("kernel", "odd")),
    "conv_positions kernel columns": (lambda: pe.conv_positions(Z((4, 3)), Z((3, 2))), ValueError, "columns"),
}

RELATIVE_BIASES = {
    "relative_positions negative q_len": (lambda: pe.relative_positions(-1, 3), ValueError, "q_len"),
    "relative_positions float k_len": (lambda: pe.relative_positions(2, 3.5), TypeError, "k_len"),
    "relative_positions integral float k_len": (lambda: pe.relative_positions(2, 3.0), TypeError, "k_len"),
    "relative_positions too large": (lambda: pe.relative_positions(10**7, 10**7), ValueError, "memory"),
    "relative_positions offset below int64": (lambda: pe.relative_positions(1, 8, offset=-(2**63)), ValueError, ("offset", "int64")),
    "relative_positions offset past int64": (lambda: pe.relative_positions(3, 1, offset=2**63 - 2), ValueError, ("offset", "int64")),
    "t5_bias offset below int64": (lambda: pe.t5_bias(T5_TABLE, 1, 8, offset=-(2**63) + 6), ValueError, ("offset", "int64")),
    "t5_bias offset past int64": (lambda: pe.t5_bias(T5_TABLE, 2, 8, offset=2**63 - 1), ValueError, ("offset", "int64")),
    "alibi_bias offset below int64": (lambda: pe.alibi_bias(SLOPES, 1, 8, offset=-(2**63) + 3), ValueError, ("offset", "int64")),
    "relative_bias_vector offset below int64": (lambda: pe.relative_bias_vector("alibi", SLOPES, 1, 8, offset=-(2**63)), ValueError, ("offset", "int64")),
    "kerple_bias offset below int64": (lambda: pe.kerple_bias(SLOPES, SLOPES, 1, 8, offset=-(2**63)), ValueError, ("offset", "int64")),
    "sandwich_bias offset below int64": (lambda: pe.sandwich_bias(1, 8, 4, offset=-(2**63)), ValueError, ("offset", "int64")),
    # Positions that are not arrays had been dropped: the call gave the bias of no positions.
    "kerple_bias list key_positions": (lambda: pe.kerple_bias(SLOPES, SLOPES, 3, 4, key_positions=[0, 1, 2, 3]), TypeError, "key_positions must be an array"),
    "sandwich_bias list query_positions": (lambda: pe.sandwich_bias(3, 4, 8, query_positions=[0, 5, 9]), TypeError, "query_positions must be an array"),
    "cope_positions list k": (lambda: pe.cope_positions(Z((3, 4)), [[0.0] * 4] * 3), TypeError, "k must be an array"),
    "cope_logits list pos_emb": (lambda: pe.cope_logits(Z((3, 4)), Z((3, 4)), [[0.0] * 4] * 4), TypeError, "pos_emb must be an array"),
    "fire_distances list query_positions": (lambda: pe.fire_distances(3, 4, query_positions=[0, 5, 9]), TypeError, "query_positions"),
    "fire_distances tuple key_positions": (lambda: pe.fire_distances(3, 4, key_positions=(7, 7, 7, 7)), TypeError, "key_positions"),
    "fire_bias list query_positions": (lambda: pe.fire_bias(lambda d: d, 3, 4, query_positions=[0, 5, 9]), TypeError, "query_positions"),
    "fire_distances offset past int64": (lambda: pe.fire_distances(2, 8, offset=2**63 - 1), ValueError, ("offset", "int64")),
    # A 0-d offset on another device, not read now (torch's RuntimeError once computing).
    **{
        f"{name} torch 0-d offset on the meta device": (call, ValueError, ("offset", "meta"))
        for name, call in (
            ("t5_bias", lambda: pe.t5_bias(_torch().ones(32, 2), 1, 8, offset=_torch().tensor(3, device="meta"))),
            ("alibi_bias", lambda: pe.alibi_bias(_torch().ones(2), 1, 8, offset=_torch().tensor(3, device="meta"))),
            ("kerple_bias", lambda: pe.kerple_bias(_torch().ones(2), _torch().ones(2), 1, 8, offset=_torch().tensor(3, device="meta"))),
            ("fire_bias", lambda: pe.fire_bias(lambda d: d, 1, 8, offset=_torch().tensor(3, device="meta"), xp=_torch(), device="cpu")),
        )
    },
    # A uint64 0-d offset past int64 in a torch call (torch's int() of it raised RuntimeError).
    "alibi_bias torch, NumPy uint64 offset past int64": (
        lambda: pe.alibi_bias(_torch().ones(2), 1, 8, offset=np.array(2**63, np.uint64)), ValueError, ("offset", "int64"),
    ),  # fmt: skip
    "t5_bias torch uint64 offset past int64": (
        lambda: pe.t5_bias(_torch().ones(32, 2), 1, 8, offset=_torch().tensor(-1).view(_torch().uint64)), ValueError, ("offset", "int64"),
    ),  # fmt: skip
    "clip_relative float rel": (lambda: pe.clip_relative(np.array([0.5]), 4), TypeError, "rel"),
    "clip_relative list rel": (lambda: pe.clip_relative([1, 2], 2), TypeError, "rel"),
    "clip_relative negative max_distance": (lambda: pe.clip_relative(np.arange(3), -1), ValueError, "max_distance"),
    "clip_relative float max_distance": (lambda: pe.clip_relative(np.array([1]), 2.0), TypeError, "max_distance"),
    "t5_bucket float rel": (lambda: pe.t5_bucket(np.array([1.5])), TypeError, "rel"),
    "t5_bucket one bucket": (lambda: pe.t5_bucket(np.arange(3), num_buckets=1), ValueError, "num_buckets"),
    # A broadcast rel costs nothing; a result of its shape would not fit.
    "clip_relative too large": (lambda: pe.clip_relative(np.broadcast_to(np.int64(3), (2**50,)), 2), ValueError, "memory"),
    "t5_bucket too large": (lambda: pe.t5_bucket(np.broadcast_to(np.int64(3), (2**50,))), ValueError, "memory"),
    "deberta_bucket too large": (lambda: pe.deberta_bucket(np.broadcast_to(np.int64(3), (2**50,))), ValueError, "memory"),
    "t5_bucket two buckets": (lambda: pe.t5_bucket(np.arange(5), num_buckets=2), ValueError, "num_buckets"),
    "t5_bucket 3 buckets bidirectional": (lambda: pe.t5_bucket(np.arange(3), num_buckets=3), ValueError, "num_buckets"),
    "t5_bucket float num_buckets": (lambda: pe.t5_bucket(np.arange(5), num_buckets=32.0), TypeError, "num_buckets"),
    "t5_bucket max_distance too small": (lambda: pe.t5_bucket(np.arange(3), num_buckets=32, max_distance=8), ValueError, "max_distance"),
    "t5_bucket max_distance too small, one direction": (
        lambda: pe.t5_bucket(np.arange(5), bidirectional=False, num_buckets=32, max_distance=16), ValueError, "max_distance",
    ),
    "t5_bucket zero max_distance": (lambda: pe.t5_bucket(np.arange(5), max_distance=0), ValueError, "max_distance"),
    "t5_bucket integer bidirectional": (lambda: pe.t5_bucket(np.arange(5), bidirectional=1), TypeError, "bidirectional"),
    "deberta_bucket float rel": (lambda: pe.deberta_bucket(np.arange(5.0)), TypeError, "rel"),
    "deberta_bucket bucket_size 1": (lambda: pe.deberta_bucket(np.arange(3), bucket_size=1), ValueError, "bucket_size"),
    "deberta_bucket float bucket_size": (lambda: pe.deberta_bucket(np.arange(5), bucket_size=8.0), TypeError, "bucket_size"),
    "deberta_bucket zero max_position": (lambda: pe.deberta_bucket(np.arange(5), max_position=0), ValueError, "max_position"),
    "t5_bias table 1-D": (lambda: pe.t5_bias(Z(32), 4, 4), ValueError, "table"),
    "t5_bias integer table": (lambda: pe.t5_bias(Z((32, 2), dtype=np.int64), 3, 4), TypeError, "table"),
    "t5_bias list table": (lambda: pe.t5_bias([0.0] * 32, 3, 4), TypeError, "table"),
    "t5_bias 3 buckets": (lambda: pe.t5_bias(Z((3, 2)), 3, 4), ValueError, "num_buckets"),
    "t5_bucket 2**24 buckets": (lambda: pe.t5_bucket(np.arange(5), num_buckets=2**24, max_distance=2**30), ValueError, "num_buckets must be at most 65536"),
    "t5_bias 2**17 buckets": (lambda: pe.t5_bias(Z((2**17, 1)), 3, 4, max_distance=2**20), ValueError, "num_buckets must be at most 65536"),
    "t5_bias negative q_len": (lambda: pe.t5_bias(T5_TABLE, -1, 4), ValueError, "q_len"),
    "t5_bias negative k_len": (lambda: pe.t5_bias(T5_TABLE, 4, -4), ValueError, "k_len"),
    "t5_bias float k_len": (lambda: pe.t5_bias(T5_TABLE, 3, 4.0), TypeError, "k_len"),
    "t5_bias float offset": (lambda: pe.t5_bias(T5_TABLE, 3, 4, offset=0.5), TypeError, "offset"),
    "t5_bias max_distance too small": (lambda: pe.t5_bias(T5_TABLE, 3, 4, max_distance=8), ValueError, "max_distance"),
    "t5_bias out wrong shape": (lambda: pe.t5_bias(T5_TABLE, 4, 4, out=Z((2, 4, 5))), ValueError, "out"),
    "t5_bias out wrong dtype": (lambda: pe.t5_bias(T5_TABLE, 4, 4, out=Z((2, 4, 4), dtype=np.float32)), ValueError, "out"),
    "t5_bias out on JAX": (
        lambda: pe.t5_bias(_jax().numpy.ones((32, 2)), 3, 4, out=_jax().numpy.zeros((2, 3, 4))), TypeError, "out is not supported for JAX",
    ),
    "expand_bias out on JAX": (
        lambda: pe.expand_bias(_jax().numpy.ones((2, 6)), 3, 4, out=_jax().numpy.zeros((2, 3, 4))), TypeError, "out is not supported for JAX",
    ),
    "t5_bias too large": (lambda: pe.t5_bias(T5_TABLE, 10**6, 10**6), ValueError, "memory"),
    "t5_bias q_len a 0-d float array": (lambda: pe.t5_bias(T5_TABLE, np.asarray(2.0), 4), TypeError, "q_len"),
    "t5_bias q_len a 1-d array": (lambda: pe.t5_bias(T5_TABLE, np.arange(2), 4), TypeError, "q_len"),
    "t5_bias q_len a 0-d bool array": (lambda: pe.t5_bias(T5_TABLE, np.asarray(True), 4), TypeError, "q_len"),
    "t5_bias q_len a negative 0-d array": (lambda: pe.t5_bias(T5_TABLE, np.asarray(-1), 4), ValueError, "q_len"),
    "t5_bias q_len traced by jax.jit": (
        lambda: _jax().jit(lambda n: pe.t5_bias(_jax().numpy.ones((32, 2)), n, 4))(_jax().numpy.asarray(3)),
        TypeError,
        "q_len must be a concrete integer",
    ),
    "t5_bias chunks for a NumPy table": (lambda: pe.t5_bias(T5_TABLE, 3, 4, chunks=(1, 2, 2)), TypeError, "chunks"),
    "t5_bias chunks of two axes": (lambda: pe.t5_bias(_da().from_array(T5_TABLE), 3, 4, chunks=(1, 2)), ValueError, "chunks"),
    "t5_bias chunks and out": (
        lambda: pe.t5_bias(_da().from_array(T5_TABLE), 3, 4, chunks=(1, 2, 2), out=_da().zeros((2, 3, 4))), ValueError, "chunks or out",
    ),
    "t5_bias Dask table 1-D": (lambda: pe.t5_bias(_da().ones(32), 3, 3), ValueError, "table"),
    "t5_bias Dask out wrong shape": (lambda: pe.t5_bias(_da().ones((32, 2)), 3, 3, out=_da().zeros((2, 3, 4))), ValueError, "out"),
    "alibi_slopes zero heads": (lambda: pe.alibi_slopes(0), ValueError, "num_heads"),
    "alibi_slopes negative heads": (lambda: pe.alibi_slopes(-3), ValueError, "num_heads"),
    "alibi_slopes float heads": (lambda: pe.alibi_slopes(4.0), TypeError, "num_heads"),
    "alibi_slopes bool heads": (lambda: pe.alibi_slopes(True), TypeError, "num_heads"),
    "alibi_slopes zero max_bias": (lambda: pe.alibi_slopes(4, max_bias=0.0), ValueError, "max_bias"),
    "alibi_slopes negative max_bias": (lambda: pe.alibi_slopes(4, max_bias=-1.0), ValueError, "max_bias"),
    "alibi_slopes nan max_bias": (lambda: pe.alibi_slopes(4, max_bias=float("nan")), ValueError, "max_bias"),
    "alibi_bias 2-D slopes": (lambda: pe.alibi_bias(np.ones((2, 2)), 3, 3), ValueError, "slopes"),
    "alibi_bias integer slopes": (lambda: pe.alibi_bias(np.ones(2, dtype=int), 3, 3), TypeError, "slopes"),
    "alibi_bias string symmetric": (lambda: pe.alibi_bias(SLOPES, 3, 3, symmetric="yes"), TypeError, "symmetric"),
    "alibi_bias float offset": (lambda: pe.alibi_bias(SLOPES, 3, 3, offset=1.5), TypeError, "offset"),
    "alibi_bias out wrong shape": (lambda: pe.alibi_bias(SLOPES, 3, 3, out=np.ones((2, 3))), ValueError, "out"),
    "alibi_bias out on JAX": (
        lambda: pe.alibi_bias(_jax().numpy.ones(2), 3, 3, out=_jax().numpy.zeros((2, 3, 3))), TypeError, "out is not supported for JAX",
    ),
    "alibi_bias query_positions of another length": (
        lambda: pe.alibi_bias(SLOPES, 3, 3, query_positions=Z((2, 4), dtype=int)), ValueError, "query_positions",
    ),
    "alibi_bias key_positions do not broadcast": (
        lambda: pe.alibi_bias(SLOPES, 3, 3, query_positions=Z((2, 3), dtype=int), key_positions=Z((4, 3), dtype=int)), ValueError, "key_positions",
    ),
    "alibi_bias query and key batches do not broadcast": (
        lambda: pe.alibi_bias(SLOPES, 3, 3, key_positions=Z((2, 3), dtype=int), query_positions=Z((3, 3), dtype=int)), ValueError, "broadcast",
    ),
    "alibi_bias nan key_positions": (lambda: pe.alibi_bias(SLOPES, 3, 3, key_positions=np.array([0.0, np.nan, 1.0])), ValueError, "key_positions"),
    "alibi_bias bool key_positions": (lambda: pe.alibi_bias(SLOPES, 3, 3, key_positions=Z(3, dtype=bool)), TypeError, "key_positions"),
    "alibi_bias per-token positions with chunks": (
        lambda: pe.alibi_bias(SLOPES, 3, 3, key_positions=Z(3, dtype=int), chunks=(1, 1, 1)), ValueError, "chunks",
    ),
    "alibi_bias too large": (lambda: pe.alibi_bias(np.ones(4), 2**40, 2**40), ValueError, "memory"),
    "alibi_bias per-token too large": (
        lambda: pe.alibi_bias(np.ones(4), 2**20, 2**20, key_positions=Z((2**20,), dtype=np.int64)), ValueError, "memory",
    ),
    # A missing position's arange (q_len or k_len of them) had been built before the result
    # was checked: NumPy's MemoryError, torch's RuntimeError (DefaultCPUAllocator).
    "t5_bias per-token too large, no query positions": (
        lambda: pe.t5_bias(T5_TABLE, 2**40, 1, key_positions=Z((1,), dtype=np.int64)), ValueError, "memory",
    ),
    "t5_bias one offset per row too large": (lambda: pe.t5_bias(T5_TABLE, 1, 2**40, offset=np.array([1, 2])), ValueError, "memory"),
    "t5_bias torch per-token too large": (
        lambda: pe.t5_bias(_torch().ones(32, 2), 1, 2**40, query_positions=_torch().zeros(1, dtype=_torch().int64)), ValueError, "memory",
    ),
    "kerple_bias per-token too large": (lambda: pe.kerple_bias(SLOPES, SLOPES, 1, 2**40, query_positions=Z((1,), dtype=np.int64)), ValueError, "memory"),
    "sandwich_bias per-token too large": (lambda: pe.sandwich_bias(1, 2**40, 4, query_positions=Z((1,), dtype=np.int64)), ValueError, "memory"),
    "fire_distances too large": (lambda: pe.fire_distances(2**40, 1), ValueError, "memory"),
    "fire_distances per-token too large": (lambda: pe.fire_distances(1, 2**40, query_positions=Z((1,), dtype=np.int64)), ValueError, "memory"),
    "shaw_logits per-token too large": (
        lambda: pe.shaw_logits(Z((1, 1)), np.broadcast_to(Z((1, 1)), (2**40, 1)), Z((5, 1)), max_distance=2, query_positions=Z((1,), dtype=np.int64)),
        ValueError,
        "memory",
    ),
    "alibi_bias negative chunk": (lambda: pe.alibi_bias(_da().ones(2), 3, 4, chunks=(1, 2, -5)), ValueError, "chunks (1, 2, -5) do not describe blocks"),
    "alibi_bias chunks a word": (lambda: pe.alibi_bias(_da().ones(2), 3, 4, chunks="bogus"), ValueError, "chunks"),
    "relative_bias_vector unknown kind": (lambda: pe.relative_bias_vector("rotary", SLOPES, 3, 3), ValueError, "kind"),
    "relative_bias_vector shaw without max_distance": (lambda: pe.relative_bias_vector("shaw", np.ones((5, 2)), 3, 4), TypeError, "max_distance"),
    "relative_bias_vector shaw table rows": (
        lambda: pe.relative_bias_vector("shaw", np.ones((6, 2)), 3, 4, max_distance=2), ValueError, "table",
    ),
    "relative_bias_vector shaw with bucket_size": (
        lambda: pe.relative_bias_vector("shaw", np.ones((5, 2)), 3, 4, max_distance=2, bucket_size=4), TypeError, "bucket_size",
    ),
    "relative_bias_vector deberta table rows": (
        lambda: pe.relative_bias_vector("deberta", np.ones((5, 2)), 3, 4, max_distance=2), ValueError, "table",
    ),
    "relative_bias_vector deberta max_position without bucket_size": (
        lambda: pe.relative_bias_vector("deberta", np.ones((4, 2)), 3, 4, max_distance=2, max_position=8), ValueError, "max_position",
    ),
    "relative_bias_vector deberta zero max_distance": (
        lambda: pe.relative_bias_vector("deberta", np.ones((4, 2)), 3, 4, max_distance=0), ValueError, "max_distance",
    ),
    "relative_bias_vector t5 table without heads": (lambda: pe.relative_bias_vector("t5", np.ones((4, 0)), 3, 4), ValueError, "table"),
    "relative_bias_vector alibi list slopes": (lambda: pe.relative_bias_vector("alibi", [1.0], 3, 4), TypeError, "slopes"),
    "relative_bias_vector too large": (lambda: pe.relative_bias_vector("t5", np.ones((32, 4)), 2**40, 2**40), ValueError, "memory"),
    "expand_bias vec length": (lambda: pe.expand_bias(np.ones((2, 5)), 3, 4), ValueError, "vec"),
    "expand_bias list vec": (lambda: pe.expand_bias([1.0] * 6, 3, 4), TypeError, "vec"),
    "expand_bias too large": (lambda: pe.expand_bias(np.ones((8, 2 * 10**6 - 1)), 10**6, 10**6), ValueError, "memory"),
    "expand_bias chunks for a NumPy vec": (lambda: pe.expand_bias(Z((1, 6)), 3, 4, chunks=(1, 2, 2)), TypeError, "chunks"),
    "t5_bias float query_positions": (lambda: pe.t5_bias(T5_TABLE, 1, 3, query_positions=np.array([0.5])), TypeError, "query_positions"),
    "t5_bias key_positions of another length": (
        lambda: pe.t5_bias(T5_TABLE, 1, 3, key_positions=np.arange(4)), ValueError, ("key_positions", "k_len = 3"),
    ),
    "t5_bias torch table, JAX key_positions": (
        lambda: pe.t5_bias(_torch().zeros(32, 2), 1, 3, key_positions=_jax().numpy.arange(3)), TypeError, ("different kinds", "jax", "torch", "xp="),
    ),
    "t5_bias torch table, NumPy out": (
        lambda: pe.t5_bias(_torch().zeros(32, 2), 2, 3, out=Z((2, 2, 3))), TypeError, ("different kinds", "numpy", "torch"),
    ),
    "relative_bias Dask table, torch key_positions": (
        lambda: pe.relative_bias("t5", _da().ones((32, 2)), 1, 3, key_positions=_torch().arange(3)), TypeError, "different kinds",
    ),
    "t5_bias per-token too large": (
        lambda: pe.t5_bias(T5_TABLE, 2**20, 2**20, key_positions=Z((2**20,), dtype=np.int64)), ValueError, "memory",
    ),
    "attention causal a string": (lambda: pe.attention(Q, Q, Q, causal="no"), TypeError, "causal must be a bool"),
    "attention list v": (lambda: pe.attention(Q, Q, Q.tolist()), TypeError, "v must be an array"),
    "attention list mask": (lambda: pe.attention(Q, Q, Q, mask=[[True] * 4] * 4), TypeError, "mask must be an array"),
    "attention number bias": (lambda: pe.attention(Q, Q, Q, bias=0.0), TypeError, "bias must be an array"),
    "attention integer mask": (lambda: pe.attention(Q, Q, Q, mask=np.ones((4, 4), dtype=int)), TypeError, "mask must be a boolean"),
    "attention mask of another length": (lambda: pe.attention(Q, Q, Q, mask=np.ones(5, dtype=bool)), ValueError, "mask of shape (5,)"),
    "attention torch q, JAX mask": (
        lambda: pe.attention(*(_torch().zeros(4, 8),) * 3, mask=_jax().numpy.ones((4, 4), dtype=bool)), TypeError, ("different kinds", "jax", "torch"),
    ),
}

RELATIVE_LOGITS = {
    "nezha_table too large": (lambda: pe.nezha_table(2**31, 2**31), ValueError, "memory"),  # (MemoryError before)
    "nezha_table negative max_distance": (lambda: pe.nezha_table(-1, 4), ValueError, "max_distance"),
    "nezha_table float max_distance": (lambda: pe.nezha_table(2.0, 4), TypeError, "max_distance"),
    "nezha_table odd dim": (lambda: pe.nezha_table(2, 3), ValueError, "dim"),
    "nezha_table unknown form": (lambda: pe.nezha_table(2, 4, form="x"), ValueError, "form"),
    "shaw_logits k of another head dim": (lambda: pe.shaw_logits(Q, Z((2, 6, 7)), Z((5, 8)), max_distance=2), ValueError, "k"),
    "shaw_logits head dimensions differ": (
        lambda: pe.shaw_logits(Z((2, 3, 4)), Z((2, 5, 6)), Z((5, 4)), max_distance=2), ValueError, "head dimension",
    ),
    "shaw_logits table_k rows": (lambda: pe.shaw_logits(Q, K, Z((4, 8)), max_distance=2), ValueError, "table_k"),
    "shaw_logits sparse torch q": (
        lambda: pe.shaw_logits(_torch().ones(1, 2, 4).to_sparse(), _torch().ones(1, 3, 4), _torch().ones(7, 4), max_distance=3), TypeError, "q must be a dense",
    ),  # fmt: skip
    "shaw_logits table_k width": (lambda: pe.shaw_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((5, 3)), max_distance=2), ValueError, "table_k"),
    "shaw_logits batches differ": (lambda: pe.shaw_logits(Z((2, 3, 4)), Z((3, 5, 4)), Z((5, 4)), max_distance=2), ValueError, "batch"),
    "shaw_logits negative max_distance": (
        lambda: pe.shaw_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((5, 4)), max_distance=-2), ValueError, "max_distance",
    ),
    "shaw_logits float offset": (
        lambda: pe.shaw_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((5, 4)), max_distance=2, offset=0.5), TypeError, "offset",
    ),
    "shaw_logits 1-D q": (lambda: pe.shaw_logits(Z(4), Z((2, 5, 4)), Z((5, 4)), max_distance=2), ValueError, "q"),
    "shaw_logits integer table_k": (
        lambda: pe.shaw_logits(Z((3, 4)), Z((5, 4)), Z((5, 4), dtype=np.int64), max_distance=2), TypeError, "table_k",
    ),
    "shaw_logits list q": (lambda: pe.shaw_logits([[0.0]], Z((5, 1)), Z((5, 1)), max_distance=2), TypeError, "q"),
    "shaw_logits too large": (
        lambda: pe.shaw_logits(np.broadcast_to(Z((1, 1)), (10**6, 1)), np.broadcast_to(Z((1, 1)), (10**6, 1)), Z((5, 1)), max_distance=2),
        ValueError,
        "memory",
    ),
    "shaw_output v rows": (lambda: pe.shaw_output(Z((3, 5)), Z((4, 2)), Z((5, 2)), max_distance=2), ValueError, "v"),
    "shaw_output table_v width": (lambda: pe.shaw_output(Z((3, 5)), Z((5, 2)), Z((5, 3)), max_distance=2), ValueError, "table_v"),
    "shaw_output integer weights": (
        lambda: pe.shaw_output(Z((3, 5), dtype=np.int64), Z((5, 2)), Z((5, 2)), max_distance=2), TypeError, "weights",
    ),
    "rel_shift 1-D": (lambda: pe.rel_shift(Z(4)), ValueError, "x"),
    "rel_shift list": (lambda: pe.rel_shift([[1.0]]), TypeError, "x"),
    "xl_logits longer queries than keys": (
        lambda: pe.xl_logits(Z((2, 6, 4)), Z((2, 5, 4)), Z((2, 5, 4)), Z((2, 1, 4)), Z((2, 1, 4))), ValueError, "q_len",
    ),
    "xl_logits r rows": (lambda: pe.xl_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 1, 4)), Z((2, 1, 4))), ValueError, "r"),
    "xl_logits r width": (lambda: pe.xl_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 5, 3)), Z((2, 1, 4)), Z((2, 1, 4))), ValueError, "r"),
    "xl_logits u heads": (lambda: pe.xl_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 5, 4)), Z((3, 1, 4)), Z((2, 1, 4))), ValueError, "u"),
    "xl_logits v width": (lambda: pe.xl_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 5, 4)), Z((2, 1, 4)), Z((2, 1, 5))), ValueError, "v"),
    "xl_logits head dimensions differ": (
        lambda: pe.xl_logits(Z((2, 3, 4)), Z((2, 5, 3)), Z((2, 5, 4)), Z((2, 1, 4)), Z((2, 1, 4))), ValueError, "head dimension",
    ),
    "segment_logits float segments": (
        lambda: pe.segment_logits(Z((2, 3, 4)), Z(3), Z(5, dtype=int), *[Z((2, 1, 4))] * 3), TypeError, "seg_q",
    ),
    "segment_logits seg_q length": (
        lambda: pe.segment_logits(Z((2, 3, 4)), Z(4, dtype=int), Z(5, dtype=int), *[Z((2, 1, 4))] * 3), ValueError, "seg_q",
    ),
    "segment_logits s_diff width": (
        lambda: pe.segment_logits(Z((2, 3, 4)), Z(3, dtype=int), Z(5, dtype=int), Z((2, 1, 4)), Z((2, 1, 3)), Z((2, 1, 4))), ValueError, "s_diff",
    ),
    "segment_logits segment batches differ": (
        lambda: pe.segment_logits(Z((2, 2, 3, 4)), Z((3, 3), dtype=int), Z((2, 5), dtype=int), *[Z((2, 1, 4))] * 3), ValueError, "seg_q",
    ),
    "tener_logits odd head dim": (lambda: pe.tener_logits(Z((2, 3)), Z((2, 3)), Z((1, 3)), Z((1, 3))), ValueError, "even"),
    "tener_logits zero base": (lambda: pe.tener_logits(Z((1, 3, 4)), Z((1, 3, 4)), Z((1, 1, 4)), Z((1, 1, 4)), base=0.0), ValueError, "base"),
    "tener_logits unknown layout": (
        lambda: pe.tener_logits(Z((1, 3, 4)), Z((1, 3, 4)), Z((1, 1, 4)), Z((1, 1, 4)), layout="zigzag"), ValueError, "layout",
    ),
    "tener_logits u heads": (lambda: pe.tener_logits(Z((1, 3, 4)), Z((1, 3, 4)), Z((2, 1, 4)), Z((1, 1, 4))), ValueError, "u"),
    "deberta_logits pos_q rows": (lambda: pe.deberta_logits(Q, K, Z((2, 5, 8)), Z((2, 6, 8)), max_distance=3), ValueError, "pos_q"),
    "deberta_logits pos_q rows of another max_distance": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 6, 4)), Z((2, 4, 4)), max_distance=2), ValueError, "pos_q",
    ),
    "deberta_logits needed pos_q missing": (
        lambda: pe.deberta_logits(np.ones((2, 3, 4)), np.ones((2, 5, 4)), None, np.ones((2, 4, 4)), max_distance=2, terms=("p2c",)),
        ValueError,
        "pos_q",
    ),
    "deberta_logits zero max_distance": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=0), ValueError, "max_distance",
    ),
    "deberta_logits float max_distance": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=2.5), TypeError, "max_distance",
    ),
    "deberta_logits bucket_size 1": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=2, bucket_size=1), ValueError, "bucket_size",
    ),
    "deberta_logits max_position without bucket_size": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=2, max_position=10),
        ValueError,
        "max_position",
    ),
    "deberta_logits terms not a subset": (
        lambda: pe.deberta_logits(Q, K, Z((2, 6, 8)), Z((2, 6, 8)), max_distance=3, terms=("c2p", "p2p")), ValueError, "terms",
    ),
    "deberta_logits repeated terms": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=2, terms=("c2p", "c2p")), ValueError, "terms",
    ),
    "deberta_logits terms a string": (
        lambda: pe.deberta_logits(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 4, 4)), Z((2, 4, 4)), max_distance=2, terms="c2p"), TypeError, "terms",
    ),
    "tupe_logits p rows": (lambda: pe.tupe_logits(Z((2, 3, 4)), Z((2, 3, 4)), Z((2, 5)), Z((2, 5, 4)), Z((2, 5, 4))), ValueError, "p"),
    "tupe_logits uq shape": (lambda: pe.tupe_logits(Z((2, 3, 4)), Z((2, 3, 4)), Z((3, 5)), Z((2, 4, 4)), Z((2, 5, 4))), ValueError, "uq"),
    "tupe_logits bias shape": (
        lambda: pe.tupe_logits(Z((2, 3, 4)), Z((2, 3, 4)), Z((3, 5)), Z((2, 5, 4)), Z((2, 5, 4)), bias=Z((3, 3, 3))), ValueError, "bias",
    ),
    "tupe_logits cls a number": (lambda: pe.tupe_logits(Q, K, Z((6, 8)), np.eye(8), np.eye(8), cls=3.0), TypeError, "cls"),
    "tupe_logits offset past int64": (lambda: pe.tupe_logits(Q, K, Z((6, 8)), np.eye(8), np.eye(8), offset=2**63 - 2), ValueError, ("offset", "int64")),
    "cope_positions offset below int64": (lambda: pe.cope_positions(Q, K, offset=-(2**63)), ValueError, ("offset", "int64")),
    "shaw_logits offset below int64": (
        lambda: pe.shaw_logits(Q, K, Z((5, 8)), max_distance=2, offset=-(2**63)), ValueError, ("offset", "int64"),
    ),
    "tupe_logits cls[0] per head of another count": (
        lambda: pe.tupe_logits(Z((2, 3, 4)), Z((2, 3, 4)), Z((3, 5)), Z((2, 5, 4)), Z((2, 5, 4)), cls=(Z(3), 0.0)), ValueError, "cls[0]",
    ),
    "tupe_logits head dimensions differ": (
        lambda: pe.tupe_logits(Z((2, 3, 4)), Z((2, 3, 5)), Z((3, 5)), Z((2, 5, 4)), Z((2, 5, 4))), ValueError, "head dimension",
    ),
    "shaw_logits torch q and k, JAX table_k": (
        lambda: pe.shaw_logits(_torch().zeros(2, 3, 4), _torch().zeros(2, 5, 4), _jax().numpy.zeros((9, 4)), max_distance=4), TypeError, ("different kinds", "jax", "torch"),
    ),
    "deberta_logits JAX pos_q among torch": (
        lambda: pe.deberta_logits(_torch().zeros(2, 3, 4), _torch().zeros(2, 5, 4), _jax().numpy.zeros((2, 4, 4)), _torch().zeros(2, 4, 4), max_distance=2),
        TypeError, ("different kinds", "jax", "torch"),
    ),
    "xl_logits JAX r among torch": (
        lambda: pe.xl_logits(_torch().zeros(2, 3, 4), _torch().zeros(2, 5, 4), _jax().numpy.zeros((2, 8, 4)), _torch().zeros(2, 1, 4), _torch().zeros(2, 1, 4)),
        TypeError, ("different kinds", "jax", "torch"),
    ),
    "shaw_logits float key_positions": (
        lambda: pe.shaw_logits(Q, K, Z((5, 8)), max_distance=2, key_positions=np.arange(6.0)), TypeError, "key_positions must have an integer dtype",
    ),
    "shaw_logits positions batch against q": (
        lambda: pe.shaw_logits(Z((2, 1, 4, 8)), Z((2, 1, 6, 8)), Z((5, 8)), max_distance=2, key_positions=Z((3, 6), dtype=int)),
        ValueError, ("query_positions/key_positions", "batch axes of q and k"),
    ),
    "deberta_logits query_positions of another length": (
        lambda: pe.deberta_logits(Q, K, Z((2, 6, 8)), Z((2, 6, 8)), max_distance=3, query_positions=np.arange(5)),
        ValueError, ("query_positions", "q_len = 4"),
    ),
}

ROTARY = {
    "rope_frequencies odd dim": (lambda: pe.rope_frequencies(7), ValueError, "dim"),
    "rope_frequencies zero dim": (lambda: pe.rope_frequencies(0), ValueError, "dim"),
    "rope_frequencies float dim": (lambda: pe.rope_frequencies(8.0), TypeError, "dim"),
    "rope_frequencies too large": (lambda: pe.rope_frequencies(2**50), ValueError, "memory"),
    "rope_frequencies negative base": (lambda: pe.rope_frequencies(8, base=-1.0), ValueError, "base"),
    "rope_frequencies scaling a string": (lambda: pe.rope_frequencies(8, scaling="yarn"), TypeError, "scaling"),
    "rope_frequencies negative seq_len": (lambda: pe.rope_frequencies(8, seq_len=-1), ValueError, "seq_len"),
    "rope_frequencies float seq_len": (lambda: pe.rope_frequencies(8, seq_len=2.5), TypeError, "seq_len"),
    "rope_frequencies NTK on dim 2": (lambda: pe.rope_frequencies(2, scaling=S.NTK(2.0)), ValueError, "dim"),
    "rope_frequencies LongRoPE lists of another length": (
        lambda: pe.rope_frequencies(8, scaling=S.LongRoPE([1.0] * 3, [1.0] * 3, 16)), ValueError, "short_factor",
    ),
    "rope_frequencies integer dtype": (lambda: pe.rope_frequencies(8, xp=np, dtype=np.int32), TypeError, "dtype"),
    "rope_cos_sin list positions": (lambda: pe.rope_cos_sin([0, 1], INV_FREQ), TypeError, "positions"),
    "rope_cos_sin infinite positions": (lambda: pe.rope_cos_sin(np.array([0.0, np.inf]), INV_FREQ), ValueError, "positions"),
    "rope_cos_sin unknown layout": (lambda: pe.rope_cos_sin(np.arange(3), INV_FREQ, layout="zigzag"), ValueError, "layout"),
    "rope_cos_sin nan inv_freq": (lambda: pe.rope_cos_sin(np.arange(3), np.array([1.0, np.nan])), ValueError, "inv_freq"),
    "rope_cos_sin 3-D inv_freq": (lambda: pe.rope_cos_sin(np.arange(3), np.ones((2, 2, 2))), ValueError, "inv_freq"),  # 2-D: one set per row
    # (NumPy's cast to float64 dropped the imaginary parts; float() of a complex tensor raised RuntimeError)
    "rope_cos_sin complex inv_freq": (lambda: pe.rope_cos_sin(np.arange(3), np.array([1.0, 0.5j])), TypeError, "inv_freq"),
    "rope_cos_sin complex inv_freq list": (lambda: pe.rope_cos_sin(np.arange(3), [1.0, 0.5 + 0j]), TypeError, "inv_freq"),
    "rope_cos_sin complex torch inv_freq": (lambda: pe.rope_cos_sin(_torch().arange(3), _torch().tensor([1.0, 0.5j])), TypeError, "inv_freq"),
    "rerotate complex inv_freq": (lambda: pe.rerotate(X, 1, np.array([1.0, 0.5j])), TypeError, "inv_freq"),
    "rerotate complex new_inv_freq": (lambda: pe.rerotate(X, 1, INV_FREQ, new_inv_freq=INV_FREQ + 0j), TypeError, "new_inv_freq"),
    "rope_cos_sin integer dtype": (lambda: pe.rope_cos_sin(np.arange(3), INV_FREQ, dtype=np.int64), TypeError, "dtype"),
    "rope_cos_sin inv_freq of another device library": (
        lambda: pe.rope_cos_sin(_jax().numpy.arange(3), _torch().ones(2, dtype=_torch().float64)), TypeError, "arrays of different kinds",
    ),
    "rope_cos_sin too large": (
        lambda: pe.rope_cos_sin(np.broadcast_to(np.arange(2**21), (2**21, 2**21)), [1.0] * 8), ValueError, "memory",
    ),
    "mrope_cos_sin too large": (
        lambda: pe.mrope_cos_sin(np.broadcast_to(np.arange(2**21), (3, 2**21, 2**21)), [1.0] * 8, [4, 2, 2]), ValueError, "memory",
    ),
    "mrope_cos_sin sections do not sum": (lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0] * 4, [1, 1, 1]), ValueError, "sections"),
    "mrope_cos_sin sections sum to more": (
        lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0, 0.5, 0.25, 0.1], [2, 2, 2]), ValueError, "sections must sum",
    ),
    "mrope_cos_sin a row per section": (
        lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0, 0.5, 0.25, 0.1], [3, 1]), ValueError, "one row per section",
    ),
    "mrope_cos_sin float section": (
        lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0, 0.5, 0.25, 0.1], [2, 2.0, 0]), TypeError, "sections[1]",
    ),
    "mrope_cos_sin negative section": (
        lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0, 0.5, 0.25, 0.1], [5, -1, 0]), ValueError, "sections[1]",
    ),
    "mrope_cos_sin sections a string": (lambda: pe.mrope_cos_sin(Z((3, 4), dtype=int), [1.0, 0.5, 0.25, 0.1], "223"), TypeError, "sections"),
    "mrope_cos_sin bool positions": (
        lambda: pe.mrope_cos_sin(Z((3, 4), dtype=bool), [1.0, 0.5, 0.25, 0.1], [2, 1, 1]), TypeError, "positions",
    ),
    "apply_rope integer x": (lambda: pe.apply_rope(X.astype(np.int32), COS, SIN), TypeError, "x"),
    "apply_rope cos narrower than sin": (lambda: pe.apply_rope(X, COS[:, :6], SIN), ValueError, "cos"),
    "apply_rope cos/sin wider than sin": (lambda: pe.apply_rope(X, np.ones((3, 6)), np.ones((3, 4))), ValueError, "sin"),
    "apply_rope odd rotary width": (lambda: pe.apply_rope(X, COS[:, :5], SIN[:, :5]), ValueError, "rotary"),
    "apply_rope cos/sin wider than x": (lambda: pe.apply_rope(X[..., :4], COS, SIN), ValueError, "rotary"),
    "apply_rope cos/sin of other positions": (lambda: pe.apply_rope(X, COS[:2], SIN[:2]), ValueError, "cos"),
    "apply_rope unknown layout": (lambda: pe.apply_rope(X, COS, SIN, layout="gptj"), ValueError, "layout"),
    "apply_rope out wrong dtype": (lambda: pe.apply_rope(X, COS, SIN, out=Z((2, 3, 8))), ValueError, "out"),
    "apply_rope out wrong shape": (lambda: pe.apply_rope(X, COS, SIN, out=Z((2, 3, 4), dtype=np.float32)), ValueError, "out"),
    "apply_rope integer cos": (lambda: pe.apply_rope(X, COS.astype(np.int64), SIN), TypeError, "cos"),
    "apply_rope out on JAX": (
        lambda: pe.apply_rope(*(_jax().numpy.asarray(a, dtype="float32") for a in (np.ones((3, 8)), COS, SIN)), out=_jax().numpy.ones((3, 8))),
        TypeError,
        "out",
    ),
    "rope integer x": (lambda: pe.rope(X.astype(np.int64)), TypeError, "x"),
    "rope odd rotary_dim": (lambda: pe.rope(X, rotary_dim=5), ValueError, "rotary_dim"),
    "rope rotary_dim too big": (lambda: pe.rope(X, rotary_dim=10), ValueError, "rotary_dim"),
    "rope odd head dim": (lambda: pe.rope(Z((3, 7), dtype=np.float32)), ValueError, "rotary_dim"),
    "rope positions do not broadcast": (lambda: pe.rope(X, np.arange(4)), ValueError, "positions"),
    "rope nan positions": (lambda: pe.rope(X, np.array([0.0, np.nan, 1.0])), ValueError, "positions"),
    "rope infinite positions": (lambda: pe.rope(X4, positions=np.full(5, np.inf)), ValueError, "positions"),
    "rope string positions": (lambda: pe.rope(X, np.array(["a", "b", "c"])), TypeError, "positions"),
    "rope seq_axis the feature axis": (lambda: pe.rope(X, seq_axis=-1), ValueError, "seq_axis"),
    "rope offset None": (lambda: pe.rope(X, offset=None), TypeError, "offset"),
    "rope positions, offset None": (lambda: pe.rope(X, np.arange(3), offset=None), TypeError, "offset"),
    "rope seq_axis out of range": (lambda: pe.rope(X, seq_axis=3), ValueError, "seq_axis"),
    "rope float offset": (lambda: pe.rope(X, offset=1.5), TypeError, "offset"),
    "rope offset beyond int64": (lambda: pe.rope(X, offset=2**70), ValueError, ("offset", "int64")),
    "rope offset whose positions pass int64": (lambda: pe.rope(X, offset=2**63 - 2), ValueError, ("offset", "int64")),
    "rope sparse torch x": (lambda: pe.rope(_torch().ones(2, 5, 8).to_sparse()), TypeError, ("x must be a dense", "to_dense")),
    "rope nested torch x": (
        lambda: pe.rope(_nested_torch()), TypeError, ("x must be a dense", "nested"),
    ),  # fmt: skip
    "rope torch, NumPy uint64 offset past int64": (
        lambda: pe.rope(_torch().ones(2, 3, 8), offset=np.array(2**64 - 1, np.uint64)), ValueError, ("offset", "int64"),
    ),  # fmt: skip
    "rope offset a 0-d float array": (lambda: pe.rope(X4, offset=np.asarray(2.0)), TypeError, "offset"),
    "rope integer inverse": (lambda: pe.rope(X, inverse=1), TypeError, "inverse"),
    "rope zero base": (lambda: pe.rope(X, base=0.0), ValueError, "base"),
    "rope unknown layout": (lambda: pe.rope(X4, layout="quarter"), ValueError, "layout"),
    "rope scaling a dict": (lambda: pe.rope(X, scaling={"factor": 2}), TypeError, "scaling"),
    # A Scaling subclass that is no dataclass: named, not fields()'s "must be called with a dataclass type or instance".
    "rope scaling of a plain Scaling subclass": (lambda: pe.rope(X, scaling=_PlainScaling(2.0)), TypeError, ("scaling", "_PlainScaling", "dataclass")),
    "rope_frequencies scaling of a plain Scaling subclass": (lambda: pe.rope_frequencies(8, scaling=_PlainScaling(2.0)), TypeError, ("scaling", "_PlainScaling", "dataclass")),
    "rerotate scaling of a plain Scaling subclass": (
        lambda: pe.rerotate(X, 1, scaling=_PlainScaling(2.0), seq_len=4), TypeError, ("scaling", "_PlainScaling", "dataclass"),
    ),  # fmt: skip
    "rope LongRoPE lists of another length": (
        lambda: pe.rope(Z((2, 6), dtype=np.float32), scaling=S.LongRoPE([1.0] * 2, [1.0] * 2, 4)), ValueError, "short_factor",
    ),
    "rope torch 0-d seq_len on the meta device": (
        lambda: pe.rope(_torch().ones(1, 3, 8), scaling=S.DynamicNTK(2.0, 4), seq_len=_torch().tensor(30, device="meta")), ValueError, ("seq_len", "meta"),
    ),  # fmt: skip
    "rope seq_len per row of the wrong length": (lambda: pe.rope(X4, scaling=S.DynamicNTK(2.0, 4), seq_len=np.arange(3)), ValueError, "seq_len"),
    "rope seq_len per row of floats": (lambda: pe.rope(X4, scaling=S.DynamicNTK(2.0, 4), seq_len=np.ones(2)), TypeError, "seq_len"),
    "rope out wrong dtype": (lambda: pe.rope(X, out=Z((2, 3, 8))), ValueError, "out"),
    "rope out a list": (lambda: pe.rope(X, out=[0.0]), TypeError, "out"),
    "rope out overlaps x": (lambda: pe.rope(X4, out=X4[:, ::-1]), ValueError, "overlaps"),
    "rope torch out overlaps x": (_overlapping_torch_rope, ValueError, "overlaps"),
    "rope torch out for NumPy x": (lambda: pe.rope(X4, out=_torch().zeros(*X4.shape)), TypeError, "out"),
    "rope NumPy out for torch x": (lambda: pe.rope(_torch().zeros(2, 3, 8), out=Z((2, 3, 8), dtype=np.float32)), TypeError, "out"),
    "rope torch x, JAX positions": (lambda: pe.rope(_torch().zeros(2, 3, 8), _jax().numpy.arange(3)), TypeError, "different kinds"),
    "rope Dask x, torch positions": (lambda: pe.rope(_da().ones((5, 4), chunks=2), _torch().arange(5)), TypeError, "different kinds"),
    "rope Dask positions do not broadcast": (lambda: pe.rope(_da().ones((5, 4), chunks=2), _da().arange(4)), ValueError, "positions"),
    "rope NumPy out for Dask x": (lambda: pe.rope(_da().ones((5, 4), chunks=2), out=Z((5, 4))), TypeError, "out"),
    "rope Dask out wrong shape": (lambda: pe.rope(_da().ones((5, 4), chunks=2), out=_da().zeros((5, 2))), ValueError, "out"),
    "rope integer Dask x": (lambda: pe.rope(_da().ones((5, 4), dtype=int)), TypeError, "x must have a real floating dtype"),
    "rope out on JAX": (lambda: pe.rope(_jax().numpy.ones((3, 4)), out=_jax().numpy.ones((3, 4))), TypeError, "out is not supported for JAX"),
    "rope JAX x, torch positions": (lambda: pe.rope(_jax().numpy.ones((3, 4)), _torch().arange(3)), TypeError, "different kinds"),
    "rope traced positions do not broadcast": (
        lambda: _jax().jit(lambda a, p: pe.rope(a, p))(_jax().numpy.ones((3, 4)), _jax().numpy.arange(4)), ValueError, "positions",
    ),
    "rope traced integer x": (
        lambda: _jax().jit(pe.rope)(_jax().numpy.ones((3, 4), dtype="int32")), TypeError, "x must have a real floating dtype",
    ),
    "rerotate traced inv_freq": (
        lambda: _jax().jit(lambda f: pe.rerotate(_jax().numpy.ones((3, 4)), 1, f))(_jax().numpy.ones(2)),
        TypeError,
        "inv_freq must hold concrete values",
    ),
    "rerotate inv_freq that requires grad": (
        lambda: pe.rerotate(_torch().zeros(3, 4), 1, _torch().ones(2, requires_grad=True)), TypeError, ["inv_freq requires grad", "detach()"],
    ),
    "rerotate integer x": (lambda: pe.rerotate(Z((4, 8), dtype=np.int64), 1, np.ones(2)), TypeError, "x"),
    "rerotate inv_freq of another length": (lambda: pe.rerotate(Z((4, 8)), 1, np.ones(5)), ValueError, "inv_freq"),
    "rerotate delta of another length": (lambda: pe.rerotate(Z((4, 8)), np.arange(3), np.ones(2)), ValueError, "delta"),
    "rerotate delta a string": (lambda: pe.rerotate(Z((4, 8)), "1", np.ones(2)), TypeError, "delta"),
    "rerotate new_inv_freq of another length": (
        lambda: pe.rerotate(Z((4, 8)), 1, np.ones(2), new_inv_freq=np.ones(3)), ValueError, "new_inv_freq",
    ),
    "rerotate new_inv_freq of another library": (
        lambda: pe.rerotate(Z((3, 4)), 1, np.ones(2), new_inv_freq=_torch().ones(2)), TypeError, "new_inv_freq",
    ),
    "rerotate unknown layout": (lambda: pe.rerotate(Z((4, 8)), 1, np.ones(2), layout="pairs"), ValueError, "layout"),
    "convert_layout unknown dst": (lambda: pe.convert_layout(Z((2, 6)), "half", "neox"), ValueError, "dst"),
    "convert_layout dst a typo": (lambda: pe.convert_layout(X, "half", "interleave"), ValueError, "dst"),
    "convert_layout unknown src": (lambda: pe.convert_layout(Z((2, 6)), "gptj", "half"), ValueError, "src"),
    "convert_layout rotary_dim too big": (lambda: pe.convert_layout(Z((2, 6)), "half", "interleaved", rotary_dim=8), ValueError, "rotary_dim"),
    "convert_layout odd width": (lambda: pe.convert_layout(Z((2, 7)), "half", "interleaved"), ValueError, "rotary_dim"),
    "convert_layout list x": (lambda: pe.convert_layout([1.0, 2.0], "half", "interleaved"), TypeError, "x"),
    "permute_qk_weight rows not heads of head_dim": (
        lambda: pe.permute_qk_weight(Z((10, 4)), "interleaved", "half", head_dim=8), ValueError, "w",
    ),
    "permute_qk_weight rows not a multiple of head_dim": (
        lambda: pe.permute_qk_weight(Z((10, 3)), "half", "interleaved", head_dim=4), ValueError, "head_dim",
    ),
    "permute_qk_weight odd head_dim": (lambda: pe.permute_qk_weight(Z((8, 3)), "half", "interleaved", head_dim=3), ValueError, "head_dim"),
    "permute_qk_weight rotary_dim too big": (
        lambda: pe.permute_qk_weight(Z((8, 3)), "half", "interleaved", head_dim=4, rotary_dim=6), ValueError, "rotary_dim",
    ),
    "positions_from_mask float mask": (lambda: pe.positions_from_mask(np.ones((2, 3), dtype=np.float32)), TypeError, "mask"),
    "positions_from_mask 1-D float mask": (lambda: pe.positions_from_mask(np.array([0.5, 1.0])), TypeError, "mask"),
    "positions_from_mask list": (lambda: pe.positions_from_mask([[1, 1]]), TypeError, "mask"),
    "positions_from_mask float start": (lambda: pe.positions_from_mask(np.ones(3, dtype=bool), start=0.5), TypeError, "start"),
    "positions_from_cu_seqlens short of total": (lambda: pe.positions_from_cu_seqlens(np.array([0, 3, 5]), 6), ValueError, "cu_seqlens"),
    "positions_from_cu_seqlens not from 0": (lambda: pe.positions_from_cu_seqlens(np.array([1, 3, 5]), 5), ValueError, "cu_seqlens"),
    "positions_from_cu_seqlens decreasing": (lambda: pe.positions_from_cu_seqlens(np.array([0, 5, 3]), 5), ValueError, "cu_seqlens"),
    "positions_from_cu_seqlens decreasing inside": (
        lambda: pe.positions_from_cu_seqlens(np.array([0, 4, 3, 5]), 5), ValueError, "cu_seqlens",
    ),
    "positions_from_cu_seqlens float": (lambda: pe.positions_from_cu_seqlens(np.array([0.0, 5.0]), 5), TypeError, "cu_seqlens"),
    "positions_from_cu_seqlens 2-D": (lambda: pe.positions_from_cu_seqlens(np.array([[0, 5]]), 5), ValueError, "cu_seqlens"),
    "positions_from_cu_seqlens negative total": (lambda: pe.positions_from_cu_seqlens(np.array([0, 5]), -1), ValueError, "total"),
    "rope_decay odd dim": (lambda: pe.rope_decay(10, 7), ValueError, "dim"),
    "rope_decay negative count": (lambda: pe.rope_decay(-1, 8), ValueError, "distances"),
    "rope_decay float count": (lambda: pe.rope_decay(2.5, 8), TypeError, "distances"),
    "rope_decay nan distances": (lambda: pe.rope_decay(np.array([np.nan]), 8), ValueError, "distances"),
    "rope_decay zero base": (lambda: pe.rope_decay(4, 8, base=0.0), ValueError, "base"),
    "linear_attention q and k widths differ": (lambda: pe.linear_attention(Z((5, 8)), Z((5, 4)), Z((5, 2))), ValueError, "q and k"),
    "linear_attention k and v lengths differ": (lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((4, 2))), ValueError, "k and v"),
    "linear_attention batch axes that do not broadcast": (
        lambda: pe.linear_attention(Z((2, 5, 8)), Z((2, 5, 8)), Z((3, 5, 2))), ValueError, ("q of shape", "v of shape"),
    ),  # fmt: skip
    "linear_attention torch batch axes that do not broadcast": (
        lambda: pe.linear_attention(_torch().ones(2, 5, 8), _torch().ones(3, 5, 8), _torch().ones(3, 5, 2)), ValueError, ("q of shape", "k of shape"),
    ),  # fmt: skip
    "linear_attention causal running sums too large": (
        lambda: pe.linear_attention(Z((1, 8)), np.broadcast_to(Z(8), (2**20, 8)), np.broadcast_to(Z(1), (2**20, 2**30)), causal=True),
        ValueError, "memory",
    ),  # fmt: skip
    "linear_attention causal with more queries than keys": (
        lambda: pe.linear_attention(Z((5, 8)), Z((3, 8)), Z((3, 2)), causal=True), ValueError, "causal",
    ),
    "linear_attention causal a string": (lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((5, 2)), causal="yes"), TypeError, "causal"),
    "linear_attention unknown feature map": (
        lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((5, 2)), feature_map="relu6"), ValueError, "feature_map",
    ),
    "linear_attention unknown feature map of Q and K": (lambda: pe.linear_attention(Q, K, K, feature_map="softmax"), ValueError, "feature_map"),
    "linear_attention positions of another length": (
        lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((5, 2)), positions=np.arange(4)), ValueError, "positions",
    ),
    "linear_attention one positions of a pair": (
        lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((5, 2)), positions=(np.arange(5),)), ValueError, "positions",
    ),
    "linear_attention unknown layout": (
        lambda: pe.linear_attention(Z((5, 8)), Z((5, 8)), Z((5, 2)), layout="twist", positions=np.arange(5)), ValueError, "layout",
    ),
    "linear_attention integer q": (lambda: pe.linear_attention(Z((5, 8), dtype=np.int32), Z((5, 8)), Z((5, 2))), TypeError, "q"),
    # (MemoryError from NumPy or a Python list before: fuzz_public_api.py, 600 calls a function)
    "axial_frequencies too wide": (lambda: pe.axial_frequencies(2**40), ValueError, "memory"),
    "xpos_scale too wide, no positions": (lambda: pe.xpos_scale(np.zeros((0, 4)), 2**62), ValueError, "memory"),
    "xpos_scale odd dim": (lambda: pe.xpos_scale(np.arange(3), 5), ValueError, "dim"),
    "xpos_scale zero scale_base": (lambda: pe.xpos_scale(np.arange(4), 8, scale_base=0), ValueError, "scale_base"),
    "xpos_scale positions a number": (lambda: pe.xpos_scale(3, 4), TypeError, "positions"),
    "xpos_scale infinite positions": (lambda: pe.xpos_scale(np.array([np.inf]), 4), ValueError, "positions"),
    "axial_rope grid of another length": (lambda: pe.axial_rope(Z((6, 8)), Z((5, 2), dtype=np.int64)), ValueError, "grid"),
    "axial_rope grid without axes": (lambda: pe.axial_rope(Z((6, 8)), Z((6, 0), dtype=np.int64)), ValueError, "grid"),
    "axial_rope nan grid": (lambda: pe.axial_rope(Z((6, 8)), np.full((6, 2), np.nan)), ValueError, "grid"),
    "axial_rope axes_dims of another count": (lambda: pe.axial_rope(Z((6, 8)), GRID, axes_dims=(4, 4, 4)), ValueError, "axes_dims"),
    "axial_rope axes_dims too wide": (lambda: pe.axial_rope(Z((6, 8)), GRID, axes_dims=(8, 6)), ValueError, "axes_dims"),
    "axial_rope odd axes_dims": (lambda: pe.axial_rope(Z((6, 8)), GRID, axes_dims=(3, 4)), ValueError, "axes_dims"),
    "axial_rope axes_dims a number": (lambda: pe.axial_rope(Z((6, 8)), GRID, axes_dims=4), TypeError, "axes_dims"),
    "axial_rope unknown layout": (lambda: pe.axial_rope(Z((6, 8)), GRID, layout="diagonal"), ValueError, "layout"),
    "axial_rope out wrong dtype": (lambda: pe.axial_rope(Z((6, 8)), GRID, out=Z((6, 8), dtype=np.float32)), ValueError, "out"),
    # the scalings and Hugging Face configs
    "Linear zero factor": (lambda: S.Linear(0.0), ValueError, "factor"),
    "Linear negative factor": (lambda: S.Linear(-2.0), ValueError, "factor"),
    "Linear factor a string": (lambda: S.Linear("2"), TypeError, "factor"),
    "NTK zero alpha": (lambda: S.NTK(0.0), ValueError, "alpha"),
    "NTK infinite alpha": (lambda: S.NTK(float("inf")), ValueError, "alpha"),
    "DynamicNTK negative factor": (lambda: S.DynamicNTK(-1.0, 2048), ValueError, "factor"),
    "DynamicNTK zero original_max_position": (lambda: S.DynamicNTK(2.0, 0), ValueError, "original_max_position"),
    "DynamicNTK float original_max_position": (lambda: S.DynamicNTK(2.0, 2048.5), TypeError, "original_max_position"),
    "YaRN zero factor": (lambda: S.YaRN(0.0, 4096), ValueError, "factor"),
    "YaRN negative factor": (lambda: S.YaRN(-2.0, 4096), ValueError, "factor"),
    "YaRN zero beta_fast": (lambda: S.YaRN(4.0, 4096, beta_fast=0.0), ValueError, "beta_fast"),
    "YaRN negative beta_slow": (lambda: S.YaRN(4.0, 4096, beta_slow=-1.0), ValueError, "beta_slow"),
    "YaRN zero attention_factor": (lambda: S.YaRN(4.0, 4096, attention_factor=0.0), ValueError, "attention_factor"),
    "YaRN nan mscale": (lambda: S.YaRN(4.0, 4096, mscale=float("nan")), ValueError, "mscale"),
    # ln(e) = 1: 0.1 * -10 * ln(factor) + 1 = 0, the ratio's denominator (was ZeroDivisionError) or the scale
    "YaRN mscale_all_dim zeroing its term": (
        lambda: pe.rope_frequencies(8, scaling=S.YaRN(2.718281828459045, 4096, mscale=1.0, mscale_all_dim=-10.0)), ValueError, "mscale_all_dim",
    ),
    "YaRN mscale zeroing the scale": (
        lambda: pe.rope(np.ones((2, 8)), inverse=True, scaling=S.YaRN(2.718281828459045, 4096, mscale=-10.0, mscale_all_dim=1.0)), ValueError, "mscale",
    ),
    "YaRN truncate a string": (lambda: S.YaRN(4.0, 4096, truncate="yes"), TypeError, "truncate"),
    "LongRoPE empty lists": (lambda: S.LongRoPE([], [], 4096), ValueError, "short_factor"),
    "LongRoPE lists of different lengths": (lambda: S.LongRoPE([1.0, 2.0], [1.0], 4096), ValueError, "long_factor"),
    "LongRoPE negative short factor": (lambda: S.LongRoPE([1.0, -2.0], [1.0, 1.0], 4096), ValueError, "short_factor[1]"),
    "LongRoPE zero long factor": (lambda: S.LongRoPE([1.0, 2.0], [0.0, 1.0], 4096), ValueError, "long_factor[0]"),
    "LongRoPE short_factor a string": (lambda: S.LongRoPE("12", [1.0, 1.0], 4096), TypeError, "short_factor"),
    "LongRoPE zero factor": (lambda: S.LongRoPE([1.0], [1.0], 4096, factor=0.0), ValueError, "factor"),
    # (ln(1) = 0 divided: a bare ZeroDivisionError on the first call)
    "LongRoPE original length 1 with a factor": (lambda: S.LongRoPE([1.0], [1.0], 1, factor=2.0), ValueError, "original_max_position > 1"),
    "YaRN at base 1": (lambda: pe.rope(np.ones((4, 8)), base=1.0, scaling=S.YaRN(2.0, 8)), ValueError, "base != 1"),
    "Llama3 zero factor": (lambda: S.Llama3(0.0, 8192), ValueError, "factor"),
    "Llama3 high_freq_factor below low": (
        lambda: S.Llama3(8.0, 8192, low_freq_factor=4.0, high_freq_factor=1.0), ValueError, "high_freq_factor",
    ),
    "Llama3 zero low_freq_factor": (lambda: S.Llama3(8.0, 8192, low_freq_factor=0.0), ValueError, "low_freq_factor"),
    "from_hf unknown rope_type": (lambda: S.from_hf({"rope_type": "spiral"}, head_dim=64), ValueError, "rope_type"),
    "from_hf rope_type of another library": (lambda: S.from_hf({"rope_type": "su"}, head_dim=64), ValueError, "rope_type"),
    "from_hf unknown legacy type": (lambda: S.from_hf({"type": "ntk-by-parts"}, head_dim=64), ValueError, "rope_type"),
    "from_hf parameters a string": (lambda: S.from_hf("linear", head_dim=64), TypeError, "rope_parameters"),
    "from_hf config a number": (lambda: S.from_hf(42, head_dim=16), TypeError, "config"),
    "from_hf linear without factor": (lambda: S.from_hf({"rope_type": "linear"}, head_dim=64), ValueError, "factor"),
    "from_hf linear negative factor": (lambda: S.from_hf({"rope_type": "linear", "factor": -1.0}, head_dim=64), ValueError, "factor"),
    "from_hf dynamic without max_position_embeddings": (
        lambda: S.from_hf({"rope_type": "dynamic", "factor": 2.0}, head_dim=64), ValueError, "max_position_embeddings",
    ),
    "from_hf yarn without original length": (lambda: S.from_hf({"rope_type": "yarn", "factor": 2.0}, head_dim=64), ValueError, "original_max_position"),
    "from_hf yarn without factor": (
        lambda: S.from_hf({"rope_type": "yarn", "original_max_position_embeddings": 64}, head_dim=64), ValueError, "factor",
    ),
    "from_hf llama3 without low_freq_factor": (
        lambda: S.from_hf({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}, head_dim=16), ValueError, "low_freq_factor",
    ),
    "from_hf longrope without short_factor": (
        lambda: S.from_hf({"rope_type": "longrope", "long_factor": [1.0] * 8}, head_dim=16, max_position_embeddings=8), ValueError, "short_factor",
    ),
    "from_hf longrope lists of another length": (
        lambda: S.from_hf(
            {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3, "original_max_position_embeddings": 8, "factor": 2.0},
            head_dim=8,
        ),
        ValueError,
        "short_factor",
    ),
    "from_hf partial_rotary_factor to an odd width": (
        lambda: S.from_hf({"rope_type": "default", "partial_rotary_factor": 0.3}, head_dim=10), ValueError, "partial_rotary_factor",
    ),
    "from_hf partial_rotary_factor above 1": (
        lambda: S.from_hf({"rope_type": "default", "partial_rotary_factor": 1.5}, head_dim=64), ValueError, "partial_rotary_factor",
    ),
    "from_hf zero rope_theta": (lambda: S.from_hf({"rope_type": "default", "rope_theta": 0.0}, head_dim=64), ValueError, "rope_theta"),
    "from_hf zero head_dim": (lambda: S.from_hf({}, head_dim=0), ValueError, "head_dim"),
    "from_hf without head_dim": (lambda: S.from_hf({"rope_type": "linear", "factor": 2.0}), ValueError, "head_dim"),
    "from_hf unknown layer_type": (
        lambda: S.from_hf({"full_attention": {}, "sliding_attention": {}}, head_dim=64, layer_type="local"), ValueError, "layer_type",
    ),
    "from_hf unknown layer_type of one": (
        lambda: S.from_hf({"full_attention": {"rope_type": "default"}}, head_dim=16, layer_type="local"), ValueError, "layer_type",
    ),
    "from_hf nested without layer_type": (lambda: S.from_hf({"full_attention": {}}, head_dim=64), ValueError, "layer_type"),
    "from_hf nested of two without layer_type": (
        lambda: S.from_hf({"full_attention": {"rope_type": "default"}, "sliding_attention": {}}, head_dim=16), ValueError, "layer_type",
    ),
    "from_hf layer_type of flat parameters": (
        lambda: S.from_hf({"rope_type": "default"}, head_dim=16, layer_type="full_attention"), ValueError, "layer_type",
    ),
}
GRID = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 2)

TORCH_ADAPTERS = {
    "RotaryEmbedding rotary_dim too big": (lambda: _torch_module("RotaryEmbedding", 8, rotary_dim=10), ValueError, "rotary_dim"),
    "RotaryEmbedding unknown layout": (lambda: _torch_module("RotaryEmbedding", 8, layout="zigzag"), ValueError, "layout"),
    "T5RelativeBias no heads": (lambda: _torch_module("T5RelativeBias", 0), ValueError, "num_heads"),
    "ALiBi float heads": (lambda: _torch_module("ALiBi", 2.5), ValueError, "num_heads"),
    "ShawRelative negative max_distance": (lambda: _torch_module("ShawRelative", 4, max_distance=-1), ValueError, "max_distance"),
    "LearnedEmbedding no positions": (lambda: _torch_module("LearnedEmbedding", 0, 4), ValueError, "num_positions"),
    "DeBERTaRelative zero max_distance": (lambda: _torch_module("DeBERTaRelative", 2, 4, max_distance=0), ValueError, "max_distance"),
    # Parameters beyond memory (or int64 bytes): torch's RuntimeError (DefaultCPUAllocator's,
    # "Storage size calculation overflowed") or TypeError after its unpacking, not naming the option
    "LearnedEmbedding too many positions": (lambda: _torch_module("LearnedEmbedding", 10**12, 8), ValueError, ("weight", "memory")),
    "LearnedEmbedding beyond int64 bytes": (lambda: _torch_module("LearnedEmbedding", 2**62, 4), ValueError, ("weight", "memory")),
    "LearnedEmbedding too wide": (lambda: _torch_module("LearnedEmbedding", 8, 2**70), ValueError, ("weight", "memory")),
    "T5RelativeBias too many heads": (lambda: _torch_module("T5RelativeBias", 2**40), ValueError, ("table", "memory")),
    "ShawRelative too far": (lambda: _torch_module("ShawRelative", 8, max_distance=2**40), ValueError, ("table_k", "memory")),
    "ShawRelative too wide": (lambda: _torch_module("ShawRelative", 2**40, max_distance=2), ValueError, ("table_k", "memory")),
    "DeBERTaRelative too far": (lambda: _torch_module("DeBERTaRelative", 8, 8, max_distance=2**40), ValueError, ("pos_q", "memory")),
    "DeBERTaRelative c2p too far": (
        lambda: _torch_module("DeBERTaRelative", 8, 8, max_distance=2**40, terms=("c2p",)), ValueError, ("pos_k", "memory"),
    ),
    "TransformerXLRelative too many heads": (lambda: _torch_module("TransformerXLRelative", 2**15, 2**15, dim=8), ValueError, ("r_proj", "memory")),
    "TENERRelative too many heads": (lambda: _torch_module("TENERRelative", 2**40, 8), ValueError, ("u", "memory")),
    "TUPE too many positions": (lambda: _torch_module("TUPE", 8, 8, max_positions=2**40), ValueError, ("p of shape", "memory")),
    "TUPE too many heads": (lambda: _torch_module("TUPE", 2**15, 2**15, max_positions=8, dim=8), ValueError, ("uq", "memory")),
    "TUPE bias a string": (lambda: _torch_module("TUPE", 2, 4, max_positions=8, bias="alibi"), TypeError, "bias"),
    "FIRE too many heads": (lambda: _torch_module("FIRE", 2**40), ValueError, ("mlp", "memory")),
    "FIRE too wide": (lambda: _torch_module("FIRE", 8, mlp_width=2**40), ValueError, ("mlp", "memory")),
    "KERPLE too many heads": (lambda: _torch_module("KERPLE", 2**62), ValueError, ("r1", "memory")),
    "CoPE too many positions": (lambda: _torch_module("CoPE", 8, npos_max=2**40), ValueError, ("pos_emb", "memory")),
    "CoPE too wide": (lambda: _torch_module("CoPE", 2**40), ValueError, ("pos_emb", "memory")),
    "LearnedEmbedding.extend too long": (lambda: _torch_module("LearnedEmbedding", 2**16, 4).extend(2**32), ValueError, "memory"),  # (hierarchical_extend's check)
    "RandomizedRoPE max_length beyond int64": (lambda: _torch_module("RandomizedRoPE", 8, max_length=2**70), ValueError, ("max_length", "int64")),
    "score_mod unknown kind": (lambda: _torch_module("score_mod", "rotary", _torch().ones(2), 3, 3), ValueError, "kind"),
    "score_mod vector params of another length": (lambda: _torch_module("score_mod", "vector", _torch().ones(2, 4), 3, 3), ValueError, "params"),
    "HFRotaryEmbedding call of an unknown layer_type": (
        lambda: _nested_rotary()(_torch().zeros(1), _torch().arange(20)[None], "global_attention"), ValueError, "layer_type",
    ),
    "HFRotaryEmbedding of an unknown layer_type": (lambda: _nested_rotary(layer_type="global_attention"), ValueError, "layer_type"),
    "T5RelativeBias.from_hf of a layer without the table": (
        lambda: _posenc_torch().T5RelativeBias.from_hf(_hf_model("t5").encoder.block[1].layer[0].SelfAttention),
        ValueError,
        "relative_attention_bias",
    ),
    "patch_hf another architecture": (
        lambda: _torch_module("patch_hf", _gpt2()),
        ValueError,
        ("gpt2", "bloom", "gemma", "gpt_neox", "llama", "mistral", "mt5", "phi3", "qwen2", "qwen3", "t5"),
    ),
    "patch_hf a config dict": (lambda: _torch_module("patch_hf", {"model_type": "llama"}), TypeError, "model"),
}

CONFIGURATION = {
    "attention bias shape": (lambda: pe.attention(Q, K, K, bias=Z((3, 4, 6))), ValueError, "bias"),
    "attention bias of other lengths": (lambda: pe.attention(Z((2, 4)), Z((3, 4)), Z((3, 4)), bias=Z((4, 4))), ValueError, "bias"),
    "attention head dims differ": (lambda: pe.attention(Z((2, 4)), Z((3, 5)), Z((3, 5))), ValueError, "same feature size"),
    "attention torch v of other batch axes": (
        lambda: pe.attention(_torch().ones(2, 3, 4), _torch().ones(2, 5, 4), _torch().ones(3, 5, 4)), ValueError, ("q of shape", "v of shape"),
    ),  # fmt: skip
    "set_backend unknown": (lambda: pe.set_backend("cuda"), ValueError, "backend"),
    "set_backend unknown language": (lambda: pe.set_backend("fortran"), ValueError, "backend"),
    "use_backend unknown": (lambda: _within(pe.use_backend("gpu")), ValueError, "backend"),
    "arrays on two devices": (_strict_on_two_devices, ValueError, "devices"),
    # dtype=float64 on a device without it: array-api-strict's own ValueError had named neither.
    **{
        f"{name} dtype float64 on a device without it": (lambda build=build: _float64_on_no_float64(build), ValueError, ("dtype=", "no_float64", "has no float64"))
        for name, build in (
            ("sinusoidal", lambda s, d, f64: pe.sinusoidal(8, 4, xp=s, device=d, dtype=f64)),
            ("rope_frequencies", lambda s, d, f64: pe.rope_frequencies(8, xp=s, device=d, dtype=f64)),
            ("rope_cos_sin", lambda s, d, f64: pe.rope_cos_sin(s.asarray([1, 2], device=d), [1.0, 0.5], dtype=f64)),
            ("alibi_slopes", lambda s, d, f64: pe.alibi_slopes(4, xp=s, device=d, dtype=f64)),
            ("fire_distances", lambda s, d, f64: pe.fire_distances(3, 4, xp=s, device=d, dtype=f64)),
            ("sandwich_vector", lambda s, d, f64: pe.sandwich_vector(3, 4, 8, xp=s, device=d, dtype=f64)),
        )
    },
    # dtype=int64 on a device without it: array-api-strict's own ValueError had come from inside the computation.
    **{
        f"{name} dtype int64 on a device without it": (lambda build=build: _int64_on_no_x64(build), ValueError, ("dtype=", "no_x64", "int64", "ask for"))
        for name, build in (
            ("relative_positions", lambda s, d, i64: pe.relative_positions(3, 4, xp=s, device=d, dtype=i64)),
            ("relative_positions offset", lambda s, d, i64: pe.relative_positions(3, 4, offset=s.asarray(2, device=d), dtype=i64)),
            ("randomized_positions", lambda s, d, i64: pe.randomized_positions(3, 10, rng=0, xp=s, device=d, dtype=i64)),
        )
    },
    "xp a module name": (lambda: pe.alibi_slopes(4, xp="numpy"), TypeError, "xp must be an array namespace"),
    "xp a number": (lambda: pe.alibi_slopes(4, xp=3), TypeError, "xp must be an array namespace"),
    "xp an object": (lambda: pe.alibi_slopes(4, xp=object()), TypeError, "xp must be an array namespace"),
    "warmup unknown dtype": (lambda: pe.warmup(dtypes="float8"), ValueError, "dtypes must be one or more of"),
    "warmup no dtypes": (lambda: pe.warmup(dtypes=[]), ValueError, "dtypes"),
    "warmup dtypes a number": (lambda: pe.warmup(dtypes=5), ValueError, "dtypes"),
    "warmup gpu a string": (lambda: pe.warmup(gpu="yes"), TypeError, "gpu must be None, True or False"),
    "warmup progress a number": (lambda: pe.warmup(progress=3), TypeError, "progress must be a callable"),
    "warmup gpu without a GPU": (_no_gpu_warmup, ValueError, "gpu=True needs numba.cuda and a CUDA GPU"),
}

# The kernels called directly: each launcher checks what a kernel would otherwise read or
# write out of bounds, before it launches (``toeplitz_*``, ``rope_*``; CPU and CUDA).
KERNEL_LAUNCHERS = {
    "expand vec length": (lambda: _cpu("toeplitz_expand", Z(5), 3, 2), ValueError, "vec must have 4 entries"),
    "expand negative q_len": (lambda: _cpu("toeplitz_expand", Z(5), -1, 2), ValueError, "q_len must be a non-negative integer"),
    "expand float q_len": (lambda: _cpu("toeplitz_expand", Z(5), 3.0, 3), TypeError, "q_len must be an integer"),
    "expand bool k_len": (lambda: _cpu("toeplitz_expand", Z(5), 3, True), TypeError, "k_len must be an integer"),
    "expand 0-d vec": (lambda: _cpu("toeplitz_expand", Z(()), 1, 1), ValueError, "vec must have at least 1 dimension"),
    "expand out wrong shape": (lambda: _cpu("toeplitz_expand", Z(5), 3, 3, out=Z((3, 4))), ValueError, "out must have shape (3, 3)"),
    "expand out wrong dtype": (
        lambda: _cpu("toeplitz_expand", Z(5), 3, 3, out=Z((3, 3), np.float32)), ValueError, "out must have dtype float64",
    ),
    "expand out of another library": (
        lambda: _cpu("toeplitz_expand", Z(5), 3, 3, out=_torch().zeros(3, 3, dtype=_torch().float64)),
        TypeError,
        "out must be an array of the same kind",
    ),
    "expand read-only out": (lambda: _cpu("toeplitz_expand", Z(5), 3, 3, out=_readonly(Z((3, 3)))), ValueError, "writeable"),
    "gather index length": (lambda: _cpu("toeplitz_gather", Z((3, 4)), Z(5, np.int64), 2), ValueError, "index must have shape (4,)"),
    "gather float index": (lambda: _cpu("toeplitz_gather", Z((3, 4)), Z(5, np.float64), 3), TypeError, "index must have an integer dtype"),
    "gather index past the end": (
        lambda: _cpu("toeplitz_gather", Z((3, 4)), np.array([0, 1, 4, 0, 0]), 3), ValueError, "index values must lie in [0, 4)",
    ),
    "gather negative index": (lambda: _cpu("toeplitz_gather", Z((3, 4)), np.array([0, 1, -1, 0, 0]), 3), ValueError, "got values in [-1, 1]"),
    "gather 1-D scores": (lambda: _cpu("toeplitz_gather", Z(4), Z(4, np.int64), 1), ValueError, "scores must have at least 2"),
    "scatter index past the end": (
        lambda: _cpu("toeplitz_scatter", Z((3, 3)), np.array([0, 1, 2, 3, 0]), 3), ValueError, "index values must lie in [0, 3)",
    ),
    "scatter negative m": (lambda: _cpu("toeplitz_scatter", Z((3, 3)), Z(5, np.int64), -2), ValueError, "m must be a non-negative integer"),
    "scatter index length": (lambda: _cpu("toeplitz_scatter", Z((3, 3)), Z(4, np.int64), 2), ValueError, "index must have shape (5,)"),
    "scatter out wrong shape": (
        lambda: _cpu("toeplitz_scatter", Z((3, 3)), Z(5, np.int64), 2, out=Z((3, 3))), ValueError, "out must have shape (3, 2)",
    ),
    "rope_rotate inv_freq of another width": (lambda: _cpu("rope_rotate", Z((3, 4)), np.arange(3), np.ones(3)), ValueError, "inv_freq"),
    "rope_rotate out wrong shape": (lambda: _cpu("rope_rotate", Z((3, 4)), np.arange(3), np.ones(2), out=Z((3, 5))), ValueError, "out"),
    "rope_rotate 0-d x": (lambda: _cpu("rope_rotate", Z(()), np.arange(1), np.ones(1)), ValueError, "inv_freq"),  # (was IndexError)
    "CUDA rope_rotate 0-d x": (lambda: _cuda("rope_rotate", Z((), np.float32), np.arange(1), np.ones(1)), ValueError, "inv_freq"),
    "rope_apply cos/sin wider than x": (lambda: _cpu("rope_apply", Z((3, 4)), np.ones((3, 6)), np.ones((3, 6))), ValueError, "cos/sin"),
    "rope_apply odd cos/sin": (lambda: _cpu("rope_apply", Z((3, 4)), np.ones((3, 3)), np.ones((3, 3))), ValueError, "cos/sin"),
    "rope_apply sin narrower than cos": (lambda: _cpu("rope_apply", Z((3, 4)), np.ones((3, 4)), np.ones((3, 2))), ValueError, "cos/sin"),
    "CUDA gather index past the end": (
        lambda: _cuda("toeplitz_gather", Z((3, 4), np.float32), np.array([0, 1, 4, 0, 0]), 3), ValueError, "index values must lie in [0, 4)",
    ),
    "CUDA scatter index length": (
        lambda: _cuda("toeplitz_scatter", Z((3, 4), np.float32), Z(3, np.int64), 4), ValueError, "index must have shape (6,)",
    ),
}

TABLES = {
    "absolute": ABSOLUTE,
    "relative biases": RELATIVE_BIASES,
    "relative logits": RELATIVE_LOGITS,
    "rotary": ROTARY,
    "torch adapters": TORCH_ADAPTERS,
    "configuration": CONFIGURATION,
    "kernel launchers": KERNEL_LAUNCHERS,
}


def _cases():
    for family, table in TABLES.items():
        marks = [pytest.mark.kernels] if table is KERNEL_LAUNCHERS else []
        for name in table:
            yield pytest.param(family, name, id=f"{family}: {name}", marks=marks)


def test_every_family_has_a_table_of_cases():
    assert all(len(table) >= 10 for table in TABLES.values()) and sum(map(len, TABLES.values())) >= 40


def _no_kernel(op, *args, **kwargs):
    raise AssertionError(f"the kernel registry chose an implementation of {op} before the bad input was refused")


def test_a_good_call_would_reach_the_kernel_registry(monkeypatch):
    monkeypatch.setattr(_dispatch, "select", _no_kernel)
    with pytest.raises(AssertionError, match="t5_buckets"):  # (its first op: the vector's buckets, then toeplitz_expand)
        pe.t5_bias(T5_TABLE, 3, 4)


@pytest.mark.parametrize("family, name", list(_cases()))
def test_bad_input(family, name, monkeypatch):
    call, error, fragments = TABLES[family][name]
    if family != "kernel launchers":
        monkeypatch.setattr(_dispatch, "select", _no_kernel)
    with no_dask_compute(name), pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in (fragments,) if isinstance(fragments, str) else fragments:
        assert fragment in message, f"{name}: message {message!r} does not name {fragment!r}"


def test_numpy_masked_arrays_are_refused_wherever_an_array_goes():
    """A mask no computation would honour: masked positions took np.ma's placeholder values
    (``sinusoidal([1, --, 3])`` gave row 1 the sinusoid of 2 at every frequency) and the
    kernel and the reference disagreed on masked x."""
    masked = np.ma.masked_array
    x, pos = np.ones((1, 3, 8)), np.array([1, 2, 3])
    cos, sin = pe.rope_cos_sin(pos, [1.0, 0.5])
    table = np.ones((32, 2))
    calls = {
        "x": lambda: pe.rope(masked(x, mask=False)),
        "positions": lambda: pe.rope(x, masked(pos, mask=[0, 1, 0])),
        "out": lambda: pe.rope(x, out=masked(np.empty_like(x), mask=False)),
        "sinusoidal positions": lambda: pe.sinusoidal(masked(pos, mask=[0, 1, 0]), 4),
        "rope_cos_sin positions": lambda: pe.rope_cos_sin(masked(pos, mask=[0, 1, 0]), [1.0]),
        "cos": lambda: pe.apply_rope(x, masked(cos, mask=False), sin),
        "table": lambda: pe.t5_bias(masked(table, mask=False), 2, 3),
        "key_positions": lambda: pe.alibi_bias(np.ones(2), 1, 3, key_positions=masked(pos, mask=[0, 1, 0])),
        "inv_freq": lambda: pe.rope_cos_sin(pos, masked([1.0, 0.5], mask=[0, 1])),
        "per-row offset": lambda: pe.rope(np.ones((2, 3, 8)), offset=masked([1, 2], mask=[0, 1])),
        "0-d offset": lambda: pe.t5_bias(table, 2, 3, offset=masked(1, mask=True)),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="masked array"):
            call()


def test_array_api_strict_older_than_2024_12_is_refused_before_any_work():
    """array-api-strict set to ``api_version="2023.12"``: one ``TypeError`` naming the version
    to set, from every function, before any work (the logits had failed inside strict with
    its own RuntimeError at ``take_along_axis``, attention and KERPLE's power kind with an
    AttributeError at ``where`` of a Python scalar, while other functions ran)."""
    strict = pytest.importorskip("array_api_strict")
    a = strict.asarray(np.linspace(-1.0, 1.0, 24).reshape(2, 3, 4))
    calls = {
        "shaw_logits": lambda: pe.shaw_logits(a, a, a[0, ...], max_distance=1),
        "xl_logits": lambda: pe.xl_logits(a, a, a, a[0, 0, ...], a[0, 0, ...]),
        "attention causal": lambda: pe.attention(a, a, a, causal=True),
        "kerple_bias power": lambda: pe.kerple_bias(a[0, 0, ...] ** 2, a[0, 0, ...] ** 2, 3, 3, kind="power"),
        "rope": lambda: pe.rope(a),
        "t5_bias": lambda: pe.t5_bias(a[0, ...], 2, 2),
        "sinusoidal xp=": lambda: pe.sinusoidal(3, 8, xp=strict),
    }
    with strict.ArrayAPIStrictFlags(api_version="2023.12"):
        for name, call in calls.items():
            with pytest.raises(TypeError, match=r"Array API standard 2024\.12 .* api_version '2023\.12'.*set_array_api_strict_flags"):
                call()
    assert pe.rope(a).shape == a.shape
