"""Run by tests/test_jax_pipeline.py in a child process (the forced host device count must
be set before JAX initialises): posenc's kernel ops inside ``jax.shard_map``, whose types
track the manual mesh axes a value varies along. Prints one line per check: ``name ok`` or
a failure."""

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
    x = jnp.asarray(rng.standard_normal((count, 2, 6, 8)), jnp.float32)
    table = jnp.asarray(rng.standard_normal((32, 2)), jnp.float32)
    positions = jnp.asarray(rng.integers(0, 50, (count, 6)))
    weights = jnp.arange(8.0)
    dynamic = pe.scaling.DynamicNTK(2.0, 3)

    def put(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec))

    cases = {  # name: (per-device function, in_specs, out_specs, arguments)
        # x varies along d (its rows), the positions made from the offset do not
        "grad of rope": (lambda a: jax.grad(lambda b: jnp.sum(pe.rope(b, offset=3) * weights))(a), (P("d"),), P("d"), (put(x, P("d")),)),
        "grad of rope at a traced length": (
            lambda a, o: jax.grad(lambda b: jnp.sum(pe.rope(b, offset=o[0], scaling=dynamic) * weights))(a), (P("d"), P("d")), P("d"),
            (put(x, P("d")), put(jnp.arange(count) * 5, P("d"))),
        ),
        # x the same on every device, the positions (offsets) not: x's cotangent sums over d
        "grad of rope, x replicated": (
            lambda a, p: jax.grad(lambda b: jnp.sum(pe.rope(b, p[0]) ** 2 * weights))(a), (P(), P("d")), P(), (put(x[:1], P()), put(positions, P("d"))),
        ),
        "grad of t5_bias, table replicated": (
            lambda t, o: jax.grad(lambda u: jnp.sum(pe.t5_bias(u, 3, 5, offset=o[0]) * jnp.arange(5.0)))(t), (P(), P("d")), P(),
            (put(table, P()), put(jnp.arange(count) * 7, P("d"))),
        ),
    }
    for name, (fn, in_specs, out_specs, args) in cases.items():
        mapped = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
        try:
            got = mapped(*args)
            with pe.use_backend("reference"):  # (JAX's own operations: the expected values)
                want = mapped(*args)
        except Exception as error:  # noqa: BLE001  (reported on the line)
            print(name, "FAIL", type(error).__name__, str(error)[:200], flush=True)
            continue
        off = float(jnp.max(jnp.abs(got - want)))
        print(name, "ok" if off <= 1e-4 * (1 + float(jnp.max(jnp.abs(want)))) else f"FAIL values off by {off}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
