"""Hostile inputs: every public function, random invalid arguments, in a child process.

The child (``hostile/fuzz_public_api.py``) reports each call that raised anything but a
``ValueError``/``TypeError`` with a message; a crash of the child (a kernel touching
memory it should not) fails this test through its exit status.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parent / "hostile" / "fuzz_public_api.py"


@pytest.mark.slow
def test_public_functions_reject_hostile_input_cleanly():
    proc = subprocess.run([sys.executable, str(SCRIPT), "100"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"fuzz child died (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["functions"] > 0 and report["calls"] > 0
    assert not report["failures"], "\n".join(report["failures"])


KERNEL_FUZZ = pathlib.Path(__file__).parent / "hostile" / "fuzz_kernel_layouts.py"


@pytest.mark.slow
def test_kernels_match_the_reference_under_hostile_layouts():
    """The CPU kernels against the reference on transposed, sliced, negatively strided,
    unaligned, byte-swapped and broadcast operands, ``out=`` in place, apart, overlapping
    and wrong, every positions dtype near its limits: the same outcome and numbers, the
    same bits whatever the layout and on a cached plan, nothing written outside ``out``
    (``hostile/fuzz_kernel_layouts.py``; run it with ``NUMBA_ENABLE_CUDASIM=1`` for the
    CUDA kernels)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(KERNEL_FUZZ), "150", "2024"], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"fuzz child died (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["functions"] > 10 and report["cases"] > 2000
    assert not report["defects"], "\n".join(report["defects"])
