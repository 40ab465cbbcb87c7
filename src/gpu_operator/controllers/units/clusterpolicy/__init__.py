"""The ClusterPolicy unit: the unit (unit.py), its reconcile (reconcile.py) and what only it does: the
KubeVirt sync (kubevirt.py), the namespace's pod security labels (podsecurity.py), the GPU nodes
whose container runtime no toolkit serves (runtimes.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.clusterpolicy.unit import ClusterPolicyUnit

__all__ = ["ClusterPolicyUnit", "build"]


def build(parts: UnitParts) -> ClusterPolicyUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return ClusterPolicyUnit(parts.kube, parts.settings, parts.model, parts.images, parts.labels_first)
