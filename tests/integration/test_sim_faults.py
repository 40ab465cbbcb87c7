"""`sim fault` on kwok nodes, end to end on the control plane: where the operator-validator pod runs
with its gpu-health container, the health agent's stand-in (sim/standins/health.py) publishes the node's
report; an Xid 79 injected on one GPU turns it unhealthy with action reboot (on a host whose driver
keeps a recovery action, the report carries the driver's node-reboot), --clear (a reboot)
healthy again; a node nobody faulted gets only its first report, a node without the pod nothing.
The writes are counted in the apiserver's audit log. The command itself on a simulator `sim up`
started (its stand-ins process plays the agent, and the device plugin, whose allocatable drops
by the Unhealthy GPU), with its errors for a bad node or GPU. (What the operator makes of the report is
tested with the operator.)"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.sim.commands.faultinject import inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware.faults import FaultError, NodeHosts, node_host_spec
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.standins import kubeletdp, roster
from gpu_operator.sim.standins.health import APP, CONTAINER
from gpu_operator.vocabulary import HEALTH_REPORT_ANNOTATION, NODE_AGENT_FIELD_MANAGER
from tests.support.components import COMPONENT_ACCOUNT, component_account
from tests.support.waiting import wait_for

Nodes = Callable[..., list[str]]


def validator_pod(namespace: str, node: str) -> Pod:
    """A pod bound to a kwok node (kwok marks it Running) shaped like the operator-validator's:
    its label, its main container and the gpu-health container with the validations it expects."""
    return cast(
        Pod,
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"validator-{node}", "namespace": namespace, "labels": {"app": APP}},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": COMPONENT_ACCOUNT,
                    "containers": [
                        {"name": APP, "image": "example.invalid/validator:1"},
                        {
                            "name": CONTAINER,
                            "image": "example.invalid/validator:1",
                            "env": [{"name": "HEALTH_VALIDATIONS", "value": "driver,toolkit,cuda,plugin"}],
                        },
                    ],
                },
            }
        ),
    )


def report(kube: Client, node: str) -> dict[str, Any]:
    """The node's health report ({} while it has none)."""
    meta = kube.get(Node, node).metadata
    text = ((meta.annotations if meta else None) or {}).get(HEALTH_REPORT_ANNOTATION)
    return {} if text is None else cast(dict[str, Any], json.loads(text))


def agent_patches(plane: ControlPlane, node: str) -> int:
    """Completed patches of the Node by the node agents' field manager (the audit log's fields)."""
    count = 0
    for event in plane.audit_events():
        ref = event.get("objectRef", {})
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(event.get("requestURI", "")).query)
        if (
            event.get("verb") == "patch"
            and event.get("stage") == "ResponseComplete"
            and ref.get("resource") == "nodes"
            and ref.get("name") == node
            and not ref.get("subresource")
            and query.get("fieldManager") == [NODE_AGENT_FIELD_MANAGER]
        ):
            count += 1
    return count


def test_an_xid_79_reaches_the_nodes_health_report_and_clear_brings_it_back(
    control_plane: ControlPlane, kube: Client, fake_nodes: Nodes, namespace: str, tmp_path: Path
) -> None:
    faulted, quiet, bare = fake_nodes("dgx-h100:3")
    state = SimState(
        dir=str(tmp_path),
        server=control_plane.server,
        kubeconfig=str(control_plane.admin_kubeconfig),
        binaries="",
    )
    # the faulted node's host runs a driver from 565, which keeps a recovery action per GPU
    # (every shape's is 550: sim/hardware/recovery.py, sim/hardware/nvmltree.py)
    spec = node_host_spec("dgx-h100")
    spec["driver_version"] = "570.133.20"
    NodeHosts(tmp_path / "hosts").faults(faulted, spec)
    with pytest.raises(
        FaultError, match=r"NODE 'no-such-node': no such node in this simulator: give one of "
    ):
        inject(state, "no-such-node", "xid", 79, None)
    with pytest.raises(FaultError, match=r"--gpu 8: this host has 8 GPU\(s\): give an index from 0 to 7"):
        inject(state, faulted, "xid", 79, 8)

    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with roster.running(config, nodes=False, hosts=tmp_path / "hosts") as health:
        for node in (faulted, quiet):
            kube.create(validator_pod(namespace, node))
        for node in (faulted, quiet):
            first = wait_for(f"{node}'s first health report", lambda n=node: report(kube, n))  # type: ignore[misc]
            assert (first["state"], first["action"], first["healthy"], first["validated"]) == (
                "healthy",
                "none",
                8,
                True,
            )

        said = inject(state, faulted, "xid", 79, 1)
        assert said.startswith(f"node {faulted}: GPU 1 (")
        bad = wait_for(
            "the Xid 79 in the report",
            lambda: report(kube, faulted),
            until=lambda r: r.get("state") not in (None, "healthy"),
        )
        assert (bad["state"], bad["action"], bad["healthy"]) == ("unhealthy", "reboot", 7)
        (gpu,) = bad["gpus"]
        assert (gpu["xid"], gpu["state"], gpu["action"]) == (79, "unhealthy", "reboot")
        # the agent read NVML as the host answers it: the driver asks for a node reboot (RESTART_BM)
        assert "nvml" in bad["sources"] and gpu["recovery"] == "node-reboot"

        inject(state, faulted, "clear", None, None)
        good = wait_for(
            "the report healthy again after --clear",
            lambda: report(kube, faulted),
            until=lambda r: r.get("state") == "healthy",
        )
        assert (good["action"], good["healthy"], good["gpus"]) == ("none", 8, [])
    assert health.error is None
    assert report(kube, bare) == {}
    # first report, unhealthy, healthy again; the quiet node its first report only; the bare node none
    assert [agent_patches(control_plane, n) for n in (faulted, quiet, bare)] == [3, 1, 0]


def plugin_pod(namespace: str, node: str) -> Pod:
    """A pod labelled like NVIDIA's device plugin's, bound to a kwok node."""
    return cast(
        Pod,
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"device-plugin-{node}",
                    "namespace": namespace,
                    "labels": {"app": kubeletdp.APP},
                },
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": COMPONENT_ACCOUNT,
                    "containers": [{"name": "nvidia-device-plugin", "image": "example.invalid/dp:1"}],
                },
            }
        ),
    )


def gpus(kube: Client, node: str) -> tuple[str | None, str | None]:
    status = kube.get(Node, node).status
    assert status is not None
    return (status.capacity or {}).get("nvidia.com/gpu"), (status.allocatable or {}).get("nvidia.com/gpu")


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_command_on_a_simulator_sim_up_started(tmp_path: Path) -> None:
    where = str(tmp_path / "sim")
    up = sim("up", "--dir", where, "--shape", "dgx-h100:2")
    assert up.returncode == 0, up.stderr
    try:
        state = SimState.load(Path(where))
        assert state is not None
        kube = Client(KubeConfig.from_file(state.kubeconfig))
        component_account(kube, "default")  # the stand-ins call as the pods' ServiceAccount
        kube.create(validator_pod("default", "dgx-h100-0"))
        kube.create(plugin_pod("default", "dgx-h100-0"))
        first = wait_for("the first health report", lambda: report(kube, "dgx-h100-0"))
        assert (first["state"], first["action"]) == ("healthy", "none")
        wait_for(
            "the device plugin's 8 GPUs", lambda: gpus(kube, "dgx-h100-0"), until=lambda g: g == ("8", "8")
        )

        xid = sim("fault", "dgx-h100-0", "--xid", "79", "--gpu", "1", "--dir", where)
        assert xid.returncode == 0, xid.stderr
        assert xid.stdout.startswith(
            "node dgx-h100-0: GPU 1 (0000:42:00.0): Xid 79 written to the kernel log"
        )
        bad = wait_for(
            "the Xid in the report",
            lambda: report(kube, "dgx-h100-0"),
            until=lambda r: r.get("state") not in (None, "healthy"),
        )
        assert (bad["state"], bad["action"], [g["bus"] for g in bad["gpus"]]) == (
            "unhealthy",
            "reboot",
            ["0000:42:00.0"],
        )
        # the device plugin reports that GPU Unhealthy: counted in capacity, not in allocatable
        wait_for("allocatable 7", lambda: gpus(kube, "dgx-h100-0"), until=lambda g: g == ("8", "7"))

        unknown = sim("fault", "dgx-h100-9", "--gone", "--dir", where)
        assert unknown.returncode == 1
        assert (
            "error: NODE 'dgx-h100-9': no such node in this simulator: give one of dgx-h100-0, dgx-h100-1"
            in unknown.stderr
        )
        out_of_range = sim("fault", "dgx-h100-1", "--gone", "--gpu", "8", "--dir", where)
        assert out_of_range.returncode == 1
        assert "error: --gpu 8: this host has 8 GPU(s): give an index from 0 to 7" in out_of_range.stderr

        clear = sim("fault", "dgx-h100-0", "--clear", "--dir", where)
        assert clear.returncode == 0, clear.stderr
        good = wait_for(
            "the report healthy again",
            lambda: report(kube, "dgx-h100-0"),
            until=lambda r: r.get("state") == "healthy",
        )
        assert good["gpus"] == []
        wait_for("allocatable 8 again", lambda: gpus(kube, "dgx-h100-0"), until=lambda g: g == ("8", "8"))
        assert report(kube, "dgx-h100-1") == {}  # no validator pod there: no agent
        kube.close()
    finally:
        down = sim("down", "--dir", where)
    assert down.returncode == 0, down.stderr
