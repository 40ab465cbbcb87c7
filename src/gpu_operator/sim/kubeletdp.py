"""What the kubelet does to a Node's status when NVIDIA's device plugin registers with it, for a
kwok node (kwok plays the kubelet but has no device manager): once the device plugin's pod (label
app=nvidia-device-plugin-daemonset, the operator's DaemonSet) runs on the node, its status gets
`nvidia.com/gpu: <GPUs>` in capacity and allocatable; when the pod goes, what the kubelet's device
manager does when a plugin's endpoint stops.

Facts (kubernetes v1.36 pkg/kubelet, read for facts only):
- cm/devicemanager/manager.go `PluginDisconnected`: every device of the resource turns unhealthy
  and the endpoint's stop time is recorded; `GetCapacity`: capacity counts healthy + unhealthy
  devices, allocatable the healthy ones (so allocatable drops to 0 at once, capacity stays);
  once the endpoint's grace period has passed the resource is reported removed.
- cm/devicemanager/types.go: `endpointStopGracePeriod` = 5 minutes.
- nodestatus/setters.go `MachineInfo`: a removed device-plugin resource stays in capacity with
  0 ("had been registered before"); allocatable follows capacity.

The patch goes to the Node's status subresource as a strategic merge (the kubelet's node-status
patch), field manager `kubelet`. kwok v0.8.0 keeps it: its node stages write the status as a
strategic merge of a template that copies `.status.capacity`/`.allocatable` as found
(kustomize/stage/node/fast/node-initialize.yaml, pkg/utils/lifecycle/next.go) and its lease
heartbeat touches only conditions, addresses and the daemon endpoint.

Per-device health, given the kwok nodes' host trees (`sim up` does; `sim fault` changes them): a
GPU NVIDIA's plugin would report Unhealthy in ListAndWatch (a critical Xid in the node's kernel log
since the plugin's pod started, or its device node gone: `sim/xidhealth.py`, the rule of the real
node's device-plugin stand-in) still counts in capacity but not in allocatable
(manager.go `GetCapacity`); a new pod of the plugin, or a new boot (`--clear`), starts with every
GPU Healthy. The node is looked at again when `sim fault` announces it.

Not played: sharing replicas, MIG resources, a kubelet restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from gpu_operator.sim import devnodes
from gpu_operator.sim.faults import ChangeFollower, NodeHosts, follow_changes
from gpu_operator.sim.podwatch import NodeView, PodView
from gpu_operator.sim.xidhealth import XidHealth
from gpu_operator.vocabulary import GPU_RESOURCE

log = logging.getLogger("gpu_operator.sim.kubeletdp")

APP = "nvidia-device-plugin-daemonset"
FIELD_MANAGER = "kubelet"
# cm/devicemanager/types.go endpointStopGracePeriod
GRACE_PERIOD = 300.0


def desired_status(gpus: int, running: bool, stopped_for: float | None,
                   grace_period: float = GRACE_PERIOD, unhealthy: int = 0) -> dict[str, dict[str, str]] | None:
    """The `nvidia.com/gpu` capacity and allocatable the kubelet reports: the plugin running (with
    `unhealthy` of the GPUs reported Unhealthy); stopped `stopped_for` seconds ago (None: it never
    registered here: nothing)."""
    if running:
        return {"capacity": {GPU_RESOURCE: str(gpus)}, "allocatable": {GPU_RESOURCE: str(max(0, gpus - unhealthy))}}
    if stopped_for is None:
        return None
    if stopped_for <= grace_period:
        return {"capacity": {GPU_RESOURCE: str(gpus)}, "allocatable": {GPU_RESOURCE: "0"}}
    return {"capacity": {GPU_RESOURCE: "0"}, "allocatable": {GPU_RESOURCE: "0"}}


def status_patch(status: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"status": status}


class DevicePluginCapacity:
    """The kubelet's device manager for the device plugin on kwok nodes (a `podwatch.Player`)."""

    app = APP
    field_manager = FIELD_MANAGER

    def __init__(self, grace_period: float = GRACE_PERIOD, clock: Callable[[], float] = time.monotonic,
                 hosts: Path | None = None, interval: float = 2.0) -> None:
        self.grace_period, self.clock = grace_period, clock
        # node -> when its plugin stopped (None: it runs); absent: never registered here
        self.stopped_at: dict[str, float | None] = {}
        self.written: dict[str, dict[str, dict[str, str]]] = {}
        self.hosts = NodeHosts(hosts) if hosts is not None else None
        self.interval = interval
        self.health: dict[str, tuple[str, XidHealth]] = {}  # node -> (its plugin pod's uid, what it saw)
        self.wake: Callable[[str], None] = lambda _node: None

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    async def start(self, client: AsyncClient) -> None:
        if self.hosts is not None:
            self._task = asyncio.create_task(follow_changes(ChangeFollower(self.hosts.base), self.interval, self._woken),
                                             name="device-plugin-health")

    def _woken(self, node: str) -> None:
        if node in self.health:
            self.wake(node)

    def unhealthy(self, node: str, pod: PodView) -> int:
        """How many of the node's GPUs the plugin in `pod` reports Unhealthy (0 without host trees)."""
        if self.hosts is None:
            return 0
        entry = self.health.get(node)
        if entry is None or entry[0] != pod.uid:  # the plugin (re)started: it sees Xids from now on
            entry = self.health[node] = (pod.uid, XidHealth(self.hosts.root(node), pod.env))
        marked = entry[1].poll()
        root = self.hosts.root(node)
        return sum(1 for gpu in self.hosts.gpus(node)
                   if gpu.xid_address in marked or devnodes.char_device(root / f"dev/nvidia{gpu.minor}") is None)

    def stopped_for(self, node: str, view: NodeView, running: bool) -> float | None:
        """Seconds since the plugin stopped on `node` (0 while it runs), None if it never ran."""
        now = self.clock()
        if running:
            self.stopped_at[node] = None
        elif node not in self.stopped_at:
            if float(view.capacity.get(GPU_RESOURCE, 0) or 0) <= 0:
                return None
            self.stopped_at[node] = now  # registered before this stand-in started
        elif self.stopped_at[node] is None:
            self.stopped_at[node] = now
        since = self.stopped_at[node]
        return 0.0 if since is None else now - since

    async def sync(self, client: AsyncClient, node: str, view: NodeView | None,
                   pods: list[PodView]) -> float | None:
        if view is None or view.shape is None or not view.nvidia_gpus:
            self.stopped_at.pop(node, None)
            self.written.pop(node, None)
            self.health.pop(node, None)
            return None
        plugins = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        running = bool(plugins)
        unhealthy = self.unhealthy(node, plugins[-1]) if running else 0
        if not running:
            self.health.pop(node, None)
        stopped_for = self.stopped_for(node, view, running)
        wanted = desired_status(view.nvidia_gpus, running, stopped_for, self.grace_period, unhealthy)
        if wanted is not None and self.written.get(node) != wanted:
            await client.patch(Node.Status, node, status_patch(wanted), field_manager=FIELD_MANAGER)
            self.written[node] = wanted
            log.info("node %s: the device plugin %s: %s capacity %s, allocatable %s", node,
                     "runs" if running else "is gone", GPU_RESOURCE, wanted["capacity"][GPU_RESOURCE],
                     wanted["allocatable"][GPU_RESOURCE])
        if not running and stopped_for is not None and stopped_for <= self.grace_period:
            return self.grace_period - stopped_for + 0.05  # look again when the grace period ends
        return None
