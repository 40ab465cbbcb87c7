"""Nothing only tests use lives in the shipped package: every module under src/gpu_operator is
reached from an entry point (the `gpu-operator` and `nvidia-validator` scripts) through imports
or a `python -m gpu_operator...` command line the code builds, or by name from the modules a
registry finds (`BY_NAME`). Test support belongs in tests/support/, dev tooling in tools/."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.imports import modules as _modules
from tests.support.imports import references

ROOT = Path(__file__).resolve().parents[2]


def by_name() -> dict[str, list[str]]:
    """The modules a registry imports by name: the unit folders and their take-back steps
    (controllers/units/__init__.py), our kinds' api modules (api/crdgen.py, `ours()`)."""
    from gpu_operator.api import crdgen
    from gpu_operator.controllers import units

    return {
        units.__name__: [f"{units.__name__}.{name}" for name in units.unit_folders()]
        + [step.__module__ for step in units.take_backs()],
        crdgen.__name__: [module.__name__ for module in crdgen.ours()],
    }


def test_every_shipped_module_is_reached_from_an_entry_point() -> None:
    modules = _modules()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    todo = [target.partition(":")[0] for target in scripts.values()]
    assert todo and all(t in modules for t in todo), todo
    reached: set[str] = set()
    found = by_name()
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages load first
        todo += references(name, modules[name], modules, strings=True)
        todo += found.get(name, [])
    unreached = sorted(set(modules) - reached)
    assert unreached == [], f"only tests or tools use {unreached}: move them to tests/support/ or tools/"
