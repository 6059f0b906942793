"""``patch_hf`` against the unpatched model: ``generate()`` and prefill on a LLaMA-like CPU model.

The model of issue 18: 8 layers, hidden 1024, 16 heads, 4 KV heads, random weights; 32 new
tokens (greedy) after a 64-token prompt, and one forward over a 1024-token prompt. The
patched and the unpatched copy share their weights and run alternately, so a busy
machine slows both alike; each figure is the best of ``repeat`` runs. ``ratio`` is patched
over unpatched wall time (at most 1.0 is the goal), beside the same ratio of CPU time.
"""

from __future__ import annotations

import copy
import time


def models(dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from .torch import patch_hf

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000
    )
    plain = LlamaForCausalLM(config).to(dtype).eval()
    return plain, patch_hf(copy.deepcopy(plain))


def _timed(fn):
    """``(wall seconds, CPU seconds of this process)`` of one call: on a shared machine the
    CPU time moves less with the load than the wall time does."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def ratios(dtype_name="float32", repeat=3, new_tokens=32, prompt=64, prefill=1024):
    """``{"generate": ((patched wall, CPU), (unpatched wall, CPU)), "prefill": ...}`` and whether the tokens agree."""
    import torch

    dtype = getattr(torch, dtype_name)
    plain, patched = models(dtype)
    ids = torch.randint(0, 32000, (1, prompt), generator=torch.Generator().manual_seed(1))
    long_ids = torch.randint(0, 32000, (1, prefill), generator=torch.Generator().manual_seed(2))
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    results = {}
    with torch.no_grad():
        tokens = [m.generate(ids, **kwargs) for m in (patched, plain)]  # warm-up (kernels, plans)
        for name, call in (("generate", lambda m: m.generate(ids, **kwargs)), ("prefill", lambda m: m(long_ids))):
            best = [(float("inf"),) * 2, (float("inf"),) * 2]
            for _ in range(repeat):
                for i, m in enumerate((patched, plain)):
                    wall, cpu = _timed(lambda: call(m))
                    best[i] = (min(best[i][0], wall), min(best[i][1], cpu))
            results[name] = tuple(best)
    return results, bool(torch.equal(tokens[0], tokens[1]))


def run(dtypes=("float32", "bfloat16"), repeat=3):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    lines = [f"{'model call':<22} {'patched':>9} {'unpatched':>10} {'ratio':>6} {'CPU-time ratio':>15}"]
    try:
        for dtype in dtypes:
            found, same = ratios(dtype, repeat)
            for name, (ours, theirs) in found.items():
                lines.append(f"{name + ' ' + dtype:<22} {ours[0]:8.3f}s {theirs[0]:9.3f}s {ours[0] / theirs[0]:6.3f} {ours[1] / theirs[1]:15.3f}")
            lines.append(f"  greedy tokens equal ({dtype}): {same}")
    finally:
        torch.set_num_threads(threads)
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
