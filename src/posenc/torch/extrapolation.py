"""Do positional encodings extrapolate? Train short, test long, one encoding at a time.

One small decoder-only transformer (pre-LayerNorm, causal) whose positional encoding is a
plug-in :class:`posenc.torch.PositionalModule`: ``embed`` on the token embeddings and
``attend`` in every layer. For every (encoding, task, seed) it trains at ``train_len``
items and measures the accuracy on the answer tokens at ``eval_lens`` (by default 1x, 2x,
4x and 8x the training length). ``rope+ntk``, ``rope+dynamic`` and ``rope+yarn`` are the
trained ``rope`` model evaluated with a test-time scaling, without retraining.

Everything is seeded (data, initialisation, randomised positions) and torch runs
deterministic on one thread, so the same call on the same machine gives the same records.
``python -m posenc extrapolate`` / ``posenc extrapolate`` write them with a table and a figure.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import posenc as pe

from . import _tasks
from .lengthgen import FIRE, KERPLE, CoPE, RandomizedRoPE, Sandwich

TASKS = tuple(_tasks.TASKS)
TEST_TIME_SCALINGS = ("rope+ntk", "rope+dynamic", "rope+yarn")
ENCODINGS = (
    "none", "learned", "sinusoidal", "shaw", "xl", "t5", "deberta", "tupe", "alibi", "rope", "xpos",
    "fire", "kerple", "sandwich", "cope", "randomized", *TEST_TIME_SCALINGS,
)  # fmt: skip
TRAIN_LEN = 8
FACTORS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Config:
    """Model and training sizes (the default is the documented experiment); ``mlp``: the
    MLP's hidden width as a multiple of ``d_model``; each training step draws its item count
    from ``ceil(shortest * train_len) .. train_len``."""

    d_model: int = 64
    heads: int = 4
    layers: int = 3
    mlp: int = 2
    shortest: float = 0.5
    steps: int = 400
    batch: int = 96
    lr: float = 5e-3
    eval_sequences: int = 64


# ---- the model ---------------------------------------------------------------------------


def _positional(name, cfg, train_len, train_seq, max_seq, seed):
    """A fresh positional module for ``name`` (``train_seq``: the longest training input;
    Shaw's and DeBERTa's clipping distance is the training length in items)."""
    import posenc.torch as pt

    head_dim = cfg.d_model // cfg.heads
    builders = {
        "none": lambda: pt.NoPE(),
        "learned": lambda: pt.LearnedEmbedding(train_seq, cfg.d_model),
        "sinusoidal": lambda: pt.SinusoidalEmbedding(cfg.d_model),
        "shaw": lambda: pt.ShawRelative(head_dim, max_distance=train_len),
        "xl": lambda: pt.TransformerXLRelative(cfg.heads, head_dim),
        "t5": lambda: pt.T5RelativeBias(cfg.heads, bidirectional=False),
        "deberta": lambda: pt.DeBERTaRelative(cfg.heads, head_dim, max_distance=train_len),
        "tupe": lambda: pt.TUPE(cfg.heads, head_dim, max_positions=max_seq),
        "alibi": lambda: pt.ALiBi(cfg.heads),
        "rope": lambda: pt.RotaryEmbedding(head_dim),
        "xpos": lambda: pt.XPos(head_dim),
        "fire": lambda: FIRE(cfg.heads),
        "kerple": lambda: KERPLE(cfg.heads),
        "sandwich": lambda: Sandwich(cfg.heads),
        "cope": lambda: CoPE(head_dim, npos_max=train_seq),
        "randomized": lambda: RandomizedRoPE(head_dim, max_length=max_seq, seed=seed),
    }
    return builders[name]()


def _test_time_rope(name, head_dim, train_seq, eval_seq):
    """The ``rope`` model's rotary module for ``eval_seq`` tokens with a test-time scaling."""
    import posenc.torch as pt

    factor = max(1.0, eval_seq / train_seq)
    scaling = {
        "rope+ntk": lambda: pe.scaling.NTK(factor),
        "rope+dynamic": lambda: pe.scaling.DynamicNTK(2.0, train_seq),
        "rope+yarn": lambda: pe.scaling.YaRN(factor, train_seq),
    }[name]()
    return pt.RotaryEmbedding(head_dim, scaling=scaling)


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg, positional):
        super().__init__()
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp * cfg.d_model), nn.GELU(), nn.Linear(cfg.mlp * cfg.d_model, cfg.d_model))
        self.positional = positional

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = self.positional.attend(q, k, v, causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """A causal decoder-only transformer; one positional module per layer (one shared
    module when it has no parameters of its own, or is T5's bias, shared across layers in
    T5). The first layer's module embeds."""

    def __init__(self, cfg, make_positional, *, shared=False):
        super().__init__()
        self.embedding = nn.Embedding(_tasks.VOCAB, cfg.d_model)
        first = make_positional()
        shared = shared or not any(True for _ in first.parameters())
        self.blocks = nn.ModuleList(Block(cfg, first if shared or i == 0 else make_positional()) for i in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, _tasks.VOCAB)

    def forward(self, tokens):
        x = self.blocks[0].positional.embed(self.embedding(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def replace_positional(self, make_positional):
        """A copy with every layer's positional module replaced (test-time scalings)."""
        other = _copy.deepcopy(self)
        module = make_positional()
        for block in other.blocks:
            block.positional = module
        return other


# ---- training and evaluation -------------------------------------------------------------


def _seed_of(*parts):
    """A stable 63-bit seed from strings and ints (Python's ``hash`` is salted per process)."""
    words = list(json.dumps(parts).encode())
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0]) >> 1


def _loss_and_hits(model, task, rng, batch, n):
    inputs, targets, answer = _tasks.TASKS[task](rng, batch, n)
    logits = model(torch.from_numpy(np.ascontiguousarray(inputs)))
    mask = torch.from_numpy(np.ascontiguousarray(answer))
    targets = torch.from_numpy(np.ascontiguousarray(targets))
    picked, wanted = logits[mask], targets[mask]
    loss = nn.functional.cross_entropy(picked, wanted, reduction="sum")
    return loss, int((picked.argmax(-1) == wanted).sum()), int(wanted.numel())


def train(name, task, seed, cfg, train_len, max_seq):
    """A model trained on ``task`` with ``n ~ U{ceil(cfg.shortest * train_len) .. train_len}`` items per step."""
    torch.manual_seed(_seed_of("init", name, task, seed))
    train_seq = _tasks.seq_len(task, train_len)
    model = Decoder(cfg, lambda: _positional(name, cfg, train_len, train_seq, max_seq, seed), shared=name == "t5")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    rng = np.random.default_rng(_seed_of("data", task, seed))
    model.train()
    for _ in range(cfg.steps):
        n = int(rng.integers(max(1, math.ceil(cfg.shortest * train_len)), train_len + 1))
        loss, _, count = _loss_and_hits(model, task, rng, cfg.batch, n)
        opt.zero_grad()
        (loss / count).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
    return model


@torch.no_grad()
def evaluate(model, task, seed, cfg, n):
    """``(accuracy, loss)`` on the answer tokens of ``cfg.eval_sequences`` sequences of ``n`` items."""
    model.eval()
    rng = np.random.default_rng(_seed_of("eval", task, seed, n))
    total_loss, hits, count = 0.0, 0, 0
    left = cfg.eval_sequences
    while left:
        batch = min(left, 32)
        loss, h, c = _loss_and_hits(model, task, rng, batch, n)
        total_loss, hits, count, left = total_loss + float(loss), hits + h, count + c, left - batch
    return hits / count, total_loss / count


def _for_length(model, name, task, n):
    """The model to evaluate at ``n`` items: a learned table extended past its trained rows."""
    if name != "learned":
        return model
    need = _tasks.seq_len(task, n)
    table = model.blocks[0].positional
    if need <= table.weight.shape[0]:
        return model
    other = _copy.deepcopy(model)
    other.blocks[0].positional.extend(need)
    return other


# ---- the grid ----------------------------------------------------------------------------


def _names(value, valid, what):
    if value is None:
        return list(valid)
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    value = list(value)
    unknown = [v for v in value if v not in valid]
    if unknown or not value:
        raise ValueError(f"unknown {what} {', '.join(map(repr, unknown)) or '(none given)'}; valid {what}s: {', '.join(valid)}")
    return list(dict.fromkeys(value))


def check_arguments(encodings=None, tasks=None, seeds=1, train_len=TRAIN_LEN, eval_lens=None):
    """Validated ``(encodings, tasks, seeds, train_len, eval_lens)``; raises before any training."""
    encodings = _names(encodings, ENCODINGS, "encoding")
    tasks = _names(tasks, TASKS, "task")
    for name, value in (("seeds", seeds), ("train_len", train_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    eval_lens = [train_len * f for f in FACTORS] if eval_lens is None else list(eval_lens)
    for n in eval_lens:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"eval_lens must be positive integers, got {n!r}")
        if n < train_len:
            raise ValueError(f"eval_lens must be >= train_len = {train_len} (this measures extrapolation), got {n}")
        if n > _tasks.SYMBOLS:
            raise ValueError(f"eval_lens must be <= {_tasks.SYMBOLS} (the tasks' distinct symbols), got {n}")
    if not eval_lens:
        raise ValueError("eval_lens must name at least one length")
    return encodings, tasks, seeds, train_len, sorted(set(eval_lens))


class _Progress:
    def __init__(self, total, enabled):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def step(self, label):
        self.done += 1
        if self.enabled:
            width = 24
            filled = width * self.done // self.total
            elapsed = time.perf_counter() - self.start
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:6.0f}s  {label:<32}", end="", file=sys.stderr, flush=True)
            if self.done == self.total:
                print(file=sys.stderr, flush=True)


def _job(name, evaluated, task, seed, cfg, train_len, eval_lens):
    """Train ``name`` once and evaluate it as each of ``evaluated`` (``rope`` and its
    test-time scalings share one training); returns their records."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    max_seq = _tasks.seq_len(task, max(eval_lens))
    trained = train(name, task, seed, cfg, train_len, max_seq)
    records = []
    for encoding in evaluated:
        for n in eval_lens:
            if encoding in TEST_TIME_SCALINGS:
                train_seq, eval_seq = _tasks.seq_len(task, train_len), _tasks.seq_len(task, n)
                head_dim = cfg.d_model // cfg.heads
                model = trained.replace_positional(lambda: _test_time_rope(encoding, head_dim, train_seq, eval_seq))
            else:
                model = _for_length(trained, encoding, task, n)
            accuracy, loss = evaluate(model, task, seed, cfg, n)
            records.append({"task": task, "encoding": encoding, "seed": seed, "train_len": train_len, "eval_len": n, "accuracy": accuracy, "loss": loss})
    return records


def run(*, encodings=None, tasks=None, seeds=1, quick=False, progress=True, train_len=TRAIN_LEN, eval_lens=None, config=None, workers=None):
    """Train and evaluate every (encoding, task, seed); returns the records.

    Parameters
    ----------
    encodings, tasks : names (a list, or a comma-separated string), default all of
        :data:`ENCODINGS` / :data:`TASKS`
    seeds : int >= 1, seeds ``0 .. seeds - 1``
    quick : bool, one seed whatever ``seeds`` says (the small grid)
    progress : bool, a progress bar on stderr
    train_len : int >= 1, items per training sequence (at most; each step draws from
        ``ceil(config.shortest * train_len) .. train_len``)
    eval_lens : item counts to evaluate at, each ``>= train_len`` (default ``train_len`` x 1, 2, 4, 8)
    config : :class:`Config`, model and training sizes
    workers : processes training in parallel (default: 2, or 1 on a one-core machine);
        every training runs on one thread with deterministic torch, so the records do not
        depend on ``workers``

    Returns
    -------
    list of dicts ``{"task", "encoding", "seed", "train_len", "eval_len", "accuracy", "loss"}``,
    ordered by task, encoding, seed and length; ``accuracy`` is the fraction of answer
    tokens predicted right (greedy), ``loss`` their mean cross-entropy (nats).
    """
    encodings, tasks, seeds, train_len, eval_lens = check_arguments(encodings, tasks, seeds, train_len, eval_lens)
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if quick:
        seeds = 1
    cfg = Config() if config is None else config
    shared = {}
    for name in encodings:
        shared.setdefault("rope" if name in TEST_TIME_SCALINGS else name, []).append(name)
    jobs = [(name, evaluated, task, seed, cfg, train_len, eval_lens) for task in tasks for seed in range(seeds) for name, evaluated in shared.items()]
    bar = _Progress(len(jobs), progress)
    records = []
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        if workers == 1:
            for job in jobs:
                records += _job(*job)
                bar.step(f"{job[2]} {job[0]} seed {job[3]}")
        else:
            import concurrent.futures
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
                futures = {pool.submit(_job, *job): job for job in jobs}
                for future in concurrent.futures.as_completed(futures):
                    job = futures[future]
                    records += future.result()
                    bar.step(f"{job[2]} {job[0]} seed {job[3]}")
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    order = {name: i for i, name in enumerate(encodings)}
    records.sort(key=lambda r: (tasks.index(r["task"]), order[r["encoding"]], r["seed"], r["eval_len"]))
    return records


def results(*, encodings=None, tasks=None, seeds=1, quick=False, progress=True, train_len=TRAIN_LEN, eval_lens=None, config=None, workers=None):
    """What ``results.json`` holds: :func:`run`'s records beside what made them.

    Returns ``{"config", "versions", "commit", "cpu", "seeds", "records"}``: every option
    (``config``: the validated arguments and :class:`Config`'s fields), the Python and package
    versions, the posenc source's git commit (``+changes`` when it differs from it), the CPU
    (:mod:`posenc.torch._provenance`), the seeds run and the records. Nothing in it depends on
    the clock or the load: the same call on the same machine returns the same document.
    ``workers`` is left out: the records do not depend on it.
    """
    from . import _provenance

    encodings, tasks, seeds, train_len, eval_lens = check_arguments(encodings, tasks, seeds, train_len, eval_lens)
    seeds = 1 if quick else seeds
    cfg = Config() if config is None else config
    records = run(encodings=encodings, tasks=tasks, seeds=seeds, progress=progress, train_len=train_len, eval_lens=eval_lens, config=cfg, workers=workers)
    options = {"encodings": encodings, "tasks": tasks, "quick": quick, "train_len": train_len, "eval_lens": eval_lens, **dataclasses.asdict(cfg)}
    return {
        "config": options,
        "versions": _provenance.versions(),
        "commit": _provenance.commit(),
        "cpu": _provenance.cpu(),
        "seeds": list(range(seeds)),
        "records": records,
    }
