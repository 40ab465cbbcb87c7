"""Fake GPU node shapes: data (YAML beside this module) turned into Node manifests.

A shape describes a host: its OS and kernel, its GPUs as NVML would report them, where their
driver comes from. From it come three views:

- `Shape.node()`: the Node as it is created (the simulator's kwok Nodes): what the kubelet and
  Node Feature Discovery (or our node-discovery agent) put there, nothing more. No GPU feature
  discovery (GFD) label, no `nvidia.com/gpu` capacity: those appear only once GFD's and the device
  plugin's pods run on the node (the simulator's stand-ins, `gpu_operator.sim.standins`).
- `Shape.gfd_labels()`: the labels GFD publishes for such a host (its NodeFeature's spec.labels).
- `Shape.settled_node()`: the steady state (node + GFD labels + the device plugin's capacity), for
  `gpu-operator render --shape`, which describes a cluster whose operands already run.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from gpu_operator.vocabulary import (
    GPU_COUNT,
    GPU_PRODUCT,
    GPU_RESOURCE,
    KERNEL_FULL,
    MIG_CAPABLE,
    NFD,
    NFD_DEVICE_LABEL_PREFIX,
    NFD_GPU_LABELS,
    NVIDIA,
    OS_ID,
    OS_VERSION_ID,
    OS_VERSION_MAJOR,
)

# kwok manages only nodes carrying this annotation (see gpu_operator.sim.plane.controlplane).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
SHAPE_LABEL = "gpu-operator.sim/shape"
# The driver every simulated GPU node runs (the host driver of sim/realnode/realspec.py's trees; the
# operator's driver container is played by kwok, so one version stands for both) and the CUDA
# version that driver reports (cuDriverGetVersion).
DRIVER_VERSION = "550.127.05"
CUDA_DRIVER_VERSION = (12, 4)
# Where a shape's GPUs get their driver: the operator's driver container, the host, or vfio-pci
# (passed through to VMs: no NVML, so neither GFD nor the device plugin sees them).
GPU_DRIVERS = ("operator", "host", "vfio-pci")
# The CPU architectures a shape's node may have (the kubelet's `kubernetes.io/arch`, Go's GOARCH).
ARCHES = ("amd64", "arm64")
# GFD's label for GPUs attached to a multi-node NVLink fabric (k8s-device-plugin internal/lm/imex.go).
GPU_CLIQUE = f"{NVIDIA}/gpu.clique"


class ShapeError(ValueError):
    """A shape name, count or file is wrong; the message says which and how to fix it."""


def sanitise(value: str) -> str:
    """GFD's label-value form of a name: only [A-Za-z0-9-_. ] kept, runs of blanks become "-"
    (k8s-device-plugin internal/lm/resource.go)."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", value).split())


def arch_family(major: int, minor: int) -> str:
    """GFD's `nvidia.com/gpu.family` for a CUDA compute capability (internal/lm/resource.go)."""
    families = {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return families.get(major, "undefined")


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    os_id: str
    os_version_id: str
    kernel: str
    runtime: str
    capacity: dict[str, str]
    kubelet: str = "fake"  # nodeInfo.kubeletVersion (a distribution's: v1.31.4+k3s1)
    machine: str = ""
    gpu_count: int = 0
    gpu_vendor_device: str = ""
    gpu_name: str = ""
    gpu_memory_mib: int = 0
    gpu_compute_capability: str = ""
    mig_capable: bool = False
    gpu_driver: str = "operator"
    extra_labels: dict[str, str] = field(default_factory=dict)
    arch: str = "amd64"
    cpu_vendor: str = "Intel"  # NFD's cpu-model.vendor_id
    # Multi-node NVLink (GB200 NVL72): how many nodes (compute trays) share one NVLink domain, and
    # how many of them one clique (a partition of it) holds; 0: no fabric (NVLink, if any, stays
    # inside the node and NVML reports no fabric).
    nvlink_domain_nodes: int = 0
    nvlink_clique_nodes: int = 0

    def fabric_ids(self, node_name: str) -> tuple[str, str] | None:
        """The (cluster UUID, clique ID) NVML's fabric info reports for every GPU of the node
        `<shape>-<index>` (nvmlDeviceGetGpuFabricInfo, as the NVLink fabric's manager set it): one
        cluster UUID per NVLink domain of `nvlink_domain_nodes` nodes numbered in order, clique
        IDs 1, 2, ... per `nvlink_clique_nodes` nodes within it. None: no fabric, or a node name
        without an index."""
        index = node_name.rpartition("-")[2]
        if not self.nvlink_domain_nodes or not index.isdigit():
            return None
        domain, within = divmod(int(index), self.nvlink_domain_nodes)
        clique = within // (self.nvlink_clique_nodes or self.nvlink_domain_nodes) + 1
        cluster = uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-operator.sim/{self.name}/nvlink-domain/{domain}")
        return str(cluster), str(clique)

    @property
    def gpu_product(self) -> str:
        """GFD's `nvidia.com/gpu.product`: the NVML device name, sanitised."""
        return sanitise(self.gpu_name)

    @property
    def host_driver(self) -> bool:
        return self.gpu_driver == "host"

    @property
    def nvidia_gpus(self) -> int:
        """The GPUs NVML sees (on the nvidia driver): none where they sit on vfio-pci."""
        return 0 if self.gpu_driver == "vfio-pci" else self.gpu_count

    def labels(self, node_name: str) -> dict[str, str]:
        """The Node's labels at creation: the kubelet's, NFD's (or our node-discovery agent's:
        the same keys), the simulator's own (`type`, the shape) and the spec's extra labels."""
        labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": self.arch,
            "type": "kwok",
            SHAPE_LABEL: self.name,
            OS_ID: self.os_id,
            OS_VERSION_ID: self.os_version_id,
            OS_VERSION_MAJOR: self.os_version_id.split(".")[0],
            KERNEL_FULL: self.kernel,
            f"{NFD}/cpu-model.vendor_id": self.cpu_vendor,
        }
        if "." in self.os_version_id:
            labels[f"{OS_VERSION_ID}.minor"] = self.os_version_id.split(".")[1]
        if self.gpu_count:
            labels[NFD_GPU_LABELS[0]] = "true"
            device = self.gpu_vendor_device.partition(":")[2].lower()
            if device:
                labels[f"{NFD_DEVICE_LABEL_PREFIX}{device}.present"] = "true"
        labels.update(self.extra_labels)
        return labels

    def node(self, node_name: str) -> dict[str, Any]:
        """A Node manifest for this shape as it is created, managed by kwok."""
        capacity = dict(self.capacity)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name,
                "labels": self.labels(node_name),
                "annotations": {
                    KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                    "node.alpha.kubernetes.io/ttl": "0",
                },
            },
            "spec": {},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                "nodeInfo": {
                    "architecture": self.arch,
                    "operatingSystem": "linux",
                    "osImage": f"{self.os_id.capitalize()} {self.os_version_id}",
                    "kernelVersion": self.kernel,
                    "containerRuntimeVersion": self.runtime,
                    "kubeletVersion": self.kubelet,
                    "kubeProxyVersion": "fake",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            },
        }

    def gfd_labels(
        self, mig_strategy: str = "none", timestamp: int | None = None, node: str = ""
    ) -> dict[str, str]:
        """What GPU feature discovery v0.20.0 publishes for this host with full GPUs (no MIG
        device configured), its default (no) sharing and no vGPU: internal/lm/nvml.go (versions,
        mig.capable, mps.capable, gpu.mode), resource.go (product, count, replicas,
        sharing-strategy, memory, family, compute), mig-strategy.go and strategy.go
        (`mig.strategy` unless none), machine-type.go, vgpu.go, timestamp.go (`timestamp`: the
        process start, Unix seconds; None leaves it out, as GFD_NO_TIMESTAMP does), imex.go
        (`gpu.clique`: `<cluster UUID>.<clique ID>` of the fabric-attached GPUs of `node`, all in
        one clique; none without a fabric). Empty where NVML sees no GPU (no GPU, or all on
        vfio-pci): GFD then writes nothing."""
        if not self.nvidia_gpus:
            return {}
        major, _, minor = self.gpu_compute_capability.partition(".")
        driver = DRIVER_VERSION.split(".")
        cuda_major, cuda_minor = CUDA_DRIVER_VERSION
        n = NVIDIA
        labels = {
            f"{n}/gpu.machine": sanitise(self.machine or "unknown"),
            f"{n}/cuda.driver.major": driver[0],
            f"{n}/cuda.driver.minor": driver[1],
            f"{n}/cuda.driver.rev": driver[2] if len(driver) > 2 else "",
            f"{n}/cuda.runtime.major": str(cuda_major),
            f"{n}/cuda.runtime.minor": str(cuda_minor),
            f"{n}/cuda.driver-version.major": driver[0],
            f"{n}/cuda.driver-version.minor": driver[1],
            f"{n}/cuda.driver-version.revision": driver[2] if len(driver) > 2 else "",
            f"{n}/cuda.driver-version.full": DRIVER_VERSION,
            f"{n}/cuda.runtime-version.major": str(cuda_major),
            f"{n}/cuda.runtime-version.minor": str(cuda_minor),
            f"{n}/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
            MIG_CAPABLE: str(self.mig_capable).lower(),
            f"{n}/mps.capable": "false",
            GPU_PRODUCT: self.gpu_product,
            GPU_COUNT: str(self.nvidia_gpus),
            f"{n}/gpu.replicas": "1",
            f"{n}/gpu.sharing-strategy": "none",
            f"{n}/gpu.mode": "compute",  # PCI class 0302 (3D controller), as every shape's GPU
            f"{n}/vgpu.present": "false",
        }
        if self.gpu_memory_mib:
            labels[f"{n}/gpu.memory"] = str(self.gpu_memory_mib)
        if major and int(major):
            labels.update(
                {
                    f"{n}/gpu.family": arch_family(int(major), int(minor or 0)),
                    f"{n}/gpu.compute.major": major,
                    f"{n}/gpu.compute.minor": minor or "0",
                }
            )
        if mig_strategy in ("single", "mixed"):
            labels[f"{n}/mig.strategy"] = mig_strategy
        if timestamp is not None:
            labels[f"{n}/gfd.timestamp"] = str(timestamp)
        fabric = self.fabric_ids(node)
        if fabric:
            labels[GPU_CLIQUE] = ".".join(fabric)
        return labels

    def device_plugin_resources(self) -> dict[str, str]:
        """What NVIDIA's device plugin registers with the kubelet (full GPUs, no sharing)."""
        return {GPU_RESOURCE: str(self.nvidia_gpus)} if self.nvidia_gpus else {}

    def settled_node(self, node_name: str, mig_strategy: str = "none") -> dict[str, Any]:
        """The Node once GFD's labels are on it and the device plugin has registered its GPUs
        (GFD's timestamp left out): the steady state `render --shape` describes."""
        node = self.node(node_name)
        node["metadata"]["labels"].update(self.gfd_labels(mig_strategy, node=node_name))
        for key in ("capacity", "allocatable"):
            node["status"][key].update(self.device_plugin_resources())
        return node


def names() -> list[str]:
    """Every shape shipped with the package."""
    files = resources.files(__package__).joinpath("data").iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def load(name: str) -> Shape:
    data_dir = resources.files(__package__).joinpath("data")
    path = data_dir.joinpath(f"{name}.yaml")
    if not path.is_file():
        raise ShapeError(f"unknown node shape {name!r}: choose one of {', '.join(names())}")
    raw = yaml.safe_load(path.read_text()) or {}
    gpu = raw.get("gpu") or {}
    os_ = raw["os"]
    driver = str(gpu.get("driver", "operator"))
    if driver not in GPU_DRIVERS:
        raise ShapeError(f"shape {name}: gpu.driver {driver!r}: choose one of {', '.join(GPU_DRIVERS)}")
    arch = str(raw.get("arch", "amd64"))
    if arch not in ARCHES:
        raise ShapeError(f"shape {name}: arch {arch!r}: choose one of {', '.join(ARCHES)}")
    nvlink = raw.get("nvlink") or {}
    return Shape(
        name=name,
        description=raw.get("description", ""),
        os_id=str(os_["id"]),
        os_version_id=str(os_["version_id"]),
        kernel=str(raw["kernel"]),
        runtime=str(raw["runtime"]),
        kubelet=str(raw.get("kubelet", "fake")),
        capacity={k: str(v) for k, v in raw["capacity"].items()},
        machine=str(raw.get("machine", "")),
        gpu_count=int(gpu.get("count", 0)),
        gpu_vendor_device=str(gpu.get("vendor_device", "")),
        gpu_name=str(gpu.get("name", "")),
        gpu_memory_mib=int(gpu.get("memory_mib", 0)),
        gpu_compute_capability=str(gpu.get("compute_capability", "")),
        mig_capable=bool(gpu.get("mig_capable", False)),
        gpu_driver=driver,
        extra_labels={k: str(v) for k, v in (raw.get("extra_labels") or {}).items()},
        arch=arch,
        cpu_vendor=str(raw.get("cpu_vendor", "Intel")),
        nvlink_domain_nodes=int(nvlink.get("domain_nodes", 0)),
        nvlink_clique_nodes=int(nvlink.get("clique_nodes", 0)),
    )


_SPEC = re.compile(r"^(?P<name>[a-z0-9-]+)(?::(?P<count>\d+))?(?P<labels>(?:,[^,=]+=[^,=]*)*)$")


def parse_spec(spec: str) -> tuple[Shape, int]:
    """Parse `NAME[:COUNT][,KEY=VALUE...]` (COUNT defaults to 1; labels are added to every node)."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ShapeError(f"bad shape {spec!r}: expected NAME[:COUNT][,KEY=VALUE...], e.g. dgx-h100:4,pool=a")
    count = int(match["count"] or 1)
    if count < 1:
        raise ShapeError(f"bad shape {spec!r}: COUNT must be at least 1")
    shape = load(match["name"])
    extra = dict(pair.split("=", 1) for pair in match["labels"].split(",")[1:])
    if extra:
        shape = dataclasses.replace(shape, extra_labels={**shape.extra_labels, **extra})
    return shape, count


def nodes(specs: list[str], start: int = 0, settled: bool = False) -> list[dict[str, Any]]:
    """Node manifests for `NAME[:COUNT][,KEY=VALUE...]` specs, named `<shape>-<index>` (numbered
    across specs of the same shape, so `dgx-h100:2,pool=a dgx-h100:2,pool=b` gives four nodes):
    as created (`Shape.node`), or with `settled` as they are once GFD and the device plugin ran
    (`Shape.settled_node`)."""
    out: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for spec in specs:
        shape, count = parse_spec(spec)
        first = start + used.get(shape.name, 0)
        used[shape.name] = used.get(shape.name, 0) + count
        make = shape.settled_node if settled else shape.node
        out.extend(make(f"{shape.name}-{first + i}") for i in range(count))
    return out
