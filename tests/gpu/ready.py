"""``make test-gpu``'s first step: exit with a clear message unless this interpreter can run the GPU suite."""

import importlib.util
import sys
from pathlib import Path


def main() -> int:
    missing = [m for m in ("numpy", "numba", "array_api_compat", "pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return f"make test-gpu: {sys.executable} lacks {', '.join(missing)} (pip install -e '.[test,cuda]' into it)"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
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


if __name__ == "__main__":
    sys.exit(main())
