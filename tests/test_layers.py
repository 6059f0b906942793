"""The package's imports run downwards only, and none closes a circle.

Layers, from the ground up: core (namespaces, validation, the kernel registry, plan
caches) <- families (absolute, relative, rotary, attention: each owning its references and
plan keys) <- kernels (``_kernels``: Numba CPU and CUDA) <- the package's face
(``posenc/__init__``) <- adapters (torch, JAX, Dask, Flax: they register into the layers below)
<- tools (CLI, benchmarks, figures, demos). Every import statement of ``src/posenc`` is
read (module level and inside functions alike); a name loaded by ``"module:function"``
strings (the registry's loaders, ``_dispatch.ADAPTERS``) is not an import. The kernel layer
imports no JAX or Dask: their bridges are the adapters ``posenc._jax`` and ``posenc._dask``.
"""

from __future__ import annotations

import ast
import pathlib

import posenc

ROOT = pathlib.Path(posenc.__file__).parent
CORE = {"_compat", "_xp", "_validate", "_dispatch", "_plans", "_doublefloat", "_device_constants", "_built"}
FAMILIES = {"absolute", "relative", "rotary", "attention"}
ADAPTERS = {"torch", "jax", "flax", "_jax", "_dask"}
FRAMEWORKS_OF_ADAPTERS = {"jax", "jaxlib", "flax", "dask", "distributed"}  # imported by adapters only
LAYERS = ("core", "families", "kernels", "face", "adapters", "tools")
# A family's plan builders stand on the kernel layer beside ``_kernels/rope_plan.py``: they
# launch what the registry chose; the family's keys (``_signatures.py``) name them as strings.
PLAN_BUILDERS = {"posenc.relative._decode", "posenc.relative._logits_plan", "posenc.rotary._tables_plan"}


def _modules():
    """``{module name: (path, is a package)}`` of every file of the package."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _imported(modules, name):
    """``[(imported module, line)]``: every import statement of module ``name``, its
    targets made absolute (a posenc name: the posenc module it loads)."""
    path, package = modules[name]
    here = name.split(".") if package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("posenc"):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
            found.append((target, node.lineno))
    return found


def _imports(modules):
    """``{module: {(imported posenc module, line)}}``: every import of a posenc module."""
    return {name: {(t, line) for t, line in _imported(modules, name) if t.startswith("posenc") and t != name} for name in modules}


def layer(module):
    parts = module.split(".")
    if module == "posenc":
        return LAYERS.index("face")
    top = parts[1]
    if parts[-1] == "_demo" or top not in CORE | FAMILIES | ADAPTERS | {"_kernels"}:
        return LAYERS.index("tools")
    if top in CORE:
        return LAYERS.index("core")
    if module in PLAN_BUILDERS:
        return LAYERS.index("kernels")
    if top in FAMILIES:
        return LAYERS.index("families")
    if top in ADAPTERS:
        return LAYERS.index("adapters")
    return LAYERS.index("kernels")


def _circles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = {m: sorted({t for t, _ in e}) for m, e in edges.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


MODULES = _modules()
EDGES = _imports(MODULES)


def test_the_reader_sees_the_package():
    assert {"posenc._dispatch", "posenc.rotary.apply", "posenc._kernels.rope_cpu", "posenc.torch.hf"} <= set(EDGES)
    # a relative import of a module, and one inside a function
    assert "posenc._dispatch" in {t for t, _ in EDGES["posenc.rotary.apply"]}
    assert "posenc.rotary._call" in {t for t, _ in EDGES["posenc._kernels.rope_plan"]}
    assert layer("posenc._xp") < layer("posenc.rotary.apply") < layer("posenc._kernels.rope_cpu") < layer("posenc") < layer("posenc.torch.hf") < layer("posenc.cli")
    assert layer("posenc._jax.cpu") == layer("posenc._dask") == layer("posenc.torch._ops") == LAYERS.index("adapters")
    # imports of other libraries, one inside a function
    assert "jax" in {t for t, _ in _imported(MODULES, "posenc._jax.cpu")}
    assert "dask.array" in {t for t, _ in _imported(MODULES, "posenc._dask")}


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{m} ({LAYERS[layer(m)]}) line {line} imports {t} ({LAYERS[layer(t)]})"
        for m, e in sorted(EDGES.items())
        for t, line in sorted(e)
        if layer(t) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_the_kernel_layer_imports_no_framework_of_an_adapter():
    """No kernel module imports JAX, Flax or Dask: the code that needs one is an adapter's
    (``posenc._jax``, ``posenc._dask``). (Below the kernels, the namespaces and validation
    read JAX arrays through the Array API, as they read every library's.)"""
    found = [
        f"{m} line {line} imports {t}"
        for m in sorted(MODULES)
        if layer(m) == LAYERS.index("kernels")
        for t, line in _imported(MODULES, m)
        if t.partition(".")[0] in FRAMEWORKS_OF_ADAPTERS
    ]
    assert not found, "\n".join(found)


def test_no_import_circle():
    assert not _circles(EDGES), _circles(EDGES)


def test_the_circle_finder_finds_circles():
    edges = {"a": {("b", 1)}, "b": {("c", 1)}, "c": {("a", 1)}, "d": {("a", 1)}}
    assert _circles(edges) == [["a", "b", "c"]]
