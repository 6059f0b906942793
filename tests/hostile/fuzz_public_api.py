"""Call every public posenc function with random invalid arguments (run as a child process).

For each public callable, hypothesis draws each parameter from a pool of hostile values
(wrong types, negative and huge integers, NaN, odd sizes, empty and mis-shaped arrays,
integer/complex/string arrays, arrays of another library) mixed with plausible ones so
that deeper checks are reached too. A call may succeed or raise ``ValueError`` /
``TypeError`` with a non-empty message; anything else (another exception, ``MemoryError``,
a crash of this process) is a defect. The address space is capped so an unchecked giant
allocation fails here instead of exhausting the machine.

Prints one JSON line: ``{"functions": n, "calls": n, "failures": [...]}``.
"""

from __future__ import annotations

import inspect
import json
import resource
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc as pe

LIMIT_BYTES = 6 * 2**30
NOT_FUZZED = {"get_backend", "set_backend", "use_backend"}


def hostile_values():
    rng = np.random.default_rng(0)
    values = [
        None, True, -1, -7, 0, 1, 2, 3, 5, 8, 2**31, 2**62, 1.5, -0.5, float("nan"), float("inf"),
        "half", "interleaved", "bogus", (), [1, 2], {"a": 1}, 1j,
        np.array(3), np.array([]), np.zeros((0, 4)), np.zeros((4, 0)),
        np.arange(6), np.arange(-3, 3), np.arange(5, dtype=np.int8), np.array([2**40]),
        np.full(4, np.nan), np.array([np.inf, 1.0]), np.ones(3, dtype=np.complex64),
        np.array(["a", "b"]), np.array([object()], dtype=object), np.ones(4, dtype=bool),
        rng.standard_normal((4,)), rng.standard_normal((3, 4)), rng.standard_normal((2, 3, 4)),
        rng.standard_normal((2, 2, 5, 8)).astype(np.float32), rng.standard_normal((2, 5, 7)).astype(np.float16),
        rng.standard_normal((8, 6)).astype(np.float32)[:, ::2], rng.standard_normal((1, 1, 1, 2)),
        rng.standard_normal((33, 4)), np.zeros((2, 2, 0, 8)), rng.standard_normal((4, 4))[::-1],
    ]
    try:
        import torch

        values += [torch.ones(3, 4), torch.zeros(2, 5, 8, dtype=torch.bfloat16), torch.arange(5)]
    except ImportError:
        pass
    return values


POOL = hostile_values()
VALUE = st.sampled_from(range(len(POOL)))


def public_functions():
    return {name: getattr(pe, name) for name in pe.__all__ if name not in NOT_FUZZED and callable(getattr(pe, name))}


def fuzz(name, fn, examples, failures):
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 0
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("xp", "device")]
    calls = 0

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(VALUE, st.booleans()), min_size=len(params), max_size=len(params)))
    def check(choice):
        nonlocal calls
        args, kwargs = [], {}
        for p, (index, use) in zip(params, choice):
            required = p.default is p.empty
            if not (required or use):
                continue
            value = POOL[index]
            if p.kind == p.KEYWORD_ONLY:
                kwargs[p.name] = value
            else:
                args.append(value)
        calls += 1
        try:
            fn(*args, **kwargs)
        except (ValueError, TypeError) as exc:
            if not str(exc).strip():
                failures.append(f"{name}: empty {type(exc).__name__} message for {_show(args, kwargs)}")
        except Exception as exc:  # any other exception is the defect being hunted
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]} for {_show(args, kwargs)}")

    check()
    return calls


def _show(args, kwargs):
    def one(v):
        if hasattr(v, "shape"):
            return f"{type(v).__module__.split('.')[0]}{tuple(v.shape)}:{v.dtype}"
        return repr(v)[:40]

    return "(" + ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]) + ")"


def main(examples: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
    failures: list[str] = []
    functions = public_functions()
    calls = sum(fuzz(name, fn, examples, failures) for name, fn in sorted(functions.items()))
    print(json.dumps({"functions": len(functions), "calls": calls, "failures": failures[:50]}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
