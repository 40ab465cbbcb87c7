"""GPU feature discovery's labels on a default install without NFD, end to end on the real control
plane: the operator (real process) deploys GFD, the GFD stand-in publishes its NodeFeature where
GFD's pod runs (sim/standins/gfd.py), the operator mirrors the labels onto the Node (controllers/units/labels/gfdlabels.py)
and the MIG manager follows mig.capable; GFD off -> the real garbage collector deletes the objects
with GFD's DaemonSet and the labels go. With NFD (the chart's nfd.enabled=false: the operator runs
with --no-gfd-node-labels) NFD's master stand-in writes them and the operator writes none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import GFD_LABELS_ANNOTATION, MIG_CAPABLE, MIG_MANAGER
from tests.support.status import reconciled
from tests.support.waiting import wait_for

NodeFeature = create_namespaced_resource("nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures")
PRODUCT = "nvidia.com/gpu.product"
OPERATOR_MANAGER = "gpu-operator"


def labels(kube: Client, name: str) -> dict[str, str]:
    return dict(kube.get(Node, name).metadata.labels or {})


def managers_of(kube: Client, name: str, key: str) -> set[str]:
    """Field managers that own the label `key` of a Node (metadata.managedFields)."""
    out = set()
    for entry in kube.get(Node, name).metadata.managedFields or []:
        fields = (entry.fieldsV1 or {}).get("f:metadata", {}).get("f:labels", {})
        if f"f:{key}" in fields:
            out.add(str(entry.manager))
    return out


def creator_of(kube: Client, name: str) -> str:
    """The field manager that created the Node (its Update/Apply entry with the node's own fields)."""
    entries = kube.get(Node, name).metadata.managedFields or []
    creators = [
        e
        for e in entries
        if "f:kubernetes.io/hostname" in (e.fieldsV1 or {}).get("f:metadata", {}).get("f:labels", {})
    ]
    assert creators, entries
    return str(creators[0].manager)


def test_default_install_puts_gfds_labels_on_gpu_nodes_and_takes_them_back(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    h100 = fake_nodes("dgx-h100:1")[0]
    l40s = fake_nodes("host-driver:1")[0]
    a10 = fake_nodes("a10:1")[0]
    for node in (h100, l40s, a10):  # nothing of GFD's at creation: a real node has none then
        assert not {PRODUCT, MIG_CAPABLE} & labels(kube, node).keys()
        assert "nvidia.com/gpu" not in (kube.get(Node, node).status.capacity or {})
    operator = start_operator()
    cluster_policies({})

    def settled() -> dict[str, dict[str, str]]:
        return {n: labels(kube, n) for n in (h100, l40s, a10)}

    got = wait_for(
        "GFD's labels on every GPU node",
        settled,
        context=operator.log_text,
        until=lambda by: all(PRODUCT in v for v in by.values()) and by[h100].get(MIG_MANAGER) == "true",
    )
    assert got[h100][PRODUCT] == "NVIDIA-H100-80GB-HBM3" and got[h100][MIG_CAPABLE] == "true"
    assert got[h100]["nvidia.com/gpu.count"] == "8"
    assert got[l40s][PRODUCT] == "NVIDIA-L40S" and got[l40s][MIG_CAPABLE] == "false"
    assert got[a10][MIG_CAPABLE] == "false" and MIG_MANAGER not in got[a10] and MIG_MANAGER not in got[l40s]
    for node in (h100, l40s, a10):
        # one writer, the operator, and never the identity that created the Node
        assert managers_of(kube, node, PRODUCT) == {OPERATOR_MANAGER}, node
        assert creator_of(kube, node) != OPERATOR_MANAGER
        feature = kube.get(NodeFeature, f"nvidia-features-for-{node}", namespace=operator_namespace)
        published = {k: v for k, v in (feature.spec or {})["labels"].items() if k.startswith("nvidia.com/")}
        assert {k: got[node][k] for k in published} == published
        listed = {
            f"nvidia.com/{k}"
            for k in (kube.get(Node, node).metadata.annotations or {})[GFD_LABELS_ANNOTATION].split(",")
        }
        assert listed == set(published)
    # the MIG manager's DaemonSet runs on the H100 node only; the device plugin's capacity is there
    mig = wait_for(
        "the MIG manager scheduled",
        lambda: kube.get(DaemonSet, "nvidia-mig-manager", namespace=operator_namespace).status,
        until=lambda s: s is not None and s.desiredNumberScheduled == 1,
    )
    assert mig.desiredNumberScheduled == 1
    wait_for(
        "nvidia.com/gpu capacity from the device plugin",
        lambda: (kube.get(Node, h100).status.capacity or {}).get("nvidia.com/gpu"),
        until=lambda c: c == "8",
    )
    reconciled(kube, context=operator.log_text)

    # GFD off: its DaemonSet goes, the garbage collector deletes its NodeFeatures, the labels go
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"gfd": {"enabled": False}}},
        patch_type=PatchType.MERGE,
    )
    gone = wait_for(
        "GFD's labels removed",
        settled,
        context=operator.log_text,
        until=lambda by: not any(PRODUCT in v or MIG_CAPABLE in v for v in by.values()),
    )
    for node in (h100, l40s, a10):
        assert GFD_LABELS_ANNOTATION not in (kube.get(Node, node).metadata.annotations or {})
    # The H100 keeps its MIG manager: its model (PCI device 2330, from our discovery's NFD label)
    # is MIG-capable by our layouts, and a container node never loses the MIG manager once set.
    assert gone[h100].get(MIG_MANAGER) == "true" and MIG_MANAGER not in gone[a10]
    wait_for(
        "GFD's NodeFeatures collected",
        lambda: list(kube.list(NodeFeature, namespace=operator_namespace)),
        until=lambda items: not items,
    )


def test_a_node_gfd_no_longer_runs_on_loses_its_labels(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    first, second = fake_nodes("host-driver:2")
    operator = start_operator()
    cluster_policies({})
    wait_for(
        "GFD's labels",
        lambda: [labels(kube, n).get(PRODUCT) for n in (first, second)],
        until=lambda got: all(got),
        context=operator.log_text,
    )
    # the user takes one node out of GFD (the DaemonSet's pod goes; its NodeFeature stays, owned
    # by the DaemonSet, and must not keep the labels alive)
    kube.patch(
        Node, first, {"metadata": {"labels": {"nvidia.com/gpu.deploy.gpu-feature-discovery": "false"}}}
    )
    wait_for(
        "the labels removed from that node only",
        lambda: (labels(kube, first), labels(kube, second)),
        until=lambda got: PRODUCT not in got[0] and PRODUCT in got[1],
        context=operator.log_text,
    )
    assert kube.get(NodeFeature, f"nvidia-features-for-{first}", namespace=operator_namespace) is not None


def test_with_nfd_its_master_writes_gfds_labels_and_the_operator_none(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    nfd_master: Any,
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    operator = start_operator(extra_args=["--no-gfd-node-labels"])
    cluster_policies({})
    got = wait_for(
        "GFD's labels from NFD's master",
        lambda: labels(kube, node),
        until=lambda got: got.get(PRODUCT) and got.get(MIG_MANAGER) == "true",
        context=operator.log_text,
    )
    assert got[MIG_CAPABLE] == "true"
    owners = managers_of(kube, node, PRODUCT)
    assert owners and OPERATOR_MANAGER not in owners, owners
    assert GFD_LABELS_ANNOTATION not in (kube.get(Node, node).metadata.annotations or {})
