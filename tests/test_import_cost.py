"""``import posenc`` stays light: no numba, framework or dask import (checked in a child)."""

import subprocess
import sys

HEAVY = ("numba", "torch", "cupy", "jax", "dask", "transformers", "matplotlib")


def test_import_posenc_imports_no_heavy_module():
    code = "import sys, posenc; print(' '.join(m for m in %r if m in sys.modules))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import posenc imported: {out.stdout.strip()}"
