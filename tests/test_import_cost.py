"""``import posenc`` stays light: no numba, framework or dask import (checked in a child)."""

import subprocess
import sys

HEAVY = ("numba", "torch", "cupy", "jax", "dask", "transformers", "matplotlib")


def _loaded_after(code, modules):
    """Which of ``modules`` a new interpreter has imported once it has run ``code``."""
    probe = code + "\nimport sys; print(' '.join(m for m in %r if m in sys.modules))" % (tuple(modules),)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_import_posenc_imports_no_heavy_module():
    loaded = _loaded_after("import posenc", HEAVY)
    assert loaded == [], f"import posenc imported: {' '.join(loaded)}"


def test_calls_that_need_no_kernel_do_not_import_numba():
    """Numba's start-up (its import and CPU target, about half a second) is paid by the first
    call that runs a kernel, never by tables and indices that are plain array code."""
    code = (
        "import numpy as np, posenc as pe\n"
        "inv_freq, _ = pe.rope_frequencies(64)\n"
        "pe.sinusoidal(16, 8); pe.rope_cos_sin(np.arange(4), inv_freq); pe.relative_positions(3, 5)\n"
        "pe.t5_bucket(np.arange(-4, 4)); pe.alibi_slopes(8)"
    )
    assert _loaded_after(code, ["numba"]) == []
