"""``patch_hf`` against the unpatched model: ``generate()`` and prefill on a LLaMA-like CPU model.

The model of issue 18: 8 layers, hidden 1024, 16 heads, 4 KV heads, random weights; 32 new
tokens (greedy) after a 64-token prompt, and one forward over a 1024-token prompt. The
patched and the unpatched copy share their weights and run alternately, so a busy
machine slows both alike; each figure is the best of ``repeat`` runs. ``ratio`` is patched
over unpatched wall time (at most 1.0 is the goal), beside the same ratio of CPU time and
the median of the rounds' own ratios (wall / CPU), which a load that changes between
rounds moves less.

``positional`` times the positional work of the same forward alone (the rotary module and
every layer's rotation), which the matrix products' spread does not hide; ``run`` reports
it under each dtype's model calls.

``compiled=True`` (``--compile``) times both copies under ``torch.compile`` as transformers
recommends it for generation: a static KV cache (``cache_implementation="static"``) and
``model.forward = torch.compile(model.forward)`` (transformers compiles ``generate()`` by
itself only on accelerators). The first ``generate()`` and the first prefill of each copy
compile; they are reported apart ("first call") and left out of the best-of timings.
"""

from __future__ import annotations

import copy
import statistics
import time


def models(dtype, layers=8):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from .torch import patch_hf

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000
    )
    plain = LlamaForCausalLM(config).to(dtype).eval()
    return plain, patch_hf(copy.deepcopy(plain))


def _timed(fn):
    """``(wall seconds, CPU seconds of this process)`` of one call: on a shared machine the
    CPU time moves less with the load than the wall time does."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def ratios(dtype_name="float32", repeat=3, new_tokens=32, prompt=64, prefill=1024, compiled=False, layers=8):
    """``{"generate": ((patched wall, CPU), (unpatched wall, CPU), (median ratio wall, CPU)), "prefill": ...}``
    and whether the tokens agree: the best of ``repeat`` runs of each copy, and the median over
    the rounds of each round's patched/unpatched ratio (the two copies run back to back in
    a round, so both see the same moment's load).

    With ``compiled``, also ``"generate, first call"`` and ``"prefill, first call"``: the calls
    that compile (each copy's first, timed once)."""
    import torch

    dtype = getattr(torch, dtype_name)
    plain, patched = models(dtype, layers)
    ids = torch.randint(0, 32000, (1, prompt), generator=torch.Generator().manual_seed(1))
    long_ids = torch.randint(0, 32000, (1, prefill), generator=torch.Generator().manual_seed(2))
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    if compiled:
        kwargs["cache_implementation"] = "static"
        torch._dynamo.reset()  # both copies share one code object: 3 graphs each, under the recompile limit
        for m in (patched, plain):
            m.forward = torch.compile(m.forward)
    calls = (("generate", lambda m: m.generate(ids, **kwargs)), ("prefill", lambda m: m(long_ids)))
    results = {}
    with torch.no_grad():
        if compiled:
            for name, call in calls:
                results[name + ", first call"] = tuple(_timed(lambda: call(m)) for m in (patched, plain))
        tokens = [m.generate(ids, **kwargs) for m in (patched, plain)]  # warm-up (kernels, plans)
        for name, call in calls:
            times = {0: [], 1: []}
            for round_ in range(repeat):
                for i in (0, 1) if round_ % 2 == 0 else (1, 0):  # which copy runs first alternates too
                    times[i].append(_timed(lambda: call((patched, plain)[i])))
            best = [tuple(min(t[j] for t in times[i]) for j in (0, 1)) for i in (0, 1)]
            paired = [tuple(o[j] / t[j] for j in (0, 1)) for o, t in zip(times[0], times[1])]
            results[name] = (*best, tuple(statistics.median(r[j] for r in paired) for j in (0, 1)))
    return results, bool(torch.equal(tokens[0], tokens[1]))


def positional(dtype_name="float32", tokens=1, compiled=False, layers=8, calls=200, rounds=7):
    """``{"posenc": seconds, "transformers": seconds}``: the positional work of one forward of
    the model above alone, the rotary module once and the rotation of q and k in every
    layer, patched (``HFRotaryEmbedding``, ``posenc.torch.hf.apply_rotary_pos_emb``) and
    unpatched (transformers' LLaMA code), at ``tokens`` new positions (1: a decode step),
    eager or compiled (inductor, static shapes). The same work as in ``ratios`` without the
    matrix products around it, whose run-to-run spread (several percent on a shared CPU)
    hides differences of this size; the best of ``rounds`` alternated rounds of ``calls``."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from .torch import hf

    dtype = getattr(torch, dtype_name)
    config = LlamaConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4)
    gen = torch.Generator().manual_seed(0)
    # q and k as the attention makes them: a projection viewed [1, tokens, heads, 64], transposed
    qs = [torch.randn(1, tokens, 16 * 64, generator=gen).to(dtype).view(1, tokens, 16, 64).transpose(1, 2) for _ in range(layers)]
    ks = [torch.randn(1, tokens, 4 * 64, generator=gen).to(dtype).view(1, tokens, 4, 64).transpose(1, 2) for _ in range(layers)]
    x = torch.zeros(1, dtype=dtype)

    def step(rotary, apply):
        def forward(position_ids):
            cos, sin = rotary(x, position_ids)
            return [apply(q, k, cos, sin) for q, k in zip(qs, ks)]

        return torch.compile(forward, fullgraph=True, dynamic=False) if compiled else forward

    rotary = hf.HFRotaryEmbedding(config)
    rotary.keep_rows_for_compile(dtype)  # as patch_hf does for a CPU model
    steps = {"posenc": step(rotary, hf.apply_rotary_pos_emb), "transformers": step(LlamaRotaryEmbedding(config), apply_rotary_pos_emb)}
    positions = [torch.arange(64 + i, 64 + i + tokens)[None] for i in range(calls)]
    best = {}
    with torch.no_grad():
        for forward in steps.values():
            forward(positions[0])
        for _ in range(rounds):
            for name, forward in steps.items():
                start = time.perf_counter()
                for p in positions:
                    forward(p)
                best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / calls)
    return best


def run(dtypes=("float32", "bfloat16"), repeat=3, compiled=False, layers=8):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    lines = [f"{'model call':<36} {'patched':>9} {'unpatched':>10} {'ratio':>6} {'CPU-time ratio':>15} {'median round ratio':>19}"]
    try:
        for dtype in dtypes:
            found, same = ratios(dtype, repeat, compiled=compiled, layers=layers)
            for name, (ours, theirs, *median) in found.items():
                paired = f"{median[0][0]:.3f} / {median[0][1]:.3f}" if median else "-"
                lines.append(f"{name + ' ' + dtype:<36} {ours[0]:8.3f}s {theirs[0]:9.3f}s {ours[0] / theirs[0]:6.3f} {ours[1] / theirs[1]:15.3f} {paired:>19}")
            lines.append(f"  greedy tokens equal ({dtype}): {same}")
            for tokens in (1, 1024):
                found = positional(dtype, tokens, compiled, layers, calls=200 if tokens == 1 else 10)
                ours, theirs = found["posenc"], found["transformers"]
                name = f"positional work, {tokens} token{'s' * (tokens > 1)} {dtype}"
                lines.append(f"{name:<36} {ours * 1e6:7.1f}us {theirs * 1e6:8.1f}us {ours / theirs:6.3f}")
    finally:
        torch.set_num_threads(threads)
    return "\n".join(lines)


def main(argv=None):
    import argparse

    from ._cli_errors import number

    parser = argparse.ArgumentParser(prog="python -m posenc._bench_generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="both copies under torch.compile (static KV cache)")
    parser.add_argument("--dtype", action="append", choices=("float32", "bfloat16"), help="repeat for several (default: both)")
    parser.add_argument("--repeat", type=number(int, 1), default=3, help="best of this many alternated runs (default 3)")
    parser.add_argument("--layers", type=number(int, 1), default=8, help="decoder layers (default 8, the model of issue 18)")
    args = parser.parse_args(argv)
    print(run(tuple(args.dtype or ("float32", "bfloat16")), args.repeat, args.compile, args.layers))


if __name__ == "__main__":
    main()
