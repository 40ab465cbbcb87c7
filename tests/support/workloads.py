"""GPU workloads on fake nodes: Deployments whose pods request nvidia.com/gpu (what a driver
upgrade evicts), PodDisruptionBudgets over them, and pods holding gpu.nvidia.com ResourceClaims
(allocated by the real scheduler against the DRA kubelet plugin stand-in's ResourceSlices)."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
ResourceClaimTemplate = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)  # (registered for from_dict)


def gpu_deployment(
    name: str,
    namespace: str,
    replicas: int,
    *,
    gpus: int = 1,
    node_selector: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    match = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": {**match, **(labels or {})}},
                "spec": {
                    "nodeSelector": node_selector or {"nvidia.com/gpu.present": "true"},
                    "tolerations": [
                        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "example.invalid/cuda-job:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def pdb(name: str, namespace: str, app: str, min_available: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }


def create(client: Client, *objects: dict[str, Any]) -> None:
    for obj in objects:
        client.create(from_dict(obj))


def claim_pod(
    kube: Client,
    namespace: str,
    name: str,
    count: int,
    *,
    tolerations: tuple[dict[str, Any], ...] = (),
    node_selector: dict[str, str] | None = None,
    device_class: str = "gpu.nvidia.com",
) -> None:
    """A user's pod asking, through a ResourceClaimTemplate, for `count` devices of `device_class`."""
    kube.create(
        from_dict(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": device_class,
                                        "allocationMode": "ExactCount",
                                        "count": count,
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
    )
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            *tolerations,
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    kube.create(
        from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }
        )
    )


def claim_results(kube: Client, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The allocation results (driver, pool, device) of the pod's claim; [] until it is allocated."""
    status = kube.get(Pod, pod, namespace=namespace).status
    for entry in (status.resourceClaimStatuses if status else None) or []:
        if entry.resourceClaimName:
            claim = kube.get(ResourceClaim, entry.resourceClaimName, namespace=namespace)
            devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
            return list(devices.get("results") or [])
    return []
