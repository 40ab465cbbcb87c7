"""What NVIDIA's GPU kubelet plugin (the `gpus` container of the DRA driver's DaemonSet) does to the
API for a kwok node, which runs no container: once the plugin's pod runs on a node, that node's
GPUs are published as a ResourceSlice of driver gpu.nvidia.com; when the pod goes, so does the
slice. The real scheduler then allocates ResourceClaims against these slices (the DRA validation
pods, DCGM's admin claims, a user's claim for one GPU), and kwok marks the pods Running.

Sources (NVIDIA/k8s-dra-driver-gpu, read for facts only): cmd/gpu-kubelet-plugin/deviceinfo.go (the
device attributes: type, uuid, productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion, index; device names gpu-<index>), and the kubelet plugin
library's publishing (one pool per node, named after it, `spec.nodeName` set, the slice owned by
the Node).

What it does not play: MIG devices, passthrough (vfio) devices, health updates, claim preparation
(there is no container to inject into; the real node's toolkit stand-in covers CDI injection).
GPUs of a node come from its shape's labels (nvidia.com/gpu.count, nvidia.com/gpu.product); a
node whose GPUs go to VMs (workload config vm-passthrough) publishes none, as the plugin finds no
GPU on the nvidia driver there.
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.vocabulary import GPU_COUNT, GPU_PRODUCT, VM_PASSTHROUGH, WORKLOAD_CONFIG

log = logging.getLogger("gpu_operator.sim.draplugin")

DRIVER = "gpu.nvidia.com"
PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
OWNER_LABEL = "gpu-operator.sim/dra-plugin"
# The driver version our simulated nodes report (sim/realspec.py's host driver).
DRIVER_VERSION = "550.127.05"
CUDA_DRIVER_VERSION = "12.4.0"
ARCHITECTURES = {"H100": ("Hopper", "9.0.0"), "L40S": ("Ada Lovelace", "8.9.0"), "A100": ("Ampere", "8.0.0")}
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


def semver(version: str) -> str:
    """A driver version as a DRA version attribute (semver: no leading zeros, 550.127.05 -> 550.127.5)."""
    parts = [str(int(p)) for p in version.split(".")[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU UUID per node and index (NVML's form: GPU-<uuid>)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.gpu-operator.sim')}"


def devices(node: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The node's GPUs as the plugin describes them (attributes without a domain are qualified by
    the driver name: DeviceClass selectors read device.attributes['gpu.nvidia.com'].type)."""
    if labels.get(WORKLOAD_CONFIG) == VM_PASSTHROUGH:
        return []
    count = int(labels.get(GPU_COUNT, "0") or 0)
    product = labels.get(GPU_PRODUCT, "NVIDIA GPU").replace("-", " ")
    architecture, capability = next((v for k, v in ARCHITECTURES.items() if k in product), ("unknown", "0.0.0"))
    out = []
    for index in range(count):
        out.append({"name": f"gpu-{index}", "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(node, index)},
            "productName": {"string": product}, "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture}, "cudaComputeCapability": {"version": capability},
            "driverVersion": {"version": semver(DRIVER_VERSION)},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            "index": {"int": index}}})
    return out


def slice_for(node: dict[str, Any]) -> dict[str, Any]:
    meta = node["metadata"]
    name = meta["name"]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}", "labels": {OWNER_LABEL: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta["uid"],
                                          "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices(name, meta.get("labels") or {})},
    }


class SlicePublisher:
    """Keeps one ResourceSlice per kwok node where a kubelet plugin pod is Running."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.last_error = ""

    def plugin_nodes(self) -> set[str]:
        pods = self.client.list(Pod, namespace="*", labels={"app": PLUGIN_APP})
        return {p.spec.nodeName for p in pods
                if p.spec is not None and p.spec.nodeName and p.status is not None and p.status.phase == "Running"
                and p.metadata is not None and p.metadata.deletionTimestamp is None}

    def sync_once(self) -> tuple[list[str], list[str]]:
        """Publish and withdraw slices; returns (published, withdrawn) node names."""
        running = self.plugin_nodes()
        nodes = {n.metadata.name: n for n in self.client.list(Node, labels={"type": "kwok"})
                 if n.metadata is not None and n.metadata.name}
        current = {s.spec["nodeName"] for s in self.client.list(ResourceSlice, labels={OWNER_LABEL: "true"})
                   if s.spec and s.spec.get("nodeName")}
        published, withdrawn = [], []
        for name in sorted((running & set(nodes)) - current):
            body = slice_for(nodes[name].to_dict())
            self.client.apply(ResourceSlice.from_dict(body), field_manager="gpu-operator-sim-dra", force=True)
            published.append(name)
        for name in sorted(current - running):
            try:
                self.client.delete(ResourceSlice, f"{name}-{DRIVER}")
            except ApiError as err:
                if err.status.code != 404:
                    raise
            withdrawn.append(name)
        for name in published:
            log.info("node %s: the DRA kubelet plugin runs: ResourceSlice %s-%s published", name, name, DRIVER)
        for name in withdrawn:
            log.info("node %s: the DRA kubelet plugin is gone: its ResourceSlice withdrawn", name)
        return published, withdrawn

    def run(self, stop: threading.Event, period: float = 1.0) -> None:
        """Until `stop`: look every `period` seconds (one list of plugin pods, nodes and slices)."""
        while not stop.is_set():
            try:
                self.sync_once()
                self.last_error = ""
            except ApiError as err:
                if err.status.message != self.last_error:  # once per distinct refusal
                    log.warning("DRA plugin stand-in: %s", err.status.message)
                self.last_error = str(err.status.message)
            stop.wait(period)


def serve(kubeconfig: str) -> None:
    """`gpu-operator sim dra-plugin`: run the stand-in until SIGTERM/SIGINT (the simulator starts it)."""
    import signal

    from lightkube import KubeConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    client = Client(KubeConfig.from_file(kubeconfig), field_manager="gpu-operator-sim-dra")
    log.info("DRA kubelet-plugin stand-in: publishing ResourceSlices of kwok nodes where %s runs", PLUGIN_APP)
    try:
        SlicePublisher(client).run(stop)
    finally:
        client.close()


def start_detached(kubeconfig: str, log_path: Path) -> int:
    """Start `serve` as its own session (the simulator records and stops it); returns its pid."""
    import subprocess
    import sys

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpu_operator.cli", "sim", "dra-plugin",
                                 f"--kubeconfig={kubeconfig}"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid
