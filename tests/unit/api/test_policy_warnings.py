"""Fields set in a way that has no effect are named in ClusterPolicy.warnings()."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy


def _policy(driver: dict[str, Any]) -> ClusterPolicy:
    return ClusterPolicy.model_validate({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                         "metadata": {"name": "p"}, "spec": {"driver": driver}})


def test_a_driver_version_alone_is_named_with_the_fix() -> None:
    (warning,) = _policy({"version": "580.95.05"}).warnings()
    assert "driver.version '580.95.05'" in warning and "driver.repository and driver.image" in warning
    assert _policy({"version": "580.95.05", "repository": "nvcr.io/nvidia", "image": "driver"}).warnings() == []
    assert _policy({}).warnings() == []
