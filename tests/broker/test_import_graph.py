"""The broker's and the stores' modules import each other without cycles (and each imports).

Edges are the package's own imports a module runs — at its top or inside a function, not
those only a type checker follows (under `if TYPE_CHECKING:`) — in every module under the
package's directory, subpackages included (`pygazette/broker/fragment/`).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

# Each package checked, and a module of it that imports others of it (so that an empty
# graph, read wrong, does not pass).
PACKAGES = {
    "pygazette.broker": "pygazette.broker.append_fsm",
    "pygazette.stores": "pygazette.stores.file_store",
}


def _modules(package: str) -> dict[str, Path]:
    root = Path(importlib.import_module(package).__file__ or "").parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, known: set[str], root_package: str) -> set[str]:
    """The modules of `known` (those of `root_package`) that `module` imports when it runs."""
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
            if name and name != module and name != root_package:
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


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_module_imports(package: str) -> None:
    for module in _modules(package):
        importlib.import_module(module)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_modules_import_without_cycles(package: str) -> None:
    modules = _modules(package)
    known = set(modules)
    graph = {m: _imports(m, p, known, package) for m, p in modules.items()}
    assert graph[PACKAGES[package]], "the import graph was not read"
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_fragment_subpackage_is_in_the_graph() -> None:
    modules = _modules("pygazette.broker")
    assert "pygazette.broker.fragment" in modules
    assert "pygazette.broker.fragment.spool" in modules


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
