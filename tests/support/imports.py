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
    """Modules `name` imports (the import statements `./dev test --changed` reads too:
    tools/changed_tests.imported); with `strings`, also module names in its string constants (a
    `-m gpu_operator.x` argv it builds)."""
    from tools.changed_tests import imported

    tree = ast.parse(path.read_text())
    refs = imported(tree, name, path.as_posix())
    if strings:
        refs.update(
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
    return refs & set(known)
