"""What NVIDIA's GPU kubelet plugin (the `gpus` container of the DRA driver's DaemonSet) does to the
API for a kwok node, which runs no container: once the plugin's pod runs on a node, that node's
GPUs are published as a ResourceSlice of driver gpu.nvidia.com; when the pod goes, so does the
slice. The real scheduler then allocates ResourceClaims against these slices (the DRA validation
pods, DCGM's admin claims, a user's claim for one GPU), and kwok marks the pods Running. One of the
simulator's node stand-ins (`sim/standins/roster.py`: driven by the watch of the components' pods).

Sources (NVIDIA/k8s-dra-driver-gpu, read for facts only): cmd/gpu-kubelet-plugin/deviceinfo.go (the
device attributes: type, uuid, productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion, index; device names gpu-<index>), and the kubelet plugin
library's publishing (one pool per node, named after it, `spec.nodeName` set, the slice owned by
the Node).

Each GPU also carries the standard attribute resource.kubernetes.io/pciBusID (its PCI address,
domain:bus:device.function in lower case: NVML's bus id as go-nvlib folds it; nvlib.go sets it with
k8s.io/dynamic-resource-allocation's deviceattribute), the address the node's host tree gives it.

Health (given the kwok nodes' host trees, `sim up` does; `sim fault` changes them): with the
plugin's feature gate NVMLDeviceHealthCheck, an Xid logged since the plugin's pod started taints
the GPU's device in the slice (`gpu.nvidia.com/xid`, NoSchedule; None for the application Xids),
which the scheduler honours (DRADeviceTaints: beta and on by default in Kubernetes 1.36, GA in 1.37): the device
stays in the slice and is no longer allocated to new claims; a new plugin pod or a new boot starts
without taints (`sim/standins/drahealth.py` has the rule and its sources). Without the gate: no taint.

MIG (static MIG devices, `sim/standins/dramig.py` has the rules and sources): as the plugin reads NVML once
when it starts, the GPUs' MIG state (`sim/hardware/mighw.py`, the same the device plugin's stand-in reads) is
taken when the plugin's pod starts; a GPU with MIG mode on is published as its MIG devices (type
mig), not itself. A layout changed while the plugin runs shows once its pod is restarted.

With the plugin's DynamicMIG gate, partitionable devices instead (`sim/standins/drapartitions.py`): the MIG
devices it did not make destroyed when it starts, the pool split into a counters slice and one slice
per GPU (the Kubernetes 1.35+ form, whatever the apiserver's version); with a gate it refuses beside
DynamicMIG, nothing.

Its `compute-domains` container (a GPUCluster with compute domains on): `sim/standins/computedomainplugin.py`'s
ChannelPlugin, called here with the same pod's client.

What it does not play: passthrough (vfio) devices, claim preparation
(there is no container to inject into; the real node's toolkit stand-in covers CDI injection).
A node's GPUs come from its shape (label gpu-operator.sim/shape), as the plugin reads them from
NVML; a node whose GPUs go to VMs (vfio-pci, or workload config vm-passthrough) publishes none, as
the plugin finds no GPU on the nvidia driver there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource

from gpu_operator.shapes import CUDA_DRIVER_VERSION, DRIVER_VERSION, arch_family
from gpu_operator.sim.hardware.faults import ChangeFollower, NodeHosts, follow_changes
from gpu_operator.sim.hardware.mighw import MigHardware, shape_gpus
from gpu_operator.sim.hardware.migparted import GpuMig
from gpu_operator.sim.standins import dramig, drapartitions
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.computedomainplugin import ChannelPlugin
from gpu_operator.sim.standins.drahealth import SliceHealth
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView

log = logging.getLogger("gpu_operator.sim.standins.draplugin")

DRIVER = "gpu.nvidia.com"
PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
OWNER_LABEL = "gpu-operator.sim/dra-plugin"
FIELD_MANAGER = "gpu-operator-sim-dra"
# NVML's architecture names (deviceinfo.go's `architecture`) by GFD's family of the compute capability
ARCHITECTURES = {
    "hopper": "Hopper",
    "ada-lovelace": "Ada Lovelace",
    "ampere": "Ampere",
    "blackwell": "Blackwell",
}
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


@cache
def gpu_addresses(shape: str) -> tuple[str, ...]:
    """The PCI addresses of a kwok node's GPUs by index, as its host tree has them."""
    from gpu_operator.sim.realnode.realspec import host_spec

    return tuple(str(d["address"]) for d in host_spec(shape)["devices"])


def semver(version: str) -> str:
    """A driver version as a DRA version attribute (semver: no leading zeros, 550.127.05 -> 550.127.5)."""
    parts = [str(int(p)) for p in version.split(".")[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU UUID per node and index (NVML's form: GPU-<uuid>), for a GPU its host has none for."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.gpu-operator.sim')}"


def devices(
    view: StandinNodeView, taints: dict[str, dict[str, str]] | None = None, gpus: list[GpuMig] | None = None
) -> list[dict[str, Any]]:
    """The node's GPUs as the plugin describes them (attributes without a domain are qualified by
    the driver name: DeviceClass selectors read device.attributes['gpu.nvidia.com'].type);
    `taints`: the plugin's taint per GPU address (domain:bus:device, as the Xid line has it);
    `gpus`: their MIG state (default: as the host boots, MIG off): a GPU with MIG mode on is
    published as its MIG devices instead (`dramig`)."""
    shape = view.shape
    if shape is None or not view.nvidia_gpus:
        return []
    by_index = {g.index: g for g in (shape_gpus(shape) if gpus is None else gpus)}
    product = shape.gpu_name or "NVIDIA GPU"
    major, _, minor = shape.gpu_compute_capability.partition(".")
    architecture = ARCHITECTURES.get(arch_family(int(major or 0), int(minor or 0)), "unknown")
    capability = f"{int(major or 0)}.{int(minor or 0)}.0"
    out = []
    addresses = gpu_addresses(shape.name)
    for index in range(view.nvidia_gpus):
        address = addresses[index] if index < len(addresses) else None
        mig = by_index.get(index)
        attributes = {
            "type": {"string": "gpu"},
            "uuid": {"string": mig.uuid if mig else gpu_uuid(view.name, index)},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": capability},
            "driverVersion": {"version": semver(DRIVER_VERSION)},
            "cudaDriverVersion": {"version": "{}.{}.0".format(*CUDA_DRIVER_VERSION)},
            "index": {"int": index},
        }
        device: dict[str, Any] = {"name": f"gpu-{index}", "attributes": attributes}
        if address is not None:
            attributes[PCI_BUS_ID] = {"string": address}
            taint = (taints or {}).get(address.rsplit(".", 1)[0])
            if taint is not None:
                device["taints"] = [dict(taint)]
        if mig is not None and mig.enabled:
            out.extend(dramig.mig_devices(mig, device))
        else:
            out.append(device)
    return out


def slices_for(
    view: StandinNodeView, contents: list[dict[str, Any]], generation: int = 1
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlices, one per entry of `contents` (`devices` or `sharedCounters`):
    `<node>-gpu.nvidia.com` for one slice, `<node>-gpu.nvidia.com-<i>` for several."""
    name, count = view.name, len(contents)
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{name}-{DRIVER}" if count == 1 else f"{name}-{DRIVER}-{i}",
                "labels": {OWNER_LABEL: "true"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": view.uid, "controller": True}
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": name,
                "pool": {"name": name, "generation": generation, "resourceSliceCount": count},
                **content,
            },
        }
        for i, content in enumerate(contents)
    ]


def slice_for(
    view: StandinNodeView, taints: dict[str, dict[str, str]] | None = None, gpus: list[GpuMig] | None = None
) -> dict[str, Any]:
    return slices_for(view, [{"devices": devices(view, taints, gpus)}])[0]


def pool(
    view: StandinNodeView, env: dict[str, str], taints: dict[str, dict[str, str]], gpus: list[GpuMig] | None
) -> list[dict[str, Any]]:
    """What the plugin publishes: the static form, or under DynamicMIG the partitionable devices
    (`drapartitions`); PluginRefuses where its gates keep it from starting."""
    if drapartitions.dynamic(env) and view.shape is not None:
        off = drapartitions.destroyed(shape_gpus(view.shape) if gpus is None else gpus)
        parts = drapartitions.split(off, devices(view, taints, off))
        if parts is not None:
            return parts
    return [{"devices": devices(view, taints, gpus)}]


class SlicePublisher:
    """One ResourceSlice per kwok node where a kubelet plugin pod is Running (a `podwatch.Player`)."""

    app = PLUGIN_APP
    field_manager = FIELD_MANAGER
    identity = ident.POD  # its pod's ServiceAccount; once the pod is gone the kubelet withdraws its slices

    def __init__(
        self, hosts: Path | None = None, interval: float = 2.0, mig: MigHardware | None = None
    ) -> None:
        self.published: dict[str, str] = {}  # node -> the devices last published (JSON)
        self.mig = mig
        self.enumerated: dict[
            str, tuple[str, list[GpuMig]]
        ] = {}  # node -> (its plugin pod's uid, the GPUs then)
        self.names: dict[str, tuple[int, list[str]]] = {}  # node -> (pool generation, its slices' names)
        self.served = True  # resource.k8s.io/v1 (Kubernetes >= 1.34); the floor (1.29) has none
        self.hosts = NodeHosts(hosts) if hosts is not None else None
        self.interval = interval
        self.health: dict[str, tuple[str, SliceHealth]] = {}  # node -> (its plugin pod's uid, what it saw)
        self.wake: Callable[[str], None] = lambda _node: None
        self.domains = (
            ChannelPlugin()
        )  # the pod's compute-domains container (sim/standins/computedomainplugin.py)

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def _woken(self, node: str) -> None:
        if node in self.health:
            self.wake(node)

    def taints(self, node: str, pod: PodView) -> dict[str, dict[str, str]]:
        """The plugin's taints per GPU address (none without host trees)."""
        if self.hosts is None:
            return {}
        entry = self.health.get(node)
        if entry is None or entry[0] != pod.uid:  # the plugin (re)started: no taint, Xids from now on
            entry = self.health[node] = (pod.uid, SliceHealth(self.hosts.root(node), pod.env))
        return entry[1].poll()

    def gpus(self, node: str, pod: PodView, view: StandinNodeView) -> list[GpuMig] | None:
        """The GPUs' MIG state as the plugin's pod found it when it started (None: MIG never played);
        under DynamicMIG the plugin then destroys the MIG devices it did not make."""
        if self.mig is None or view.shape is None:
            return None
        entry = self.enumerated.get(node)
        if entry is None or entry[0] != pod.uid:
            found = self.mig.gpus(node, view.shape)
            off = drapartitions.destroyed(found)
            if (
                drapartitions.dynamic(pod.env)
                and off != found
                and drapartitions.split(off, devices(view, None, off)) is not None
            ):
                found = off
                self.mig.set(node, view.shape, found)
                log.info(
                    "node %s: the DRA kubelet plugin (DynamicMIG) destroyed the MIG devices it did not make",
                    node,
                )
            entry = self.enumerated[node] = (pod.uid, found)
        return entry[1]

    async def start(self, client: AsyncClient) -> None:
        """Slices this stand-in published before (a restart): looked at again once the pods are listed,
        withdrawn where their plugin's pod no longer runs (as the kubelet wipes a driver's slices that
        no plugin serves). Where
        the apiserver serves no resource.k8s.io/v1, NVIDIA's plugin could not publish either: this
        stand-in stays idle, and the other stand-ins play on."""
        try:
            async for found in client.list(ResourceSlice, labels={OWNER_LABEL: "true"}):
                if found.spec and found.spec.get("nodeName"):
                    node = str(found.spec["nodeName"])
                    self.published[node] = ""
                    generation, names = self.names.get(
                        node, (int((found.spec.get("pool") or {}).get("generation", 1)), [])
                    )
                    self.names[node] = (
                        generation,
                        [*names, str(found.metadata.name if found.metadata else "")],
                    )
                    self.wake(node)
            for node in await self.domains.start(client):
                self.wake(node)
        except ApiError as err:
            if err.status.code != 404:
                raise
            self.served = False
            log.info(
                "resource.k8s.io/v1 ResourceSlices are not served here (Kubernetes older than 1.34): "
                "the DRA kubelet plugin stand-in publishes nothing"
            )
        if self.hosts is not None:
            self._task = asyncio.create_task(
                follow_changes(ChangeFollower(self.hosts.base), self.interval, self._woken),
                name="dra-plugin-health",
            )

    async def _write(self, client: AsyncClient, body: dict[str, Any]) -> None:
        """Create the slice, or update the one there: the verbs NVIDIA's plugin uses (its
        ResourceSlice controller, k8s.io/dynamic-resource-allocation/resourceslice: create, update,
        delete; no patch), which its rendered ClusterRole grants."""
        obj = from_dict(body)
        try:
            await client.create(obj, field_manager=FIELD_MANAGER)
        except ApiError as err:
            if err.status.code != 409:
                raise
            found = await client.get(type(obj), body["metadata"]["name"])
            body = {
                **body,
                "metadata": {
                    **body["metadata"],
                    "resourceVersion": found.metadata.resourceVersion if found.metadata else None,
                },
            }
            await client.replace(from_dict(body), field_manager=FIELD_MANAGER)

    async def _delete(self, client: AsyncClient, names: list[str]) -> None:
        for name in names:
            try:
                await client.delete(ResourceSlice, name)
            except ApiError as err:
                if err.status.code != 404:
                    raise

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if not self.served:
            return None
        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        bodies: list[dict[str, Any]] = []
        if running and view is not None and view.shape is not None:
            pod = running[-1]
            try:
                bodies = slices_for(
                    view, pool(view, pod.env, self.taints(node, pod), self.gpus(node, pod, view))
                )
            except drapartitions.PluginRefuses as err:
                log.info("node %s: the DRA kubelet plugin does not start: %s", node, err)
        if bodies and view is not None:
            content = json.dumps([b["spec"] for b in bodies], sort_keys=True)
            if self.published.get(node) != content:
                generation, old = self.names.get(node, (0, []))
                names = [b["metadata"]["name"] for b in bodies]
                generation = generation + 1 if names != old or not generation else generation
                for body in slices_for(
                    view,
                    [
                        {k: v for k, v in b["spec"].items() if k in ("devices", "sharedCounters")}
                        for b in bodies
                    ],
                    generation,
                ):
                    await self._write(client, body)
                await self._delete(client, [n for n in old if n not in names])
                log.info(
                    "node %s: the DRA kubelet plugin runs: ResourceSlices %s published",
                    node,
                    ", ".join(names),
                )
                self.published[node], self.names[node] = content, (generation, names)
        elif node in self.published:
            await self._delete(client, self.names.get(node, (0, [f"{node}-{DRIVER}"]))[1])
            for book in (self.published, self.health, self.enumerated, self.names):
                book.pop(node, None)
            log.info("node %s: the DRA kubelet plugin is gone: its ResourceSlices withdrawn", node)
        if view is None or view.shape is None:
            return None
        return await self.domains.sync(client, view, running[-1] if running else None)
