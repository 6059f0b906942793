"""Issue 32, JAX as a first-class pipeline: traced context-extension lengths computed as
exactly as static ones, mixed host/device inputs, clear errors for silent cases, export,
sharding. JAX runs here without x64 (float32 at most).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import posenc as pe
from formulas import rope_formula, rope_tables

jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")


# --- 1. a traced seq_len (every step of a jitted decoding loop) ------------------------


def dynamic_ntk_inv_freq(dim, base, factor, original, seq_len):
    """HF's ``_compute_dynamic_ntk_parameters`` in float64, written out."""
    n = max(seq_len, original)
    new_base = base * (factor * n / original - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / new_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def longrope_inv_freq(dim, base, short, long, original, seq_len):
    """HF's ``_compute_longrope_parameters`` in float64: long factors past the original length."""
    factors = np.asarray(long if seq_len > original else short, dtype=np.float64)
    return 1.0 / (factors * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


_DIM = 64
_SHORT = tuple(np.random.default_rng(1).uniform(1.0, 1.5, _DIM // 2))
_LONG = tuple(np.random.default_rng(2).uniform(1.0, 40.0, _DIM // 2))
SCALINGS = {
    "dynamic": (pe.scaling.DynamicNTK(4.0, 4096), lambda n: dynamic_ntk_inv_freq(_DIM, 10000.0, 4.0, 4096, n)),
    "longrope": (
        pe.scaling.LongRoPE(_SHORT, _LONG, 4096, factor=4.0),
        lambda n: longrope_inv_freq(_DIM, 10000.0, _SHORT, _LONG, 4096, n),
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_traced_seq_len_as_exact_as_a_static_one(name, dtype, rng):
    scaling, formula = SCALINGS[name]
    scale = scaling.frequencies(_DIM, 10000.0, None)[1]
    x = rng.standard_normal((2, 3, 1, _DIM)).astype(np.float32)  # [batch, heads, seq = 1, dim]
    xj = jnp.asarray(x, dtype=getattr(jnp, dtype))
    x = np.asarray(xj, dtype=np.float64)  # the input as rounded to dtype
    step = jax.jit(lambda x, offset, seq_len: pe.rope(x, scaling=scaling, offset=offset, seq_len=seq_len))
    pair = np.sqrt(x[..., : _DIM // 2] ** 2 + x[..., _DIM // 2 :] ** 2)
    pair = np.concatenate([pair, pair], -1)
    for position in (19, 4095, 4096, 16000, 10**6):
        expected = rope_formula(x, *rope_tables(np.array([position]), formula(position + 1), "half"), "half") * scale
        got = np.asarray(step(xj, position, position + 1), dtype=np.float64)
        # docs/precision.md: angles within 1e-6 without float64; then float32 roundings
        bound = (1e-6 + 8 * 2.0**-24) * pair * scale
        if dtype == "bfloat16":  # within one bfloat16 ulp of the float64 result
            bound = bound + np.spacing(np.abs(expected).astype(ml_dtypes.bfloat16)).astype(np.float64)
        assert np.all(np.abs(got - expected) <= bound), (position, np.abs(got - expected).max())
        eager = np.asarray(pe.rope(xj, scaling=scaling, offset=position, seq_len=position + 1), dtype=np.float64)
        assert np.all(np.abs(got - eager) <= 2 * bound)


def test_traced_dynamic_frequencies_are_the_host_table_rounded_once():
    dyn = SCALINGS["dynamic"][0]
    lengths = jnp.asarray([19, 4095, 4096, 4097, 16000, 10**6, 2**31 - 1])
    got, _ = jax.jit(lambda n: pe.rope_frequencies(_DIM, scaling=dyn, seq_len=n, xp=jnp))(lengths)
    for row, n in zip(np.asarray(got), np.asarray(lengths)):
        table = dynamic_ntk_inv_freq(_DIM, 10000.0, 4.0, 4096, int(n))
        np.testing.assert_allclose(row, table, rtol=2.0**-24, atol=0)


# --- 5. silent cases made errors ---------------------------------------------------------


def test_transposed_t5_table_is_refused_unless_its_shape_is_said():
    with pytest.raises(ValueError, match=r"table of shape \(4, 32\) is ambiguous.*num_buckets= or heads="):
        pe.t5_bias(jnp.zeros((4, 32)), 8, 8)
    with pytest.raises(ValueError, match=r"transposed\? .*pass table.T"):
        pe.t5_bias(jnp.zeros((4, 32)), 8, 8, num_buckets=32)
    with pytest.raises(ValueError, match=r"transposed\?"):
        pe.t5_bias(jnp.zeros((4, 32)), 8, 8, heads=4)
    table = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)  # T5-XXL: 32 buckets, 64 heads
    got = pe.t5_bias(jnp.asarray(table), 3, 5, heads=64)
    assert got.shape == (64, 3, 5)
    np.testing.assert_array_equal(np.asarray(got), pe.t5_bias(table, 3, 5, num_buckets=32))
    np.testing.assert_array_equal(np.asarray(got), pe.t5_bias(table, 3, 5))  # T5's 32 buckets: not ambiguous


def test_traced_cu_seqlens_checked_by_checkify():
    from jax.experimental import checkify

    packed = jax.jit(checkify.checkify(lambda cu: pe.positions_from_cu_seqlens(cu, 9)))
    err, positions = packed(jnp.array([0, 3, 9]))
    err.throw()
    np.testing.assert_array_equal(np.asarray(positions), [0, 1, 2, 0, 1, 2, 3, 4, 5])
    err, _ = packed(jnp.array([0, 3, 5]))  # ends before total: the trailing tokens had wrong positions
    with pytest.raises(Exception, match="cu_seqlens must be non-decreasing from 0 to total = 9, got values from 0 to 5"):
        err.throw()
    with pytest.raises(ValueError, match="checkify.check which was not functionalized"):
        jax.jit(lambda cu: pe.positions_from_cu_seqlens(cu, 9))(jnp.array([0, 3, 9]))
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing from 0 to total = 9"):
        jax.jit(lambda: pe.positions_from_cu_seqlens(np.array([0, 3, 5]), 9))()  # a host constant: checked now
    unchecked = jax.jit(lambda cu: pe.positions_from_cu_seqlens(cu, 9, check_traced=False))(jnp.array([0, 3, 9]))
    np.testing.assert_array_equal(np.asarray(unchecked), [0, 1, 2, 0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize(
    "name, call",
    [
        ("q_len", lambda n: pe.t5_bias(jnp.zeros((32, 2)), n, 3)),
        ("total", lambda n: pe.positions_from_cu_seqlens(jnp.array([0, 3]), n)),
        ("rotary_dim", lambda n: pe.rope(jnp.zeros((3, 8)), rotary_dim=n)),
        ("base", lambda n: pe.rope(jnp.zeros((3, 8)), base=n)),
    ],
)
def test_traced_value_where_a_static_one_is_needed_names_static_argnums(name, call):
    with pytest.raises(TypeError, match=f"^{name} must be a concrete .*traced.*static_argnums"):
        jax.jit(call)(4)


# --- 3. export, and the backend in the jit cache key ------------------------------------


def _model(x, table, offset):
    y = pe.rope(x, offset=offset)
    scores = jnp.einsum("bhqd,bhkd->bhqk", y, y)
    return scores + pe.t5_bias(table, x.shape[-2], x.shape[-2])


def _model_inputs():
    rng = np.random.default_rng(3)
    return jnp.asarray(rng.standard_normal((2, 4, 5, 16)), jnp.float32), jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)


def test_export_for_cpu_cuda_and_tpu_serializes_and_runs():
    from jax import export

    x, table = _model_inputs()
    jitted = jax.jit(_model)
    assert "custom_call" in jitted.lower(x, table, 3).as_text()  # the CPU kernel's host call under jit
    want = np.asarray(jitted(x, table, 3))
    for platforms in (("cpu",), ("cuda",), ("tpu",), ("cpu", "cuda", "tpu")):
        exported = export.export(jitted, platforms=platforms)(x, table, 3)
        assert "custom_call" not in exported.mlir_module()  # the reference, lowered for every platform
        back = export.deserialize(exported.serialize())
        assert back.platforms == platforms
        if "cpu" in platforms:
            np.testing.assert_allclose(np.asarray(back.call(x, table, 3)), want, rtol=1e-5, atol=1e-5)


def test_export_with_kernels_keeps_the_cpu_host_call():
    from jax import export

    from posenc.jax import export_with_kernels

    x, table = _model_inputs()
    jitted = jax.jit(_model)
    with export_with_kernels():
        with pytest.raises(ValueError, match="custom call"):
            export.export(jitted, platforms=["cpu"])(x, table, 3)
        targets = sorted(set(re.findall(r"custom_call @(posenc\w+)", jitted.lower(x, table, 3).as_text())))
        exported = export.export(
            jitted, platforms=["cpu"], disabled_checks=[export.DisabledSafetyCheck.custom_call(t) for t in targets]
        )(x, table, 3)
    assert "custom_call" in exported.mlir_module()
    np.testing.assert_allclose(np.asarray(exported.call(x, table, 3)), np.asarray(jitted(x, table, 3)), rtol=1e-5, atol=1e-5)


def test_the_jit_key_defaults_to_the_process_backend_even_when_first_loaded_inside_a_block():
    """``posenc.jax`` (the backend's part of the jit key) first imported inside a
    ``use_backend("reference")`` block took that block's backend as its global default, so
    afterwards a call outside any block and one inside a reference block shared one jit
    cache entry: the block then ran the kernel (an order-dependent failure of the test below)."""
    code = (
        "import jax, jax.numpy as jnp, numpy as np, posenc as pe\n"
        "from posenc import _dispatch\n"
        "with pe.use_backend('reference'):\n"
        "    _dispatch.call('toeplitz_expand', np.ones((2, 6)), 3, 4)\n"
        "x = jnp.ones((2, 4, 5, 16)); f = jax.jit(lambda x, o: pe.rope(x, offset=o)); f(x, 3)\n"
        "assert 'custom_call' in f.lower(x, 3).as_text()\n"
        "with pe.use_backend('reference'):\n"
        "    assert 'custom_call' not in f.lower(x, 3).as_text()\n"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], check=True)


def test_use_backend_retraces_a_function_jitted_before():
    x, table = _model_inputs()
    jitted = jax.jit(_model)
    jitted(x, table, 3)
    assert "custom_call" in jitted.lower(x, table, 3).as_text()
    with pe.use_backend("reference"):
        assert "custom_call" not in jitted.lower(x, table, 3).as_text()
        reference = np.asarray(jitted(x, table, 3))
    np.testing.assert_allclose(reference, np.asarray(jitted(x, table, 3)), rtol=1e-5, atol=1e-5)
    assert "custom_call" in jitted.lower(x, table, 3).as_text()
    pe.set_backend("reference")
    try:
        assert "custom_call" not in jitted.lower(x, table, 3).as_text()
    finally:
        pe.set_backend("auto")
    assert "custom_call" in jitted.lower(x, table, 3).as_text()


# --- 2. sharding: a per-shard kernel call -------------------------------------------------


@pytest.mark.parametrize("devices", [2, 4])
def test_sharded_inputs_stay_sharded_without_all_gather(devices):
    """Values, output shardings and the compiled HLO (no all-gather) of batch-, head- and
    sequence-sharded calls; a sharded last axis is gathered (documented cost). In a child
    process: the forced host device count must be set before JAX initialises."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "jax_sharding" / "check_sharded.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(pe.__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), str(devices)], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(lines) == 7 and all(line.endswith(" ok") for line in lines), "\n".join(lines)
