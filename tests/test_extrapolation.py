"""posenc.torch.extrapolation and ``posenc extrapolate``: end to end on a tiny grid, determinism,
the tasks' generators, the scaled hyperparameters, the metrics and intervals, bad input."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import json
import os
import sys

import numpy as np
import pytest
import torch

from posenc import cli
from posenc.torch import _hparams, _report, _tasks, extrapolation as ex

TINY = ex.Config(d_model=16, heads=2, layers=1, steps=3, batch=4, eval_sequences=4, valid_sequences=4, lrs=(1e-3,))
KEYS = {"task", "encoding", "seed", "train_len", "eval_len", "lr", "exact_match", "token_accuracy", "loss", "matches"}


def tiny_results(**kwargs):
    options = {"train_len": 2, "eval_lens": [2, 4], "progress": False, "config": TINY, "workers": 1, "seeds": 1}
    return ex.results(**{**options, **kwargs})


def test_every_encoding_trains_and_is_evaluated_at_every_length():
    records = tiny_results(tasks=["copy"])["records"]
    assert {r["encoding"] for r in records} == set(ex.ENCODINGS)
    assert len(records) == len(ex.ENCODINGS) * 2
    for r in records:
        assert set(r) == KEYS and r["train_len"] == 2 and len(r["matches"]) == TINY.eval_sequences
        assert 0.0 <= r["exact_match"] <= r["token_accuracy"] <= 1.0 and np.isfinite(r["loss"])
        assert r["exact_match"] == r["matches"].count("1") / len(r["matches"])


def test_run_returns_the_records_of_one_seed_by_default():
    # (API.md: run(*, encodings=None, tasks=None, seeds=1, quick=False, progress=True) -> list[dict])
    parameters = inspect.signature(ex.run).parameters
    assert [(n, parameters[n].default) for n in ("encodings", "tasks", "seeds", "quick", "progress")] == [
        ("encodings", None), ("tasks", None), ("seeds", 1), ("quick", False), ("progress", True)
    ]
    options = {"encodings": ["alibi"], "tasks": ["copy"], "train_len": 2, "eval_lens": [2], "progress": False, "config": TINY, "workers": 1}
    records = ex.run(**options)
    assert records == ex.results(**options, seeds=1)["records"] and {r["seed"] for r in records} == {0}


def test_every_task_trains_on_the_smallest_grid():
    records = tiny_results(encodings=["alibi"], tasks=list(ex.TASKS), eval_lens=[2])["records"]
    assert [r["task"] for r in records] == list(ex.TASKS)


def test_records_are_bit_identical_on_a_rerun_and_with_two_workers():
    sweep = ex.Config(**{**TINY.__dict__, "lrs": (1e-3, 3e-2)})
    options = {"encodings": "alibi,rope,rope+yarn,randomized,learned", "tasks": "reverse", "seeds": 2, "config": sweep}
    first = tiny_results(**options)
    assert json.dumps(first) == json.dumps(tiny_results(**options, workers=2))  # a rerun, on two processes
    assert torch.get_num_threads() >= 1 and not torch.are_deterministic_algorithms_enabled()


def test_the_learning_rate_is_chosen_per_encoding_on_seed_0s_validation_and_used_everywhere():
    sweep = ex.Config(**{**TINY.__dict__, "lrs": (1e-4, 3e-2), "steps": 20})
    document = tiny_results(encodings="alibi,rope,rope+ntk", tasks="copy,reverse", seeds=2, config=sweep)
    rows = document["sweep"]
    assert {(r["task"], r["encoding"], r["lr"]) for r in rows} == {("reverse", e, lr) for e in ("alibi", "rope") for lr in sweep.lrs}
    for name in ("alibi", "rope"):
        mine = [r for r in rows if r["encoding"] == name]
        best = max(mine, key=lambda r: (r["valid_exact_match"], r["valid_token_accuracy"], -r["valid_loss"]))
        assert [r["lr"] for r in mine if r["chosen"]] == [best["lr"]]
        evaluated = ("rope", "rope+ntk") if name == "rope" else (name,)
        mine = [r for r in document["records"] if r["encoding"] in evaluated]
        assert {r["lr"] for r in mine} == {best["lr"]} and {(r["task"], r["seed"]) for r in mine} == {(t, s) for t in ("copy", "reverse") for s in (0, 1)}
    assert ex.sweep_task(["copy", "parity"]) == "copy"


@torch.no_grad()
def _free_running(model, sequences, prompt):
    """Greedy decoding one token at a time from the prompt, the model's own tokens fed back."""
    model.eval()
    written = sequences[:, :prompt]
    for _ in range(sequences.shape[1] - prompt):
        written = torch.cat([written, model(written)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return (written[:, prompt:] == sequences[:, prompt:]).all(-1)


def test_exact_match_is_that_of_free_running_greedy_decoding():
    small = ex.Config(d_model=32, heads=2, layers=2, steps=60, batch=32, lrs=(1e-2,))
    hp = _hparams.scaled(_tasks.seq_len("copy", 1), _tasks.seq_len("copy", 2))
    model = ex.train("alibi", "copy", 0, small, 1, 1e-2, hp, _tasks.seq_len("copy", 2))
    matched = ""
    for n in (1, 2):
        found = ex.evaluate(model, "copy", 0, n, 64)
        rng = np.random.default_rng(ex._seed_of("test", "copy", 0, n))
        decoded = []
        for _ in range(2):
            sequences, prompt = _tasks.copy(rng, 32, n)
            decoded += _free_running(model, torch.from_numpy(sequences), prompt).tolist()
        assert found["matches"] == "".join("1" if m else "0" for m in decoded)
        matched += found["matches"]
    assert "1" in matched and "0" in matched  # a model between right and wrong


# ---- the tasks -----------------------------------------------------------------------


def _prompt_and_answer(task, n, batch=16, seed=0):
    sequences, prompt = _tasks.TASKS[task](np.random.default_rng(seed), batch, n)
    assert sequences.dtype == np.int64 and sequences.shape == (batch, _tasks.seq_len(task, n) + 1)
    sep = prompt - (2 if task == "count" else 1)  # count's query follows its SEP
    assert (sequences[:, sep] == _tasks.SEP).all() and (sequences >= 0).all() and (sequences < _tasks.VOCAB).all()
    return [(row[:sep].tolist() + row[sep + 1 : prompt].tolist(), row[prompt:].tolist()) for row in sequences]


@pytest.mark.parametrize("n", [1, 5, 64])
def test_sequence_tasks_write_the_transformed_items(n):
    for task, answer_of in {
        "copy": lambda x: x, "reverse": lambda x: x[::-1], "duplicate": lambda x: x + x, "sort": sorted,
    }.items():  # fmt: skip
        for items, answer in _prompt_and_answer(task, n):
            assert len(items) == n == len(set(items)) and max(items) < _tasks.SYMBOLS
            assert answer == answer_of(items)
    for items, answer in _prompt_and_answer("bucket_sort", n):
        assert len(items) == n and set(items) <= set(range(_tasks.BUCKETS)) and answer == sorted(items)


@pytest.mark.parametrize("n", [1, 7, 40])
def test_parity_and_modular_arithmetic_answer_by_their_definitions(n):
    for bits, answer in _prompt_and_answer("parity", n):
        assert len(bits) == n and set(bits) <= {0, 1} and answer == [bits.count(1) % 2]
    for expression, answer in _prompt_and_answer("modular_arithmetic", n):
        text = "".join({_tasks.PLUS: "+", _tasks.MINUS: "-"}.get(t, str(t)) for t in expression)
        assert len(expression) == 2 * n - 1 and set(expression[0::2]) <= set(range(_tasks.MODULUS))
        assert answer == [eval(text) % _tasks.MODULUS]  # Python's own left-to-right + and -


@pytest.mark.parametrize("n", [1, 3, 8, 50])
def test_count_answers_how_often_the_query_occurs(n):
    counts = []
    for prompt, answer in _prompt_and_answer("count", n, batch=200):
        items, query = prompt[:-1], prompt[-1]
        assert len(items) == n and set(items) <= set(range(_tasks.COUNT_ALPHABET))
        assert answer == [items.count(query)]
        counts.append(answer[0])
    assert set(counts) == set(range(min(n, _tasks.MAX_COUNT) + 1))  # every count occurs, none above the cap


@pytest.mark.parametrize("task", ex.TASKS)
def test_input_lengths_are_those_of_the_generated_sequences(task):
    for n in range(1, _tasks.SYMBOLS + 1):
        sequences, _ = _tasks.TASKS[task](np.random.default_rng(0), 1, n)
        assert _tasks.seq_len(task, n) == sequences.shape[1] - 1
        assert _tasks.items_within(task, _tasks.seq_len(task, n)) == n


def test_tasks_are_reproducible_from_the_generator():
    for task in ex.TASKS:
        a, pa = _tasks.TASKS[task](np.random.default_rng(3), 4, 6)
        b, pb = _tasks.TASKS[task](np.random.default_rng(3), 4, 6)
        assert pa == pb and np.array_equal(a, b)


# ---- hyperparameters, intervals ------------------------------------------------------


def test_hyperparameters_scale_with_the_training_length():
    # the figures: FIRE's L = 512 at 2,048 tokens is 4 at 16; xPos's 512 at 1,024 is 8 at 16
    hp = _hparams.scaled(16, 128)
    assert hp["fire"]["L"] == 4 and hp["xpos"]["scale_base"] == 8 and hp["cope"]["P"] == 16 and hp["randomized"]["M"] == 128
    assert _hparams.scaled(512, 512)["sandwich"]["base"] == pytest.approx(10000.0)
    assert np.log(16) / np.log(hp["sandwich"]["base"]) == pytest.approx(np.log(512) / np.log(10000))
    assert _hparams.parse(["fire.L=8", "sandwich.dim=64", "fire.L=2"]) == {"fire": {"L": 2.0}, "sandwich": {"dim": 64}}
    assert _hparams.resolve(16, 128, {"fire": {"L": 2.0}})["fire"] == {"L": 2.0}


def test_hyperparameters_are_used_and_recorded():
    document = tiny_results(encodings="fire,xpos", tasks="copy", hparams=["xpos.scale_base=3"])
    hp = document["config"]["hparams"]["copy"]
    assert hp["fire"]["L"] == _tasks.seq_len("copy", 2) / 4 and hp["xpos"]["scale_base"] == 3.0
    assert document["config"]["hparam_overrides"] == {"xpos": {"scale_base": 3.0}}
    model = ex._positional("xpos", TINY, 2, 3, 7, hp, 0)
    assert model.scale_base == 3.0 and ex._positional("fire", TINY, 2, 3, 7, hp, 0).threshold == hp["fire"]["L"]


def test_bootstrap_interval():
    assert _report.interval(["1111", "1111"]) == (1.0, 1.0, 1.0)
    assert _report.interval(["1111" * 8, "0000" * 8, "1010" * 8]) == (0.5, 0.0, 1.0)  # 3 seeds: 1/27 of the draws are all one seed
    mean, low, high = _report.interval(["1111" * 8, "0000" * 8, "1010" * 8, "1100" * 8, "0110" * 8])
    assert mean == 0.5 and 0.0 < low < 0.5 < high < 1.0
    one_seed = _report.interval(["10" * 32])  # one seed: the sequences' sampling alone, about +-0.12
    assert one_seed[0] == 0.5 and 0.3 < one_seed[1] < 0.45 and 0.55 < one_seed[2] < 0.7
    assert _report.interval(["1100", "0110"]) == _report.interval(["1100", "0110"])


# ---- the command ---------------------------------------------------------------------


def test_the_command_writes_json_markdown_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ex, "results", functools.partial(ex.results, workers=1))
    monkeypatch.setattr(ex, "Config", functools.partial(dataclasses.replace, TINY))  # the default grid's config, tiny
    out = tmp_path / "out"
    argv = ["extrapolate", "--encodings", "none,alibi", "--tasks", "copy", "--train-len", "2", "--eval-lens", "2,4", "--seeds", "2",
            "--hparam", "fire.L=3", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    document = json.loads((out / "results.json").read_text())
    assert set(document) == {"config", "versions", "commit", "cpu", "seeds", "sweep", "records"}
    records = document["records"]
    assert len(records) == 2 * 2 * 2 and {r["seed"] for r in records} == {0, 1} and document["seeds"] == [0, 1]
    assert document["config"]["encodings"] == ["none", "alibi"] and document["config"]["steps"] == TINY.steps
    assert document["config"]["hparams"]["copy"]["fire"]["L"] == 3.0
    assert document["versions"]["torch"] == importlib.metadata.version("torch") and document["cpu"]["cores"] >= 1
    md = (out / "results.md").read_text()
    assert "posenc extrapolate --encodings none,alibi --tasks copy --seeds 2 --train-len 2 --eval-lens 2,4 --hparam fire.L=3 --out" in md
    assert "| encoding | lr | **2** (train) | 4 (2x) |" in md and "### copy" in md and "Exact match" in md and "Token accuracy" in md
    assert (out / "extrapolation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = (out / "results.json").read_bytes()
    assert cli.main(argv) == 0
    assert (out / "results.json").read_bytes() == first
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert (out / "results.json").stat().st_mode & 0o044  # readable by others, as open() would make it
    assert "s of CPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"encodings": ["rope", "nope"]}, "unknown encoding 'nope'; valid encodings: none, learned"),
        ({"encodings": "alibi,typo"}, "rope\\+yarn"),
        ({"tasks": ["sorting"]}, "unknown task 'sorting'; valid tasks: copy, reverse, duplicate, sort, bucket_sort, parity"),
        ({"seeds": 0}, "seeds"),
        ({"train_len": 0}, "train_len"),
        ({"eval_lens": [8, 4]}, "eval_lens must be >= train_len = 8"),
        ({"eval_lens": [8, -1]}, "positive"),
        ({"eval_lens": [8, 1000]}, "eval_lens must be <= 64 for task 'reverse'"),
        ({"tasks": "parity", "eval_lens": [8, 5000]}, "eval_lens must be <= 2047 for task 'parity' \\(inputs of at most 2048 tokens\\), got 5000"),
        ({"tasks": "modular_arithmetic", "train_len": 10**10}, "eval_lens \\(train_len x 1, 2, 4, 8\\) must be <= 1024 for task 'modular_arithmetic'"),
        ({"hparams": ["fire.threshold=3"]}, "ENCODING.NAME=VALUE with ENCODING.NAME one of fire.L"),
        ({"hparams": ["sandwich.dim=7"]}, "sandwich.dim must be an even positive integer"),
        ({"hparams": ["randomized.M=20"]}, "randomized.M must be >= 192, the longest test input"),
        ({"config": ex.Config(lrs=())}, "learning rates"),
    ],
)
def test_bad_arguments_are_refused_before_training(kwargs, match, monkeypatch):
    monkeypatch.setattr(ex, "train", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    with pytest.raises(ValueError, match=match):
        ex.results(progress=False, **kwargs)


def test_lengths_past_the_distinct_symbols_are_allowed_where_items_repeat():
    assert ex.check_arguments(tasks="parity,count", eval_lens=[8, 100])[4] == [8, 100]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--encodings", "rope,bogus"], "unknown encoding 'bogus'"),
        (["--tasks", "bogus"], "valid tasks: copy, reverse"),
        (["--train-len", "0"], "train_len must be a positive integer"),
        (["--eval-lens", "4,2", "--train-len", "4"], "eval_lens must be >= train_len"),
        (["--eval-lens", "4,x"], "--eval-lens must be comma-separated integers"),
        (["--tasks", "modular_arithmetic", "--train-len", "10000000000"], "must be <= 1024 for task 'modular_arithmetic' (inputs of at most 2048 tokens)"),
        (["--tasks", "parity", "--train-len", str(10**20)], "must be <= 2047 for task 'parity'"),
        (["--seeds", "-1"], "seeds must be a positive integer"),
        (["--seeds", "0"], "seeds must be a positive integer"),
        (["--seeds", str(10**12)], "seeds must be at most 1,000, got 1,000,000,000,000"),
        (["--lm", "--seeds", "1001"], "seeds must be at most 1,000, got 1,001"),
        (["--steps", str(10**12)], "steps must be at most 1,000,000, got 1,000,000,000,000"),
        (["--lm", "--eval-lens", "64,200000"], "eval_lens must be <= 2048 bytes for --lm"),
        (["--lrs", "0.01,fast"], "--lrs must be comma-separated numbers"),
        (["--lrs", "-1"], "learning rates must be positive"),
        (["--steps", "0"], "steps must be a positive integer"),
        (["--lm", "--steps", "10"], "--steps does not apply to --lm"),
        (["--hparam", "cope.P=0"], "cope.P must be a positive integer"),
        (["--quick", "--hparam", "xpos=4"], "expected ENCODING.NAME=VALUE"),
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
        {"task": "copy", "encoding": "rope", "seed": 0, "train_len": 4, "eval_len": n, "lr": 0.01, "exact_match": a, "token_accuracy": t,
         "loss": 1.0, "matches": m}
        for n, a, t, m in ((4, 0.25, 0.6, "1000"), (8, 0.0, 0.1, "0000"))
    ]  # fmt: skip
    assert _report.unlearned(records) == [("copy", "rope", 0.25, _report.learnt_bar("copy", 4)[0], _report.learnt_bar("copy", 4)[1])]
    md = _report.markdown({"records": records, "seeds": [0], "config": {"eval_sequences": 4}})
    assert "| rope ✗ | 0.01 | **0.25 [0.00, 0.75]** | 0.00 [0.00, 0.00] |" in md and "| rope | 0.60 | 0.10 |" in md


def test_randomised_positions_of_an_evaluation_do_not_depend_on_what_ran_before_it():
    """The sweep's validation drew randomised RoPE's test positions from the module's generator
    first, so the same training gave other test records with the sweep than without."""
    hp = _hparams.resolve(_tasks.seq_len("reverse", 2), _tasks.seq_len("reverse", 4), {})
    swept = ex._job("randomized", ["randomized"], "reverse", 0, 0.01, TINY, 2, [2, 4], hp, True)[1]
    alone = ex._job("randomized", ["randomized"], "reverse", 0, 0.01, TINY, 2, [2, 4], hp, False)[1]
    assert swept == alone
    only_long = ex._job("randomized", ["randomized"], "reverse", 0, 0.01, TINY, 2, [4], hp, False)[1]
    assert only_long == alone[1:]


def test_learnt_means_halfway_from_chance_to_one_at_the_training_length():
    """A model that always writes one answer reaches parity's chance, 0.5, and is not learnt
    (the flat 0.5 rule had passed it); the bar is halfway from each task's chance to 1, the
    chance being the likeliest answer's rate, checked here on 100,000 drawn sequences; a run
    whose lengths leave out the training length is not judged (it had read a made-up 0.00)."""
    rng = np.random.default_rng(5)
    for task in _tasks.TASKS:
        sequences, prompt = _tasks.TASKS[task](rng, 100_000, 6)
        _, counts = np.unique(sequences[:, prompt:], axis=0, return_counts=True)
        assert counts.max() / 100_000 == pytest.approx(_tasks.chance(task, 6), abs=0.01), task
    assert _report.learnt_bar("parity", 8) == (0.5, 0.75) and _report.learnt_bar("count", 8) == pytest.approx((0.2, 0.6))
    assert 0 < _tasks.chance("bucket_sort", 450) < 1e-4  # (a float division of 450! had overflowed)

    def records(task, rates, train_len=8):
        return [
            {"task": task, "encoding": "rope", "seed": 0, "train_len": train_len, "eval_len": n, "lr": 0.01, "exact_match": a,
             "token_accuracy": a, "loss": 1.0, "matches": "1" * int(a * 100) + "0" * (100 - int(a * 100))}
            for n, a in rates.items()
        ]  # fmt: skip

    assert [row[:3] for row in _report.unlearned(records("parity", {8: 0.5, 16: 0.47}))] == [("parity", "rope", 0.5)]
    assert _report.unlearned(records("parity", {8: 0.8, 16: 0.5})) == []
    assert _report.unlearned(records("copy", {8: 0.55})) == []
    assert _report.unlearned(records("reverse", {16: 1.0, 32: 1.0})) == []  # the training length not evaluated
    md = _report.markdown({"records": records("parity", {8: 0.5}), "seeds": [0], "config": {"eval_sequences": 100}})
    assert "| rope ✗ |" in md


def test_an_interrupted_write_leaves_no_partial_json(tmp_path, monkeypatch):
    (tmp_path / "results.json").write_text("old")

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dumps", broken)
    with pytest.raises(KeyboardInterrupt):
        _report.write({"records": []}, str(tmp_path))
    assert (tmp_path / "results.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize(("argv", "steps", "lrs"), [([], 400, (2.5e-3, 5e-3, 1e-2)), (["--quick"], 400, (5e-3,)), (["--quick", "--steps", "7"], 7, (5e-3,)), (["--steps", "9", "--lrs", "0.1"], 9, (0.1,))])
def test_steps_and_rates_reach_the_training_configuration(argv, steps, lrs, tmp_path, monkeypatch):
    class Called(Exception):
        pass

    def results(**kwargs):
        raise Called(kwargs["config"])

    monkeypatch.setattr(ex, "results", results)
    with pytest.raises(Called) as called:
        cli.main(["extrapolate", *argv, "--out", str(tmp_path)])
    assert (called.value.args[0].steps, called.value.args[0].lrs) == (steps, lrs)
