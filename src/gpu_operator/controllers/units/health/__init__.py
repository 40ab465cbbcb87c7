"""The GPU health unit: the unit (unit.py), its signals (rules.py, pure), remediation (machine.py,
pure; what it keeps and reads of a node: remediationfacts.py; its steps: executor.py), DRA device
taints (dra.py) and its metrics (metrics.py)."""

from gpu_operator.controllers.gpuholders import runtime_access
from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.health.dra import DeviceTaints
from gpu_operator.controllers.units.health.unit import HealthUnit

__all__ = ["HealthUnit", "build"]


def build(parts: UnitParts) -> HealthUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`): it reads the read model
    through callables (nodes, one node, the active policy's health spec, how pods reach GPUs)."""
    model = parts.model
    return HealthUnit(
        model.nodes,
        model.node,
        model.health_spec,
        parts.kube,
        settings=parts.settings,
        device_taints=DeviceTaints(parts.kube, model.gpucluster_owner),
        runtime=lambda: runtime_access(model.active_policy()),
        namespace=model.namespace,
    )
