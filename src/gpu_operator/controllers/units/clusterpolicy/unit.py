"""The ClusterPolicy unit: the reconcile (controllers/units/clusterpolicy/reconcile.py) of the active policy,
kicked by every event but a driver pod's or a NodeFeature's (neither changes what it renders or
its status), an edit of the devicePlugin.config ConfigMap included, and held back while a new policy's labels are written (`labels_first`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpu_operator.controllers import metrics
from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER, NVIDIA_DRIVER
from gpu_operator.controllers.loop import Event, EventKind, NodeEvent, Result, UnitBase
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy.reconcile import ClusterPolicyReconciler
from gpu_operator.kube.client import Kube

WANTED = frozenset({EventKind.OWNED, EventKind.PLUGIN_CONFIG})
WANTED_CRS = (CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)


class ClusterPolicyUnit(UnitBase):
    name = "ClusterPolicy reconcile"

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        model: ReadModel,
        images: Mapping[str, str],
        labels_first: Callable[[], bool],
    ) -> None:
        self.model = model
        self.settings = settings
        self.labels_first = labels_first
        self.reconciler = ClusterPolicyReconciler(kube, settings, images)

    def wants(self, event: Event) -> bool:
        return isinstance(event, NodeEvent) or event.kind in WANTED or event.of(*WANTED_CRS)

    async def reconcile(self) -> Result:
        if self.labels_first():
            return Result(self.settings.coalesce)  # looks again after the coalescing window
        report = await self.reconciler.reconcile(self.model.snapshot())
        metrics.record_reconcile(report)
        return report

    def failed(self, err: BaseException) -> None:
        metrics.record_error()
