"""The asv suite: what asv's environments install, which rows skip where a library is
missing (in ``setup``, never in ``setup_cache`` or ``teardown``), that the timed rows are
posenc's alone, and which rows the regression check (``make bench-continuous``) selects.

The suite's modules are imported in child processes (cwd ``asv_benchmarks``, as asv imports
them), some with torch, transformers and JAX hidden from the import system (``HIDE``).
"""

import html.parser
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUITE = ROOT / "asv_benchmarks"
MODULES = ("absolute", "bias", "decode", "first_call", "gpu", "jax", "rope", "rows")

# The child: every benchmark of the suite as asv names it (``module.Class.method``, params as
# their repr), with its kind.
# Run first in each child: the finders of sys.meta_path find none of the libraries named in
# its first argument, so ``import`` fails and ``importlib.util.find_spec`` answers None.
HIDE = """
import sys
HIDDEN = {name for name in sys.argv[1].split(",") if name}


class Hiding:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):  # find_distributions, invalidate_caches ...
        return getattr(self.finder, name)


sys.meta_path[:] = [Hiding(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""

LIST_ROWS = HIDE + """
import inspect, itertools, json, sys
import importlib
rows = []
for module_name in sys.argv[2].split(","):
    module = importlib.import_module("benchmarks." + module_name)
    for cls_name, cls in vars(module).items():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        for method in dir(cls):
            if method.split("_")[0] not in ("time", "track", "peakmem"):
                continue
            params = getattr(cls, "params", None)
            names = [f"{module_name}.{cls_name}.{method}"]
            if params:
                names = [f"{names[0]}({', '.join(map(repr, combo))})" for combo in itertools.product(*params)]
            rows += [[name, method.split("_")[0]] for name in names]
print(json.dumps(rows))
"""


def child(code, *args, timeout=600):
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=SUITE, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rows():
    return child(LIST_ROWS, "", ",".join(MODULES))


def test_the_suite_imports_without_torch_transformers_or_jax(rows):
    hidden = child(LIST_ROWS, "torch,transformers,jax,cupy", ",".join(MODULES))
    assert hidden == rows


def test_timed_rows_run_posencs_code_alone(rows):
    """Baselines (a formula, the framework, a copy or fill) run only inside ``track_`` ratios."""
    # gpu.py's variants are parameters, its anchors among them: a module the regression check
    # leaves out, whose rows run only on a GPU.
    timed = [name for name, kind in rows if kind in ("time", "peakmem") and not name.startswith("gpu.")]
    assert timed
    for name in timed:
        method = name.split("(")[0].split(".")[-1]
        assert "posenc" in method, f"{name}: a timed row that is not posenc's"


def test_model_sized_shapes_are_ordinary_parameters(rows):
    names = {name for name, _ in rows}
    assert "rope.RopeRotate.time_rope_posenc_in_place('1x32x8192x128', 'float32')" in names
    assert "bias.T5Bias.time_t5_posenc(2048)" in names
    assert "bias.BiasPeakMemory.peakmem_t5_posenc(2048)" in names
    assert not (SUITE / "benchmarks" / "common.py").read_text().count("environ")


# The child: ``setup`` and ``teardown`` of every parameter set, as asv's runner calls them
# (teardown after a skipped setup too), for the small first parameter of each class (every
# call of DecodeStep); prints [name, "ok" | "skipped: why"] per set.
SETUP_TEARDOWN = HIDE + """
import inspect, itertools, json, sys
import importlib
out = []
for module_name in sys.argv[2].split(","):
    module = importlib.import_module("benchmarks." + module_name)
    for cls_name, cls in vars(module).items():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__ or not hasattr(cls, "setup"):
            continue
        params = list(getattr(cls, "params", None) or [[]])
        if params[0] and cls_name != "DecodeStep":
            params[0] = params[0][:1]
        for combo in itertools.product(*params) if params != [[]] else [()]:
            bench = cls()
            cache = (bench.setup_cache(),) if hasattr(bench, "setup_cache") and sys.argv[3] == "cache" else ()
            try:
                bench.setup(*cache, *combo)
                state = "ok"
            except NotImplementedError as skip:
                state = f"skipped: {skip}"
            finally:
                if hasattr(bench, "teardown"):
                    bench.teardown(*cache, *combo)
            out.append([f"{module_name}.{cls_name}{list(combo)}", state])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def without_libraries():
    return dict(child(SETUP_TEARDOWN, "torch,transformers,jax,cupy", "absolute,bias,decode,rope,jax,rows", "cache"))


def test_without_torch_posencs_numpy_rows_run_and_the_rest_skip_in_setup(without_libraries):
    ran = {name for name, state in without_libraries.items() if state == "ok"}
    skipped = {name: state for name, state in without_libraries.items() if state != "ok"}
    for numpy_row in (
        "rope.RopeRotate['1x8x256x128', 'float32']",
        "rope.RopeApply['1x8x256x128', 'float32']",
        "rope.RopeVsFormula['1x8x256x128', 'float32', 'numpy']",
        "bias.T5Bias[256]",
        "bias.AlibiBias[256]",
        "bias.AlibiVsFormula[256, 'numpy']",
        "bias.BiasPeakMemory[256]",
        "bias.ShawGather[512, 'numpy']",
        "absolute.Sinusoidal[2048, 128]",
        "decode.DecodeStep['rope numpy [1,32,1,128]']",
        "decode.DecodeStep['t5_bias numpy 16 heads, 1 x 512']",
        "rows.BiasRows['t5', 'numpy']",
        "rows.LogitsRows['numpy']",
    ):
        assert numpy_row in ran
    for other_row, library in (
        ("rope.RopeRotate['1x8x256x128', 'bfloat16']", "torch"),
        ("rope.RopeVsFormula['1x8x256x128', 'float32', 'torch']", "torch"),
        ("bias.T5VsOriginal[256]", "torch"),
        ("bias.ShawGather[512, 'torch']", "torch"),
        ("decode.DecodeStep['rope torch [1,32,1,128]']", "torch"),
        ("decode.Generate['float32', 'generate']", "torch"),
        ("jax.JaxRope['1x8x1024x128']", "jax"),
        ("jax.JaxDecode[]", "jax"),
        ("rows.BiasRows['t5', 'torch']", "torch"),
    ):
        assert skipped[other_row] == f"skipped: {library} is not installed" or library in skipped[other_row], other_row
    assert all("numpy" not in name or "bfloat16" in name for name in skipped)


def test_decode_rows_tear_down_what_setup_changed():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(SUITE))
    try:
        from benchmarks.decode import DecodeStep
    finally:
        sys.path.remove(str(SUITE))
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    bench = DecodeStep()
    bench.setup("rope torch [1,32,1,128]")
    assert not torch.is_grad_enabled() and torch.get_num_threads() == min(2, threads)
    bench.teardown("rope torch [1,32,1,128]")
    assert (torch.get_num_threads(), torch.is_grad_enabled()) == (threads, grad)


# ---------------------------------------------------------------- what asv installs


def test_asv_environments_install_torch_first_and_alone_then_what_the_suite_measures():
    config = json.loads((SUITE / "asv.conf.json").read_text())
    assert "invalid" not in config.get("project_url", "")
    commands = [shlex.split(c) for c in config["install_command"]]
    first, *rest = commands
    assert first[first.index("install") + 1:] == ["torch==2.13.0"]
    for command in rest:  # later installs hold torch where it is
        assert "torch==2.13.0" in command
    wheel = [arg for c in rest for arg in c if arg.startswith("{wheel_file}")]
    assert wheel == ["{wheel_file}[bench-suite]"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "transformers==5.24.0" in extras["bench-suite"] and "transformers==5.24.0" in extras["test"]
    assert any(r.startswith("jax") for r in extras["bench-suite"])
    assert "posenc[bench-suite]" in extras["bench"] and any(r.startswith("asv") for r in extras["bench"])


# ---------------------------------------------------------------- the regression check


def regression_regexes():
    """The ``-b`` patterns of the Makefile's BENCH_REGRESSION."""
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^BENCH_REGRESSION \?=((?:.*\\\n)*.*)$", text, re.M).group(1)
    return shlex.split(block.replace("\\\n", " ").replace("$$", "$"))[1::2]  # make's escapes


def selected(patterns, names):
    return sorted(name for name in names if any(re.search(p, name) for p in patterns))  # asv's rule


def test_the_regression_check_selects_posencs_hot_paths_and_ratios_only(rows):
    names = [name for name, _ in rows]
    chosen = selected(regression_regexes(), names)
    assert all(".track_" in name for name in chosen)
    assert "rope.RopeRotate.track_in_place_time_over_copy('1x8x256x128', 'float32')" in chosen
    assert "bias.T5Bias.track_t5_out_time_over_fill(256)" in chosen
    assert "decode.DecodeStep.track_ratio('rope numpy [1,32,1,128]')" in chosen
    assert "decode.DecodeStep.track_ratio('t5_bias torch 16 heads, 1 x 512')" in chosen
    assert not [name for name in chosen if "2048" in name or "8192" in name or "jax." in name or "positions" in name]
    assert len(chosen) == 11  # the set measured in docs/benchmarks.md: about 4-5 minutes a comparison


def test_the_docs_name_the_rows_the_regression_check_runs(rows):
    section = (ROOT / "docs" / "benchmarks.md").read_text().split("### The regression check")[1].split("\n#")[0]
    chosen = selected(regression_regexes(), [name for name, _ in rows])
    shapes, calls = re.findall(r"`(\d+x\d+x\d+x\d+)`", section), re.findall(r"`(\w+\.\w+\.\w+\(\d+\))`", section)
    assert shapes and calls
    assert [shape for shape in shapes if not any(f"('{shape}'" in name for name in chosen)] == []
    assert [call for call in calls if call not in chosen] == []


def test_anchored_names_select_one_class():
    names = ["decode.DecodeStep.time_posenc('rope numpy [1,32,1,128]')", "jax.JaxDecode.time_decode_posenc_jax_jit"]
    assert selected(["DecodeStep"], names) == names[:1]
    assert selected([r"^decode\.DecodeStep\."], names) == names[:1]


def test_every_plant_wraps_a_function_that_exists_and_runs_rows_of_the_check(rows):
    sys.path.insert(0, str(SUITE))
    try:
        import plant_regression
    finally:
        sys.path.remove(str(SUITE))
    chosen = selected(regression_regexes(), [name for name, _ in rows])
    for name, (path, target, expected) in plant_regression.PLANTS.items():
        source = (ROOT / path).read_text()
        if target is None:
            continue
        owner, _, attr = target.rpartition(".")
        assert re.search(rf"^def {attr or owner}\(" if not owner else rf"def {attr}\(", source, re.M), name
        assert [row for row in chosen if re.search(expected, row)], name


# ---------------------------------------------------------------- the offline report


class Resources(html.parser.HTMLParser):
    """Every URL the page would load or link, its scripts, and its table cells' text."""

    def __init__(self):
        super().__init__()
        self.urls, self.scripts, self.cells, self.polylines = [], 0, [], 0
        self._cell = None

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href", "data", "xlink:href", "action") and value:
                self.urls.append(value)
            if name == "style" and value and "url(" in value:
                self.urls.append(value)
        self.scripts += tag == "script"
        self.polylines += tag == "polyline"
        if tag == "td":
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append(self._cell.strip())
            self._cell = None


def asv(*args, config, timeout=600):
    env = {**os.environ, "ASV_PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "asv", *args, "--config", str(config)], cwd=SUITE, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """asv results of two commits (HEAD~1 where the clone has it, and HEAD) for two cheap
    benchmarks, stored as ``make bench-record`` stores them, and the page made of them."""
    pytest.importorskip("asv")
    tmp = tmp_path_factory.mktemp("asv")
    config = json.loads((SUITE / "asv.conf.json").read_text())
    config.update(repo=str(ROOT), benchmark_dir=str(SUITE / "benchmarks"), results_dir=str(tmp / "results"),
                  env_dir=str(tmp / "env"), html_dir=str(tmp / "html"))
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(config))
    asv("machine", "--yes", config=path)
    commits = []
    for name in ("HEAD~1", "HEAD"):
        found = subprocess.run(["git", "rev-parse", "--verify", "-q", name], cwd=ROOT, capture_output=True, text=True)
        if found.returncode == 0:
            commits.append(found.stdout.strip())
    for commit in commits:
        asv("run", "--quick", "-b", r"^rope\.RopePrecision\.", "-b", r"^absolute\.Sinusoidal\.time_",
            "--set-commit-hash", commit, "-E", f"existing:{sys.executable}", config=path)
    out = tmp / "report"
    proc = subprocess.run([sys.executable, str(SUITE / "report.py"), str(tmp / "results"), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = Resources()
    page.feed((out / "index.html").read_text(encoding="utf-8"))
    return page, commits, tmp / "results"


def test_the_report_loads_nothing_from_the_network_and_holds_the_results(report):
    page, commits, results = report
    assert page.scripts == 0
    assert [url for url in page.urls if "//" in url or url.endswith((".js", ".css"))] == []
    stored = [json.loads(p.read_text()) for p in results.rglob("*.json") if p.name not in ("benchmarks.json", "machine.json")]
    assert len(stored) == len(commits)
    error = stored[-1]["results"]["rope.RopePrecision.track_rope_max_abs_error_at_2_24"][0][0]  # column "result", one value
    assert f"{error:.4g}" in page.cells  # the value, as the page shows it
    assert len([cell for cell in page.cells if cell.endswith(("µs", "ms"))]) >= 4 * len(commits)  # Sinusoidal's 4 parameter sets
    if len(commits) == 2:
        assert page.polylines >= 5  # a line over the commits for each series


def test_the_plant_script_reads_the_rows_asv_marks_slower():
    sys.path.insert(0, str(SUITE))
    try:
        import plant_regression
    finally:
        sys.path.remove(str(SUITE))
    output = """| Change   | Before [6a9d780f] <plant-rope~1>   | After [c794c035] <plant-rope>   | Ratio   | Benchmark (Parameter) |
|----------|------------------------------------|---------------------------------|---------|-----------------------|
|          | 0.9005167311610505                 | 0.8574347778821587              | 0.95    | decode.DecodeStep.track_ratio('apply_rope numpy [1,32,1,128]') |
| -        | 0.5                                | 0.4                             | 0.80    | bias.T5Bias.track_t5_out_time_over_fill(256) |
| +        | 13.628042643959592                 | 15.17197892520802               | 1.11    | rope.RopeRotate.track_in_place_time_over_copy('1x8x256x128', 'bfloat16') |
| +        | 6.324601016056232                  | 7.081409800115644               | 1.12    | rope.RopeRotate.track_in_place_time_over_copy('1x8x256x128', 'float32') |"""
    assert plant_regression.flags(output + "\n" + output) == [
        "rope.RopeRotate.track_in_place_time_over_copy('1x8x256x128', 'bfloat16')",
        "rope.RopeRotate.track_in_place_time_over_copy('1x8x256x128', 'float32')",
    ]
