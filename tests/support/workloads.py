"""GPU workloads on fake nodes: Deployments whose pods request nvidia.com/gpu (what a driver
upgrade evicts) and PodDisruptionBudgets over them."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict


def gpu_deployment(name: str, namespace: str, replicas: int, *, gpus: int = 1,
                   node_selector: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    match = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": {**match, **(labels or {})}},
                "spec": {
                    "nodeSelector": node_selector or {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "cuda", "image": "example.invalid/cuda-job:1",
                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                },
            },
        },
    }


def pdb(name: str, namespace: str, app: str, min_available: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}}


def create(client: Client, *objects: dict[str, Any]) -> None:
    for obj in objects:
        client.create(from_dict(obj))
