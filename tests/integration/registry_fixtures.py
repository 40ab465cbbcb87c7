"""The simulator's OCI registry (sim/plane/registry.py) for integration tests: one per test session,
started on first use, with our image pushed and the real node trusting it. Fails (never skips)
when it cannot start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_operator import __version__
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.registry import Registry
from gpu_operator.sim.realnode.realnode import RealNode, image_archive

REPOSITORY = "gpu-operator-py"  # our image's repository path in the registry, as on ghcr.io
IMAGE_NAME = "gpu-operator"


@dataclass(frozen=True)
class PushedImage:
    registry: Registry
    node: RealNode
    ref: str  # HOST:PORT/gpu-operator-py/gpu-operator:<version>

    @property
    def repository(self) -> str:
        """The chart's operator.repository for the registry."""
        return f"{self.registry.host}/{REPOSITORY}"


@pytest.fixture(scope="session")
def registry(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    t0 = time.monotonic()
    with Registry(Path(tmp_path_factory.mktemp("registry")), control_plane.pki.dir) as reg:
        print(f"\nregistry at {reg.host} in {time.monotonic() - t0:.1f}s (build included when cold)")
        yield reg


@pytest.fixture(scope="session")
def registry_image(registry: Registry, real_node: RealNode) -> PushedImage:
    """Our image (the archive the real node runs) pushed to the registry, and the real node's
    containerd configured for it (the simulator's CA, a forwarder into the node's network)."""
    t0 = time.monotonic()
    ref = registry.push_archive(image_archive(), f"{REPOSITORY}/{IMAGE_NAME}", __version__)
    real_node.trust_registry(registry.host, registry.ca_cert)
    print(f"\nour image pushed to {ref} in {time.monotonic() - t0:.1f}s")
    return PushedImage(registry, real_node, ref)
