"""``out=`` against allocating, at a decode step and on a cache (issue 23: ``out=`` never slower).

``python docs/out_bench.py [numpy,torch] [1,8,1,128]`` prints, for ``rope(x, offset=7)``,
``apply_rope(x, cos, sin)`` and ``rerotate(x, -1, inv_freq)`` on a float32 ``x`` of the
given shape, the best per-call process CPU time of the allocating call, of ``out=x`` (in
place) and of ``out=buf`` (a separate buffer), measured interleaved (each round times every
variant once) over many rounds, with each variant's ratio to the allocating call. Process
CPU time rather than wall time: on a shared machine it moves less with the other jobs. Run
it with ``NUMBA_NUM_THREADS=1`` for one thread's figures.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import posenc as pe


def _per_call(fn, number):
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number


def compare(calls, number, rounds):
    """Best seconds per call of each of ``calls`` (a dict), interleaved round by round."""
    for fn in calls.values():
        fn()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, fn in calls.items():
            best[name] = min(best[name], _per_call(fn, number))
    return best


def main(libraries, shape):
    elements = int(np.prod(shape))
    number, rounds = max(10, 1_000_000 // (elements * 8) or 1), 15 if elements > 100_000 else 30
    for lib in libraries:
        if lib == "torch":
            import torch

            wrap, arange = torch.from_numpy, torch.arange
        else:
            wrap, arange = np.asarray, np.arange
        keys = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        # Each variant reads its own copy: the in-place one rewrites its copy on every call,
        # which would leave the others' input dirty in the caches (at 2 MB, up to 9% on them).
        x_alloc, x_in_place, x_buf = (wrap(keys.copy()) for _ in range(3))
        buf = wrap(np.empty(shape, np.float32))
        inv_freq, _ = pe.rope_frequencies(shape[-1])
        cos, sin = pe.rope_cos_sin(arange(shape[-2]) + 7, inv_freq)
        cases = {
            "rope": lambda x, **out: pe.rope(x, offset=7, **out),
            "apply_rope": lambda x, **out: pe.apply_rope(x, cos, sin, **out),
            "rerotate": lambda x, **out: pe.rerotate(x, -1, inv_freq, **out),
        }
        for name, call in cases.items():
            variants = {
                "alloc": lambda call=call: call(x_alloc),
                "out=x": lambda call=call: call(x_in_place, out=x_in_place),
                "out=buf": lambda call=call: call(x_buf, out=buf),
            }
            best = compare(variants, number, rounds)
            cells = "  ".join(f"{k} {v * 1e6:8.1f} us ({v / best['alloc']:.3f})" for k, v in best.items())
            print(f"{lib:5s} {name:10s} {list(shape)}  {cells}", flush=True)


if __name__ == "__main__":
    libraries = sys.argv[1].split(",") if len(sys.argv) > 1 else ["numpy", "torch"]
    shape = tuple(int(n) for n in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 8, 1, 128)
    main(libraries, shape)
