"""GPUCluster on the real control plane: the DRA stack applied, GPU nodes labelled for it, the real
scheduler allocating ResourceClaims against the slices the simulator's kubelet-plugin stand-in
publishes (sim/standins/draplugin.py, run for the session by conftest's node stand-ins), the ClusterPolicy
exclusion, switched-off features deleted, and the ordered teardown (claim holders first, then the
finalizer, then the garbage collector)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod
from lightkube.types import PatchType

from gpu_operator.kube.client import GPUClusterResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import ALL_DEPLOY_LABELS, DRA_STATE_LABELS, deploy_label
from tests.support.status import condition, policy_status
from tests.support.waiting import wait_for
from tests.support.workloads import claim_pod, claim_results

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
DeviceClass = create_global_resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")
IMAGE = {"repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0"}
NAME = "gpu-cluster"


def gpucluster_status(kube: Client) -> dict[str, Any]:
    try:
        return dict(kube.get(GPUClusterResource, NAME).get("status") or {})
    except ApiError as err:
        if err.status.code == 404:
            return {}
        raise


def is_ready(status: dict[str, Any]) -> bool:
    return status.get("state") == "ready" and condition(status, "Ready").get("reason") == "Reconciled"


def exists(kube: Client, resource: Any, name: str, namespace: str | None = None) -> bool:
    try:
        kube.get(resource, name, **({"namespace": namespace} if namespace else {}))
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return True


@pytest.fixture
def gpucluster(kube: Client) -> Iterator[Callable[[dict[str, Any]], None]]:
    """`gpucluster(spec)` creates the GPUCluster; after the test it is deleted (its finalizer removed
    by hand if no operator is left to do it: no later test may find it)."""

    def create(spec: dict[str, Any]) -> None:
        kube.create(
            from_dict(
                {
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "GPUCluster",
                    "metadata": {"name": NAME},
                    "spec": spec,
                }
            )
        )

    yield create
    try:
        kube.delete(GPUClusterResource, NAME)
    except ApiError as err:
        if err.status.code != 404:
            raise
    try:
        wait_for("the GPUCluster gone", lambda: not exists(kube, GPUClusterResource, NAME), timeout=30)
    except AssertionError:
        kube.patch(GPUClusterResource, NAME, {"metadata": {"finalizers": []}}, patch_type=PatchType.MERGE)
    wait_for("the GPUCluster gone", lambda: not exists(kube, GPUClusterResource, NAME), timeout=30)
    wait_for(
        "its DeviceClasses collected", lambda: not exists(kube, DeviceClass, "gpu.nvidia.com"), timeout=60
    )


def labels(kube: Client, node: str) -> dict[str, str]:
    return dict(kube.get(Node, node).metadata.labels or {})


def deploy_labels(kube: Client, node: str) -> dict[str, str]:
    return {k: v for k, v in labels(kube, node).items() if k in ALL_DEPLOY_LABELS}


def allocated_node(kube: Client, namespace: str, pod: str) -> str | None:
    """The node (pool) of the pod's allocated claim, None until it is allocated."""
    results = claim_results(kube, namespace, pod)
    return str(results[0]["pool"]) if results else None


def bring_up(
    kube: Client, start_operator: Start, gpucluster: Callable[[dict[str, Any]], None], spec: dict[str, Any]
) -> Callable[[], str]:
    """Start the operator, create the GPUCluster, wait until it is ready; returns the context (both
    CRs' status and the operator's log) to print with a failed wait."""
    operator = start_operator()
    gpucluster(spec)

    def context() -> str:
        return f"{gpucluster_status(kube)}\n{policy_status(kube)}\n{operator.log_text()[-4000:]}"

    wait_for(
        "GPUCluster ready", lambda: gpucluster_status(kube), until=is_ready, timeout=180, context=context
    )
    return context


def test_the_dra_stack_comes_up_and_claims_are_allocated_on_gpu_nodes(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    operator_namespace: str,
    gpucluster: Callable[[dict[str, Any]], None],
    namespace: str,
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:2")
    (cpu_node,) = fake_nodes("cpu:1")
    context = bring_up(kube, start_operator, gpucluster, {"draDriver": IMAGE, "dcgmExporter": {}})
    body = kube.get(GPUClusterResource, NAME)
    assert "gpucluster.nvidia.com/dra-resourceclaim" in body["metadata"]["finalizers"]
    assert gpucluster_status(kube)["namespace"] == operator_namespace
    ns_labels = kube.get(Namespace, operator_namespace).metadata.labels or {}
    assert ns_labels.get("resource.kubernetes.io/admin-access") == "true"
    for node in gpu_nodes:
        assert deploy_labels(kube, node) == {key: "true" for key in DRA_STATE_LABELS}, node
    assert deploy_labels(kube, cpu_node) == {}
    for name in (
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "vfio.gpu.nvidia.com",
        "compute-domain-daemon.nvidia.com",
    ):
        assert exists(kube, DeviceClass, name), name
    validators = list(
        kube.list(Pod, namespace=operator_namespace, labels={"app": "nvidia-operator-validator"})
    )
    placed = {
        str(p.metadata.name if p.metadata else ""): str(p.spec.nodeName if p.spec else "") for p in validators
    }
    assert sorted(placed.values()) == sorted(gpu_nodes)
    for pod, node_name in placed.items():
        assert allocated_node(kube, operator_namespace, pod) == node_name

    # a user's claim for one GPU lands on a GPU node; one for more GPUs than a node has stays pending
    claim_pod(kube, namespace, "one-gpu", 1)
    holder = wait_for(
        "the one-GPU claim allocated", lambda: allocated_node(kube, namespace, "one-gpu"), timeout=60
    )
    assert holder in gpu_nodes
    claim_pod(kube, namespace, "nine-gpus", 9)

    def unschedulable() -> dict[str, Any]:
        status = kube.get(Pod, "nine-gpus", namespace=namespace).status
        found = [c for c in (status.conditions if status else None) or [] if c.type == "PodScheduled"]
        return (
            {"status": found[0].status, "reason": found[0].reason, "message": found[0].message}
            if found
            else {}
        )

    scheduled = wait_for(
        "the nine-GPU pod refused by the scheduler",
        unschedulable,
        until=lambda c: c.get("reason") == "Unschedulable",
        timeout=60,
    )
    assert scheduled["status"] == "False" and "claim" in (scheduled["message"] or "")

    # a feature switched off: its objects are deleted (upstream leaves them)
    kube.patch(
        GPUClusterResource,
        NAME,
        {"spec": {"draDriver": {"computeDomains": {"enabled": False}}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "the compute-domain controller deleted",
        lambda: not exists(kube, Deployment, "nvidia-dra-driver-controller", operator_namespace),
        timeout=60,
        context=context,
    )
    wait_for(
        "the compute-domain DeviceClasses deleted",
        lambda: not exists(kube, DeviceClass, "compute-domain-daemon.nvidia.com"),
        timeout=60,
        context=context,
    )

    # deletion: claim holders first (foreground), then the finalizer; the plugin goes last
    kube.delete(Pod, "one-gpu", namespace=namespace)
    kube.delete(GPUClusterResource, NAME)
    wait_for(
        "the GPUCluster gone",
        lambda: not exists(kube, GPUClusterResource, NAME),
        timeout=120,
        context=context,
    )
    events = [e for e in kube.list(Event, namespace="default") if e.involvedObject.kind == "GPUCluster"]
    assert any(
        e.reason == "DrainingClaimConsumers" and "nvidia-dra-validator" in (e.message or "") for e in events
    )
    wait_for(
        "the kubelet plugin collected",
        lambda: not exists(kube, DaemonSet, "nvidia-dra-driver-kubelet-plugin", operator_namespace),
        timeout=60,
    )
    wait_for(
        "the DRA labels taken back",
        lambda: all(not deploy_labels(kube, n) for n in gpu_nodes),
        timeout=60,
        context=context,
    )


def test_a_clusterpolicy_beside_a_gpucluster_stops_both_and_flips_no_label(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Callable[..., str],
    gpucluster: Callable[[dict[str, Any]], None],
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:1")
    context = bring_up(kube, start_operator, gpucluster, {"draDriver": IMAGE})
    before = deploy_labels(kube, gpu_nodes[0])
    cluster_policies({})

    def both_conflicted() -> bool:
        mine, theirs = condition(gpucluster_status(kube), "Error"), condition(policy_status(kube), "Error")
        return (
            mine.get("reason") == "PrerequisiteNotMet"
            and theirs.get("reason") == "ReconcileFailed"
            and "cannot co-exist" in theirs.get("message", "")
            and "cluster-policy" in mine.get("message", "")
        )

    wait_for("both CRs report the conflict", both_conflicted, timeout=60, context=context)
    assert gpucluster_status(kube)["state"] == "notReady" and policy_status(kube)["state"] == "notReady"
    assert deploy_labels(kube, gpu_nodes[0]) == before  # no flip to the device-plugin set
    assert deploy_label("device-plugin") not in labels(kube, gpu_nodes[0])
    assert not list(kube.list(DaemonSet, namespace="*", labels={"app": "nvidia-device-plugin-daemonset"}))

    kube.delete(GPUClusterResource, NAME)
    wait_for(
        "the ClusterPolicy's stack takes over",
        lambda: labels(kube, gpu_nodes[0]).get(deploy_label("device-plugin")) == "true",
        timeout=120,
        context=context,
    )
    assert not {k for k in labels(kube, gpu_nodes[0]) if k in DRA_STATE_LABELS[1:]}


def test_nvidiadrivers_manage_the_dra_stack_driver(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    nvidia_drivers: Callable[..., str],
    gpucluster: Callable[[dict[str, Any]], None],
    operator_namespace: str,
) -> None:
    """Without a ClusterPolicy, NVIDIADrivers install the driver of a GPUCluster's nodes (as NVIDIA's
    operator lets them): their pools' DaemonSets on the nodes they own, owner labels, status."""
    (node,) = fake_nodes("dgx-h100:1")
    operator = start_operator()
    nvidia_drivers("default", {"default": True, "version": "580.82.07"})
    gpucluster({"draDriver": IMAGE})

    def context() -> str:
        return f"{gpucluster_status(kube)}\n{operator.log_text()[-4000:]}"

    def driver_ready() -> bool:
        from tests.support.status import driver_status

        return driver_status(kube, "default").get("state") == "ready"

    wait_for("the NVIDIADriver ready beside the GPUCluster", driver_ready, timeout=120, context=context)
    assert labels(kube, node).get("nvidia.com/gpu-operator.driver.owner") == "default"
    drivers = [
        ds
        for ds in kube.list(DaemonSet, namespace=operator_namespace)
        if (ds.metadata.labels or {}).get("app.kubernetes.io/component") == "nvidia-driver"
    ]
    assert (
        len(drivers) == 1 and drivers[0].spec.template.spec.nodeSelector.get(deploy_label("driver")) == "true"
    )
    wait_for(
        "GPUCluster ready", lambda: gpucluster_status(kube), until=is_ready, timeout=120, context=context
    )


def test_leaving_dra_keeps_the_driver_label_while_a_pod_holds_a_gpu_claim(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Callable[..., str],
    gpucluster: Callable[[dict[str, Any]], None],
    namespace: str,
) -> None:
    """GPUCluster -> ClusterPolicy: nvidia.com/gpu.deploy.dra-driver stays on the node where a user's
    pod still holds a gpu.nvidia.com claim (its plugin must unprepare it), and goes once the pod is
    gone; the other node switches at once."""
    nodes = fake_nodes("dgx-h100:2")
    context = bring_up(kube, start_operator, gpucluster, {"draDriver": IMAGE})
    claim_pod(kube, namespace, "holder", 1)
    holder = str(
        wait_for("the claim allocated", lambda: allocated_node(kube, namespace, "holder"), timeout=60)
    )
    other = next(n for n in nodes if n != holder)
    kube.delete(GPUClusterResource, NAME)
    wait_for(
        "the GPUCluster gone",
        lambda: not exists(kube, GPUClusterResource, NAME),
        timeout=120,
        context=context,
    )
    cluster_policies({})
    wait_for(
        "the free node on the device-plugin stack",
        lambda: (
            labels(kube, other).get(deploy_label("device-plugin")) == "true"
            and deploy_label("dra-driver") not in labels(kube, other)
        ),
        timeout=120,
        context=context,
    )
    on_holder = labels(kube, holder)
    assert on_holder.get(deploy_label("device-plugin")) == "true"
    assert on_holder.get(deploy_label("dra-driver")) == "true", (
        "the DRA driver label went while a claim is held"
    )
    kube.delete(Pod, "holder", namespace=namespace)
    wait_for(
        "the DRA driver label gone once the claim is released",
        lambda: deploy_label("dra-driver") not in labels(kube, holder),
        timeout=90,
        context=context,
    )
