"""ClusterPolicy.warnings(): fields the operator keeps but does not act on. A driver.version
without driver.repository and driver.image is not one of them: it retags the operator's
DRIVER_IMAGE (tests/unit/render/test_driver.py), where NVIDIA's operator ignores it."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy


def _policy(driver: dict[str, Any]) -> ClusterPolicy:
    return ClusterPolicy.model_validate(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "p"},
            "spec": {"driver": driver},
        }
    )


def test_a_driver_version_alone_takes_effect_so_it_is_no_warning() -> None:
    assert _policy({"version": "580.95.05"}).warnings() == []
    assert _policy({}).warnings() == []


def test_a_misspelt_driver_field_is_still_named() -> None:
    (warning,) = _policy({"verison": "580.95.05"}).warnings()
    assert "spec.driver.verison" in warning and "ignored" in warning
