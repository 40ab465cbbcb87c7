"""What the health agent reads before a GPU reset, read by its own code in a real container on the
real node, against this machine's real kernel: its own host PID (NSpid in the host's
/proc/self/status, `requests.own_host_pid`) and the processes of other containers that hold a
/dev/nvidia* file open (`holders.open_device_files`). The unit tests feed both from fixture /proc
trees; only a kernel shows that the numbers and the link targets are what the code expects.

The pod is shaped as the validator's gpu-health container: privileged, root, no hostPID, the
host's /proc read-only under /host. The "device files" are regular files each container makes in
its own /dev: no NVIDIA driver runs here, and a /dev/nvidiaN node of a host tree opens with ENXIO.
What a kernel decides is the same for both: a process's open file is named by the path it opened,
as its own mount namespace sees it. What stays unproven without a GPU: `nvidia-smi -r` itself, and
the driver's /proc/driver/nvidia/gpus (minor -> bus) on a real host (docs/health.md)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode.realnode import RealNode
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, api_log

# The holder: a process of another container with /dev/nvidia7 open until the test ends.
HOLDER = """
import os, time
open('/dev/nvidia7', 'w').close()
fd = os.open('/dev/nvidia7', os.O_RDONLY)
print('holding', os.getpid(), flush=True)
time.sleep(180)  # until the test deletes the pod
"""

# The agent's side, with the agent's own functions; it holds /dev/nvidia3 itself (as its NVML
# handles would, were they not let go first), so the test can tell its own entry by its host PID.
AGENT = """
import json, os, time
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.holders import open_device_files
from gpu_operator.node.health.requests import own_host_pid
open('/dev/nvidia3', 'w').close()
fd = os.open('/dev/nvidia3', os.O_RDONLY)
fs = HostFS('/host')
deadline = time.monotonic() + 90
held = []
while time.monotonic() < deadline:
    held = open_device_files(fs, '/dev/nvidia')
    if {d for _, _, d in held} >= {'/dev/nvidia3', '/dev/nvidia7'}:
        break
    time.sleep(0.5)
print(json.dumps({'own': own_host_pid(fs), 'getpid': os.getpid(), 'held': held}), flush=True)
time.sleep(180)  # alive while the test reads its PIDs from outside, until it deletes the pod
"""


def _nspid(pid: int) -> list[int]:
    """A process's PIDs from the machine's namespace inwards (this test runs in the machine's)."""
    found = re.search(r"^NSpid:\s*(.+)$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found, f"/proc/{pid}/status has no NSpid"
    return [int(p) for p in found.group(1).split()]


def _pod(name: str) -> dict[str, Any]:
    root = {"runAsUser": 0, "runAsGroup": 0}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": REAL_NODE,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "holder",
                    "image": IMAGE,
                    "command": ["python3.11", "-c", HOLDER],
                    "securityContext": root,
                },
                {
                    "name": "agent",
                    "image": IMAGE,
                    "command": ["python3.11", "-c", AGENT],
                    "securityContext": {"privileged": True, **root},
                    "volumeMounts": [
                        {
                            "name": "host-proc",
                            "mountPath": "/host/proc",
                            "readOnly": True,
                            "mountPropagation": "HostToContainer",
                        }
                    ],
                },
            ],
            "terminationGracePeriodSeconds": 0,
            "volumes": [{"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}}],
        },
    }


def test_the_agent_knows_its_host_pid_and_another_containers_open_gpu_file_on_a_real_kernel(
    control_plane: ControlPlane, real_node: RealNode, namespace: str
) -> None:
    name = "holders"
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    control_plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", _pod(name))
    try:
        _check(control_plane, namespace, name, path)
    finally:
        control_plane.request("DELETE", path, {"gracePeriodSeconds": 0})


def _report(plane: ControlPlane, namespace: str, name: str, path: str, container: str, start: str) -> str:
    """The first line of a running container's log that starts with `start`, once it is there."""
    deadline = time.monotonic() + 180
    while True:
        pod: dict[str, Any] = plane.request("GET", path)
        state: dict[str, Any] = next(
            (s["state"] for s in pod["status"].get("containerStatuses") or [] if s["name"] == container), {}
        )
        if "running" in state:
            found = [line for line in api_log(plane, namespace, name, container) if line.startswith(start)]
            if found:
                return found[0]
        assert "terminated" not in state, (api_log(plane, namespace, name, container), pod["status"])
        assert time.monotonic() < deadline, f"pod {namespace}/{name}: {pod['status']}"
        time.sleep(0.5)


def _check(plane: ControlPlane, namespace: str, name: str, path: str) -> None:
    seen = json.loads(_report(plane, namespace, name, path, "agent", "{"))
    holder = int(_report(plane, namespace, name, path, "holder", "holding").split()[1])

    # Its own PID as the host numbers it is not the PID its container gives it (the defect the
    # issue found: os.getpid() was compared with host PIDs), and the kernel agrees which it is.
    own = seen["own"]
    assert own != seen["getpid"], seen
    assert _nspid(own) == [own, seen["getpid"]], (own, seen)

    # Both open files are found, each with the host PID of the process that holds it and the
    # path as that process opened it in its own container.
    held = {device: (pid, comm) for pid, comm, device in seen["held"]}
    assert held["/dev/nvidia3"] == (own, "python3.11"), seen
    assert held["/dev/nvidia7"][1] == "python3.11", seen
    holder_host = held["/dev/nvidia7"][0]
    assert holder_host != own
    assert _nspid(holder_host) == [holder_host, holder], (holder_host, holder)
    # The agent's rule (requests.RequestActor: a holder whose pid is its own does not count)
    # leaves exactly the other container's process.
    assert [pid for pid, _, device in seen["held"] if pid != own] == [holder_host]
