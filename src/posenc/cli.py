"""The ``posenc`` command: ``info`` and ``demo``."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys

OPTIONAL = ("numpy", "numba", "numba-cuda", "cupy-cuda12x", "torch", "jax", "dask", "array-api-strict", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cmd_info(args) -> int:
    import posenc

    print(f"posenc {posenc.__version__}  backend={posenc.get_backend()}")
    for dist in OPTIONAL:
        print(f"  {dist:<18} {_version(dist) or 'not installed'}")
    from posenc._kernels import _available

    print(f"  numba CPU kernels  {'usable' if _available.numba_cpu() else 'unavailable'}")
    print(f"  numba.cuda kernels {'usable' if _available.numba_cuda() else 'no CUDA device'}")
    return 0


def cmd_demo(args) -> int:
    from posenc import _demo

    failures = _demo.run()
    print("demo finished" + (f" with {failures} failure(s)" if failures else ": every encoding ran"))
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Transformer positional encodings for any array.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions and usable backends").set_defaults(func=cmd_info)
    sub.add_parser("demo", help="run every encoding once and print what it did").set_defaults(func=cmd_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
