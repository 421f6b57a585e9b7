"""The package's shape: data flows one way, between modules and between the parts (layers) of the
package, and the read side never loads the write side."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dlpack

ROOT = Path(dlpack.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["dlpack", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The dlpack modules ``path`` imports anywhere (also inside functions), except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dlpack")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "dlpack":
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    """Each dlpack module and the dlpack modules it imports: every module parsed once per run."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: frozenset(d for d in _imports(path) if d in files and d != name) for name, path in files.items()}


def _graph() -> dict[str, set[str]]:
    """A copy of the import graph, the caller's to change."""
    return {name: set(deps) for name, deps in _parsed_graph().items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state:
                found = dfs(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


#: The parts of the package, bottom to top: a module may import its own part and the parts below it.
#: Parts are folders, except the HALCON folder: it is one home for the reader of the code, and each of
#: its modules serves one layer (a DLDataset source is a source, its view is read side, ...).
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ground",
        (
            "dlpack.errors",
            "dlpack.schema",
            "dlpack.manifest",
            "dlpack.ragged",
            "dlpack.timing",
            "dlpack._*",
        ),
    ),
    ("transforms", ("dlpack.transforms",)),
    ("backends", ("dlpack.backends",)),
    # Above the registries it checks names against (formats, augmentation engines, online layer).
    ("options", ("dlpack.options",)),
    ("storage", ("dlpack.storage",)),
    ("sources", ("dlpack.sources", "dlpack.halcon.source")),
    ("read", ("dlpack.read", "dlpack.halcon.view")),
    ("pack", ("dlpack.pack",)),
    ("variants", ("dlpack.variants",)),
    ("exports", ("dlpack.exports", "dlpack.halcon.export", "dlpack.halcon.hdict", "dlpack.halcon.build")),
    ("adapters", ("dlpack.torch", "dlpack.halcon", "dlpack.halcon.feeder")),
    ("tools", ("dlpack.bench", "dlpack.tuning")),
    ("face", ("dlpack", "dlpack.cli", "dlpack.__main__", "dlpack.sample", "dlpack.testing", "dlpack.building")),
)
RANK = {name: i for i, (name, _) in enumerate(PARTS)}
#: The write side: the build pipeline and the augmentation cache's build stage.
WRITE = {"pack", "variants"}
#: The read side: what a training process loads (the store, the loader, the views, the adapters).
READ = {"read", "adapters"}


def _part(module: str) -> str:
    """The part ``module`` belongs to: the longest prefix named in PARTS."""
    best, length = None, -1
    for part, prefixes in PARTS:
        for prefix in prefixes:
            if prefix.endswith("*"):
                hit = module.startswith(prefix[:-1]) and module.count(".") == 1
            else:
                hit = module == prefix or module.startswith(prefix + ".")
            if hit and len(prefix) > length:
                best, length = part, len(prefix)
    assert best is not None, f"{module} belongs to no part: add it to PARTS"
    return best


def _part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, deps in graph.items():
        parts.setdefault(_part(module), set()).update(_part(d) for d in deps if d != "dlpack")
    for part, deps in parts.items():
        deps.discard(part)
    return parts


def test_import_graph_has_no_cycle() -> None:
    graph = _graph()
    # A package's __init__ re-exports its modules; edges into a package mean "one of its modules".
    for name in list(graph):
        if name != "dlpack":
            graph[name].discard("dlpack")
    assert "dlpack.read.loader" in graph and "dlpack.backends.base" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_cycle_between_parts() -> None:
    parts = _part_graph(_graph())
    assert set(parts) == set(RANK), sorted(set(RANK) - set(parts))
    assert _cycle(parts) is None, " -> ".join(_cycle(parts) or [])


def test_parts_import_only_parts_below_them() -> None:
    graph = _graph()
    wrong = sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if dep != "dlpack" and RANK[_part(dep)] > RANK[_part(module)]
    )
    assert not wrong, "imports that climb a layer: " + "; ".join(wrong)


def test_the_read_side_never_imports_the_write_side() -> None:
    """A training process that reads a store never loads the build pipeline or the variants' build."""
    graph = _graph()
    wrong = sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if _part(module) in READ and dep != "dlpack" and _part(dep) in WRITE
    )
    assert not wrong, "; ".join(wrong)


def test_lower_layers_do_not_import_higher_ones() -> None:
    graph = _graph()
    low = {"dlpack.errors", "dlpack.schema", "dlpack.manifest", "dlpack.transforms.functional", "dlpack.read.loader"}
    pack = {name for name in graph if name == "dlpack.pack" or name.startswith("dlpack.pack.")}
    assert {"dlpack.pack", "dlpack.pack.write"} <= pack
    high = {"dlpack.read.dataset", "dlpack.cli", "dlpack.bench", "dlpack.torch"} | pack

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    for module in low:
        assert not (reach(module) & high), f"{module} reaches {sorted(reach(module) & high)}"
    assert not (reach("dlpack.backends") & (pack | {"dlpack.read.dataset", "dlpack.read.loader"}))
    # The worker pool and progress helpers serve every stage, and know nothing of the build.
    assert not (reach("dlpack._parallel") & high)


def test_the_schema_imports_nothing_of_dlpack() -> None:
    """Every layer asks dlpack.schema what the store's arrays are, so it sits below them all."""
    assert _graph()["dlpack.schema"] == set()
    for module in ("dlpack.manifest", "dlpack.backends.reader", "dlpack.read.dataset"):
        assert "dlpack.schema" in _graph()[module], module


def test_every_import_of_dlpack_names_a_module_that_exists() -> None:
    """A lazy import of a module that moved fails only when its line runs: found here instead."""
    modules = {_module_name(p) for p in ROOT.rglob("*.py")}
    missing = []
    for path in ROOT.rglob("*.py"):
        me = _module_name(path)
        package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dlpack":
                target = node.module or ""
            else:
                continue
            if target not in modules:
                missing.append(f"{me}:{node.lineno} imports {target}")
    assert not missing, "; ".join(missing)


_IMPORT_EACH = r"""
import importlib, json, os, sys
import cv2, h5py, numpy, zarr  # noqa: F401 - third-party modules loaded once, before the forks
failed = {}
for name in json.loads(sys.argv[1]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child with no dlpack module loaded yet imports just this one
        os.close(r)
        try:
            importlib.import_module(name)
            text = ""
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            kind = type(exc).__name__
            text = "" if kind == "MissingExtraError" else f"{kind}: {exc}"
        os.write(w, text.encode())
        os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    if out:
        failed[name] = out.decode()
print(json.dumps(failed))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks one child per module")
def test_every_module_imports_on_its_own() -> None:
    """Whichever module a program imports first works: an import cycle that only some orders
    trip over (a package importing one of its importers) fails here."""
    names = sorted(_module_name(p) for p in ROOT.rglob("*.py") if p.name != "__main__.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(names)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {}
