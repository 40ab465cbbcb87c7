"""NVIDIADriver on the real control plane: per-pool DaemonSets, the switch from the ClusterPolicy's
driver, conflicts, and the CRD's rules (apiserver + etcd + controller-manager GC + scheduler + kwok)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import condition, driver_status, policy_status
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
OWNER = "nvidia.com/gpu-operator.driver.owner"
COMPONENT = "app.kubernetes.io/component"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
PAUSED = "nvidia.com/gpu-driver-upgrade-paused"
CRD_ON = {"driver": {"useNvidiaDriverCRD": True}}


def owned_daemonsets(kube: Client, namespace: str, owner: str) -> list[DaemonSet]:
    uid = kube.get(NVIDIADriverResource, owner)["metadata"]["uid"]
    return [
        ds
        for ds in kube.list(DaemonSet, namespace=namespace)
        if any(ref.uid == uid for ref in ds.metadata.ownerReferences or [])
    ]


def driver_pods(kube: Client, namespace: str) -> list[Pod]:
    return list(kube.list(Pod, namespace=namespace, labels={COMPONENT: "nvidia-driver"}))


def node_label(kube: Client, node: str, key: str) -> str | None:
    return (kube.get(Node, node).metadata.labels or {}).get(key)


def ready(kube: Client, name: str) -> Callable[[], bool]:
    def check() -> bool:
        status = driver_status(kube, name)
        return status.get("state") == "ready" and condition(status, "Ready").get("reason") == "Reconciled"

    return check


def test_two_pools_two_versions_get_their_own_daemonsets_on_their_own_nodes(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    nvidia_drivers: Callable[..., str],
    operator_namespace: str,
) -> None:
    pool_a = fake_nodes("dgx-h100:2,pool=a")
    pool_b = fake_nodes("dgx-h100:1,pool=b")
    operator = start_operator()
    cluster_policies(CRD_ON)
    nvidia_drivers("pool-a", {"version": "570.172.08", "nodeSelector": {"pool": "a"}})
    nvidia_drivers(
        "pool-b", {"version": "580.82.07", "kernelModuleType": "open", "nodeSelector": {"pool": "b"}}
    )
    for name in ("pool-a", "pool-b"):

        def context(n: str = name) -> str:
            return f"{driver_status(kube, n)}\n{operator.log_text()[-3000:]}"

        wait_for(f"NVIDIADriver {name} ready", ready(kube, name), timeout=120, context=context)
    expected = {
        "pool-a": (pool_a, "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"),
        "pool-b": (pool_b, "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04"),
    }
    for owner, (nodes, image) in expected.items():
        (ds,) = owned_daemonsets(kube, operator_namespace, owner)
        assert ds.metadata.name.startswith("nvidia-gpu-driver-ubuntu22.04-")
        containers = {c.name: c for c in ds.spec.template.spec.containers}
        assert containers["nvidia-driver-ctr"].image == image
        assert (ds.spec.template.spec.nodeSelector or {})[OWNER] == owner
        pods = [
            p
            for p in driver_pods(kube, operator_namespace)
            if any(r.name == ds.metadata.name for r in p.metadata.ownerReferences or [])
        ]
        assert sorted(str(p.spec.nodeName) for p in pods) == sorted(nodes), owner
        assert all(node_label(kube, n, OWNER) == owner for n in nodes)
        assert condition(driver_status(kube, owner), "Ready")["reason"] == "Reconciled", (
            driver_status(kube, owner),
            operator.log_text()[-3000:],
        )
    assert "nvidia-driver-daemonset" not in {
        ds.metadata.name for ds in kube.list(DaemonSet, namespace=operator_namespace)
    }
    # Deleting one NVIDIADriver removes its DaemonSets only.
    b_names = {ds.metadata.name for ds in owned_daemonsets(kube, operator_namespace, "pool-b")}
    a_names = {ds.metadata.name for ds in owned_daemonsets(kube, operator_namespace, "pool-a")}
    kube.delete(NVIDIADriverResource, "pool-b")
    wait_for(
        "pool-b's DaemonSet garbage-collected",
        lambda: not b_names & {ds.metadata.name for ds in kube.list(DaemonSet, namespace=operator_namespace)},
    )
    assert a_names <= {ds.metadata.name for ds in kube.list(DaemonSet, namespace=operator_namespace)}
    wait_for(
        "pool-b's node loses its owner label",
        lambda: node_label(kube, pool_b[0], OWNER) is None,
        context=operator.log_text,
    )


def test_switch_from_clusterpolicy_driver_keeps_driver_pods_until_replaced(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    nvidia_drivers: Callable[..., str],
    operator_namespace: str,
) -> None:
    nodes = fake_nodes("dgx-h100:2")
    operator = start_operator()
    cluster_policies({})
    wait_for(
        "the ClusterPolicy's driver pods running",
        lambda: len([p for p in driver_pods(kube, operator_namespace) if p.status.phase == "Running"]) == 2,
        timeout=120,
        context=operator.log_text,
    )
    old = {str(p.metadata.name): p.spec.nodeName for p in driver_pods(kube, operator_namespace)}
    # Paused, so that the test sees the nodes held in upgrade-required before the upgrade
    # controller replaces the pods (both nodes at once: no limit on parallel upgrades).
    nvidia_drivers(
        "default",
        {
            "default": True,
            "version": "580.82.07",
            "upgradePolicy": {"maxParallelUpgrades": 0, "maxUnavailable": "100%"},
        },
        annotations={PAUSED: "true"},
    )
    kube.patch(ClusterPolicyResource, "cluster-policy", {"spec": CRD_ON}, patch_type=PatchType.MERGE)
    wait_for(
        "the ClusterPolicy's driver DaemonSet deleted",
        lambda: (
            "nvidia-driver-daemonset"
            not in {ds.metadata.name for ds in kube.list(DaemonSet, namespace=operator_namespace)}
        ),
        context=operator.log_text,
    )
    wait_for(
        "the NVIDIADriver's DaemonSet created",
        lambda: owned_daemonsets(kube, operator_namespace, "default"),
        context=operator.log_text,
    )
    # Orphan propagation: the old pods are still there and running, owned by nobody.
    live = {p.metadata.name: p for p in driver_pods(kube, operator_namespace)}
    for name in old:
        assert name in live and live[name].status.phase == "Running", name
        assert not [r for r in live[name].metadata.ownerReferences or [] if r.controller]
    # The migration rule marks the nodes for the upgrade controller, which replaces the pods.
    for node in nodes:

        def upgrade_required(n: str = node) -> bool:
            return node_label(kube, n, UPGRADE_STATE) == "upgrade-required"

        wait_for(f"{node} upgrade-required", upgrade_required, context=operator.log_text)
        assert node_label(kube, node, OWNER) == "default"
    (new_ds,) = owned_daemonsets(kube, operator_namespace, "default")
    new_pods = [p for p in driver_pods(kube, operator_namespace) if str(p.metadata.name) not in old]
    assert all(p.status.phase != "Running" for p in new_pods)  # the anti-affinity keeps them out
    # Resumed, the upgrade controller takes the nodes through the NVIDIADriver's upgrade policy:
    # its pod-restart step deletes the old pods and the new DaemonSet's pods start.
    kube.patch(
        NVIDIADriverResource,
        "default",
        {"metadata": {"annotations": {PAUSED: None}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "both nodes upgrade-done",
        lambda: {node_label(kube, n, UPGRADE_STATE) for n in nodes} == {"upgrade-done"},
        timeout=120,
        context=lambda: (
            f"{[node_label(kube, n, UPGRADE_STATE) for n in nodes]}\n{operator.log_text()[-3000:]}"
        ),
    )
    assert not {str(p.metadata.name) for p in driver_pods(kube, operator_namespace)} & set(old)
    wait_for(
        "the NVIDIADriver ready with its own pods",
        ready(kube, "default"),
        timeout=120,
        context=lambda: f"{driver_status(kube, 'default')}\n{operator.log_text()[-3000:]}",
    )
    running = {
        p.spec.nodeName
        for p in driver_pods(kube, operator_namespace)
        if p.status.phase == "Running"
        and any(r.name == new_ds.metadata.name for r in p.metadata.ownerReferences or [])
    }
    assert running == set(nodes)
    wait_for(
        "ClusterPolicy ready again",
        lambda: policy_status(kube).get("state") == "ready",
        timeout=120,
        context=operator.log_text,
    )


def test_overlapping_selectors_are_reported_and_nothing_is_deleted(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    nvidia_drivers: Callable[..., str],
    operator_namespace: str,
) -> None:
    (node,) = fake_nodes("dgx-h100:1,pool=a")
    operator = start_operator()
    cluster_policies(CRD_ON)
    nvidia_drivers("first", {"version": "570.172.08", "nodeSelector": {"pool": "a"}})
    wait_for("first ready", ready(kube, "first"), timeout=120, context=operator.log_text)
    (first_ds,) = owned_daemonsets(kube, operator_namespace, "first")
    pods_before = {p.metadata.name for p in driver_pods(kube, operator_namespace)}

    nvidia_drivers("second", {"version": "580.82.07", "nodeSelector": {"nvidia.com/gpu.present": "true"}})
    for name in ("first", "second"):

        def conflict_reported(n: str = name) -> bool:
            return condition(driver_status(kube, n), "Error").get("reason") == "ConflictingNodeSelector"

        wait_for(f"{name} reports the conflict", conflict_reported, context=operator.log_text)
        status = driver_status(kube, name)
        assert status["state"] == "notReady"
        assert node in condition(status, "Error")["message"]
    wait_for(
        "a Warning event on the node",
        lambda: [
            e
            for e in kube.list(Event, namespace="default", fields={"involvedObject.name": node})
            if e.reason == "ConflictingNodeSelector" and "first, second" in (e.message or "")
        ],
        context=operator.log_text,
    )
    assert node_label(kube, node, OWNER) == "first"
    assert [ds.metadata.name for ds in owned_daemonsets(kube, operator_namespace, "first")] == [
        first_ds.metadata.name
    ]
    assert owned_daemonsets(kube, operator_namespace, "second") == []
    assert {p.metadata.name for p in driver_pods(kube, operator_namespace)} == pods_before

    # A conflict is what the status names first (as upstream), also when the CR cannot render:
    # which one a user sees must not depend on which CR the operator saw first.
    kube.patch(
        NVIDIADriverResource,
        "first",
        {"spec": {"repoConfig": {"name": "no-such-repo"}}},
        patch_type=PatchType.MERGE,
    )

    def conflict_and_render_error() -> dict[str, Any]:
        return condition(driver_status(kube, "first"), "Error")

    error = wait_for(
        "first reports the conflict and its missing ConfigMap",
        conflict_and_render_error,
        until=lambda c: "no-such-repo" in c.get("message", ""),
        context=operator.log_text,
    )
    assert error["reason"] == "ConflictingNodeSelector"
    assert node in error["message"]
    assert [ds.metadata.name for ds in owned_daemonsets(kube, operator_namespace, "first")] == [
        first_ds.metadata.name
    ]
    kube.patch(NVIDIADriverResource, "first", {"spec": {"repoConfig": None}}, patch_type=PatchType.MERGE)

    kube.delete(NVIDIADriverResource, "second")
    wait_for("first ready again", ready(kube, "first"), context=operator.log_text)


@pytest.mark.parametrize(
    ("spec", "update", "field", "words"),
    [
        (
            {"default": True, "nodeSelector": {"pool": "a"}},
            None,
            "spec.nodeSelector",
            "must not set nodeSelector",
        ),
        ({"nodeSelector": {OWNER: "x"}}, None, "spec.nodeSelector", "must not use"),
        ({"driverType": "cpu"}, None, "spec.driverType", "Unsupported value"),
        (
            {"kernelModuleType": "closed"},
            None,
            "spec.kernelModuleType",
            "unsupported value closed: use one of auto, open",
        ),
        ({"driverType": "gpu"}, {"driverType": "vgpu"}, "spec.driverType", "immutable"),
        ({"usePrecompiled": False}, {"usePrecompiled": True}, "spec.usePrecompiled", "immutable"),
    ],
)
def test_bad_specs_are_rejected_naming_the_field(
    kube: Client,
    crds: list[str],
    nvidia_drivers: Callable[..., str],
    spec: dict[str, Any],
    update: dict[str, Any] | None,
    field: str,
    words: str,
) -> None:
    with pytest.raises(ApiError) as err:
        nvidia_drivers("bad", spec)
        if update is not None:
            kube.patch(NVIDIADriverResource, "bad", {"spec": update}, patch_type=PatchType.MERGE)
    assert err.value.status.code == 422
    message = err.value.status.message or ""
    assert field in message and words in message, message
