"""What ``make test-gpu`` and ``posenc info`` need of a machine, checked without a GPU.

``posenc info`` says why the numba.cuda kernels cannot run (numba-cuda that fails to import
next to NumPy 2.5, no GPU); the ``jax_cpu`` kernel samples lie on JAX's CPU device even
where JAX's default device is a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from posenc import cli
from posenc._kernels import _arrays


def test_import_failure_under_numpy_2_5_names_the_cause_and_the_fix():
    said = _arrays.import_failure(AttributeError("module 'numpy' has no attribute 'row_stack'"), "2.5.2")
    assert "numba.cuda failed to import (AttributeError: module 'numpy' has no attribute 'row_stack')" in said
    assert "NumPy 2.5 removed" in said and "NumPy here is 2.5.2" in said and "posenc[cuda]" in said
    other = _arrays.import_failure(ImportError("libcudart.so: cannot open"), "2.4.6")
    assert other == "numba.cuda failed to import (ImportError: libcudart.so: cannot open)"


def test_posenc_info_says_what_is_wrong_when_numba_cuda_does_not_import():
    """A fresh interpreter where ``from numba import cuda`` raises as numba-cuda 0.30.4 does
    under NumPy 2.5: ``posenc info`` prints the reason instead of failing."""
    script = textwrap.dedent(
        """
        import sys, numba
        class Broken:
            def find_spec(self, name, path=None, target=None):
                if name == "numba.cuda":
                    raise AttributeError("module 'numpy' has no attribute 'row_stack'")
        sys.meta_path.insert(0, Broken())
        sys.modules.pop("numba.cuda", None)
        if hasattr(numba, "cuda"):
            del numba.cuda
        from posenc import cli
        sys.exit(cli.main(["info"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "numba.cuda kernels unavailable: numba.cuda failed to import (AttributeError: module 'numpy' has no attribute 'row_stack')" in proc.stdout


@pytest.mark.parametrize(("release", "found"), [(None, "no numba-cuda package (numba's own numba.cuda)"), ((0, 20), "numba-cuda 0.20")])
def test_an_old_or_missing_numba_cuda_is_named_with_the_fix(monkeypatch, release, found):
    """numba.cuda that imports but is not numba-cuda >= the ``cuda`` extra's floor (launch
    bounds, launches through cuda.core): the kernels are off and ``posenc info`` says why."""
    pytest.importorskip("numba")
    monkeypatch.setattr(_arrays, "numba_cuda_release", lambda: release)
    _arrays.cuda_problem.cache_clear()
    try:
        said = _arrays.cuda_problem()
    finally:
        _arrays.cuda_problem.cache_clear()
    assert said == f"{found}: posenc's CUDA kernels need numba-cuda >= 0.30, pip install 'posenc[cuda]'"


def test_the_numba_cuda_floor_is_the_cuda_extras():
    """``_arrays.NUMBA_CUDA_MIN`` and pyproject's ``cuda`` and ``test`` extras name one release."""
    import pathlib
    import tomllib

    project = tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    floor = "numba-cuda>=" + ".".join(map(str, _arrays.NUMBA_CUDA_MIN))
    extras = project["optional-dependencies"]
    assert floor in extras["cuda"] and floor in extras["test"]


def test_posenc_info_without_a_gpu_says_so(capsys):
    if _arrays.numba_cuda():
        pytest.skip("a GPU or the CUDA simulator is here")
    assert cli.main(["info"]) == 0
    assert "numba.cuda kernels unavailable: no usable CUDA GPU" in capsys.readouterr().out


def test_jax_cpu_kernel_samples_lie_on_the_cpu_device():
    jax = pytest.importorskip("jax")
    from kernel_samples import SAMPLES

    seen = 0
    for op in ("rope_rotate", "rope_apply", "toeplitz_gather"):
        for args, _ in SAMPLES[f"{op}.jax_cpu"](np.random.default_rng(0)):
            for a in args:
                if isinstance(a, jax.Array):
                    assert {d.platform for d in a.devices()} == {"cpu"}
                    seen += 1
    assert seen


def test_the_gpu_benchmark_anchors_compute_what_posenc_computes():
    """``posenc bench --gpu`` times its anchors beside posenc: each must compute the same thing
    (checked here on CPU tensors: the formulas are device-agnostic torch)."""
    torch = pytest.importorskip("torch")
    import posenc as pe
    from posenc import _bench_gpu
    from posenc.torch.hf import apply_rotary_pos_emb

    x = torch.randn(1, 4, 1, 16, dtype=torch.float64)
    position = torch.tensor([4095])
    # transformers' float32 angles: at 4095 radians one float32 rounding is up to 2.4e-4 (posenc's are exact).
    torch.testing.assert_close(_bench_gpu.decode_formula(torch, x, position)(), pe.rope(x, position), rtol=0, atol=5e-4 * float(x.abs().max()))
    slopes = torch.tensor(pe.alibi_slopes(4), dtype=torch.float32)
    positions = torch.arange(9)
    torch.testing.assert_close(_bench_gpu.alibi_formula(slopes, positions), pe.alibi_bias(slopes, 9, 9, symmetric=True))
    q, k = torch.randn(2, 5, 4, 16).transpose(1, 2), torch.randn(2, 5, 2, 16).transpose(1, 2)
    angles = torch.rand(2, 5, 8, dtype=torch.float64) * 9
    cos, sin = (f(torch.cat([angles, angles], -1)).float() for f in (torch.cos, torch.sin))
    for got, want in zip(_bench_gpu._hf_apply(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(got, want)


def test_the_gpu_decode_rows_pair_each_posenc_call_with_its_eager_anchor():
    """``posenc bench --gpu``'s decode rows (made here on the CPU): ``pe.rope`` beside the
    eager formula, the HF drop-in's ``apply_rotary_pos_emb`` beside transformers' own, each
    posenc row's ratio taken against the anchor timed with it."""
    torch = pytest.importorskip("torch")
    from posenc import _bench_gpu

    rows = _bench_gpu._decode_rows(torch, torch.bfloat16, 1, lambda line: None, lambda: None, device="cpu")
    assert [(r.impl, r.dtype) for r in rows] == [
        ("torch eager plain formula", "bfloat16"), ("posenc rope (torch)", "bfloat16"),
        ("torch eager plain formula", "bfloat16"), ("posenc apply_rotary_pos_emb (torch)", "bfloat16"),
    ]  # fmt: skip
    assert rows[0].op == rows[1].op != rows[2].op == rows[3].op
    assert rows[1].plain_seconds == rows[0].seconds and rows[3].plain_seconds == rows[2].seconds
    assert rows[3].nbytes == 2 * (32 + 8) * 128 * 2 and all(r.seconds > 0 for r in rows)


def test_the_launch_cost_script_runs_without_a_gpu():
    """``tests/gpu/launch_cost.py`` packs the rotary kernel's real signature (it went stale once
    when the signature grew an argument)."""
    pytest.importorskip("cuda.core")
    script = Path(__file__).parent / "gpu" / "launch_cost.py"
    paths = [str(Path(__file__).parents[1] / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "rotary kernel, 129 parameters" in out.stdout and "packing as ints and floats (posenc)" in out.stdout


def test_make_test_gpu_names_a_dependency_older_than_posenc_needs():
    """``tests/gpu/ready.py`` (``make test-gpu``'s first step, which runs src/ without
    installing posenc, so pip never checked the minimums) names each dependency older than
    pyproject.toml's minimum and how to upgrade it: array-api-compat 1.12 beside JAX 0.11
    had failed 407 of the GPU suite's tests."""
    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    try:
        import ready
    finally:
        sys.path.pop(0)
    versions = {"numpy": "2.4.6", "array-api-compat": "1.12.0", "numba": "0.68.1"}
    said = ready.older_than_required(["numpy>=1.26", "array-api-compat>=1.14", "numba>=0.60", "absent>=1.0"], versions.get)
    assert said == ["array-api-compat 1.12.0 is older than the 1.14 posenc needs (pip install 'array-api-compat>=1.14')"]
    assert ready.older_than_required(["numpy>=2.5"], {"numpy": "2.5.0rc1"}.get) == []
    assert ready.older_than_required(["numpy>=2.5"], {"numpy": "2.4.99"}.get) != []


def _stubs(folder, **scripts):
    """Executables ``name`` running bash ``body`` in ``folder``; the environment with it first on PATH."""
    folder.mkdir()
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/bash\n" + body + "\n")
        (folder / name).chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_the_wheels_script_runs_in_a_git_worktree(tmp_path):
    """``tests/gpu/wheels.sh`` adds ``/.whl/`` to git's exclude file where git keeps it: in a
    worktree (every helper session's checkout) ``.git`` is a file, and the script's
    ``echo >> .git/info/exclude`` stopped it (``set -e``) before any download."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    repo, tree = tmp_path / "repo", tmp_path / "tree"
    script = repo / "tests" / "gpu" / "wheels.sh"
    script.parent.mkdir(parents=True)
    script.write_bytes((Path(__file__).parent / "gpu" / "wheels.sh").read_bytes())
    for step in (["init", "-q", str(repo)], ["-C", str(repo), "add", "."], ["-C", str(repo), "commit", "-qm", "w"], ["-C", str(repo), "worktree", "add", "-q", "--detach", str(tree)]):
        subprocess.run([*git, *step], check=True, capture_output=True)
    env = _stubs(tmp_path / "bin", python3='echo "$@" > downloaded; mkdir -p .whl')  # (no download)
    done = subprocess.run(["sh", "tests/gpu/wheels.sh"], cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip download" in (tree / "downloaded").read_text()
    exclude = subprocess.run([*git, "-C", str(tree), "rev-parse", "--git-path", "info/exclude"], capture_output=True, text=True, check=True).stdout.strip()
    assert "/.whl/" in Path(tree, exclude).read_text().splitlines()


def test_the_lease_script_prints_the_failures_of_a_test_run(tmp_path):
    """``tests/gpu/lease.sh test`` prints the GPU suite's failed tests and counts, also when
    the run ran past its limit: a step then gets SIGINT (pytest prints its summary, then its
    workers' KeyboardInterrupt tracebacks), where it had printed the log's last 3 lines only
    (the tracebacks' ends; and plain ``timeout``'s SIGTERM left no summary at all)."""
    traceback = "\n".join([f'echo "  File \\"x.py\\", line {n}"' for n in range(20)])
    env = _stubs(
        tmp_path / "bin",
        **{
            "python3": "exit 0",
            "nvidia-smi": "echo H200",
            "make": "echo 'FAILED tests/test_a.py::test_b - boom'\necho '===== 1 failed, 9 passed in 330.00s ====='\n" + traceback + "\necho KeyboardInterrupt\nexit 2",
        },
    )
    script = Path(__file__).parent / "gpu" / "lease.sh"
    done = subprocess.run(["bash", str(script), "test"], cwd=tmp_path, env={**env, "OUT": str(tmp_path / "out")}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "test: exit 2" in done.stdout
    assert "FAILED tests/test_a.py::test_b - boom" in done.stdout and "1 failed, 9 passed" in done.stdout
