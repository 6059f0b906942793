"""Run by tests/test_jax_pipeline.py in a child process: XLA_FLAGS must force the host
device count before JAX initialises (so nothing runs on import: pytest's doctest collection
imports this file). Prints one line per check: ``name ok`` or a failure."""

from __future__ import annotations

import os
import sys


def main(count):
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import posenc as pe

    mesh = jax.make_mesh((count,), ("d",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 12, 16)).astype(np.float32)  # [batch, heads, seq, dim]
    table = rng.standard_normal((32, 8)).astype(np.float32)
    cos, sin = (t.astype(np.float32) for t in pe.rope_cos_sin(np.arange(12) + 3, pe.rope_frequencies(16)[0]))

    def put(a, spec):
        return jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))

    def check(name, fn, args, want, spec, gathers=False):
        jitted = jax.jit(fn)
        got = jitted(*args)
        hlo = jitted.lower(*args).compile().as_text()
        problems = []
        if not np.allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5):
            problems.append(f"values off by {np.abs(np.asarray(got) - want).max()}")
        if tuple(got.sharding.spec) + (None,) * (got.ndim - len(got.sharding.spec)) != tuple(spec) + (None,) * (got.ndim - len(spec)):
            problems.append(f"sharding {got.sharding.spec}, wanted {spec}")
        if ("all-gather" in hlo) != gathers:
            problems.append("an all-gather" if not gathers else "no all-gather")
        print(name, "ok" if not problems else "FAIL " + "; ".join(problems), flush=True)


    rotated = pe.rope(x, offset=3)
    check("rope batch", lambda a: pe.rope(a, offset=3), (put(x, P("d")),), rotated, P("d"))
    check("rope heads", lambda a: pe.rope(a, offset=3), (put(x, P(None, "d")),), rotated, P(None, "d"))
    check("rope seq", lambda a: pe.rope(a, offset=3), (put(x, P(None, None, "d")),), rotated, P(None, None, "d"))
    check("rope dim gathers", lambda a: pe.rope(a, offset=3), (put(x, P(None, None, None, "d")),), rotated, P(None, None, None, "d"), gathers=True)
    for name, spec in (("batch", P("d")), ("heads", P(None, "d"))):  # (the result's type carries x's sharding: a matmul reads it)
        check(
            f"rope then q @ k.T {name}", lambda a: pe.rope(a, offset=3) @ jnp.swapaxes(a, -1, -2), (put(x, spec),),
            rotated @ np.swapaxes(x, -1, -2), spec,
        )  # fmt: skip
    check("apply_rope heads", lambda a, c, s: pe.apply_rope(a, c, s), (put(x, P(None, "d")), jnp.asarray(cos), jnp.asarray(sin)), pe.apply_rope(x, cos, sin), P(None, "d"))
    check("t5_bias heads", lambda t: pe.t5_bias(t, 12, 12), (put(table, P(None, "d")),), pe.t5_bias(table, 12, 12), P("d"))
    packed = rng.integers(0, 40, (4, 12))  # per-token positions [batch, seq], sharded on the batch
    check(
        "t5_bias per-token positions batch", lambda p: pe.t5_bias(table, 12, 12, query_positions=p, key_positions=p),
        (put(packed, P("d")),), pe.t5_bias(table, 12, 12, query_positions=packed, key_positions=packed), P("d"),
    )  # fmt: skip
    pos_q, pos_k = (rng.standard_normal((8, 6, 16)).astype(np.float32) for _ in range(2))  # per-head tables, replicated
    check(
        "deberta_logits heads", lambda a: pe.deberta_logits(a, a, pos_q, pos_k, max_distance=3), (put(x, P(None, "d")),),
        pe.deberta_logits(x, x, pos_q, pos_k, max_distance=3), P(None, "d"),
    )  # fmt: skip
    dynamic = pe.scaling.DynamicNTK(2.0, 8)  # a length past 8 rescales: the host call reads each traced length
    check(
        "rope dynamic traced offset batch", lambda a, o: pe.rope(a, offset=o, scaling=dynamic), (put(x, P("d")), jnp.int32(50)),
        pe.rope(x, offset=50, scaling=dynamic), P("d"),
    )  # fmt: skip
    rows = np.array([0, 7, 50, 400])
    check(
        "rope dynamic per-row offsets batch", lambda a, o: pe.rope(a, offset=o, scaling=dynamic), (put(x, P("d")), put(rows, P("d"))),
        pe.rope(x, offset=rows, scaling=dynamic), P("d"),
    )  # fmt: skip
    # Operands sharded unlike x (the rows on the batch, x on the sequence or the heads): each
    # shard's call takes its own rows, resharded as the result is (48 of 64 rows were wrong):
    # the rows are gathered, the cost of a few integers.
    check(
        "rope dynamic per-row offsets, x on the sequence", lambda a, o: pe.rope(a, offset=o, scaling=dynamic),
        (put(x, P(None, None, "d")), put(rows, P("d"))), pe.rope(x, offset=rows, scaling=dynamic), P(None, None, "d"), gathers=True,
    )  # fmt: skip
    check(
        "rope per-row offsets, x on the heads", lambda a, o: pe.rope(a, offset=o), (put(x, P(None, "d")), put(rows, P("d"))),
        pe.rope(x, offset=rows), P(None, "d"), gathers=True,
    )  # fmt: skip
    grad = jax.grad(lambda a: jnp.sum(pe.rope(a, offset=3) * a))  # R a + R^T a
    check("rope gradient batch", grad, (put(x, P("d")),), rotated + pe.rope(x, offset=3, inverse=True), P("d"))
    eager(count, x, cos, sin)
    eager_bits(count, x, cos, sin)
    explicit(count, x, table)
    uncommitted(count, x, table)


def eager(count, x, cos, sin):
    """Calls outside ``jit`` on x sharded over an Auto and an Explicit mesh, beside NumPy
    constants, an uncommitted JAX array and one replicated on the mesh, and ``jax.vmap``,
    ``jax.jvp`` and ``jax.grad`` of rope outside ``jit`` (their results had been put on
    one device), and rope's per-row lengths: the values of the unsharded call and x's
    sharding. One line per mesh and spec (``eager ... ok``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import posenc as pe

    rng = np.random.default_rng(1)
    pos_q, pos_k = (rng.standard_normal((8, 6, 16)).astype(np.float32) for _ in range(2))
    r, u = rng.standard_normal((8, 24, 16)).astype(np.float32), rng.standard_normal((8, 1, 16)).astype(np.float32)
    positions = np.arange(12) + 3
    rows, dynamic = np.array([0, 3, 100, 7]).reshape(4, 1, 1), pe.scaling.DynamicNTK(2.0, 8)
    for kind in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((count,), ("d",), axis_types=(kind,))
        replicated = jax.device_put(jnp.asarray(positions), NamedSharding(mesh, P()))
        for spec in (P("d"), P(None, "d"), P(None, None, "d")):
            xs = jax.device_put(x, NamedSharding(mesh, spec))
            cases = {
                "rope offset": (lambda a: pe.rope(a, offset=3), pe.rope(x, offset=3)),
                "rope NumPy positions": (lambda a: pe.rope(a, positions), pe.rope(x, positions)),
                "rope uncommitted positions": (lambda a: pe.rope(a, jnp.asarray(positions)), pe.rope(x, positions)),
                "rope replicated positions": (lambda a: pe.rope(a, replicated), pe.rope(x, positions)),
                "apply_rope NumPy tables": (lambda a: pe.apply_rope(a, cos, sin), pe.apply_rope(x, cos, sin)),
                # (a row at a time, stacked: an Auto mesh's result had come back replicated)
                "rope per-row lengths": (lambda a: pe.rope(a, offset=jnp.asarray(rows), scaling=dynamic), pe.rope(x, offset=rows, scaling=dynamic)),
            }
            grad = jax.grad(lambda a: jnp.sum(pe.rope(a, offset=3) * a))  # (eager transforms run the op on the arrays)
            cases["vmap of rope"] = (lambda a: jax.vmap(lambda b: pe.rope(b, offset=3))(a), pe.rope(x, offset=3))
            cases["jvp of rope"] = (lambda a: jax.jvp(lambda b: pe.rope(b, offset=3), (a,), (a,))[1], pe.rope(x, offset=3))
            cases["grad of rope"] = (  # (an explicit mesh's eager grad needs the mesh set, as plain JAX's does)
                lambda a: grad(a) if kind == AxisType.Auto else _with_mesh(jax, mesh, grad, a), pe.rope(x, offset=3) + pe.rope(x, offset=3, inverse=True),
            )
            if spec != P(None, None, "d") or kind == AxisType.Auto:  # (explicit: JAX's own q @ k.T of two sequence-sharded operands raises)
                cases["deberta_logits NumPy tables"] = (lambda a: pe.deberta_logits(a, a, pos_q, pos_k, max_distance=3), pe.deberta_logits(x, x, pos_q, pos_k, max_distance=3))
                # (an uncommitted per-head r split as q: reshard had refused the abstract mesh outside jit)
                cases["xl_logits uncommitted r"] = (lambda a: pe.xl_logits(a, a, jnp.asarray(r), jnp.asarray(u), jnp.asarray(u)), pe.xl_logits(x, x, r, u, u))
            problems = []
            for name, (fn, want) in cases.items():
                try:
                    got = fn(xs)
                except Exception as error:  # noqa: BLE001  (reported on the line)
                    problems.append(f"{name}: {type(error).__name__} {str(error)[:160]}")
                    continue
                if not np.allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5):
                    problems.append(f"{name}: values off by {np.abs(np.asarray(got) - want).max()}")
                if tuple(got.sharding.spec)[: len(spec)] != tuple(spec):
                    problems.append(f"{name}: sharding {got.sharding.spec}, wanted {spec}")
            print(f"eager {kind.name} {spec}", "ok" if not problems else "FAIL " + "; ".join(problems), flush=True)


def eager_bits(count, x, cos, sin):
    """Calls outside ``jit`` on arrays sharded over several devices give the NumPy path's
    bits, as jitted ones do: they had taken the reference, 1-2 ulps off in float32 without
    x64 (``eager bits ok``)."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import posenc as pe

    mesh = jax.make_mesh((count,), ("d",))
    inv_freq = pe.rope_frequencies(16)[0]
    problems = []
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        a = x.astype(dtype)
        c, s = (t.astype(dtype) for t in (cos, sin))
        for spec in (P("d"), P(None, "d"), P(None, None, "d")):
            sharded = jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))
            for name, fn in (
                ("rope", lambda b: pe.rope(b, offset=5, inverse=True, layout="interleaved")),
                ("rope rotary_dim", lambda b: pe.rope(b, rotary_dim=8)),
                ("apply_rope", lambda b: pe.apply_rope(b, c, s)),
                ("rerotate", lambda b: pe.rerotate(b, 7, inv_freq)),
            ):
                got, want = fn(sharded), fn(a)
                if not np.array_equal(np.asarray(got), want):
                    problems.append(f"{name} {np.dtype(dtype).name} {spec}: off by {np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max()}")
                if tuple(got.sharding.spec)[: len(spec)] != tuple(spec):
                    problems.append(f"{name} {np.dtype(dtype).name} {spec}: sharding {got.sharding.spec}")
    print("eager bits", "ok" if not problems else "FAIL " + "; ".join(problems[:6]), flush=True)


def uncommitted(count, x, table):
    """Calls outside ``jit`` on uncommitted single-device arrays (``jnp.asarray``) give
    uncommitted results, as JAX's own operations: they had been committed to device 0, so a
    ``jit`` with ``in_shardings`` or beside a sharded array refused them. One line
    (``uncommitted ok``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import posenc as pe

    mesh = jax.make_mesh((count,), ("d",))
    sharded = jax.device_put(x, NamedSharding(mesh, P("d")))
    add = jax.jit(lambda a, b: a + b)
    double = jax.jit(lambda a: 2 * a, in_shardings=NamedSharding(mesh, P("d")))
    cases = {
        "rope": (pe.rope(jnp.asarray(x), offset=3), pe.rope(x, offset=3)),
        "rope bfloat16": (pe.rope(jnp.asarray(x, jnp.bfloat16), offset=3), pe.rope(np.asarray(jnp.asarray(x, jnp.bfloat16)), offset=3)),
        "rope gradient": (jax.grad(lambda a: jnp.sum(pe.rope(a, offset=3) * a))(jnp.asarray(x)), pe.rope(x, offset=3) + pe.rope(x, offset=3, inverse=True)),
    }
    problems = []
    for name, (got, want) in cases.items():
        if got.committed:
            problems.append(f"{name}: committed to {got.devices()}")
        if not np.allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-5, atol=1e-5):
            problems.append(f"{name}: values off")
        for use, fn, args in (("beside a sharded array", add, (got, sharded)), ("in_shardings", double, (got,))):
            try:
                fn(*args)
            except ValueError as error:
                problems.append(f"{name} {use}: {str(error)[:120]}")
    bias = pe.t5_bias(jnp.asarray(table), 12, 12)
    if bias.committed:
        problems.append(f"t5_bias: committed to {bias.devices()}")
    print("uncommitted", "ok" if not problems else "FAIL " + "; ".join(problems), flush=True)


def explicit(count, x, table):
    """On an Explicit mesh, under ``jit`` and outside it, calls whose operation splits an
    axis JAX cannot keep split there (per-token positions split on the sequence, a table
    split on its rows, or on its heads beside positions split over the same mesh axis, a
    convolution or a rotation along a split axis, the per-row lengths of a dynamic scaling,
    split or not, a Toeplitz expansion's gradient to a head-split table, Transformer-XL's
    per-head ``r`` beside head-split ``q``, per-batch ``r`` or DeBERTa tables beside batch-split ``q``,
    one offset per row split beside a batch-split ``x``, TENER's too): they had raised JAX's sharding errors. The values of the unsharded call and the result's spec,
    one line a case (``explicit ... ok``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import posenc as pe

    mesh = jax.make_mesh((count,), ("d",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(2)
    packed = rng.integers(0, 40, (4, 12))
    kernel = rng.standard_normal((3, 16)).astype(np.float32)
    weights = rng.standard_normal((1, 8)).astype(np.float32)
    dynamic, rows = pe.scaling.DynamicNTK(2.0, 8), np.array([0, 7, 50, 400])

    def t5_per_token(p):
        return pe.t5_bias(table, 12, 12, query_positions=p, key_positions=p)

    def t5_per_token_heads(p):
        split = jax.device_put(jnp.asarray(table), NamedSharding(mesh, P(None, "d")))
        return pe.t5_bias(split, 12, 12, query_positions=p, key_positions=p)

    def rows_split(a):  # (the lengths gathered too: they had been indexed while split, outside jit)
        return pe.rope(a, offset=jax.device_put(jnp.asarray(rows), NamedSharding(mesh, P("d")))[:, None, None], scaling=dynamic)

    def split_rows(values):
        return jax.device_put(jnp.asarray(values), NamedSharding(mesh, P("d")))

    near, fractional = np.array([0, 3, 5, 7]), np.arange(12, dtype=np.float32) + 0.5
    p_rows, eye = rng.standard_normal((20, 16)).astype(np.float32), np.eye(16, dtype=np.float32)
    attention = np.abs(rng.standard_normal((4, 8, 12, 12))).astype(np.float32)
    table_v = rng.standard_normal((7, 16)).astype(np.float32)

    # (one offset per batch row split beside a batch-split x: the rows had been unstacked or indexed while split)
    def rope_rows(a):  # (float positions without float64: each row the call of its own offset, outside jit)
        return pe.rope(a, fractional, offset=split_rows(near)[:, None, None])

    def tupe_rows(a):
        return pe.tupe_logits(a, a, p_rows, eye, eye, offset=split_rows(near))

    def shaw_rows(a):
        return pe.shaw_output(split_rows(attention), a, table_v, max_distance=3, offset=split_rows(near))

    r, u = rng.standard_normal((8, 24, 16)).astype(np.float32), rng.standard_normal((8, 1, 16)).astype(np.float32)

    def tener_rows(a):  # (each row's queries against its sinusoids: they had been unstacked while split)
        return pe.tener_logits(a, a, u, u, offset=split_rows(near))

    def xl(a):  # (r split on its heads as q: the matmul had refused a replicated r)
        return pe.xl_logits(a, a, jnp.asarray(r), jnp.asarray(u), jnp.asarray(u))

    rb, pb = rng.standard_normal((4, 8, 24, 16)).astype(np.float32), rng.standard_normal((4, 8, 6, 16)).astype(np.float32)

    def xl_batch(a):  # (a per-batch r: it had been replicated on its batch beside q split there, which the matmul refused)
        return pe.xl_logits(a, a, jnp.asarray(rb), jnp.asarray(u), jnp.asarray(u))

    def deberta_batch(a):
        return pe.deberta_logits(a, a, jnp.asarray(pb), jnp.asarray(pb), max_distance=3)

    def fire(p):
        return pe.fire_bias(lambda z: z @ jnp.asarray(weights), 12, 12, query_positions=p, key_positions=p)

    deberta_table = rng.standard_normal((16, 8)).astype(np.float32)

    def deberta_per_token(p):  # (the bucket logs had joined a split row to a replicated constant)
        return pe.relative_bias("deberta", deberta_table, 12, 12, query_positions=p, key_positions=p, max_distance=8, bucket_size=8, max_position=64)

    grid = np.stack([np.arange(12) // 4, np.arange(12) % 4], axis=-1)  # (3 x 4 tokens: a slice of channels per axis)
    padding = np.arange(12)[None, :] >= np.array([0, 3, 5, 12])[:, None]  # (left padding, one row all padding)
    weight = rng.standard_normal((64, 8)).astype(np.float32)  # a q projection [4 heads x 16, in]
    causal_mask = np.tril(np.ones((12, 12), bool))
    emb = rng.standard_normal((16, 16)).astype(np.float32)  # CoPE's position embeddings [P, d]
    grid4 = np.stack([np.arange(12) // 4, np.arange(12) % 4, np.arange(12) // 6, np.arange(12) % 3], axis=-1)  # (4 axes: split on them, each axis's coordinates had been sliced from a split axis)

    def deberta_logits_per_token(p):  # (p2c gathers at the transposed indices: split on the gathered axis)
        return pe.deberta_logits(x, x, pb[0], pb[0], max_distance=3, query_positions=p, key_positions=p)

    rows8 = rng.standard_normal((8, 8, 16)).astype(np.float32)  # [heads, 2K, d], K = 4

    def deberta_table_rows(t):  # (the per-token gather read the split rows)
        return pe.deberta_logits(x, x, t, t, max_distance=4, query_positions=packed, key_positions=packed)

    def t5_gradient(t):
        return jax.grad(lambda u: jnp.sum(pe.t5_bias(u, 12, 12) ** 2))(t)

    inv_freq = pe.rope_frequencies(16)[0].astype(np.float32)

    def causal_linear(a):
        return pe.linear_attention(a, a, a, causal=True)

    projection = rng.standard_normal((8, 8, 16)).astype(np.float32)  # TUPE's per-head Uq = Uk [heads, d_p, e]
    head_emb = rng.standard_normal((8, 16, 16)).astype(np.float32)  # (per head, replicated beside head-split q: the matmul had refused it)

    def tupe(p):  # (its rows had been taken at the queries' positions while split)
        return pe.tupe_logits(x, x, p, projection, projection)

    per_row = inv_freq * np.array([[1.0], [0.5], [0.25], [0.125]], np.float32)  # (one frequency set per batch row: each row had been read from the split rows)

    def tables(f):  # (a split inv_freq: its values had been read element by element, which JAX refuses eagerly)
        return jnp.stack(pe.rope_cos_sin(np.arange(12), f))

    def multimodal(f):  # (under jit the split frequencies had been picked section by section)
        return jnp.stack(pe.mrope_cos_sin(np.stack([np.arange(12), np.arange(12) // 4, np.arange(12) % 4]), f, [4, 2, 2]))

    cases = [  # name, function, argument, its spec, the result's spec, the unsharded result
        ("t5_bias per-token positions on the sequence", t5_per_token, packed, P(None, "d"), P(None, None, "d"), t5_per_token(packed)),
        ("t5_bias table rows", lambda t: pe.t5_bias(t, 12, 12), table, P("d"), P(), pe.t5_bias(table, 12, 12)),
        # (heads split over the mesh axis the positions' batch is split over: the heads are gathered)
        ("t5_bias head-split table, per-token positions on the batch", lambda p: t5_per_token_heads(p), packed, P("d"), P("d"), t5_per_token(packed)),
        ("fire_bias per-token positions on the batch", fire, packed, P("d"), P("d"), pe.fire_bias(lambda z: z @ weights, 12, 12, query_positions=packed, key_positions=packed)),
        ("fire_bias per-token positions on the sequence", fire, packed, P(None, "d"), P(None, None, "d"), pe.fire_bias(lambda z: z @ weights, 12, 12, query_positions=packed, key_positions=packed)),
        ("relative_bias deberta per-token positions on the batch", deberta_per_token, packed, P("d"), P("d"), deberta_per_token(packed)),
        ("relative_bias deberta per-token positions on the sequence", deberta_per_token, packed, P(None, "d"), P(None, None, "d"), deberta_per_token(packed)),
        ("deberta_logits per-token positions on the sequence", deberta_logits_per_token, packed, P(None, "d"), P(None, None, "d"), deberta_logits_per_token(packed)),
        ("deberta_logits per-token positions, tables split on their rows", deberta_table_rows, rows8, P(None, "d"), P(), deberta_table_rows(rows8)),
        ("conv_positions batch", lambda a: pe.conv_positions(a, kernel), x, P("d"), P("d"), pe.conv_positions(x, kernel)),
        ("conv_positions sequence", lambda a: pe.conv_positions(a, kernel), x, P(None, None, "d"), P(None, None, "d"), pe.conv_positions(x, kernel)),
        ("rope channels", lambda a: pe.rope(a, offset=3), x, P(None, None, None, "d"), P(None, None, None, "d"), pe.rope(x, offset=3)),
        ("axial_rope channels", lambda a: pe.axial_rope(a, grid), x, P(None, None, None, "d"), P(None, None, None, "d"), pe.axial_rope(x, grid)),
        ("rope dynamic per-row offsets", lambda a: pe.rope(a, offset=jnp.asarray(rows)[:, None, None], scaling=dynamic), x, P("d"), P("d"), pe.rope(x, offset=rows[:, None, None], scaling=dynamic)),
        ("rope dynamic per-row offsets split beside x", rows_split, x, P("d"), P("d"), pe.rope(x, offset=rows[:, None, None], scaling=dynamic)),
        ("rope float positions, per-row offsets split beside x", rope_rows, x, P("d"), P("d"), pe.rope(x, fractional, offset=near[:, None, None])),
        ("tupe_logits per-row offsets split beside q", tupe_rows, x, P("d"), P("d"), pe.tupe_logits(x, x, p_rows, eye, eye, offset=near)),
        ("shaw_output per-row offsets split beside weights and v", shaw_rows, x, P("d"), P("d"), pe.shaw_output(attention, x, table_v, max_distance=3, offset=near)),
        ("tener_logits per-row offsets split beside q", tener_rows, x, P("d"), P("d"), pe.tener_logits(x, x, u, u, offset=near)),
        ("xl_logits head-split q and k, per-head r", xl, x, P(None, "d"), P(None, "d"), pe.xl_logits(x, x, r, u, u)),
        ("xl_logits batch-split q and k, per-batch r", xl_batch, x, P("d"), P("d"), pe.xl_logits(x, x, rb, u, u)),
        ("deberta_logits batch-split q and k, per-batch tables", deberta_batch, x, P("d"), P("d"), pe.deberta_logits(x, x, pb, pb, max_distance=3)),
        ("t5_bias gradient to head-split table", t5_gradient, table, P(None, "d"), P(None, "d"), np.asarray(t5_gradient(jnp.asarray(table)))),
        ("rope_cos_sin inv_freq split", tables, inv_freq, P("d"), P(None, None, "d"), np.asarray(tables(inv_freq))),
        ("rope_cos_sin per-row inv_freq split on its rows", tables, per_row, P("d"), P(None, "d"), np.asarray(tables(per_row))),
        ("mrope_cos_sin inv_freq split", multimodal, inv_freq, P("d"), P(None, None, "d"), np.asarray(multimodal(inv_freq))),
        ("axial_rope grid split on its coordinates", lambda g: pe.axial_rope(x, g), grid4, P(None, "d"), P(), pe.axial_rope(x, grid4)),
        ("cope_logits pos_emb split on its rows", lambda e: pe.cope_logits(x, x, e), emb, P("d"), P(), pe.cope_logits(x, x, emb)),
        # (eagerly its zero column, replicated, had been joined to a split x; a split last axis had been padded to 17 under jit)
        ("rel_shift heads", pe.rel_shift, x, P(None, "d"), P(None, "d"), pe.rel_shift(x)),
        ("rel_shift last axis", pe.rel_shift, x, P(None, None, None, "d"), P(None, None, None, "d"), pe.rel_shift(x)),
        # (a running count or sum along a split axis: JAX refuses the cumulative sum)
        ("positions_from_mask mask on the sequence", pe.positions_from_mask, padding, P(None, "d"), P(None, "d"), pe.positions_from_mask(padding)),
        ("positions_from_cu_seqlens split boundaries", lambda c: pe.positions_from_cu_seqlens(c, 12, check_traced=False), np.array([0, 3, 5, 12]), P("d"), P(), pe.positions_from_cu_seqlens(np.array([0, 3, 5, 12]), 12)),
        ("linear_attention causal sequence", causal_linear, x, P(None, None, "d"), P(None, None, "d"), causal_linear(x)),
        ("permute_qk_weight rows", lambda w: pe.permute_qk_weight(w, "interleaved", "half", head_dim=16), weight, P("d"), P("d"), pe.permute_qk_weight(weight, "interleaved", "half", head_dim=16)),
        ("apply_absolute table rows", lambda t: pe.apply_absolute(x, t, offset=4), emb, P("d"), P(), pe.apply_absolute(x, emb, offset=4)),
        ("apply_absolute per-row offsets", lambda o: pe.apply_absolute(x[:, 0], emb, offset=o), np.array([0, 1, 3, 4]), P("d"), P(), pe.apply_absolute(x[:, 0], emb, offset=np.array([0, 1, 3, 4]))),
        ("hierarchical_extend table rows", lambda t: pe.hierarchical_extend(t, 40), emb, P("d"), P(), pe.hierarchical_extend(emb, 40)),
        ("tupe_logits p rows", tupe, emb[:, :8], P("d"), P(), tupe(emb[:, :8])),
        ("mrope_cos_sin positions split on their sections", lambda p: jnp.stack(pe.mrope_cos_sin(p, inv_freq, [2, 2, 2, 2])), grid4.T, P("d"), P(), np.stack(pe.mrope_cos_sin(grid4.T, inv_freq, [2, 2, 2, 2]))),
        ("xdrope_cos_sin positions split on their sections", lambda p: jnp.stack(pe.xdrope_cos_sin(p, inv_freq, [2, 2, 2, 2])), grid4.T, P("d"), P(), np.stack(pe.xdrope_cos_sin(grid4.T, inv_freq, [2, 2, 2, 2]))),
        ("cope_positions mask split on the keys", lambda m: pe.cope_positions(x, x, mask=m), causal_mask, P(None, "d"), P(None, None, None, "d"), pe.cope_positions(x, x, mask=causal_mask)),
        ("cope_logits head-split q and k, per-head pos_emb", lambda a: pe.cope_logits(a, a, head_emb), x, P(None, "d"), P(None, "d"), pe.cope_logits(x, x, head_emb)),
        # (split per-head tables beside unsplit q: gathered, where the matmul had refused them)
        ("deberta_logits head-split tables, q unsplit", lambda t: pe.deberta_logits(x, x, t, t, max_distance=3), pb[0], P("d"), P(), pe.deberta_logits(x, x, pb[0], pb[0], max_distance=3)),
        ("xl_logits head-split r, q unsplit", lambda t: pe.xl_logits(x, x, t, u, u), r, P("d"), P(), pe.xl_logits(x, x, r, u, u)),
        ("convert_layout channels", lambda a: pe.convert_layout(a, "interleaved", "half"), x, P(None, None, None, "d"), P(None, None, None, "d"), pe.convert_layout(x, "interleaved", "half")),
    ]  # fmt: skip
    with jax.set_mesh(mesh):  # (an explicit mesh's grad needs it, as plain JAX's does)
        for name, fn, arg, spec, want_spec, want in cases:
            problems = []
            for mode, call in (("jit", jax.jit(fn)), ("eager", fn)):
                try:
                    got = call(jax.device_put(jnp.asarray(arg), NamedSharding(mesh, spec)))
                except Exception as error:  # noqa: BLE001  (reported on the line)
                    problems.append(f"{mode}: {type(error).__name__} {str(error)[:160]}")
                    continue
                if not np.allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5):
                    problems.append(f"{mode}: values off by {np.abs(np.asarray(got) - want).max()}")
                have = tuple(jax.typeof(got).sharding.spec)
                if have + (None,) * (got.ndim - len(have)) != tuple(want_spec) + (None,) * (got.ndim - len(want_spec)):
                    problems.append(f"{mode}: sharding {have}, wanted {want_spec}")
            print(f"explicit {name}", "ok" if not problems else "FAIL " + "; ".join(problems), flush=True)


def _with_mesh(jax, mesh, fn, *args):
    with jax.set_mesh(mesh):
        return fn(*args)


if __name__ == "__main__":
    main(int(sys.argv[1]))
