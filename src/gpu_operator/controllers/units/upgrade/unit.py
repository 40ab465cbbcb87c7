"""The driver upgrade unit: the state machine (controllers/units/upgrade/controller.py) for the ClusterPolicy, or
for each NVIDIADriver on its own nodes (controllers/units/upgrade/owners.py).

A pass lists every node and driver pod, so not every node event kicks it: label-only changes
(thousands while a policy labels its nodes) do not; a new or deleted node, its upgrade state or
skip label, its annotations, its cordon or readiness do, as do driver pods (a new driver
DaemonSet revision starts upgrades), owned objects and our CRs. Held back while a new policy's
labels are written (`labels_first`)."""

from __future__ import annotations

from collections.abc import Callable

from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER, NVIDIA_DRIVER
from gpu_operator.controllers.gpuholders import runtime_access
from gpu_operator.controllers.loop import Event, EventKind, NodeEvent, Result, UnitBase
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.upgrade.controller import UpgradeController
from gpu_operator.controllers.units.upgrade.owners import upgrade_owners
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import UPGRADE_SKIP, UPGRADE_STATE

WANTED = frozenset({EventKind.OWNED, EventKind.DRIVER_POD})
WANTED_CRS = (CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)
UpgradeFacts = tuple[str | None, str | None, tuple[tuple[str, str], ...], bool, bool]


def upgrade_facts(view: NodeView) -> UpgradeFacts:
    """What the state machine reads of a node besides its driver pod."""
    return (
        view.labels.get(UPGRADE_STATE),
        view.labels.get(UPGRADE_SKIP),
        tuple(sorted(view.annotations.items())),
        view.unschedulable,
        view.ready,
    )


class UpgradeUnit(UnitBase):
    name = "driver upgrade pass"

    def __init__(
        self, kube: Kube, settings: OperatorSettings, model: ReadModel, labels_first: Callable[[], bool]
    ) -> None:
        self.model = model
        self.settings = settings
        self.labels_first = labels_first
        self.controller = UpgradeController(
            kube, model.namespace, model.nodes, settings, driver_pods=model.driver_pods
        )
        self._facts: dict[str, UpgradeFacts] = {}  # per node, what the last event showed

    def wants(self, event: Event) -> bool:
        if not isinstance(event, NodeEvent):
            return event.kind in WANTED or event.of(*WANTED_CRS)
        before = self._facts.pop(event.name, None)
        if event.view is None:
            return True
        facts = self._facts[event.name] = upgrade_facts(event.view)
        return facts != before

    async def reconcile(self) -> Result:
        if self.labels_first():
            return Result(self.settings.coalesce)
        model = self.model
        owners = upgrade_owners(
            model.active_policy(), model.drivers(), model.nodes(), dra=bool(model.gpuclusters())
        )
        return await self.controller.reconcile(owners, runtime_access(model.active_policy()))
