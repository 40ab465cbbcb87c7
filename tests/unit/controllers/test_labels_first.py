"""Labels first: while a new ClusterPolicy's labels are being written, the units that would act on
every node (the reconcile, the driver upgrade pass) wait and look again after the coalescing
window; once the labelling unit is done, they run. The manager wires the gate."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpu_operator.controllers.customresources import CLUSTER_POLICY, CUSTOM_RESOURCES
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.loop import Result
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.labels.unit import LabelUnit
from gpu_operator.controllers.units.upgrade.unit import UpgradeUnit
from gpu_operator.controllers.views import ClusterPolicyView
from gpu_operator.kube.client import Kube


class NoKube:
    """Nothing here may reach the apiserver: the passes under test are stubbed below it."""

    http: Any = None
    streams: Any = None
    statuses_written: dict[Any, Any] = {}


def _manager(busy: list[bool], asked: list[Any]) -> tuple[Manager, list[Any]]:
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"), OperatorSettings(coalesce=0.1))
    policy = ClusterPolicyView.of(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {
                "name": "cluster-policy",
                "uid": "u1",
                "generation": 1,
                "creationTimestamp": "2026-11-26T00:00:00Z",
            },
            "spec": {},
        }
    )
    manager.model.indices.update(
        {
            **{row.index_id: {} for row in CUSTOM_RESOURCES},
            CLUSTER_POLICY.index_id: {"cluster-policy": [policy]},
        }
    )

    def labelling(active: ClusterPolicyView | None) -> bool:
        asked.append(active.name if active is not None else None)
        return busy[0]

    passes: list[Any] = []

    async def reconcile(owners: Any, access: Any = None) -> Result:
        passes.append(owners)
        return Result(600.0)

    labels = next(unit for unit in manager.units if isinstance(unit, LabelUnit))
    labels.labelling = labelling  # type: ignore[method-assign]
    upgrade = next(loop.unit for loop in manager.loops if isinstance(loop.unit, UpgradeUnit))
    upgrade.controller.reconcile = reconcile  # type: ignore[method-assign]
    return manager, passes


def test_the_driver_upgrade_pass_waits_while_a_new_policys_labels_are_written() -> None:
    labelling: list[bool] = [True]
    asked: list[Any] = []
    manager, passes = _manager(labelling, asked)
    upgrade = next(loop.unit for loop in manager.loops if isinstance(loop.unit, UpgradeUnit))

    async def one_pass() -> float | None:
        return (await upgrade.reconcile()).requeue

    assert asyncio.run(one_pass()) == 0.1  # looks again after the coalescing window
    assert passes == []
    assert asked == ["cluster-policy"]  # asked about the active policy

    labelling[0] = False
    assert asyncio.run(one_pass()) == 600.0
    assert len(passes) == 1
