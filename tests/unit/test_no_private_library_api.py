"""The shipped package uses only the public API of its libraries: no private module imported, no
private attribute of a library's object reached into (lightkube's `client._client`, say)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpu_operator"
LIBRARIES = {
    "kopf",
    "lightkube",
    "prometheus_client",
    "aiohttp",
    "pydantic",
    "typer",
    "rich",
    "httpx2",
    "yaml",
}
# Private attributes our own objects use on themselves (self._x) are fine; these are the
# private names of library objects the operator once reached into.
LIBRARY_PRIVATE_ATTRIBUTES = {"_client", "_core", "_cogs", "_kits", "_value"}


def _imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_no_private_modules_of_libraries() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for name in _imports(ast.parse(path.read_text())):
            parts = name.split(".")
            if parts[0] in LIBRARIES and any(p.startswith("_") for p in parts[1:]):
                offenders.append(f"{path.relative_to(SRC)}: {name}")
    assert offenders == []


def test_no_private_attributes_of_library_objects() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in LIBRARY_PRIVATE_ATTRIBUTES:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in {"self", "cls"}):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: .{node.attr}")
    assert offenders == []
