"""KubeNodeView's logic over a stand-in for lightkube's Client (the real API path runs in integration tests)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node

from gpu_operator.node.cluster.kubeapi import KubeNodeView


class Obj:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.metadata = SimpleNamespace(name=data["metadata"].get("name"))

    def to_dict(self) -> dict[str, Any]:
        return self.data


class StandInClient:
    """Answers get/list/create/delete/patch like the API server would for these few calls."""

    def __init__(self, phases: list[str]) -> None:
        self.phases = phases
        self.calls: list[tuple[Any, ...]] = []
        self.node = {
            "metadata": {"name": "gpu-0", "uid": "n1", "labels": {"a": "b"}},
            "status": {"allocatable": {"nvidia.com/gpu": 8}},
        }

    def get(self, res: Any, name: str, namespace: str | None = None) -> Obj:
        if res is Node:
            return Obj(self.node)
        if res is DaemonSet:
            return Obj(
                {
                    "metadata": {
                        "name": name,
                        "ownerReferences": [
                            {
                                "apiVersion": "nvidia.com/v1",
                                "kind": "ClusterPolicy",
                                "name": "cluster-policy",
                                "uid": "cp1",
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    }
                }
            )
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        return Obj(
            {
                "metadata": {
                    "name": name,
                    "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-operator-validator"}],
                },
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "serviceAccountName": "nvidia-operator-validator",
                },
                "status": {"phase": phase},
            }
        )

    def list(self, res: Any, namespace: str, labels: dict[str, str], fields: dict[str, str]) -> list[Obj]:
        self.calls.append(("list", labels, fields))
        return [Obj({"metadata": {"name": "old-pod"}})]

    def delete(self, res: Any, name: str, namespace: str) -> None:
        self.calls.append(("delete", name))

    def create(self, obj: Any) -> Obj:
        self.calls.append(("create", type(obj).__name__))
        return Obj({"metadata": {"name": "nvidia-cuda-validator-abcde"}})

    def patch(self, res: Any, name: str, obj: Any, patch_type: Any) -> Obj:
        self.calls.append(("patch", name, obj))
        return Obj(self.node)


MANIFEST = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "generateName": "nvidia-cuda-validator-",
        "namespace": "gpu-operator",
        "labels": {"app": "nvidia-cuda-validator"},
    },
    "spec": {"nodeName": "gpu-0", "containers": [{"name": "c", "image": "i"}]},
}


def test_run_pod_replaces_old_pods_and_waits_for_the_end(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("gpu_operator.node.cluster.kubeapi.time.sleep", lambda _s: None)
    client = StandInClient(["Pending", "Running", "Succeeded"])
    view = KubeNodeView("gpu-0", "gpu-operator", "validator-pod", client=client)
    outcome = view.run_pod(MANIFEST, timeout=60)
    assert outcome.succeeded and outcome.phase == "Succeeded"
    assert client.calls[:3] == [
        ("list", {"app": "nvidia-cuda-validator"}, {"spec.nodeName": "gpu-0"}),
        ("delete", "old-pod"),
        ("create", "Pod"),
    ]


def test_node_facts_and_template(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    view = KubeNodeView("gpu-0", "gpu-operator", "validator-pod", client=StandInClient(["Running"]))
    assert view.node_labels() == {"a": "b"} and view.node_allocatable() == {"nvidia.com/gpu": "8"}
    # the workload pods belong to the ClusterPolicy that owns the validator's DaemonSet, not to the DaemonSet
    assert view.validator_pod_template() == {
        "ownerReferences": [
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "name": "cluster-policy",
                "uid": "cp1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "tolerations": [{"operator": "Exists"}],
        "serviceAccountName": "nvidia-operator-validator",
    }
    assert KubeNodeView("gpu-0", "ns", "", client=StandInClient(["Running"])).validator_pod_template() == {}


def test_publish_patches_labels_and_creates_node_events() -> None:
    client = StandInClient(["Running"])
    KubeNodeView("gpu-0", "gpu-operator", client=client).publish(
        {"nvidia.com/gpu.driver.source": "host", "nvidia.com/gpu.driver.version": None},
        [{"reason": "IommuOff", "type": "Warning", "message": "m"}],
    )
    assert client.calls[0] == (
        "patch",
        "gpu-0",
        {
            "metadata": {
                "labels": {"nvidia.com/gpu.driver.source": "host", "nvidia.com/gpu.driver.version": None}
            }
        },
    )
    assert client.calls[1] == ("create", Event.__name__)


def test_kubevirt_advertised_pairs_permitted_ids_with_the_nodes_allocatable() -> None:
    class KubeVirtClient(StandInClient):
        def list(self, res: Any, namespace: str, **_: Any) -> list[Obj]:  # type: ignore[override]
            assert res.__name__ == "KubeVirt" and namespace == "*"
            return [
                Obj(
                    {
                        "metadata": {"name": "kubevirt"},
                        "spec": {
                            "configuration": {
                                "permittedHostDevices": {
                                    "pciHostDevices": [
                                        {
                                            "pciVendorSelector": "10DE:2330",
                                            "resourceName": "nvidia.com/H100_SXM5_80GB",
                                            "externalResourceProvider": False,
                                        },
                                        {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S"},
                                    ]
                                }
                            }
                        },
                    }
                )
            ]

    client = KubeVirtClient(["Running"])
    client.node["status"] = {
        "capacity": {"nvidia.com/H100_SXM5_80GB": "8"},
        "allocatable": {"nvidia.com/H100_SXM5_80GB": "8"},
    }
    view = KubeNodeView("gpu-0", "", client=client)
    assert [(a.vendor_device, a.resource, a.count) for a in view.kubevirt_advertised()] == [
        ("10de:2330", "nvidia.com/H100_SXM5_80GB", 8),
        ("10de:26b9", "nvidia.com/L40S", 0),
    ]
