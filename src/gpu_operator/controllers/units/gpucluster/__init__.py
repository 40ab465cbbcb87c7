"""The GPUCluster unit: the unit (unit.py) and its reconcile of the DRA stack (reconcile.py)."""

from gpu_operator.controllers.units.gpucluster.unit import GPUClusterUnit

__all__ = ["GPUClusterUnit"]
