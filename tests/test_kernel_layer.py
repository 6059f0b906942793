"""The kernel layer's own machinery: specialisations built once and announced when slow,
``warmup``, the CPU thread runner, the GPU stream policy, and the call path of ``pe.rope``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import posenc as pe
from arrays import child_pythonpath
from posenc._kernels import _arrays, _family, _layout, warmup

# ---------------------------------------------------------------- Family


def _family_of(build, name):
    family = _family.Family(name, build, [("a",), ("b",)], lambda key: {"float32"})
    _family.FAMILIES.pop(name)  # keep warmup's registry to the real families
    return family


def test_each_key_is_built_once_even_from_many_threads():
    calls = []

    def build(key):
        calls.append(key)
        time.sleep(0.01)
        return f"kernel {key}"

    family = _family_of(build, "test-once")
    threads = [threading.Thread(target=lambda: family["a"]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert family["a"] == "kernel a" and calls == ["a"]


def test_a_slow_build_is_announced_once_and_a_fast_one_not(monkeypatch, caplog):
    monkeypatch.setattr(_family, "NOTICE_AFTER", 0.05)
    family = _family_of(lambda key: time.sleep(0.5) or key, "test-slow")
    with caplog.at_level(logging.WARNING, logger="posenc"):
        family["a"]
        family["a"]
    notices = [r.getMessage() for r in caplog.records if r.name == "posenc"]
    assert len(notices) == 1 and "compiling the Numba kernel test-slow[a]" in notices[0] and "posenc warmup" in notices[0]
    caplog.clear()
    monkeypatch.setattr(_family, "NOTICE_AFTER", 5.0)
    with caplog.at_level(logging.WARNING, logger="posenc"):
        family["b"]
    assert not caplog.records


def test_a_cold_compile_says_so_on_stderr_and_a_cache_load_is_no_compile(tmp_path):
    # A compile takes 0.4-2 s depending on the machine, a cache load a few milliseconds: the
    # notice threshold is lowered between the two, so the test does not depend on the machine.
    code = (
        "import numpy as np, posenc as pe; from posenc._kernels import _family; _family.NOTICE_AFTER = 0.1;"
        "pe.rope(np.ones((2, 3, 4), np.float64), layout='interleaved');"
        "print([(str(b), b.compiled) for b in _family.BUILDS])"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "posenc: compiling the Numba kernel rope_cpu[rotate, float64, interleaved]" in cold.stderr
    assert cold.stderr.count("posenc:") == 1
    assert cold.stdout.strip() == "[('rope_cpu[rotate, float64, interleaved]', True)]"
    assert "compiling" not in warm.stderr
    assert warm.stdout.strip() == "[('rope_cpu[rotate, float64, interleaved]', False)]"


@pytest.mark.parametrize("helper", ["_pairs.py", "_codec.py"])
def test_an_edit_to_a_helper_module_recompiles_the_cached_kernels_that_inline_it(tmp_path, helper):
    """Numba's cache checks a kernel's own file only; the helpers' digest in each kernel's
    closure (``_family.source_digest``) makes an edit to ``_pairs.py`` or ``_codec.py``
    recompile the kernels that inline it, and only those."""
    import shutil

    package = tmp_path / "src" / "posenc"
    shutil.copytree(Path(pe.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import numpy as np, torch, posenc as pe; from posenc import _dispatch; from posenc._kernels import _family;"
        "pe.rope(torch.ones(2, 3, 8, dtype=torch.bfloat16));"
        "_dispatch.call('toeplitz_scatter', np.ones((1, 2, 3)), np.array([0, 1, 2, 1]), 3);"
        "print(sorted((str(b), b.compiled) for b in _family.BUILDS))"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": child_pythonpath(tmp_path / "src")}

    def builds():
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return dict(eval(run.stdout))

    assert all(builds().values())  # cold: everything compiles
    assert not any(builds().values())  # warm: everything loads
    with open(package / "_kernels" / helper, "a") as f:
        f.write("\n# an edit\n")
    rotation, scatter = builds().values()
    assert (rotation, scatter) == ((True, False) if helper == "_pairs.py" else (False, True))


def test_the_cuda_rotation_keys_its_cache_on_every_helper_module_it_inlines(monkeypatch):
    """The numba.cuda rotation inlines ``_codec``, ``_codec_f32`` (through ``_codec_cuda``) and
    ``_codec_cuda``: each kernel's closure holds the digest of all three, so an edit to any
    recompiles it rather than loading a stale kernel from Numba's cache."""
    pytest.importorskip("numba.cuda")
    from numba import cuda

    from posenc._kernels import _codec, _codec_cuda, _codec_f32, _family, rope_cuda

    digested = []
    monkeypatch.setattr(_family, "source_digest", lambda *modules: digested.append(modules) or 0)
    monkeypatch.setattr(cuda, "jit", lambda *args, **options: (lambda fn: fn))
    for key in [("rotate", "bfloat16", "half"), ("apply", "float32", rope_cuda.WORDS_LAYOUT)]:
        rope_cuda._build(*key)
    assert len(digested) == 2 and all({_codec, _codec_f32, _codec_cuda} <= set(modules) for modules in digested)


def _uncached_compiles(source):
    """``(line, text)`` of each Numba compile in ``source`` that is neither an inlined helper
    (``njit(inline="always")``: compiled into the kernels that call it) nor ``_family``'s
    (``jitted``/``cached``, which pass ``cache=True``): a decorator ``@njit``/``@cuda.jit``,
    or a call ``njit(...)``/``cuda.jit(...)`` without ``cache=True``."""
    import ast

    def is_jit(node):
        return (isinstance(node, ast.Name) and node.id in ("njit", "jit")) or (isinstance(node, ast.Attribute) and node.attr == "jit")

    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        decorators = node.decorator_list if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
        found += [(d.lineno, ast.unparse(d)) for d in decorators if is_jit(d)]  # bare: @njit, @cuda.jit
        if isinstance(node, ast.Call) and is_jit(node.func):
            options = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if options.get("inline") != "'always'" and options.get("cache") != "True":
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_kernel_is_kept_in_numbas_cache():
    """The guide's ``cache=True`` for every kernel of ``posenc._kernels``, CPU and CUDA: each is
    built through ``_family.jitted``/``_family.cached`` (or inlined into one that is), so a
    second process loads it in milliseconds instead of compiling it again. (``_family.jitted``
    itself compiles without the cache only where Numba has no directory to keep it in.)"""
    package = Path(pe.__file__).parent / "_kernels"
    found = {path.name: _uncached_compiles(path.read_text()) for path in sorted(package.glob("*.py")) if path.name != "_family.py"}
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert _uncached_compiles("@cuda.jit\ndef k(a):\n    pass\n") and _uncached_compiles("k = njit(nogil=True)(f)\n")
    assert not _uncached_compiles("f = njit(inline='always')(g)\nk = _family.jitted(njit, f, sig, nogil=True)\n")


def test_a_failed_build_propagates_and_is_tried_again_next_time():
    attempts = []

    def build(key):
        attempts.append(key)
        if len(attempts) == 1:
            raise ZeroDivisionError("first try")
        return "kernel"

    family = _family_of(build, "test-fail")
    with pytest.raises(ZeroDivisionError):
        family["a"]
    assert family["a"] == "kernel" and attempts == ["a", "a"]


# ---------------------------------------------------------------- warmup


def test_warmup_builds_what_the_plan_lists():
    plan = warmup.plan("float32", gpu=False)
    assert {f.name for f, _ in plan} == {"bias_rows_cpu", "rope_cpu", "toeplitz_cpu"}
    assert ("rotate", "float32", "half") in [key for f, key in plan if f.name == "rope_cpu"]
    assert all("bfloat16" not in key for _, key in plan)
    built = pe.warmup("float32", gpu=False)
    assert [(b.family, b.key) for b in built] == [(f.name, key) for f, key in plan]
    assert all(f[key] is not None for f, key in plan)
    again = pe.warmup("float32", gpu=False)  # already built in this process: nothing to do
    assert [(b.family, b.key, b.seconds, b.compiled) for b in again] == [(f.name, key, 0.0, False) for f, key in plan]


def test_warmup_reports_progress():
    seen = []
    pe.warmup(["float64"], gpu=False, progress=lambda done, total, built: seen.append((done, total, str(built))))
    assert [d for d, _, _ in seen] == list(range(1, len(seen) + 1)) and seen[-1][1] == len(seen)
    assert "rope_cpu[rotate, float64, half]" in [s for *_, s in seen]


def test_cli_warmup():
    from posenc import cli

    out = subprocess.run([sys.executable, "-m", "posenc.cli", "warmup", "--dtype", "float32", "--no-gpu"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "9 kernel specialisations ready" in out.stdout and "9/9" in out.stderr
    assert "warmup" in cli.build_parser().format_help()
    bad = subprocess.run([sys.executable, "-m", "posenc.cli", "warmup", "--dtype", "int8"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_demo_marks_a_step_that_compiled(monkeypatch):
    from posenc import _demo

    builds = [
        _family.Built("rope_cpu", ("rotate", "float32", "half"), 1.4, True),
        _family.Built("toeplitz_cpu", ("expand", "uint32", "C"), 0.6, False),  # a slow cache load is no compile
    ]
    monkeypatch.setattr(_family, "BUILDS", builds)
    assert _demo._compiled_since(0) == "  (includes 1.4 s compiling rope_cpu[rotate, float32, half] once; `posenc warmup` does it ahead)"
    assert _demo._compiled_since(1) == ""


# ---------------------------------------------------------------- CPU threads


@pytest.mark.parametrize("tasks, workers", [(0, 2), (1, 4), (7, 2), (100, 3)])
def test_run_tasks_covers_every_task_once(tasks, workers):
    seen = []
    lock = threading.Lock()

    def kernel(tag, first, last):
        with lock:
            seen.extend(range(first, last))

    _layout.run_tasks(kernel, ("x",), tasks, workers)
    assert sorted(seen) == list(range(tasks))


def test_run_tasks_gives_each_worker_its_own_extras():
    used = []
    _layout.run_tasks(lambda buffer, first, last: used.append((id(buffer), first, last)), (), 10, [[1], [2]])
    assert len({u[0] for u in used}) == 2 and sorted(u[1:] for u in used) == [(0, 5), (5, 10)]


def test_run_tasks_gives_back_each_pieces_result_in_order():
    assert _layout.run_tasks(lambda first, last: (first, last), (), 10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert _layout.run_tasks(lambda first, last: (first, last), (), 10, 1) == [(0, 10)]


FORKED_RUN = """
import os, signal
from posenc._kernels import _layout

def pieces():
    seen = []
    _layout.run_tasks(lambda first, last: seen.append((first, last)), (), 10, 2)
    return sorted(seen)

assert pieces() == [(0, 5), (5, 10)]  # the pool made, with its thread
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child that waits on the parent's pool ends here
    os._exit(0 if pieces() == [(0, 5), (5, 10)] else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_run_tasks_in_a_process_forked_after_the_pool_ran():
    """A forked child (multiprocessing's default start method on Linux) has none of the
    parent pool's threads: its calls get a pool of their own instead of waiting forever."""
    env = {**os.environ, "PYTHONPATH": child_pythonpath(Path(pe.__file__).parent.parent)}
    proc = subprocess.run([sys.executable, "-c", FORKED_RUN], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "child 0", (proc.stdout, proc.stderr[-3000:])


RUN_WHILE_THE_INTERPRETER_EXITS = """
import concurrent.futures
from posenc._kernels import _layout

def pieces():
    seen = []
    _layout.run_tasks(lambda first, last: seen.append((first, last)), (), 10, 3)
    return sorted(seen)

assert pieces() == [(0, 3), (3, 6), (6, 10)]  # the pool made, with its threads
def serve(k):
    print("served" if pieces() == [(0, 3), (3, 6), (6, 10)] else "wrong", flush=True)

server = concurrent.futures.ThreadPoolExecutor(1)
for k in range(5):
    server.submit(serve, k)
# (the main thread returns: the interpreter's exit drains the server's queue, once
# concurrent.futures takes no new work)
"""


def test_run_tasks_from_a_thread_serving_calls_while_the_interpreter_exits():
    """A server's thread still draining its requests once the main thread has returned: every
    call is served (the pieces the pool refuses run on the calling thread); each raised
    ``RuntimeError: cannot schedule new futures after shutdown`` before."""
    env = {**os.environ, "PYTHONPATH": child_pythonpath(Path(pe.__file__).parent.parent)}
    proc = subprocess.run([sys.executable, "-c", RUN_WHILE_THE_INTERPRETER_EXITS], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["served"] * 5, (proc.stdout, proc.stderr[-3000:])


FORKED_DURING_A_BUILD = """
import os, signal, threading
import numba
from numba.core.compiler_lock import global_compiler_lock
from posenc._kernels import _family

building, finish = threading.Event(), threading.Event()

def build(key):
    with global_compiler_lock:  # as a Numba compile holds it
        building.set()
        finish.wait()
    return key

family = _family.Family("fork_test", build, ["a", "b"], lambda key: set())
builder = threading.Thread(target=family.__getitem__, args=("a",))
builder.start()
building.wait()
threading.Timer(0.5, finish.set).start()
pid = os.fork()  # while the other thread builds: the fork waits for it
if pid == 0:
    signal.alarm(20)  # a child that waits on a lock of the parent's builder ends here
    os._exit(0 if family["b"] == "b" and numba.njit(lambda: 1)() == 1 else 1)
_, status = os.waitpid(pid, 0)
builder.join()
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_process_forked_while_another_thread_builds_a_kernel_can_build():
    """``os.fork`` while another thread compiles (a family's lock and Numba's compiler lock
    held): the fork waits for the build, so the child inherits neither lock held by a
    thread it does not have; its own builds had waited forever."""
    env = {**os.environ, "PYTHONPATH": child_pythonpath(Path(pe.__file__).parent.parent)}
    proc = subprocess.run([sys.executable, "-c", FORKED_DURING_A_BUILD], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "child 0", (proc.stdout, proc.stderr[-3000:])


def test_threads_follow_numba(monkeypatch):
    import numba

    assert _layout.threads() >= 1
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert _layout.threads() == 1
    finally:
        numba.set_num_threads(previous)


# ---------------------------------------------------------------- the call path


def test_rope_on_a_torch_tensor_enters_few_files_and_never_climbs_out_of_kernels():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 4, 16, 8)
    for _ in range(2):  # compiled or loaded, then its plan built (on a signature's second call), before tracing
        pe.rope(x)
    package = str(Path(pe.__file__).resolve().parent) + os.sep  # not the checkout's name: a clone into posenc/ has .venv/.../site-packages below it
    entered = []

    def trace(frame, event, arg):
        if event == "call":
            path = str(Path(frame.f_code.co_filename).resolve())
            if path.startswith(package):
                entered.append(path[len(package) :].replace(os.sep, "/"))

    sys.setprofile(trace)
    try:
        pe.rope(x)
    finally:
        sys.setprofile(None)
    files = list(dict.fromkeys(entered))
    assert len(files) <= 10, files
    # (Numba reports a jitted call to a profiler on Python 3.11, not on 3.12: the first frame
    # in _kernels/ is the plan's or the launcher's, whichever Python this is.)
    first_kernel = next((i for i, f in enumerate(entered) if f.startswith("_kernels/")), None)
    assert first_kernel is not None, entered
    assert all(f.startswith("_kernels/") for f in entered[first_kernel:]), entered[first_kernel:]


# ---------------------------------------------------------------- the GPU stream policy


def test_numba_device_arrays_launch_on_their_own_stream():
    if not _arrays.numba_cuda():
        pytest.skip("no GPU and no CUDA simulator")
    from numba import cuda

    a = cuda.to_device(np.zeros(3))
    stream, _ = _arrays.launch_context(a)
    assert type(stream) is type(cuda.legacy_default_stream())
    own = cuda.stream()
    b = cuda.to_device(np.zeros(3), stream=own)
    assert _arrays.launch_context(b)[0] is own


def _handle(stream):
    """A numba stream's CUDA handle as an int (a ctypes pointer, or a cuda-python ``CUstream``)."""
    handle = stream.handle
    return handle.value if hasattr(handle, "value") else int(handle)


def test_torch_cuda_tensors_launch_on_torch_s_current_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not _arrays.numba_cuda() or _arrays.cuda_simulator():
        pytest.skip("needs a CUDA GPU")
    x = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        stream, _ = _arrays.launch_context(x)
    assert _handle(stream) == side.cuda_stream
    stream, _ = _arrays.launch_context(x)  # the default stream, handle 0: CUDA's legacy default stream
    from numba import cuda

    assert _handle(stream) == _handle(cuda.legacy_default_stream())


def test_a_bias_validates_its_lengths_once_and_its_launcher_guards_them_once(monkeypatch):
    from posenc import _validate

    seen = []
    integer = _validate.integer

    def counting(name, value, **kwargs):
        seen.append(name)
        return integer(name, value, **kwargs)

    monkeypatch.setattr(_validate, "integer", counting)
    pe.t5_bias(np.zeros((32, 2), np.float32), 5, 7)
    assert seen.count("q_len") == seen.count("k_len") == 2  # the public function, the launcher guard
