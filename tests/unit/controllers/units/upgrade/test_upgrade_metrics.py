"""gpu_operator_driver_auto_upgrade_enabled (upstream's gauge, docs/operator.md's metric table):
each upgrade pass sets it from the owners' upgradePolicy.autoUpgrade, 1 on and 0 off."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpu_operator.controllers.metrics import AUTO_UPGRADE
from gpu_operator.controllers.units.upgrade.controller import UpgradeController
from gpu_operator.controllers.units.upgrade.owners import upgrade_owners
from tests.unit.controllers.units.upgrade.test_upgrade_owners import FakeKube, node, policy_view


def gauge_after_one_pass(clusterpolicy: dict[str, Any] | None, drivers: list[dict[str, Any]]) -> float | None:
    """The gauge after one pass of the upgrade controller for these specs (no driver pods)."""
    cp = None if clusterpolicy is None else policy_view("ClusterPolicy", "cp", clusterpolicy)
    nvds = [policy_view("NVIDIADriver", f"pool-{i}", spec) for i, spec in enumerate(drivers)]
    nodes = [node("n1")]
    kube = FakeKube([], [], [])
    controller = UpgradeController(kube, "ops", lambda: nodes, driver_pods=list)  # type: ignore[arg-type]

    async def one_pass() -> None:
        try:
            await controller.reconcile(upgrade_owners(cp, nvds, nodes))
        finally:
            await kube.http.aclose()

    asyncio.run(one_pass())
    return REGISTRY.get_sample_value("gpu_operator_driver_auto_upgrade_enabled")


def upgrade_policy(auto: bool) -> dict[str, Any]:
    return {"upgradePolicy": {"autoUpgrade": auto}}


@pytest.mark.parametrize(
    ("clusterpolicy", "drivers", "expected"),
    [
        ({"driver": upgrade_policy(True)}, [], 1),
        ({"driver": upgrade_policy(False)}, [], 0),
        # sandbox workloads: upstream turns the upgrade controller off, and the gauge with it
        ({"driver": upgrade_policy(True), "sandboxWorkloads": {"enabled": True}}, [], 0),
        # with useNvidiaDriverCRD the NVIDIADrivers' policies count: on when any is on
        ({"driver": {"useNvidiaDriverCRD": True}}, [upgrade_policy(False), upgrade_policy(True)], 1),
        ({"driver": {"useNvidiaDriverCRD": True}}, [upgrade_policy(False), upgrade_policy(False)], 0),
        (None, [], 0),  # no ClusterPolicy: no owner, nothing is upgraded
    ],
)
def test_the_gauge_follows_the_owners_auto_upgrade(
    clusterpolicy: dict[str, Any] | None, drivers: list[dict[str, Any]], expected: int
) -> None:
    AUTO_UPGRADE.set(1 - expected)  # the pass, not a leftover, must set it
    assert gauge_after_one_pass(clusterpolicy, drivers) == expected
