"""Concurrency, on-disk kernel caches and reproducibility."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import posenc as pe
from arrays import child_pythonpath

RUNNER = pathlib.Path(__file__).parent / "reliability" / "kernel_run.py"
SRC = pathlib.Path(pe.__file__).parent


def _calls():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 256, 64)).astype(np.float32)
    table = rng.standard_normal((32, 8)).astype(np.float32)
    q = rng.standard_normal((2, 8, 64, 16))
    tk = rng.standard_normal((17, 16))
    return {
        "rope": lambda: pe.rope(x, offset=1000),
        "t5_bias": lambda: pe.t5_bias(table, 300, 300, offset=5),
        "alibi_bias": lambda: pe.alibi_bias(pe.alibi_slopes(8), 200, 260),
        "shaw_logits": lambda: pe.shaw_logits(q, q, tk, max_distance=8),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_same_call_from_eight_threads_is_identical(name):
    call = _calls()[name]
    first = call()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: call(), range(8)))
    for r in results:
        assert r.dtype == first.dtype and r.tobytes() == first.tobytes()


FIRST_JAX_CALLS = """
import importlib.abc, sys, threading, time
import numpy as np
import jax.numpy as jnp
import posenc as pe

class SlowAdapter(importlib.abc.MetaPathFinder):  # the JAX adapter's import, slowed down
    def find_spec(self, name, path, target=None):
        if name == "posenc._jax.register":
            time.sleep(0.5)

sys.meta_path.insert(0, SlowAdapter())
x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 4, 8, 16)).astype(np.float32))
found = {}

def call(i):
    time.sleep(0.2 * i)  # the second call comes while the first imports the adapter
    found[i] = np.asarray(pe.rope(x, offset=1000))

threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
after = np.asarray(pe.rope(x, offset=1000))
print([found[i].tobytes() == after.tobytes() for i in range(2)])
"""


@pytest.mark.slow
def test_first_jax_calls_from_two_threads_both_take_the_kernel():
    """A thread's first call on JAX arrays while another thread is importing the JAX adapter
    waits for its kernels rather than take the reference (whose numbers differ)."""
    pytest.importorskip("jax")
    env = {**os.environ, "PYTHONPATH": child_pythonpath(SRC.parent)}
    proc = subprocess.run([sys.executable, "-c", FIRST_JAX_CALLS], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "[True, True]", proc.stdout


@pytest.mark.parametrize("name", sorted(_calls()))
def test_bitwise_reproducible(name):
    call = _calls()[name]
    assert call().tobytes() == call().tobytes()


def _run(env, out, prefix=(), cases=()):
    proc = subprocess.run([*prefix, sys.executable, str(RUNNER), str(out), *cases], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, dict(np.load(out))


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.slow
def test_cold_and_warm_process_agree_with_numba_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    cold_log, cold = _run(env, tmp_path / "cold.npz")
    assert any(cache.rglob("*.nbi")), "the cold run wrote no Numba cache index"
    warm_log, warm = _run(env, tmp_path / "warm.npz")
    _same(cold, warm)
    assert "numba" in cold_log or "cpu" in cold_log, cold_log


def _read_only_view(site, mount):
    """A command prefix that runs the child with ``site`` visible read-only at ``mount``.

    Root ignores file permissions, so as root the copy is bind-mounted read-only in a
    private mount namespace; otherwise removing the write bits is enough.
    """
    if os.geteuid() != 0:
        for path in [site, *site.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        return site, ()
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a read-only directory")
    mount.mkdir()
    bind = f'mount --bind "{site}" "{mount}" && mount -o remount,ro,bind "{mount}"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f'{bind} && ! touch "{mount}/.probe" 2>/dev/null'], capture_output=True, text=True)
    if probe.returncode != 0:  # (a container or VM that refuses the mount, or ignores ro)
        pytest.skip(f"running as root where a read-only bind mount cannot be made: {probe.stderr.strip()[-200:]}")
    return mount, ("unshare", "-m", "sh", "-c", f'{bind} && exec "$0" "$@"')


@pytest.mark.slow
def test_read_only_package_directory(tmp_path):
    # The package in a directory this process cannot write: Numba must fall back to a
    # user cache directory instead of failing, and compute the same numbers.
    site = tmp_path / "site"
    shutil.copytree(SRC, site / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    path, prefix = _read_only_view(site, tmp_path / "ro")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=child_pythonpath(path), HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "user-cache"))
    # The Toeplitz kernels compile in seconds; the cold/warm test above covers the rotation.
    log, ro = _run(env, tmp_path / "ro.npz", prefix, cases=("t5_bias",))
    assert f"posenc from {path}" in log and "posenc._kernels" in log, log
    assert not any(site.rglob("*.nbi")), "Numba wrote into the read-only package"
    _, here = _run({**os.environ}, tmp_path / "here.npz", cases=("t5_bias",))
    _same(ro, here)


@pytest.mark.slow
def test_no_writable_cache_directory_anywhere(tmp_path):
    # A read-only package, no NUMBA_CACHE_DIR and a home without a writable cache directory
    # (a read-only container): the kernels compile without Numba's cache, said once, and
    # compute the same numbers.
    site = tmp_path / "site"
    shutil.copytree(SRC, site / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    path, prefix = _read_only_view(site, tmp_path / "ro")
    (tmp_path / "file").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=child_pythonpath(path), HOME=str(tmp_path / "file"), XDG_CACHE_HOME=str(tmp_path / "file" / "cache"))
    cases = ("rope", "t5_bias")
    proc = subprocess.run([*prefix, sys.executable, str(RUNNER), str(tmp_path / "ro.npz"), *cases], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Numba finds no writable cache directory") == 1, proc.stderr
    assert not any(site.rglob("*.nbi"))
    _, here = _run({**os.environ}, tmp_path / "here.npz", cases=cases)
    _same(dict(np.load(tmp_path / "ro.npz")), here)
    if importlib.util.find_spec("jax") is not None:  # jax.jit's handler, compiled without the cache too
        proc = subprocess.run([*prefix, sys.executable, "-c", JITTED_ROPE], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and proc.stdout.strip() == "True", (proc.stdout, proc.stderr[-3000:])
    if importlib.util.find_spec("numba_cuda") is not None:  # the CUDA kernels' modules (no GPU needed to import them)
        proc = subprocess.run([*prefix, sys.executable, "-c", CUDA_MODULES], env={**env, "NUMBA_ENABLE_CUDASIM": "0"}, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and proc.stdout.strip() == "imported", (proc.stdout, proc.stderr[-3000:])
        assert proc.stderr.count("Numba finds no writable cache directory") == 1, proc.stderr


CUDA_MODULES = """
import logging
logging.basicConfig()
import posenc._kernels.rope_cuda, posenc._kernels.toeplitz_cuda, posenc._kernels.buckets_cuda
print("imported")
"""


JITTED_ROPE = """
import jax, jax.numpy as jnp, numpy as np
import posenc as pe
x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 4, 8)).astype(np.float32))
print(np.asarray(jax.jit(lambda y: pe.rope(y, offset=3))(x)).tobytes() == np.asarray(pe.rope(x, offset=3)).tobytes())
"""
