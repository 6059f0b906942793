"""Demo steps for the absolute family (see ``posenc._demo``)."""

import numpy as np

import posenc as pe
from posenc._demo import describe, step


@step("sinusoidal")
def _sinusoidal(a):
    p = pe.sinusoidal(a.asarray(np.arange(1024)), 64)
    s = pe.sinusoidal(a.asarray(np.arange(1024)), 64, layout="half")
    return f"{describe(p)}; p[1,:2]={[round(float(v), 4) for v in p[1, :2]]}; half layout {describe(s)}"


@step("learned + hierarchical")
def _learned(a):
    table = a.asarray(np.random.default_rng(0).standard_normal((512, 64)), a.float32)
    ext = pe.hierarchical_extend(table, 512 * 16)
    same = bool(a.xp.all(ext[:512, ...] == table))
    return f"table (512, 64) -> {describe(ext)}; first 512 rows unchanged: {same}"


@step("FLOATER (RK4)", skip={"dask": "a sequential ODE solve, not a chunked computation (its graph grows by thousands of tasks per position)"})
def _floater(a):
    f = pe.floater(32, 16, xp=a.xp)
    err = float(a.xp.max(a.xp.abs(f - pe.sinusoidal(32, 16, xp=a.xp))))
    return f"{describe(f)}; max |FLOATER - sinusoid| = {err:.1e}"


@step("apply_absolute (add, mult)")
def _apply(a):
    x = a.asarray(np.ones((2, 16, 64)), a.float32)
    table = pe.sinusoidal(a.asarray(np.arange(32)), 64)
    added = pe.apply_absolute(x, table, offset=8)
    multiplied = pe.apply_absolute(x, table, mode="multiply")
    return f"x (2, 16, 64) + table[8:24] -> {describe(added)}; x * table -> {describe(multiplied)}"


@step("complex order")
def _complex(a):
    rng = np.random.default_rng(1)
    r, w, th = (a.asarray(rng.uniform(0.5, 1.5, (8, 16)), a.float32) for _ in range(3))
    z = pe.complex_order(r, w, th, a.asarray(np.arange(8)))
    return f"{describe(z)}; |z| = amplitude: {bool(a.xp.all(a.xp.abs(a.xp.abs(z) - r) < 1e-5))}"


@step("convolutional")
def _conv(a):
    x = a.asarray(np.random.default_rng(2).standard_normal((2, 16, 8)), a.float32)
    k = a.asarray(np.full((3, 8), 1 / 3), a.float32)
    return f"kernel width 3 -> {describe(pe.conv_positions(x, k))}"


@step("relative_positions")
def _rel(a):
    rel = pe.relative_positions(3, 4, offset=1, xp=a.xp)
    return f"{describe(rel)}; rel[0] = {[int(v) for v in rel[0, :]]} (query - key)"


@step("attention (causal)")
def _attention(a):
    rng = np.random.default_rng(3)
    q, k, v = (a.asarray(rng.standard_normal((4, 8, 16)), a.float32) for _ in range(3))
    return describe(pe.attention(q, k, v, causal=True))
