"""The MIG changes unit: the unit (unit.py) and its pure rules (rules.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.mig.unit import MIGUnit

__all__ = ["MIGUnit", "build"]


def build(parts: UnitParts) -> MIGUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return MIGUnit(parts.kube, parts.settings, parts.model)
