"""Nothing only tests use lives in the shipped package: every module under src/gpu_operator is
reached from an entry point (the `gpu-operator` and `nvidia-validator` scripts) through imports
or a `python -m gpu_operator...` command line the code builds. Test support belongs in
tests/support/, dev tooling in tools/."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.imports import modules as _modules
from tests.support.imports import references

ROOT = Path(__file__).resolve().parents[2]


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
        todo += references(name, modules[name], modules, strings=True)
    unreached = sorted(set(modules) - reached)
    assert unreached == [], f"only tests or tools use {unreached}: move them to tests/support/ or tools/"
