"""The simulator's node stand-ins on the real control plane (sim/standins/roster.py, run for the session by
conftest): a kwok node carries nothing of GPU feature discovery or the device plugin when it is
created; GFD's NodeFeature appears once a pod labelled like GFD's runs there, the `nvidia.com/gpu`
capacity once a device-plugin pod does; NFD's master (opt-in) puts the NodeFeature's labels on the
Node as `nfd-master`, never as whoever created the Node."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator import shapes
from gpu_operator.sim.standins.gfd import NodeFeature
from gpu_operator.vocabulary import NFD_NODE_NAME_LABEL
from tests.support.components import COMPONENT_ACCOUNT
from tests.support.waiting import wait_for

Nodes = Callable[..., list[str]]
GPU = "nvidia.com/gpu"
CRD_NAME = "nodefeatures.nfd.k8s-sigs.io"
GFD_KEYS = set(shapes.load("dgx-h100").gfd_labels("single", timestamp=0))


@pytest.fixture
def node_feature_crd(kube: Client, crds: list[str]) -> str:
    """NFD's NodeFeature kind: `crds` applies it with ours (kube/crds.py creates it where absent)."""
    assert CRD_NAME in crds
    wait_for("NodeFeatures served", lambda: list_node_features(kube) is not None, timeout=60)
    return CRD_NAME


def list_node_features(kube: Client) -> list[Any] | None:
    try:
        return list(kube.list(NodeFeature, namespace="*"))
    except ApiError as err:
        if err.status.code in (404, 429, 503):
            return None
        raise


def node_feature(kube: Client, namespace: str, node: str) -> dict[str, Any] | None:
    try:
        obj = kube.get(NodeFeature, f"nvidia-features-for-{node}", namespace=namespace)
        found: dict[str, Any] = obj.to_dict()  # type: ignore[no-untyped-call]
        return found
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def component_pod(name: str, namespace: str, node: str, app: str, env: dict[str, str] | None = None) -> Pod:
    """A bare pod bound to a kwok node (kwok marks it Running), labelled like the component's."""
    return cast(
        Pod,
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": COMPONENT_ACCOUNT,
                    "containers": [
                        {
                            "name": app,
                            "image": f"example.invalid/{app}:1",
                            "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                        }
                    ],
                },
            }
        ),
    )


def running_pod(kube: Client, namespace: str, name: str) -> Pod | None:
    found = kube.get(Pod, name, namespace=namespace)
    return found if found.status is not None and found.status.phase == "Running" else None


def node_resources(kube: Client, node: str) -> tuple[str | None, str | None]:
    status = kube.get(Node, node).status
    assert status is not None
    return (status.capacity or {}).get(GPU), (status.allocatable or {}).get(GPU)


def label_owners(node: Node) -> dict[str, set[str]]:
    """Field manager -> the label keys it owns, from metadata.managedFields."""
    out: dict[str, set[str]] = {}
    for entry in (node.metadata.managedFields if node.metadata else None) or []:
        labels = ((entry.fieldsV1 or {}).get("f:metadata") or {}).get("f:labels") or {}
        out.setdefault(str(entry.manager), set()).update(
            k.removeprefix("f:") for k in labels if k.startswith("f:")
        )
    return out


def test_a_kwok_node_carries_nothing_of_gfd_or_the_device_plugin_when_created(
    kube: Client, fake_nodes: Nodes
) -> None:
    (name,) = fake_nodes("dgx-h100:1")
    node = kube.get(Node, name)
    assert node.metadata is not None and node.status is not None
    labels = node.metadata.labels or {}
    assert not GFD_KEYS & set(labels), sorted(GFD_KEYS & set(labels))
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["feature.node.kubernetes.io/pci-10de_2330.present"] == "true"
    assert GPU not in (node.status.capacity or {}) and GPU not in (node.status.allocatable or {})


def test_gfd_pod_publishes_gfds_node_feature(
    kube: Client, fake_nodes: Nodes, namespace: str, node_feature_crd: str
) -> None:
    (name,) = fake_nodes("dgx-h100:1")
    kube.create(
        cast(
            DaemonSet,
            DaemonSet.from_dict(
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": {"name": "gpu-feature-discovery", "namespace": namespace},
                    "spec": {
                        "selector": {"matchLabels": {"app": "gpu-feature-discovery"}},
                        "template": {
                            "metadata": {"labels": {"app": "gpu-feature-discovery"}},
                            "spec": {
                                "nodeSelector": {"kubernetes.io/hostname": name},
                                "serviceAccountName": COMPONENT_ACCOUNT,
                                "containers": [
                                    {
                                        "name": "gpu-feature-discovery",
                                        "image": "example.invalid/gfd:1",
                                        "env": [{"name": "MIG_STRATEGY", "value": "single"}],
                                    }
                                ],
                            },
                        },
                    },
                }
            ),
        )
    )
    found = wait_for("GFD's NodeFeature", lambda: node_feature(kube, namespace, name), timeout=60)
    assert found is not None
    ds = kube.get(DaemonSet, "gpu-feature-discovery", namespace=namespace)
    (pod,) = kube.list(Pod, namespace=namespace, labels={"app": "gpu-feature-discovery"})
    assert ds.metadata is not None and pod.metadata is not None and pod.status is not None
    assert found["metadata"]["labels"] == {NFD_NODE_NAME_LABEL: name}
    assert found["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "gpu-feature-discovery",
            "uid": ds.metadata.uid,
            "controller": True,
        },
        {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
    ]
    assert pod.status.startTime is not None
    stamp = int(pod.status.startTime.timestamp())
    assert found["spec"]["labels"] == shapes.load("dgx-h100").gfd_labels("single", timestamp=stamp)
    assert {m["manager"] for m in found["metadata"]["managedFields"]} == {"gpu-feature-discovery"}
    labels = kube.get(Node, name).metadata.labels or {}
    assert not GFD_KEYS & set(
        labels
    )  # GFD writes the NodeFeature only; nothing here plays NFD or the operator

    kube.delete(DaemonSet, "gpu-feature-discovery", namespace=namespace)
    # the garbage collector's; it watches a kind added during the session after its next
    # discovery resync (30 s)
    wait_for(
        "the NodeFeature collected once its DaemonSet and pod are gone",
        lambda: node_feature(kube, namespace, name) is None,
        timeout=120,
    )


def test_device_plugin_pod_brings_the_gpu_capacity(kube: Client, fake_nodes: Nodes, namespace: str) -> None:
    (name,) = fake_nodes("a10:1")
    assert node_resources(kube, name) == (None, None)
    kube.create(component_pod("device-plugin", namespace, name, "nvidia-device-plugin-daemonset"))
    wait_for(
        "capacity and allocatable nvidia.com/gpu 2",
        lambda: node_resources(kube, name),
        until=lambda r: r == ("2", "2"),
        timeout=60,
    )
    owners = {
        m.manager
        for m in kube.get(Node, name).metadata.managedFields or []
        if f"f:{GPU}" in (((m.fieldsV1 or {}).get("f:status") or {}).get("f:capacity") or {})
    }
    assert owners == {"kubelet"}, owners
    kube.delete(Pod, "device-plugin", namespace=namespace, grace_period=0)
    # the kubelet's device manager: allocatable 0 at once, capacity kept for the endpoint's grace period
    wait_for(
        "allocatable 0, capacity kept",
        lambda: node_resources(kube, name),
        until=lambda r: r == ("2", "0"),
        timeout=60,
    )


@contextlib.contextmanager
def bare_gfd_pod(kube: Client, namespace: str, node: str) -> Iterator[str]:
    kube.create(component_pod("gfd", namespace, node, "gpu-feature-discovery"))
    try:
        wait_for("the GFD pod Running", lambda: running_pod(kube, namespace, "gfd"), timeout=60)
        yield "gfd"
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(Pod, "gfd", namespace=namespace, grace_period=0)


def test_nfd_master_puts_the_labels_on_the_node_as_nfd_master(
    kube: Client, fake_nodes: Nodes, namespace: str, node_feature_crd: str, nfd_master: object
) -> None:
    (name,) = fake_nodes("host-driver:1")
    wanted = shapes.load("host-driver").gfd_labels()
    with bare_gfd_pod(kube, namespace, name):
        found = wait_for("GFD's NodeFeature", lambda: node_feature(kube, namespace, name), timeout=60)
        assert found is not None
        assert "ownerReferences" not in found["metadata"]  # a pod no DaemonSet owns: GFD sets none
        node = wait_for(
            "GFD's labels on the Node",
            lambda: kube.get(Node, name),
            until=lambda n: set(wanted) <= set(n.metadata.labels or {}),
            timeout=60,
        )
    assert node.metadata is not None
    labels = node.metadata.labels or {}
    assert {k: labels[k] for k in wanted} == wanted
    assert labels["nvidia.com/gfd.timestamp"] == found["spec"]["labels"]["nvidia.com/gfd.timestamp"]
    recorded = (node.metadata.annotations or {})["nfd.node.kubernetes.io/feature-labels"].split(",")
    assert recorded == sorted(found["spec"]["labels"])
    owners = label_owners(node)
    assert set(found["spec"]["labels"]) <= owners.get("nfd-master", set()), owners
    assert not set(found["spec"]["labels"]) & owners.get("tests", set()), owners  # the Node's creator

    kube.delete(NodeFeature, f"nvidia-features-for-{name}", namespace=namespace)
    node = wait_for(
        "GFD's labels gone with their NodeFeature",
        lambda: kube.get(Node, name),
        until=lambda n: not set(found["spec"]["labels"]) & set(n.metadata.labels or {}),
        timeout=60,
    )
    assert "nfd.node.kubernetes.io/feature-labels" not in (node.metadata.annotations or {})
