"""`helm install` with values that cannot work, with real Helm against the real apiserver: the
error names the key to fix, and nothing is left that `helm uninstall` cannot remove."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart, release_names
from tests.support.chart import helm_in
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-bad-values"
RELEASE = "gpu-operator"


@pytest.fixture
def helm(
    control_plane: ControlPlane, kube: Client, crds: list[str], fake_nodes: Callable[..., list[str]]
) -> Iterator[helm_python.Config]:
    with helm_in(control_plane, kube, fake_nodes, NAMESPACE, RELEASE) as config:
        yield config


def _install(helm: helm_python.Config, chart_dir: Path, values: dict[str, Any]) -> str:
    with helm_python.Chart.load(packaged_chart(chart_dir)) as chart, pytest.raises(Exception) as failed:
        helm.install(
            chart,
            RELEASE,
            {"nfd": {"enabled": False}, **values},
            namespace=NAMESPACE,
            create_namespace=True,
            timeout=90,
        )
    return str(failed.value)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"mig": {"strategy": "all"}}, 'mig.strategy="all" is not a MIG strategy'),
        ({"operator": {"replicas": "two"}}, "operator.replicas=two is not a pod count"),
        ({"operator": {"logging": {"level": "trace"}}}, 'operator.logging.level="trace" is not a log level'),
    ],
)
def test_values_the_chart_refuses_install_nothing(
    helm: helm_python.Config, kube: Client, tmp_path: Path, values: dict[str, Any], key: str
) -> None:
    message = _install(helm, tmp_path / "chart", values)
    assert key in message, message
    assert RELEASE not in release_names(helm)
    assert list(kube.list(Deployment, namespace=NAMESPACE)) == []


def test_a_value_the_apiserver_refuses_names_the_field_and_uninstall_removes_the_release(
    helm: helm_python.Config, kube: Client, tmp_path: Path
) -> None:
    # Passes the chart's render; the ClusterPolicy CRD's pattern for a Prometheus duration refuses it.
    message = _install(helm, tmp_path / "chart", {"dcgmExporter": {"serviceMonitor": {"interval": "often"}}})
    assert "spec.dcgmExporter.serviceMonitor.interval" in message, message
    assert [
        p for p in kube.list(ClusterPolicyResource) if p.metadata and p.metadata.name == "cluster-policy"
    ] == []
    # A half-installed (failed) release: the uninstall removes it and what it created.
    assert RELEASE in release_names(helm)
    helm.uninstall(RELEASE, timeout=180)
    assert RELEASE not in release_names(helm)
    wait_for(
        "the operator Deployment gone",
        lambda: list(kube.list(Deployment, namespace=NAMESPACE)),
        until=lambda left: left == [],
        timeout=60,
    )
