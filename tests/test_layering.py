"""The layers of DESIGN.md: each package of pygazette imports only packages above it in the
list (at module level or inside functions alike), and the CLI entry point loads neither the
broker nor Spark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pygazette"

# Each layer and the layers it may use (DESIGN.md, "Layers").
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "auth": {"protocol"},
    "stores": {"protocol"},
    "keyspace": {"protocol", "auth"},
    "allocator": {"protocol", "auth", "keyspace"},
    "broker": {"protocol", "auth", "stores", "keyspace", "allocator"},
    "client": {"protocol", "auth", "stores"},
    "message": {"protocol", "auth", "stores", "client"},
    "consumer": {"protocol", "auth", "stores", "keyspace", "allocator", "client", "message"},
    "gateway": {"protocol", "auth", "stores", "client"},
    "spark": {"protocol", "auth", "stores", "client", "message"},
    "cli": {
        "protocol",
        "auth",
        "stores",
        "keyspace",
        "allocator",
        "broker",
        "client",
        "message",
        "consumer",
        "gateway",
        "spark",
    },
}


def _imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    layers: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "pygazette" and len(parts) > 1:
                layers.add(parts[1])
    return layers


def test_every_module_belongs_to_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages == set(ALLOWED), "a package missing from DESIGN.md's layers"
    strays = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert strays == [], "modules outside any layer"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_upward_imports(layer: str) -> None:
    bad = {}
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        if "/pb/" in str(path):
            continue
        upward = _imported_layers(path) - ALLOWED[layer] - {layer}
        if upward:
            bad[str(path.relative_to(PACKAGE))] = sorted(upward)
    assert bad == {}
