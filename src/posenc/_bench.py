"""``posenc bench``: each hot operation beside the plain formula, timed on this machine.

Every row is the best and the median of ``repeat`` runs after a warm-up call (Numba compiles
on the first call, which is never timed). ``COLUMNS`` says what each column of the table
means; the command prints it above the table and in ``posenc bench --help``. Rows that need
a library that is not installed are left out, and a last line says which and why.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import numpy as np

import posenc as pe

from . import _oracles
from ._bench_measure import Case, _measure


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


COLUMNS = {
    "operation": "the op and its shape",
    "dtype": "the dtype of the row's input and output",
    "implementation": "who computes it: posenc (kernel unless 'reference'; '(torch)': on torch tensors), the "
    "plain formula in NumPy or torch eager, T5's own torch code, or a copy/fill of the same bytes (the "
    "bandwidth rows)",
    "best ms": "best of the repeats, milliseconds, after one warm-up call",
    "median ms": "median of the same repeats: its distance from the best is the spread of this machine's timings",
    "GB/s": "bytes an ideal implementation moves, counted in the row's dtype (rope: read x and write "
    "the result; biases: write the bias), divided by the time",
    "of copy": "GB/s over the GB/s of the same table's bandwidth row in the row's dtype (np.copyto or "
    "Tensor.copy_ for rope, ndarray.fill for biases, on buffers of the same size; with --gpu the device's: "
    "torch copy_ and fill_): 1.00 = as fast as copying the bytes; blank on the bandwidth rows",
    "vs framework": "best time of the same library's own formula over this row's, in the row's dtype (NumPy "
    "rows against the NumPy formula, torch rows against torch eager or T5's torch code, bfloat16 against "
    "torch eager in bfloat16; JAX rows against the jnp formula under jax.jit; 2.0x = twice as fast); blank "
    "on the baselines themselves and the bandwidth rows",
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
    cases = [
        Case("numpy plain formula", lambda: _oracles.rope_rotate_half(x, cos, sin), nbytes),
        Case("posenc rope", lambda: pe.rope(x), nbytes),
        Case("posenc rope out=", lambda: pe.rope(x, out=buf), nbytes),
        Case("posenc rope in place", lambda: pe.rope(buf, out=buf), nbytes),
        Case("posenc reference", lambda: _reference(lambda: pe.rope(x)), nbytes),
        Case("np.copyto (bandwidth)", lambda: np.copyto(buf, x), nbytes, comparable=False, bandwidth_row=True),
    ]
    if installed("torch"):
        import torch

        formula = "torch eager formula"
        for dtype in (torch.float32, torch.bfloat16):
            tx, tc, ts = (torch.from_numpy(a).to(dtype) for a in (x, cos, sin))
            name, size = str(dtype).removeprefix("torch."), 2 * tx.numel() * tx.element_size()
            cases.insert(-1, Case(formula, lambda tx=tx, tc=tc, ts=ts: _oracles.rope_rotate_half(tx, tc, ts), size, name, against=formula))
            cases.insert(-1, Case("posenc rope (torch)", lambda tx=tx: pe.rope(tx), size, name, against=formula))
        bf16 = torch.from_numpy(x).to(torch.bfloat16)  # bfloat16's own bandwidth row: its buffers are half the size
        target = torch.empty_like(bf16)
        cases.append(Case("Tensor.copy_ (bandwidth)", lambda: target.copy_(bf16), 2 * bf16.numel() * 2, "bfloat16", comparable=False, bandwidth_row=True))
    return _measure(f"rope {list(shape)}", cases, repeat, progress)


def t5_rows(heads, length, repeat, progress):
    table = np.random.default_rng(1).standard_normal((32, heads)).astype(np.float32)
    out = np.empty((heads, length, length), dtype=np.float32)
    nbytes = out.nbytes  # write the bias
    cases = [
        Case("numpy plain formula", lambda: np.transpose(table[pe.t5_bucket(pe.relative_positions(length, length))], (2, 0, 1)).copy(), nbytes),
        Case("posenc t5_bias", lambda: pe.t5_bias(table, length, length), nbytes),
        Case("posenc t5_bias out=", lambda: pe.t5_bias(table, length, length, out=out), nbytes),
        Case("posenc reference", lambda: _reference(lambda: pe.t5_bias(table, length, length)), nbytes),
        Case("ndarray.fill (bandwidth)", lambda: out.fill(1.0), nbytes, comparable=False, bandwidth_row=True),
    ]
    if installed("torch"):
        import torch

        original = "torch T5 original"
        cases.insert(-1, Case(original, _torch_t5(table, length), nbytes, against=original))
        torch_table = torch.from_numpy(table)
        cases.insert(-1, Case("posenc t5_bias (torch)", lambda: pe.t5_bias(torch_table, length, length), nbytes, against=original))
    return _measure(f"t5_bias h={heads} L={length}", cases, repeat, progress)


def _torch_t5(table, length):
    import torch

    embedding = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    return lambda: _oracles.t5_compute_bias(torch, embedding, length, length)


def alibi_rows(heads, length, repeat, progress):
    slopes = pe.alibi_slopes(heads)
    out = np.empty((heads, length, length), dtype=np.float32)
    rel = pe.relative_positions(length, length).astype(np.float32)  # (int64 distances would make the formula float64)
    nbytes = out.nbytes  # write the bias
    cases = [
        Case("numpy plain formula", lambda: -slopes[:, None, None] * rel, nbytes),
        Case("posenc alibi_bias", lambda: pe.alibi_bias(slopes, length, length), nbytes),
        Case("posenc alibi_bias out=", lambda: pe.alibi_bias(slopes, length, length, out=out), nbytes),
        Case("ndarray.fill (bandwidth)", lambda: out.fill(1.0), nbytes, comparable=False, bandwidth_row=True),
    ]
    if installed("torch"):
        import torch

        formula = "torch eager formula"
        torch_slopes, torch_rel = torch.from_numpy(slopes), torch.from_numpy(rel).to(torch.float32)
        cases.insert(-1, Case(formula, lambda: -torch_slopes[:, None, None] * torch_rel, nbytes, against=formula))
        cases.insert(-1, Case("posenc alibi_bias (torch)", lambda: pe.alibi_bias(torch_slopes, length, length), nbytes, against=formula))
    return _measure(f"alibi_bias h={heads} L={length}", cases, repeat, progress)


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


def skipped() -> list[str]:
    """What ``run`` leaves out here, and why: one entry per missing library."""
    reasons = []
    if not installed("torch"):
        reasons.append("torch rows (the torch eager formula, T5's torch code, posenc on torch tensors, bfloat16), "
                       "the torch decode-step rows and the patched-model row: torch is not installed")
    elif not installed("transformers"):
        reasons.append("the torch and Hugging Face decode-step rows and the patched-model row: transformers is not installed")
    if not installed("jax"):
        reasons.append("the JAX table and JAX decode step: jax is not installed")
    return reasons


def model_lines(quick: bool, progress, layers: int | None = None) -> str:
    """``patch_hf`` on the LLaMA-like model of ``posenc._bench_generate``, float32: patched
    against unpatched ``generate()`` and prefill, the copies alternating (2 layers with
    ``quick``): best times, their ratio, and the median of the rounds' own ratios."""
    from . import _bench_generate

    progress("  patched model ...")
    layers = layers or (2 if quick else 8)
    found, same = _bench_generate.ratios("float32", repeat=3, layers=layers)
    lines = [f"{'model call (float32, ' + str(layers) + ' layers)':<36} {'patched':>9} {'unpatched':>10} {'ratio':>6} {'median round ratio':>19}"]
    for name, (ours, theirs, median) in found.items():
        lines.append(f"{name:<36} {ours[0]:8.3f}s {theirs[0]:9.3f}s {ours[0] / theirs[0]:6.3f} {median[0]:19.3f}")
    lines.append(f"greedy tokens equal: {same}")
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
    if installed("jax"):
        from . import _bench_jax

        jax_rows = table(_bench_jax.rows(quick, repeat, progress))
        report += f"\n\nJAX arrays on the CPU ('vs framework': over the jnp formula under jax.jit):\n\n{jax_rows}"
        decode += "\n" + _bench_jax.decode(rounds, progress=progress)
    report += f"\n\nA decode step, interleaved with the code it replaces (us per call, best round of 200 calls):\n\n{decode}"
    if installed("torch") and installed("transformers"):
        report += f"\n\npatch_hf on a LLaMA-like model (best of 3 alternated runs):\n\n{model_lines(quick, progress)}"
    reasons = skipped()
    return report + "\n\nSkipped: " + ("; ".join(reasons) if reasons else "nothing (torch, transformers and jax are installed)") + "."
