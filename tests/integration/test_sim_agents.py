"""The simulator plays our GPU probe and vfio manager on kwok nodes (sim/probestandin.py) only where
their pods run: a node with the probe's pod gets what the probe publishes for its shape's host
tree, with the node agents' field manager; a node without it gets nothing of the probe."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node

from gpu_operator.sim import standins
from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.probestandin import PROBE_APP, VFIO_APP
from gpu_operator.sim.realspec import HOST_DRIVER_VERSION
from gpu_operator.vocabulary import (
    DRIVER_SOURCE,
    DRIVER_VERSION,
    NODE_AGENT_FIELD_MANAGER,
    PROBE_FACTS_ANNOTATION,
    PROBE_STATUS,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
)
from tests.integration.test_sim_standins import component_pod
from tests.support.waiting import wait_for

Nodes = Callable[..., list[str]]


def node_annotations(kube: Client, node: str) -> dict[str, str]:
    meta = kube.get(Node, node).metadata
    return dict((meta.annotations if meta else None) or {})


def node_labels(kube: Client, node: str) -> dict[str, str]:
    meta = kube.get(Node, node).metadata
    return dict((meta.labels if meta else None) or {})


def test_the_probe_and_vfio_manager_publish_only_where_their_pods_run(
    kube: Client, control_plane: ControlPlane, fake_nodes: Nodes, namespace: str, tmp_path: Path
) -> None:
    first, second = fake_nodes("vfio-passthrough:2")
    (host,) = fake_nodes("host-driver:1")
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with standins.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
        for name, node, app, argv in (
            ("probe-a", first, PROBE_APP, ["--default-workload=vm-passthrough"]),
            ("vfio-a", first, VFIO_APP, []),
            ("probe-h", host, PROBE_APP, ["--default-workload=container"]),
        ):
            pod = component_pod(name, namespace, node, app)
            assert pod.spec is not None
            pod.spec.containers[0].args = argv
            kube.create(pod)
        facts = json.loads(
            wait_for(
                f"the probe's facts on {first}",
                lambda: node_annotations(kube, first).get(PROBE_FACTS_ANNOTATION, ""),
                timeout=60,
            )
        )
        assert facts["driverSource"] == "vfio", facts
        assert facts["gpus"] and {g["driver"] for g in facts["gpus"]} == {"vfio-pci"}, facts
        assert all(g["vendorDevice"].startswith("10de:") for g in facts["gpus"]), facts
        got = kube.get(Node, first)
        assert got.metadata is not None
        assert (got.metadata.labels or {})[PROBE_STATUS] in ("ok", "warning", "error")
        # written as the probe writes: the node agents' field manager owns the annotation
        managers = {
            m.manager
            for m in got.metadata.managedFields or []
            if f"f:{PROBE_FACTS_ANNOTATION}" in json.dumps(m.fieldsV1)
        }
        assert managers == {NODE_AGENT_FIELD_MANAGER}, managers
        # the vfio manager's pass over the same tree: every GPU already on vfio-pci
        wait_for(
            f"the vfio manager's outcome on {first}",
            lambda: node_labels(kube, first).get(VFIO_STATE),
            until=lambda s: s == "bound",
            timeout=60,
        )
        record = json.loads(node_annotations(kube, first)[VFIO_RESULT_ANNOTATION])
        assert {g["driver"] for g in record["gpus"].values()} == {"vfio-pci"}, record
        # the host-driver node's probe pod reads that host's driver
        wait_for(
            f"the probe's labels on {host}",
            lambda: node_labels(kube, host),
            until=lambda lb: (
                lb.get(DRIVER_SOURCE) == "host" and lb.get(DRIVER_VERSION) == HOST_DRIVER_VERSION
            ),
            timeout=60,
        )
        assert VFIO_STATE not in node_labels(kube, host)  # no vfio manager pod there
    assert agents.error is None, agents.error
    # the second passthrough node ran neither pod: nothing of theirs on it
    assert PROBE_FACTS_ANNOTATION not in node_annotations(kube, second)
    assert VFIO_RESULT_ANNOTATION not in node_annotations(kube, second)
    assert not {PROBE_STATUS, DRIVER_SOURCE, VFIO_STATE} & set(node_labels(kube, second))
