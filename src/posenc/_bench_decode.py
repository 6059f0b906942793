"""A decode step's calls beside the framework's own code, timed interleaved in one process.

Each case is one public call at the sizes of a decode step (one new token after a cache
of 511: LLaMA-like heads ``[1, 32, 1, 128]`` and ``[1, 8, 1, 128]``, 16 bias heads over
512 keys) and the code it replaces, fed the same inputs. Rounds alternate between the
two so that a busy machine slows both alike: the figure of each is its best round's mean
per call. ``posenc bench`` prints them in its decode-step section, ``python -m
posenc._bench_decode`` alone (``-k TEXT``: the cases whose name contains it);
``asv_benchmarks/benchmarks/decode.py`` times the same cases.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

import posenc as pe

from . import _oracles

PAST = 511  # cached tokens: the new token is at position 511, the keys are 0 .. 511
HEADS, KV_HEADS, HEAD_DIM, BIAS_HEADS = 32, 8, 128, 16


@dataclass
class Case:
    name: str
    posenc: object
    framework: object
    limit: float = 1.5  # the largest ratio posenc / framework the issue allows


def _rotate_half(xp, x):
    half = x.shape[-1] // 2
    return xp.concatenate([-x[..., half:], x[..., :half]], axis=-1) if xp is np else xp.cat([-x[..., half:], x[..., :half]], dim=-1)


def _positions(steps=4096):
    """``np.array([PAST])``, ``np.array([PAST + 1])``, ... (made ahead, so no timed call makes them), round and round."""
    return itertools.cycle([np.array([PAST + i]) for i in range(steps)])


def numpy_cases(dtype=np.float32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, HEADS, 1, HEAD_DIM)).astype(dtype)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    pos = np.array([PAST])

    def tables(pos=pos):
        angles = pos[:, None] * inv_freq[None, :]
        emb = np.concatenate([angles, angles], axis=-1)
        return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)

    cos, sin = tables()
    # A decode loop's tables: each call the position after the last one, the same on both sides.
    ours, theirs = _positions(), _positions()

    def rope_formula():
        c, s = tables()
        return x * c + _rotate_half(np, x) * s

    slopes = pe.alibi_slopes(BIAS_HEADS)
    table = rng.standard_normal((32, BIAS_HEADS)).astype(dtype)
    keys = np.arange(PAST + 1)
    past = np.array(PAST)  # an engine's cache length, a 0-d array
    shaw = rng.standard_normal((129, BIAS_HEADS)).astype(dtype)  # Shaw's scalar table, K = 64
    zeta = ((np.arange(0, HEAD_DIM, 2) + 0.4 * HEAD_DIM) / (1.4 * HEAD_DIM)).astype(dtype)  # torchscale's xPos scale

    def xpos_formula():  # torchscale's XPOS: zeta ** (position / scale_base), duplicated
        scale = zeta ** (pos[:, None].astype(dtype) / 512)
        return np.concatenate([scale, scale], axis=-1)

    r1, r2 = (rng.uniform(0.1, 2.0, BIAS_HEADS).astype(dtype) for _ in range(2))  # KERPLE's parameters
    return [
        Case("rope numpy [1,32,1,128]", lambda: pe.rope(x, offset=PAST), rope_formula),
        Case("apply_rope numpy [1,32,1,128]", lambda: pe.apply_rope(x, cos, sin), lambda: _oracles.rope_rotate_half(x, cos, sin)),
        Case("rope_cos_sin numpy [1] x 64, next position", lambda: pe.rope_cos_sin(next(ours), inv_freq, dtype=dtype), lambda: tables(next(theirs))),
        Case("rope_cos_sin numpy [1] x 64, same position", lambda: pe.rope_cos_sin(pos, inv_freq, dtype=dtype), tables),
        Case("t5_bias numpy 16 heads, 1 x 512", lambda: pe.t5_bias(table, 1, PAST + 1, offset=PAST), lambda: _numpy_t5(table, PAST, keys), 1.0),
        Case(
            "relative_bias t5 numpy 16 heads, 1 x 512",
            lambda: pe.relative_bias("t5", table, 1, PAST + 1, offset=PAST),
            lambda: _numpy_t5(table, PAST, keys),
            1.0,
        ),
        Case("alibi_bias numpy 16 heads, 1 x 512", lambda: pe.alibi_bias(slopes, 1, PAST + 1, offset=PAST), lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :].astype(dtype)),
        Case("xpos_scale numpy [1] x 128, one position", lambda: pe.xpos_scale(pos, HEAD_DIM), xpos_formula),
        # (posenc computes KERPLE in float64, rounded once: its documented precision)
        Case("kerple_bias numpy 16 heads, 1 x 512", lambda: pe.kerple_bias(r1, r2, 1, PAST + 1, offset=PAST), lambda: (-r1[:, None] * np.log1p(r2[:, None] * (PAST - keys).astype(dtype)))[:, None], 3.5),
        # The same steps with positions as arrays (an engine's position ids, per-token positions).
        Case("rope numpy [1,32,1,128], positions [511]", lambda: pe.rope(x, pos), rope_formula),
        Case("rope numpy [1,32,1,128], positions [[511]]", lambda: pe.rope(x, pos[None]), rope_formula),
        Case("rope numpy [1,32,1,128], offset np.int64(511)", lambda: pe.rope(x, offset=np.int64(PAST)), rope_formula),
        Case(
            "t5_bias numpy 16 heads, 1 x 512, positions",
            lambda: pe.t5_bias(table, 1, PAST + 1, query_positions=pos, key_positions=keys),
            lambda: _numpy_t5(table, pos, keys),
            1.0,
        ),
        Case(
            "relative_bias t5 numpy 16 heads, 1 x 512, positions",
            lambda: pe.relative_bias("t5", table, 1, PAST + 1, query_positions=pos, key_positions=keys),
            lambda: _numpy_t5(table, pos, keys),
            1.0,
        ),
        Case(
            "relative_bias shaw numpy 16 heads, 1 x 512",
            lambda: pe.relative_bias("shaw", shaw, 1, PAST + 1, max_distance=64, offset=PAST),
            lambda: np.transpose(shaw[np.clip(PAST - keys, -64, 64) + 64])[:, None],
        ),
        Case("t5_bias numpy 16 heads, 1 x 512, offset np.array(511)", lambda: pe.t5_bias(table, 1, PAST + 1, offset=past), lambda: _numpy_t5(table, PAST, keys), 1.0),
        Case(
            "alibi_bias numpy 16 heads, 1 x 512, offset np.int64(511)",
            lambda: pe.alibi_bias(slopes, 1, PAST + 1, offset=np.int64(PAST)),
            lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :].astype(dtype),
        ),
        Case(
            "kerple_bias numpy 16 heads, 1 x 512, positions",
            lambda: pe.kerple_bias(r1, r2, 1, PAST + 1, query_positions=pos, key_positions=keys),
            lambda: (-r1[:, None] * np.log1p(r2[:, None] * np.abs(pos[:, None] - keys[None, :]).astype(dtype)))[:, None],
            3.5,
        ),
        Case(
            "alibi_bias numpy 16 heads, 1 x 512, positions",
            lambda: pe.alibi_bias(slopes, 1, PAST + 1, query_positions=pos, key_positions=keys),
            lambda: -slopes[:, None, None] * (pos[:, None] - keys[None, :]).astype(dtype),
        ),
    ]


def _numpy_t5(table, query, keys, num_buckets=32, max_distance=128):
    """T5's ``compute_bias`` (bidirectional) written in NumPy: bucket ``key - query``, look up, ``[heads, 1, k]``."""
    rel = keys[None, :] - query
    half = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * half
    n = np.abs(rel)
    max_exact = half // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        large = max_exact + (np.log(n.astype(np.float32) / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    buckets = buckets + np.where(n < max_exact, n, large)
    return np.transpose(table[buckets], (2, 0, 1))


def torch_cases(torch, dtype=None):
    from transformers import LlamaConfig, T5Config
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, Qwen2VLTextConfig
    from transformers.models.t5.modeling_t5 import T5Attention

    from .torch import ALiBi, T5RelativeBias, score_mod
    from .torch.hf import HFRotaryEmbedding, MultimodalHFRotaryEmbedding, apply_rotary_pos_emb

    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, 1, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(1, KV_HEADS, 1, HEAD_DIM, generator=gen).to(dtype)
    config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    llama_rotary, posenc_rotary = LlamaRotaryEmbedding(config), HFRotaryEmbedding(config)
    position_ids = torch.tensor([[PAST]])
    cos, sin = llama_rotary(q, position_ids)
    inv_freq = llama_rotary.inv_freq
    # q and k as an attention layer holds them, views [b, h, s, d] of [b, s, h, d]: 4 positions (a speculative step's check)
    q4 = torch.randn(1, 4, HEADS, HEAD_DIM, generator=gen).to(dtype).transpose(1, 2)
    k4 = torch.randn(1, 4, KV_HEADS, HEAD_DIM, generator=gen).to(dtype).transpose(1, 2)
    cos4, sin4 = llama_rotary(q, position_ids + torch.arange(4))
    sections = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    qwen2_vl = Qwen2VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rope_parameters=sections)
    qwen2_vl_rotary, posenc_mrope = Qwen2VLRotaryEmbedding(qwen2_vl), MultimodalHFRotaryEmbedding(qwen2_vl)
    image_ids = torch.tensor([[[PAST]], [[PAST // 2]], [[PAST % 7]]])  # temporal, height, width of one token

    def rope_formula():
        c, s = llama_rotary(q, position_ids)
        return q * c[:, None] + _oracles.rotate_half(q) * s[:, None]

    # A batch of 4 requests at their own lengths: one offset a row, or position_ids [[511], [300], ...]
    q_rows = torch.randn(4, HEADS, 1, HEAD_DIM, generator=gen).to(dtype)
    row_ids = torch.tensor([[PAST], [300], [17], [2]])
    past, row_offsets = torch.tensor(PAST), row_ids[:, 0].clone()

    def rows_formula():
        c, s = llama_rotary(q_rows, row_ids)
        return q_rows * c[:, None] + _oracles.rotate_half(q_rows) * s[:, None]

    t5 = T5Attention(T5Config(num_heads=BIAS_HEADS, d_model=512, d_kv=32), has_relative_attention_bias=True)
    t5_module = T5RelativeBias.from_hf(t5)
    table = t5.relative_attention_bias.weight.detach()
    alibi = ALiBi(BIAS_HEADS)
    slopes = alibi.slopes
    keys, query = torch.arange(PAST + 1), torch.tensor([PAST])
    alibi_formula = lambda: -slopes[:, None, None] * (PAST - keys)[None, None, :].to(slopes.dtype)  # noqa: E731
    alibi_positions_formula = lambda: -slopes[:, None, None] * (query[:, None] - keys[None, :]).to(slopes.dtype)  # noqa: E731
    t5_formula = lambda: t5.compute_bias(1, PAST + 1, past_seen_tokens=PAST)  # noqa: E731
    key_minus_query = -torch.arange(PAST + 1)  # a decode step's q_len + k_len - 1 distances rel = 0 .. 511, as T5 signs them

    def t5_vector():  # what score_mod captures, in T5's own code: the buckets of the distances, looked up
        buckets = T5Attention._relative_position_bucket(key_minus_query, bidirectional=True, num_buckets=32, max_distance=128)
        return table[buckets].T

    deberta = torch.randn(512, BIAS_HEADS, generator=gen).to(dtype)  # DeBERTa-v2's table, K = 256, log buckets

    def deberta_formula():  # DeBERTa's log buckets of query - key, clipped, looked up
        buckets = make_log_bucket_position(PAST - keys, 256, 512).long()
        return deberta[torch.clamp(buckets + 256, 0, 511)].T[:, None]

    mask = torch.ones(1, PAST + 1, dtype=torch.long)
    mask_positions = (mask.cumsum(-1) - 1) * mask  # BLOOM's key positions of an attention mask, [1, 512]
    with torch.no_grad():
        return [
            Case("HF apply_rotary_pos_emb q [1,32,1,128] + k [1,8,1,128]", lambda: apply_rotary_pos_emb(q, k, cos, sin), lambda: hf_apply(q, k, cos, sin)),
            Case("HFRotaryEmbedding one position", lambda: posenc_rotary(q, position_ids), lambda: llama_rotary(q, position_ids)),
            Case("HF apply q + k, 4 positions, [b,s,h,d] views", lambda: apply_rotary_pos_emb(q4, k4, cos4, sin4), lambda: hf_apply(q4, k4, cos4, sin4)),
            Case("MultimodalHFRotaryEmbedding one position vs Qwen2-VL", lambda: posenc_mrope(q, image_ids), lambda: qwen2_vl_rotary(q, image_ids)),
            Case("rope torch [1,32,1,128]", lambda: pe.rope(q, offset=PAST), rope_formula),
            Case("apply_rope torch [1,32,1,128]", lambda: pe.apply_rope(q, cos[:, None], sin[:, None]), lambda: _oracles.rope_rotate_half(q, cos[:, None], sin[:, None])),
            Case("rope_cos_sin torch [1,1] x 64", lambda: pe.rope_cos_sin(position_ids, inv_freq, dtype=dtype), lambda: llama_rotary(q, position_ids)),
            Case("T5RelativeBias 16 heads, 1 x 512", lambda: t5_module(1, PAST + 1, offset=PAST), t5_formula, 1.0),
            Case("t5_bias torch 16 heads, 1 x 512", lambda: pe.t5_bias(table, 1, PAST + 1, offset=PAST), t5_formula, 1.0),
            Case("relative_bias t5 torch 16 heads, 1 x 512", lambda: pe.relative_bias("t5", table, 1, PAST + 1, offset=PAST), t5_formula, 1.0),
            Case(
                "relative_bias deberta torch 16 heads, 1 x 512",
                lambda: pe.relative_bias("deberta", deberta, 1, PAST + 1, max_distance=256, bucket_size=256, max_position=512, offset=PAST),
                deberta_formula,
            ),
            Case("ALiBi 16 heads, 1 x 512", lambda: alibi(1, PAST + 1, offset=PAST), alibi_formula),
            Case("alibi_bias torch 16 heads, 1 x 512", lambda: pe.alibi_bias(slopes, 1, PAST + 1, offset=PAST), alibi_formula),
            # The same steps with positions as tensors (position_ids, per-token positions).
            Case("rope torch [1,32,1,128], position_ids [[511]]", lambda: pe.rope(q, position_ids), rope_formula),
            Case("rope torch [1,32,1,128], offset tensor(511)", lambda: pe.rope(q, offset=past), rope_formula),
            Case("rope torch [4,32,1,128], position_ids of 4 rows", lambda: pe.rope(q_rows, row_ids), rows_formula),
            Case("rope torch [4,32,1,128], one offset a row", lambda: pe.rope(q_rows, offset=row_offsets), rows_formula),
            Case("T5RelativeBias 16 heads, 1 x 512, offset tensor(511)", lambda: t5_module(1, PAST + 1, offset=past), t5_formula, 1.0),
            Case("ALiBi 16 heads, 1 x 512, offset tensor(511)", lambda: alibi(1, PAST + 1, offset=past), alibi_formula),
            Case("T5RelativeBias 16 heads, 1 x 512, positions", lambda: t5_module(1, PAST + 1, query_positions=query, key_positions=keys), t5_formula, 1.0),
            Case("t5_bias torch 16 heads, 1 x 512, positions", lambda: pe.t5_bias(table, 1, PAST + 1, query_positions=query, key_positions=keys), t5_formula, 1.0),
            Case("ALiBi 16 heads, 1 x 512, positions", lambda: alibi(1, PAST + 1, query_positions=query, key_positions=keys), alibi_positions_formula),
            Case("alibi_bias torch 16 heads, 1 x 512, positions", lambda: pe.alibi_bias(slopes, 1, PAST + 1, query_positions=query, key_positions=keys), alibi_positions_formula),
            Case("score_mod t5 16 heads, 1 x 512", lambda: score_mod("t5", table, 1, PAST + 1, offset=PAST), t5_vector, 1.0),
            # A decode loop outside no_grad: autograd records the table's reads, T5's as ours.
            Case("T5RelativeBias 16 heads, 1 x 512, grad", _recorded(lambda: t5_module(1, PAST + 1, offset=PAST)), _recorded(t5_formula), 1.0),
            Case(
                "T5RelativeBias 16 heads, 1 x 512, positions, grad",
                _recorded(lambda: t5_module(1, PAST + 1, query_positions=query, key_positions=keys)),
                _recorded(t5_formula),
                1.0,
            ),
            # transformers' own ALiBi step: BLOOM's build_alibi_tensor of the mask (slopes times key positions).
            Case(
                "ALiBi 16 heads, 1 x 512, mask positions [1,512] vs BLOOM",
                lambda: alibi(1, PAST + 1, query_positions=mask_positions[:, -1:], key_positions=mask_positions),
                lambda: build_alibi_tensor(mask, BIAS_HEADS, dtype),
                1.0,
            ),
        ]


def interleaved(case, rounds=7, calls=200, clock=time.perf_counter):
    """``(posenc seconds, framework seconds)`` per call: the best of ``rounds`` alternating
    rounds of ``calls`` calls, timed by ``clock`` (wall time, or ``time.process_time``)."""
    best = [math.inf, math.inf]
    fns = (case.posenc, case.framework)
    for fn in fns:
        fn()  # warm-up: compilation and plans are never timed
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = clock()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], (clock() - t0) / calls)
    return tuple(best)


def cases():
    found = numpy_cases()
    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None:
        import torch

        found += torch_cases(torch)
    return found


def _recorded(call):
    """``call`` with torch's grad mode on (the cases run under ``no_grad``)."""
    import torch

    def recorded():
        with torch.enable_grad():
            return call()

    return recorded


def run(rounds=7, calls=200, progress=lambda s: None, only="", clock=time.perf_counter):
    """The decode-step table as text: posenc and framework microseconds per call, their
    ratio, the limit; the cases whose name contains ``only``."""
    lines = [f"{'call (decode-step sizes)':<56} {'posenc':>9} {'framework':>10} {'ratio':>6} {'limit':>6}"]
    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(min(2, threads))
    try:
        grad = torch.no_grad() if torch is not None else None
        if grad is not None:
            grad.__enter__()
        for case in cases():
            if only not in case.name:
                continue
            progress(f"  {case.name} ...")
            ours, theirs = interleaved(case, rounds, calls, clock)
            lines.append(f"{case.name:<56} {ours * 1e6:7.1f}us {theirs * 1e6:8.1f}us {ours / theirs:6.2f} {case.limit:6.1f}")
        if grad is not None:
            grad.__exit__(None, None, None)
    finally:
        if torch is not None:
            torch.set_num_threads(threads)
    return "\n".join(lines)


def main(argv=None):
    import argparse

    from ._cli_errors import number

    parser = argparse.ArgumentParser(prog="python -m posenc._bench_decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", "--only", default="", help="the cases whose name contains this text")
    parser.add_argument("--rounds", type=number(int, 1), default=7)
    parser.add_argument("--calls", type=number(int, 1), default=200)
    parser.add_argument("--cpu", action="store_true", help="process CPU time instead of wall time")
    options = parser.parse_args(argv)
    clock = time.process_time if options.cpu else time.perf_counter
    print(run(options.rounds, options.calls, lambda s: print(s, flush=True), options.only, clock))


if __name__ == "__main__":
    main()
