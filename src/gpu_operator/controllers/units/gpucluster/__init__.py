"""The GPUCluster unit: the unit (unit.py) and its reconcile of the DRA stack (reconcile.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.gpucluster.unit import GPUClusterUnit

__all__ = ["GPUClusterUnit", "build"]


def build(parts: UnitParts) -> GPUClusterUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return GPUClusterUnit(parts.kube, parts.settings, parts.model, parts.images)
