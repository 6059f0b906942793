"""``posenc bench``: each hot operation beside the plain formula, timed on this machine.

Every row is the best of ``repeat`` runs after a warm-up call (Numba compiles on the first
call, which is never timed). ``COLUMNS`` says what each column of the table means; the
command prints it above the table and in ``posenc bench --help``.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import numpy as np

import posenc as pe

from . import _oracles
from ._bench_measure import Case, _measure, best


COLUMNS = {
    "operation": "the op and its shape",
    "dtype": "the dtype of the row's input and output",
    "implementation": "who computes it: posenc (kernel unless 'reference'), the plain formula in NumPy or "
    "torch eager, or a copy/fill of the same bytes (the bandwidth rows)",
    "ms": "best of the repeats, milliseconds, after one warm-up call",
    "GB/s": "bytes an ideal implementation moves, counted in the row's dtype (rope: read x and write "
    "the result; biases: write the bias), divided by the time",
    "of copy": "GB/s over the machine's copy bandwidth (np.copyto for rope, ndarray.fill for biases, "
    "on buffers of the same size; with --gpu the device's: cupy.copyto / torch copy_ and fill): 1.00 = as "
    "fast as copying the bytes; blank on the bandwidth rows",
    "vs plain": "time of the plain formula over this row's time (NumPy on the CPU, torch eager with --gpu), "
    "same dtype only (2.0x = twice as fast); blank where the comparison means nothing: the baseline "
    "itself, the bandwidth rows, other dtypes",
}


def legend() -> str:
    width = max(map(len, COLUMNS))
    return "\n".join(
        textwrap.fill(text, 96, initial_indent=f"{name:<{width}}  ", subsequent_indent=" " * (width + 2))
        for name, text in COLUMNS.items()
    )


def rope_rows(shape, repeat, progress):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    buf = np.empty_like(x)
    seq, dim = shape[-2], shape[-1]
    inv_freq, _ = pe.rope_frequencies(dim)
    cos, sin = (a.astype(np.float32) for a in pe.rope_cos_sin(np.arange(seq), inv_freq))
    nbytes = 2 * x.nbytes  # read x, write the result
    copy = nbytes / best(lambda: np.copyto(buf, x), repeat)
    cases = [
        Case("numpy plain formula", lambda: _oracles.rope_rotate_half(x, cos, sin), nbytes),
        Case("posenc rope", lambda: pe.rope(x), nbytes),
        Case("posenc rope out=", lambda: pe.rope(x, out=buf), nbytes),
        Case("posenc rope in place", lambda: pe.rope(buf, out=buf), nbytes),
        Case("posenc reference", lambda: _reference(lambda: pe.rope(x)), nbytes),
        Case("np.copyto (bandwidth)", lambda: np.copyto(buf, x), nbytes, comparable=False, bandwidth_row=True),
    ]
    if importlib.util.find_spec("torch") is not None:
        import torch

        tx, tc, ts = (torch.from_numpy(a) for a in (x, cos, sin))
        bf16 = tx.to(torch.bfloat16)
        cases.insert(1, Case("torch eager formula", lambda: _oracles.rope_rotate_half(tx, tc, ts), nbytes))
        bf16_bytes = 2 * bf16.numel() * bf16.element_size()
        cases.insert(5, Case("posenc rope (torch)", lambda: pe.rope(bf16), bf16_bytes, "bfloat16", comparable=False))
    return _measure(f"rope {list(shape)}", cases, copy, repeat, progress)


def t5_rows(heads, length, repeat, progress):
    table = np.random.default_rng(1).standard_normal((32, heads)).astype(np.float32)
    out = np.empty((heads, length, length), dtype=np.float32)
    nbytes = out.nbytes  # write the bias
    fill = nbytes / best(lambda: out.fill(1.0), repeat)
    cases = [
        Case("numpy plain formula", lambda: np.transpose(table[pe.t5_bucket(pe.relative_positions(length, length))], (2, 0, 1)).copy(), nbytes),
        Case("posenc t5_bias", lambda: pe.t5_bias(table, length, length), nbytes),
        Case("posenc t5_bias out=", lambda: pe.t5_bias(table, length, length, out=out), nbytes),
        Case("posenc reference", lambda: _reference(lambda: pe.t5_bias(table, length, length)), nbytes),
        Case("ndarray.fill (bandwidth)", lambda: out.fill(1.0), nbytes, comparable=False, bandwidth_row=True),
    ]
    if importlib.util.find_spec("torch") is not None:
        cases.insert(1, Case("torch T5 original", _torch_t5(table, length), nbytes))
    return _measure(f"t5_bias h={heads} L={length}", cases, fill, repeat, progress)


def _torch_t5(table, length):
    import torch

    embedding = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    return lambda: _oracles.t5_compute_bias(torch, embedding, length, length)


def alibi_rows(heads, length, repeat, progress):
    slopes = pe.alibi_slopes(heads)
    out = np.empty((heads, length, length), dtype=np.float32)
    fill = out.nbytes / best(lambda: out.fill(1.0), repeat)
    rel = pe.relative_positions(length, length)
    nbytes = out.nbytes  # write the bias
    cases = [
        Case("numpy plain formula", lambda: -slopes[:, None, None] * rel, nbytes),
        Case("posenc alibi_bias", lambda: pe.alibi_bias(slopes, length, length), nbytes),
        Case("posenc alibi_bias out=", lambda: pe.alibi_bias(slopes, length, length, out=out), nbytes),
        Case("ndarray.fill (bandwidth)", lambda: out.fill(1.0), nbytes, comparable=False, bandwidth_row=True),
    ]
    return _measure(f"alibi_bias h={heads} L={length}", cases, fill, repeat, progress)


def _reference(fn):
    with pe.use_backend("reference"):
        return fn()


def table(rows) -> str:
    header = list(COLUMNS)
    body = [r.cells() for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in body]
    return "\n".join(lines)


def run(quick: bool = False, gpu: bool = False, progress=lambda s: print(s, file=sys.stderr, flush=True)) -> str:
    repeat = 3 if quick else 7
    if gpu:
        from . import _bench_gpu

        return f"{legend()}\n\n{table(_bench_gpu.rows(quick, repeat, progress))}"
    rows = []
    rope_shapes = [(1, 32, 1024, 128)] if quick else [(1, 32, 8192, 128), (4, 32, 8192, 128)]
    for shape in rope_shapes:
        rows += rope_rows(shape, repeat, progress)
    for length in [512] if quick else [512, 2048, 4096]:
        rows += t5_rows(16, length, repeat, progress)
    rows += alibi_rows(16, 512 if quick else 2048, repeat, progress)
    from . import _bench_decode

    rounds = 3 if quick else 7
    decode = _bench_decode.run(rounds=rounds, progress=progress)
    report = f"{legend()}\n\n{table(rows)}"
    if importlib.util.find_spec("jax") is not None:
        from . import _bench_jax

        jax_rows = table(_bench_jax.rows(quick, repeat, progress))
        report += f"\n\nJAX arrays on the CPU ('vs plain': over the jnp formula under jax.jit):\n\n{jax_rows}"
        decode += "\n" + _bench_jax.decode(rounds, progress=progress)
    return f"{report}\n\nA decode step, interleaved with the code it replaces (us per call, best round of 200 calls):\n\n{decode}"
