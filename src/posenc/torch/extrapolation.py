"""Do positional encodings extrapolate? Train short, test long, one encoding at a time.

One small decoder-only transformer (pre-LayerNorm, causal) whose positional encoding is a
plug-in :class:`posenc.torch.PositionalModule`: ``embed`` on the token embeddings and
``attend`` in every layer. For every encoding it picks a learning rate out of ``Config.lrs``
on in-distribution validation data (seed 0 of ``reverse``), then trains every (task, seed) at
that rate at ``train_len`` items and measures, at ``eval_lens`` (by default 1x, 2x, 4x and 8x the
training length):

- **exact match**: the share of sequences whose whole answer greedy decoding writes right.
  Greedy decoding is run as one forward pass over the true sequence: a causal model's
  free-running greedy output equals the true answer exactly when every next-token argmax
  along the true prefix is right (up to the first mistake the two prefixes are the same), so
  the share is that of free-running decoding (tests/test_extrapolation.py decodes token by
  token and compares);
- **token accuracy**: the share of answer tokens whose argmax is right given the true
  prefix (teacher forcing), and the mean cross-entropy of the answer tokens.

``rope+ntk``, ``rope+dynamic`` and ``rope+yarn`` are the trained ``rope`` model evaluated with
a test-time scaling, without retraining. The length-dependent hyperparameters (FIRE's ``L``,
xPos's ``scale_base``, CoPE's ``P``, Sandwich's base, the randomised range ``M``) are scaled
to the training length (:mod:`posenc.torch._hparams`).

Everything is seeded (data, initialisation, randomised positions) and torch runs
deterministic on one thread, so the same call on the same machine gives the same records.
``posenc extrapolate`` writes them with a table and a figure.
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

from . import _hparams, _tasks
from ._protocol import positive_int
from .lengthgen import FIRE, KERPLE, CoPE, RandomizedRoPE, Sandwich

TASKS = tuple(_tasks.TASKS)
# the default grid's, within its hour on two cores (copy, sort and bucket_sort by --tasks)
DEFAULT_TASKS = ("reverse", "duplicate", "parity", "modular_arithmetic", "count")
TEST_TIME_SCALINGS = ("rope+ntk", "rope+dynamic", "rope+yarn")
ENCODINGS = (
    "none", "learned", "sinusoidal", "shaw", "xl", "t5", "deberta", "tupe", "alibi", "rope", "xpos",
    "fire", "kerple", "sandwich", "cope", "randomized", *TEST_TIME_SCALINGS,
)  # fmt: skip
# --quick: the encodings the seeds' table and the papers argue about, on one task, 3 seeds, one rate
QUICK_ENCODINGS = ("none", "learned", "sinusoidal", "t5", "alibi", "rope", "fire", "kerple", "sandwich", "cope", "rope+yarn")
QUICK_TASKS = ("reverse",)
QUICK_SEEDS = 3
SEEDS = 5
TRAIN_LEN = 8
FACTORS = (1, 2, 4, 8)
# the longest model input, in tokens: past the papers' longest tests (500 items, Delétang et al.;
# duplicate's input is 1,500 tokens there), and evaluation's attention scores there (32
# sequences, 4 heads, float32) are already 2 GiB per layer
MAX_INPUT = 2048
# the most seeds and training steps a run takes: each seed trains every encoding on every task,
# and the job list is built before training; past these a run would take months
MAX_SEEDS = 1000
MAX_STEPS = 1_000_000


@dataclasses.dataclass(frozen=True)
class Shape:
    """The transformer's sizes; ``mlp``: the MLP's hidden width as a multiple of ``d_model``."""

    d_model: int = 64
    heads: int = 4
    layers: int = 3
    mlp: int = 2


@dataclasses.dataclass(frozen=True)
class Config(Shape):
    """Model and training sizes (the default is the documented experiment); each training
    step draws its item count from ``ceil(shortest * train_len) .. train_len``; ``lrs``: the
    learning rates tried per encoding on seed 0 of :func:`sweep_task`, the best on
    ``valid_sequences`` in-distribution sequences kept for every task (one rate: no sweep)."""

    shortest: float = 0.5
    steps: int = 400
    batch: int = 96
    lrs: tuple = (2.5e-3, 5e-3, 1e-2)
    eval_sequences: int = 64
    valid_sequences: int = 64


QUICK = Config(lrs=(5e-3,))


# ---- the model ---------------------------------------------------------------------------


def _positional(name, cfg, train_len, train_seq, max_seq, hp, seed):
    """A fresh positional module for ``name`` (``train_seq``: the longest training input,
    ``max_seq`` the longest test input; ``hp``: :func:`posenc.torch._hparams.resolve`'s values; Shaw's and DeBERTa's clipping
    distance is the training length in items)."""
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
        "xpos": lambda: pt.XPos(head_dim, scale_base=hp["xpos"]["scale_base"]),
        "fire": lambda: FIRE(cfg.heads, threshold=hp["fire"]["L"]),
        "kerple": lambda: KERPLE(cfg.heads),
        "sandwich": lambda: Sandwich(cfg.heads, dim=hp["sandwich"]["dim"], base=hp["sandwich"]["base"]),
        "cope": lambda: CoPE(head_dim, npos_max=hp["cope"]["P"]),
        "randomized": lambda: RandomizedRoPE(head_dim, max_length=hp["randomized"]["M"], seed=seed),
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

    def __init__(self, cfg, make_positional, *, vocab, shared=False):
        super().__init__()
        self.embedding = nn.Embedding(vocab, cfg.d_model)
        first = make_positional()
        shared = shared or not any(True for _ in first.parameters())
        self.blocks = nn.ModuleList(Block(cfg, first if shared or i == 0 else make_positional()) for i in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab)

    def forward(self, tokens, positions=None):
        """Next-token logits; ``positions [batch, seq]`` go to the first module's ``embed``
        (randomised RoPE's drawn positions, so that a prefix keeps its positions)."""
        x = self.blocks[0].positional.embed(self.embedding(tokens), positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def positions(self, batch, length, rng=None):
        """Positions drawn once for ``batch`` sequences of ``length`` tokens (randomised RoPE;
        from ``rng``, by default the module's own generator, which training draws from), else
        ``None`` (the modules' own ``arange``)."""
        first = self.blocks[0].positional
        if isinstance(first, RandomizedRoPE):
            return pe.randomized_positions(length, first.max_length, rng=first.rng if rng is None else rng, batch=batch, xp=torch)
        return None

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


def _answers(model, task, rng, batch, n, positions_rng=None):
    """``(logits, targets)`` of the answer tokens, ``[batch, answer, vocab]`` and ``[batch, answer]``;
    randomised positions drawn from ``positions_rng`` (by default the module's generator)."""
    sequences, prompt = _tasks.TASKS[task](rng, batch, n)
    sequences = torch.from_numpy(np.ascontiguousarray(sequences))
    inputs = sequences[:, :-1]
    logits = model(inputs, model.positions(batch, inputs.shape[1], positions_rng))
    return logits[:, prompt - 1 :], sequences[:, prompt:]


def fit(model, lr, steps, loss):
    """``model`` after ``steps`` AdamW steps on ``loss()`` (a fresh batch's mean loss per call):
    learning rate ``lr`` after 50 steps of linear warm-up, cosine decay, gradients clipped at 1."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    for _ in range(steps):
        value = loss()
        opt.zero_grad()
        value.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
    return model


def new_model(name, cfg, *, vocab, train_len, train_seq, max_seq, hp, seed, init):
    """A fresh :class:`Decoder` with ``name``'s positional modules, initialised from the seed ``init``."""
    torch.manual_seed(init)
    return Decoder(cfg, lambda: _positional(name, cfg, train_len, train_seq, max_seq, hp, seed), vocab=vocab, shared=name == "t5")


def train(name, task, seed, cfg, train_len, lr, hp, max_seq):
    """A model trained on ``task`` at learning rate ``lr`` with ``n ~ U{ceil(cfg.shortest *
    train_len) .. train_len}`` items per step (:func:`fit`, loss on the answer tokens)."""
    train_seq = _tasks.seq_len(task, train_len)
    model = new_model(name, cfg, vocab=_tasks.VOCAB, train_len=train_len, train_seq=train_seq, max_seq=max_seq, hp=hp, seed=seed,
                      init=_seed_of("init", name, task, seed))  # fmt: skip
    rng = np.random.default_rng(_seed_of("data", task, seed))

    def loss():
        n = int(rng.integers(max(1, math.ceil(cfg.shortest * train_len)), train_len + 1))
        logits, targets = _answers(model, task, rng, cfg.batch, n)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return fit(model, lr, cfg.steps, loss)


@torch.no_grad()
def evaluate(model, task, seed, n, sequences, *, split="test"):
    """``{"exact_match", "token_accuracy", "loss", "matches"}`` on ``sequences`` fresh
    sequences of ``n`` items (``split`` names their random stream: ``"valid"`` for the
    learning-rate choice, ``"test"`` for the records); ``matches``: one ``"1"``/``"0"`` per
    sequence, whether greedy decoding wrote its whole answer right. Randomised positions come
    from a generator of the split, task, seed and length too, so no evaluation depends on
    which ran before it (the learning-rate sweep's validation, other lengths)."""
    model.eval()
    rng = np.random.default_rng(_seed_of(split, task, seed, n))
    positions_rng = np.random.default_rng(_seed_of("positions", split, task, seed, n))
    loss, hits, tokens, matches = 0.0, 0, 0, []
    for start in range(0, sequences, 32):
        logits, targets = _answers(model, task, rng, min(32, sequences - start), n, positions_rng)
        right = logits.argmax(-1) == targets
        loss += float(nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
        hits, tokens = hits + int(right.sum()), tokens + right.numel()
        matches += right.all(-1).tolist()
    return {
        "exact_match": sum(matches) / len(matches),
        "token_accuracy": hits / tokens,
        "loss": loss / tokens,
        "matches": "".join("1" if m else "0" for m in matches),
    }


def for_length(model, name, head_dim, train_seq, need):
    """The model ``name`` is evaluated as at ``need`` tokens: ``model`` itself, a copy with a
    learned table extended past its trained rows (``hierarchical_extend``), or the trained
    ``rope`` model with a test-time scaling from ``train_seq`` to ``need`` tokens."""
    if name in TEST_TIME_SCALINGS:
        return model.replace_positional(lambda: _test_time_rope(name, head_dim, train_seq, need))
    if name != "learned":
        return model
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


def lens_name(eval_lens):
    """How a refusal names ``eval_lens``: as given, or as the default multiples of train_len."""
    return "eval_lens" if eval_lens is not None else f"eval_lens (train_len x {', '.join(map(str, FACTORS))})"


def check_arguments(encodings=None, tasks=None, seeds=SEEDS, train_len=TRAIN_LEN, eval_lens=None, hparams=None, config=None):
    """Validated ``(encodings, tasks, seeds, train_len, eval_lens, overrides)``; raises a
    ValueError naming the argument before any training. ``hparams``: ``["fire.L=8", ...]``
    (:func:`posenc.torch._hparams.parse`)."""
    encodings = _names(encodings, ENCODINGS, "encoding")
    tasks = _names(tasks, TASKS, "task")
    at_most("seeds", positive_int("seeds", seeds), MAX_SEEDS)
    positive_int("train_len", train_len)
    lens = lens_name(eval_lens)
    eval_lens = [train_len * f for f in FACTORS] if eval_lens is None else list(eval_lens)
    if not eval_lens:
        raise ValueError("eval_lens must name at least one length")
    for n in eval_lens:
        positive_int("eval_lens", n)
        if n < train_len:
            raise ValueError(f"eval_lens must be >= train_len = {train_len} (this measures extrapolation), got {n}")
    for task in tasks:
        most = _tasks.max_items(task)
        if most is not None and max(eval_lens) > most:
            raise ValueError(f"{lens} must be <= {most} for task {task!r} (its items are distinct symbols), got {max(eval_lens)}")
        most = _tasks.items_within(task, MAX_INPUT)
        if max(eval_lens) > most:
            raise ValueError(f"{lens} must be <= {most} for task {task!r} (inputs of at most {MAX_INPUT} tokens), got {max(eval_lens)}")
    overrides = _hparams.parse(hparams)
    longest = max(_tasks.seq_len(task, max(eval_lens)) for task in tasks)
    if overrides.get("randomized", {}).get("M", longest) < longest:
        raise ValueError(f"--hparam randomized.M must be >= {longest}, the longest test input (tokens), got {overrides['randomized']['M']}")
    cfg = Config() if config is None else config
    at_most("steps", positive_int("steps", cfg.steps), MAX_STEPS)
    if not cfg.lrs or any(isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf for lr in cfg.lrs):
        raise ValueError(f"learning rates must be positive numbers, got {cfg.lrs!r}")
    return encodings, tasks, seeds, train_len, sorted(set(eval_lens)), overrides


def at_most(name, value, most):
    """``value``, else a ValueError naming ``name`` when it is above ``most``."""
    if value > most:
        raise ValueError(f"{name} must be at most {most:,}, got {value:,}")
    return value


class Progress:
    """A progress bar on stderr (nothing when not ``enabled``)."""

    def __init__(self, total, enabled):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def step(self, label):
        self.done += 1
        if self.enabled:
            width = 24
            filled = width * self.done // self.total
            elapsed = time.perf_counter() - self.start
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:6.0f}s  {label:<40}", end="", file=sys.stderr, flush=True)
            if self.done == self.total:
                print(file=sys.stderr, flush=True)


def _job(name, evaluated, task, seed, lr, cfg, train_len, eval_lens, hp, validate):
    """Train ``name`` once at ``lr`` and evaluate it as each of ``evaluated`` (``rope`` and its
    test-time scalings share one training); returns ``(validation, records)``, the validation
    (in distribution, sequences of their own) when ``validate`` (the sweep), else ``None``."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    trained = train(name, task, seed, cfg, train_len, lr, hp, _tasks.seq_len(task, max(eval_lens)))
    valid = evaluate(trained, task, seed, train_len, cfg.valid_sequences, split="valid") if validate else None
    records = []
    train_seq, head_dim = _tasks.seq_len(task, train_len), cfg.d_model // cfg.heads
    for encoding in evaluated:
        for n in eval_lens:
            model = for_length(trained, encoding, head_dim, train_seq, _tasks.seq_len(task, n))
            found = evaluate(model, task, seed, n, cfg.eval_sequences)
            records.append({"task": task, "encoding": encoding, "seed": seed, "train_len": train_len, "eval_len": n, "lr": lr, **found})
    return valid, records


def execute(function, jobs, workers, bar, label):
    """``[function(*job) for job in jobs]``, on ``workers`` processes when more than one;
    ``bar`` (:class:`Progress`) steps with ``label(job)`` as each ends."""
    if workers == 1 or not jobs:
        done = []
        for job in jobs:
            done.append(function(*job))
            bar.step(label(job))
        return done
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(function, *job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            future.result()
            bar.step(label(futures[future]))
        return [future.result() for future in futures]


def _groups(encodings):
    """``{trained name: [names evaluated from that training]}`` (``rope`` serves its scalings)."""
    shared = {}
    for name in encodings:
        shared.setdefault("rope" if name in TEST_TIME_SCALINGS else name, []).append(name)
    return shared


def _settings(task, train_len, eval_lens, overrides):
    return _hparams.resolve(_tasks.seq_len(task, train_len), _tasks.seq_len(task, max(eval_lens)), overrides)


def _sweep_rows(jobs, done):
    """The learning-rate sweep as rows and the rate chosen per trained name: the best seed-0
    validation exact match, then token accuracy, then the lower loss (first rate on a tie)."""
    rows, best = [], {}
    for job, (valid, _) in zip(jobs, done):
        name, _, task, _, lr = job[:5]
        key = (valid["exact_match"], valid["token_accuracy"], -valid["loss"])
        if name not in best or key > best[name][0]:
            best[name] = (key, lr)
        rows.append({"task": task, "encoding": name, "lr": lr, **{f"valid_{k}": v for k, v in valid.items() if k != "matches"}})
    chosen = {name: lr for name, (_, lr) in best.items()}
    for row in rows:
        row["chosen"] = chosen[row["encoding"]] == row["lr"]
    return rows, chosen


def sweep_task(tasks):
    """The task the learning rate is chosen on: ``reverse`` when run, else the first task."""
    return "reverse" if "reverse" in tasks else tasks[0]


def _train_and_evaluate(encodings, tasks, seeds, train_len, eval_lens, overrides, cfg, workers, progress):
    """``(records, sweep rows)``: the learning-rate sweep on seed 0 of :func:`sweep_task`, then
    every (task, seed) at the rate chosen for the encoding (the sweep's training at that rate
    reused)."""
    groups = _groups(encodings)
    hp = {task: _settings(task, train_len, eval_lens, overrides) for task in tasks}

    def job(name, task, seed, lr, validate=False):
        return (name, groups[name], task, seed, lr, cfg, train_len, eval_lens, hp[task], validate)

    def label(job):
        return f"{job[2]} {job[0]} seed {job[3]} lr {job[4]:g}"

    swept = sweep_task(tasks) if len(cfg.lrs) > 1 else None
    first = [job(name, swept, 0, lr, validate=True) for name in groups for lr in cfg.lrs] if swept else []
    pending = [(task, seed) for task in tasks for seed in range(seeds) if (task, seed) != (swept, 0)]
    bar = Progress(len(first) + len(pending) * len(groups), progress)
    done = execute(_job, first, workers, bar, label)
    rows, chosen = _sweep_rows(first, done) if swept else ([], dict.fromkeys(groups, cfg.lrs[0]))
    records = [r for j, (_, found) in zip(first, done) if chosen[j[0]] == j[4] for r in found]
    later = [job(name, task, seed, chosen[name]) for task, seed in pending for name in groups]
    records += [r for _, found in execute(_job, later, workers, bar, label) for r in found]
    return records, rows


def grid(encodings, tasks, seeds, quick, config):
    """``(encodings, tasks, seeds, config)`` with the defaults of the default grid or, when
    ``quick``, of the small one filled in where ``None``."""
    if quick:
        return (
            QUICK_ENCODINGS if encodings is None else encodings,
            QUICK_TASKS if tasks is None else tasks,
            QUICK_SEEDS if seeds is None else seeds,
            QUICK if config is None else config,
        )
    return encodings, DEFAULT_TASKS if tasks is None else tasks, SEEDS if seeds is None else seeds, Config() if config is None else config


def results(*, encodings=None, tasks=None, seeds=None, quick=False, progress=True, train_len=TRAIN_LEN, eval_lens=None, hparams=None, config=None, workers=None):
    """Train and evaluate every (encoding, task, seed); returns what ``results.json`` holds.

    Parameters
    ----------
    encodings, tasks : names (a list, or a comma-separated string) out of :data:`ENCODINGS` /
        :data:`TASKS`, default all encodings and :data:`DEFAULT_TASKS` (``quick``:
        :data:`QUICK_ENCODINGS` / :data:`QUICK_TASKS`)
    seeds : int >= 1, seeds ``0 .. seeds - 1`` (default :data:`SEEDS`, ``quick``: :data:`QUICK_SEEDS`)
    quick : bool, the small grid: fewer encodings, one task, 3 seeds, one learning rate
        (:data:`QUICK`), unless ``encodings`` / ``tasks`` / ``config`` are given
    progress : bool, a progress bar on stderr
    train_len : int >= 1, items per training sequence (at most; each step draws from
        ``ceil(config.shortest * train_len) .. train_len``)
    eval_lens : item counts to evaluate at, each ``>= train_len`` (default ``train_len`` x 1, 2, 4, 8)
    hparams : ``["fire.L=8", ...]``, values in place of the scaling rule's (:mod:`posenc.torch._hparams`)
    config : :class:`Config`, model and training sizes and the learning rates swept
    workers : processes training in parallel (default: 2, or 1 on a one-core machine);
        every training runs on one thread with deterministic torch, so the records do not
        depend on ``workers``

    Returns
    -------
    dict
        ``{"config", "versions", "commit", "cpu", "seeds", "sweep", "records"}``: every option
        (the validated arguments, :class:`Config`'s fields and each task's hyperparameters),
        the Python and package versions, the posenc source's git commit (``+changes`` when it
        differs), the CPU (:mod:`posenc.torch._provenance`), the seeds, the learning-rate
        sweep (seed 0's validation per rate, ``chosen``) and the records, each ``{"task",
        "encoding", "seed", "train_len", "eval_len", "lr", "exact_match", "token_accuracy",
        "loss", "matches"}`` (:func:`evaluate`), ordered by task, encoding, seed and length.
        Nothing depends on the clock or the load: the same call on the same machine returns
        the same document.
    """
    from . import _provenance

    encodings, tasks, seeds, cfg = grid(encodings, tasks, seeds, quick, config)
    encodings, tasks, seeds, train_len, eval_lens, overrides = check_arguments(encodings, tasks, seeds, train_len, eval_lens, hparams, cfg)
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    positive_int("workers", workers)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        records, sweep = _train_and_evaluate(encodings, tasks, seeds, train_len, eval_lens, overrides, cfg, workers, progress)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    order = {name: i for i, name in enumerate(encodings)}
    records.sort(key=lambda r: (tasks.index(r["task"]), order[r["encoding"]], r["seed"], r["eval_len"]))
    options = {"encodings": encodings, "tasks": tasks, "quick": quick, "train_len": train_len, "eval_lens": eval_lens, **dataclasses.asdict(cfg)}
    options["hparams"] = {task: _settings(task, train_len, eval_lens, overrides) for task in tasks}
    options["hparam_overrides"] = overrides
    return {
        "config": options,
        "versions": _provenance.versions(),
        "commit": _provenance.commit(),
        "cpu": _provenance.cpu(),
        "seeds": list(range(seeds)),
        "sweep": sweep,
        "records": records,
    }


def run(*, encodings=None, tasks=None, seeds=1, quick=False, progress=True, **options):
    """The records of :func:`posenc.torch.extrapolation.results` alone, with its keyword
    arguments (``options``: ``train_len``, ``eval_lens``, ``hparams``, ``config``,
    ``workers``), except that ``seeds`` defaults to 1 (seed 0 alone, quick or not)."""
    return results(encodings=encodings, tasks=tasks, seeds=seeds, quick=quick, progress=progress, **options)["records"]
