"""Issue 32, JAX as a first-class pipeline: traced context-extension lengths computed as
exactly as static ones, mixed host/device inputs, clear errors for silent cases, export,
sharding. JAX runs here without x64 (float32 at most), but in ``jax.enable_x64`` blocks.
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


# --- 3b. export with symbolic sizes (jax.export.symbolic_shape) ----------------------------


def _symbolic_cases():
    """name -> (function, its arguments' (shape, dtype kind) with symbolic sizes, constraints,
    the arguments at lengths n (and t = n + 2), whether the eager call's bits are expected
    too (table lookups, ``rope_cos_sin``), whether the frequencies of a length come from
    the graph's arithmetic)."""
    rng = np.random.default_rng(5)
    table, slopes = rng.standard_normal((32, 4)), pe.alibi_slopes(4)
    shaw_table, pos_q, pos_k = rng.standard_normal((5, 16)), rng.standard_normal((4, 6, 16)), rng.standard_normal((4, 6, 16))
    u, v = rng.standard_normal((4, 1, 16)), rng.standard_normal((4, 1, 16))
    inv_freq = pe.rope_frequencies(16)[0]
    dynamic = pe.scaling.DynamicNTK(2.0, 8)
    longrope = pe.scaling.LongRoPE([1.0, 1.5, 2.0, 3.0, 1.0, 1.2, 1.1, 1.0], [4.0, 5.0, 6.0, 7.0, 8.0, 2.0, 3.0, 9.0], 8, factor=4.0)
    x = ("2, 4, s, 16", "f")

    def c(a, f):
        return jnp.asarray(a, f)

    def xs(n, f, seed=0):
        return c(np.random.default_rng(n + seed).standard_normal((2, 4, n, 16)), f)

    return {
        "rope": (lambda x: pe.rope(x), [x], (), lambda n, t, f, i: (xs(n, f),), False, False),
        "rope[offset=1]": (lambda x: pe.rope(x, offset=1), [x], (), lambda n, t, f, i: (xs(n, f),), False, False),
        "rope[offset=3, bound declared]": (lambda x: pe.rope(x, offset=3), [x], ("s <= 65536",), lambda n, t, f, i: (xs(n, f),), False, False),
        "rope[offset=s, bound declared]": (lambda x: pe.rope(x, offset=x.shape[-2]), [x], ("s <= 65536",), lambda n, t, f, i: (xs(n, f),), False, False),
        "rope[positions]": (lambda x, p: pe.rope(x, p, seq_axis="bhsd"), [x, ("s", "i")], (), lambda n, t, f, i: (xs(n, f), c(np.arange(n) * 3 + 1, i)), False, False),
        "rope[traced offset]": (lambda x, o: pe.rope(x, offset=o), [x, ("", "i")], (), lambda n, t, f, i: (xs(n, f), c(7, i)), False, False),
        "rope[DynamicNTK]": (lambda x: pe.rope(x, scaling=dynamic), [x], (), lambda n, t, f, i: (xs(n, f),), False, True),
        "rope[DynamicNTK, offset=3, bound declared]": (
            lambda x: pe.rope(x, offset=3, scaling=dynamic), [x], ("s <= 65536",), lambda n, t, f, i: (xs(n, f),), False, True,
        ),
        "rope[LongRoPE]": (lambda x: pe.rope(x, scaling=longrope), [x], (), lambda n, t, f, i: (xs(n, f),), False, False),
        "apply_rope": (
            lambda x, cos, sin: pe.apply_rope(x, cos, sin), [x, ("s, 16", "f"), ("s, 16", "f")], (),
            lambda n, t, f, i: (xs(n, f), *(c(a, f) for a in pe.rope_cos_sin(np.arange(n), inv_freq))), False, False,
        ),
        "rope_cos_sin": (lambda p: pe.rope_cos_sin(p, inv_freq)[1], [("s", "i")], (), lambda n, t, f, i: (c(np.arange(n), i),), True, False),
        "rope_frequencies[DynamicNTK, seq_len]": (
            lambda x: pe.rope_frequencies(16, scaling=dynamic, seq_len=x.shape[-2], xp=jnp)[0], [x], (), lambda n, t, f, i: (xs(n, f),), False, True,
        ),
        "t5_bias": (lambda x: pe.t5_bias(c(table, x.dtype), x.shape[-2], x.shape[-2]), [x], (), lambda n, t, f, i: (xs(n, f),), True, False),
        "t5_bias[one query]": (lambda k: pe.t5_bias(c(table, k.dtype), 1, k.shape[-2]), [x], (), lambda n, t, f, i: (xs(n, f),), True, False),
        "t5_bias[traced offset]": (
            lambda x, o: pe.t5_bias(c(table, x.dtype), x.shape[-2], x.shape[-2], offset=o), [x, ("", "i")], (),
            lambda n, t, f, i: (xs(n, f), c(-9, i)), True, False,
        ),
        "alibi_bias[traced offset]": (
            lambda x, o: pe.alibi_bias(c(slopes, x.dtype), x.shape[-2], x.shape[-2], offset=o, symmetric=True), [x, ("", "i")], (),
            lambda n, t, f, i: (xs(n, f), c(7, i)), True, False,
        ),
        "alibi_bias[q_len s, k_len t]": (
            lambda q, k: pe.alibi_bias(c(slopes, q.dtype), q.shape[-2], k.shape[-2]), [x, ("2, 4, t, 16", "f")], (),
            lambda n, t, f, i: (xs(n, f), xs(t, f)), True, False,
        ),
        "relative_bias[deberta]": (
            lambda x: pe.relative_bias("deberta", c(table[:6], x.dtype), x.shape[-2], x.shape[-2], max_distance=3, bucket_size=4, max_position=8),
            [x], (), lambda n, t, f, i: (xs(n, f),), True, False,
        ),
        "shaw_logits": (lambda q, k: pe.shaw_logits(q, k, c(shaw_table, q.dtype), max_distance=2), [x, x], (), lambda n, t, f, i: (xs(n, f), xs(n, f, 1)), False, False),
        "shaw_output": (
            lambda w, v: pe.shaw_output(w, v, c(shaw_table, w.dtype), max_distance=2), [("2, 4, s, s", "f"), x], (),
            lambda n, t, f, i: (c(np.random.default_rng(n).random((2, 4, n, n)), f), xs(n, f)), False, False,
        ),
        "deberta_logits": (
            lambda q, k: pe.deberta_logits(q, k, c(pos_q, q.dtype), c(pos_k, q.dtype), max_distance=3), [x, x], (),
            lambda n, t, f, i: (xs(n, f), xs(n, f, 1)), False, False,
        ),
        "xl_logits": (
            lambda q, k, r: pe.xl_logits(q, k, r, c(u, q.dtype), c(v, q.dtype)), [x, ("2, 4, t, 16", "f"), ("2, 4, t, 16", "f")], ("t >= s",),
            lambda n, t, f, i: (xs(n, f), xs(t, f, 1), xs(t, f, 2)), False, False,
        ),
        "tener_logits": (lambda q, k: pe.tener_logits(q, k, c(u, q.dtype), c(v, q.dtype)), [x, x], (), lambda n, t, f, i: (xs(n, f), xs(n, f, 1)), False, False),
        "segment_logits": (
            lambda q, seg: pe.segment_logits(q, seg, seg, c(u, q.dtype), c(v, q.dtype), c(u, q.dtype)), [x, ("2, s", "i")], (),
            lambda n, t, f, i: (xs(n, f), c(np.arange(2 * n).reshape(2, n) // 3, i)), False, False,
        ),
        "rel_shift": (lambda x: pe.rel_shift(x[0]), [x], (), lambda n, t, f, i: (xs(n, f),), True, False),
        "positions_from_mask": (
            lambda m: pe.positions_from_mask(m), [("2, s", "i")], (), lambda n, t, f, i: (c(np.arange(2 * n).reshape(2, n) % 3 != 0, i),), True, False,
        ),
        "tupe_logits": (
            lambda q, p: pe.tupe_logits(q, q, p, c(shaw_table[:, :16].T, q.dtype), c(shaw_table[:, :16].T, q.dtype)), [x, ("s, 16", "f")], (),
            lambda n, t, f, i: (xs(n, f), c(np.random.default_rng(n).standard_normal((n, 16)), f)), False, False,
        ),
        "conv_positions": (lambda x: pe.conv_positions(x, c(shaw_table[:3], x.dtype)), [x], (), lambda n, t, f, i: (xs(n, f),), False, False),
        "fire_bias": (
            lambda x: pe.fire_bias(lambda d: d * jnp.ones(4, d.dtype), x.shape[-2], x.shape[-2], xp=jnp, dtype=x.dtype), [x], (),
            lambda n, t, f, i: (xs(n, f),), False, False,
        ),
        "attention[alibi bias]": (
            lambda q, k: pe.attention(q, k, k, bias=pe.alibi_bias(c(slopes, q.dtype), q.shape[-2], k.shape[-2]), causal=True), [x, x], (),
            lambda n, t, f, i: (xs(n, f), xs(n, f, 1)), False, False,
        ),
    }


SYMBOLIC = _symbolic_cases()


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("name", sorted(SYMBOLIC))
def test_export_with_symbolic_lengths_gives_the_static_exports_bits(name, x64):
    """One export for every length (``jax.export.symbolic_shape``), serialized and read back,
    called at three lengths: the bits of the export at each length's static shape (XLA's
    compiled reference, whose float arithmetic may differ from the eager kernel's in the
    last bit), and the eager call's bits where the function looks values up. Its
    integer checks had refused a symbolic length (``TypeError``, or JAX's "inconclusive"
    comparison of an int32 range; ``positions_from_mask``'s and ``conv_positions``' ``int()``
    of the length), and a traced ``offset`` beside them: a comparison of
    the clamp's bounds was inconclusive (T5's buckets) or an index dtype's edge plus a
    size overflowed when lowered (ALiBi's); ``x64``: float64 and int64."""
    from jax import export

    fn, specs, constraints, make, eager, length_frequencies = SYMBOLIC[name]
    with jax.enable_x64(x64):
        f, i = (jnp.float64, jnp.int64) if x64 else (jnp.float32, jnp.int32)
        scope = export.SymbolicScope(constraints)
        args = [jax.ShapeDtypeStruct(export.symbolic_shape(shape, scope=scope) if shape else (), f if kind == "f" else i) for shape, kind in specs]
        exported = export.export(jax.jit(fn))(*args)
        assert not re.search(r"custom_call @(?!shape_assertion\b|stablehlo\.)", exported.mlir_module())  # (JAX's own: checks of the sizes, a cumsum's dynamic window)
        back = export.deserialize(exported.serialize())
        for n in (2, 5, 17):
            inputs = make(n, n + 2, f, i)
            got = np.asarray(back.call(*inputs))
            static = np.asarray(export.export(jax.jit(fn))(*inputs).call(*inputs))
            if x64 and length_frequencies:  # the length's frequencies from XLA's pow, the static export's from the host's
                np.testing.assert_allclose(got, static, rtol=1e-14, atol=1e-15)
            else:
                assert np.array_equal(got, static), (name, n)
            if eager:
                assert np.array_equal(got, np.asarray(fn(*inputs))), (name, n)


def test_export_with_a_symbolic_length_refuses_what_it_cannot_bound():
    """A range JAX can neither prove nor refute for every value of a symbolic size (the
    positions ``offset + arange(s)`` past int32 for the largest ``s``, a length ``s - 3`` below
    0) is refused with the constraint to declare, never computed unchecked; a size that must
    be known now (a feature width) is refused as such."""
    from jax import export

    table = jnp.zeros((32, 4))
    x = jax.ShapeDtypeStruct(export.symbolic_shape("2, 4, s, 16"), jnp.float32)
    refused = {
        "rope": (lambda x: pe.rope(x, offset=3), ValueError, r"offset \+ the token positions .* reach 3 \.\. s \+ 2.*declare 's \+ 2 <= 2147483647'"),
        "t5_bias": (lambda x: pe.t5_bias(table, x.shape[-2], x.shape[-2], offset=5), ValueError, r"declare 's \+ 4 <= 2147483647'"),
        "q_len": (lambda x: pe.t5_bias(table, x.shape[-2] - 3, 4), ValueError, r"q_len must be >= 0, got s - 3.*declare 's - 3 >= 0'"),
        "symbolic offset": (lambda x: pe.rope(x, offset=x.shape[-2]), ValueError, r"reach s \.\. 2\*s - 1.*declare '2\*s - 1 <= 2147483647'"),
        "dim": (lambda x: pe.rope_frequencies(x.shape[-2]), TypeError, "dim must be a concrete integer here .* symbolic dimension s"),
    }
    for name, (fn, error, message) in refused.items():
        with pytest.raises(error, match=message):
            export.export(jax.jit(fn))(x)


# --- 2. sharding: a per-shard kernel call -------------------------------------------------


def test_kernel_ops_inside_shard_map_vary_as_their_arguments():
    """Inside ``jax.shard_map`` the kernel primitive's result varies along the manual axes its
    arguments vary along, and an argument that does not is made to (``pcast``, whose
    transpose sums its cotangent): ``jax.grad`` had raised "Expected cotangent type
    float32[1,2,6,8]{V:d} but got float32[1,2,6,8]", and the gradient of a replicated x
    rotated at per-device positions was one device's alone (83 off the reference's sum).
    In a child process with 4 forced host devices."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "jax_sharding" / "check_shard_map.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(pe.__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), "4"], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(lines) == 4 and all(line.endswith(" ok") for line in lines), "\n".join(lines)


@pytest.mark.parametrize("devices, shardy", [(2, True), (4, True), (2, False)])
def test_sharded_inputs_stay_sharded_without_all_gather(devices, shardy):
    """Values, output shardings and the compiled HLO (no all-gather) of batch-, head- and
    sequence-sharded calls; a sharded last axis is gathered (documented cost); calls outside
    ``jit`` on Auto and Explicit meshes beside NumPy and unsharded JAX operands; on an
    Explicit mesh, operations along a split axis JAX cannot keep split; results of
    uncommitted arrays uncommitted. In a child process: the forced host device count must
    be set before JAX initialises. Also with GSPMD (Shardy off), whose sharding inference
    met operands of no sharding (a constant's) and aborted the process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "jax_sharding" / "check_sharded.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(pe.__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    env["JAX_USE_SHARDY_PARTITIONER"] = str(shardy).lower()
    done = subprocess.run([sys.executable, str(script), str(devices)], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(lines) == 68 and all(line.endswith(" ok") for line in lines), "\n".join(lines)
