"""The simulator's kwok node of the guest shape: its tree is the KubeVirt guest's, with the
operator's driver loaded where its validator ran (faults.node_host_spec) and only on the GPUs."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.node.doctor.findings import Severity, diagnose
from gpu_operator.node.host.probe import probe
from gpu_operator.sim.hardware import guesttree, hosttree
from gpu_operator.sim.hardware.faults import node_host_spec
from gpu_operator.sim.realnode.realspec import host_spec


def test_the_guest_shapes_tree(tmp_path: Path) -> None:
    report = probe(hosttree.build(host_spec("kubevirt-guest-h100"), tmp_path / "boot"))
    assert [g.address for g in report.gpus] == guesttree.gpu_addresses(2)
    assert report.guest.is_guest and report.driver.source.value == "none"


def test_the_driver_goes_to_the_gpus_only(tmp_path: Path) -> None:
    fs = hosttree.build(node_host_spec("kubevirt-guest-h100"), tmp_path / "root")
    report = probe(fs)
    assert {g.driver for g in report.gpus} == {"nvidia"}
    assert fs.link_name("/sys/bus/pci/devices/0000:01:00.0/driver") == "virtio-pci"
    [missing] = [f for f in diagnose(report) if f.code == "nvlink-fabric-missing"]
    # the module is loaded but the tree has no params file: what NvLinkDisable is stays unknown
    assert missing.severity == Severity.WARNING
    assert missing.evidence[2] == (
        "the nvidia module is loaded, but /proc/driver/nvidia/params names no NvLinkDisable: not known"
    )


def test_the_guest_runs_the_same_stock_containerd_as_the_simulators_hosts() -> None:
    from gpu_operator.sim.realnode.realspec import RUNTIME_FILES

    files = guesttree.guest_spec(1)["files"]
    assert {k: files[k] for k in RUNTIME_FILES["containerd"]} == RUNTIME_FILES["containerd"]
