"""The GPU health unit: the unit (unit.py), its signals (rules.py, pure), remediation (machine.py,
pure; its steps: executor.py), DRA device taints (dra.py) and its metrics (metrics.py)."""

from gpu_operator.controllers.units.health.unit import HealthUnit

__all__ = ["HealthUnit"]
