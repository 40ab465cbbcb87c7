"""The node labelling unit: the unit (unit.py), its pure decisions (nodelabels.py, and GFD's labels
without NFD: gfdlabels.py) and the patches (labeller.py)."""

from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units.labels.unit import LabelUnit

__all__ = ["LabelUnit", "build"]


def build(parts: UnitParts) -> LabelUnit:
    """The unit the manager runs (controllers/units/__init__.py, `units`)."""
    return LabelUnit(parts.kube, parts.settings, parts.model)
