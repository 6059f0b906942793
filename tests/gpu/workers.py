"""``make test-gpu``'s pytest-xdist arguments: ``-n WORKERS`` and, where pytest-xdist has it
(3.2 and later), ``--dist worksteal``, so that a worker done with its share takes tests
queued behind another's slow one (a compiled model, say) instead of idling; nothing
without pytest-xdist. Usage: ``python tests/gpu/workers.py WORKERS``."""

import sys
from importlib.metadata import PackageNotFoundError, version


def main() -> None:
    try:
        found = version("pytest-xdist")
    except PackageNotFoundError:
        return
    major, minor = (int(part) for part in found.split(".")[:2])
    print(f"-n {sys.argv[1]}" + (" --dist worksteal" if (major, minor) >= (3, 2) else ""))


if __name__ == "__main__":
    main()
