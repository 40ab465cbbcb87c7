"""What the manager hands every unit's `build` (each folder's `__init__.py` under controllers/units/,
found by the registry, controllers/units/__init__.py): the write client, the settings, the read
model, the operand images and `labels_first`, which says whether a unit holds the others back
(`UnitBase.holds_back`: node labelling while a new ClusterPolicy's labels are written)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import Kube


@dataclass(frozen=True)
class UnitParts:
    kube: Kube
    settings: OperatorSettings
    model: ReadModel
    images: Mapping[str, str]
    labels_first: Callable[[], bool]
