"""KubeVirt's virt-handler as a device plugin on kwok nodes, and the kubelet's device manager for it:
where virt-handler's pod (label kubevirt.io=virt-handler, KubeVirt's DaemonSet) runs, the PCI
host devices the KubeVirt CR of its namespace permits are registered with the "kubelet" and show
in the Node's capacity and allocatable (e.g. `nvidia.com/H100_SXM5_80GB: 8`); a VM's pod
(virt-launcher, label kubevirt.io=virt-launcher) bound to the node is given devices, recorded
where the kubelet records them, its checkpoint in the node's host tree.

Facts (kubevirt/kubevirt, read for facts only; pkg/virt-handler/device-manager):
- device_controller.go `updatePermittedHostDevicePlugins`: `permittedHostDevices.pciHostDevices`
  of the KubeVirt CR; an entry with `externalResourceProvider: true` gets no plugin from
  virt-handler (another plugin advertises it); the others map the lower-cased
  `pciVendorSelector` to `resourceName`. `refreshPermittedDevices` runs on every change of the
  CR; `splitPermittedDevices` starts a plugin only for a resource with none running and stops the
  plugins of resources no longer found: a running plugin keeps the devices it started with.
- pci_device.go `discoverPermittedHostPCIDevices`: every function under /sys/bus/pci/devices
  whose PCI ID (its uevent's PCI_ID, lower-cased) is permitted and whose `driver` link names
  vfio-pci; other drivers are skipped (nvidia.go `shouldPermitNvidia`: an nvidia-bound SR-IOV VF
  with a vGPU profile is the one exception, not played here). A device without an `iommu_group`
  link is skipped. So a GPU still on the nvidia driver is not counted, whatever its ID.
- pci_device.go `constructDPIdevices`: one device per function, its ID the IOMMU group number,
  Healthy, with its NUMA node as topology when `numa_node` >= 0. `healthCheck`: health is whether
  /dev/vfio/<group> exists (fsnotify Create -> Healthy, Remove/Rename -> Unhealthy); a group file
  missing when the plugin starts makes the watch fail, the plugin stops and is restarted with a
  back-off (`controlledDevice`): none of its devices is allocatable meanwhile.
- `Allocate`: the IOMMU group maps back to the PCI address, given to virt-launcher's container
  in `PCI_RESOURCE_<RESOURCE NAME>` (comma-separated addresses), with /dev/vfio/vfio and
  /dev/vfio/<group> as devices.

The kubelet's part (kubernetes pkg/kubelet/cm/devicemanager): capacity counts every registered
device, allocatable the Healthy ones; a stopped plugin's resource follows `kubeletdp.desired_status`
(allocatable 0, capacity 0 after the grace period). At admission of a pod bound to the node it
picks free Healthy devices for each container's request (lowest group first here; the kubelet's
pick without topology hints is unordered) and records them in
/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint (checkpoint/checkpoint.go: `Data`
{PodDeviceEntries [{PodUID, ContainerName, ResourceName, DeviceIDs {NUMA: [IDs]}, AllocResp}],
RegisteredDevices {resource: [Healthy IDs]}}, `Checksum`). Written here with AllocResp empty
and Checksum 0: nothing on a kwok node reads them back. A pod that is gone frees its devices.

Here the PCI ID is read from the function's `vendor` and `device` files (the same IDs the kernel
writes into uevent's PCI_ID). Not played: mediated devices, USB host devices, a kubelet restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.hardware import devnodes
from gpu_operator.sim.hardware.faults import ChangeFollower, NodeHosts, follow_changes, node_host_spec
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.kubeletdp import GRACE_PERIOD, desired_status, merge_status
from gpu_operator.sim.standins.podwatch import PodView, Reflector, StandinNodeView
from gpu_operator.sim.standins.probestandin import ShapeTrees

log = logging.getLogger("gpu_operator.sim.standins")

LABEL = "kubevirt.io"  # KubeVirt's pod label (api core/v1 AppLabel)
APP = "virt-handler"
LAUNCHER = "virt-launcher"
FIELD_MANAGER = "kubelet"
KubeVirt = create_namespaced_resource("kubevirt.io", "v1", "KubeVirt", "kubevirts")
PCI_DEVICES = "sys/bus/pci/devices"
VFIO = "vfio-pci"
CHECKPOINT = "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
NO_TOPOLOGY = -1  # the kubelet's NUMA key for devices without topology
RETRY = 5.0  # seconds before a failing plugin (a missing group file) starts again


@dataclass(frozen=True)
class PciDevice:
    """A device as virt-handler's PCI plugin records it."""

    address: str
    pci_id: str  # vendor:device, lower case
    driver: str
    group: str  # the IOMMU group: the device plugin's device ID
    numa: int


def permitted(kubevirt: dict[str, Any] | None) -> dict[str, str]:
    """Lower-cased pciVendorSelector -> resourceName of the entries virt-handler serves itself."""
    config = ((kubevirt or {}).get("spec") or {}).get("configuration") or {}
    entries = (config.get("permittedHostDevices") or {}).get("pciHostDevices") or []
    return {
        str(e.get("pciVendorSelector", "")).lower(): str(e.get("resourceName", ""))
        for e in entries
        if not e.get("externalResourceProvider") and e.get("pciVendorSelector")
    }


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def discover(root: Path, selectors: dict[str, str]) -> dict[str, list[PciDevice]]:
    """resourceName -> the permitted devices on vfio-pci with an IOMMU group, in address order."""
    found: dict[str, list[PciDevice]] = {}
    base = root / PCI_DEVICES
    for entry in sorted(base.iterdir()) if base.is_dir() else []:
        pci_id = f"{_read(entry / 'vendor').removeprefix('0x')}:{_read(entry / 'device').removeprefix('0x')}".lower()
        resource = selectors.get(pci_id)
        if resource is None:
            continue
        try:
            driver = os.path.basename(os.readlink(entry / "driver"))
            group = os.path.basename(os.readlink(entry / "iommu_group"))
        except OSError:
            continue  # no driver, or no IOMMU group: skipped
        if driver != VFIO:
            continue
        numa = _read(entry / "numa_node")
        found.setdefault(resource, []).append(
            PciDevice(entry.name, pci_id, driver, group, int(numa) if numa.lstrip("-").isdigit() else -1)
        )
    return found


def group_present(root: Path, group: str) -> bool:
    return devnodes.char_device(root / "dev" / "vfio" / group) is not None


@dataclass
class Plugin:
    """One running PCI device plugin: the devices it started with, whether its health watch runs."""

    devices: list[PciDevice]
    watching: bool = False

    def unhealthy(self, root: Path) -> set[str]:
        missing = {d.group for d in self.devices if not group_present(root, d.group)}
        if not self.watching:
            if missing:  # the watch on a missing file fails: the plugin stops, restarts later
                return {d.group for d in self.devices}
            self.watching = True
        return missing


@dataclass
class NodeState:
    pod: str = ""  # uid of the virt-handler pod whose plugins run
    plugins: dict[str, Plugin] = field(default_factory=dict)  # resource -> plugin
    stopped_at: dict[str, float] = field(default_factory=dict)  # resource -> when its plugin stopped
    counts: dict[str, int] = field(default_factory=dict)  # resource -> devices last registered
    written: dict[str, dict[str, str]] | None = None


class VirtHandler:
    """virt-handler's PCI device plugins through the kubelet (a `podwatch.Player`)."""

    app = APP
    pod_label = LABEL
    identity = ident.KUBELET  # the Node's status is the kubelet's, after virt-handler's plugins register
    identities: Any = None  # given by NodeStandIns: the kubelet's client
    field_manager = FIELD_MANAGER

    def __init__(
        self,
        hosts: Path | None = None,
        grace_period: float = GRACE_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 2.0,
    ) -> None:
        self.trees = ShapeTrees(hosts)
        self.grace_period, self.clock, self.interval = grace_period, clock, interval
        self.nodes: dict[str, NodeState] = {}
        self.kubevirts: dict[str, dict[str, Any]] = {}  # namespace -> its KubeVirt CR
        self.wake: Callable[[str], None] = lambda _node: None
        self.on_allocatable: Callable[[str], None] = lambda _node: None
        self._tasks: list[asyncio.Task[None]] = []

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def _kubevirt_changed(self, old: Any, new: Any) -> None:
        for obj in (old, new):
            if obj is not None:
                self.kubevirts.pop(obj["namespace"], None)
        if new is not None:
            self.kubevirts[new["namespace"]] = new["object"]
        for node, state in self.nodes.items():  # refreshPermittedDevices on every handler
            if state.pod:
                self.wake(node)

    async def start(self, client: AsyncClient) -> None:
        def view(obj: Any) -> dict[str, Any]:
            return {"namespace": obj.metadata.namespace, "object": {"spec": dict(obj).get("spec") or {}}}

        # KubeVirt's API is served only where KubeVirt is installed: until then nothing is permitted
        watch = Reflector(client, KubeVirt, {}, view, self._kubevirt_changed, "KubeVirt CRs", optional=True)
        self._tasks.append(asyncio.create_task(watch.run(), name="kubevirt-crs"))
        hosts = self.trees.hosts
        if hosts is not None:
            self._tasks.append(
                asyncio.create_task(
                    follow_changes(ChangeFollower(hosts.base), self.interval, self._tree_changed),
                    name="virt-handler-health",
                )
            )

    def _tree_changed(self, node: str) -> None:
        if node in self.nodes:
            self.wake(node)

    def root(self, node: str, view: StandinNodeView) -> Path:
        assert view.shape is not None
        return self.trees.root(node, view.shape.name)

    def registered(self, node: str, view: StandinNodeView) -> dict[str, tuple[list[str], set[str]]]:
        """resource -> (device IDs registered, the Unhealthy ones) on the node now."""
        state = self.nodes.get(node)
        if state is None or not state.pod:
            return {}
        root = self.root(node, view)
        return {r: ([d.group for d in p.devices], p.unhealthy(root)) for r, p in state.plugins.items()}

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if view is None or view.shape is None:
            self.nodes.pop(node, None)
            return None
        state = self.nodes.setdefault(node, NodeState())
        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        now, again = self.clock(), []
        if running:
            pod = running[-1]
            if state.pod != pod.uid:  # a new virt-handler: its device controller starts afresh
                state.pod, state.plugins = pod.uid, {}
            selectors = permitted(self.kubevirts.get(pod.namespace))
            wanted = set(selectors.values())
            for resource in [r for r in state.plugins if r not in wanted]:
                del state.plugins[resource]  # no longer permitted: its plugin stops
            root = self.root(node, view)
            if wanted - set(state.plugins):
                found = await asyncio.to_thread(discover, root, selectors)
                for resource, devices in found.items():
                    if resource not in state.plugins:
                        state.plugins[resource] = Plugin(devices)
                        log.info(
                            "node %s: virt-handler starts the device plugin for %s: %d device(s) on vfio-pci (%s)",
                            node,
                            resource,
                            len(devices),
                            ", ".join(d.address for d in devices),
                        )
        else:
            state.pod, state.plugins = "", {}
        parts = []
        root = self.root(node, view)
        for resource, plugin in sorted(state.plugins.items()):
            sick = plugin.unhealthy(root)
            if not plugin.watching:
                again.append(RETRY)
            state.stopped_at.pop(resource, None)
            state.counts[resource] = len(plugin.devices)
            status = desired_status(len(plugin.devices), True, 0.0, self.grace_period, len(sick), resource)
            assert status is not None
            parts.append(status)
        for resource in [r for r in state.counts if r not in state.plugins]:
            stopped = now - state.stopped_at.setdefault(resource, now)
            status = desired_status(
                state.counts[resource], False, stopped, self.grace_period, resource=resource
            )
            if status is not None:
                parts.append(status)
            if stopped <= self.grace_period:
                again.append(self.grace_period - stopped + 0.05)
        wanted_status = merge_status(parts)
        if wanted_status is not None and state.written != wanted_status:
            writer = client if self.identities is None else await self.identities.kubelet(node, FIELD_MANAGER)
            await writer.patch(Node.Status, node, {"status": wanted_status}, field_manager=FIELD_MANAGER)
            state.written = wanted_status
            log.info(
                "node %s: virt-handler's device plugins: capacity %s, allocatable %s",
                node,
                wanted_status["capacity"],
                wanted_status["allocatable"],
            )
            self.on_allocatable(node)
        if not state.pod and not state.counts:
            self.nodes.pop(node, None)
        return min(again) if again else None


class LauncherAllocations:
    """The kubelet's device manager giving virt-handler's devices to the VMs' pods
    (virt-launcher) bound to the node, recorded in its checkpoint (a `podwatch.Player`)."""

    app = LAUNCHER
    pod_label = LABEL
    identity = ident.NO_API  # the kubelet's allocation: its checkpoint in the host's files only
    field_manager = FIELD_MANAGER

    def __init__(self, handler: VirtHandler, hosts: Path | None) -> None:
        self.handler = handler
        self.hosts = NodeHosts(hosts) if hosts is not None else None
        # node -> {(pod uid, container, resource): device IDs}
        self.allocated: dict[str, dict[tuple[str, str, str], list[str]]] = {}
        self.pending: set[str] = set()
        self.wake: Callable[[str], None] = lambda _node: None

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake
        self.handler.on_allocatable = self._handler_changed

    def _handler_changed(self, node: str) -> None:
        if node in self.pending:
            self.wake(node)

    async def start(self, client: AsyncClient) -> None:
        return None

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if view is None or view.shape is None or self.hosts is None:
            return None
        table = self.allocated.setdefault(node, {})
        live = {p.uid for p in pods if not p.terminated}
        changed = False
        for key in [k for k in table if k[0] not in live]:
            del table[key]  # the pod is gone: its devices are free again
            changed = True
        registered = self.handler.registered(node, view)
        self.pending.discard(node)
        for pod in sorted((p for p in pods if p.uid in live), key=lambda p: (p.started, p.name)):
            for container, resource, count in pod.devices:
                key = (pod.uid, container, resource)
                if key in table or resource not in registered:
                    if resource not in registered:
                        self.pending.add(node)
                    continue
                ids, sick = registered[resource]
                taken = {i for (_, _, r), got in table.items() if r == resource for i in got}
                free = sorted((i for i in ids if i not in taken and i not in sick), key=int)
                if len(free) < count:
                    log.info(
                        "node %s: pod %s/%s asks for %d %s, %d free: the kubelet refuses it",
                        node,
                        pod.namespace,
                        pod.name,
                        count,
                        resource,
                        len(free),
                    )
                    continue
                table[key] = free[:count]
                changed = True
                log.info(
                    "node %s: pod %s/%s container %s gets %s IOMMU group(s) %s",
                    node,
                    pod.namespace,
                    pod.name,
                    container,
                    resource,
                    ", ".join(free[:count]),
                )
        if changed:
            await asyncio.to_thread(self.write_checkpoint, node, view, table, registered)
        return None

    def write_checkpoint(
        self,
        node: str,
        view: StandinNodeView,
        table: dict[tuple[str, str, str], list[str]],
        registered: dict[str, tuple[list[str], set[str]]],
    ) -> None:
        assert self.hosts is not None and view.shape is not None
        faults = self.hosts.faults(node, node_host_spec(view.shape.name))  # the node's own tree from now on
        data = {
            "Data": {
                "PodDeviceEntries": [
                    {
                        "PodUID": uid,
                        "ContainerName": container,
                        "ResourceName": resource,
                        "DeviceIDs": {str(NO_TOPOLOGY): ids},
                        "AllocResp": None,
                    }
                    for (uid, container, resource), ids in sorted(table.items())
                ],
                "RegisteredDevices": {
                    r: [i for i in ids if i not in sick] for r, (ids, sick) in sorted(registered.items())
                },
            },
            "Checksum": 0,
        }
        path = faults.root / CHECKPOINT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))


def read_checkpoint(root: Path) -> list[dict[str, Any]]:
    """The kubelet's device allocations on a host ([] without a checkpoint)."""
    try:
        raw = json.loads((root / CHECKPOINT).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return list((raw.get("Data") or {}).get("PodDeviceEntries") or [])


def group_addresses(root: Path, group: str) -> list[str]:
    """The PCI functions of an IOMMU group in a host tree (KubeVirt's iommuToPCIMap)."""
    devices = root / "sys" / "kernel" / "iommu_groups" / group / "devices"
    return sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []


def players(hosts: Path | None) -> list[Any]:
    handler = VirtHandler(hosts)
    return [handler, LauncherAllocations(handler, hosts)]
