"""Node shapes: what a Node carries when it is created (kubelet and NFD only), what GPU feature
discovery publishes for each shape, and the settled view `render --shape` uses."""

from __future__ import annotations

import pytest

from gpu_operator import shapes
from gpu_operator.shapes import arch_family, sanitise
from gpu_operator.vocabulary import GPU_RESOURCE

# Every key GFD v0.20.0 publishes for full GPUs, mig strategy none, no sharing, no vGPU.
GFD_KEYS = {
    f"nvidia.com/{k}"
    for k in (
        "gpu.machine",
        "cuda.driver.major",
        "cuda.driver.minor",
        "cuda.driver.rev",
        "cuda.runtime.major",
        "cuda.runtime.minor",
        "cuda.driver-version.major",
        "cuda.driver-version.minor",
        "cuda.driver-version.revision",
        "cuda.driver-version.full",
        "cuda.runtime-version.major",
        "cuda.runtime-version.minor",
        "cuda.runtime-version.full",
        "mig.capable",
        "mps.capable",
        "gpu.product",
        "gpu.count",
        "gpu.replicas",
        "gpu.sharing-strategy",
        "gpu.memory",
        "gpu.family",
        "gpu.compute.major",
        "gpu.compute.minor",
        "gpu.mode",
        "vgpu.present",
    )
}

# shape: (product, count, mig.capable, memory, family, compute major, minor, machine)
EXPECTED = {
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", "8", "true", "81559", "hopper", "9", "0", "DGXH100"),
    "host-driver": ("NVIDIA-L40S", "2", "false", "46068", "ada-lovelace", "8", "9", "PowerEdge-R760xa"),
    "a10": ("NVIDIA-A10", "2", "false", "23028", "ampere", "8", "6", "ProLiant-DL380-Gen10-Plus"),
    "dgx-a100": ("NVIDIA-A100-SXM4-40GB", "8", "true", "40960", "ampere", "8", "0", "DGXA100"),
    "dgx-b200": ("NVIDIA-B200", "8", "true", "183359", "blackwell", "10", "0", "DGXB200"),
    # no node name: no fabric position, so no gpu.clique (tests/unit/sim/test_new_systems.py)
    "gb200-nvl72": ("NVIDIA-GB200", "4", "true", "189471", "blackwell", "10", "0", "unknown"),
    "rtx-pro-6000": (
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        "8",
        "true",
        "97887",
        "blackwell",
        "12",
        "0",
        "PowerEdge-XE7740",
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gfd_labels_per_shape(name: str) -> None:
    product, count, mig, memory, family, major, minor, machine = EXPECTED[name]
    labels = shapes.load(name).gfd_labels()
    assert set(labels) == GFD_KEYS
    assert (
        labels["nvidia.com/gpu.product"],
        labels["nvidia.com/gpu.count"],
        labels["nvidia.com/mig.capable"],
        labels["nvidia.com/gpu.memory"],
        labels["nvidia.com/gpu.family"],
        labels["nvidia.com/gpu.compute.major"],
        labels["nvidia.com/gpu.compute.minor"],
        labels["nvidia.com/gpu.machine"],
    ) == (product, count, mig, memory, family, major, minor, machine)
    assert labels["nvidia.com/gpu.replicas"] == "1" and labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.mode"] == "compute" and labels["nvidia.com/mps.capable"] == "false"
    assert labels["nvidia.com/cuda.driver-version.full"] == shapes.DRIVER_VERSION
    assert labels["nvidia.com/cuda.driver.rev"] == shapes.DRIVER_VERSION.split(".")[2]
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.4"


@pytest.mark.parametrize("name", ["cpu", "vfio-passthrough"])
def test_no_gfd_labels_where_nvml_sees_no_gpu(name: str) -> None:
    assert shapes.load(name).gfd_labels(timestamp=1) == {}


@pytest.mark.parametrize(("strategy", "label"), [("none", None), ("single", "single"), ("mixed", "mixed")])
def test_mig_strategy_and_timestamp(strategy: str, label: str | None) -> None:
    labels = shapes.load("dgx-h100").gfd_labels(strategy, timestamp=1700000000)
    assert labels.get("nvidia.com/mig.strategy") == label
    assert labels["nvidia.com/gfd.timestamp"] == "1700000000"
    assert "nvidia.com/gfd.timestamp" not in shapes.load("dgx-h100").gfd_labels(strategy)


@pytest.mark.parametrize("name", shapes.names())
def test_a_created_node_carries_no_gfd_label_nor_gpu_capacity(name: str) -> None:
    node = shapes.load(name).node(f"{name}-0")
    labels = node["metadata"]["labels"]
    assert not set(labels) & (GFD_KEYS | {"nvidia.com/mig.strategy", "nvidia.com/gfd.timestamp"})
    assert "nvidia.com/gpu.driver.source" not in labels  # our probe writes it, later
    assert (
        GPU_RESOURCE not in node["status"]["capacity"] and GPU_RESOURCE not in node["status"]["allocatable"]
    )
    assert {k for k in labels if k.startswith("nvidia.com/")} <= {"nvidia.com/gpu.workload.config"}


@pytest.mark.parametrize(
    ("name", "device"),
    [
        ("dgx-h100", "2330"),
        ("a10", "2236"),
        ("host-driver", "26b9"),
        ("vfio-passthrough", "2330"),
        ("rtx-pro-6000", "2bb5"),
    ],
)
def test_nfd_pci_labels(name: str, device: str) -> None:
    labels = shapes.load(name).labels("n")
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels[f"feature.node.kubernetes.io/pci-10de_{device}.present"] == "true"
    assert [k for k in labels if k.startswith("feature.node.kubernetes.io/pci-10de_")] == [
        f"feature.node.kubernetes.io/pci-10de_{device}.present"
    ]


def test_cpu_node_has_no_pci_gpu_label() -> None:
    assert not [k for k in shapes.load("cpu").labels("n") if "pci-10de" in k]


def test_settled_view_adds_gfd_labels_and_device_plugin_capacity() -> None:
    shape = shapes.load("dgx-h100")
    settled = shape.settled_node("dgx-h100-0")
    assert settled["metadata"]["labels"] == {**shape.labels("dgx-h100-0"), **shape.gfd_labels()}
    assert (
        settled["status"]["capacity"][GPU_RESOURCE] == settled["status"]["allocatable"][GPU_RESOURCE] == "8"
    )
    passthrough = shapes.load("vfio-passthrough").settled_node("v")
    assert GPU_RESOURCE not in passthrough["status"]["capacity"]
    assert [
        n["metadata"]["labels"].get("nvidia.com/gpu.count") for n in shapes.nodes(["a10:2"], settled=True)
    ] == ["2", "2"]
    assert all("nvidia.com/gpu.count" not in n["metadata"]["labels"] for n in shapes.nodes(["a10:2"]))


def test_host_driver_shape_and_sanitise() -> None:
    assert shapes.load("host-driver").host_driver and not shapes.load("dgx-h100").host_driver
    assert sanitise("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert sanitise("  A (B)  c ") == "A-B-c"
    assert [arch_family(*c) for c in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (12, 0))] == [
        "volta",
        "turing",
        "ampere",
        "ada-lovelace",
        "hopper",
        "blackwell",
    ]


def test_an_unknown_shape_is_refused() -> None:
    with pytest.raises(shapes.ShapeError, match="unknown node shape"):
        shapes.load("no-such-shape")
