"""The driver upgrade unit: the unit (unit.py), the owners a pass runs for (owners.py), the pure state
machine (state.py; what it reads: facts.py) and its steps (controller.py)."""

from gpu_operator.controllers.units.upgrade.unit import UpgradeUnit

__all__ = ["UpgradeUnit"]
