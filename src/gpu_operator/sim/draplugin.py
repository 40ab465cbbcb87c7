"""What NVIDIA's GPU kubelet plugin (the `gpus` container of the DRA driver's DaemonSet) does to the
API for a kwok node, which runs no container: once the plugin's pod runs on a node, that node's
GPUs are published as a ResourceSlice of driver gpu.nvidia.com; when the pod goes, so does the
slice. The real scheduler then allocates ResourceClaims against these slices (the DRA validation
pods, DCGM's admin claims, a user's claim for one GPU), and kwok marks the pods Running. One of the
simulator's node stand-ins (`sim/standins.py`: driven by the watch of the components' pods).

Sources (NVIDIA/k8s-dra-driver-gpu, read for facts only): cmd/gpu-kubelet-plugin/deviceinfo.go (the
device attributes: type, uuid, productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion, index; device names gpu-<index>), and the kubelet plugin
library's publishing (one pool per node, named after it, `spec.nodeName` set, the slice owned by
the Node).

What it does not play: MIG devices, passthrough (vfio) devices, health updates, claim preparation
(there is no container to inject into; the real node's toolkit stand-in covers CDI injection).
A node's GPUs come from its shape (label gpu-operator.sim/shape), as the plugin reads them from
NVML; a node whose GPUs go to VMs (vfio-pci, or workload config vm-passthrough) publishes none, as
the plugin finds no GPU on the nvidia driver there.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource

from gpu_operator.shapes import CUDA_DRIVER_VERSION, DRIVER_VERSION, arch_family
from gpu_operator.sim.podwatch import NodeView, PodView

log = logging.getLogger("gpu_operator.sim.draplugin")

DRIVER = "gpu.nvidia.com"
PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
OWNER_LABEL = "gpu-operator.sim/dra-plugin"
FIELD_MANAGER = "gpu-operator-sim-dra"
# NVML's architecture names (deviceinfo.go's `architecture`) by GFD's family of the compute capability
ARCHITECTURES = {"hopper": "Hopper", "ada-lovelace": "Ada Lovelace", "ampere": "Ampere", "blackwell": "Blackwell"}
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


def semver(version: str) -> str:
    """A driver version as a DRA version attribute (semver: no leading zeros, 550.127.05 -> 550.127.5)."""
    parts = [str(int(p)) for p in version.split(".")[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU UUID per node and index (NVML's form: GPU-<uuid>)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.gpu-operator.sim')}"


def devices(view: NodeView) -> list[dict[str, Any]]:
    """The node's GPUs as the plugin describes them (attributes without a domain are qualified by
    the driver name: DeviceClass selectors read device.attributes['gpu.nvidia.com'].type)."""
    shape = view.shape
    if shape is None or not view.nvidia_gpus:
        return []
    product = shape.gpu_name or "NVIDIA GPU"
    major, _, minor = shape.gpu_compute_capability.partition(".")
    architecture = ARCHITECTURES.get(arch_family(int(major or 0), int(minor or 0)), "unknown")
    capability = f"{int(major or 0)}.{int(minor or 0)}.0"
    out = []
    for index in range(view.nvidia_gpus):
        out.append({"name": f"gpu-{index}", "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(view.name, index)},
            "productName": {"string": product}, "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture}, "cudaComputeCapability": {"version": capability},
            "driverVersion": {"version": semver(DRIVER_VERSION)},
            "cudaDriverVersion": {"version": "{}.{}.0".format(*CUDA_DRIVER_VERSION)},
            "index": {"int": index}}})
    return out


def slice_for(view: NodeView) -> dict[str, Any]:
    name = view.name
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}", "labels": {OWNER_LABEL: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": view.uid,
                                          "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices(view)},
    }


class SlicePublisher:
    """One ResourceSlice per kwok node where a kubelet plugin pod is Running (a `podwatch.Player`)."""

    app = PLUGIN_APP
    field_manager = FIELD_MANAGER

    def __init__(self) -> None:
        self.published: set[str] = set()
        self.served = True  # resource.k8s.io/v1 (Kubernetes >= 1.34); the floor (1.29) has none

    async def start(self, client: AsyncClient) -> None:
        """Slices this stand-in published before (a restart): withdrawn when their pod is gone. Where
        the apiserver serves no resource.k8s.io/v1, NVIDIA's plugin could not publish either: this
        stand-in stays idle, and the other stand-ins play on."""
        try:
            async for found in client.list(ResourceSlice, labels={OWNER_LABEL: "true"}):
                if found.spec and found.spec.get("nodeName"):
                    self.published.add(str(found.spec["nodeName"]))
        except ApiError as err:
            if err.status.code != 404:
                raise
            self.served = False
            log.info("resource.k8s.io/v1 ResourceSlices are not served here (Kubernetes older than 1.34): "
                     "the DRA kubelet plugin stand-in publishes nothing")

    async def sync(self, client: AsyncClient, node: str, view: NodeView | None,
                   pods: list[PodView]) -> float | None:
        if not self.served:
            return None
        running = any(p.running for p in pods)
        if running and view is not None and view.shape is not None:
            if node not in self.published:
                body = slice_for(view)
                await client.apply(from_dict(body), field_manager=FIELD_MANAGER, force=True)
                self.published.add(node)
                log.info("node %s: the DRA kubelet plugin runs: ResourceSlice %s published", node,
                         body["metadata"]["name"])
        elif node in self.published:
            try:
                await client.delete(ResourceSlice, f"{node}-{DRIVER}")
            except ApiError as err:
                if err.status.code != 404:
                    raise
            self.published.discard(node)
            log.info("node %s: the DRA kubelet plugin is gone: its ResourceSlice withdrawn", node)
        return None
