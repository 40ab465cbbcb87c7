"""Labels first: while a new ClusterPolicy's labels are being written, the loops that would act on
every node (the reconcile, the driver upgrade pass) wait and look again after the coalescing
window; once the labelling loop is done, they run."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpu_operator.controllers.cache import PolicyView
from gpu_operator.controllers.operator import Operator
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import Kube


class NoKube:
    """Nothing here may reach the apiserver: the passes under test are stubbed below it."""

    http: Any = None
    streams: Any = None


def _operator(busy: list[bool], asked: list[Any]) -> tuple[Operator, list[Any]]:
    operator = Operator(cast(Kube, NoKube()), "gpu-operator", OperatorSettings(coalesce=0.1))
    policy = PolicyView.of({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                            "metadata": {"name": "cluster-policy", "uid": "u1", "generation": 1,
                                         "creationTimestamp": "2026-11-26T00:00:00Z"},
                            "spec": {}})
    operator.indices = {"policies": {"cluster-policy": [policy]}, "drivers": {}, "gpuclusters": {},
                        "driver_pods": {}}

    def labelling(active: PolicyView | None) -> bool:
        asked.append(active.name if active is not None else None)
        return busy[0]

    passes: list[Any] = []

    async def reconcile(owners: Any) -> float:
        passes.append(owners)
        return 600.0

    operator.labels.labelling = labelling  # type: ignore[method-assign]
    operator.upgrades.reconcile = reconcile  # type: ignore[method-assign]
    return operator, passes


def test_the_driver_upgrade_pass_waits_while_a_new_policys_labels_are_written() -> None:
    labelling: list[bool] = [True]
    asked: list[Any] = []
    operator, passes = _operator(labelling, asked)
    upgrade = operator.pass_loops()["upgrade"]

    async def one_pass() -> float | None:
        return await upgrade.one_pass()

    assert asyncio.run(one_pass()) == 0.1  # looks again after the coalescing window
    assert passes == []
    assert asked == ["cluster-policy"]  # asked about the active policy

    labelling[0] = False
    assert asyncio.run(one_pass()) == 600.0
    assert len(passes) == 1
