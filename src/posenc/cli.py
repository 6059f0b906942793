"""The ``posenc`` command: ``info``, ``bench``, ``plot`` and ``demo``.

Errors are one line on stderr, ``posenc COMMAND: what went wrong``, and a non-zero exit:
2 for a bad argument, 3 for a missing optional package.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import time

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
    from posenc._kernels import _arrays

    print(f"  numba CPU kernels  {'usable' if _arrays.numba_cpu() else 'unavailable'}")
    print(f"  numba.cuda kernels {'usable' if _arrays.numba_cuda() else 'no CUDA device'}")
    return 0


def cmd_demo(args) -> int:
    from posenc import _demo

    failures = _demo.run()
    print("demo finished" + (f" with {failures} failure(s)" if failures else ": every encoding ran"))
    return 1 if failures else 0


def _bench_legend() -> str:
    from posenc import _bench

    return _bench.legend()


def cmd_bench(args) -> int:
    from posenc import _bench

    if args.gpu:
        from posenc import _bench_gpu

        problem = _bench_gpu.requirements()
        if problem:
            return _error("bench", problem, 2)
    print(_bench.run(quick=args.quick, gpu=args.gpu))
    return 0


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


def cmd_plot(args) -> int:
    from posenc import _plots

    problem = _writable_directory(args.out)
    if problem:
        return _error("plot", problem, 2)
    _plots.write_all(args.out)
    return 0


def cmd_warmup(args) -> int:
    import posenc

    def progress(done, total, built):
        width = 30
        bar = "#" * (width * done // total)
        print(f"\r[{bar:<{width}}] {done}/{total} {str(built):<45.45}", end="", file=sys.stderr, flush=True)

    start = time.perf_counter()
    try:
        built = posenc.warmup(args.dtype or None, gpu=args.gpu, progress=progress)
    except ValueError as exc:
        return _error("warmup", str(exc), 2)
    seconds = time.perf_counter() - start  # Numba's start-up included
    print(file=sys.stderr)
    compiled = [b for b in built if b.compiled]
    print(f"{len(built)} kernel specialisations ready in {seconds:.1f} s ({len(compiled)} compiled, {len(built) - len(compiled)} loaded from Numba's cache)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from posenc import __version__

    parser = argparse.ArgumentParser(prog="posenc", description="Transformer positional encodings for any array.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions and usable backends").set_defaults(func=cmd_info)
    sub.add_parser("demo", help="run every encoding once and print what it did").set_defaults(func=cmd_demo)
    bench = sub.add_parser(
        "bench",
        help="time each hot operation beside the plain formula and the memory bandwidth",
        description="Times each hot operation (rope, t5_bias, alibi_bias) in posenc beside the plain\n"
        "formula and a copy of the same bytes, and prints a table with these columns:\n\n" + _bench_legend(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="small shapes, fewer repeats (a few seconds)")
    bench.add_argument("--gpu", action="store_true", help="the rotation and bias rows on a CUDA GPU (numba.cuda kernels, torch eager, the device's copy bandwidth)")
    bench.set_defaults(func=cmd_bench)
    warm = sub.add_parser(
        "warmup",
        help="compile (or load from Numba's cache) every kernel now, e.g. when building an image",
        description="Compiles every Numba kernel specialisation for the dtypes asked (default: all), so that no call "
        "waits for a compile later. Compiled kernels are cached on disk (Numba's cache: __pycache__ next to posenc, "
        "or NUMBA_CACHE_DIR), so run it once per machine or image.",
    )
    warm.add_argument("--dtype", action="append", choices=("float16", "bfloat16", "float32", "float64"), help="a dtype to prepare (repeatable; default: all)")
    warm.add_argument("--gpu", action=argparse.BooleanOptionalAction, default=None, help="also the numba.cuda kernels (default: when a GPU is usable)")
    warm.set_defaults(func=cmd_warmup)
    plot = sub.add_parser("plot", help="write PNG figures (RoPE decay, T5 buckets, sinusoid, ALiBi, scalings, layouts)")
    plot.add_argument("--out", required=True, help="output directory")
    plot.set_defaults(func=cmd_plot)
    from posenc import _extrapolate_cli

    _extrapolate_cli.add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ImportError as exc:
        return _error(args.command, str(exc), 3)


if __name__ == "__main__":
    sys.exit(main())
