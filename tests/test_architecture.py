"""The package's shape: data flows one way (no import cycle between dlpack's modules)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import dlpack

ROOT = Path(dlpack.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["dlpack", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """dlpack modules ``path`` imports anywhere (also inside functions), except under TYPE_CHECKING."""
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


def test_import_graph_has_no_cycle() -> None:
    graph = _graph()
    # A package's __init__ re-exports its modules; edges into a package mean "one of its modules".
    for name in list(graph):
        if name != "dlpack":
            graph[name].discard("dlpack")
    assert "dlpack.loader" in graph and "dlpack.backends.base" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_lower_layers_do_not_import_higher_ones() -> None:
    graph = _graph()
    low = {"dlpack.errors", "dlpack.schema", "dlpack.manifest", "dlpack.transforms.functional", "dlpack.loader"}
    pack = {name for name in graph if name == "dlpack.pack" or name.startswith("dlpack.pack.")}
    assert {"dlpack.pack", "dlpack.pack.write", "dlpack.pack.publish"} <= pack
    high = {"dlpack.dataset", "dlpack.cli", "dlpack.bench", "dlpack.torch"} | pack

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
    assert not (reach("dlpack.backends") & (pack | {"dlpack.dataset", "dlpack.loader"}))
    # The worker pool and progress helpers serve every stage, and know nothing of the build.
    assert not (reach("dlpack._parallel") & high)


def test_the_schema_imports_nothing_of_dlpack() -> None:
    """Every layer asks dlpack.schema what the store's arrays are, so it sits below them all."""
    assert _graph()["dlpack.schema"] == set()
    for module in ("dlpack.manifest", "dlpack.backends.base", "dlpack.dataset"):
        assert "dlpack.schema" in _graph()[module], module
