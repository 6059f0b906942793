"""posenc.torch.lm and ``posenc extrapolate --lm``: the corpus split, the evaluation's windows,
a tiny run end to end, bad input."""

from __future__ import annotations

import functools
import hashlib
import json
import math

import numpy as np
import pytest
import torch

from posenc import cli
from posenc.torch import _report, lm

TINY = lm.Config(d_model=16, heads=2, layers=1, steps=3, batch=4, spans=2)


def test_the_corpus_is_split_by_file_the_same_way_every_time():
    train, test, about = lm.corpus()
    assert train.dtype == np.uint8 and about["train_bytes"] == train.size and about["test_bytes"] == test.size > 0
    assert 0.02 < test.size / (train.size + test.size) < 0.3  # (bytes: which files fall in the test share varies by Python version)
    assert 0.05 < about["test_files"] / (about["train_files"] + about["test_files"]) < 0.2
    assert about["sha256"] == hashlib.sha256(train.tobytes() + test.tobytes()).hexdigest()
    assert lm._is_test("json/decoder.py") == (hashlib.sha256(b"json/decoder.py").digest()[0] < 26)
    assert b"def " in test.tobytes()[:100000]


class Unigram(torch.nn.Module):
    """A 'language model' whose logits are fixed log-probabilities, whatever the context."""

    def __init__(self, probabilities):
        super().__init__()
        self.log_p = torch.log(torch.as_tensor(probabilities))

    def forward(self, tokens, positions=None):
        return self.log_p.expand(*tokens.shape, 256)

    def positions(self, batch, length, rng=None):
        return None


def test_every_length_scores_the_same_test_bytes():
    test = lm.corpus()[1]
    p = np.random.default_rng(0).random(256) + 0.01
    p /= p.sum()
    spans, longest = 3, 64
    first = np.linspace(0, test.size - longest - 1, spans).astype(np.int64)
    scored = np.concatenate([test[f + 1 : f + 1 + longest] for f in first])
    want = float(-np.log(p[scored]).mean())
    for n in (8, 16, 64):
        loss, perplexity = lm.evaluate(Unigram(p), n, spans, longest)
        assert loss == pytest.approx(want, rel=1e-6) and perplexity == pytest.approx(math.exp(want), rel=1e-6)


def test_a_tiny_run_is_deterministic():
    options = {"encodings": "none,rope,rope+yarn,randomized,learned", "train_len": 8, "eval_lens": [8, 16], "config": TINY, "progress": False}
    first = lm.results(**options, workers=1)
    assert json.dumps(first) == json.dumps(lm.results(**options, workers=1))
    assert first["corpus"] == lm.corpus()[2] and first["config"]["hparams"]["randomized"]["M"] == 16
    records = first["records"]
    assert len(records) == 5 * 2 and {r["encoding"] for r in records} == {"none", "rope", "rope+yarn", "randomized", "learned"}
    for r in records:
        assert set(r) == {"encoding", "seed", "train_len", "eval_len", "loss", "perplexity"} and r["perplexity"] == pytest.approx(math.exp(r["loss"]))
    md = _report.lm_markdown(first)
    assert "| encoding | **8** (train) | 16 (2x) |" in md and "| rope+yarn |" in md


def test_the_command_writes_the_lm_files(tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "results", functools.partial(lm.results, config=TINY, workers=1))
    out = tmp_path / "out"
    assert cli.main(["extrapolate", "--lm", "--encodings", "alibi,kerple", "--train-len", "8", "--eval-lens", "8,32", "--out", str(out)]) == 0
    document = json.loads((out / "lm_results.json").read_text())
    assert set(document) == {"config", "corpus", "versions", "commit", "cpu", "seeds", "records"} and len(document["records"]) == 4
    assert "posenc extrapolate --lm --encodings alibi,kerple" in (out / "lm_results.md").read_text()
    assert (out / "lm_perplexity.png").read_bytes()[:4] == b"\x89PNG"


def test_a_machine_without_the_standard_librarys_source_is_told_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lm, "train", lambda *a, **k: pytest.fail("trained without a corpus"))
    empty = np.zeros(0, dtype=np.uint8)
    monkeypatch.setattr(lm, "corpus", lambda: (empty, empty, {}))
    assert cli.main(["extrapolate", "--lm", "--out", str(tmp_path)]) == 2
    assert "--lm needs the Python standard library's .py files, found 0 training and 0 test bytes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-lens", "64,3000000"], "eval_lens must be <= 999 bytes for --lm (the test text is 1000 bytes), got 3000000"),
        (["--train-len", "200"], "eval_lens (train_len x 1, 2, 4, 8) must be <= 999 bytes for --lm (the test text is 1000 bytes), got 1600"),
        (["--train-len", "600", "--eval-lens", "600"], "train_len must be <= 499 bytes for --lm (the training text is 500 bytes), got 600"),
    ],
)
def test_lengths_past_the_text_are_refused_with_the_largest_allowed(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lm, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    monkeypatch.setattr(lm, "corpus", lambda: (np.zeros(500, dtype=np.uint8), np.zeros(1000, dtype=np.uint8), {}))
    assert cli.main(["extrapolate", "--lm", *argv, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"posenc extrapolate: {message}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "copy"], "--tasks does not apply to --lm"),
        (["--lrs", "0.01"], "--lrs does not apply to --lm"),
        (["--encodings", "bogus"], "unknown encoding 'bogus'"),
        (["--eval-lens", "32"], "eval_lens must be >= train_len = 64"),
        (["--hparam", "randomized.M=100"], "randomized.M must be >= 512"),
    ],
)
def test_the_lm_command_refuses_bad_input(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lm, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    assert cli.main(["extrapolate", "--lm", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_randomised_positions_of_an_evaluation_length_do_not_depend_on_the_lengths_before_it():
    """Each length draws randomised RoPE's positions from a generator of its own (the module's,
    shared across lengths, had made a length's perplexity depend on which ran before it)."""
    from posenc.torch import _hparams, extrapolation as ex

    hp = _hparams.resolve(16, 32, {})
    model = ex.new_model("randomized", TINY, vocab=lm.VOCAB, train_len=16, train_seq=16, max_seq=32, hp=hp, seed=0, init=0)
    alone = lm.evaluate(model, 16, 1, 32)  # (16 of the 32 positions drawn: 32 of 32 would be arange)
    lm.evaluate(model, 8, 1, 32)
    assert lm.evaluate(model, 16, 1, 32) == alone
