"""Hostile inputs: every public function, random invalid arguments, in a child process.

The child (``hostile/fuzz_public_api.py``) reports each call that raised anything but a
``ValueError``/``TypeError`` with a message; a crash of the child (a kernel touching
memory it should not) fails this test through its exit status.
"""

import json
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
