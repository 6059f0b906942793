"""``posenc extrapolate``: train short, test long, for every positional encoding (torch needed).

Arguments are checked before torch is imported and before any training starts.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time


def _lengths(text):
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--eval-lens must be comma-separated integers, got {text!r}") from None


def _rates(text):
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--lrs must be comma-separated numbers, got {text!r}") from None


def _cpu_seconds():
    """User + system CPU time of this process and its finished children (the workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def cmd_extrapolate(args) -> int:
    from posenc._cli_errors import _error, _writable_directory

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return _error("extrapolate", f"--out {args.out!r} is a file, not a directory", 2)
    try:
        import matplotlib  # noqa: F401  (the figure is drawn after the training: refuse now, not then)

        from posenc.torch import _report, extrapolation
    except ImportError as exc:
        return _error("extrapolate", f"needs PyTorch and matplotlib, pip install 'posenc[torch,plot]' ({exc})", 3)
    try:
        eval_lens = None if args.eval_lens is None else _lengths(args.eval_lens)
        run = _lm_run(args, eval_lens) if args.lm else _task_run(args, eval_lens, extrapolation)
    except ValueError as exc:
        return _error("extrapolate", str(exc), 2)
    problem = _writable_directory(args.out)
    if problem:
        return _error("extrapolate", problem, 2)
    options = [("--lm", args.lm), ("--quick", args.quick), (f"--encodings {args.encodings}", args.encodings), (f"--tasks {args.tasks}", args.tasks)]
    options += [(f"--seeds {args.seeds}", args.seeds), (f"--train-len {args.train_len}", args.train_len), (f"--eval-lens {args.eval_lens}", args.eval_lens)]
    options += [(f"--lrs {args.lrs}", args.lrs), (f"--steps {args.steps}", args.steps), *((f"--hparam {shlex.quote(h)}", True) for h in args.hparam or ())]
    command = " ".join(["posenc extrapolate", *(text for text, given in options if given), "--out", shlex.quote(args.out)])
    start, cpu = time.perf_counter(), _cpu_seconds()
    document = run()
    records = document["records"]
    paths = _report.write(document, args.out, command=command, lm=args.lm)
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    print(f"{len(records)} records in {wall:.0f} s ({cpu:.0f} s of CPU, workers included): {', '.join(paths)}", file=sys.stderr)
    for task, encoding, mean, chance, bar in [] if args.lm else _report.unlearned(records):
        print(f"posenc extrapolate: {task}/{encoding} reached only {mean:.2f} exact match at the training length "
              f"(learnt from {bar:.2f}, halfway from chance {chance:.2f} to 1)", file=sys.stderr)  # fmt: skip
    return 0


def _task_run(args, eval_lens, extrapolation):
    """The checked algorithmic-task run, as a function that trains when called."""
    changes = {"lrs": None if args.lrs is None else _rates(args.lrs), "steps": args.steps}
    changes = {name: value for name, value in changes.items() if value is not None}
    base = extrapolation.QUICK if args.quick else extrapolation.Config()
    config = dataclasses.replace(base, **changes) if changes else None
    encodings, tasks, seeds, config = extrapolation.grid(args.encodings, args.tasks, args.seeds, args.quick, config)
    train_len = extrapolation.TRAIN_LEN if args.train_len is None else args.train_len
    extrapolation.check_arguments(encodings, tasks, seeds, train_len, eval_lens, args.hparam, config)
    return lambda: extrapolation.results(
        encodings=encodings, tasks=tasks, seeds=seeds, quick=args.quick, train_len=train_len, eval_lens=eval_lens, hparams=args.hparam, config=config
    )


def _lm_run(args, eval_lens):
    """The checked ``--lm`` run, as a function that trains when called."""
    from posenc.torch import lm

    for flag, given in (("--tasks", args.tasks), ("--lrs", args.lrs), ("--steps", args.steps)):
        if given is not None:
            raise ValueError(f"{flag} does not apply to --lm (one corpus, one learning rate and length of training: posenc.torch.lm.Config)")
    seeds = 1 if args.seeds is None else args.seeds
    train_len = lm.TRAIN_LEN if args.train_len is None else args.train_len
    lm.check_arguments(args.encodings, seeds, train_len, eval_lens, args.hparam)
    return lambda: lm.results(encodings=args.encodings, seeds=seeds, quick=args.quick, train_len=train_len, eval_lens=eval_lens, hparams=args.hparam)


def add_parser(sub):
    p = sub.add_parser(
        "extrapolate",
        help="train a small transformer per encoding at one length, measure it at longer ones",
        description="Trains one small causal transformer per (encoding, task, seed) on short sequences, its learning "
        "rate chosen per (encoding, task) on in-distribution validation, and measures whole-answer exact match "
        "(free-running greedy decoding) and per-token accuracy at 1x, 2x, 4x and 8x the training length. Writes "
        "DIR/results.json, DIR/results.md and DIR/extrapolation.png. With --lm: one byte-level language model per "
        "encoding on the Python standard library's source, perplexity at 1x-8x its training length, written to "
        "DIR/lm_results.json, DIR/lm_results.md and DIR/lm_perplexity.png. Deterministic: the same command on the "
        "same machine writes the same JSON.",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quick", action="store_true", help="the small grid: 11 encodings, reverse, 3 seeds, one learning rate (with --lm: 12 encodings, 300 steps)")
    p.add_argument("--lm", action="store_true", help="perplexity against length of a byte-level language model instead of the tasks")
    p.add_argument("--encodings", help="comma-separated encoding names (default: all)")
    p.add_argument("--tasks", help="comma-separated task names out of copy, reverse, duplicate, sort, bucket_sort, parity, modular_arithmetic, count (default: reverse, duplicate, parity, modular_arithmetic, count; --quick: reverse)")
    p.add_argument("--seeds", type=int, help="seeds per (encoding, task) (default 5, --quick 3, --lm 1)")
    p.add_argument("--train-len", type=int, help="items per training sequence, at most (default 8; --lm: bytes, default 64)")
    p.add_argument("--eval-lens", help="comma-separated lengths to evaluate at, each >= --train-len (default 1x, 2x, 4x, 8x); a task's inputs are at most 2048 tokens")
    p.add_argument("--lrs", help="comma-separated learning rates tried per encoding on seed 0 of reverse, the best on in-distribution validation kept for every task (default 0.0025,0.005,0.01; --quick 0.005)")
    p.add_argument("--steps", type=int, help="training steps per model (default 400)")
    p.add_argument("--hparam", action="append", metavar="ENCODING.NAME=VALUE",
                   help="a length-dependent hyperparameter in place of the scaling rule's (repeatable): fire.L, xpos.scale_base, cope.P, sandwich.dim, sandwich.base, randomized.M")  # fmt: skip
    p.set_defaults(func=cmd_extrapolate)
