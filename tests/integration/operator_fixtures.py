"""Fixtures to run the real operator process against the session's control plane."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.kube.crds import apply_crds
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.cleanup import delete_if_present


@pytest.fixture(scope="session")
def crds(kube: Client) -> list[str]:
    return apply_crds(kube)


@pytest.fixture
def operator_namespace(kube: Client) -> Iterator[str]:
    name = f"gpu-operator-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata={"name": name}))  # type: ignore[arg-type]
    yield name
    kube.delete(Namespace, name)


@pytest.fixture
def start_operator(
    control_plane: ControlPlane, operator_namespace: str, crds: list[str], tmp_path: Any
) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(**kwargs: Any) -> OperatorProcess:
        proc = OperatorProcess(
            kubeconfig=kwargs.pop("kubeconfig", control_plane.kubeconfig_for("operator")),
            namespace=operator_namespace,
            log=tmp_path / f"operator-{len(started)}.log",
            **kwargs,
        ).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        print(f"--- {proc.log} ---\n{proc.log_text()[-4000:]}")


class CustomObjects:
    """Objects of one cluster-scoped custom kind that a test creates; `delete_all` after the test
    (one already gone is fine)."""

    def __init__(self, kube: Client, resource: Any, api_version: str, kind: str) -> None:
        self.kube, self.resource, self.api_version, self.kind = kube, resource, api_version, kind
        self.created: list[str] = []

    def create(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> str:
        metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
        self.kube.create(
            self.resource(apiVersion=self.api_version, kind=self.kind, metadata=metadata, spec=spec)
        )
        self.created.append(name)
        return name

    def delete_all(self) -> None:
        for name in self.created:
            delete_if_present(self.kube, self.resource, name)


@pytest.fixture
def cluster_policies(kube: Client) -> Iterator[Callable[..., str]]:
    """`cluster_policies(spec, name=...)` creates a ClusterPolicy; all are deleted after the test
    and their owned objects garbage-collected before the next test starts."""
    objects = CustomObjects(kube, ClusterPolicyResource, "nvidia.com/v1", "ClusterPolicy")

    def create(spec: dict[str, Any] | None = None, name: str = "cluster-policy") -> str:
        return objects.create(name, spec or {})

    yield create
    objects.delete_all()


@pytest.fixture
def nvidia_drivers(kube: Client) -> Iterator[Callable[..., str]]:
    """`nvidia_drivers(name, spec, annotations=None)` creates an NVIDIADriver; all are deleted
    after the test."""
    objects = CustomObjects(kube, NVIDIADriverResource, "nvidia.com/v1alpha1", "NVIDIADriver")
    yield objects.create
    objects.delete_all()
