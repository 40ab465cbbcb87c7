"""The operator's controllers, one folder each (controllers/loop.py says what a unit is): the unit
(unit.py), its reconcile and its pure rules. A unit never imports another unit's modules
(tests/unit/controllers/test_units_apart.py); what they share lives at controllers/'s root.

The folders are the table of units: `unit_folders()` lists them, `units()` builds each one through
its package's `build(parts: UnitParts) -> UnitBase` (controllers/unitparts.py), which the manager
runs; a new folder is a new unit with no other edit. A unit that writes something an uninstall must
take back (on Nodes, or objects no owner reference takes away) says how in its folder's takeback.py
(`take_back`, controllers/cleanup.py's `TakeBack`); `take_backs()` is the one list of them, each
folder's that has one, which `gpu-operator cleanup` (admin/cleanup.py) runs. Nothing here names a
unit: the folders are imported by name, when called, so that importing one unit does not import
the others."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_operator.controllers.cleanup import TakeBack
    from gpu_operator.controllers.loop import UnitBase
    from gpu_operator.controllers.unitparts import UnitParts


# The folders this module imports by name, for `./dev test --changed` (tools/changed_tests.py: a file
# that names a repository path reads it): a change in a unit's folder reaches the manager's tests.
READS = "src/gpu_operator/controllers/units"


def _folders() -> dict[str, Path]:
    """Folder name -> folder, of this package's path (a test may add a folder of made-up units)."""
    return {p.name: p for root in __path__ for p in Path(root).iterdir() if (p / "__init__.py").is_file()}


def unit_folders() -> list[str]:
    """Each unit's folder name, sorted: the packages beside this module (a folder holding an
    `__init__.py`)."""
    return sorted(_folders())


def unit_package(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def units(parts: UnitParts) -> list[UnitBase]:
    """One unit per folder, built by its package's `build`, in the folders' order."""
    return [unit_package(name).build(parts) for name in unit_folders()]


def take_backs() -> tuple[TakeBack, ...]:
    """Each unit folder's take-back step (its takeback.py's `take_back`), in the order they run:
    by folder name, but a step whose module says `TAKES_OUR_ANNOTATIONS = True` (node labelling's:
    it takes our nvidia.com/ annotations) after every other, as those read the annotations that say
    whose cordon it is."""
    folders = _folders()
    steps = [
        importlib.import_module(f"{__name__}.{name}.takeback")
        for name in sorted(folders)
        if (folders[name] / "takeback.py").is_file()
    ]
    steps.sort(key=lambda module: bool(getattr(module, "TAKES_OUR_ANNOTATIONS", False)))
    return tuple(module.take_back for module in steps)
