"""The operator (real process) against the real control plane: default policy on dgx-h100 nodes."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import reconciled
from tests.support.waiting import wait_for

CONTAINER_DEPLOY_LABELS = [
    "nvidia.com/gpu.deploy.driver",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.container-toolkit",
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.node-status-exporter",
    "nvidia.com/gpu.deploy.operator-validator",
    "nvidia.com/gpu.deploy.client",
    "nvidia.com/gpu.deploy.mig-manager",
]
DEFAULT_DAEMONSETS = {
    "nvidia-driver-daemonset",
    "nvidia-container-toolkit-daemonset",
    "nvidia-operator-validator",
    "nvidia-device-plugin-daemonset",
    "nvidia-device-plugin-mps-control-daemon",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
}


def test_default_policy_labels_nodes_and_becomes_ready(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    names = fake_nodes("dgx-h100:3")
    cpu = fake_nodes("cpu:1")[0]
    operator = start_operator()
    cluster_policies({})

    def labelled() -> bool:
        return all(
            kube.get(Node, n).metadata.labels.get(lbl) == "true"
            for n in names
            for lbl in ["nvidia.com/gpu.present", *CONTAINER_DEPLOY_LABELS]
        )

    wait_for("deploy labels on every GPU node", labelled, context=operator.log_text)
    cpu_labels = kube.get(Node, cpu).metadata.labels
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in cpu_labels)

    status = reconciled(kube, context=operator.log_text)
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["status"] == "True" and ready["Ready"]["reason"] == "Reconciled"
    assert ready["Error"]["status"] == "False"
    assert status["namespace"] == operator_namespace

    daemonsets = {str(ds.metadata.name): ds for ds in kube.list(DaemonSet, namespace=operator_namespace)}
    assert set(daemonsets) >= DEFAULT_DAEMONSETS, sorted(daemonsets)
    for name in DEFAULT_DAEMONSETS - {"nvidia-device-plugin-mps-control-daemon"}:
        ds = daemonsets[name]
        assert ds.status.desiredNumberScheduled == 3, name
        assert ds.status.numberReady == 3, name
    # MPS runs only on nodes labelled mps.capable: none here.
    assert daemonsets["nvidia-device-plugin-mps-control-daemon"].status.desiredNumberScheduled == 0
