"""The posenc command line: info, demo, plot, bench; clean errors without tracebacks."""

import pathlib
import subprocess
import sys

import pytest

from posenc import _bench, cli


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "posenc.cli", *args], capture_output=True, text=True, timeout=600)


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("numpy", "numba", "torch", "jax", "dask", "numba CPU kernels"):
        assert name in out


def test_demo_runs_every_family():
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for family in ("absolute", "relative", "rotary"):
        assert f"-- {family} --" in proc.stdout
    assert "FAIL" not in proc.stdout


def test_plot_writes_figures(tmp_path):
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["alibi.png", "rope_decay.png", "rope_layouts.png", "rope_scalings.png", "sinusoidal.png", "t5_buckets.png"])
    for p in tmp_path.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_unwritable_out_is_a_message_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("plot", "--out", str(blocker / "sub"))
    assert proc.returncode != 0
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_subcommand():
    proc = run_cli("frobnicate")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "invalid choice" in proc.stderr


def test_bench_table_on_tiny_shapes():
    rows = _bench.rope_rows((1, 2, 16, 8), 1, lambda s: None) + _bench.t5_rows(2, 16, 1, lambda s: None)
    text = _bench.table(rows)
    assert "posenc rope" in text and "posenc t5_bias" in text and "np.copyto" in text
    assert all(r.seconds > 0 for r in rows)
