"""What the CLI's commands (and the benchmark scripts) share: a refusal's message and exit
status, the check of an ``--out`` directory, and the argparse type of a number."""

from __future__ import annotations

import argparse
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


def number(kind, minimum, *, even=False, maximum=None):
    """An argparse type: an int at least ``minimum`` (even when asked), or a float above 0
    (``kind=float``, ``minimum=0``) or at least ``minimum``; at most ``maximum`` when given."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if kind is float and minimum == 0:
            if value is None or not 0 < value < float("inf"):
                raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
        elif value is None or not minimum <= value <= (float("inf") if maximum is None else maximum) or (even and value % 2):
            raise argparse.ArgumentTypeError(f"must be {_what(kind, minimum, even, maximum)}, got {text!r}")
        return value

    return parse


def _what(kind, minimum, even, maximum):
    """What ``number``'s arguments ask for, in words (a count's as ``_validate`` says it)."""
    if kind is int and not even and maximum is None and minimum in (0, 1):
        return "a non-negative integer" if minimum == 0 else "a positive integer"
    what = "an even integer" if even else {int: "an integer", float: "a number"}[kind]
    show = str if kind is int else "{:g}".format
    return f"{what} >= {show(minimum)}" if maximum is None else f"{what} from {show(minimum)} to {show(maximum)}"
