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
since the plugin's pod started, or its device node gone: `sim/standins/xidhealth.py`, the rule of the real
node's device-plugin stand-in) still counts in capacity but not in allocatable
(manager.go `GetCapacity`); a new pod of the plugin, or a new boot (`--clear`), starts with every
GPU Healthy. The node is looked at again when `sim fault` announces it.

MIG (given the MIG manager stand-in's GPU state, `sim/hardware/mighw.py`): the plugin's resources follow
its MIG_STRATEGY and the GPUs' MIG state (`sim/standins/migresources.py`: `nvidia.com/gpu` and/or
`nvidia.com/mig-<profile>`); a layout the plugin refuses registers nothing (it exits). A resource
the new plugin no longer registers is one whose endpoint stopped (the rule above, per resource);
MIG devices of an Unhealthy GPU are Unhealthy.

Sharing (time-slicing, MPS): the plugin's config as its pod's config-manager has it
(`sim/standins/pluginconfig.py`: the policy's devicePlugin.config ConfigMap, the node's
`nvidia.com/device-plugin.config` label, the default), its replicas and renamed resources
(`sim/standins/sharing.py`): `nvidia.com/gpu` = GPUs x replicas, or `nvidia.com/gpu.shared`; a label
change is the sidecar's SIGHUP (the plugin registers anew, the old resource's endpoint stops); a
config the plugin refuses registers nothing.

Not played: a kubelet restart.
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

from gpu_operator.sim.hardware import devnodes
from gpu_operator.sim.hardware.faults import ChangeFollower, NodeHosts, follow_changes
from gpu_operator.sim.hardware.mighw import MigHardware, shape_gpus
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins import migresources, sharing
from gpu_operator.sim.standins.pluginconfig import PluginConfigs, volume_reader
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.sim.standins.xidhealth import XidHealth
from gpu_operator.vocabulary import GPU_RESOURCE

log = logging.getLogger("gpu_operator.sim.standins.kubeletdp")

APP = "nvidia-device-plugin-daemonset"
FIELD_MANAGER = "kubelet"
# cm/devicemanager/types.go endpointStopGracePeriod
GRACE_PERIOD = 300.0


def desired_status(
    gpus: int,
    running: bool,
    stopped_for: float | None,
    grace_period: float = GRACE_PERIOD,
    unhealthy: int = 0,
    resource: str = GPU_RESOURCE,
) -> dict[str, dict[str, str]] | None:
    """The `resource` (`nvidia.com/gpu`) capacity and allocatable the kubelet reports: the plugin
    running (with `unhealthy` of its `gpus` devices reported Unhealthy); stopped `stopped_for`
    seconds ago (None: it never registered here: nothing)."""
    if running:
        return {"capacity": {resource: str(gpus)}, "allocatable": {resource: str(max(0, gpus - unhealthy))}}
    if stopped_for is None:
        return None
    if stopped_for <= grace_period:
        return {"capacity": {resource: str(gpus)}, "allocatable": {resource: "0"}}
    return {"capacity": {resource: "0"}, "allocatable": {resource: "0"}}


def status_patch(status: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"status": status}


def merge_status(parts: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]] | None:
    """One status of several resources' (None when there is none)."""
    if not parts:
        return None
    return {
        key: {k: v for part in parts for k, v in part[key].items()} for key in ("capacity", "allocatable")
    }


def is_plugin_resource(name: str) -> bool:
    base = name.removesuffix(sharing.SHARED_SUFFIX)
    return base == GPU_RESOURCE or base.startswith(migresources.MIG_RESOURCE_PREFIX)


class DevicePluginCapacity:
    """The kubelet's device manager for the device plugin on kwok nodes (a `podwatch.Player`)."""

    app = APP
    field_manager = FIELD_MANAGER
    # the Node's status is the kubelet's; the plugin's config-manager reads as its pod's ServiceAccount
    identity = ident.KUBELET
    identities: Any = None  # given by NodeStandIns: the kubelet's client

    def __init__(
        self,
        grace_period: float = GRACE_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        hosts: Path | None = None,
        interval: float = 2.0,
        mig: MigHardware | None = None,
        configs: PluginConfigs | None = None,
    ) -> None:
        self.configs = configs or PluginConfigs()
        self.on_nodes: set[str] = set()  # nodes where the plugin's pod runs
        self.grace_period, self.clock = grace_period, clock
        # (node, resource) -> when its endpoint stopped (None: it runs); absent: never registered here
        self.stopped_at: dict[tuple[str, str], float | None] = {}
        self.registered: dict[tuple[str, str], int] = {}  # (node, resource) -> devices last registered
        self.mig = mig
        self.written: dict[str, dict[str, dict[str, str]]] = {}
        self.hosts = NodeHosts(hosts) if hosts is not None else None
        self.interval = interval
        self.health: dict[str, tuple[str, XidHealth]] = {}  # node -> (its plugin pod's uid, what it saw)
        self.wake: Callable[[str], None] = lambda _node: None

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake
        self.configs.subscribe(self._woken_by_label)

    def _woken_by_label(self, node: str) -> None:
        if node in self.on_nodes:
            self.wake(node)

    async def start(self, client: AsyncClient) -> None:
        await self.configs.start(client)
        if self.hosts is not None:
            self._task = asyncio.create_task(
                follow_changes(ChangeFollower(self.hosts.base), self.interval, self._woken),
                name="device-plugin-health",
            )

    def _woken(self, node: str) -> None:
        if node in self.health:
            self.wake(node)

    def unhealthy(self, node: str, pod: PodView) -> int:
        """How many of the node's GPUs the plugin in `pod` reports Unhealthy (0 without host trees)."""
        return len(self.unhealthy_gpus(node, pod))

    def unhealthy_gpus(self, node: str, pod: PodView) -> set[int]:
        """The indices of the node's GPUs the plugin in `pod` reports Unhealthy (none without host trees)."""
        if self.hosts is None:
            return set()
        entry = self.health.get(node)
        if entry is None or entry[0] != pod.uid:  # the plugin (re)started: it sees Xids from now on
            entry = self.health[node] = (pod.uid, XidHealth(self.hosts.root(node), pod.env))
        marked = entry[1].poll()
        root = self.hosts.root(node)
        return {
            gpu.index
            for gpu in self.hosts.gpus(node)
            if gpu.xid_address in marked or devnodes.char_device(root / f"dev/nvidia{gpu.minor}") is None
        }

    def stopped_for(
        self, node: str, view: StandinNodeView, running: bool, resource: str = GPU_RESOURCE
    ) -> float | None:
        """Seconds since the plugin's endpoint for `resource` stopped on `node` (0 while it runs),
        None if it never registered it."""
        now, key = self.clock(), (node, resource)
        if running:
            self.stopped_at[key] = None
        elif key not in self.stopped_at:
            if float(view.capacity.get(resource, 0) or 0) <= 0:
                return None
            self.stopped_at[key] = now  # registered before this stand-in started
        elif self.stopped_at[key] is None:
            self.stopped_at[key] = now
        since = self.stopped_at[key]
        return 0.0 if since is None else now - since

    def resources(
        self, node: str, view: StandinNodeView, plugin: PodView | None, config: sharing.Sharing | None = None
    ) -> dict[str, tuple[int, int]]:
        """Resource -> (devices, Unhealthy ones) the running `plugin` registers with its sharing
        `config` (none: it is not running or refuses the MIG layout or the config)."""
        if plugin is None or view.shape is None:
            return {}
        config = config or sharing.Sharing()
        sick = self.unhealthy_gpus(node, plugin)
        gpus = self.mig.gpus(node, view.shape) if self.mig is not None else shape_gpus(view.shape)
        if not gpus:  # the shape's GPUs are not NVML's here (e.g. vm-passthrough workload)
            return {}
        strategy = plugin.env.get("MIG_STRATEGY") or config.mig_strategy or "none"
        try:
            sharing.check(config, strategy)
            found = sharing.replicate(config, migresources.advertised(strategy, gpus))
        except (migresources.PluginError, sharing.SharingConfigError) as err:
            log.info("node %s: the device plugin refuses its MIG layout or config and exits: %s", node, err)
            return {}
        return {
            name: (len(devs), sum(1 for _, parent in devs if parent in sick)) for name, devs in found.items()
        }

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if view is None or view.shape is None or not view.nvidia_gpus:
            for key in [k for k in self.stopped_at if k[0] == node]:
                self.stopped_at.pop(key, None)
                self.registered.pop(key, None)
            self.written.pop(node, None)
            self.health.pop(node, None)
            return None
        plugins = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        running = bool(plugins)
        if not running:
            self.health.pop(node, None)
        config = None
        (self.on_nodes.add if running else self.on_nodes.discard)(node)
        if running:
            try:
                config = await self.configs.config(
                    client, node, plugins[-1], volume_reader(self.identities, node)
                )
            except sharing.SharingConfigError as err:
                log.info("node %s: the device plugin does not start: %s", node, err)
                running, plugins = False, []
        else:
            self.configs.forget(APP, node)
        now_registered = self.resources(node, view, plugins[-1] if running else None, config)
        known = {r for (n, r) in self.stopped_at if n == node}
        known |= {r for r, v in view.capacity.items() if is_plugin_resource(r) and float(v or 0) > 0}
        parts, again = [], []
        for resource in sorted(known | set(now_registered)):
            if resource in now_registered:
                count, sick = now_registered[resource]
                self.registered[(node, resource)] = count
                self.stopped_for(node, view, True, resource)
                running_status = desired_status(count, True, 0.0, self.grace_period, sick, resource)
                assert running_status is not None
                parts.append(running_status)
                continue
            stopped_for = self.stopped_for(node, view, False, resource)
            count = self.registered.get((node, resource), int(float(view.capacity.get(resource, 0) or 0)))
            status = desired_status(count, False, stopped_for, self.grace_period, resource=resource)
            if status is not None:
                parts.append(status)
            if stopped_for is not None and stopped_for <= self.grace_period:
                again.append(self.grace_period - stopped_for + 0.05)  # look again when the grace period ends
        wanted = merge_status(parts)
        if wanted is not None and self.written.get(node) != wanted:
            writer = client if self.identities is None else await self.identities.kubelet(node, FIELD_MANAGER)
            await writer.patch(Node.Status, node, status_patch(wanted), field_manager=FIELD_MANAGER)
            self.written[node] = wanted
            log.info(
                "node %s: the device plugin %s: capacity %s, allocatable %s",
                node,
                "runs" if running else "is gone",
                wanted["capacity"],
                wanted["allocatable"],
            )
        return min(again) if again else None
