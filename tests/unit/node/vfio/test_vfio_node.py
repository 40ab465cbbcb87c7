"""vfio-manage reconcile (the in-cluster vfio-manager) on the seed-001 fixture and the kernel simulator:
which GPUs it binds (all, or a mixed node's 4 of 8), the safety rules, and what it records on the Node."""

from __future__ import annotations

import json
from typing import Any

from gpu_operator.node.host import pci
from gpu_operator.node.vfio.incluster import parse_passthrough_devices, reconcile, select
from gpu_operator.vocabulary import (
    PASSTHROUGH_DEVICES_ANNOTATION,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
    WORKLOAD_CONFIG,
)
from tests.unit.node.nodekit import RecordedNode

H100 = [
    "0000:0a:00.0",
    "0000:18:00.0",
    "0000:3b:00.0",
    "0000:44:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b8:00.0",
    "0000:c1:00.0",
]
VMS, CONTAINERS = H100[:4], H100[4:]


def drivers(fs: Any) -> dict[str, str | None]:
    return {f.address: f.driver for f in pci.scan(fs, "10de") if f.is_gpu}


def test_mixed_node_binds_the_four_listed_gpus_and_leaves_four_on_nvidia(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    node = RecordedNode(
        {WORKLOAD_CONFIG: "vm-passthrough"},
        {PASSTHROUGH_DEVICES_ANNOTATION: "0a:00.0, 0000:18:00.0,3B:00.0 44:00.0"},
    )
    record, written = reconcile(host.fs, host.kernel(), node)
    assert written and record["state"] == "bound"
    assert drivers(host.fs) == {**dict.fromkeys(VMS, "vfio-pci"), **dict.fromkeys(CONTAINERS, "nvidia")}
    assert all(pci.read_function(host.fs, a).driver_override is None for a in CONTAINERS)
    assert node.labels[VFIO_STATE] == "bound"
    stored = json.loads(node.annotations[VFIO_RESULT_ANNOTATION])
    assert {a for a, g in stored["gpus"].items() if g["driver"] == "vfio-pci"} == set(VMS)
    assert all(stored["gpus"][a]["result"].startswith("not for VMs") for a in CONTAINERS)
    (event,) = node.events
    assert event["reason"] == "VFIOBound" and event["type"] == "Normal"
    assert "4 GPU(s) on vfio-pci" in event["message"] and "4 left for containers" in event["message"]


def test_a_second_pass_changes_nothing_and_writes_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    node = RecordedNode({WORKLOAD_CONFIG: "vm-passthrough"})
    reconcile(host.fs, kernel, node)
    writes, patches = len(kernel.log), node.patches
    record, written = reconcile(host.fs, kernel, node)
    assert not written and record["state"] == "bound"
    assert len(kernel.log) == writes and node.patches == patches and len(node.events) == 1
    assert drivers(host.fs) == dict.fromkeys(H100, "vfio-pci")


def test_a_process_holding_a_gpu_is_refused_and_reported_as_a_warning(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "h100-nvidia-bound", processes=[{"pid": 4242, "comm": "nvidia-persistenced", "fds": ["/dev/nvidia0"]}]
    )
    node = RecordedNode(annotations={PASSTHROUGH_DEVICES_ANNOTATION: "0a:00.0,18:00.0"})
    record, _ = reconcile(host.fs, host.kernel(), node)
    assert record["state"] == "partial"
    assert drivers(host.fs)["0000:0a:00.0"] == "nvidia" and drivers(host.fs)["0000:18:00.0"] == "vfio-pci"
    (event,) = node.events
    assert event["type"] == "Warning" and event["reason"] == "VFIORefused"
    assert "nvidia-persistenced (pid 4242)" in event["message"] and "0000:0a:00.0" in event["message"]


def test_iommu_off_refuses_every_gpu(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", iommu=False)
    node = RecordedNode()
    record, _ = reconcile(host.fs, host.kernel(), node)
    assert record["state"] == "refused" and set(drivers(host.fs).values()) == {"nvidia"}
    assert "IOMMU is off" in node.events[0]["message"]


def test_a_foreign_device_in_the_group_is_refused(build_host) -> None:  # type: ignore[no-untyped-def]
    spec_devices = [
        {
            "address": "0000:0a:00.0",
            "vendor": "10de",
            "device": "2330",
            "class": "030200",
            "driver": "nvidia",
            "iommu_group": 40,
        },
        {
            "address": "0000:0b:00.0",
            "vendor": "15b3",
            "device": "1021",
            "class": "020000",
            "driver": "mlx5_core",
            "iommu_group": 40,
        },
    ]
    host = build_host(
        "h100-nvidia-bound", devices=spec_devices, pci_drivers=["vfio-pci", "nvidia", "mlx5_core"]
    )
    node = RecordedNode()
    record, _ = reconcile(host.fs, host.kernel(), node)
    assert record["state"] == "refused" and drivers(host.fs) == {"0000:0a:00.0": "nvidia"}
    assert "non-NVIDIA devices: 0000:0b:00.0" in node.events[0]["message"]


def test_a_container_node_without_a_list_binds_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    node = RecordedNode({WORKLOAD_CONFIG: "container"})
    record, written = reconcile(host.fs, kernel, node)
    assert record["state"] == "none" and kernel.log == [] and node.events == []
    assert written and node.labels[VFIO_STATE] == "none"


def test_a_bad_annotation_names_itself_and_binds_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    for value, words in (
        ("0a:00.0,gpu7", "'gpu7' is not a PCI address"),
        ("0a:00.0,01:00.0", "not an NVIDIA GPU"),
    ):
        node = RecordedNode(annotations={PASSTHROUGH_DEVICES_ANNOTATION: value})
        record, _ = reconcile(host.fs, kernel, node)
        assert record["state"] == "failed" and kernel.log == []
        assert (
            PASSTHROUGH_DEVICES_ANNOTATION in node.events[0]["message"] and words in node.events[0]["message"]
        )


def test_selection_rules() -> None:
    assert select({}, {}).all_gpus
    assert (
        select({WORKLOAD_CONFIG: "vm-vgpu"}, {}).devices == []
        and not select({WORKLOAD_CONFIG: "vm-vgpu"}, {}).all_gpus
    )
    assert select({WORKLOAD_CONFIG: "container"}, {PASSTHROUGH_DEVICES_ANNOTATION: "c1:00.0"}).devices == [
        "0000:c1:00.0"
    ]
    assert parse_passthrough_devices("0A:00.0 0000:0a:00.0,18:00.0") == ["0000:0a:00.0", "0000:18:00.0"]
