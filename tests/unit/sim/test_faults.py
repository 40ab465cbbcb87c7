"""GPU faults on a host tree (`sim/hardware/faults.py`): the driver's Xid record in the kernel log as our
kernel-log reader parses it, a GPU off the bus gone from sysfs, procfs and /dev and back (byte for
byte) after --clear, which starts a new boot; the changes journal; bad input named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_operator.node.doctor.kernellog import kernel_log_findings
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import devnodes, faults, hosttree
from gpu_operator.sim.realnode.toolkit import gpus


@pytest.fixture
def spec() -> dict:  # type: ignore[type-arg]
    return faults.node_host_spec("dgx-h100")


@pytest.fixture
def node(tmp_path: Path, spec: dict) -> faults.HostFaults:  # type: ignore[type-arg]
    return faults.NodeHosts(tmp_path / "hosts").faults("gpu-node-0", spec)


def tree_listing(root: Path) -> dict[str, str]:
    """Every path of a tree with its link target or file content (what a reader can see)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base) / name
            rel = str(path.relative_to(root))
            node = devnodes.char_device(path) if not path.is_symlink() else None
            out[rel] = (
                f"-> {os.readlink(path)}"
                if path.is_symlink()
                else f"char {node}"
                if node
                else "dir"
                if path.is_dir()
                else path.read_bytes().decode(errors="replace")
            )
    return out


def test_an_operator_driver_node_has_the_driver_loaded_a_kernel_log_and_a_boot_id(
    node: faults.HostFaults,
) -> None:
    found = gpus(node.root)
    assert len(found) == 8 and [g.minor for g in found] == list(range(8))
    assert node.fs.read_text(faults.KMSG) == ""
    assert len(faults.boot_id(node.fs)) == 36


def test_a_tree_made_while_no_validator_ran_carries_no_status_file(node: faults.HostFaults) -> None:
    """Born as the host is before any validator pod: /run/nvidia/validations holds only what one wrote."""
    from gpu_operator.vocabulary import VALIDATIONS_DIR

    assert not node.fs.exists(VALIDATIONS_DIR) or node.fs.listdir(VALIDATIONS_DIR) == []
    faults.validator_wrote(node.fs, when=1000.0)
    for name in faults.VALIDATED:
        assert node.fs.resolve(f"{VALIDATIONS_DIR}/{name}-ready").stat().st_mtime == 1000.0
    faults.validator_wrote(node.fs, when=2000.0)  # a file already there keeps its time
    assert node.fs.resolve(f"{VALIDATIONS_DIR}/driver-ready").stat().st_mtime == 1000.0


def test_xid_is_the_drivers_record_and_our_reader_finds_it(node: faults.HostFaults) -> None:
    gpu = node.xid(48, 1)
    node.xid(79, 1)
    assert gpu.address == gpus(node.root)[1].address
    lines = node.fs.read_text(faults.KMSG).splitlines()  # type: ignore[union-attr]
    assert [line.split(",")[:2] for line in lines] == [["3", "0"], ["3", "1"]]
    assert lines[1].split(";", 1)[1] == (
        f"NVRM: Xid (PCI:{gpu.address[:-2]}): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus."
    )
    codes = {f.code: f for f in kernel_log_findings(HostFS(node.root))}
    assert {"xid-48", "xid-79"} <= set(codes)
    assert codes["xid-79"].severity.name == "ERROR"


def test_gone_removes_the_card_and_clear_restores_it_as_it_was(
    tmp_path: Path,
    spec: dict,  # type: ignore[type-arg]
    node: faults.HostFaults,
) -> None:
    pristine = tmp_path / "pristine"
    hosttree.build(spec, pristine)
    before_boot = faults.boot_id(node.fs)
    gpu = node.gone(2)
    fs = node.fs
    assert not fs.exists(f"/sys/bus/pci/devices/{gpu.address}")
    assert not fs.exists(f"/proc/driver/nvidia/gpus/{gpu.address}")
    assert not fs.exists(f"/dev/nvidia{gpu.minor}")
    assert not fs.is_symlink(f"/sys/bus/pci/drivers/nvidia/{gpu.address}")
    assert [g.address for g in gpus(node.root)] == [g.address for g in node.book().gpus if g.index != 2]
    # the other GPUs and the bridge above the lost card stay
    assert fs.exists(f"/sys/bus/pci/devices/{gpus(node.root)[2].address}")
    assert {f.code for f in kernel_log_findings(HostFS(node.root))} >= {"xid-79", "gpu-off-bus"}
    # an index still names the same GPU while another is gone
    assert node.xid(48, 3).address == node.book().gpus[3].address
    with pytest.raises(faults.FaultError, match=r"--gone: GPU 2 .* already off the bus: --clear"):
        node.gone(2)

    book = node.clear()
    assert book.gone == {} and book.xids == [] and book.boots == 1
    assert fs.read_text(faults.KMSG) == ""
    assert faults.boot_id(fs) != before_boot
    restored, original = tree_listing(node.root), tree_listing(pristine)
    boot = ("proc/sys/kernel/random/boot_id", "proc/stat")  # a new boot: its id and its time (btime)
    assert {k: v for k, v in restored.items() if k not in boot} == {
        k: v for k, v in original.items() if k not in boot
    }
    assert restored["proc/stat"].startswith("btime ")
    assert restored[f"dev/nvidia{gpu.minor}"] == f"char {(195, gpu.minor)}"


def test_bad_gpu_and_xid_are_named_with_the_fix(node: faults.HostFaults, tmp_path: Path) -> None:
    with pytest.raises(
        faults.FaultError, match=r"--gpu 8: this host has 8 GPU\(s\): give an index from 0 to 7"
    ):
        node.xid(79, 8)
    for raw in ("abc", "0", "-3", "79.5", "4096"):
        with pytest.raises(faults.FaultError, match=r"--xid .*whole number from 1 to 1023, e.g. --xid 79"):
            faults.parse_xid(raw)
    assert faults.parse_xid(" 79 ") == 79
    cpu = faults.HostFaults(tmp_path / "cpu", tmp_path / "cpu-book")
    hosttree.build(faults.node_host_spec("cpu"), cpu.root)
    with pytest.raises(faults.FaultError, match="no GPU on NVIDIA's driver"):
        cpu.xid(79)


def test_the_journal_reports_each_announced_node_once_per_poll(tmp_path: Path) -> None:
    hosts = faults.NodeHosts(tmp_path / "hosts")
    hosts.announce("before")  # announced before the follower started: in the trees already
    follower = faults.ChangeFollower(hosts.base)
    assert follower.poll() == []
    hosts.announce("a")
    hosts.announce("b")
    hosts.announce("a")
    assert follower.poll() == ["a", "b"]
    assert follower.poll() == []
    with (hosts.base / faults.CHANGES).open("a") as out:
        out.write("half")  # a line still being written waits
    assert follower.poll() == []
    with (hosts.base / faults.CHANGES).open("a") as out:
        out.write("-written\n")
    assert follower.poll() == ["half-written"]


def test_a_reset_forgets_one_gpus_xids_keeps_the_boot_and_cannot_reach_a_gone_gpu(
    node: faults.HostFaults,
) -> None:
    boot = faults.boot_id(node.fs)
    first, second = node.xid(48, 1), node.xid(48, 2)
    gone = node.gone(3)
    node.reset(first.address)
    book = node.book()
    assert [x["gpu"] for x in book.xids] == [second.index, gone.index] and gone.address in book.gone
    assert faults.boot_id(node.fs) == boot and book.boots == 0
    with pytest.raises(faults.FaultError, match="off the bus"):
        node.reset(gone.address)
    with pytest.raises(faults.FaultError, match="not a GPU of this host"):
        node.reset("0000:ff:00.0")
    node.fs.write_text("/var/run/reboot-required", "")
    node.clear()  # a reboot empties /run: kured's sentinel goes
    assert not node.fs.exists("/var/run/reboot-required")
