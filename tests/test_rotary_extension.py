"""Drift-free context extension in a growing KV cache (docs/rotary.md, "Context extension
in a growing cache"): after 1000 decode steps past the original length the keys are as
accurate as keys rotated from scratch, in float32, float16 and bfloat16.

The recipe under test keeps every key as first rotated (with the frequencies of the
original length) and gives attention one rerotation of that cache to the current
frequencies per step: each key is rounded twice, never a chain of rerotations.
The reference is the float64 rotation of the same (rounded) keys."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

L, D, STEPS = 32, 16, 1000
SCALINGS = {
    "dynamic NTK": pe.scaling.DynamicNTK(4.0, L),
    "LongRoPE switch": pe.scaling.LongRoPE([1.0] * (D // 2), list(np.linspace(1.0, 8.0, D // 2)), L),
    "YaRN switch": pe.scaling.YaRN(8.0, L),
}


def _arrays(dtype):
    """(namespace module, array maker, eps) for a dtype name; bfloat16 through torch."""
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        return torch, lambda a: torch.from_numpy(a).to(torch.bfloat16), float(torch.finfo(torch.bfloat16).eps)
    return np, lambda a: a.astype(dtype), float(np.finfo(dtype).eps)


def _float64(a):
    return np.asarray(a.double() if hasattr(a, "double") else a, dtype=np.float64)


def _frequencies(scaling, n):
    """What a call at length ``n`` rotates with: (inv_freq, attention_scale). YaRN stands for
    a switch at the original length: the original frequencies up to it, YaRN's after."""
    if isinstance(scaling, pe.scaling.YaRN) and n <= L:
        return pe.rope_frequencies(D)
    return pe.rope_frequencies(D, scaling=scaling, seq_len=n)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_a_growing_cache_stays_at_the_from_scratch_error_for_1000_steps(name, dtype, rng):
    xp, make, eps = _arrays(dtype)
    scaling = SCALINGS[name]
    raw = make(rng.standard_normal((1, L + STEPS, D)))  # [heads, seq, dim], keys before rotation
    first_freq, first_scale = _frequencies(scaling, L)
    # The cache: every key rotated once, with the frequencies and scale of the original length.
    cache = pe.rope(raw, xp.arange(L + STEPS), scaling=scaling, seq_len=L) if name != "YaRN switch" else pe.rope(raw)
    work = cache * 1
    for n in range(L + 1, L + STEPS + 1):
        freq, scale = _frequencies(scaling, n)
        keys = pe.rerotate(cache[:, :n], xp.arange(n), first_freq, new_inv_freq=freq, out=work[:, :n])
        if scale != first_scale:
            keys *= scale / first_scale
    n = L + STEPS
    exact = _float64(pe.rope(_float64(raw), scaling=scaling, seq_len=n))
    scratch = _float64(pe.rope(raw, scaling=scaling, seq_len=n)) - exact
    drift = _float64(keys) - exact
    top = float(np.abs(exact).max())
    # Two roundings per key (first rotation, one rerotation) and, for YaRN, the scale.
    assert np.abs(drift).max() <= np.abs(scratch).max() + 3 * eps * top
    assert np.linalg.norm(drift) <= 2 * np.linalg.norm(scratch) + eps * np.linalg.norm(exact)


def test_rotating_at_attention_time_is_the_from_scratch_rotation(rng):
    # The other recipe: keep keys unrotated, rotate the cache in every step (out= a buffer).
    scaling, raw = SCALINGS["dynamic NTK"], rng.standard_normal((2, L + 50, D)).astype(np.float16)
    buffer = np.empty_like(raw)
    for n in (L, L + 1, L + 50):
        keys = pe.rope(raw[:, :n], scaling=scaling, seq_len=n, out=buffer[:, :n])
        np.testing.assert_array_equal(keys, pe.rope(raw[:, :n], scaling=scaling))
