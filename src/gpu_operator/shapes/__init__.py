"""Fake GPU node shapes: data (YAML beside this module) turned into Node manifests.

The same shapes feed the simulator (kwok-managed Nodes) and `gpu-operator render --shape`
(cluster facts without a cluster), so both see identical labels and nodeInfo.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from gpu_operator.vocabulary import (
    GPU_COUNT,
    GPU_PRODUCT,
    KERNEL_FULL,
    MIG_CAPABLE,
    NFD,
    NFD_GPU_LABELS,
    OS_ID,
    OS_VERSION_ID,
    OS_VERSION_MAJOR,
)

# kwok manages only nodes carrying this annotation (see gpu_operator.sim.controlplane).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
SHAPE_LABEL = "gpu-operator.sim/shape"


class ShapeError(ValueError):
    """A shape name, count or file is wrong; the message says which and how to fix it."""


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    os_id: str
    os_version_id: str
    kernel: str
    runtime: str
    capacity: dict[str, str]
    gpu_count: int = 0
    gpu_vendor_device: str = ""
    gpu_product: str = ""
    mig_capable: bool | None = None
    gfd_labels: bool = True
    extra_labels: dict[str, str] = field(default_factory=dict)

    def labels(self, node_name: str) -> dict[str, str]:
        """NFD-style labels (and GFD-style ones where the shape implies them)."""
        labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            SHAPE_LABEL: self.name,
            OS_ID: self.os_id,
            OS_VERSION_ID: self.os_version_id,
            OS_VERSION_MAJOR: self.os_version_id.split(".")[0],
            KERNEL_FULL: self.kernel,
            f"{NFD}/cpu-model.vendor_id": "Intel",
        }
        if self.gpu_count:
            labels[NFD_GPU_LABELS[0]] = "true"
            if self.gfd_labels:
                labels[GPU_COUNT] = str(self.gpu_count)
                if self.gpu_product:
                    labels[GPU_PRODUCT] = self.gpu_product
                if self.mig_capable is not None:
                    labels[MIG_CAPABLE] = str(self.mig_capable).lower()
        labels.update(self.extra_labels)
        return labels

    def node(self, node_name: str) -> dict[str, Any]:
        """A Node manifest for this shape, managed by kwok."""
        capacity = dict(self.capacity)
        if self.gpu_count and self.gfd_labels:
            capacity["nvidia.com/gpu"] = str(self.gpu_count)
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
                "allocatable": capacity,
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "osImage": f"{self.os_id.capitalize()} {self.os_version_id}",
                    "kernelVersion": self.kernel,
                    "containerRuntimeVersion": self.runtime,
                    "kubeletVersion": "fake",
                    "kubeProxyVersion": "fake",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            },
        }


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
    return Shape(
        name=name,
        description=raw.get("description", ""),
        os_id=str(os_["id"]),
        os_version_id=str(os_["version_id"]),
        kernel=str(raw["kernel"]),
        runtime=str(raw["runtime"]),
        capacity={k: str(v) for k, v in raw["capacity"].items()},
        gpu_count=int(gpu.get("count", 0)),
        gpu_vendor_device=str(gpu.get("vendor_device", "")),
        gpu_product=str(gpu.get("product", "")),
        mig_capable=gpu.get("mig_capable"),
        gfd_labels=bool(gpu.get("gfd_labels", True)),
        extra_labels={k: str(v) for k, v in (raw.get("extra_labels") or {}).items()},
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


def nodes(specs: list[str], start: int = 0) -> list[dict[str, Any]]:
    """Node manifests for `NAME[:COUNT][,KEY=VALUE...]` specs, named `<shape>-<index>` (numbered
    across specs of the same shape, so `dgx-h100:2,pool=a dgx-h100:2,pool=b` gives four nodes)."""
    out: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for spec in specs:
        shape, count = parse_spec(spec)
        first = start + used.get(shape.name, 0)
        used[shape.name] = used.get(shape.name, 0) + count
        out.extend(shape.node(f"{shape.name}-{first + i}") for i in range(count))
    return out
