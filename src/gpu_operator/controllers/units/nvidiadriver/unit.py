"""The NVIDIADriver unit: one level-based reconcile of every NVIDIADriver (routing needs them
all; controllers/units/nvidiadriver/reconcile.py), kicked by nodes, driver pods, our CRs and owned objects, and
idle while there is no NVIDIADriver (node bursts then cost nothing here)."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER, NVIDIA_DRIVER
from gpu_operator.controllers.loop import Event, EventKind, NodeEvent, Result, UnitBase
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.nvidiadriver.reconcile import NVIDIADriverReconciler
from gpu_operator.kube.client import Kube

WANTED = frozenset({EventKind.OWNED, EventKind.DRIVER_POD})
WANTED_CRS = (CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)


class NVIDIADriverUnit(UnitBase):
    name = "NVIDIADriver reconcile"

    def __init__(
        self, kube: Kube, settings: OperatorSettings, model: ReadModel, images: Mapping[str, str]
    ) -> None:
        self.model = model
        self.reconciler = NVIDIADriverReconciler(kube, settings, images)

    def wants(self, event: Event) -> bool:
        return isinstance(event, NodeEvent) or event.kind in WANTED or event.of(*WANTED_CRS)

    def idle(self) -> bool:
        return not self.model.drivers()

    async def reconcile(self) -> Result:
        return await self.reconciler.reconcile(self.model.snapshot())
