"""A decode step's bias with positions as arrays, beside the same call with a scalar offset and the plain formula.

``python docs/positions_bench.py [numpy,torch]`` prints, for 16 heads, 512 keys
(``arange(512)``) and one query at 511, float32, the best per-call process CPU time of
``t5_bias`` / ``alibi_bias`` / ``relative_bias`` and the torch modules with
``query_positions=[511], key_positions=arange(512)``, of the same call with ``offset=511``,
and of the framework's formula (NumPy: ``posenc._bench_decode``'s; torch: transformers'
``T5Attention.compute_bias`` and ALiBi's ``-slopes[:, None, None] * (511 - keys)``),
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

PAST, HEADS = 511, 16


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


def numpy_rows():
    slopes = pe.alibi_slopes(HEADS)
    table = np.random.default_rng(0).standard_normal((32, HEADS)).astype(np.float32)
    keys, query = np.arange(PAST + 1), np.array([PAST])
    alibi_formula = lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :]  # noqa: E731
    at = {"query_positions": query, "key_positions": keys}
    return [
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
    return [
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
