"""The GPUCluster unit: the DRA stack's reconcile (controllers/units/gpucluster/reconcile.py), kicked by our CRs
and owned objects (node changes reach it through the DaemonSets' status), idle while there is no
GPUCluster."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER, NVIDIA_DRIVER
from gpu_operator.controllers.loop import Event, EventKind, ObjectEvent, Result, UnitBase
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.gpucluster.reconcile import GPUClusterReconciler
from gpu_operator.kube.client import Kube

WANTED = frozenset({EventKind.OWNED})
WANTED_CRS = (CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)


class GPUClusterUnit(UnitBase):
    name = "GPUCluster reconcile"

    def __init__(
        self, kube: Kube, settings: OperatorSettings, model: ReadModel, images: Mapping[str, str]
    ) -> None:
        self.model = model
        self.reconciler = GPUClusterReconciler(kube, settings, images)

    def wants(self, event: Event) -> bool:
        return isinstance(event, ObjectEvent) and (event.kind in WANTED or event.of(*WANTED_CRS))

    def idle(self) -> bool:
        return not self.model.gpuclusters()

    async def reconcile(self) -> Result:
        return await self.reconciler.reconcile(self.model.snapshot())
