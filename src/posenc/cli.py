"""The ``posenc`` command: ``info``, ``bench``, ``plot`` and ``demo``."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
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


def cmd_bench(args) -> int:
    from posenc import _bench

    print(_bench.run(quick=args.quick))
    return 0


def cmd_plot(args) -> int:
    from posenc import _plots

    try:
        os.makedirs(args.out, exist_ok=True)
        probe = os.path.join(args.out, ".posenc-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        print(f"posenc plot: cannot write to {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    _plots.write_all(args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Transformer positional encodings for any array.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions and usable backends").set_defaults(func=cmd_info)
    sub.add_parser("demo", help="run every encoding once and print what it did").set_defaults(func=cmd_demo)
    bench = sub.add_parser("bench", help="time each hot operation beside the plain formula and the memory bandwidth")
    bench.add_argument("--quick", action="store_true", help="small shapes, fewer repeats")
    bench.set_defaults(func=cmd_bench)
    plot = sub.add_parser("plot", help="write PNG figures (RoPE decay, T5 buckets, sinusoid, ALiBi, scalings, layouts)")
    plot.add_argument("--out", required=True, help="output directory")
    plot.set_defaults(func=cmd_plot)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ImportError as exc:
        print(f"posenc {args.command}: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
