"""Fixtures to run the real operator process against the session's control plane."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.kube.crds import apply_crds
from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.operator_process import OperatorProcess


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
def start_operator(control_plane: ControlPlane, operator_namespace: str, crds: list[str],
                   tmp_path: Any) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(**kwargs: Any) -> OperatorProcess:
        proc = OperatorProcess(kubeconfig=kwargs.pop("kubeconfig", control_plane.kubeconfig_for("operator")),
                               namespace=operator_namespace,
                               log=tmp_path / f"operator-{len(started)}.log", **kwargs).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        print(f"--- {proc.log} ---\n{proc.log_text()[-4000:]}")


@pytest.fixture
def cluster_policies(kube: Client) -> Iterator[Callable[..., str]]:
    """`cluster_policies(spec, name=...)` creates a ClusterPolicy; all are deleted after the test
    and their owned objects garbage-collected before the next test starts."""
    created: list[str] = []

    def create(spec: dict[str, Any] | None = None, name: str = "cluster-policy") -> str:
        kube.create(ClusterPolicyResource(  # type: ignore[call-overload]  # metadata as a dict
            apiVersion="nvidia.com/v1", kind="ClusterPolicy", metadata={"name": name}, spec=spec or {}))
        created.append(name)
        return name

    yield create
    for name in created:
        try:
            kube.delete(ClusterPolicyResource, name)
        except ApiError as err:
            if err.status.code != 404:
                raise


@pytest.fixture
def nvidia_drivers(kube: Client) -> Iterator[Callable[..., str]]:
    """`nvidia_drivers(name, spec, annotations=None)` creates an NVIDIADriver; all are deleted
    after the test."""
    created: list[str] = []

    def create(name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> str:
        metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
        kube.create(NVIDIADriverResource(  # type: ignore[call-overload]  # metadata as a dict
            apiVersion="nvidia.com/v1alpha1", kind="NVIDIADriver", metadata=metadata, spec=spec))
        created.append(name)
        return name

    yield create
    for name in created:
        try:
            kube.delete(NVIDIADriverResource, name)
        except ApiError as err:
            if err.status.code != 404:
                raise
