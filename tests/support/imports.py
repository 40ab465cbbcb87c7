"""The package's import graph, read from the source with ast: every module under src/gpu_operator
and the modules each one imports (absolute, relative, `from x import module`, function-level too)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "gpu_operator").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def references(name: str, path: Path, known: dict[str, Path], *, strings: bool = False) -> set[str]:
    """Modules `name` imports; with `strings`, also module names in its string constants (a
    `-m gpu_operator.x` argv it builds)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    refs: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            refs.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            refs.add(base)
            refs.update(f"{base}.{alias.name}" for alias in node.names)
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            refs.add(node.value)
    return refs & set(known)
