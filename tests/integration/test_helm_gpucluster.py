"""The chart's GPUCluster (`gpuCluster.deployCR`, the DRA stack), installed with real Helm against
the real apiserver: its template renders only where the resource.k8s.io/v1 DeviceClass API is
served (an offline render has no such capability), so only an install shows what it makes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import helm_python
import pytest
from lightkube import Client

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart
from tests.support.chart import helm_in

NAMESPACE = "gpu-operator-dra-values"
RELEASE = "gpu-operator"


@pytest.fixture
def helm(
    control_plane: ControlPlane, kube: Client, crds: list[str], fake_nodes: Callable[..., list[str]]
) -> Iterator[helm_python.Config]:
    with helm_in(control_plane, kube, fake_nodes, NAMESPACE, RELEASE) as config:
        yield config
    # Helm keeps the GPUCluster on uninstall (helm.sh/resource-policy: keep): not for the next test
    if any(c.metadata and c.metadata.name == "gpu-cluster" for c in kube.list(GPUClusterResource)):
        kube.delete(GPUClusterResource, "gpu-cluster")


def test_the_chart_deploys_the_gpucluster_its_values_describe(
    helm: helm_python.Config, kube: Client, tmp_path: Path
) -> None:
    values = {
        "nfd": {"enabled": False},
        "clusterPolicy": {"deployCR": False},
        "gpuCluster": {"deployCR": True},
        "driver": {"nvidiaDriverCRD": {"enabled": True}},
        "draDriver": {"version": "v25.12.0", "computeDomains": {"enabled": False}},
        "dcgmExporter": {"enabled": False},
        "daemonsets": {"priorityClassName": "system-node-critical"},
        "operator": {"cleanupOnUninstall": False},
    }
    with helm_python.Chart.load(packaged_chart(tmp_path / "chart")) as chart:
        helm.install(chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True, timeout=180)
    cluster = GPUCluster.model_validate(dict(kube.get(GPUClusterResource, "gpu-cluster")))
    assert cluster.warnings() == []  # every field it carries is one the API knows
    assert cluster.spec is not None
    dra = cluster.spec.draDriver
    assert (dra.repository, dra.image, dra.version) == ("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v25.12.0")
    assert dra.computeDomains is not None and dra.computeDomains.enabled is False
    assert not cluster.spec.dcgm_exporter_on()
    assert (
        cluster.spec.daemonsets is not None
        and cluster.spec.daemonsets.priorityClassName == "system-node-critical"
    )
    # one stack at a time: no ClusterPolicy beside it
    assert [
        p for p in kube.list(ClusterPolicyResource) if p.metadata and p.metadata.name == "cluster-policy"
    ] == []
