"""The real node (kubelet + containerd, running our image) for integration tests: one per test
session, next to the kwok nodes, started on first use. Fails (never skips) when it cannot start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator import __version__
from gpu_operator.sim import binaries
from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.realnode import RealNode, cgroup_dirs, image_archive, node_labels
from tests.support.hostsim import fakehost

REAL_NODE = "real-node-0"
SHAPE = "host-driver"
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
IMAGE = f"ghcr.io/gpu-operator-py/gpu-operator:{__version__}"


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    archive = image_archive()
    base = Path(tmp_path_factory.mktemp("real-node"))
    host = base / "host"
    fakehost.build_file(HOSTS / "ubuntu-apt-driver.yaml", host)
    node = RealNode(base / "node", REAL_NODE, binaries.locate(), control_plane.pki.dir,
                    control_plane.apiserver_port, labels=node_labels(SHAPE), host_root=host)
    t0 = time.monotonic()
    node.start()
    try:
        refs = node.containerd.import_image(archive)
        assert IMAGE in refs, f"{archive} does not hold {IMAGE}: {refs}"
        print(f"\nreal node {REAL_NODE} Ready with our image in {time.monotonic() - t0:.1f}s")
        yield node
    finally:
        node.stop()
    # Nothing of the node may outlive it: processes, cgroups.
    assert node.sandbox.members() == []
    assert not [d for d in cgroup_dirs(REAL_NODE) if d.exists()]


def pod_log(node: RealNode, namespace: str, pod: str, container: str) -> str:
    """A container's log as the kubelet wrote it (its CRI log files under the node's podLogsDir)."""
    return "".join(p.read_text(errors="replace")
                   for d in node.pod_logs.glob(f"{namespace}_{pod}_*")
                   for p in sorted((d / container).glob("*.log")))
