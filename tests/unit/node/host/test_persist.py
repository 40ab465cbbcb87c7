"""vfio-manage persist on fixture host roots: what it writes, idempotence, --remove restores the files exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.host import persist
from gpu_operator.node.host.hostfs import HostFS

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


def files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.is_symlink()
        and "sys" not in p.relative_to(root).parts[:1]
        and "proc" not in p.relative_to(root).parts[:1]
    }


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["vfio-manage", *args])
    return result.exit_code, result.output


def test_persist_all_writes_the_init_top_script_and_module_lines_then_nothing(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    root = str(host.fs.root)
    code, out = cli("persist", "--all", f"--host-root={root}")
    assert code == 0, out
    script = host.fs.read_text(persist.INITRAMFS_TOOLS_SCRIPT) or ""
    assert all(a in script for a in H100) and "echo vfio-pci >" in script and "driver_override" in script
    assert host.fs.resolve(persist.INITRAMFS_TOOLS_SCRIPT).stat().st_mode & 0o111
    modules = (host.fs.read_text(persist.INITRAMFS_TOOLS_MODULES) or "").splitlines()
    assert [m for m in modules if not m.startswith("#")] == ["vfio", "vfio_iommu_type1", "vfio_pci"]
    assert "update-initramfs -u -k all" in out and "recovery console" in out and persist.SKIP_PARAM in out
    before = files(host.fs.root)
    code, again = cli("persist", "--all", f"--host-root={root}")
    assert code == 0 and "nothing changed" in again and "wrote" not in again
    assert files(host.fs.root) == before


def test_remove_undoes_exactly_what_persist_wrote(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    host.fs.write_text(persist.INITRAMFS_TOOLS_MODULES, "# List of modules\nbonding\n")
    before = files(host.fs.root)
    persist.persist(host.fs, H100[:4])
    assert files(host.fs.root) != before
    result = persist.remove(host.fs)
    assert set(result.removed) == {persist.INITRAMFS_TOOLS_SCRIPT, persist.INITRAMFS_TOOLS_MODULES}
    assert files(host.fs.root) == before
    assert not persist.remove(host.fs).changed


def test_a_new_device_list_rewrites_only_the_script(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    persist.persist(host.fs, H100)
    result = persist.persist(host.fs, H100[:4])
    assert result.written == [persist.INITRAMFS_TOOLS_SCRIPT]
    assert persist.inspect(host.fs).ours == H100[:4]


def test_a_foreign_file_at_our_path_is_not_overwritten(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    host.fs.write_text(persist.INITRAMFS_TOOLS_SCRIPT, "#!/bin/sh\n# mine\n")
    with pytest.raises(persist.PersistError, match="not written by vfio-manage persist"):
        persist.persist(host.fs, H100)
    assert persist.remove(host.fs).removed == []
    assert host.fs.read_text(persist.INITRAMFS_TOOLS_SCRIPT) == "#!/bin/sh\n# mine\n"


def test_rhel_like_hosts_get_a_dracut_module_and_the_dracut_command(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", os={"id": "rocky", "version_id": "9.4"})
    code, out = cli("persist", "--device", "0a:00.0", f"--host-root={host.fs.root}")
    assert code == 0, out
    assert "dracut -f --regenerate-all" in out and "update-initramfs" not in out
    hook = host.fs.read_text(persist.DRACUT_HOOK) or ""
    assert "0000:0a:00.0" in hook and "0000:18:00.0" not in hook
    assert "vfio_iommu_type1" in (host.fs.read_text(persist.DRACUT_CONF) or "")
    assert persist.inspect(host.fs).boot_modules == ["vfio", "vfio_iommu_type1", "vfio_pci"]
    code, out = cli("persist", "--remove", f"--host-root={host.fs.root}")
    assert (
        code == 0
        and not host.fs.exists(persist.DRACUT_MODULE_DIR)
        and not host.fs.exists(persist.DRACUT_CONF)
    )


def test_hosts_without_an_initramfs_generator_are_refused_with_the_alternative(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("talos")
    code, out = cli("persist", "--all", f"--host-root={host.fs.root}")
    assert code != 0 and "machine configuration" in out


def test_inspect_reads_the_seed_hosts_hand_written_script(build_host) -> None:  # type: ignore[no-untyped-def]
    info = persist.inspect(build_host("h100-vfio").fs)
    assert sorted(info.persisted) == H100 and info.ours == []
    assert info.flavor == "initramfs-tools"


def test_inspect_reads_vfio_pci_ids_from_the_command_line_and_modprobe(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", cmdline="ro intel_iommu=on vfio-pci.ids=10de:2330")
    assert sorted(persist.inspect(host.fs).persisted) == H100
    other = build_host("h100-nvidia-bound")
    other.fs.write_text("/etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2330\n")
    assert persist.inspect(HostFS(other.fs.root)).persisted["0000:0a:00.0"] == "vfio-pci ids=10de:2330"


def _run_early_script(host, text: str, cmdline: str, tmp_path: Path, source: bool = False):  # type: ignore[no-untyped-def]
    """Run the generated boot script with sh against the fixture's sysfs (its absolute paths moved under
    the fixture root; modprobe is a stub that records its arguments)."""
    import subprocess

    root = str(host.fs.root)
    host.fs.write_text("/proc/cmdline", cmdline + "\n")
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "early.sh"
    script.write_text(
        text.replace("/sys/bus/pci/devices/", f"{root}/sys/bus/pci/devices/").replace(
            "/proc/cmdline", f"{root}/proc/cmdline"
        )
    )
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "modprobe").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/modprobe.log\n')
    (stubs / "modprobe").chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin"}
    argv = ["sh", "-c", f". {script}"] if source else ["sh", str(script)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("flavor", ["initramfs-tools", "dracut"])
def test_the_boot_script_sets_driver_override_and_honours_the_skip_word(  # type: ignore[no-untyped-def]
    build_host, tmp_path: Path, flavor: str
) -> None:
    from gpu_operator.node.host import pci

    text = (persist.initramfs_tools_script if flavor == "initramfs-tools" else persist.dracut_hook)(
        [*H100[:4], "0000:ff:00.0"]
    )  # an address that is gone at boot is skipped, not an error
    skipped = build_host("h100-nvidia-bound")
    done = _run_early_script(
        skipped, text, f"ro quiet {persist.SKIP_PARAM}", tmp_path / "a", source=flavor == "dracut"
    )
    assert done.returncode == 0, done.stderr
    assert all(pci.read_function(skipped.fs, a).driver_override is None for a in H100)
    host = build_host("h100-nvidia-bound")
    done = _run_early_script(host, text, "ro quiet intel_iommu=on", tmp_path / "b", source=flavor == "dracut")
    assert done.returncode == 0, done.stderr
    overrides = {a: pci.read_function(host.fs, a).driver_override for a in H100}
    assert overrides == {**dict.fromkeys(H100[:4], "vfio-pci"), **dict.fromkeys(H100[4:], None)}
    assert (tmp_path / "b" / "modprobe.log").read_text() == "-q vfio-pci\n"


def test_the_dracut_module_setup_parses() -> None:
    import subprocess

    done = subprocess.run(
        ["bash", "-n"], input=persist.dracut_setup(), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


def test_persist_all_leaves_out_a_gpu_whose_group_holds_a_nic(build_host) -> None:  # type: ignore[no-untyped-def]
    """Seed 001's 8x H100 with GPU 0000:3b:00.0 in one IOMMU group with an i40e NIC: bind refuses that
    GPU, so persist must not put it on vfio-pci at the next boot either; the other seven are written."""
    others = [a for a in H100 if a != "0000:3b:00.0"]
    devices = [
        {"addresses": others, "vendor": "10de", "device": "2330", "class": "030200", "driver": "nvidia"},
        {
            "address": "0000:3b:00.0",
            "vendor": "10de",
            "device": "2330",
            "class": "030200",
            "driver": "nvidia",
            "iommu_group": 77,
        },
        {
            "address": "0000:3c:00.0",
            "vendor": "8086",
            "device": "1572",
            "class": "020000",
            "driver": "i40e",
            "iommu_group": 77,
        },
    ]
    host = build_host("h100-nvidia-bound", devices=devices, pci_drivers=["vfio-pci", "nvidia", "i40e"])
    root = str(host.fs.root)
    code, out = cli("persist", "--all", f"--host-root={root}")
    assert code == 1, out
    assert "left out 0000:3b:00.0" in out and "0000:3c:00.0" in out and "ACS" in out
    script = host.fs.read_text(persist.INITRAMFS_TOOLS_SCRIPT) or ""
    assert all(a in script for a in others) and "0000:3b:00.0" not in script and "0000:3c:00.0" not in script
    assert "persisted all but 1 GPU(s): 0000:3b:00.0" in out
    # the same refusal as bind's, for the same GPU
    from gpu_operator.node.vfio import manage as vfio

    plans = {p.gpu: p for p in vfio.plan(host.fs, "bind", [], True)}
    assert plans["0000:3b:00.0"].refused and not any(plans[a].refused for a in others)
    # run again: nothing changes, still says which GPU stays out
    code, again = cli("persist", "--all", f"--host-root={root}")
    assert code == 1 and "nothing changed" in again and "left out 0000:3b:00.0" in again


def test_persist_writes_nothing_when_no_gpu_may_move(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", iommu=False)
    code, out = cli("persist", "--all", f"--host-root={host.fs.root}")
    assert code == 1 and "IOMMU is off" in out and "nothing written" in out
    assert host.fs.read_text(persist.INITRAMFS_TOOLS_SCRIPT) is None
