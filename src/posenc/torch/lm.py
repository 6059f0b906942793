"""Perplexity against length: a small byte-level language model per encoding, trained at one
length and evaluated at longer ones (``posenc extrapolate --lm``).

The claims of ALiBi (Press et al. 2022), KERPLE (Chi et al. 2022), FIRE (Li et al. 2024) and
Sandwich (Chi et al. 2023) are about language-model perplexity past the training length. The
corpus is one every machine with Python has offline: the standard library's own ``.py`` files
(the running interpreter's, without its test suites and site-packages), split by file into
train and test by a hash of the file's path (:data:`TEST_SHARE` of the files to test), so the
split is the same on every machine with that Python version; the results record the version,
the file and byte counts and a digest of the text.

Training draws windows of ``train_len`` bytes at random places of the training text. Evaluation
is Press et al.'s non-overlapping one: ``Config.spans`` stretches of ``max(eval_lens)`` bytes at
evenly spaced places of the test text, each cut into windows of ``n`` bytes for every
evaluation length ``n``, so every length scores the same bytes and only the context a byte
sees changes. Perplexity is ``exp`` of the mean cross-entropy per byte.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import pathlib
import platform
import sysconfig

import numpy as np
import torch
from torch import nn

from . import _hparams, extrapolation as ex
from ._protocol import positive_int

TEST_SHARE = 0.1
VOCAB = 256
TRAIN_LEN = 64
QUICK_ENCODINGS = ("none", "learned", "sinusoidal", "t5", "alibi", "rope", "xpos", "fire", "kerple", "sandwich", "cope", "rope+yarn")
_SKIPPED = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class Config(ex.Shape):
    """The language model's sizes: the task model's shape with 2 layers, ``steps`` AdamW steps
    of ``batch`` windows at learning rate ``lr`` (one rate for every encoding: no sweep),
    ``spans`` test stretches of the longest evaluation length."""

    layers: int = 2
    steps: int = 2000
    batch: int = 32
    lr: float = 3e-3
    spans: int = 16


QUICK = Config(steps=300, spans=8)


def _is_test(relative):
    return hashlib.sha256(relative.encode()).digest()[0] < round(256 * TEST_SHARE)


@functools.lru_cache(maxsize=1)
def corpus():
    """``(train, test, about)``: the training and test text as ``uint8`` arrays (files joined
    in path order) and ``about`` (Python version, file and byte counts, sha256 of the text)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIPPED & set(p.relative_to(root).parts))
    parts = {False: [], True: []}
    for path in files:
        parts[_is_test(path.relative_to(root).as_posix())].append(path.read_bytes())
    train, test = (np.frombuffer(b"".join(parts[side]), dtype=np.uint8) for side in (False, True))
    digest = hashlib.sha256(train.tobytes() + test.tobytes()).hexdigest()
    about = {"python": platform.python_version(), "train_files": len(parts[False]), "test_files": len(parts[True]),
             "train_bytes": int(train.size), "test_bytes": int(test.size), "sha256": digest}  # fmt: skip
    return train, test, about


def _windows(text, starts, length):
    """``(inputs, targets)`` ``int64 [len(starts), length]``: ``text[s : s + length]`` and the byte after each."""
    index = np.asarray(starts)[:, None] + np.arange(length + 1)
    chunk = torch.from_numpy(text[index].astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def train(name, seed, cfg, train_len, max_len, hp):
    """A byte-level language model with ``name``'s encoding, trained on ``train_len``-byte windows."""
    text = corpus()[0]
    model = ex.new_model(name, cfg, vocab=VOCAB, train_len=train_len, train_seq=train_len, max_seq=max_len, hp=hp, seed=seed,
                         init=ex._seed_of("lm-init", name, seed))  # fmt: skip
    rng = np.random.default_rng(ex._seed_of("lm-data", seed))

    def loss():
        inputs, targets = _windows(text, rng.integers(0, text.size - train_len, cfg.batch), train_len)
        logits = model(inputs, model.positions(cfg.batch, train_len))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return ex.fit(model, cfg.lr, cfg.steps, loss)


@torch.no_grad()
def evaluate(model, n, spans, max_len):
    """``(loss, perplexity)`` per byte over ``spans`` test stretches of ``max_len`` bytes cut into ``n``-byte windows."""
    model.eval()
    text = corpus()[1]
    first = np.linspace(0, text.size - max_len - 1, spans).astype(np.int64)
    starts = (first[:, None] + np.arange(0, max_len - n + 1, n)).ravel()
    total, count = 0.0, 0
    positions_rng = np.random.default_rng(ex._seed_of("lm-positions", n))  # (not the module's: lengths do not depend on each other)
    for block in np.array_split(starts, max(1, len(starts) * n // 4096)):
        inputs, targets = _windows(text, block, n)
        logits = model(inputs, model.positions(len(block), n, positions_rng))
        total += float(nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
        count += targets.numel()
    loss = total / count
    return loss, math.exp(loss)


def _job(name, evaluated, seed, cfg, train_len, eval_lens, hp):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    trained = train(name, seed, cfg, train_len, max(eval_lens), hp)
    records = []
    for encoding in evaluated:
        for n in eval_lens:
            model = ex.for_length(trained, encoding, cfg.d_model // cfg.heads, train_len, n)
            loss, perplexity = evaluate(model, n, cfg.spans, max(eval_lens))
            records.append({"encoding": encoding, "seed": seed, "train_len": train_len, "eval_len": n, "loss": loss, "perplexity": perplexity})
    return records


def check_arguments(encodings=None, seeds=1, train_len=TRAIN_LEN, eval_lens=None, hparams=None):
    """Validated ``(encodings, seeds, train_len, eval_lens, overrides)``; a ValueError naming
    the argument before any training."""
    encodings = ex._names(encodings, ex.ENCODINGS, "encoding")
    ex.at_most("seeds", positive_int("seeds", seeds), ex.MAX_SEEDS)
    positive_int("train_len", train_len)
    lens = ex.lens_name(eval_lens)
    eval_lens = [train_len * f for f in ex.FACTORS] if eval_lens is None else list(eval_lens)
    if not eval_lens:
        raise ValueError("eval_lens must name at least one length")
    for n in eval_lens:
        positive_int("eval_lens", n)
        if n < train_len:
            raise ValueError(f"eval_lens must be >= train_len = {train_len} (this measures extrapolation), got {n}")
    overrides = _hparams.parse(hparams)
    if overrides.get("randomized", {}).get("M", max(eval_lens)) < max(eval_lens):
        raise ValueError(f"--hparam randomized.M must be >= {max(eval_lens)}, the longest test input (bytes), got {overrides['randomized']['M']}")
    train, test, _ = corpus()
    if min(train.size, test.size) < 2:  # not one window of one byte and the byte after it
        root = sysconfig.get_paths()["stdlib"]
        raise ValueError(f"--lm needs the Python standard library's .py files, found {train.size} training and {test.size} test bytes under {root}")
    # a window is followed by the byte it predicts last
    if max(eval_lens) > test.size - 1:
        raise ValueError(f"{lens} must be <= {test.size - 1} bytes for --lm (the test text is {test.size} bytes), got {max(eval_lens)}")
    if max(eval_lens) > ex.MAX_INPUT:
        raise ValueError(f"{lens} must be <= {ex.MAX_INPUT} bytes for --lm (the evaluation's attention scores grow as its square), got {max(eval_lens)}")
    if train_len > train.size - 1:
        raise ValueError(f"train_len must be <= {train.size - 1} bytes for --lm (the training text is {train.size} bytes), got {train_len}")
    return encodings, seeds, train_len, sorted(set(eval_lens)), overrides


def results(*, encodings=None, seeds=1, quick=False, progress=True, train_len=TRAIN_LEN, eval_lens=None, hparams=None, config=None, workers=None):
    """Train one byte-level model per (encoding, seed) at ``train_len`` bytes, evaluate it at
    ``eval_lens`` (default 1x, 2x, 4x, 8x); returns what ``lm_results.json`` holds:
    ``{"config", "corpus", "versions", "commit", "cpu", "seeds", "records"}``, records
    ``{"encoding", "seed", "train_len", "eval_len", "loss", "perplexity"}``. ``quick``:
    :data:`QUICK_ENCODINGS` and :data:`QUICK` unless given. Deterministic as
    :func:`posenc.torch.extrapolation.results` is."""
    from . import _provenance

    if quick:
        encodings = QUICK_ENCODINGS if encodings is None else encodings
        config = QUICK if config is None else config
    cfg = Config() if config is None else config
    encodings, seeds, train_len, eval_lens, overrides = check_arguments(encodings, seeds, train_len, eval_lens, hparams)
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    positive_int("workers", workers)
    hp = _hparams.resolve(train_len, max(eval_lens), overrides)
    about = corpus()[2]
    jobs = [(name, evaluated, seed, cfg, train_len, eval_lens, hp) for seed in range(seeds) for name, evaluated in ex._groups(encodings).items()]
    bar = ex.Progress(len(jobs), progress)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        done = ex.execute(_job, jobs, workers, bar, lambda job: f"lm {job[0]} seed {job[2]}")
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    order = {name: i for i, name in enumerate(encodings)}
    records = sorted((r for found in done for r in found), key=lambda r: (order[r["encoding"]], r["seed"], r["eval_len"]))
    options = {"encodings": encodings, "quick": quick, "train_len": train_len, "eval_lens": eval_lens, **dataclasses.asdict(cfg),
               "hparams": hp, "hparam_overrides": overrides}  # fmt: skip
    return {"config": options, "corpus": about, "versions": _provenance.versions(), "commit": _provenance.commit(), "cpu": _provenance.cpu(),
            "seeds": list(range(seeds)), "records": records}  # fmt: skip
