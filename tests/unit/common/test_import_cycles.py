"""No import cycle inside any service or `alnair.common`.

Every import counts: at module level, inside a function, and under `if TYPE_CHECKING:` (a
cycle hidden from the interpreter is still two modules that cannot be understood, moved or
tested apart). The imports are read with the standard library's `ast`, not by importing, so
the test sees what the source says. import-linter's layer contracts (`make lint`) keep the
floors; this keeps every module of a floor from leaning on another that leans back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [*sorted((ROOT / "libs").glob("*/src")), *sorted((ROOT / "services").glob("*/src"))]


def _modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `src`."""
    out = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(name: str, path: Path) -> Iterator[str]:
    """Every module name `path` imports, wherever the import statement stands (an imported
    name may itself be a submodule: `from pkg import mod`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def import_graph(modules: dict[str, Path], scope: str) -> dict[str, set[str]]:
    """Module -> the modules of `scope` (a service's or common's package) it imports."""
    inside = {m for m in modules if m == scope or m.startswith(scope + ".")}
    return {m: {t for t in _imported(m, modules[m]) if t in inside and t != m} for m in inside}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _scopes() -> Iterator[tuple[str, dict[str, Path]]]:
    for src in SOURCES:
        modules = _modules(src)
        for top in sorted({m.split(".")[1] for m in modules if m.count(".") >= 1}):
            yield f"alnair.{top}", modules


@pytest.mark.parametrize(("scope", "modules"), list(_scopes()), ids=lambda v: str(v)[:40])
def test_no_import_cycle_inside(scope: str, modules: dict[str, Path]) -> None:
    found = cycles(import_graph(modules, scope))
    assert found == [], f"import cycles inside {scope}: {found}"


def test_every_service_and_common_is_read() -> None:
    scopes = {scope for scope, _ in _scopes()}
    assert scopes >= {
        "alnair.common",
        "alnair.deviceplugin",
        "alnair.elastic",
        "alnair.predictor",
        "alnair.profiler",
        "alnair.scheduler",
    }


def test_a_cycle_through_type_checking_or_a_function_is_found(tmp_path: Path) -> None:
    """The detector itself: a relative import under TYPE_CHECKING and one inside a function
    close two cycles; a module that imports only downwards is in none."""
    pkg = tmp_path / "alnair" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import H\n"
    )
    (pkg / "high.py").write_text("from alnair.demo.low import L\n")
    (pkg / "a.py").write_text("def f():\n    from alnair.demo import b\n")
    (pkg / "b.py").write_text("import alnair.demo.a\n")
    (pkg / "top.py").write_text("from alnair.demo import a, low\n")
    graph = import_graph(_modules(tmp_path), "alnair.demo")
    assert cycles(graph) == [
        ["alnair.demo.a", "alnair.demo.b"],
        ["alnair.demo.high", "alnair.demo.low"],
    ]
