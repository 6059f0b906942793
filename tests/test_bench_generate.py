"""The patched-against-unpatched generate() benchmark on a one-layer model: its records and the asv track that reads them."""

import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from posenc import _bench_generate  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ratios_time_both_copies_and_the_asv_track_reads_them(monkeypatch):
    found, same = _bench_generate.ratios("float32", repeat=2, new_tokens=2, prompt=4, prefill=8, layers=1)
    assert same, "the patched copy generated other tokens"
    assert set(found) == {"generate", "prefill"}
    for ours, theirs, median in found.values():
        assert all(t > 0 for t in (*ours, *theirs)) and all(r > 0 for r in median)
    monkeypatch.syspath_prepend(str(ROOT / "asv_benchmarks"))
    from benchmarks import decode

    ratio = decode.Generate().track_patched_over_unpatched({"float32": found}, "float32", "generate")
    assert ratio == found["generate"][0][0] / found["generate"][1][0]


def test_the_report_has_a_line_per_call_and_says_whether_tokens_agree(monkeypatch):
    def fake(dtype, repeat, compiled, layers):
        return {"generate": ((2.0, 1.0), (4.0, 2.0), (0.5, 0.25))}, True

    monkeypatch.setattr(_bench_generate, "ratios", fake)
    monkeypatch.setattr(_bench_generate, "positional", lambda *a, **k: {"posenc": 1e-5, "transformers": 2e-5})
    lines = _bench_generate.run(("float32",)).splitlines()
    assert lines[1].split()[:2] == ["generate", "float32"] and lines[1].split()[4:] == ["0.500", "0.500", "0.500", "/", "0.250"]
    assert lines[2].strip() == "greedy tokens equal (float32): True"
    assert [line.split()[-1] for line in lines[3:]] == ["0.500", "0.500"]


def test_positional_work_times_both_sides():
    found = _bench_generate.positional("bfloat16", tokens=3, layers=2, calls=2, rounds=1)
    assert set(found) == {"posenc", "transformers"} and all(t > 0 for t in found.values())
