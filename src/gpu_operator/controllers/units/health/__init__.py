"""The GPU health unit: the unit (unit.py), its signals (rules.py, pure), remediation (machine.py,
pure; what it keeps and reads of a node: remediationfacts.py; its steps: executor.py), DRA device
taints (dra.py) and its metrics (metrics.py)."""

from gpu_operator.controllers.units.health.unit import HealthUnit

__all__ = ["HealthUnit"]
