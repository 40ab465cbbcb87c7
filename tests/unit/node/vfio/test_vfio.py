"""vfio-manage against the kernel simulator: behaviour, refusals with reasons, idempotence."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import RecordingWriter
from gpu_operator.node.vfio import manage as vfio
from tests.unit.node.nodekit import HOST_NAMES

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


def _drivers(fs) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    return {f.address: f.driver for f in pci.scan(fs, "10de")}


def test_bind_all_moves_eight_h100s_and_a_second_run_changes_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    assert set(_drivers(host.fs).values()) == {"nvidia"}
    plans = vfio.execute(host.fs, kernel, "bind", [], True)
    assert [p.gpu for p in plans] == H100 and all(p.ok for p in plans)
    assert _drivers(host.fs) == dict.fromkeys(H100, "vfio-pci")
    assert all(pci.read_function(host.fs, a).driver_override == "vfio-pci" for a in H100)
    first = len(kernel.log)
    again = vfio.execute(host.fs, kernel, "bind", [], True)
    assert len(kernel.log) == first and all(p.unchanged and p.ok for p in again)
    assert _drivers(host.fs) == dict.fromkeys(H100, "vfio-pci")


def test_seed_host_already_isolated_needs_no_writes(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    kernel = host.kernel()
    plans = vfio.execute(host.fs, kernel, "bind", [], True)
    assert kernel.log == [] and all(p.ok and "already" in p.result for p in plans)


def test_audio_function_moves_with_its_gpu_and_the_other_gpu_stays(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver", pci_drivers=["nvidia", "snd_hda_intel", "vfio-pci"])
    (plan,) = vfio.execute(host.fs, host.kernel(), "bind", ["41:00.0"], False)
    assert plan.ok
    assert _drivers(host.fs) == {
        "0000:41:00.0": "vfio-pci",
        "0000:41:00.1": "vfio-pci",
        "0000:c1:00.0": "nvidia",
        "0000:c1:00.1": "snd_hda_intel",
    }


def test_unbind_gives_gpus_back_to_the_host_driver(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver", pci_drivers=["nvidia", "snd_hda_intel", "vfio-pci"])
    kernel = host.kernel()
    vfio.execute(host.fs, kernel, "bind", [], True)
    plans = vfio.execute(host.fs, kernel, "unbind", [], True)
    assert all(p.ok for p in plans)
    assert _drivers(host.fs) == {
        "0000:41:00.0": "nvidia",
        "0000:41:00.1": "snd_hda_intel",
        "0000:c1:00.0": "nvidia",
        "0000:c1:00.1": "snd_hda_intel",
    }
    assert all(f.driver_override is None for f in pci.scan(host.fs, "10de"))
    assert all(p.unchanged for p in vfio.execute(host.fs, kernel, "unbind", [], True))


def test_unbind_without_a_host_driver_says_so(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    (plan,) = vfio.execute(host.fs, host.kernel(), "unbind", ["0a:00.0"], False)
    assert plan.ok and "no host driver claims it" in plan.result
    assert _drivers(host.fs)["0000:0a:00.0"] is None


def test_refuses_when_iommu_is_off(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", iommu=False)
    kernel = host.kernel()
    plans = vfio.execute(host.fs, kernel, "bind", [], True)
    assert all(p.refused and "IOMMU is off" in p.refused and "intel_iommu=on" in p.refused for p in plans)
    assert kernel.log == [] and set(_drivers(host.fs).values()) == {"nvidia"}


def test_refuses_a_group_shared_with_a_foreign_device(build_host) -> None:  # type: ignore[no-untyped-def]
    devices = [
        {
            "address": "0000:0a:00.0",
            "vendor": "10de",
            "device": "2330",
            "class": "030200",
            "driver": "nvidia",
            "iommu_group": 30,
        },
        {
            "address": "0000:0a:00.2",
            "vendor": "8086",
            "device": "1572",
            "class": "020000",
            "driver": "i40e",
            "iommu_group": 30,
        },
        {
            "address": "0000:18:00.0",
            "vendor": "10de",
            "device": "2330",
            "class": "030200",
            "driver": "nvidia",
        },
    ]
    host = build_host("h100-nvidia-bound", devices=devices)
    refused, moved = vfio.execute(host.fs, host.kernel(), "bind", [], True)
    assert refused.refused and "0000:0a:00.2" in refused.refused and "ACS" in refused.refused
    assert moved.ok and _drivers(host.fs) == {"0000:0a:00.0": "nvidia", "0000:18:00.0": "vfio-pci"}


def test_gpus_sharing_a_group_must_move_together(build_host) -> None:  # type: ignore[no-untyped-def]
    devices = [
        {
            "addresses": ["0000:0a:00.0", "0000:0b:00.0"],
            "vendor": "10de",
            "device": "2330",
            "class": "030200",
            "driver": "nvidia",
            "iommu_group": 40,
            "parent": "pci0000:00/0000:00:02.0",
        },
    ]
    host = build_host("h100-nvidia-bound", devices=devices)
    (alone,) = vfio.execute(host.fs, host.kernel(), "bind", ["0000:0a:00.0"], False)
    assert alone.refused and "0000:0b:00.0" in alone.refused and "--all" in alone.refused
    both = vfio.execute(host.fs, host.kernel(), "bind", ["0a:00.0", "0b:00.0"], False)
    assert all(p.ok for p in both) and set(_drivers(host.fs).values()) == {"vfio-pci"}


def test_refuses_a_gpu_in_use_and_binds_the_rest(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "h100-nvidia-bound",
        processes=[{"pid": 1777, "comm": "nvidia-persistenced", "fds": ["/dev/nvidiactl", "/dev/nvidia3"]}],
    )
    plans = {p.gpu: p for p in vfio.execute(host.fs, host.kernel(), "bind", [], True)}
    busy = plans["0000:44:00.0"]  # minor 3 in /proc/driver/nvidia/gpus
    assert busy.refused and "nvidia-persistenced (pid 1777) holds /dev/nvidia3" in busy.refused
    drivers = _drivers(host.fs)
    assert drivers.pop("0000:44:00.0") == "nvidia" and set(drivers.values()) == {"vfio-pci"}


def test_refuses_unbind_while_a_vm_holds_the_group(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio", processes=[{"pid": 900, "comm": "qemu-kvm", "fds": ["/dev/vfio/10"]}])
    (plan,) = vfio.execute(host.fs, host.kernel(), "unbind", ["0a:00.0"], False)
    assert plan.refused and "qemu-kvm (pid 900)" in plan.refused


def test_vfio_module_is_loaded_when_missing_or_the_bind_is_refused(build_host) -> None:  # type: ignore[no-untyped-def]
    spec = {"pci_drivers": ["nvme", "nvidia"], "modules": ["nvidia"]}
    host = build_host("h100-nvidia-bound", **spec)
    kernel = host.kernel()
    plans = vfio.execute(host.fs, kernel, "bind", [], True)
    assert all(p.refused and "modprobe vfio-pci" in p.refused for p in plans) and kernel.log == []
    plans = vfio.execute(host.fs, kernel, "bind", [], True, load_vfio=lambda: kernel.load_driver("vfio-pci"))
    assert all(p.ok for p in plans) and set(_drivers(host.fs).values()) == {"vfio-pci"}


def test_dry_run_plans_the_writes_and_changes_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    recorder = RecordingWriter()
    plans = vfio.plan(host.fs, "bind", ["0a:00.0"], False)
    for path, value in plans[0].writes:
        recorder.write(path, value)
    assert recorder.writes == [
        ("/sys/bus/pci/devices/0000:0a:00.0/driver_override", "vfio-pci"),
        ("/sys/bus/pci/drivers/nvidia/unbind", "0000:0a:00.0"),
        ("/sys/bus/pci/drivers_probe", "0000:0a:00.0"),
    ]
    assert _drivers(host.fs)["0000:0a:00.0"] == "nvidia"


@pytest.mark.parametrize("bad", ["zz:00.0", "0000:0a:00", "0000:ff:00.0"])
def test_bad_device_arguments_name_the_problem(build_host, bad: str) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    with pytest.raises(vfio.VfioUsageError, match="--device"):
        vfio.plan(host.fs, "bind", [bad], False)
    with pytest.raises(vfio.VfioUsageError, match="--all"):
        vfio.plan(host.fs, "bind", [], False)


def test_cli_dry_run_prints_writes_and_cpu_only_host_has_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    result = CliRunner().invoke(
        app, ["vfio-manage", "bind", "--all", "--dry-run", "--host-root", str(host.fs.root)]
    )
    assert result.exit_code == 0, result.output
    assert "echo 'vfio-pci' > /sys/bus/pci/devices/0000:c1:00.0/driver_override" in result.output
    assert _drivers(host.fs)["0000:c1:00.0"] == "nvidia"
    cpu = build_host("cpu-only")
    result = CliRunner().invoke(app, ["vfio-manage", "bind", "--all", "--host-root", str(cpu.fs.root)])
    assert result.exit_code == 0 and "no NVIDIA GPU" in result.output
    result = CliRunner().invoke(
        app, ["vfio-manage", "bind", "--device", "0a:00.0", "--host-root", str(cpu.fs.root)]
    )
    assert result.exit_code == 2 and "not an NVIDIA GPU" in result.output


@pytest.mark.parametrize("name", HOST_NAMES)
def test_bind_all_then_unbind_all_on_every_fixture(build_host, name: str) -> None:  # type: ignore[no-untyped-def]
    host = build_host(name)
    kernel = host.kernel()
    gpus = [f.address for f in pci.scan(host.fs, "10de") if f.is_gpu]
    before = _drivers(host.fs)
    plans = vfio.execute(host.fs, kernel, "bind", [], True, load_vfio=lambda: kernel.load_driver("vfio-pci"))
    assert [p.gpu for p in plans] == gpus and all(p.ok for p in plans), [p.refused or p.result for p in plans]
    assert all(_drivers(host.fs)[a] == "vfio-pci" for a in gpus)
    writes = len(kernel.log)
    assert (
        all(p.unchanged for p in vfio.execute(host.fs, kernel, "bind", [], True))
        and len(kernel.log) == writes
    )
    vfio.execute(host.fs, kernel, "unbind", [], True)
    after = _drivers(host.fs)
    for address, driver in before.items():
        # Back to what the host's loaded drivers claim: the original driver, or none for vfio-only hosts.
        assert after[address] == (None if driver == "vfio-pci" else driver)
