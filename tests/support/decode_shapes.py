"""Pods and Nodes shaped like the ones a kwok cluster serves, for the decode stress
(tests/support/decode_stress.py): kwok's labels and annotations on a Node, its five conditions,
addresses and daemon endpoint, and on both kinds the managedFields an apiserver keeps (one entry
per manager, fieldsV1 a tree of `f:` keys), which are most of a listed object's bytes. The shape
follows kwok's fake-node example and the apiserver's server-side apply bookkeeping
(kubernetes-sigs/kwok, kustomize/stage/node; KEP-555); the values are made up."""

from __future__ import annotations

import json
from typing import Any

TIME = "2026-12-01T00:00:00Z"


def fields(*paths: str) -> dict[str, Any]:
    """A managedFields fieldsV1 tree from dotted paths ("f:status.f:phase")."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path.split("."):
            node = node.setdefault(key, {})
    return tree


def managed(manager: str, operation: str, tree: dict[str, Any], subresource: str = "") -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": TIME,
        "fieldsType": "FieldsV1",
        "fieldsV1": tree,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


CONDITION_KEYS = (
    'k:{"type":"%s"}',
    "f:lastHeartbeatTime",
    "f:lastTransitionTime",
    "f:message",
    "f:reason",
    "f:status",
    "f:type",
)


def condition_paths(types: list[str]) -> list[str]:
    return [
        f"f:status.f:conditions.{CONDITION_KEYS[0] % t}.{key}" for t in types for key in CONDITION_KEYS[1:]
    ]


NODE_CONDITIONS = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
NODE_MANAGED = [
    managed(
        "kwokctl",
        "Update",
        fields(
            "f:metadata.f:annotations.f:node.alpha.kubernetes.io/ttl",
            "f:metadata.f:annotations.f:kwok.x-k8s.io/node",
            "f:metadata.f:labels.f:beta.kubernetes.io/arch",
            "f:metadata.f:labels.f:beta.kubernetes.io/os",
            "f:metadata.f:labels.f:kubernetes.io/arch",
            "f:metadata.f:labels.f:kubernetes.io/hostname",
            "f:metadata.f:labels.f:kubernetes.io/os",
            "f:metadata.f:labels.f:kubernetes.io/role",
            "f:metadata.f:labels.f:node-role.kubernetes.io/agent",
            "f:metadata.f:labels.f:type",
            "f:spec.f:taints",
        ),
    ),
    managed(
        "gpu-operator",
        "Apply",
        fields(*[f"f:metadata.f:labels.f:nvidia.com/gpu.label-{j}" for j in range(40)]),
    ),
    managed(
        "kwok",
        "Update",
        fields(
            "f:status.f:addresses",
            "f:status.f:allocatable.f:cpu",
            "f:status.f:allocatable.f:memory",
            "f:status.f:allocatable.f:pods",
            "f:status.f:capacity.f:cpu",
            "f:status.f:capacity.f:memory",
            "f:status.f:capacity.f:pods",
            "f:status.f:daemonEndpoints.f:kubeletEndpoint.f:Port",
            "f:status.f:nodeInfo.f:architecture",
            "f:status.f:nodeInfo.f:kubeletVersion",
            "f:status.f:nodeInfo.f:operatingSystem",
            "f:status.f:phase",
            *condition_paths(NODE_CONDITIONS),
        ),
        "status",
    ),
    managed("kube-controller-manager", "Update", fields("f:spec.f:podCIDR", "f:spec.f:podCIDRs")),
]


def node(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"node-{i}",
            "uid": f"node-uid-{i}",
            "resourceVersion": str(5000 + i),
            "creationTimestamp": TIME,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": f"node-{i}",
                "kubernetes.io/os": "linux",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "type": "kwok",
                **{f"nvidia.com/gpu.label-{j}": f"value-{j}" for j in range(40)},
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "kwok.x-k8s.io/node": "fake",
                "example.com/note": "x" * 64,
            },
            "managedFields": NODE_MANAGED,
        },
        "spec": {
            "podCIDR": f"10.{i // 250}.{i % 250}.0/24",
            "podCIDRs": [f"10.{i // 250}.{i % 250}.0/24"],
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": f"10.1.{i // 250}.{i % 250}"},
                {"type": "Hostname", "address": f"node-{i}"},
            ],
            "capacity": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [
                {
                    "type": t,
                    "status": "True" if t == "Ready" else "False",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                    "lastHeartbeatTime": TIME,
                    "lastTransitionTime": TIME,
                }
                for t in NODE_CONDITIONS
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "architecture": "amd64",
                "bootID": "b",
                "containerRuntimeVersion": "containerd://2.1",
                "kernelVersion": "6.8",
                "kubeProxyVersion": "",
                "machineID": "m",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04",
                "systemUUID": "s",
            },
            "phase": "Running",
        },
    }


POD_MANAGED = [
    managed(
        "kube-controller-manager",
        "Update",
        fields(
            "f:metadata.f:generateName",
            "f:metadata.f:labels.f:app",
            'f:metadata.f:ownerReferences.k:{"uid":"ds-uid"}',
            "f:spec.f:affinity.f:nodeAffinity",
            'f:spec.f:containers.k:{"name":"driver"}.f:env',
            'f:spec.f:containers.k:{"name":"driver"}.f:image',
            'f:spec.f:containers.k:{"name":"driver"}.f:resources.f:limits',
            "f:spec.f:tolerations",
            'f:spec.f:volumes.k:{"name":"host"}.f:hostPath.f:path',
        ),
    ),
    managed(
        "kwok",
        "Update",
        fields(
            *condition_paths(["Ready", "Initialized", "ContainersReady", "PodScheduled"]),
            "f:status.f:containerStatuses",
            "f:status.f:hostIP",
            "f:status.f:phase",
            "f:status.f:podIP",
            "f:status.f:podIPs",
            "f:status.f:startTime",
        ),
        "status",
    ),
]


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pod-{i}",
            "generateName": "nvidia-driver-",
            "namespace": "gpu-operator",
            "uid": f"uid-{i}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": TIME,
            "labels": {**{f"example.com/label-{j}": f"value-{j}" for j in range(10)}, "app": "driver"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "nvidia-driver",
                    "uid": "ds-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": POD_MANAGED,
        },
        "spec": {
            "nodeName": f"node-{i}",
            "serviceAccountName": "driver",
            "containers": [
                {
                    "name": "driver",
                    "image": "nvcr.io/nvidia/driver:595.45.04",
                    "env": [{"name": f"E{j}", "value": str(j)} for j in range(5)],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            "tolerations": [{"operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
        "status": {
            "phase": "Running",
            "hostIP": f"10.1.{i // 250}.{i % 250}",
            "podIP": "10.0.0.1",
            "podIPs": [{"ip": "10.0.0.1"}],
            "startTime": TIME,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": TIME}
                for t in ("Ready", "Initialized", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "driver",
                    "ready": True,
                    "restartCount": 0,
                    "image": "driver",
                    "imageID": "sha256:0",
                    "started": True,
                    "state": {"running": {"startedAt": TIME}},
                }
            ],
        },
    }


def body(kind: str, items: list[dict[str, Any]], cont: str = "") -> bytes:
    meta = {"resourceVersion": "9", **({"continue": cont} if cont else {})}
    return json.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": items}).encode()
