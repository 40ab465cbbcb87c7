"""The NVIDIADriver unit: the unit (unit.py) and its reconcile of per-pool driver DaemonSets
(reconcile.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.nvidiadriver.unit import NVIDIADriverUnit

__all__ = ["NVIDIADriverUnit", "build"]


def build(parts: UnitParts) -> NVIDIADriverUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return NVIDIADriverUnit(parts.kube, parts.settings, parts.model, parts.images)
