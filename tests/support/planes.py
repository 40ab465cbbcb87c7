"""The control-plane and client fixtures' bodies, shared by tests/integration (one plane per
session) and tests/chaos (one per module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig

from gpu_operator.kube.crds import apply_crds
from gpu_operator.sim.plane import binaries
from gpu_operator.sim.plane.controlplane import ControlPlane


@contextlib.contextmanager
def running_plane(
    tmp_path_factory: pytest.TempPathFactory, name: str, kubernetes: str = "current"
) -> Iterator[ControlPlane]:
    # In CI the binaries must be there (./dev builds them first); a missing build is a failure,
    # never a skip.
    found = binaries.locate(build=True, kubernetes=kubernetes)
    plane = ControlPlane(Path(tmp_path_factory.mktemp(name)), found)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@contextlib.contextmanager
def admin_client(plane: ControlPlane) -> Iterator[Client]:
    """An admin lightkube client (field manager `tests`)."""
    client = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="tests")
    try:
        yield client
    finally:
        client.close()


def module_plane_fixtures(name: str, kubernetes: str = "current") -> tuple[Any, Any, Any]:
    """`control_plane, kube, crds = module_plane_fixtures(...)` in a conftest: a control plane of
    `kubernetes` for each test module of that directory (tests/chaos, tests/floor), its admin
    client and our CRDs applied once; the integration tests' function fixtures work on top."""

    @pytest.fixture(scope="module")
    def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
        with running_plane(tmp_path_factory, name, kubernetes=kubernetes) as plane:
            yield plane

    @pytest.fixture(scope="module")
    def kube(control_plane: ControlPlane) -> Iterator[Client]:
        with admin_client(control_plane) as client:
            yield client

    @pytest.fixture(scope="module")
    def crds(kube: Client) -> list[str]:
        return apply_crds(kube)

    return control_plane, kube, crds
