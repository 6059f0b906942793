"""What the CLI's commands share: a refusal's message and exit status, and the check of an ``--out`` directory."""

from __future__ import annotations

import os
import sys


def _error(command: str, message: str, status: int) -> int:
    print(f"posenc {command}: {message}", file=sys.stderr)
    return status


def _writable_directory(path: str) -> str | None:
    """Why ``path`` cannot be the output directory, or ``None`` once it exists and is writable."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"--out {path!r} is not a directory"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"--out {path!r}: {parent!r} is not a directory"
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".posenc-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        return f"cannot write to {path!r}: {exc.strerror or exc}"
    return None
