"""vGPU host state after a reboot: the fixture host (tests/fixtures/hosts/h100-vgpu.yaml) played by
the vGPU host simulator; the agent's pass restores VFs, vGPU types and MIG mode, changes nothing
the second time, never touches a VF a VM holds, and names the field of a type the GPU cannot create."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.vgpuhost import sysfs
from gpu_operator.node.vgpuhost.config import DesiredVGPUConfig, VGPUConfigError, desired_from_config
from gpu_operator.node.vgpuhost.restore import FM_CONFIG, restore, state_of
from tests.support.hostsim.vgpusim import VgpuHostSim

PFS = ("0000:41:00.0", "0000:c1:00.0")
CONFIG = """\
version: v1
vgpu-configs:
  default:
    - devices: all
      vgpu-devices: {}
  H100XM-20C:
    - devices: all
      vgpu-devices:
        H100XM-20C: 4
  mixed:
    - devices: [0]
      vgpu-devices:
        H100XM-40C: 2
    - devices: [1]
      vgpu-devices:
        H100XM-1-10C: 3
  H100XM-40C:
    - devices: all
      vgpu-devices:
        H100XM-40C: 2
  too-big:
    - devices: all
      vgpu-devices:
        H100XM-80C: 2
  wrong-family:
    - devices: all
      vgpu-devices:
        H100-20C: 1
"""


@pytest.fixture
def host(build_host):  # type: ignore[no-untyped-def]
    fake = build_host("h100-vgpu")
    return fake.fs, VgpuHostSim(fake.fs, fake.spec)


def desired(fs: HostFS, name: str, fabric_mode: int | None = 2) -> DesiredVGPUConfig:
    return desired_from_config(
        fs,
        CONFIG,
        name,
        source="config.yaml",
        chosen_by="test",
        fabric_mode=fabric_mode,
        fabric_mode_source="FABRIC_MODE",
    )


def snapshot(fs: HostFS, sim: VgpuHostSim) -> dict[str, dict[str, Any]]:
    """What a reboot loses, read back from sysfs (and MIG mode from the simulated nvidia-smi)."""
    out = {}
    for address in PFS:
        pf = sysfs.read_pf(fs, address)
        out[address] = {
            "numvfs": pf.numvfs,
            "types": [vf.current for vf in pf.vfs],
            "vfs": [vf.address for vf in pf.vfs],
            "mig": sim.mig_mode(address),
        }
    return out


def test_the_fixture_boots_without_vfs_and_the_pf_reads_as_sriov_capable(host) -> None:  # type: ignore[no-untyped-def]
    fs, _sim = host
    pf = sysfs.read_pf(fs, PFS[0])
    assert (pf.totalvfs, pf.numvfs, pf.vfs) == (16, 0, [])


def test_restore_brings_back_exactly_what_the_reboot_cleared(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    want = desired(fs, "mixed")
    first = restore(fs, want, sim, sim)
    assert state_of(first) == "restored", [s.line() for s in first]
    before = snapshot(fs, sim)
    assert before["0000:41:00.0"]["numvfs"] == 16 and before["0000:41:00.0"]["types"][:3] == [1058, 1058, 0]
    assert before["0000:c1:00.0"]["types"][:4] == [1061, 1061, 1061, 0]
    assert before["0000:c1:00.0"]["mig"] == (True, True) and before["0000:41:00.0"]["mig"] == (False, False)
    assert before["0000:41:00.0"]["vfs"][:2] == ["0000:41:00.4", "0000:41:00.5"]

    sim.reboot()
    cleared = snapshot(fs, sim)
    assert all(c == {"numvfs": 0, "types": [], "vfs": [], "mig": (False, False)} for c in cleared.values())

    again = restore(fs, want, sim, sim)
    assert state_of(again) == "restored"
    assert snapshot(fs, sim) == before
    # NVIDIA's order on each GPU: MIG mode, then the VFs, then the types
    c1 = [s.step for s in again if s.gpu == "0000:c1:00.0"]
    assert c1 == ["mig-mode", "vfs", "vgpu-types"]
    assert sim.log.index("nvidia-smi -i 0000:c1:00.0 -mig 1") < sim.log.index("sriov-manage -e 0000:c1:00.0")


def test_a_second_pass_changes_nothing(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    want = desired(fs, "H100XM-20C")
    known: dict[str, int] = {}
    restore(fs, want, sim, sim, known)
    writes = len(sim.log)
    second = restore(fs, want, sim, sim, known)
    assert state_of(second) == "unchanged", [s.line() for s in second]
    assert {s.outcome for s in second} == {"ok"}
    assert len(sim.log) == writes


def test_a_vf_a_vm_holds_is_skipped_and_reported(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    known: dict[str, int] = {}  # the type ids the agent records (a full GPU's VFs list none)
    restore(fs, desired(fs, "H100XM-20C"), sim, sim, known)
    sim.start_vm(4242, "0000:41:00.4")  # a VM runs on virtfn0 of the first GPU with its H100XM-20C
    log = len(sim.log)
    steps = restore(fs, desired(fs, "H100XM-40C"), sim, sim, known)  # the config now wants H100XM-40C
    step = next(s for s in steps if s.gpu == "0000:41:00.0" and s.step == "vgpu-types")
    assert step.outcome == "skipped"
    assert "qemu-kvm[4242]" in step.detail
    assert state_of(steps) == "partial"
    assert [vf.current for vf in sysfs.read_pf(fs, "0000:41:00.0").vfs][:4] == [1059] * 4  # untouched
    assert not any(line.startswith("/sys/bus/pci/devices/0000:41:") for line in sim.log[log:])
    # the other GPU, without a VM, took the new layout: its old vGPUs cleared first
    other = next(s for s in steps if s.gpu == "0000:c1:00.0" and s.step == "vgpu-types")
    assert other.outcome == "changed"
    assert [vf.current for vf in sysfs.read_pf(fs, "0000:c1:00.0").vfs][:4] == [1058, 1058, 0, 0]


def test_a_gpu_with_a_vm_keeps_its_vfs_when_their_count_is_off(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    restore(fs, desired(fs, "H100XM-20C"), sim, sim)
    sim.start_vm(4243, "0000:41:00.5")
    fs.write_text("/sys/bus/pci/devices/0000:41:00.0/sriov_numvfs", "8\n")  # someone changed the count
    steps = restore(fs, desired(fs, "H100XM-20C"), sim, sim)
    vfs = next(s for s in steps if s.gpu == "0000:41:00.0" and s.step == "vfs")
    assert vfs.outcome == "skipped" and "qemu-kvm[4243]" in vfs.detail
    assert "sriov-manage -d 0000:41:00.0" not in sim.log


def test_a_type_the_gpu_cannot_create_names_the_field_and_what_it_can(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    steps = restore(fs, desired(fs, "wrong-family"), sim, sim)
    bad = [s for s in steps if s.step == "vgpu-types"]
    assert [s.outcome for s in bad] == ["failed", "failed"]
    assert bad[0].field == "config.yaml: vgpu-configs.wrong-family[0].vgpu-devices"
    assert bad[0].creatable == ["H100XM-80C", "H100XM-40C", "H100XM-20C", "H100XM-10C"]
    assert state_of(steps) == "failed"


def test_more_vgpus_than_fit_fail_on_the_vf_that_cannot_take_one(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    steps = restore(fs, desired(fs, "too-big"), sim, sim)
    bad = next(s for s in steps if s.step == "vgpu-types")
    assert bad.outcome == "failed" and bad.creatable == [] and "virtfn1" in bad.detail


def test_fabric_manager_mode_is_written_to_the_hosts_config_once(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    steps = restore(fs, desired(fs, "default"), sim, sim)
    fm = next(s for s in steps if s.step == "fabric-manager")
    assert fm.outcome == "changed"
    assert "FABRIC_MODE=2\n" in (fs.read_text(FM_CONFIG) or "") and "LOG_LEVEL=4" in (
        fs.read_text(FM_CONFIG) or ""
    )
    again = next(s for s in restore(fs, desired(fs, "default"), sim, sim) if s.step == "fabric-manager")
    assert again.outcome == "ok"


def test_bad_configs_name_the_field(host) -> None:  # type: ignore[no-untyped-def]
    fs, _sim = host
    with pytest.raises(VGPUConfigError, match=r"no config 'nope'.*H100XM-20C"):
        desired(fs, "nope")
    with pytest.raises(
        VGPUConfigError, match=r"vgpu-configs.x\[0\].vgpu-devices: 'H100 20C' is not a vGPU type"
    ):
        desired_from_config(
            fs,
            "version: v1\nvgpu-configs:\n  x:\n  - devices: all\n    vgpu-devices: {H100 20C: 1}\n",
            "x",
            source="config.yaml",
            chosen_by="test",
        )
    with pytest.raises(VGPUConfigError, match=r"vgpu-configs.x\[0\].devices: write `all`"):
        desired_from_config(
            fs,
            "version: v1\nvgpu-configs:\n  x:\n  - devices: first\n    vgpu-devices: {}\n",
            "x",
            source="config.yaml",
            chosen_by="test",
        )


def test_on_a_gpu_that_keeps_mig_mode_it_takes_effect_at_the_reboot(build_host) -> None:  # type: ignore[no-untyped-def]
    """Ampere's way (NVIDIA: A100 keeps MIG mode across reboots, a change waits for a reset): the pass
    reports the pending mode as not done; after the reboot it is current and the vGPUs follow."""
    spec = build_host("h100-vgpu").spec
    fake = build_host("h100-vgpu", vgpu={**spec["vgpu"], "mig_persists_reboot": True})
    fs, sim = fake.fs, VgpuHostSim(fake.fs, fake.spec)
    first = restore(fs, desired(fs, "mixed"), sim, sim)
    mig = next(s for s in first if s.gpu == "0000:c1:00.0" and s.step == "mig-mode")
    assert mig.outcome == "failed" and "pending" in mig.detail
    assert sim.mig_mode("0000:c1:00.0") == (False, True)
    sim.reboot()
    assert sim.mig_mode("0000:c1:00.0") == (True, True)
    again = restore(fs, desired(fs, "mixed"), sim, sim)
    assert state_of(again) == "restored"
    assert [vf.current for vf in sysfs.read_pf(fs, "0000:c1:00.0").vfs][:3] == [1061] * 3


def test_a_write_the_driver_refuses_fails_the_step_with_its_error(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host

    class Refusing:
        def write(self, path: str, value: str) -> None:
            raise OSError(errno.EBUSY, "Device or resource busy")

    steps = restore(fs, desired(fs, "H100XM-20C"), Refusing(), sim)
    types = [s for s in steps if s.step == "vgpu-types"]
    assert [s.outcome for s in types] == ["failed", "failed"]
    assert types[0].detail == "writing 1059 to 0000:41:00.4/nvidia/current_vgpu_type: Device or resource busy"


def test_an_mdev_host_gets_its_vfs_and_leaves_the_vgpus_to_the_device_manager(build_host) -> None:  # type: ignore[no-untyped-def]
    """Ampere's SR-IOV vGPU: the VFs are mdev parents. The agent enables them (the mdev devices live
    on them) and creates no vGPU: that framework is NVIDIA's vGPU device manager's."""
    spec = build_host("h100-vgpu").spec
    fake = build_host("h100-vgpu", vgpu={**spec["vgpu"], "framework": "mdev"})
    fs, sim = fake.fs, VgpuHostSim(fake.fs, fake.spec)
    steps = restore(fs, desired(fs, "H100XM-20C"), sim, sim)
    types = next(s for s in steps if s.gpu == PFS[0] and s.step == "vgpu-types")
    assert (types.outcome, types.detail) == (
        "ok",
        "0000:41:00.4: the mdev framework: its vGPUs are the vGPU device manager's to create",
    )
    assert state_of(steps) == "restored" and sysfs.read_pf(fs, PFS[0]).numvfs == 16
    assert not any("current_vgpu_type" in line for line in sim.log)


def test_a_gpu_without_sr_iov_that_is_an_mdev_parent_is_left_alone(build_host) -> None:  # type: ignore[no-untyped-def]
    spec = build_host("h100-vgpu").spec
    gpu = {**spec["devices"][0], "attributes": {"mdev_supported_types/nvidia-222/name": "T4-16Q"}}
    fake = build_host("h100-vgpu", devices=[gpu, *spec["devices"][1:]])
    fs, sim = fake.fs, VgpuHostSim(fake.fs, fake.spec)
    steps = restore(fs, desired(fs, "H100XM-20C", fabric_mode=None), sim, sim)
    assert [(s.step, s.outcome) for s in steps if s.gpu == PFS[0]] == [("mig-mode", "ok"), ("vfs", "ok")]
    assert state_of(steps) == "unchanged" and sim.log == []


def test_without_fabric_managers_config_on_the_host_the_step_says_what_to_install(build_host) -> None:  # type: ignore[no-untyped-def]
    fake = build_host("h100-vgpu", files={})
    fs, sim = fake.fs, VgpuHostSim(fake.fs, fake.spec)
    fm = next(s for s in restore(fs, desired(fs, "default"), sim, sim) if s.step == "fabric-manager")
    assert fm.outcome == "failed" and fm.field == "FABRIC_MODE"
    assert fm.detail.startswith(
        f"FABRIC_MODE=2 wanted, but the host has no {FM_CONFIG}: install Fabric Manager"
    )
