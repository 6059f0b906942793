"""The README's install section, tried as a new user would: a fresh venv with only ``pip install .``."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from arrays import gpu_run

ROOT = pathlib.Path(__file__).resolve().parents[1]

# make test-gpu runs on a GPU machine, which need not reach a package index (the build
# backend is installed from one): installing as a new user would is make test's check.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(gpu_run(), reason="the install from an index is make test's check, not make test-gpu's")]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new virtual environment with posenc installed from this checkout, nothing else asked for."""
    path = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)], check=True, timeout=1200)
    return path / "bin"


def _run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)


def test_only_the_core_dependencies_are_installed(venv):
    listed = _run([str(venv / "python"), "-m", "pip", "list", "--format=freeze"]).stdout.lower()
    names = {line.split("==")[0] for line in listed.split()}
    assert {"posenc", "numpy", "numba", "array-api-compat"} <= names
    assert not names & {"torch", "jax", "dask", "matplotlib", "scipy"}


def test_version(venv):
    import posenc

    out = _run([str(venv / "posenc"), "--version"])
    assert out.returncode == 0 and posenc.__version__ in out.stdout


def test_demo_runs_and_skips_torch_cleanly(venv):
    out = _run([str(venv / "posenc"), "demo"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "torch skipped: not installed (pip install 'posenc[torch]')" in out.stdout.splitlines()[0]
    assert out.stdout.rstrip().endswith("demo finished: no failures")


def test_numpy_rope_matches_the_formula(venv):
    code = (
        "import numpy as np, posenc as pe\n"
        "x = np.random.default_rng(0).standard_normal((2, 3, 5, 8))\n"
        "theta = 10000.0 ** (-np.arange(4) / 4)\n"
        "angle = np.arange(5)[:, None] * theta\n"
        "c, s = np.cos(angle), np.sin(angle)\n"
        "a, b = x[..., :4], x[..., 4:]\n"
        "want = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)\n"
        "assert np.allclose(pe.rope(x), want, rtol=1e-12, atol=1e-12)\n"
        "print('ok')\n"
    )
    out = _run([str(venv / "python"), "-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_posenc_torch_without_torch_names_the_extra(venv):
    out = _run([str(venv / "python"), "-c", "import posenc.torch"])
    assert out.returncode != 0
    assert "ImportError: posenc.torch needs PyTorch: pip install 'posenc[torch]'" in out.stderr
