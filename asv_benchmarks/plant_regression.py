"""Sensitivity of the regression check, shown: plant a slowdown, run the check, count the flags.

For each plant, a commit on top of ``--base`` is made in a temporary git worktree: a hot
path of posenc wrapped so that every call takes ``1 + --slowdown`` times as long (it spins
for that fraction of the call's own time after the call), or, for ``none``, a README-only
change (an A/A comparison). Then the documented regression command, ``make
bench-continuous BENCH_BASE=<base> BENCH_HEAD=<planted>``, runs from this checkout, and its
comparison is read: a row flagged (``+``) that runs the planted code is a true flag, any
other a false one. The check passes a plant when at least one of its rows is flagged with
at most ``--max-false`` false flags, and ``none`` when nothing is flagged.

    python asv_benchmarks/plant_regression.py                    # all four, 15 %
    python asv_benchmarks/plant_regression.py rope none --make-args "BENCH_FACTOR=1.1"

The temporary worktrees and branches are removed afterwards; each run's full output goes to
``asv_benchmarks/.asv/plant-<name>.log``.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

WRAPPER = '''

# Planted by asv_benchmarks/plant_regression.py: every call takes {factor} times as long.
def _planted_slowdown(fn):
    import functools
    import time

    @functools.wraps(fn)
    def slower(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        until = time.perf_counter() + {fraction} * (time.perf_counter() - start)
        while time.perf_counter() < until:
            pass
        return result

    return slower


{target} = _planted_slowdown({target})
'''

# name: (file, the function wrapped, the rows of the regression set that run it)
PLANTS = {
    "rope": (
        "src/posenc/_kernels/rope_cpu.py",
        "rotate_positions",
        r"^rope\.RopeRotate\.",
    ),
    "t5_bias": (
        "src/posenc/relative/biases.py",
        "t5_bias",
        r"^bias\.T5Bias\.|^decode\.DecodeStep\.track_ratio\(.t5_bias ",
    ),
    "decode": (
        "src/posenc/rotary/apply.py",
        "rope",
        r"^decode\.DecodeStep\.track_ratio\(.rope (numpy|torch) ",
    ),
    "none": ("README.md", None, r"$^"),
}



def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def plant(name, base, fraction, workdir):
    """A commit on ``base`` with the plant ``name`` applied, made in a worktree under ``workdir``; its hash."""
    path, target, _ = PLANTS[name]
    tree = pathlib.Path(workdir) / f"plant-{name}"
    # On a branch: asv reads the commits from its own mirror of this repository's branches.
    git("worktree", "add", "-B", f"plant-{name}", str(tree), base)
    file = tree / path
    if target is None:
        file.write_text(file.read_text() + "\n<!-- an A/A comparison: this line changes nothing measured -->\n")
    else:
        file.write_text(file.read_text() + WRAPPER.format(factor=1 + fraction, fraction=fraction, target=target))
    message = f"planted: {name} {fraction:.0%} slower" if target else "planted: README only (A/A)"
    git("-c", "user.name=plant", "-c", "user.email=plant@localhost", "commit", "-q", "-am", message, cwd=tree)
    return git("rev-parse", "HEAD", cwd=tree), tree


def flags(output):
    """The benchmark names of the rows asv's comparison tables mark as slower: ``| + | before |
    after | ratio | name |``."""
    found = set()
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) == 7 and cells[1] == "+":
            found.add(cells[5])
    return sorted(found)


def check(name, base, fraction, make_args, max_false):
    with tempfile.TemporaryDirectory(prefix="posenc-plant-") as workdir:
        head, tree = plant(name, base, fraction, workdir)
        try:
            command = ["make", "--no-print-directory", "bench-continuous", f"BENCH_BASE={base}", f"BENCH_HEAD={head}", *make_args]
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
            git("branch", "-D", f"plant-{name}")
    log = ROOT / "asv_benchmarks" / ".asv" / f"plant-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {shlex.join(command)}\n{proc.stdout}\n{proc.stderr}")
    flagged = flags(proc.stdout)
    expected = re.compile(PLANTS[name][2])
    true = [f for f in flagged if expected.search(f)]
    false = [f for f in flagged if not expected.search(f)]
    passed = (not flagged) if name == "none" else (bool(true) and len(false) <= max_false)
    print(f"{name}: exit {proc.returncode}, {len(true)} true flag(s), {len(false)} false: {'PASS' if passed else 'FAIL'}")
    for f in flagged:
        print(f"    {'true ' if f in true else 'FALSE'} {f}")
    return passed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plants", nargs="*", metavar="PLANT", help=f"any of {', '.join(PLANTS)} (default: all)")
    parser.add_argument("--base", default="HEAD", help="the commit planted on and compared with (default HEAD)")
    parser.add_argument("--slowdown", type=float, default=0.15, help="the fraction planted (default 0.15)")
    parser.add_argument("--max-false", type=int, default=1, help="false flags a plant may have (default 1)")
    parser.add_argument("--make-args", default="", help="more arguments for make, e.g. 'BENCH_FACTOR=1.1'")
    args = parser.parse_args(argv)
    unknown = set(args.plants) - set(PLANTS)
    if unknown:
        parser.error(f"unknown plant(s) {', '.join(sorted(unknown))}: choose from {', '.join(PLANTS)}")
    base = git("rev-parse", args.base)
    results = [check(name, base, args.slowdown, shlex.split(args.make_args), args.max_false) for name in args.plants or PLANTS]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
