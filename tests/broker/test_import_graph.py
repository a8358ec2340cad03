"""The broker package's modules import each other without cycles (and each imports).

Edges are the `pygazette.broker.*` imports a module runs — at its top or inside a function,
not those only a type checker follows (under `if TYPE_CHECKING:`) — in every module under
`pygazette/broker/`, subpackages included.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pygazette.broker

PACKAGE = "pygazette.broker"
ROOT = Path(pygazette.broker.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([PACKAGE, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `module` imports when it runs."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)
            return
        for name in names:
            # The deepest known module the name refers to (`a.b.c` may be a.b's attribute).
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name != PACKAGE:
                out.add(name)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done.
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_every_broker_module_imports() -> None:
    for module in _modules():
        importlib.import_module(module)


def test_broker_modules_import_without_cycles() -> None:
    modules = _modules()
    known = set(modules)
    graph = {m: _imports(m, p, known) for m, p in modules.items()}
    assert graph[f"{PACKAGE}.append_fsm"], "the import graph was not read"
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
