"""The posenc command line: info, demo, plot, bench; clean errors without tracebacks."""

import importlib
import importlib.metadata
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from posenc import _bench, _demo, cli


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "posenc.cli", *args], capture_output=True, text=True, timeout=600)


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("numpy", "numba", "torch", "jax", "dask", "numba CPU kernels"):
        assert name in out


def test_info_lists_each_librarys_devices(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU {i}")
    assert cli.main(["info"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.split()[0] == "devices"]
    jax_devices = ", ".join(f"{device.platform}:{device.id}" for device in jax.devices())
    assert line.split(None, 1)[1] == f"numpy cpu; torch cpu, cuda:0 (GPU 0), cuda:1 (GPU 1); jax {jax_devices}"


def test_info_says_numba_that_does_not_import_is_unusable(tmp_path):
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.2 or less. Got NumPy 2.4.")\n')
    path = os.pathsep.join([str(tmp_path), *sys.path])
    proc = subprocess.run([sys.executable, "-m", "posenc.cli", "info"], capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "numba CPU kernels" in line]
    assert line.split("kernels", 1)[1].strip() == "unavailable: numba failed to import (Numba needs NumPy 2.2 or less. Got NumPy 2.4.)"


def test_info_says_which_library_does_not_start_and_goes_on(monkeypatch, capsys):
    jax = pytest.importorskip("jax")

    def devices():
        raise AssertionError("no cuda backend")  # what JAX_PLATFORMS=cuda raises without a GPU

    monkeypatch.setattr(jax, "devices", devices)
    assert cli.main(["info"]) == 0
    assert "; jax unavailable (AssertionError: no cuda backend)" in capsys.readouterr().out


@pytest.mark.parametrize("wheel", ["cupy-cuda12x", "cupy-cuda13x", "cupy-rocm-6-0", "cupy"])
def test_info_finds_cupy_whichever_wheel_installed_it(wheel, monkeypatch, capsys):
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"cupy": [wheel]})
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "13.6.0" if dist == wheel else version(dist))
    assert cli.main(["info"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.split()[0] == "cupy"]
    assert line.split() == ["cupy", "13.6.0", f"({wheel})"]


@pytest.mark.parametrize("command", [["info"], ["demo"], ["bench"], ["warmup"], ["plot"], ["plot", "decay"], ["extrapolate"]])
def test_an_option_a_command_does_not_take_is_that_commands_error(command, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main([*command, "--no-such-option", "--out", "unused"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: posenc {' '.join(command)} ")
    assert err.endswith(f"posenc {' '.join(command)}: error: unrecognized arguments: --no-such-option{'' if command[0] in ('plot', 'extrapolate') else ' --out unused'}\n")


def test_python_dash_m_posenc_is_the_posenc_command():
    proc = subprocess.run([sys.executable, "-m", "posenc", "extrapolate", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: posenc extrapolate")
    wrong = subprocess.run([sys.executable, "-m", "posenc", "no-such-command"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr


@pytest.mark.parametrize("command", [["info"], ["demo", "--library", "numpy"]])
def test_a_reader_that_leaves_gets_no_traceback(command):
    read, write = os.pipe()
    os.close(read)  # posenc info | head -1, once head has exited
    try:
        proc = subprocess.run([sys.executable, "-m", "posenc.cli", *command], stdout=write, stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr


def test_demo_of_a_library_asked_for_but_not_installed_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(_demo, "_installed", lambda module: module == "numpy")
    assert cli.main(["demo", "--library", "numpy", "--library", "torch"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err == "posenc demo: --library torch: not installed (pip install 'posenc[torch]')\n"


def test_demo_runs_every_family():
    proc = run_cli("demo", "--library", "numpy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "libraries: numpy"
    for family in ("absolute", "relative", "rotary"):
        assert f"-- {family} --" in proc.stdout
    assert "FAIL" not in proc.stdout and proc.stdout.endswith("demo finished: no failures\n")


@pytest.mark.parametrize("library", [name for name, *_ in _demo.LIBRARIES])
def test_demo_runs_every_step_on_each_installed_library(library):
    (module,) = [module for name, module, *_ in _demo.LIBRARIES if name == library]
    pytest.importorskip(module)
    lines = []
    assert _demo.run(lines.append, only=[library]) == 0, "\n".join(lines)
    ran = [line for line in lines if line.startswith("  ") and "skipped on" not in line]
    skipped = [line for line in lines if "skipped on" in line]
    assert len(ran) + len(skipped) == len(_demo._STEPS) and len(skipped) <= 1
    described = [line for line in ran if " float32" in line]
    assert described and all(f"{library} (" in line for line in described), described


def test_demo_names_each_library_it_skips_and_why(monkeypatch):
    monkeypatch.setattr(_demo, "_installed", lambda module: module == "numpy")
    found = {name: (maker, why) for name, maker, why in _demo.libraries()}
    assert list(found) == ["numpy", "torch", "jax", "dask", "array-api-strict"]
    assert found["numpy"] == (_demo.numpy_arrays, "")
    assert found["jax"] == (None, "not installed (pip install 'posenc[jax]')")
    lines = []
    assert _demo.run(lines.append) == 0
    assert lines[0] == (
        "libraries: numpy; torch skipped: not installed (pip install 'posenc[torch]'); "
        "jax skipped: not installed (pip install 'posenc[jax]'); dask skipped: not installed (pip install 'posenc[dask]'); "
        "array-api-strict skipped: not installed (pip install array-api-strict)"
    )
    assert [line.split("  ")[0] for line in lines if line.startswith("==")] == ["== numpy =="]


def test_demo_refuses_an_unknown_library():
    proc = run_cli("demo", "--library", "cupyy")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --library: invalid choice: 'cupyy'" in proc.stderr


def test_plot_writes_figures(tmp_path):
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["alibi.png", "rope_decay.png", "rope_layouts.png", "rope_scalings.png", "sinusoidal.png", "t5_buckets.png"])
    for p in tmp_path.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_one_figure_with_its_options(tmp_path, monkeypatch):
    from posenc import plots

    calls = []
    for name in ("rope_decay", "scalings", "t5_buckets", "alibi", "sinusoidal", "rope_layouts"):
        monkeypatch.setattr(plots, name, lambda name=name, **kwargs: calls.append((name, kwargs)))
    out = str(tmp_path)
    assert cli.main(["plot", "decay", "--base", "10000", "500000", "--out", out]) == 0
    assert cli.main(["plot", "scaling", "--type", "yarn", "--factor", "8", "--out", out]) == 0
    assert cli.main(["plot", "--out", out, "t5", "--buckets", "16", "--max-distance", "64"]) == 0
    assert cli.main(["plot", "alibi", "--heads", "12", "--head", "3", "--length", "16", "--out", out]) == 0
    assert cli.main(["plot", "sinusoidal", "--out", out]) == 0
    assert calls == [
        ("rope_decay", {"bases": [10000.0, 500000.0], "path": f"{out}/rope_decay.png"}),
        ("scalings", {"types": ["yarn"], "factor": 8.0, "path": f"{out}/rope_scalings.png"}),
        ("t5_buckets", {"num_buckets": 16, "max_distance": 64, "path": f"{out}/t5_buckets.png"}),
        ("alibi", {"heads": 12, "length": 16, "head": 3, "path": f"{out}/alibi.png"}),
        ("sinusoidal", {"path": f"{out}/sinusoidal.png"}),
    ]


def test_plot_decay_writes_only_its_figure(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", "decay", "--base", "10000", "500000", "--max-distance", "4096", "--out", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["rope_decay.png"]
    assert capsys.readouterr().out == f"wrote {tmp_path}/rope_decay.png\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["decay", "--base", "10000", "x"], "posenc plot decay: error: argument --base: must be a positive number, got 'x'"),
        (["decay", "--dim", "7"], "posenc plot decay: error: argument --dim: must be an even integer >= 2, got '7'"),
        (["layouts", "--dim", "100000"], "posenc plot layouts: error: argument --dim: must be an even integer from 2 to 256, got '100000'"),
        (["scaling", "--type", "yarnn"], "posenc plot scaling: error: argument --type: invalid choice: 'yarnn'"),
        (["scaling", "--factor", "0.5"], "posenc plot scaling: error: argument --factor: must be a number from 1 to 1e+06, got '0.5'"),
        (["t5", "--max-distance", str(10**8)], "posenc plot t5: error: argument --max-distance: must be an integer from 1 to 1048576, got '100000000'"),
        (["scaling", "--dim", str(10**8)], "posenc plot scaling: error: argument --dim: must be an even integer from 4 to 65536, got '100000000'"),
        (["scaling", "--factor", "1e20"], "posenc plot scaling: error: argument --factor: must be a number from 1 to 1e+06, got '1e20'"),
        (["alibi", "--heads", "0"], "posenc plot alibi: error: argument --heads: must be a positive integer, got '0'"),
        (["t5", "--size", "16"], "posenc plot t5: error: unrecognized arguments: --size 16"),
        (["decay"], "posenc plot decay: error: the following arguments are required: --out"),
        ([], "posenc plot: error: the following arguments are required: --out"),
        (["frob"], "posenc plot: error: argument FIGURE: invalid choice: 'frob'"),
    ],
)
def test_plot_refuses_bad_options(args, message, tmp_path, capsys):
    out = [] if args in (["decay"], []) else ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit:
        cli.main(["plot", *args, *out])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_plot_option_the_figure_refuses_is_one_line(tmp_path, capsys):
    assert cli.main(["plot", "alibi", "--head", "8", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "posenc plot: head must be below heads=8, got 8\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["alibi", "--length", "12000"], "length x length must be at most 16777216 cells for this figure (an image of them), got 12000 x 12000"),
        (["sinusoidal", "--length", "2000000"], "length x dim must be at most 16777216 cells for this figure (an image of them), got 2000000 x 128"),
    ],
)
def test_plot_refuses_a_heat_map_too_large_to_draw(args, message, tmp_path, capsys):
    """Before any work: ALiBi at 12000 x 12000 had peaked at 16 GB in matplotlib (the
    OOM killer a little further), the sinusoid of 2e6 positions at 20 GB."""
    assert cli.main(["plot", *args, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"posenc plot: {message}\n"
    assert list(tmp_path.iterdir()) == []


def test_plot_unwritable_out_is_a_message_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("plot", "--out", str(blocker / "sub"))
    assert proc.returncode == 2
    assert "is not a directory" in proc.stderr and "Traceback" not in proc.stderr


def test_plot_out_that_is_a_file_says_not_a_directory(tmp_path, capsys):
    target = tmp_path / "figure.png"
    target.write_text("x")
    assert cli.main(["plot", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc plot: --out {str(target)!r} is not a directory\n"
    assert target.read_text() == "x"


def test_missing_matplotlib_is_one_line_with_one_prefix(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert cli.main(["plot", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("posenc") == 2 and err.startswith("posenc plot: matplotlib is not installed")
    assert err.count("\n") == 1


def test_version():
    import posenc

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"posenc {posenc.__version__}\n"


def test_unknown_subcommand():
    proc = run_cli("frobnicate")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "invalid choice" in proc.stderr


@pytest.mark.parametrize(
    "module, argv",
    [("_bench_decode", ["--calls", "0"]), ("_bench_decode", ["--rounds", "0"]), ("_bench_generate", ["--repeat", "0"]), ("_bench_generate", ["--layers", "-1"])],
)
def test_bench_scripts_refuse_counts_below_one(module, argv, monkeypatch, capsys):
    bench = importlib.import_module(f"posenc.{module}")
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("ran despite a bad count"))
    with pytest.raises(SystemExit) as exit:
        bench.main(argv)
    assert exit.value.code == 2
    assert f"error: argument {argv[0]}: must be a positive integer, got '{argv[1]}'" in capsys.readouterr().err


def test_warmup_gpu_without_a_usable_gpu_names_the_option(monkeypatch, capsys):
    from posenc._kernels import _arrays

    monkeypatch.setattr(_arrays, "cuda_problem", lambda: "no usable CUDA GPU (here, a test's)")
    assert cli.main(["warmup", "--gpu", "--dtype", "float32"]) == 2
    assert capsys.readouterr().err == "posenc warmup: --gpu needs the numba.cuda kernels, unavailable here: no usable CUDA GPU (here, a test's)\n"


def tiny_bench_rows():
    quiet = lambda s: None  # noqa: E731
    return _bench.rope_rows((1, 2, 16, 8), 1, quiet) + _bench.t5_rows(2, 16, 1, quiet) + _bench.alibi_rows(2, 16, 1, quiet)


def test_bench_table_explains_itself_and_leaves_meaningless_ratios_blank():
    rows = tiny_bench_rows()
    text = _bench.table(rows)
    header = text.splitlines()[0]
    assert header.split("  ")[0] == "operation" and re.sub(r"\s{2,}", "|", header.strip()).split("|") == list(_bench.COLUMNS)
    assert all(0 < r.seconds <= r.median for r in rows)
    cells = {(r.op, r.impl, r.dtype): dict(zip(_bench.COLUMNS, r.cells())) for r in rows}
    for (op, impl, dtype), row in cells.items():
        if "(bandwidth)" in impl:
            assert row["of copy"] == "" and row["vs framework"] == "", impl
        else:
            assert row["of copy"] != "", impl
        if "formula" in impl or "original" in impl:
            assert row["vs framework"] == "", impl  # a baseline
        elif "(bandwidth)" not in impl:
            assert row["vs framework"].endswith("x"), impl
    assert cells[("rope [1, 2, 16, 8]", "posenc rope", "float32")]["vs framework"].endswith("x")


def test_bench_compares_each_library_with_its_own_formula():
    """'vs framework' is the same library's formula in the row's dtype over the row's time."""
    pytest.importorskip("torch")
    rows = _bench.rope_rows((1, 2, 16, 8), 1, lambda s: None) + _bench.t5_rows(2, 16, 1, lambda s: None)
    found = {(r.op, r.impl, r.dtype): r for r in rows}
    rope = "rope [1, 2, 16, 8]"
    for dtype in ("float32", "bfloat16"):
        ours, theirs = found[(rope, "posenc rope (torch)", dtype)], found[(rope, "torch eager formula", dtype)]
        assert ours.plain_seconds == theirs.seconds
    assert found[(rope, "posenc rope", "float32")].plain_seconds == found[(rope, "numpy plain formula", "float32")].seconds
    t5 = "t5_bias h=2 L=16"
    assert found[(t5, "posenc t5_bias (torch)", "float32")].plain_seconds == found[(t5, "torch T5 original", "float32")].seconds


def test_bench_names_what_it_skips_and_why(monkeypatch):
    missing = {"torch", "transformers", "jax"}
    monkeypatch.setattr(_bench, "installed", lambda module: module not in missing)
    reasons = _bench.skipped()
    assert any("torch is not installed" in r for r in reasons) and any("jax is not installed" in r for r in reasons)
    missing = {"transformers"}
    assert _bench.skipped() == ["the torch and Hugging Face decode-step rows and the patched-model row: transformers is not installed"]
    missing = set()
    assert _bench.skipped() == []


def test_bench_has_the_patched_model_rows_where_transformers_is_installed():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    lines = _bench.model_lines(True, lambda s: None, layers=1).splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    for call in ("generate", "prefill"):
        patched, unpatched, ratio = float(rows[call][1].rstrip("s")), float(rows[call][2].rstrip("s")), float(rows[call][3])
        rounding = 5e-4 * (1 + patched / unpatched) / unpatched + 5e-4  # times printed to 1 ms, the ratio to 0.001
        assert ratio == pytest.approx(patched / unpatched, abs=rounding)
    assert lines[-1] == "greedy tokens equal: True"  # float32: the same tokens


def test_bench_counts_bytes_in_each_rows_dtype():
    pytest.importorskip("torch")
    rows = {(r.impl, r.dtype): r for r in _bench.rope_rows((1, 2, 16, 8), 1, lambda s: None)}
    elements = 1 * 2 * 16 * 8
    assert rows[("posenc rope", "float32")].nbytes == 2 * elements * 4  # read and write float32
    assert rows[("posenc rope (torch)", "bfloat16")].nbytes == 2 * elements * 2  # read and write bfloat16
    assert rows[("torch eager formula", "bfloat16")].nbytes == 2 * elements * 2
    t5 = _bench.t5_rows(2, 16, 1, lambda s: None)
    assert {r.nbytes for r in t5} == {2 * 16 * 16 * 4}  # write the float32 bias


def test_bench_of_copy_is_over_the_bandwidth_row_the_table_prints():
    """A row's 'of copy' is its GB/s over the GB/s printed on the bandwidth row of its dtype in
    the same table (a copy timed apart, before the rows, had been the divisor: 0.59 shown
    where the printed figures gave 0.38); bfloat16 rows have their own bandwidth row."""
    pytest.importorskip("torch")
    rows = tiny_bench_rows()
    for op in {r.op for r in rows}:
        table = [r for r in rows if r.op == op]
        for dtype in {r.dtype for r in table}:
            anchor = next(r for r in table if r.dtype == dtype and "(bandwidth)" in r.impl)
            for row in table:
                if row.dtype == dtype and row is not anchor and "(bandwidth)" not in row.impl:
                    assert row.copy_rate == anchor.nbytes / anchor.seconds, (op, row.impl, dtype)


def test_bench_numpy_baselines_compute_in_the_rows_dtype(monkeypatch):
    """Each NumPy case of a table, and each decode step's NumPy formula, gives an array of the
    row's dtype (ALiBi's int64 distances had made its formula float64: nine times slower than
    the same formula in float32, which the table reported as posenc's speed-up)."""
    from posenc import _bench_decode

    tables = []
    monkeypatch.setattr(_bench, "_measure", lambda op, cases, *args, **kwargs: tables.append(cases) or [])
    _bench.rope_rows((1, 2, 16, 8), 1, None), _bench.t5_rows(2, 16, 1, None), _bench.alibi_rows(2, 16, 1, None)
    for case in (c for cases in tables for c in cases if "numpy" in c.impl or c.impl.startswith("posenc")):
        result = case.fn()
        if isinstance(result, np.ndarray):
            assert result.dtype == np.dtype(case.dtype), case.impl
    alibi = [case for case in _bench_decode.numpy_cases() if "alibi" in case.name]
    assert alibi
    for case in alibi:
        assert case.framework().dtype == case.posenc().dtype == np.float32, case.name


def test_bench_help_describes_every_column():
    proc = run_cli("bench", "--help")
    assert proc.returncode == 0
    for column in _bench.COLUMNS:
        assert f"\n{column} " in proc.stdout
    assert "vs framework" in proc.stdout and "np.copyto" in proc.stdout


def test_bench_gpu_without_a_gpu_says_why():
    from posenc._kernels import _arrays

    if _arrays.numba_cuda() and not _arrays.cuda_simulator():
        pytest.skip("a GPU is here")
    out = subprocess.run([sys.executable, "-m", "posenc.cli", "bench", "--gpu"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("posenc bench: --gpu needs an NVIDIA GPU")


def test_bench_gpu_rows_on_a_gpu():
    from posenc import _bench_gpu

    problem = _bench_gpu.requirements()
    if problem:
        pytest.skip(problem)
    rows = _bench_gpu.rows(True, 1, lambda s: None)
    impls = {r.impl for r in rows}
    assert {"torch eager plain formula", "posenc rope (torch)", "Tensor.copy_ (bandwidth)", "posenc t5_bias (torch)"} <= impls
    assert all(r.seconds > 0 for r in rows)
    assert "GB/s" in _bench.table(rows).splitlines()[0]


class _Timeline:
    """A host and a device as two clocks: enqueued work starts when the device is free and
    the host has enqueued it; the host waits only when it synchronises."""

    RATE = 2e9  # cycles a second of the fake torch.cuda._sleep

    def __init__(self, host_per_call, device_per_call):
        self.host = self.device = 0.0
        self.host_per_call, self.device_per_call = host_per_call, device_per_call

    def enqueue(self, work):
        self.device = max(self.device, self.host) + work
        return self.device

    def call(self):
        self.host += self.host_per_call
        self.enqueue(self.device_per_call)

    def torch(self):
        timeline = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                self.at = timeline.enqueue(0.0)

            def synchronize(self):
                timeline.host = max(timeline.host, self.at)

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        class Cuda:
            def synchronize(self):
                timeline.host = max(timeline.host, timeline.device)

            def _sleep(self, cycles):
                timeline.enqueue(cycles / timeline.RATE)

        cuda = Cuda()
        cuda.Event = Event
        return type("FakeTorch", (), {"cuda": cuda})


def test_bench_gpu_device_timings_leave_out_the_hosts_time(monkeypatch):
    """A call whose host work (3 ms) outlasts its device work (1 ms): the device's time per
    call is 1 ms, where the wall time of calls enqueued back to back would give 3 ms."""
    from posenc import _bench_gpu, _bench_measure

    timeline = _Timeline(host_per_call=3e-3, device_per_call=1e-3)
    monkeypatch.setattr(_bench_gpu.time, "perf_counter", lambda: timeline.host)
    times = _bench_gpu.device_timings(timeline.torch())(timeline.call, 3, 10)
    assert times == pytest.approx([1e-3] * 3, rel=1e-9)

    monkeypatch.setattr(_bench_measure.time, "perf_counter", lambda: timeline.host)
    wall = _bench_measure.timings(timeline.call, 3, timeline.torch().cuda.synchronize, 10)
    assert wall == pytest.approx([3e-3 + 1e-4] * 3, rel=1e-9)  # the host's 3 ms a call, and the last call's device work


def test_bench_gpu_jax_rows_dispatch_calls_back_to_back(monkeypatch):
    """The JAX rows' timing path, run on JAX's CPU arrays in place of a GPU's: three rows,
    each the time of calls dispatched without waiting, then a wait for the last."""
    jax = pytest.importorskip("jax")
    from posenc import _bench_gpu
    from posenc._bench_jax import RopeCalls

    dispatched = []
    calls = RopeCalls((1, 2, 8, 16))
    jitted = calls.jitted
    calls.jitted = lambda *a: dispatched.append(1) or jitted(*a)
    monkeypatch.setattr(_bench_gpu, "jax_gpu_rope", lambda shape: (calls, jax.jit(lambda x: -x)))
    rows = _bench_gpu._jax_rows((1, 2, 8, 16), 2, lambda line: None)
    assert [r.impl for r in rows] == ["jnp plain formula, jax.jit", "posenc rope (JAX, jax.jit)", "jnp negation, jax.jit (bandwidth)"]
    assert all(r.seconds > 0 for r in rows)
    assert len(dispatched) == 1 + 2 * _bench_gpu.BACK_TO_BACK  # a warm-up call, then two samples


ROOT = pathlib.Path(__file__).resolve().parents[1]
# a command line as the docs write one, up to the end of its code span, quote, comment or clause
COMMAND = re.compile(r"posenc (?:info|demo|bench|warmup|plot|extrapolate)\b(?:(?!, )[^`\"'|)#:\n])*")


REFUSED_ON_PURPOSE = {"posenc plot decay --dim 7 --out figures"}  # docs/cli.md shows the refusal


def documented_commands():
    """``(file, command)`` for each ``posenc ...`` command line with options in the README, the
    docs and the sources' docstrings (synopses with ``[...]``, ``FIGURE`` or ``...`` left out)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src" / "posenc").rglob("*.py"))]
    for path in files:
        for command in COMMAND.findall(path.read_text(encoding="utf-8")):
            command = command.strip()
            if " --" in command and command not in REFUSED_ON_PURPOSE and not re.search(r"\[|FIGURE|\.\.\.|--help", command):
                yield path.relative_to(ROOT).as_posix(), command


def test_documented_command_lines_are_ones_the_command_takes(capsys):
    """Every option exists; the README's and the docs' lines (not a docstring's mention of a
    mode, such as ``posenc extrapolate --lm``) are whole, with the --out that plot and extrapolate need."""
    refused = []
    for where, command in documented_commands():
        argv = shlex.split(command)[1:]
        if argv[0] in ("plot", "extrapolate") and "--out" not in argv:
            if not where.endswith(".py"):
                refused.append((where, command, "--out is required"))
            argv += ["--out", "DIR"]
        try:
            cli.build_parser().parse_args(argv)
        except SystemExit:
            refused.append((where, command, capsys.readouterr().err.splitlines()[-1]))
    assert not refused


def test_every_command_is_documented():
    (commands,) = [a.choices for a in cli.build_parser()._actions if isinstance(a, cli.argparse._SubParsersAction)]
    table = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert [c for c in commands if f"| `posenc {c}" not in table] == []
    assert [c for c in commands if f"``{c}``" not in cli.__doc__.split("\n\n")[0]] == []
