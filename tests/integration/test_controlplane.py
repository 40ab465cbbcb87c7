"""Smoke test of the simulated control plane: apiserver + etcd (CRDs, RBAC), controller-manager
and scheduler (DaemonSet pods created and bound), kwok (fake nodes, pods Ready)."""

from __future__ import annotations

import functools
import urllib.error
from collections.abc import Callable

import pytest
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.sim.plane.controlplane import ControlPlane
from tests.support.waiting import wait_for


def test_version_is_the_built_release(control_plane: ControlPlane) -> None:
    version = control_plane.request("GET", "/version")
    assert version["gitVersion"] == "v1.37.2"
    assert version["minor"] == "37"


def test_crd_is_served(control_plane: ControlPlane, kube: Client) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.smoke.example.com"},
        "spec": {
            "group": "smoke.example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Cluster",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
    kube.apply(from_dict(crd), force=True)

    def established() -> bool:
        got = control_plane.request(
            "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.smoke.example.com"
        )
        conditions = (got.get("status") or {}).get("conditions") or []  # null just after create
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for("CRD Established", established, timeout=60)
    control_plane.request(
        "POST",
        "/apis/smoke.example.com/v1/widgets",
        {
            "apiVersion": "smoke.example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 2},
        },
    )
    # The schema is enforced by the real apiserver.
    with pytest.raises(urllib.error.HTTPError) as bad:
        control_plane.request(
            "POST",
            "/apis/smoke.example.com/v1/widgets",
            {
                "apiVersion": "smoke.example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "bad"},
                "spec": {"size": 0},
            },
        )
    assert bad.value.code == 422


def test_daemonset_follows_fake_gpu_nodes(
    kube: Client, namespace: str, fake_nodes: Callable[..., list[str]]
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:3")
    fake_nodes("cpu:1")
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "smoke", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "smoke"}},
            "template": {
                "metadata": {"labels": {"app": "smoke"}},
                "spec": {
                    "nodeSelector": {"feature.node.kubernetes.io/pci-10de.present": "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "example.invalid/smoke:1",
                            "securityContext": {"privileged": True},
                        }
                    ],
                },
            },
        },
    }
    kube.create(from_dict(ds))

    def counts() -> tuple[int, int]:
        status = kube.get(DaemonSet, "smoke", namespace=namespace).status
        return (status.desiredNumberScheduled, status.numberReady) if status else (-1, -1)

    wait_for("3 ready pods", counts, until=lambda c: c == (3, 3), timeout=60)
    fake_nodes.remove(gpu_nodes[0])  # type: ignore[attr-defined]
    wait_for("the DaemonSet to follow the node deletion", counts, until=lambda c: c == (2, 2), timeout=60)


def test_serviceaccount_identity_is_subject_to_rbac(control_plane: ControlPlane) -> None:
    path = control_plane.serviceaccount_kubeconfig("rbac-smoke", "nobody")
    client = Client(KubeConfig.from_file(path))
    with pytest.raises(ApiError) as denied:
        list(client.list(Node))
    assert denied.value.status.code == 403
    assert "system:serviceaccount:rbac-smoke:nobody" in str(denied.value.status.message)


def test_a_pod_the_node_controller_marked_not_ready_is_ready_again_as_a_live_kubelet_makes_it(
    kube: Client, namespace: str, fake_nodes: Callable[..., list[str]]
) -> None:
    """The node lifecycle controller marks a lapsed node's pods not Ready (the Ready condition
    alone); a live kubelet writes them back at its next status sync, and so does kwok's
    `pod-ready-again` stage (sim/plane/planeargs.py). A pod whose containers are not ready (a
    kubelet's own verdict) stays as it is."""
    node = fake_nodes("cpu:1")[0]
    for name in ("marked", "held"):
        kube.create(
            from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "nodeName": node,
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "c", "image": "example.invalid/smoke:1"}],
                    },
                }
            )
        )

    def conditions(name: str) -> dict[str, str]:
        status = kube.get(Pod, name, namespace=namespace).status
        return {c.type: c.status for c in (status.conditions if status and status.conditions else [])}

    for name in ("marked", "held"):
        wait_for(
            f"{name} Ready",
            functools.partial(conditions, name),
            until=lambda c: c.get("Ready") == "True",
            timeout=60,
        )

    def mark(name: str, types: tuple[str, ...]) -> None:
        # as MarkPodsNotReady: those conditions False, the others as they are
        conditions_patch = [{"type": t, "status": "False"} for t in types]
        kube.patch(Pod.Status, name, {"status": {"conditions": conditions_patch}}, namespace=namespace)

    mark("marked", ("Ready",))
    mark("held", ("Ready", "ContainersReady"))
    wait_for(
        "the marked pod Ready again",
        lambda: conditions("marked"),
        until=lambda c: c["Ready"] == "True",
        timeout=30,
    )
    assert conditions("marked")["ContainersReady"] == "True"
    held = conditions("held")
    assert (held["Ready"], held["ContainersReady"]) == ("False", "False"), held
