"""Child process for the caching tests: run each kernel path once and save the results.

Usage: ``python kernel_run.py OUT.npz``. Prints which implementation ran for each case.
"""

import sys

import numpy as np

import posenc as pe
from posenc import _dispatch


def cases():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 64, 32)).astype(np.float32)
    table = rng.standard_normal((32, 4)).astype(np.float32)
    q = rng.standard_normal((2, 4, 16, 8))
    return {
        "rope": (lambda: pe.rope(x, offset=2**31 - 100), ("rope_rotate", (x, np.arange(64), np.ones(16)), {})),
        "t5_bias": (lambda: pe.t5_bias(table, 48, 64, offset=3), ("toeplitz_expand", (table.T.copy(), 48, 64 - 47), {})),
        "shaw_logits": (lambda: pe.shaw_logits(q, q, rng.standard_normal((9, 8)), max_distance=4), None),
    }


def main(path):
    print(f"posenc from {pe.__file__}")
    results = {}
    for name, (fn, probe) in cases().items():
        results[name] = fn()
        if probe is not None:
            op, args, kwargs = probe
            impl = _dispatch.select(op, *args, **kwargs)
            print(f"{name}: {impl.__module__}.{impl.__name__}")
    np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])
