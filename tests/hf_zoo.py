"""Every transformers causal-LM architecture, built tiny from its own config class, against its patched copy.

``model_types()`` lists the model types of transformers' causal-LM auto mapping;
``build(model_type)`` shrinks the default config (2 layers, hidden 64, 4 heads, 2 KV heads,
head dim 16, vocab 96, 4 experts, ...) and builds a random float32 model in eval mode, or
raises :class:`Unbuildable` saying why not (a config that refuses the sizes, a model that
needs inputs other than token ids, a forward or ``generate()`` that fails unpatched).
``check(model_type)`` patches a copy with ``posenc.torch.patch_hf`` and returns a
:class:`Row`: what was patched, the largest logit difference on a left-padded batch, whether
greedy ``generate()`` (KV cache) gives the same tokens, or why ``patch_hf`` refused.

``python tests/hf_zoo.py [--markdown FILE] [TYPE ...]`` runs every architecture (or the
ones named) and prints the table, or writes it between the markers of ``FILE``
(docs/transformers.md).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
import warnings

import torch

import hf_models
from hf_models import NEW, PROMPT, VOCAB

LENGTH = PROMPT + NEW

# Config fields set when the default config has them: sizes shrunk (and Zamba2's use_mem_rope
# on, so that its attention runs its rotary path).
SIZES = dict(
    vocab_size=VOCAB, hidden_size=64, d_model=64, n_embd=64, intermediate_size=96, ffn_hidden_size=96, n_inner=96,
    num_hidden_layers=2, n_layer=2, num_layers=2, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_attention_heads=4, n_head=4, num_heads=4,
    num_key_value_heads=2, n_head_kv=2, num_kv_heads=2, multi_query_group_num=2, head_dim=16,
    max_position_embeddings=64, n_positions=64, max_seq_len=64, seq_length=64,
    num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2, moe_k=2,
    top_k=2, n_shared_experts=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    expert_ffn_hidden_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
    kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    rotary_dim=8, sliding_window=8, attention_chunk_size=8, initializer_range=0.25, use_cache=True,
    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
    ngram_vocab_size_base=VOCAB, split_ngram_parts=1, use_mem_rope=True, vocab_size_per_layer_input=VOCAB,
    hidden_size_per_layer_input=16,
)
# Sizes set even where the default config leaves them None: a None the model reads as a number
# (head_dim = hidden / heads, a KV head count, Qwen4-Exp's indexer) fails the tiny build.
SET_WHEN_NONE = (
    "n_group", "topk_group", "num_experts_per_tok", "head_dim", "num_key_value_heads",
    "indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio",
)
NOT_RUN = "no rotary, T5 relative-bias or ALiBi code in its modeling file (not run)"
# Fields that must not be set (a tied embedding of another size, special ids beyond the vocab).
UNSET = dict(tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0)


class Unbuildable(Exception):
    """The architecture cannot be built tiny and run unpatched; the message says why."""


@dataclasses.dataclass
class Row:
    model_type: str
    patched: str = ""  # what patch_hf replaced (its report), empty when refused
    diff: float = float("nan")  # max |logit difference| over real tokens
    scale: float = float("nan")  # max |logit|
    rounding: float = float("nan")  # max |logit difference| of the unpatched model in float32 and float64
    tokens_equal: bool | None = None
    refused: str = ""  # patch_hf's error, or why it cannot be built tiny
    buildable: bool = True

    @property
    def covered(self):
        return self.buildable and not self.refused and self.tokens_equal and self.diff <= self.tolerance

    @property
    def tolerance(self):
        """Float32 rounding of this model: 1e-5 of the largest logit, or twice its own float32 error if larger."""
        return max(1e-5 * self.scale, 2 * self.rounding)


def model_types():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def positional(model_type):
    """Whether the modeling file of ``model_type`` has rotary, T5 relative-bias or ALiBi code."""
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    try:
        source = inspect.getsource(importlib.import_module(f"transformers.models.{name}.modeling_{name}"))
    except (ImportError, OSError):
        return True  # cannot tell: run it
    return bool(re.search(r"def apply_\w*rot|relative_attention_bias|alibi|RotaryEmbedding", source))


def _shrunk(config_class):
    default = config_class()
    default.allow_global_per_layer_attribute_access = True  # a per-layer attribute (Gemma 4's head_dim): its global value shrunk, its per-layer ones kept
    layers = next((getattr(default, n) for n in ("num_hidden_layers", "n_layer", "num_layers") if hasattr(default, n)), None)
    kwargs = {
        k: v for k, v in SIZES.items()
        if hasattr(default, k) and (getattr(default, k) is not None or k in SET_WHEN_NONE)
        and not isinstance(getattr(config_class, k, None), property)
    }
    for name, sub in (getattr(config_class, "sub_configs", None) or {}).items():  # text/vision configs: shrunk too
        if isinstance(sub, type):
            kwargs[name] = _shrunk(sub)
    if "qk_rope_head_dim" in kwargs:  # multi-head latent attention: the rotary head is qk_rope_head_dim, no KV groups
        kwargs.pop("head_dim", None)
        if "num_key_value_heads" in kwargs:
            kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    kwargs.update({k: v for k, v in UNSET.items() if hasattr(default, k) or k == "tie_word_embeddings"})
    count = 2
    per_layer = {
        name: value for name, value in vars(default).items()
        if isinstance(value, list) and layers and len(value) == layers and not _layer_indices(value, layers)
    }
    for value in per_layer.values():  # per-layer lists: one layer of each kind (attention, linear, ...)
        count = max(count, len(dict.fromkeys(map(repr, value))))
    for name, value in per_layer.items():
        firsts = [value[[repr(v) for v in value].index(kind)] for kind in dict.fromkeys(map(repr, value))]
        kwargs[name] = (firsts * count)[:count]
    for name, value in vars(default).items():  # a list of every layer's index (LFM2's full_attn_idxs): those that remain
        if isinstance(value, list) and layers and len(value) == layers and _layer_indices(value, layers):
            kwargs[name] = [i for i in value if i < count]
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if name in kwargs:
            kwargs[name] = count
    config = config_class(**kwargs)
    fraction = _partial_rotary_factor(config)
    if fraction and kwargs.get("head_dim") and int(kwargs["head_dim"] * fraction) % 2:  # an odd rotary dimension: a wider head
        kwargs["head_dim"] = next(h for h in range(16, 257, 8) if int(h * fraction) % 2 == 0 and int(h * fraction) >= 2)
        config = config_class(**kwargs)
    return config


def _layer_indices(value, layers):
    """A list of layer indices (distinct, increasing ints below ``layers``), not one value per layer."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return ints and len(value) > 0 and value == sorted(set(value)) and value[-1] < layers


def _partial_rotary_factor(config):
    """The rotary fraction of the head: of the rope parameters, or of their first layer type (nested), or of the config."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        for d in (params, *(v for v in params.values() if isinstance(v, dict))):
            if isinstance(d.get("partial_rotary_factor"), float):
                return d["partial_rotary_factor"]
    return getattr(config, "partial_rotary_factor", None)


def build(model_type, seed=0):
    """A tiny random float32 model of ``model_type`` in eval mode (``Unbuildable`` if it cannot be)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config = _shrunk(CONFIG_MAPPING[model_type])
    except Exception as error:  # noqa: BLE001  (any refusal of the sizes: recorded as the reason)
        raise Unbuildable(f"config refuses tiny sizes: {type(error).__name__}: {_short(error)}") from None
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    except Exception as error:  # noqa: BLE001
        raise Unbuildable(f"model cannot be built tiny: {type(error).__name__}: {_short(error)}") from None
    return model.eval()


def rotary_modules(packages=None):
    """transformers' rotary modules with a default initialiser (``compute_default_rope_parameters``)
    in the modeling files of ``packages`` (folders of ``transformers.models``; every one when
    None), each with the config classes it is built from: ``[(rotary class, [config class,
    ...])]``, the annotated ``config`` of every ``__init__`` in the file that builds it from its
    ``config`` (where none does, the ``config`` its initialiser is annotated with)."""
    import ast
    import importlib
    import inspect
    import pkgutil
    import typing

    import transformers.models

    found = []
    for name in packages or sorted(m.name for m in pkgutil.iter_modules(transformers.models.__path__)):
        try:
            modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        rotary = {
            n: c for n, c in vars(modeling).items()
            if isinstance(c, type) and c.__module__ == modeling.__name__ and hasattr(c, "compute_default_rope_parameters")
        }
        built = {n: [] for n in rotary}  # rotary class name -> config classes of the __init__s that build it
        for node in ast.walk(ast.parse(inspect.getsource(modeling))):
            init = node if isinstance(node, ast.FunctionDef) and node.name == "__init__" else None
            config = init and next((a.annotation for a in init.args.args if a.arg == "config"), None)
            if not isinstance(config, ast.Name) or not isinstance(getattr(modeling, config.id, None), type):
                continue
            for call in ast.walk(init):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in rotary:
                    given = [*call.args, *(k.value for k in call.keywords if k.arg == "config")][:1]
                    if given and ast.unparse(given[0]) in ("config", "self.config") and getattr(modeling, config.id) not in built[call.func.id]:
                        built[call.func.id].append(getattr(modeling, config.id))
        for n, cls in rotary.items():
            found.append((cls, built[n] or [typing.get_type_hints(cls.compute_default_rope_parameters)["config"]]))
    return found


def default_rotary(rotary_class, config_class, partial_rotary_factor=None):
    """``(module, config)``: ``rotary_class`` built from ``config_class`` (or its text config),
    shrunk (at its default sizes where it refuses them), with every rope parameter set to
    ``rope_type="default"`` (its ``rope_theta`` kept) and ``partial_rotary_factor`` (the
    config's own when None); ``Unbuildable`` says why it cannot be."""

    def default(params):
        fraction = params.get("partial_rotary_factor") if partial_rotary_factor is None else partial_rotary_factor
        return {"rope_type": "default", "rope_theta": params.get("rope_theta", 10000.0)} | (
            {} if fraction is None else {"partial_rotary_factor": fraction}
        )

    try:
        config = _shrunk(config_class)
    except Exception:  # noqa: BLE001  (its default sizes, then)
        try:
            config = config_class()
        except Exception as error:  # noqa: BLE001
            raise Unbuildable(f"{config_class.__name__}() fails: {type(error).__name__}: {_short(error, 80)}") from None
    text = config if getattr(config, "rope_parameters", None) is not None else config.get_text_config()
    params = getattr(text, "rope_parameters", None)
    if params is None or type(text).__module__ != config_class.__module__:
        raise Unbuildable(f"{config_class.__name__} has no rope parameters")
    params = params or {t: {} for t in dict.fromkeys(getattr(text, "layer_types", None) or ())}  # (left to a composite config to fill)
    nested = bool(params) and all(isinstance(v, dict) or v is None for v in params.values())
    text.rope_parameters = {k: None if v is None else default(v) for k, v in params.items()} if nested else default(params)
    why = []
    for given in (config,) if text is config else (config, text):
        try:
            return rotary_class(given), text
        except Exception as error:  # noqa: BLE001  (a config this module is not built from)
            why.append(f"not built from {type(given).__name__}: {type(error).__name__}: {_short(error, 80)}")
    raise Unbuildable("; ".join(why))


def inputs():
    """hf_models' left-padded batch of two, ``LENGTH`` tokens, ids from 3 (0-2 are special tokens in some configs)."""
    return hf_models.inputs(length=LENGTH, lowest=3)


def logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.float()


def generate(model, ids, mask):
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0
    )


def _short(error, limit=160):
    text = re.sub(r"\s+", " ", str(error)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_unpatched(model):
    ids, mask = inputs()
    try:
        out = logits(model, ids, mask)
        tokens = generate(model, ids[:, :PROMPT], mask[:, :PROMPT])
    except Exception as error:  # noqa: BLE001
        raise Unbuildable(f"unpatched forward/generate fails: {type(error).__name__}: {_short(error)}") from None
    if not torch.isfinite(out).all():
        raise Unbuildable("unpatched logits are not finite")
    return out, tokens


def check(model_type):
    """Patch a tiny ``model_type`` and compare with the original: a :class:`Row`."""
    from posenc.torch import patch_hf

    row = Row(model_type)
    if not positional(model_type):
        row.buildable, row.refused = False, NOT_RUN
        return row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            original = build(model_type)
            before, tokens = run_unpatched(original)
        except Unbuildable as why:
            row.buildable, row.refused = False, str(why)
            return row
        model = copy.deepcopy(original)
        try:
            patch_hf(model)
        except ValueError as error:
            row.refused = _short(error, 400)
            return row
        row.patched = describe(model.posenc_patched)
        ids, mask = inputs()
        try:
            after = logits(model, ids, mask)
            row.tokens_equal = torch.equal(generate(model, ids[:, :PROMPT], mask[:, :PROMPT]), tokens)
        except Exception as error:  # noqa: BLE001  (a patched model that fails is a failure of patch_hf: recorded)
            row.patched, row.refused = "", f"FAILS after patching: {type(error).__name__}: {_short(error)}"
            return row
        real = mask.bool()
        row.diff = float((after - before).abs()[real].max())
        row.scale = float(before.abs()[real].max())
        try:  # the model's own float32 error, where it runs in float64 (grouped-matmul MoE layers do not)
            exact = logits(copy.deepcopy(original).double(), ids, mask)
            row.rounding = float((before.double() - exact).abs()[real].max())
        except RuntimeError:
            row.rounding = 0.0
    return row


def describe(parts):
    """``"HFRotaryEmbedding x1; apply_rotary_pos_emb: apply_rope (half) x2"`` from ``model.posenc_patched``."""
    counts = {}
    for part in parts:
        what = part.split(": ", 1)[1]
        counts[what] = counts.get(what, 0) + 1
    return "; ".join(f"{what} x{n}" for what, n in counts.items())


def markdown(rows):
    lines = [
        "| architecture | patched | max \\|logit diff\\| (tolerance) | greedy tokens | refused because |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.buildable:
            continue
        diff = f"{r.diff:.2g} ({r.tolerance:.2g})" if r.patched else ""
        tokens = "" if r.tokens_equal is None else ("equal" if r.tokens_equal else "DIFFERENT")
        refused = r.refused.replace("|", "/").replace("*", "\\*")
        lines.append(f"| `{r.model_type}` | {r.patched} | {diff} | {tokens} | {refused} |")
    return "\n".join(lines)


def unbuildable_markdown(rows):
    lines = [f"- `{r.model_type}`: {r.refused.replace('*', chr(92) + '*')}" for r in rows if not r.buildable and r.refused != NOT_RUN]
    quiet = [f"`{r.model_type}`" for r in rows if r.refused == NOT_RUN]
    return "\n".join(lines) + f"\n\nWithout rotary, T5 relative-bias or ALiBi code in their modeling file (not run): {', '.join(quiet)}."


def summary(rows):
    buildable = [r for r in rows if r.buildable]
    covered = [r for r in buildable if r.covered]
    return f"{len(covered)} of {len(buildable)} buildable tiny causal-LM architectures covered ({len(rows)} model types in transformers' causal-LM mapping)"


def _write(path, rows):
    text = open(path).read()
    block = f"{summary(rows)}.\n\n{markdown(rows)}\n\nNot buildable tiny (not in the table):\n\n{unbuildable_markdown(rows)}\n"
    start, end = "<!-- hf-zoo-table:start -->", "<!-- hf-zoo-table:end -->"
    if start not in text:
        raise SystemExit(f"{path} has no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{start}\n{block}{end}{tail}")


if __name__ == "__main__":
    import transformers

    args = sys.argv[1:]
    import json

    target = jsonl = None
    if args[:1] == ["--markdown"]:
        target, args = args[1], args[2:]
    if args[:1] == ["--jsonl"]:  # append each row to a file; --markdown FILE --from JSONL writes the table from it
        jsonl, args = args[1], args[2:]
    if args[:1] == ["--from"]:
        latest = {}  # the last row of each model type, over the files in order
        for path in args[1:]:
            for line in open(path):
                row = Row(**json.loads(line))
                latest[row.model_type] = row
        rows = [latest[t] for t in sorted(latest)]
        print(summary(rows))
        _write(target, rows)
        raise SystemExit(0)
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a config that stays large fails, not the machine
    def too_slow(*_):
        raise TimeoutError("over 300 s")

    signal.signal(signal.SIGALRM, too_slow)
    rows = []
    for model_type in args or model_types():
        signal.alarm(300)
        try:
            row = check(model_type)
        except Exception as error:  # noqa: BLE001  (recorded in the table, the sweep goes on)
            row = Row(model_type, buildable=False, refused=f"the run fails: {type(error).__name__}: {_short(error)}")
        signal.alarm(0)
        rows.append(row)
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")
        status = "covered" if row.covered else ("unbuildable" if not row.buildable else "refused/failed")
        print(f"{model_type:28s} {status:14s} {row.patched:40s} {row.diff:9.2g} {row.tokens_equal!s:5s} {row.refused}", flush=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {summary(rows)}")
    if target and not jsonl:
        _write(target, rows)
