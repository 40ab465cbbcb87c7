"""The oldest Kubernetes we support, run for real: its apiserver, controller-manager and scheduler
(tools/controlplane/kube-floor) with kwok nodes. The chart's kubeVersion names this floor; the
default policy becomes ready on it, the packaged chart installs and uninstalls, and the DRA stack
(which the floor does not serve) is reported with the fix instead of failing silently."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.cleanup import delete_if_present
from tests.support.helm_cli import MAJORS, HelmCLI
from tests.support.status import condition, reconciled
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FLOOR_ENV = ROOT / "tools" / "controlplane" / "kube-floor" / "version.env"
CHART_YAML = ROOT / "deployments" / "gpu-operator" / "Chart.yaml"
DEFAULT_DAEMONSETS = {
    "nvidia-driver-daemonset",
    "nvidia-container-toolkit-daemonset",
    "nvidia-operator-validator",
    "nvidia-device-plugin-daemonset",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
}
RELEASE, HELM_NAMESPACE = "gpu-operator", "gpu-operator-floor"


def floor_version() -> str:
    found = re.search(r"^KUBE_FLOOR_VERSION=(v\d+\.\d+\.\d+)$", FLOOR_ENV.read_text(), re.M)
    assert found, f"{FLOOR_ENV} names no KUBE_FLOOR_VERSION=vX.Y.Z"
    return found.group(1)


def test_the_floor_runs_and_is_the_charts_kube_version(control_plane: ControlPlane) -> None:
    served = control_plane.request("GET", "/version")
    assert served["gitVersion"] == floor_version(), served
    constraint = str(yaml.safe_load(CHART_YAML.read_text())["kubeVersion"])
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0", constraint)
    assert found, f"Chart.yaml kubeVersion {constraint!r} is not '>=1.N.0-0'"
    assert (found.group(1), found.group(2)) == (served["major"], served["minor"]), (constraint, served)


def test_the_default_policy_becomes_ready_on_the_floor(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:2", "host-driver:1")
    cpu = fake_nodes("cpu:1")[0]
    operator = start_operator()
    cluster_policies({})

    status = reconciled(kube, context=operator.log_text)
    assert condition(status, "Ready")["status"] == "True", status
    for name in gpu_nodes:
        labels = kube.get(Node, name).metadata.labels
        assert labels.get("nvidia.com/gpu.present") == "true", (name, labels)
        assert labels.get("nvidia.com/gpu.deploy.operator-validator") == "true", (name, labels)
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in kube.get(Node, cpu).metadata.labels)
    daemonsets = {str(ds.metadata.name): ds for ds in kube.list(DaemonSet, namespace=operator_namespace)}
    assert set(daemonsets) >= DEFAULT_DAEMONSETS, sorted(daemonsets)
    for name in DEFAULT_DAEMONSETS - {"nvidia-mig-manager"}:
        assert (daemonsets[name].status.desiredNumberScheduled, daemonsets[name].status.numberReady) == (
            3,
            3,
        ), name
    assert daemonsets["nvidia-mig-manager"].status.numberReady == 2  # the MIG-capable dgx-h100 nodes
    # Every write was accepted (an apply with a field the floor's schemas lack is refused): the
    # level field of each log line ("<date> <time> LEVEL logger: message").
    errors = [line for line in operator.log_text().splitlines() if line.split()[2:3] == ["ERROR"]]
    assert errors == [], errors[:5]


@pytest.fixture(params=MAJORS, ids=[f"helm{m}" for m in MAJORS])
def helm(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    kube: Client,
    crds: list[str],
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> Iterator[HelmCLI]:
    """The helm command line, Helm 3 and Helm 4 (tests/support/helm_cli.py), with a kwok node
    where kwok completes the chart's hook Job pods."""
    fake_nodes("cpu:1")
    cli = HelmCLI(request.param, control_plane.admin_kubeconfig, HELM_NAMESPACE, tmp_path / "helm")
    yield cli
    if RELEASE in cli.releases():
        cli.uninstall(RELEASE)
    delete_if_present(kube, Namespace, HELM_NAMESPACE)
    wait_for(
        "the namespace gone",
        lambda: [n for n in kube.list(Namespace) if n.metadata.name == HELM_NAMESPACE],
        until=lambda left: not left,
        timeout=120,
    )


def test_the_packaged_chart_installs_and_uninstalls_on_the_floor(
    helm: HelmCLI, kube: Client, tmp_path: Path
) -> None:
    helm.install(packaged_chart(tmp_path / "chart"), RELEASE, {"nfd": {"enabled": False}}, timeout=120)
    assert [(h["revision"], h["status"]) for h in helm.history(RELEASE)] == [(1, "deployed")]
    deployments = [str(d.metadata.name) for d in kube.list(Deployment, namespace=HELM_NAMESPACE)]
    assert deployments == ["gpu-operator"], deployments
    assert kube.get(ClusterPolicyResource, "cluster-policy").metadata.name == "cluster-policy"
    helm.uninstall(RELEASE)
    assert RELEASE not in helm.releases()
    wait_for(
        "the operator Deployment gone",
        lambda: list(kube.list(Deployment, namespace=HELM_NAMESPACE)),
        until=lambda left: left == [],
        timeout=60,
    )
    delete_if_present(kube, ClusterPolicyResource, "cluster-policy")  # helm.sh/resource-policy: keep


def test_a_gpucluster_on_the_floor_says_dra_is_not_served(
    kube: Client, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    kube.create(
        from_dict(
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "GPUCluster",
                "metadata": {"name": "gpu-cluster"},
                "spec": {
                    "draDriver": {
                        "repository": "nvcr.io/nvidia",
                        "image": "dra-driver-nvidia-gpu",
                        "version": "v0.5.0",
                    }
                },
            }
        )
    )
    try:

        def status() -> dict[str, Any]:
            return dict(kube.get(GPUClusterResource, "gpu-cluster").get("status") or {})

        failed = wait_for(
            "the GPUCluster's Error condition",
            status,
            until=lambda s: bool(condition(s, "Error")),
            timeout=60,
            context=operator.log_text,
        )
        assert condition(failed, "Ready")["status"] == "False", failed
        error = condition(failed, "Error")
        assert error["status"] == "True", failed
        assert "enable Dynamic Resource Allocation" in error["message"], error
    finally:
        kube.patch(
            GPUClusterResource, "gpu-cluster", {"metadata": {"finalizers": []}}, patch_type=PatchType.MERGE
        )
        delete_if_present(kube, GPUClusterResource, "gpu-cluster")


def test_resource_claims_read_as_not_served_on_the_floor(control_plane: ControlPlane) -> None:
    """The drains' claim read (kube/reads.py) finds no ResourceClaim version here and says so with
    None (a claim a pod names then counts), instead of failing the upgrade pass."""
    from gpu_operator.kube.reach import run_kube

    async def read(kube: Any) -> Any:
        return await kube.list_resource_claims(), await kube.list_resource_claims("default")

    assert run_kube(str(control_plane.admin_kubeconfig), "reading ResourceClaims", read) == (None, None)
