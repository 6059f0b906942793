"""The ``posenc`` command: ``info``, ``demo``, ``bench``, ``warmup``, ``plot`` and ``extrapolate``.

Each subcommand is added by one ``_add_NAME(sub)`` function listed in ``SUBCOMMANDS``; its
parser's ``func`` runs it.

Errors are one line on stderr, ``posenc COMMAND: what went wrong``, and a non-zero exit:
2 for a bad argument, 3 for a missing optional package.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time

from posenc._cli_errors import _error, _writable_directory, number
from posenc.plots import LAYOUTS_MAX_DIM, SCALINGS, SCALINGS_MAX_DIM, T5_MAX_DISTANCE

OPTIONAL = ("numpy", "numba", "numba-cuda", "cupy", "torch", "jax", "dask", "array-api-strict", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    """The installed CuPy, whichever wheel provides it (one per CUDA or ROCm release:
    cupy-cuda12x, cupy-cuda13x, cupy-rocm-6-0, ... or cupy from source): ``13.6.0 (cupy-cuda12x)``."""
    dists = importlib.metadata.packages_distributions().get("cupy", [])
    return ", ".join(f"{_version(dist)} ({dist})" for dist in dists) or None


def _devices() -> str:
    """The devices each installed array library sees: ``numpy cpu; torch cpu, cuda:0 (NVIDIA H200); jax cpu:0``."""
    found = ["numpy cpu"]
    for library, installed, devices in (("torch", _version("torch"), _torch_devices), ("jax", _version("jax"), _jax_devices), ("cupy", _cupy_version(), _cupy_devices)):
        if installed:
            try:
                found.append(f"{library} {devices()}")
            except Exception as exc:  # one that does not import or start (JAX_PLATFORMS=cuda without a GPU: AssertionError)
                found.append(f"{library} unavailable ({type(exc).__name__}: {exc})")
    return "; ".join(found)


def _torch_devices() -> str:
    import torch

    return ", ".join(["cpu", *(f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count()))])


def _jax_devices() -> str:
    import jax

    return ", ".join(f"{device.platform}:{device.id}" for device in jax.devices())


def _cupy_devices() -> str:
    import cupy

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # no driver, or no GPU
        return f"none ({exc})"
    return ", ".join(f"cuda:{i}" for i in range(count)) or "none"


def cmd_info(args) -> int:
    import posenc

    print(f"posenc {posenc.__version__}  backend={posenc.get_backend()}")
    for dist in OPTIONAL:
        print(f"  {dist:<18} {(_cupy_version() if dist == 'cupy' else _version(dist)) or 'not installed'}")
    from posenc._kernels import _arrays

    for kernels, problem in (("numba CPU", _arrays.numba_problem()), ("numba.cuda", _arrays.cuda_problem())):
        print(f"  {kernels + ' kernels':<18} {'usable' if problem is None else 'unavailable: ' + problem}")
    print(f"  devices            {_devices()}")
    return 0


def cmd_demo(args) -> int:
    from posenc import _demo

    missing = [f"{name}: {why}" for name, maker, why in _demo.libraries() if args.library and name in args.library and maker is None]
    if missing:
        return _error("demo", f"--library {'; '.join(missing)}", 3)
    failures = _demo.run(only=args.library)
    print("demo finished" + (f" with {failures} failure(s)" if failures else ": no failures"))
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


def cmd_plot(args) -> int:
    from posenc import plots

    out = getattr(args, "out", None)
    if out is None:
        args.plot_parser.error("the following arguments are required: --out")
    problem = _writable_directory(out)
    if problem:
        return _error("plot", problem, 2)
    figure = getattr(args, "figure", None) or "all"
    if figure == "all":
        plots.write_all(out)
        return 0
    make, filename, options = PLOTS[figure]
    kwargs = {dest: getattr(args, dest) for _flag, dest, _ in options if hasattr(args, dest)}
    path = os.path.join(out, filename)
    try:
        getattr(plots, make)(**kwargs, path=path)
    except ValueError as exc:
        return _error("plot", str(exc), 2)
    print(f"wrote {path}")
    return 0


MAX_FACTOR = 1e6  # plot scaling's: far past the published scalings (LongRoPE's 2048k tokens from 4k: 512)
_DIM = ("--dim", "dim", {"type": number(int, 2, even=True), "help": "features (rotary dimension), even"})
_BASE = ("--base", "base", {"type": number(float, 0), "help": "frequency base"})
_LENGTH = ("--length", "length", {"type": number(int, 1), "help": "number of positions"})
# figure: (posenc.plots function, file name, options as (flag, keyword, argparse settings))
PLOTS = {
    "decay": ("rope_decay", "rope_decay.png", [
        _DIM,
        ("--base", "bases", {"type": number(float, 0), "nargs": "+", "help": "one curve per base (e.g. 10000 500000)"}),
        ("--max-distance", "max_distance", {"type": number(int, 2), "help": "largest relative distance"}),
    ]),
    "t5": ("t5_buckets", "t5_buckets.png", [
        ("--buckets", "num_buckets", {"type": number(int, 4), "help": "number of buckets"}),
        ("--max-distance", "max_distance", {"type": number(int, 1, maximum=T5_MAX_DISTANCE), "help": f"distance from which keys share the last bucket, at most {T5_MAX_DISTANCE}"}),
    ]),
    "sinusoidal": ("sinusoidal", "sinusoidal.png", [_LENGTH, _DIM, _BASE]),
    "alibi": ("alibi", "alibi.png", [
        ("--heads", "heads", {"type": number(int, 1), "help": "number of heads"}),
        _LENGTH,
        ("--head", "head", {"type": number(int, 0), "help": "the head drawn, from 0"}),
    ]),
    "scaling": ("scalings", "rope_scalings.png", [
        ("--type", "types", {"nargs": "+", "choices": SCALINGS, "help": "one panel per scaling (default: all)"}),
        ("--factor", "factor", {"type": number(float, 1, maximum=MAX_FACTOR), "help": f"scaling factor (NTK's alpha), at most {MAX_FACTOR:g}"}),
        ("--dim", "dim", {"type": number(int, 4, even=True, maximum=SCALINGS_MAX_DIM), "help": f"rotary dimension, even, at most {SCALINGS_MAX_DIM}"}),
        _BASE,
        ("--original", "original", {"type": number(int, 1), "help": "original (trained) context length"}),
        ("--seq-len", "seq_len", {"type": number(int, 1), "help": "length seen by dynamic NTK and LongRoPE (default: factor * original)"}),
    ]),
    "layouts": ("rope_layouts", "rope_layouts.png", [
        ("--dim", "dim", {"type": number(int, 2, even=True, maximum=LAYOUTS_MAX_DIM), "help": f"features (rotary dimension), even, at most {LAYOUTS_MAX_DIM}"}),
    ]),
}


def _add_plot(sub) -> None:
    plot = sub.add_parser(
        "plot",
        help="write PNG figures (RoPE decay, T5 buckets, sinusoid, ALiBi, scalings, layouts)",
        description="Writes one figure with the options given (posenc plot decay --base 10000 500000 --out DIR), "
        "or every figure with its defaults (posenc plot all --out DIR, or posenc plot --out DIR).",
    )
    out = {"default": argparse.SUPPRESS, "metavar": "DIR", "help": "output directory (created if missing)"}
    plot.add_argument("--out", **out)
    plot.set_defaults(func=cmd_plot, plot_parser=plot)
    figures = plot.add_subparsers(dest="figure", metavar="FIGURE", help="one of: " + ", ".join([*PLOTS, "all"]))
    figures.add_parser("all", help="every figure, with its defaults").add_argument("--out", **out)
    for name, (make, filename, options) in PLOTS.items():
        figure = figures.add_parser(name, help=f"posenc.plots.{make} -> {filename}", description=f"Writes DIR/{filename} (posenc.plots.{make}).")
        for flag, dest, settings in options:
            figure.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **settings)
        figure.add_argument("--out", **out)
        figure.set_defaults(plot_parser=figure)


def cmd_warmup(args) -> int:
    import posenc
    from posenc._kernels import _arrays

    problem = _arrays.cuda_problem() if args.gpu else None
    if problem:
        return _error("warmup", f"--gpu needs the numba.cuda kernels, unavailable here: {problem}", 2)

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


def _add_info(sub) -> None:
    sub.add_parser("info", help="versions and usable backends").set_defaults(func=cmd_info)


def _add_demo(sub) -> None:
    from posenc import _demo

    demo = sub.add_parser(
        "demo",
        help="run every encoding once on each installed array library and print what it did",
        description="Runs every encoding once on NumPy, torch, JAX, Dask and array-api-strict, "
        "each where installed (the others are named with the reason they are skipped).",
    )
    libraries = [name for name, *_ in _demo.LIBRARIES]
    demo.add_argument("--library", action="append", choices=libraries, help="run on this library only (repeatable; default: every installed one)")
    demo.set_defaults(func=cmd_demo)


def _add_bench(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="time each hot operation beside the plain formula and the memory bandwidth",
        description="Times each hot operation (rope, t5_bias, alibi_bias) in posenc beside the plain\n"
        "formula and a copy of the same bytes, and prints a table with these columns:\n\n" + _bench_legend()
        + "\n\nWhere JAX is installed, a second table has the same calls on JAX CPU arrays (eager and under\n"
        "jax.jit, beside the NumPy path, 'vs framework' over the jnp formula under jax.jit), and the decode\n"
        "section a jitted JAX decode step beside the jnp formula under jax.jit. Where transformers is\n"
        "installed, patch_hf's patched LLaMA-like model against the unpatched one. A last line names the\n"
        "rows left out for a missing library.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="small shapes, fewer repeats (a few seconds)")
    bench.add_argument("--gpu", action="store_true", help="the rotation and bias rows on a CUDA GPU (numba.cuda kernels, torch eager, the device's copy bandwidth)")
    bench.set_defaults(func=cmd_bench)


def _add_warmup(sub) -> None:
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


def _add_extrapolate(sub) -> None:
    from posenc import _extrapolate_cli

    _extrapolate_cli.add_parser(sub)


# Each adds one subcommand (its parser and ``func``), in the order ``posenc --help`` lists them.
SUBCOMMANDS = [_add_info, _add_demo, _add_bench, _add_warmup, _add_plot, _add_extrapolate]


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: arguments it does not take are its error (``posenc info: error:
    unrecognized arguments: --x``, after its usage), not the top-level ``posenc``'s."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    from posenc import __version__

    parser = argparse.ArgumentParser(prog="posenc", description="Transformer positional encodings for any array.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ImportError as exc:
        return _error(args.command, str(exc), 3)
    except BrokenPipeError:
        # The reader left (posenc info | head -1): stop, and let nothing flush into the pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
