"""Drift of a growing KV cache past the original length (docs/rotary.md, "Context
extension in a growing cache"), and the cost of a step of each recipe.

``python docs/rope_drift.py [STEPS]`` prints, for dynamic NTK and a LongRoPE switch and for
float32, float16 and bfloat16 keys (torch), the error after STEPS decode steps past the
original length 32 of: the chained rerotations (rerotate from step n's frequencies to
step n + 1's, every step), one rerotation from the first frequencies, and rotating
unrotated keys at attention time; then the time of one step of each on a 4k cache.
"""

from __future__ import annotations

import sys
import timeit

import numpy as np

import posenc as pe

L, D, HEADS = 32, 64, 2


def drift(steps, scaling, dtype):
    """Max error (in eps of ``dtype``) and relative norm error of each recipe after ``steps``."""
    import torch

    eps = torch.finfo(dtype).eps
    raw = torch.from_numpy(np.random.default_rng(0).standard_normal((1, HEADS, L + steps, D))).to(dtype)
    n = L
    chained = pe.rope(raw[:, :, :n], scaling=scaling, seq_len=n)
    first = pe.rope(raw, scaling=scaling, seq_len=L)  # every key rotated once, original length
    first_freq, _ = pe.rope_frequencies(D, scaling=scaling, seq_len=L)
    for n in range(L, L + steps):
        old, _ = pe.rope_frequencies(D, scaling=scaling, seq_len=n)
        new, _ = pe.rope_frequencies(D, scaling=scaling, seq_len=n + 1)
        chained = pe.rerotate(chained, torch.arange(n), old, new_inv_freq=new)
        key = pe.rope(raw[:, :, n : n + 1], scaling=scaling, offset=n, seq_len=n + 1)
        chained = torch.cat([chained, key], dim=2)
    n = L + steps
    now, _ = pe.rope_frequencies(D, scaling=scaling, seq_len=n)
    recipes = {
        "chained": chained,
        "rerotate once from first": pe.rerotate(first, torch.arange(n), first_freq, new_inv_freq=now),
        "rotate at attention": pe.rope(raw, scaling=scaling, seq_len=n),
    }
    exact = pe.rope(raw.double(), scaling=scaling, seq_len=n).numpy()
    out = {}
    for name, keys in recipes.items():
        err = keys.double().numpy() - exact
        out[name] = (np.abs(err).max() / eps, np.linalg.norm(err) / np.linalg.norm(exact))
    return out


def step_times(n=4096, heads=8, dim=128):
    """Seconds per decode step of each recipe on a float16 cache ``[1, heads, n, dim]``."""
    import torch

    scaling = pe.scaling.DynamicNTK(4.0, L)
    raw = torch.randn(1, heads, n, dim).to(torch.float16)
    cache, work = pe.rope(raw, scaling=scaling, seq_len=L), torch.empty_like(raw)
    pos = torch.arange(n)
    first, _ = pe.rope_frequencies(dim, scaling=scaling, seq_len=L)
    old, _ = pe.rope_frequencies(dim, scaling=scaling, seq_len=n - 1)
    new, _ = pe.rope_frequencies(dim, scaling=scaling, seq_len=n)
    calls = {
        "chained (in place)": lambda: pe.rerotate(cache, pos, old, new_inv_freq=new, out=cache),
        "rerotate once from first": lambda: pe.rerotate(cache, pos, first, new_inv_freq=new, out=work),
        "rotate at attention": lambda: pe.rope(raw, scaling=scaling, seq_len=n, out=work),
    }
    return {name: min(timeit.repeat(call, number=5, repeat=5)) / 5 for name, call in calls.items()}


def main(steps):
    import torch

    scalings = {
        "dynamic NTK": pe.scaling.DynamicNTK(4.0, L),
        "LongRoPE": pe.scaling.LongRoPE([1.0] * (D // 2), list(np.linspace(1.0, 8.0, D // 2)), L),
    }
    for label, scaling in scalings.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            row = drift(steps, scaling, dtype)
            text = " | ".join(f"{k}: {e:6.1f} eps, rel norm {r:.2e}" for k, (e, r) in row.items())
            print(f"{label:11s} {str(dtype)[6:]:9s} {text}", flush=True)
    for name, seconds in step_times().items():
        print(f"one step, 4k float16 cache [1, 8, 4096, 128], {name}: {seconds * 1e3:.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
