"""First calls: how long a new process waits before posenc answers.

Each ``track_`` runs a fresh Python process and reports seconds (as asv ``track_``
values, since a compile can only be timed once per cache):

* ``cold``: an empty ``NUMBA_CACHE_DIR``, so the call compiles its kernel (once per machine);
* ``warm``: a second process on that cache: ``import posenc`` plus the first call, the
  kernel loaded from the cache (for ``apply_rope``, which runs after a ``rope`` call:
  ``import`` plus ``apply_rope``'s own first call).

The calls are ``pe.rope`` on float32 ``[1, 8, 128, 64]``, ``pe.apply_rope`` after it (its
own kernel), and ``pe.t5_bias`` (the Toeplitz expansion). ``python -m
benchmarks.first_call`` (from ``asv_benchmarks``) prints the same figures as a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# The child: import, then each call once, timed; prints {name: seconds} as JSON.
_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import posenc as pe
timings = {"import": time.perf_counter() - t0}
x = np.random.default_rng(0).standard_normal((1, 8, 128, 64)).astype(np.float32)
table = np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32)
calls = {
    "rope": lambda: pe.rope(x),
    "apply_rope": lambda: pe.apply_rope(x, *pe.rope_cos_sin(np.arange(128), pe.rope_frequencies(64)[0], dtype=np.float32)),
    "t5_bias": lambda: pe.t5_bias(table, 128, 128),
}
for name in sys.argv[1:]:
    t = time.perf_counter()
    calls[name]()
    timings[name] = time.perf_counter() - t
print(json.dumps(timings))
"""

CALLS = ("rope", "apply_rope", "t5_bias")
# What runs in the process before each timed call: apply_rope is timed after a rope call,
# as in the issue that asked for these figures, so it shows only its own kernel's cost.
_BEFORE = {"apply_rope": ("rope",)}


def run(cache_dir, calls=CALLS):
    """Seconds of ``import`` and each of ``calls`` in a new process using ``cache_dir``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, *calls], env=env, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(calls=CALLS):
    """``{call: (cold, warm)}``: each call's cold run and a warm run on its cache, one empty cache per call."""
    results = {}
    for call in calls:
        sequence = [*_BEFORE.get(call, ()), call]
        with tempfile.TemporaryDirectory() as cache:
            results[call] = (run(cache, sequence), run(cache, sequence))
    return results


class FirstCall:
    """Cold and warm first calls, each in its own process (measured once, in ``setup_cache``)."""

    params = [list(CALLS)]
    param_names = ["call"]
    timeout = 900

    def setup_cache(self):
        return measure()

    def track_cold(self, results, call):
        return results[call][0][call]

    def track_warm_with_import(self, results, call):
        warm = results[call][1]
        return warm["import"] + warm[call]

    track_cold.unit = track_warm_with_import.unit = "seconds"


def main():
    rows = [(call, cold[call], warm["import"], warm[call]) for call, (cold, warm) in measure().items()]
    print("| call | cold first call (s) | warm: import (s) | warm: first call (s) | warm total (s) |")
    print("|---|---|---|---|---|")
    for call, cold, imp, first in rows:
        print(f"| `{call}` | {cold:.2f} | {imp:.2f} | {first:.2f} | {imp + first:.2f} |")


if __name__ == "__main__":
    main()
