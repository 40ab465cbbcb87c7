"""The control-plane and client fixtures' bodies, shared by tests/integration (one plane per
session) and tests/chaos (one per module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig

from gpu_operator.sim import binaries
from gpu_operator.sim.controlplane import ControlPlane


@contextlib.contextmanager
def running_plane(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[ControlPlane]:
    # In CI the binaries must be there (./dev builds them first); a missing build is a failure,
    # never a skip.
    found = binaries.locate(build=True)
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
