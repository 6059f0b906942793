"""The figures of docs/transformers.md, "float16 and bfloat16 models": a 16-bit transformers
model patched by ``patch_hf`` against the same model unpatched and in float32.

``python docs/hf_16bit.py`` (from the repository root; about 10 s on two cores, a minute more
on the first run, which compiles posenc's kernels) builds each of the 14 rotary models of
``tests/hf_models.py`` in float32, converts a copy to bfloat16 and to float16, and patches a
copy of that. On the left-padded batch of two 24-token rows (real tokens only) and 14 greedy
tokens from the 10-token prompt, it prints per model and then the table's figures for each
dtype: the largest logit difference patched vs unpatched (and the float32 model's largest
logit), the mean logit distance from the float32 model of the unpatched and of the patched
model, the models whose greedy tokens differ patched vs unpatched, unpatched vs float32 (and
patched vs float32), and in how many models the patched model is closer to the float32 model,
and further by at most how much in the others.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")  # tests/hf_models.py
ROTARY_PREFIXES = ("llama", "mistral", "qwen", "phi3", "gemma", "gpt_neox")  # the rotary models of hf_models.MODELS


def measure(name, dtype):
    """One model in ``dtype``: a dict of its figures."""
    import torch
    from hf_models import PROMPT, build, generate, inputs, logits

    from posenc.torch import patch_hf

    reference = build(name)
    original = copy.deepcopy(reference).to(dtype)
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = inputs()
    real = mask.bool()[..., None].expand(-1, -1, reference.config.vocab_size)
    exact = logits(reference, ids, mask)[real]
    before, after = logits(original, ids, mask).float()[real], logits(patched, ids, mask).float()[real]
    prompt, prompt_mask = ids[:, :PROMPT], mask[:, :PROMPT]
    tokens = {which: generate(model, prompt, prompt_mask) for which, model in (("float32", reference), ("unpatched", original), ("patched", patched))}
    return {
        "diff": float((after - before).abs().max()),
        "scale": float(exact.abs().max()),
        "unpatched": float((before - exact).abs().mean()),
        "patched": float((after - exact).abs().mean()),
        "tokens patched vs unpatched": not torch.equal(tokens["patched"], tokens["unpatched"]),
        "tokens unpatched vs float32": not torch.equal(tokens["unpatched"], tokens["float32"]),
        "tokens patched vs float32": not torch.equal(tokens["patched"], tokens["float32"]),
    }


def _range(values, digits):
    return f"{min(values):.{digits}g}-{max(values):.{digits}g}"


def main():
    sys.path.insert(0, TESTS)
    import hf_models
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the tiny configs' notices
    rotary = [name for name in hf_models.MODELS if name.startswith(ROTARY_PREFIXES)]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {len(rotary)} rotary models of tests/hf_models.py")
    summary = {}
    for dtype in (torch.bfloat16, torch.float16):
        rows = {}
        for name in rotary:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rows[name] = r = measure(name, dtype)
            flags = [k.removeprefix("tokens ") for k, v in r.items() if k.startswith("tokens") and v]
            print(
                f"{str(dtype)[6:]:9s} {name:24s} max|diff| {r['diff']:.3g} (largest logit {r['scale']:.3g})  mean distance from "
                f"float32: unpatched {r['unpatched']:.3g}, patched {r['patched']:.3g} ({r['patched'] / r['unpatched'] - 1:+.1%})"
                f"  tokens differ: {', '.join(flags) or '-'}"
            )
        summary[dtype] = rows
    n = len(rotary)
    print()
    for dtype, rows in summary.items():
        r = list(rows.values())
        closer = [x for x in r if x["patched"] < x["unpatched"]]
        further = max((x["patched"] / x["unpatched"] - 1 for x in r if x not in closer), default=0.0)
        print(f"{str(dtype)[6:]}:")
        print(f"  largest logit difference, patched vs unpatched: {_range([x['diff'] for x in r], 2)} (largest logit {_range([x['scale'] for x in r], 2)})")
        print(f"  mean logit distance from the float32 model, unpatched: {_range([x['unpatched'] for x in r], 2)}")
        print(f"  mean logit distance from the float32 model, patched: {_range([x['patched'] for x in r], 2)}")
        for key in ("tokens patched vs unpatched", "tokens unpatched vs float32", "tokens patched vs float32"):
            names = [name for name, x in rows.items() if x[key]]
            print(f"  greedy {key.removeprefix('tokens ')} differ: {len(names)} of {n} ({', '.join(names)})")
        print(f"  patched closer to float32 than unpatched in {len(closer)} of {n}, further by at most {further:.1%} in the others")


if __name__ == "__main__":
    main()
