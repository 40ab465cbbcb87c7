"""The MIG changes unit: the unit (unit.py) and its pure rules (rules.py)."""

from gpu_operator.controllers.units.mig.unit import MIGUnit

__all__ = ["MIGUnit"]
