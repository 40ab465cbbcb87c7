"""Node labelling with NVIDIADrivers (owner label, upgrade annotation per owner, migration rule) and
the controller's pure helpers (routing from node views, owners kept through a conflict)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.controllers.queries import (
    NodeDriver,
    effective_owners,
    node_drivers,
    routing_of,
    upgrade_groups,
)
from gpu_operator.controllers.units.labels.nodelabels import desired_change
from gpu_operator.controllers.views import DriverPodView, NodeView
from tests.unit.controllers.labelkit import label_policy

OWNER = "nvidia.com/gpu-operator.driver.owner"
STATE = "nvidia.com/gpu-driver-upgrade-state"
ENABLED = "nvidia.com/gpu-driver-upgrade-enabled"
GPU = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true"}
CRD = label_policy({"driver": {"useNvidiaDriverCRD": True}})


def nvd(name: str, **spec: Any) -> NVIDIADriver:
    return NVIDIADriver.model_validate({"metadata": {"name": name}, "spec": spec})


def view(name: str, **labels: str) -> NodeView:
    return NodeView.of({"metadata": {"name": name, "labels": {**GPU, **labels}}})


def test_owner_label_and_annotation_follow_the_owner() -> None:
    change = desired_change(dict(GPU), {}, CRD, NodeDriver(owner="pool-a"))
    assert change.labels[OWNER] == "pool-a" and change.annotations[ENABLED] == "true"
    off = desired_change(
        {**GPU, OWNER: "pool-a"}, {ENABLED: "true"}, CRD, NodeDriver("pool-a", auto_upgrade=False)
    )
    assert OWNER not in off.labels and off.annotations == {ENABLED: None}
    gone = desired_change({**GPU, OWNER: "pool-a"}, {ENABLED: "true"}, CRD, NodeDriver(owner=None))
    assert gone.labels[OWNER] is None and gone.annotations[ENABLED] is None


def test_conflict_leaves_owner_and_annotation_alone() -> None:
    change = desired_change({**GPU, OWNER: "pool-a"}, {ENABLED: "true"}, CRD, NodeDriver(conflict=True))
    assert OWNER not in change.labels and ENABLED not in change.annotations


def test_migration_rule_marks_nodes_with_orphaned_driver_pods() -> None:
    orphan = NodeDriver(owner="default", orphaned_driver_pod=True)
    assert desired_change(dict(GPU), {}, CRD, orphan).labels[STATE] == "upgrade-required"
    assert desired_change({**GPU, STATE: "upgrade-done"}, {}, CRD, orphan).labels[STATE] == "upgrade-required"
    assert STATE not in desired_change({**GPU, STATE: "cordon-required"}, {}, CRD, orphan).labels
    assert STATE not in desired_change(dict(GPU), {}, CRD, NodeDriver(owner="default")).labels
    # autoUpgrade off: the upgrade controller removes state labels, so none is written here
    manual = NodeDriver(owner="default", auto_upgrade=False, orphaned_driver_pod=True)
    assert STATE not in desired_change(dict(GPU), {}, CRD, manual).labels


def test_without_the_crd_the_owner_label_goes_and_the_policy_decides_the_annotation() -> None:
    policy = label_policy({"driver": {"upgradePolicy": {"autoUpgrade": True}}})
    change = desired_change({**GPU, OWNER: "x"}, {}, policy, NodeDriver(owner="x", auto_upgrade=False))
    assert change.labels[OWNER] is None and change.annotations[ENABLED] == "true"


def test_node_drivers_route_on_every_label_and_see_orphans() -> None:
    drivers = [
        nvd("a", nodeSelector={"pool": "a"}, upgradePolicy={"autoUpgrade": False}),
        nvd("d", default=True),
    ]
    nodes = [view("n1", pool="a"), view("n2"), NodeView.of({"metadata": {"name": "cpu", "labels": {}}})]
    pods = [DriverPodView("p", "n2", running=True, orphaned=True), DriverPodView("q", "n1", True, False)]
    got = node_drivers(drivers, nodes, pods)
    assert got == {"n1": NodeDriver("a", auto_upgrade=False), "n2": NodeDriver("d", orphaned_driver_pod=True)}


def test_a_conflicting_node_stays_with_its_current_owner() -> None:
    drivers = [
        nvd("a", nodeSelector={"pool": "a"}),
        nvd("wide", nodeSelector={"nvidia.com/gpu.present": "true"}),
    ]
    nodes = [view("n1", pool="a", **{OWNER: "a"}), view("n2", pool="a")]
    routing = routing_of(drivers, nodes)
    assert routing.conflicts == {"n1": ("a", "wide"), "n2": ("a", "wide")}
    assert effective_owners(routing, nodes) == {"n1": "a"}


def test_driver_pod_view() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "ownerReferences": [{"controller": True, "uid": "u"}]},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running"},
    }
    assert DriverPodView.of(body) == DriverPodView("p", "n", running=True, orphaned=False)
    body["metadata"]["ownerReferences"] = []
    assert DriverPodView.of(body).orphaned


def test_upgrade_groups_one_per_owner_with_its_own_policy() -> None:
    drivers = [
        nvd("b", nodeSelector={"pool": "b"}, upgradePolicy={"autoUpgrade": False, "maxParallelUpgrades": 3}),
        nvd("a", nodeSelector={"pool": "a"}),
    ]
    nodes = [view("n2", **{OWNER: "a"}), view("n1", **{OWNER: "a"}), view("n3", **{OWNER: "b"}), view("n4")]
    groups = upgrade_groups(drivers, nodes)
    assert [(g.owner, g.nodes) for g in groups] == [("a", ("n1", "n2")), ("b", ("n3",))]
    assert groups[0].policy.autoUpgrade is True and groups[0].policy.maxParallelUpgrades == 1
    assert groups[1].policy.autoUpgrade is False and groups[1].policy.maxParallelUpgrades == 3
