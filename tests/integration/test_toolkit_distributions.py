"""Runtimes by distribution with the operator on the control plane: a stock node and a k3s node
each get the toolkit pod of their own DaemonSet (node labelling's nvidia.com/gpu.container-runtime
and the DaemonSets' affinities, placed by the real DaemonSet controller); a node whose runtime
turns unrecognisable loses its toolkit pod, and the ClusterPolicy's status and a Node Event name it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpu_operator.render.distributions import HINT_KEYS
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import RUNTIME_GROUP, RUNTIME_NOT_RECOGNISED
from tests.support.events import node_events
from tests.support.status import condition, policy_status, reconciled
from tests.support.waiting import wait_for

TOOLKIT = "nvidia-container-toolkit-daemonset"


def toolkit_pods(kube: Client, namespace: str) -> dict[str, str]:
    """node -> the app (DaemonSet) of the toolkit pod running there."""
    return {
        str(p.spec.nodeName): str(p.metadata.labels["app"])
        for p in kube.list(Pod, namespace=namespace)
        if p.spec
        and p.spec.nodeName
        and p.metadata
        and p.metadata.labels
        and str(p.metadata.labels.get("app", "")).startswith(TOOLKIT)
        and not p.metadata.deletionTimestamp
    }


def test_each_distribution_gets_its_toolkit_and_an_unrecognised_runtime_is_named(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    stock, k3s = fake_nodes("a10:1", "k3s:1")
    operator = start_operator()
    cluster_policies({})
    reconciled(kube, context=operator.log_text)
    labels = {n: dict(kube.get(Node, n).metadata.labels or {}) for n in (stock, k3s)}
    assert RUNTIME_GROUP not in labels[stock] and labels[k3s][RUNTIME_GROUP] == "k3s"
    wait_for(
        "a toolkit pod of its own DaemonSet on each node",
        lambda: toolkit_pods(kube, operator_namespace),
        until=lambda pods: pods == {stock: TOOLKIT, k3s: f"{TOOLKIT}-k3s"},
        context=operator.log_text,
    )

    # the stock node's runtime turns into one nobody knows
    kube.patch(
        Node.Status,
        stock,
        {"status": {"nodeInfo": {"containerRuntimeVersion": "frakti://0.3"}}},
        patch_type=PatchType.MERGE,
    )

    def error() -> dict[str, Any]:  # upstream's pair: Ready False, Error True with the reason and message
        return condition(policy_status(kube), "Error")

    found = wait_for(
        "the ClusterPolicy to name the node",
        error,
        until=lambda c: c.get("reason") == RUNTIME_NOT_RECOGNISED,
        context=operator.log_text,
    )
    assert found["message"] == (
        f"node {stock}: no container toolkit runs there: its container runtime (frakti://0.3) is not one the "
        "operator recognises (containerd of stock, k3s, RKE2, MicroK8s or k0s; CRI-O; Docker); name its runtime "
        f"in spec.toolkit.env ({', '.join(HINT_KEYS)}) or label it nvidia.com/gpu.deploy.container-toolkit=false "
        "(docs/distributions.md)"
    )
    wait_for(
        "the node's Warning Event",
        lambda: [e.reason for e in node_events(kube, stock)],
        until=lambda reasons: RUNTIME_NOT_RECOGNISED in reasons,
    )
    wait_for(
        "no toolkit pod on the node",
        lambda: toolkit_pods(kube, operator_namespace),
        until=lambda pods: pods == {k3s: f"{TOOLKIT}-k3s"},
        context=operator.log_text,
    )
