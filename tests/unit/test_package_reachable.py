"""Nothing only tests use lives in the shipped package: every module under src/gpu_operator is
reached from an entry point (the `gpu-operator` and `nvidia-validator` scripts) through imports
or a `python -m gpu_operator...` command line the code builds. Test support belongs in
tests/support/, dev tooling in tools/."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "gpu_operator").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _references(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules this one imports (absolute, relative, `from x import module`) or names in a string
    (a `-m gpu_operator.x` argv)."""
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            refs.add(node.value)
    return refs & set(modules)


def test_every_shipped_module_is_reached_from_an_entry_point() -> None:
    modules = _modules()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    todo = [target.partition(":")[0] for target in scripts.values()]
    assert todo and all(t in modules for t in todo), todo
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages load first
        todo += _references(name, modules[name], modules)
    unreached = sorted(set(modules) - reached)
    assert unreached == [], f"only tests or tools use {unreached}: move them to tests/support/ or tools/"
