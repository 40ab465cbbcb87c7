"""ClusterPolicy warnings on the real control plane: a field NVIDIA's operator silently ignores
(driver.version without repository and image) takes effect here, so no Warning Event is due."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event

from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import POLICY_WARNING_REASON
from tests.support.status import reconciled


def policy_warnings(kube: Client, name: str) -> list[str]:
    return [
        e.message or ""
        for e in kube.list(
            Event,
            namespace="default",
            fields={"involvedObject.kind": "ClusterPolicy", "involvedObject.name": name},
        )
        if e.reason == POLICY_WARNING_REASON
    ]


def test_a_driver_version_alone_retags_the_driver_image_and_warns_nothing(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    """NVIDIA's operator ignores driver.version without repository and image; ours retags the image
    it would otherwise use (DRIVER_IMAGE), so the field does what docs/upgrades.md says."""
    fake_nodes("dgx-h100:1")
    operator = start_operator()
    name = cluster_policies({"driver": {"version": "580.95.05"}})
    reconciled(kube, name, context=operator.log_text)
    driver = kube.get(DaemonSet, "nvidia-driver-daemonset", namespace=operator_namespace)
    images = [c.image for c in driver.spec.template.spec.containers if c.name == "nvidia-driver-ctr"]
    assert images == ["nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"], images
    assert policy_warnings(kube, name) == []
