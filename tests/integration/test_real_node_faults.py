"""`sim fault` on the real node: its host tree changes as a host's does (a critical Xid in the kernel
log, a GPU off the bus with its device node gone), the device-plugin stand-in reports the GPU
Unhealthy through the kubelet's device-plugin API as NVIDIA's plugin does, the kubelet's
`nvidia.com/gpu` allocatable drops (capacity stays) and a pod asking for both GPUs stays Pending;
--clear (a reboot) makes it Healthy again and the pod is scheduled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.sim.commands.faultinject import inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode.realnode import RealNode
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE
from tests.support.waiting import wait_for

GPU = "nvidia.com/gpu"


@pytest.fixture
def real_state(real_node: RealNode, device_plugin_pod: RealNode, tmp_path: Path) -> Iterator[SimState]:
    """The simulator state `sim fault` reads for the real node, NVIDIA's device plugin on it
    (`device_plugin_pod`); the host is rebooted afterwards (every GPU back), whatever the test left."""
    assert real_node.host_root is not None
    state = SimState(
        dir=str(tmp_path),
        server="",
        kubeconfig="",
        binaries="",
        real_node={"name": REAL_NODE, "host_root": str(real_node.host_root)},
    )
    yield state
    inject(state, REAL_NODE, "clear", None, None)
    real_node.wait_allocatable(GPU, "2", 60)


def gpus(plane: ControlPlane) -> tuple[str, str]:
    status = plane.request("GET", f"/api/v1/nodes/{REAL_NODE}")["status"]
    return status["capacity"].get(GPU, ""), status["allocatable"].get(GPU, "")


def scheduled(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    pod = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    condition: dict[str, Any] = next(
        (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {}
    )
    return {
        "status": condition.get("status"),
        "reason": condition.get("reason"),
        "node": pod["spec"].get("nodeName"),
        "phase": pod["status"].get("phase"),
    }


def test_a_critical_xid_or_a_lost_gpu_drops_allocatable_and_clear_brings_it_back(
    control_plane: ControlPlane, real_node: RealNode, real_state: SimState, namespace: str
) -> None:
    assert gpus(control_plane) == ("2", "2")
    said = inject(real_state, REAL_NODE, "xid", 48, 1)  # double-bit ECC: the plugin marks it Unhealthy
    assert said.startswith(f"node {REAL_NODE}: GPU 1 (")
    wait_for(
        "allocatable 1 after Xid 48", lambda: gpus(control_plane), until=lambda g: g == ("2", "1"), timeout=60
    )

    control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "two-gpus"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                "containers": [
                    {
                        "name": "main",
                        "image": IMAGE,
                        "command": ["python3.11", "-c", "pass"],
                        "resources": {"limits": {GPU: "2"}},
                    }
                ],
            },
        },
    )
    pending = wait_for(
        "the 2-GPU pod unschedulable",
        lambda: scheduled(control_plane, namespace, "two-gpus"),
        until=lambda s: s["reason"] == "Unschedulable",
        timeout=60,
    )
    assert (pending["status"], pending["node"], pending["phase"]) == ("False", None, "Pending")

    inject(real_state, REAL_NODE, "clear", None, None)  # a reboot: a new plugin process, every GPU Healthy
    wait_for(
        "allocatable 2 after --clear",
        lambda: gpus(control_plane),
        until=lambda g: g == ("2", "2"),
        timeout=60,
    )
    bound = wait_for(
        "the 2-GPU pod scheduled",
        lambda: scheduled(control_plane, namespace, "two-gpus"),
        until=lambda s: s["status"] == "True",
        timeout=90,
    )
    assert bound["node"] == REAL_NODE
    control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/two-gpus?gracePeriodSeconds=0")

    inject(real_state, REAL_NODE, "gone", None, 0)  # off the bus: /dev/nvidia0 gone, still listed Unhealthy
    assert not (real_node.host_root / "dev" / "nvidia0").exists()  # type: ignore[operator]
    wait_for(
        "allocatable 1 with GPU 0 gone",
        lambda: gpus(control_plane),
        until=lambda g: g == ("2", "1"),
        timeout=60,
    )
    inject(real_state, REAL_NODE, "clear", None, None)
    wait_for("allocatable 2 again", lambda: gpus(control_plane), until=lambda g: g == ("2", "2"), timeout=60)
