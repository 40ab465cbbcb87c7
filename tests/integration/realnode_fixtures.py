"""The real node (kubelet + containerd, running our image) for integration tests: one per test
session, next to the kwok nodes, started on first use. Fails (never skips) when it cannot start."""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator import __version__
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.plane import binaries
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode import nvruntime, toolkit
from gpu_operator.sim.realnode.cudasample import CUDA_SAMPLE_IMAGE
from gpu_operator.sim.realnode.pluginimage import DEVICE_PLUGIN_IMAGE
from gpu_operator.sim.realnode.realnode import RealNode, cgroup_dirs, image_archive
from gpu_operator.sim.realnode.realspec import host_spec, node_labels
from tests.support import realplugin

REAL_NODE = "real-node-0"
SHAPE = "host-driver"
NO_DRIVER_SHAPE = "dgx-h100"  # its driver would come from the operator (an NVIDIA image)
MERGE = "application/merge-patch+json"
GPU_LABEL_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/", "gpu-operator.sim/")
IMAGE = f"ghcr.io/gpu-operator-py/gpu-operator:{__version__}"


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    archive = image_archive()
    base = Path(tmp_path_factory.mktemp("real-node"))
    host, broken = base / "host", base / "host-no-driver"
    hosttree.build(host_spec(SHAPE), host)
    # GPUs with no driver installed (for the pending-validation test).
    hosttree.build(host_spec(NO_DRIVER_SHAPE), broken)
    # No GPU labels until a test asks for them (`real_gpu_node`): other tests' policies (rootFS /)
    # must not run our operands on this machine's own root.
    node = RealNode(
        base / "node",
        REAL_NODE,
        binaries.locate(),
        control_plane.pki.dir,
        control_plane.apiserver_port,
        host_root=host,
        other_host_roots=(broken,),
        egress_routes=control_plane.egress_routes,
    )
    t0 = time.monotonic()
    node.start()
    try:
        refs = node.import_images(archive)
        assert {IMAGE, CUDA_SAMPLE_IMAGE, DEVICE_PLUGIN_IMAGE} <= set(refs), f"{archive}: {refs}"
        print(f"\nreal node {REAL_NODE} Ready with our image in {time.monotonic() - t0:.1f}s")
        yield node
    finally:
        node.stop()
    # Nothing of the node may outlive it: processes, cgroups.
    assert node.sandbox.members() == []
    assert not [d for d in cgroup_dirs(node.cgroup_name) if d.exists()]


def _labelled(node: RealNode, shape: str) -> Iterator[RealNode]:
    path = f"/api/v1/nodes/{REAL_NODE}"
    node.admin("PATCH", path, {"metadata": {"labels": node_labels(shape)}}, MERGE)
    yield node
    meta = node.admin("GET", path)["metadata"]
    gpu = {k: None for k in meta.get("labels", {}) if k.startswith(GPU_LABEL_PREFIXES)}
    notes = {k: None for k in meta.get("annotations", {}) if k.startswith(GPU_LABEL_PREFIXES)}
    node.admin("PATCH", path, {"metadata": {"labels": gpu, "annotations": notes}}, MERGE)


@pytest.fixture
def device_plugin_pod(real_node: RealNode) -> Iterator[RealNode]:
    """NVIDIA's device plugin deployed on the real node without the operator (`realplugin`), for
    one test, its GPUs allocatable; afterwards the pod is deleted (and its socket gone)."""
    assert real_node.host_root is not None
    realplugin.start(real_node, real_node.host_root)
    try:
        real_node.wait_allocatable("nvidia.com/gpu", str(len(toolkit.gpus(real_node.host_root))), 120)
        yield real_node
    finally:
        realplugin.stop(real_node)


@pytest.fixture
def real_gpu_node(real_node: RealNode) -> Iterator[RealNode]:
    """The real node labelled as a GPU node of SHAPE for one test (our operands may select it);
    afterwards every GPU label and annotation (the shape's, the operator's, the agents') is
    removed again. Request it before the operator and policy fixtures: it is undone after them."""
    yield from _labelled(real_node, SHAPE)


@pytest.fixture
def real_passthrough_node(real_node: RealNode) -> Iterator[RealNode]:
    """The same, labelled as a vfio-passthrough node (nvidia.com/gpu.workload.config=vm-passthrough)."""
    yield from _labelled(real_node, "vfio-passthrough")


def api_log(
    plane: ControlPlane, namespace: str, pod: str, container: str, previous: bool = False
) -> list[str]:
    """A container's log lines as `kubectl logs` reads them: through the apiserver, which fetches
    them from the real node's kubelet (through the control plane's egress proxy)."""
    query = urllib.parse.urlencode({"container": container, **({"previous": "true"} if previous else {})})
    req = urllib.request.Request(f"{plane.server}/api/v1/namespaces/{namespace}/pods/{pod}/log?{query}")
    try:
        with urllib.request.urlopen(req, context=plane.ssl_context("admin"), timeout=30) as resp:
            return str(resp.read().decode(errors="replace")).splitlines()
    except urllib.error.HTTPError as err:
        raise AssertionError(
            f"log of {namespace}/{pod}/{container}: HTTP {err.code} {err.read()[:500]!r}"
        ) from err


@contextlib.contextmanager
def gpus_of(node: RealNode, host_root: Path, mig_strategy: str) -> Iterator[None]:
    """For one test, the real node's GPUs are those of another host tree (MIG-capable ones: the
    session's node has L40S): its device plugin's pod (`device_plugin_pod`) replaced by one over
    that tree with `mig_strategy` and the `nvidia` runtime handler (read at each container's
    creation) given it; afterwards the node's own tree, plugin pod and handler again, with its GPUs
    allocatable as before. Callers wait for the allocatable they expect."""
    own = node.host_root
    assert own is not None, "the real node has no host tree"
    tree = Path(host_root).absolute()
    try:
        realplugin.stop(node)
        node.runtime_wrapper.write_text(nvruntime.wrapper_script(tree))
        realplugin.start(node, tree, mig_strategy)
        yield
    finally:
        realplugin.stop(node)
        node.runtime_wrapper.write_text(nvruntime.wrapper_script(own))
        realplugin.start(node, own)
        node.wait_allocatable("nvidia.com/gpu", str(len(toolkit.gpus(own))), 60)
