"""``make test-gpu``'s first step: exit with a clear message unless this interpreter can run the GPU suite."""

import importlib.util
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path


def older_than_required(requirements, version_of):
    """A message for each ``"name>=minimum"`` of ``requirements`` whose installed version
    (``version_of(name)``, ``None`` where it is not installed) is older than its minimum."""
    found = []
    for requirement in requirements:
        name, _, minimum = requirement.partition(">=")
        minimum = minimum.split(",")[0].strip()
        installed = version_of(name.strip()) if minimum else None
        if installed is not None and _release(installed) < _release(minimum):
            found.append(f"{name.strip()} {installed} is older than the {minimum} posenc needs (pip install '{name.strip()}>={minimum}')")
    return found


def _release(version):
    """The leading numbers of a version string (``"2.5.0rc1"``: ``(2, 5, 0)``), to compare."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in found.group().split(".")) if found else ()


def main() -> int:
    missing = [m for m in ("numpy", "numba", "array_api_compat", "pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return f"make test-gpu: {sys.executable} lacks {', '.join(missing)} (pip install -e '.[test,cuda]' into it)"
    root = Path(__file__).resolve().parents[2]
    # (the suite imports src/ without installing posenc, so pip never checked these; an
    # array-api-compat older than 1.14 failed 407 tests on JAX 0.11's tracers)
    stale = older_than_required(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"], _installed)
    if stale:
        return "make test-gpu: " + "; ".join(stale)
    sys.path.insert(0, str(root / "src"))
    from posenc._kernels import _arrays

    problem = _arrays.cuda_problem()  # numba-cuda that does not import (NumPy >= 2.5), no GPU, ...
    if problem is not None:
        return f"make test-gpu: {problem}"
    from numba import cuda
    libraries = []
    if importlib.util.find_spec("cupy") is not None:
        libraries.append("cupy")
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            libraries.append("torch CUDA")
    if not libraries:
        return f"make test-gpu: {sys.executable} has neither CuPy nor a CUDA build of torch to make GPU arrays with"
    print(f"GPU suite: {cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) else cuda.get_current_device().name}; arrays from {', '.join(libraries)}")
    return 0


def _installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
