"""A KubeVirt VM guest's host tree (sim/hardware/guesttree.py) as the probe, discovery and doctor read it:
1, 2 and 8 H100 SXM5 passed through, a PCIe H100, a vGPU guest, NVSwitches given, NVLink disabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.node.discover import discovered
from gpu_operator.node.doctor.findings import Finding, Severity, diagnose
from gpu_operator.node.host import pci
from gpu_operator.node.host.guest import vgpu_capability
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.probe import probe
from gpu_operator.sim.hardware import guesttree, hosttree
from gpu_operator.vocabulary import NFD_DEVICE_LABEL_PREFIX, NFD_HYPERVISOR


def build(tmp_path: Path, *args: object, **kwargs: object) -> HostFS:
    return hosttree.build(guesttree.guest_spec(*args, **kwargs), tmp_path / "root")  # type: ignore[arg-type]


def by_code(findings: list[Finding]) -> dict[str, Finding]:
    return {f.code: f for f in findings}


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_sxm_guest_layout(tmp_path: Path, gpus: int) -> None:
    fs = build(tmp_path, gpus)
    report = probe(fs)
    assert [g.address for g in report.gpus] == guesttree.gpu_addresses(gpus)
    assert {g.vendor_device for g in report.gpus} == {"10de:2330"}
    # each GPU alone behind a QEMU PCIe root port on bus 0
    for gpu in report.gpus:
        port = Path(fs.canonical(f"/sys/bus/pci/devices/{gpu.address}")).parent.name
        assert port.startswith("0000:00:0")
        assert pci.read_function(fs, port).vendor_device == "1b36:000c"
        assert gpu.iommu_group is None and gpu.numa_node is None
    assert report.iommu.enabled is False and fs.listdir("/sys/kernel/iommu_groups") == []
    guest = report.guest
    assert guest.is_guest and guest.hypervisor_flag
    assert (guest.dmi_vendor, guest.dmi_product, guest.dmi_family) == ("KubeVirt", "None", "KubeVirt")
    assert guest.kind == "passthrough"
    assert guest.nvlink_gpus == guesttree.gpu_addresses(gpus) and guest.nvswitches == []
    assert guest.fabric_missing


def test_bare_metal_hosts_are_not_guests(tmp_path: Path) -> None:
    from gpu_operator.sim.realnode.realspec import host_spec

    report = probe(hosttree.build(host_spec("dgx-h100"), tmp_path / "root"))
    assert not report.guest.is_guest and report.guest.gpus == []
    assert by_code(diagnose(report)).keys().isdisjoint({"vm-guest", "nvlink-fabric-missing"})


def test_sxm_guest_before_the_driver_loads_warns(tmp_path: Path) -> None:
    found = by_code(diagnose(probe(build(tmp_path, 2))))
    assert found["vm-guest"].severity == Severity.INFO
    missing = found["nvlink-fabric-missing"]
    assert missing.severity == Severity.WARNING
    assert missing.evidence[0] == "GPUs: 0000:06:00.0, 0000:07:00.0"


def test_sxm_guest_with_the_driver_loaded_is_an_error(tmp_path: Path) -> None:
    report = probe(build(tmp_path, 8, driver=True))
    assert report.guest.nvlink_disable == 0
    assert report.driver.source.value == "operator"
    missing = by_code(diagnose(report))["nvlink-fabric-missing"]
    assert missing.severity == Severity.ERROR
    assert "/proc/driver/nvidia/params: NvLinkDisable: 0" in missing.evidence


def test_nvlink_disabled_lets_cuda_start(tmp_path: Path) -> None:
    report = probe(build(tmp_path, 2, driver=True, nvlink_disabled=True))
    found = by_code(diagnose(report))
    assert "nvlink-fabric-missing" not in found
    assert found["nvlink-disabled-in-guest"].severity == Severity.INFO


def test_nvswitches_given_to_the_vm(tmp_path: Path) -> None:
    report = probe(build(tmp_path, 8, nvswitches=4, driver=True))
    assert len(report.guest.nvswitches) == 4 and not report.guest.fabric_missing
    found = by_code(diagnose(report))
    assert "nvlink-fabric-missing" not in found and "nvlink-fabric-in-guest" in found


def test_pcie_h100_guest_has_no_fabric_to_miss(tmp_path: Path) -> None:
    report = probe(build(tmp_path, 1, model="h100-pcie", driver=True))
    assert report.gpus[0].vendor_device == "10de:2331"
    assert report.guest.kind == "passthrough" and report.guest.nvlink_gpus == []
    found = by_code(diagnose(report))
    assert "vm-guest" in found and "nvlink-fabric-missing" not in found


def test_vgpu_guest(tmp_path: Path) -> None:
    report = probe(build(tmp_path, 1, vgpu=True, driver=True))
    [gpu] = report.guest.gpus
    assert (gpu.kind, gpu.host_driver_version, gpu.host_driver_branch) == ("vgpu", "550.127.05", "r550_00")
    assert report.guest.kind == "vgpu" and not report.guest.fabric_missing
    found = by_code(diagnose(report))
    assert "nvlink-fabric-missing" not in found
    assert "0000:06:00.0: vgpu (host vGPU manager 550.127.05, branch r550_00)" in found["vm-guest"].evidence


def test_unprivileged_read_leaves_the_kind_unknown(tmp_path: Path) -> None:
    fs = build(tmp_path, 1)
    config = fs.resolve("/sys/bus/pci/devices/0000:06:00.0/config")
    config.write_bytes(config.read_bytes()[:64])  # what an unprivileged read of sysfs config returns
    report = probe(fs)
    assert report.guest.kind == "unknown"
    assert vgpu_capability(b"\0" * 64) is None


def test_capability_parsing_edges() -> None:
    assert vgpu_capability(guesttree.gpu_config("2330")) == (False, "", "")
    assert vgpu_capability(guesttree.vgpu_config("2330", "535.54.06", "r535_00")) == (
        True,
        "535.54.06",
        "r535_00",
    )
    no_list = bytearray(guesttree.vgpu_config("2330"))
    no_list[6] = 0  # status says: no capability list
    assert vgpu_capability(bytes(no_list)) == (False, "", "")
    loop = bytearray(guesttree.gpu_config("2330"))
    loop[0x79] = 0x60  # the PCIe capability points back at the first: a loop ends the walk
    assert vgpu_capability(bytes(loop)) == (False, "", "")


def test_discovery_labels_a_guest_and_its_nvswitches(tmp_path: Path) -> None:
    labels, _ = discovered(build(tmp_path, 2))
    assert labels[NFD_HYPERVISOR] == "true" and labels[f"{NFD_DEVICE_LABEL_PREFIX}2330.present"] == "true"
    assert f"{NFD_DEVICE_LABEL_PREFIX}22a3.present" not in labels
    labels, _ = discovered(build(tmp_path / "b", 8, nvswitches=4))
    assert labels[f"{NFD_DEVICE_LABEL_PREFIX}22a3.present"] == "true"


def test_guest_spec_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="model"):
        guesttree.guest_spec(1, model="h100-nvl")
    with pytest.raises(ValueError, match="gpus"):
        guesttree.guest_spec(0)
