"""posenc.torch.extrapolation and ``posenc extrapolate``: end to end on a tiny grid, determinism, bad input."""

from __future__ import annotations

import functools
import json
import os
import sys

import numpy as np
import pytest
import torch

from posenc import cli
from posenc.torch import _report, _tasks, extrapolation as ex

TINY = ex.Config(d_model=16, heads=2, layers=1, steps=3, batch=4, eval_sequences=4)


def tiny_run(**kwargs):
    options = {"train_len": 2, "eval_lens": [2, 4], "progress": False, "config": TINY, "workers": 1}
    return ex.run(**{**options, **kwargs})


def test_every_encoding_trains_and_is_evaluated_at_every_length():
    records = tiny_run(tasks=["copy"])
    assert {r["encoding"] for r in records} == set(ex.ENCODINGS)
    assert len(records) == len(ex.ENCODINGS) * 2
    for r in records:
        assert set(r) == {"task", "encoding", "seed", "train_len", "eval_len", "accuracy", "loss"}
        assert 0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["loss"]) and r["train_len"] == 2


def test_records_are_bit_identical_on_a_rerun_and_with_two_workers():
    first = tiny_run(encodings="alibi,rope,rope+yarn,randomized,learned", tasks="reverse", seeds=2)
    again = tiny_run(encodings="alibi,rope,rope+yarn,randomized,learned", tasks="reverse", seeds=2)
    assert json.dumps(first) == json.dumps(again)
    parallel = tiny_run(encodings="alibi,rope,rope+yarn,randomized,learned", tasks="reverse", seeds=2, workers=2)
    assert json.dumps(first) == json.dumps(parallel)
    assert torch.get_num_threads() >= 1 and not torch.are_deterministic_algorithms_enabled()


def test_the_model_learns_copy_at_the_default_size():
    records = ex.run(encodings=["learned"], tasks=["copy"], eval_lens=[8], progress=False, workers=1)
    assert records[0]["accuracy"] > 0.8


def test_tasks_mark_the_answers():
    rng = np.random.default_rng(0)
    inputs, targets, answer = _tasks.reverse(rng, 2, 3)
    assert inputs.shape == targets.shape == answer.shape == (2, 6)
    assert (inputs[:, 3] == _tasks.SEP).all()
    np.testing.assert_array_equal(targets[:, 3:], inputs[:, 2::-1])
    assert answer[0].tolist() == [False, False, False, True, True, True]
    inputs, targets, answer = _tasks.copy(rng, 1, 4)
    np.testing.assert_array_equal(targets[0, 4:], inputs[0, :4])
    assert len(set(inputs[0, :4].tolist())) == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"encodings": ["rope", "nope"]}, "unknown encoding 'nope'; valid encodings: none, learned"),
        ({"encodings": "alibi,typo"}, "rope\\+yarn"),
        ({"tasks": ["sort"]}, "unknown task 'sort'; valid tasks: copy, reverse"),
        ({"seeds": 0}, "seeds"),
        ({"train_len": 0}, "train_len"),
        ({"eval_lens": [8, 4]}, "eval_lens must be >= train_len = 8"),
        ({"eval_lens": [8, -1]}, "positive"),
        ({"eval_lens": [8, 1000]}, "eval_lens must be <= 64"),
    ],
)
def test_bad_arguments_are_refused_before_training(kwargs, match, monkeypatch):
    monkeypatch.setattr(ex, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    with pytest.raises(ValueError, match=match):
        ex.run(progress=False, **kwargs)


def test_the_command_writes_json_markdown_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ex, "results", functools.partial(ex.results, config=TINY, workers=1))
    out = tmp_path / "out"
    argv = ["extrapolate", "--encodings", "none,alibi", "--tasks", "copy", "--train-len", "2", "--eval-lens", "2,4", "--seeds", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    document = json.loads((out / "results.json").read_text())
    assert set(document) == {"config", "versions", "commit", "cpu", "seeds", "records"}
    records = document["records"]
    assert len(records) == 2 * 2 * 2 and {r["seed"] for r in records} == {0, 1} and document["seeds"] == [0, 1]
    assert document["config"]["encodings"] == ["none", "alibi"] and document["config"]["steps"] == TINY.steps
    assert document["versions"]["torch"] == torch.__version__ and document["cpu"]["cores"] >= 1
    md = (out / "results.md").read_text()
    assert "posenc extrapolate --encodings none,alibi --tasks copy --seeds 2 --train-len 2 --eval-lens 2,4 --out" in md
    assert "| encoding | **2** (train) | 4 (2x) |" in md and "### copy" in md
    assert "did not reach" in md.lower() or "✗" not in md
    assert (out / "extrapolation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = (out / "results.json").read_bytes()
    assert cli.main(argv) == 0
    assert (out / "results.json").read_bytes() == first
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert (out / "results.json").stat().st_mode & 0o044  # readable by others, as open() would make it
    assert "records in" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--encodings", "rope,bogus"], "unknown encoding 'bogus'"),
        (["--tasks", "bogus"], "valid tasks: copy, reverse"),
        (["--train-len", "0"], "train_len must be a positive integer"),
        (["--eval-lens", "4,2", "--train-len", "4"], "eval_lens must be >= train_len"),
        (["--eval-lens", "4,x"], "--eval-lens must be comma-separated integers"),
        (["--seeds", "-1"], "seeds must be a positive integer"),
    ],
)
def test_the_command_refuses_bad_input(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ex, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    assert cli.main(["extrapolate", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_matplotlib_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ex, "train", lambda *a, **k: pytest.fail("trained without matplotlib"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["extrapolate", "--quick", "--out", str(tmp_path)]) == 3
    assert "needs PyTorch and matplotlib" in capsys.readouterr().err


def test_the_command_refuses_an_out_it_cannot_write(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ex, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))

    def refused(path, *args, **kwargs):  # what a read-only directory does (root would write anyway)
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "makedirs", refused)
    assert cli.main(["extrapolate", "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot write to" in err and "Permission denied" in err


def test_the_command_refuses_an_out_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "results"
    path.write_text("")
    assert cli.main(["extrapolate", "--quick", "--out", str(path)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_an_unlearned_task_is_reported():
    records = [
        {"task": "copy", "encoding": "rope", "seed": 0, "train_len": 4, "eval_len": n, "accuracy": a, "loss": 1.0}
        for n, a in ((4, 0.5), (8, 0.1))
    ]
    assert _report.unlearned(records) == [("copy", "rope", 0.5)]
    md = _report.markdown(records)
    assert "| rope ✗ | **0.50** | 0.10 |" in md and "- copy / rope: 0.50" in md


def test_an_interrupted_write_leaves_no_partial_json(tmp_path, monkeypatch):
    (tmp_path / "results.json").write_text("old")

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dumps", broken)
    with pytest.raises(KeyboardInterrupt):
        _report.write([], str(tmp_path))
    assert (tmp_path / "results.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
