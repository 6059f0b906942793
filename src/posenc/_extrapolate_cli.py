"""``posenc extrapolate``: train short, test long, for every positional encoding (torch needed).

Arguments are checked before torch is imported and before any training starts.
"""

from __future__ import annotations

import os
import shlex
import sys
import time


def _lengths(text):
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--eval-lens must be comma-separated integers, got {text!r}") from None


def cmd_extrapolate(args) -> int:
    from posenc.cli import _error, _writable_directory

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return _error("extrapolate", f"--out {args.out!r} is a file, not a directory", 2)
    try:
        import matplotlib  # noqa: F401  (the figure is drawn after the training: refuse now, not then)

        from posenc.torch import _report, extrapolation
    except ImportError as exc:
        return _error("extrapolate", f"needs PyTorch and matplotlib, pip install 'posenc[torch,plot]' ({exc})", 3)
    try:
        eval_lens = None if args.eval_lens is None else _lengths(args.eval_lens)
        extrapolation.check_arguments(args.encodings, args.tasks, args.seeds, args.train_len, eval_lens)
    except ValueError as exc:
        return _error("extrapolate", str(exc), 2)
    problem = _writable_directory(args.out)
    if problem:
        return _error("extrapolate", problem, 2)
    options = [("--quick", args.quick), (f"--encodings {args.encodings}", args.encodings), (f"--tasks {args.tasks}", args.tasks)]
    options += [(f"--seeds {args.seeds}", not args.quick), (f"--train-len {args.train_len}", True), (f"--eval-lens {args.eval_lens}", args.eval_lens)]
    command = " ".join(["posenc extrapolate", *(text for text, given in options if given), "--out", shlex.quote(args.out)])
    start = time.perf_counter()
    document = extrapolation.results(
        encodings=args.encodings, tasks=args.tasks, seeds=args.seeds, quick=args.quick, train_len=args.train_len, eval_lens=eval_lens
    )
    records = document["records"]
    paths = _report.write(document, args.out, command=command)
    print(f"{len(records)} records in {time.perf_counter() - start:.0f} s: {', '.join(paths)}", file=sys.stderr)
    for task, encoding, mean in _report.unlearned(records):
        print(f"posenc extrapolate: {task}/{encoding} reached only {mean:.2f} at the training length (< {_report.THRESHOLD})", file=sys.stderr)
    return 0


def add_parser(sub):
    p = sub.add_parser(
        "extrapolate",
        help="train a small transformer per encoding at one length, measure it at longer ones",
        description="Trains one small causal transformer per (encoding, task, seed) on short sequences and "
        "measures the answer accuracy at 1x, 2x, 4x and 8x the training length. Writes DIR/results.json, "
        "DIR/results.md and DIR/extrapolation.png. Deterministic: the same command on the same machine writes "
        "the same results.json.",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quick", action="store_true", help="one seed: a third of the default grid's work")
    p.add_argument("--encodings", help="comma-separated encoding names (default: all)")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per (encoding, task) (default 3)")
    p.add_argument("--train-len", type=int, default=8, help="items per training sequence, at most (default 8)")
    p.add_argument("--eval-lens", help="comma-separated item counts to evaluate at, each >= --train-len (default 1x, 2x, 4x, 8x)")
    p.set_defaults(func=cmd_extrapolate)
