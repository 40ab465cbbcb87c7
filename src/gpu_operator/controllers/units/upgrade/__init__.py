"""The driver upgrade unit: the unit (unit.py), the owners a pass runs for (owners.py), the pure state
machine (state.py; what it reads: facts.py) and its steps (controller.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.upgrade.unit import UpgradeUnit

__all__ = ["UpgradeUnit", "build"]


def build(parts: UnitParts) -> UpgradeUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return UpgradeUnit(parts.kube, parts.settings, parts.model, parts.labels_first)
