"""No two modules of the package import each other, however indirectly.

An import counts wherever it is written: at the top, deferred into a function, or under
``if TYPE_CHECKING:`` (a type-only import still ties the two modules for a reader, and one
made real later is a cycle at import time). A package's ``__init__`` re-exports its modules,
so every module of it would seem to import its package: ``__init__`` modules are left out of
the search, as the cycles that matter for reading are between the modules that hold code.
The scan reads the syntax tree, so a docstring may name any module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cronlock

PACKAGE = Path(cronlock.__file__).resolve().parent


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package under ``root`` and the package's modules it imports."""
    paths = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets.add(module)
                targets.update(f"{module}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in paths and t != name}
    inits = {n for n, p in paths.items() if p.name == "__init__.py"}
    return {n: targets - inits for n, targets in graph.items() if n not in inits}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm; the
    recursion is as deep as the longest import chain, a few dozen modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 60  # the whole package, subpackages included
    assert cycles(graph) == []


def test_the_queue_writes_to_observe_below_it_and_the_readers_sit_above() -> None:
    # What the queue and the runs record into (stats, trace hooks, the serving rule) imports
    # nothing of the queue's, the runs' or the App's; what reads the App (the overview,
    # slots) is imported by neither.
    graph = import_graph(PACKAGE)
    above = ("cronlock.queue", "cronlock.periodic", "cronlock.app")
    for below in ("stats", "tracehooks", "serving"):
        assert not {t for t in graph[f"cronlock.observe.{below}"] if t.startswith(above)}
    readers = {"cronlock.observe.overview", "cronlock.observe.slots"}
    assert "cronlock.app" in graph["cronlock.observe.overview"]
    users = {n for n, targets in graph.items() if targets & readers}
    assert all(not n.startswith(("cronlock.queue", "cronlock.app")) for n in users), users


def test_the_scan_sees_deferred_and_type_only_cycles(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from . import a\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from .b import g\n")  # deferred
    (root / "b.py").write_text("from .sub import c\n")
    (root / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    (root / "d.py").write_text("import pkg.a\n")  # imports into the cycle, not part of it
    assert import_graph(root)["pkg.b"] == {"pkg.sub.c"}
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
