"""Where a result came from: package versions, the source's git commit and the CPU.

Everything here is stable between two runs on one machine with one checkout (no clock, no
load), so a results file that records it still reproduces bit for bit.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

PACKAGES = ("posenc", "torch", "numpy", "matplotlib")


def versions():
    """``{"python": ..., package: version or None}``."""
    found = {"python": platform.python_version()}
    for dist in PACKAGES:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def commit():
    """The git commit of the imported posenc source, ``"+changes"`` appended when files under
    the package differ from it; ``None`` outside a git checkout."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        done = subprocess.run(["git", "-C", package, *args], capture_output=True, text=True, timeout=30, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    if not head:
        return None
    return head + ("+changes" if changed else "")


def cpu():
    """``{"model", "cores", "machine", "torch_capability"}``: the processor's name (Linux's
    ``/proc/cpuinfo``, else :func:`platform.processor`), its logical cores, and the vector
    instructions torch's CPU kernels chose (they set the last bits of a result)."""
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    import torch

    return {"model": model, "cores": os.cpu_count(), "machine": platform.machine(), "torch_capability": torch.backends.cpu.get_cpu_capability()}
