"""The probe on every fixture host, and on variations that move one fact at a time."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.host.probe import probe
from tests.unit.node.nodekit import HOST_NAMES

# name -> (driver source, flavor, GPU count, runtime flavor, nvidia runtime, nouveau, passthrough intent)
EXPECTED = {
    "cpu-only": ("none", "", 0, "containerd", False, False, False),
    "h100-nvidia-bound": ("host", "distribution", 8, "k3s", False, False, False),
    "h100-vfio": ("vfio", "", 8, "k3s", False, False, True),
    "h100-vgpu": ("host", "distribution", 2, "", False, False, False),
    "nouveau": ("none", "", 1, "containerd", False, True, False),
    "operator-driver": ("operator", "operator", 2, "containerd", True, False, False),
    "talos": ("host", "talos", 1, "talos", True, False, False),
    "ubuntu-apt-driver": ("host", "distribution", 2, "containerd", True, False, False),
}


def test_every_fixture_has_an_expectation() -> None:
    assert set(EXPECTED) == set(HOST_NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_probe_on_fixture(build_host, name: str) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host(name).fs)
    source, flavor, gpus, runtime, nvidia_runtime, nouveau, intent = EXPECTED[name]
    assert report.driver.source == source
    assert report.driver.flavor == flavor
    assert len(report.gpus) == gpus
    assert report.runtime.flavor == runtime
    assert report.runtime.nvidia_runtime is nvidia_runtime
    assert report.nouveau_loaded is nouveau
    assert report.passthrough_intent.present is intent
    assert report.iommu.enabled


def test_seed_001_host_facts(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("h100-vfio").fs)
    assert [g.address for g in report.gpus] == [
        "0000:0a:00.0",
        "0000:18:00.0",
        "0000:3b:00.0",
        "0000:44:00.0",
        "0000:87:00.0",
        "0000:90:00.0",
        "0000:b8:00.0",
        "0000:c1:00.0",
    ]
    assert {g.vendor_device for g in report.gpus} == {"10de:2330"}
    assert len({g.iommu_group for g in report.gpus}) == 8
    assert [g.numa_node for g in report.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert report.vfio_pci_loaded and report.iommu.cmdline_flags == ["intel_iommu=on", "iommu=pt"]
    assert any("init-top/vfio-pci-override" in e for e in report.passthrough_intent.evidence)
    assert report.runtime.socket == "/run/k3s/containerd/containerd.sock"


def test_talos_driver_found_outside_usr_bin(build_host) -> None:  # type: ignore[no-untyped-def]
    driver = probe(build_host("talos").fs).driver
    assert driver.nvidia_smi == "/usr/local/bin/nvidia-smi"
    assert driver.nvml_library and driver.nvml_library.startswith("/usr/local/glibc/usr/lib/")
    # the driver's tree: nvidia-smi in its bin/, libnvidia-ml in its glibc/usr/lib
    assert driver.kernel_version == "570.124.06" and driver.driver_root == "/usr/local"


def test_glibc_tree_alone_is_enough_to_find_a_talos_driver(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("talos", executables={}, os={"id": "talos", "version_id": "v1.9.5"})
    driver = probe(host.fs).driver
    assert (driver.source, driver.flavor, driver.nvidia_smi, driver.driver_root) == (
        "host",
        "talos",
        None,
        "/usr/local",
    )


def test_extra_search_path_finds_a_driver_in_an_odd_place(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", executables={"/opt/vendor/nvidia/bin/nvidia-smi": "#!/bin/sh\n"})
    assert probe(host.fs).driver.source == "none"
    driver = probe(host.fs, extra_search_dirs=("/opt/vendor/nvidia/bin",)).driver
    assert (driver.source, driver.nvidia_smi) == ("host", "/opt/vendor/nvidia/bin/nvidia-smi")


def test_module_without_user_space_is_still_a_host_driver(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver", executables={}, files={})
    driver = probe(host.fs).driver
    assert driver.source == "host" and driver.kernel_module_loaded and not driver.host_userspace


def test_iommu_off_and_holders(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "h100-nvidia-bound",
        iommu=False,
        cmdline="ro quiet",
        processes=[{"pid": 77, "comm": "python3", "fds": ["/dev/nvidia7", "/dev/null"]}],
    )
    report = probe(host.fs)
    assert not report.iommu.enabled and report.iommu.groups == 0 and report.iommu.cmdline_flags == []
    assert all(g.iommu_group is None for g in report.gpus)
    assert [(h.pid, h.comm, h.device, h.address) for h in report.holders] == [
        (77, "python3", "/dev/nvidia7", "0000:c1:00.0")
    ]


def test_shared_iommu_group_is_reported(build_host) -> None:  # type: ignore[no-untyped-def]
    devices = [
        {"address": "0000:0a:00.0", "vendor": "10de", "device": "2330", "class": "030200", "iommu_group": 5},
        {"address": "0000:0a:00.1", "vendor": "1b21", "device": "1242", "class": "0c0330", "iommu_group": 5},
    ]
    assert probe(build_host("h100-vfio", devices=devices).fs).shared_iommu_groups == {5: ["0000:0a:00.1"]}


def test_cli_probe_prints_json(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("talos")
    result = CliRunner().invoke(app, ["node", "probe", "--host-root", str(host.fs.root)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["driver"]["source"] == "host" and data["nvidia_functions"][0]["name"] == "AD104GL [L4]"


def test_proc_driver_version_alone_means_the_module_is_loaded(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver", executables={}, files={})
    host.fs.write_text("/proc/modules", "")
    driver = probe(host.fs).driver
    assert (driver.source, driver.kernel_module_loaded, driver.kernel_version) == ("host", True, "550.127.05")
