"""``make test-gpu``'s first step: exit with a clear message unless this interpreter can run the GPU suite."""

import importlib.util
import sys


def main() -> int:
    missing = [m for m in ("numpy", "numba", "array_api_compat", "pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return f"make test-gpu: {sys.executable} lacks {', '.join(missing)} (pip install -e '.[test,cuda]' into it)"
    from numba import cuda

    if not cuda.is_available():
        return "make test-gpu: no usable CUDA GPU here (numba.cuda.is_available() is False); the GPU suite needs an NVIDIA GPU and its driver"
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
