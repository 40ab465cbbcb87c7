"""Which node keys the cleanup takes back: ours (by field manager in managedFields), never a user's."""

from __future__ import annotations

from typing import Any

from gpu_operator.controllers.cleanup import cleanup_patch, owned_keys


def _entry(manager: str, labels: list[str], annotations: list[str] = []) -> dict[str, Any]:  # noqa: B006
    meta: dict[str, Any] = {}
    if labels:
        meta["f:labels"] = {f"f:{k}": {} for k in labels}
    if annotations:
        meta["f:annotations"] = {f"f:{k}": {} for k in annotations}
    return {"manager": manager, "operation": "Update", "fieldsV1": {"f:metadata": meta}}


NODE = {
    "metadata": {
        "name": "gpu-1",
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.driver": "false",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.workload.config": "container",
            "nvidia.com/gpu.driver.source": "host",
            "kubernetes.io/hostname": "gpu-1",
            "nvidia.com/mig.config": "all-disabled",
        },
        "annotations": {
            "nvidia.com/gpu-driver-upgrade-enabled": "true",
            "nvidia.com/gpu.passthrough.devices": "x",
            "node.alpha.kubernetes.io/ttl": "0",
        },
        "managedFields": [
            _entry(
                "gpu-operator",
                [
                    "nvidia.com/gpu.present",
                    "nvidia.com/gpu.deploy.device-plugin",
                    "nvidia.com/mig.config",
                    "nvidia.com/gone",
                ],
                ["nvidia.com/gpu-driver-upgrade-enabled"],
            ),
            _entry("gpu-operator-node", ["nvidia.com/gpu.driver.source"]),
            _entry(
                "kubectl-label",
                ["nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.workload.config"],
                ["nvidia.com/gpu.passthrough.devices"],
            ),
            _entry("kubelet", ["kubernetes.io/hostname"], ["node.alpha.kubernetes.io/ttl"]),
        ],
    }
}


def test_only_keys_our_managers_own_are_taken_back() -> None:
    labels, annotations = owned_keys(NODE["metadata"])
    assert labels == {
        "nvidia.com/gpu.present",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/mig.config",
        "nvidia.com/gpu.driver.source",
    }
    assert annotations == {"nvidia.com/gpu-driver-upgrade-enabled"}
    assert cleanup_patch(NODE) == {
        "metadata": {
            "labels": dict.fromkeys(sorted(labels)),
            "annotations": {"nvidia.com/gpu-driver-upgrade-enabled": None},
        }
    }


def test_a_node_without_our_keys_needs_no_patch() -> None:
    plain = {
        "metadata": {"name": "cpu-1", "labels": {"a": "b"}, "managedFields": [_entry("gpu-operator", ["a"])]}
    }  # not under nvidia.com/
    assert cleanup_patch(plain) is None


def test_a_kept_label_stays_out_of_the_patch() -> None:
    patch = cleanup_patch(NODE, frozenset({"nvidia.com/gpu.deploy.device-plugin"}))
    assert patch is not None and "nvidia.com/gpu.deploy.device-plugin" not in patch["metadata"]["labels"]
    assert "nvidia.com/gpu.present" in patch["metadata"]["labels"]
