"""A decode step's bias with positions as arrays, beside the same call with a scalar offset and the plain formula.

``python docs/positions_bench.py [numpy,torch]`` prints the best per-call process CPU time
of a decode step with positions as arrays, of the same call with a scalar offset, and of
the framework's formula, all float32: ``rope`` of ``q [1, 32, 1, 128]`` with ``positions=[777]``
or ``[[777]]`` (torch: ``torch.tensor([[777]])``, Hugging Face's ``position_ids``) against
``offset=777`` and the rotate-half formula with its cos/sin tables; ``t5_bias`` /
``alibi_bias`` / ``relative_bias`` and the torch modules, 16 heads, with
``query_positions=[511], key_positions=arange(512)`` against ``offset=511`` and the formula
(NumPy: ``posenc._bench_decode``'s; torch: transformers' ``T5Attention.compute_bias`` and
ALiBi's ``-slopes[:, None, None] * (511 - keys)``),
interleaved round by round (a load change slows all alike), with the positions call's ratio
to each. Process CPU time rather than wall time: on a shared machine it moves less with the
other jobs (torch's 2 threads both count in it).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import posenc as pe
from posenc._bench_decode import _numpy_t5
from posenc._oracles import rope_rotate_half

PAST, HEADS = 511, 16
POSITION, ROPE_HEADS, HEAD_DIM = 777, 32, 128


def _per_call(fn, number):
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number


def compare(calls, number=1000, rounds=5):
    """Best seconds per call of each of ``calls``, interleaved round by round."""
    for fn in calls:
        fn(), fn(), fn()  # the plan is built on a signature's second call
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, fn in enumerate(calls):
            best[i] = min(best[i], _per_call(fn, number))
            time.sleep(0.3)  # torch's idle OpenMP workers spin a while after a parallel op: not into the next timing
    return best


def _rope_rows(xp, x, positions, name):
    """``rope(x, positions)`` against ``offset=777`` and the rotate-half formula of ``xp``."""
    inv_freq = 1.0 / 10000.0 ** (xp.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    cast = (lambda a: a.astype(x.dtype)) if xp is np else (lambda a: a.to(x.dtype))

    def formula():
        angles = xp.asarray([float(POSITION)])[:, None] * inv_freq[None, :]
        emb = xp.concat([angles, angles], axis=-1)
        return rope_rotate_half(x, cast(xp.cos(emb)), cast(xp.sin(emb)))

    return [(f"rope {name} {list(p.shape)}", lambda p=p: pe.rope(x, p), lambda: pe.rope(x, offset=POSITION), formula) for p in positions]


def numpy_rows():
    x = np.random.default_rng(0).standard_normal((1, ROPE_HEADS, 1, HEAD_DIM)).astype(np.float32)
    rope = _rope_rows(np, x, (np.array([POSITION]), np.array([[POSITION]])), "numpy")
    slopes = pe.alibi_slopes(HEADS)
    table = np.random.default_rng(0).standard_normal((32, HEADS)).astype(np.float32)
    keys, query = np.arange(PAST + 1), np.array([PAST])
    alibi_formula = lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :].astype(np.float32)  # noqa: E731
    at = {"query_positions": query, "key_positions": keys}
    return [
        *rope,
        ("alibi_bias numpy", lambda: pe.alibi_bias(slopes, 1, 512, **at), lambda: pe.alibi_bias(slopes, 1, 512), alibi_formula),
        ("t5_bias numpy", lambda: pe.t5_bias(table, 1, 512, **at), lambda: pe.t5_bias(table, 1, 512), lambda: _numpy_t5(table, PAST, keys)),
        ("relative_bias t5 numpy", lambda: pe.relative_bias("t5", table, 1, 512, **at), lambda: pe.relative_bias("t5", table, 1, 512), lambda: _numpy_t5(table, PAST, keys)),
        ("relative_bias alibi numpy", lambda: pe.relative_bias("alibi", slopes, 1, 512, **at), lambda: pe.relative_bias("alibi", slopes, 1, 512), alibi_formula),
    ]  # fmt: skip


def torch_rows():
    import torch
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    from posenc.torch import ALiBi, T5RelativeBias

    torch.set_num_threads(2)
    t5 = T5Attention(T5Config(num_heads=HEADS, d_model=512, d_kv=32), has_relative_attention_bias=True)
    t5_module, alibi = T5RelativeBias.from_hf(t5), ALiBi(HEADS)
    slopes, table = alibi.slopes, t5.relative_attention_bias.weight.detach()
    keys, query = torch.arange(PAST + 1), torch.tensor([PAST])
    alibi_formula = lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :].to(slopes.dtype)  # noqa: E731
    t5_formula = lambda: t5.compute_bias(1, 512, past_seen_tokens=PAST)  # noqa: E731
    at = {"query_positions": query, "key_positions": keys}
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, ROPE_HEADS, 1, HEAD_DIM)).astype(np.float32))
    return [
        *_rope_rows(torch, x, (torch.tensor([[POSITION]]),), "torch"),
        ("ALiBi module torch", lambda: alibi(1, 512, **at), lambda: alibi(1, 512, offset=PAST), alibi_formula),
        ("T5RelativeBias module torch", lambda: t5_module(1, 512, **at), lambda: t5_module(1, 512, offset=PAST), t5_formula),
        ("t5_bias torch", lambda: pe.t5_bias(table, 1, 512, **at), lambda: pe.t5_bias(table, 1, 512, offset=PAST), t5_formula),
        ("alibi_bias torch", lambda: pe.alibi_bias(slopes, 1, 512, **at), lambda: pe.alibi_bias(slopes, 1, 512, offset=PAST), alibi_formula),
    ]  # fmt: skip


def _print(rows):
    for name, *calls in rows:
        positions, scalar, formula = (t * 1e6 for t in compare(calls))
        print(f"{name:<30}{positions:9.1f}us{scalar:7.1f}us{formula:7.1f}us   {positions / scalar:.2f}x  {positions / formula:.2f}x", flush=True)


def main(libraries):
    print(f"{'call':<30}{'positions':>11}{'scalar':>9}{'formula':>9}   positions / scalar, / formula")
    for lib in libraries:
        if lib == "numpy":
            _print(numpy_rows())
            continue
        import torch

        with torch.no_grad():
            _print(torch_rows())


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["numpy", "torch"])
