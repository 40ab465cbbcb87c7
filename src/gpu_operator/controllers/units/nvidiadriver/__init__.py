"""The NVIDIADriver unit: the unit (unit.py) and its reconcile of per-pool driver DaemonSets
(reconcile.py)."""

from gpu_operator.controllers.units.nvidiadriver.unit import NVIDIADriverUnit

__all__ = ["NVIDIADriverUnit"]
