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


# Private names reached on something other than self/cls that are not a library's internals: the
# stdlib's type of os.environ (for a type hint), and one of our own objects' methods.
NOT_A_LIBRARYS = {"os._Environ", "self._guard._refused"}


def test_no_private_attributes_of_library_objects() -> None:
    """No `x._name` where x is not self or cls (a library's internals change without notice: the
    HTTP pool's `_pool._network_backend` was set once for a 2 % CPU gain), but the few listed."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                not isinstance(node, ast.Attribute)
                or not node.attr.startswith("_")
                or node.attr.startswith("__")
            ):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            if ast.unparse(node) not in NOT_A_LIBRARYS:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []
