"""Backend selection and the kernel registry (unknown backends, mixed devices: test_bad_inputs.py)."""

import os
import subprocess
import sys
import threading

import posenc as pe
from posenc import _dispatch


def test_set_and_use_backend():
    assert pe.get_backend() == "auto"
    with pe.use_backend("reference"):
        assert pe.get_backend() == "reference"
    assert pe.get_backend() == "auto"
    pe.set_backend("reference")
    try:
        assert pe.get_backend() == "reference"
    finally:
        pe.set_backend("auto")


def test_use_backend_is_per_thread():
    seen = []
    with pe.use_backend("reference"):
        t = threading.Thread(target=lambda: seen.append(pe.get_backend()))
        t.start()
        t.join()
    assert seen == ["auto"]


def test_environment_variable_forces_reference():
    code = "import posenc; print(posenc.get_backend())"
    env = {"POSENC_BACKEND": "reference", "PATH": "", **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "reference"


def test_an_unknown_backend_in_the_environment_names_the_variable():
    env = {"POSENC_BACKEND": "kernels", "PATH": "", **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}}
    out = subprocess.run([sys.executable, "-c", "import posenc"], capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == "ValueError: the environment variable POSENC_BACKEND must be one of 'auto', 'reference', got 'kernels'"


def test_registry_selects_first_accepting_kernel_and_reference_backend():
    op = "test_registry_op"
    _dispatch.reference(op)(lambda x: ("reference", x))
    kernel = _dispatch.register(op, f"{op}.fake", accepts=lambda a: a["x"] > 0, loader="builtins:abs")
    try:
        assert _dispatch.call(op, -3) == ("reference", -3)
        assert _dispatch.call(op, 3) == 3
        with pe.use_backend("reference"):
            assert _dispatch.call(op, 3) == ("reference", 3)
    finally:
        _dispatch._kernels.pop(op)
        _dispatch._references.pop(op)
        _dispatch._parameters.pop(op)
    assert kernel.load() is abs
