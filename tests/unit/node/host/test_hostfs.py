"""HostFS: chroot-style resolution, and no read or write ever leaves the host root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_operator.node.host.hostfs import HostFS, HostPathError, HostPathEscape, KernelWriter, RecordingWriter


@pytest.fixture
def tree(tmp_path: Path) -> tuple[HostFS, Path]:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=ubuntu\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return HostFS(root), tmp_path


def test_absolute_symlinks_resolve_inside_the_root(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    fs.symlink("/usr/lib/os-release", "/etc/os-release")
    assert fs.read_text("/usr/lib/os-release") == "ID=ubuntu\n"
    assert fs.canonical("/usr/lib/os-release") == "/etc/os-release"


def test_relative_symlinks_like_sysfs_resolve(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    fs.write_text("/sys/devices/pci0000:00/0000:00:01.0/vendor", "0x10de\n")
    fs.symlink("/sys/bus/pci/devices/0000:00:01.0", "../../../devices/pci0000:00/0000:00:01.0")
    assert fs.read_value("/sys/bus/pci/devices/0000:00:01.0/vendor") == "0x10de"


def test_dotdot_above_root_is_refused(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    with pytest.raises(HostPathEscape):
        fs.resolve("/../outside.txt")
    assert fs.read_text("/../outside.txt") is None  # a read refuses quietly and names the path
    assert "climbs above the host root" in fs.refused["/../outside.txt"]
    with pytest.raises(HostPathEscape):
        fs.write_text("/etc/../../outside.txt", "pwned")


def test_symlink_leading_out_is_refused_for_reads_and_writes(tree: tuple[HostFS, Path]) -> None:
    fs, outside = tree
    # A hostile link planted on the host (not made through HostFS).
    (fs.root / "etc" / "evil").symlink_to("../../outside.txt")
    assert fs.read_text("/etc/evil") is None
    assert not fs.exists("/etc/evil") and fs.listdir("/etc/evil") == []
    assert "/etc/evil" in fs.refused
    with pytest.raises(HostPathEscape):
        fs.write_existing("/etc/evil", "pwned")
    with pytest.raises(HostPathEscape):
        fs.write_atomic("/etc/evil", "pwned")
    assert (outside / "outside.txt").read_text() == "secret\n"


def test_a_directory_link_leading_out_is_refused(tree: tuple[HostFS, Path]) -> None:
    fs, outside = tree
    (fs.root / "run").symlink_to("../..")
    with pytest.raises(HostPathEscape):
        fs.write_text("/run/outside.txt", "pwned")
    assert (outside / "outside.txt").read_text() == "secret\n"


def test_creating_an_escaping_symlink_is_refused_and_undone(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    with pytest.raises(HostPathEscape):
        fs.symlink("/etc/link", "../../outside.txt")
    assert not os.path.lexists(fs.root / "etc" / "link")


def test_symlink_loops_end_with_an_error(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    (fs.root / "a").symlink_to("b")
    (fs.root / "b").symlink_to("a")
    with pytest.raises(HostPathError, match="too many levels"):
        fs.resolve("/a")
    assert fs.read_text("/a") is None
    assert "too many levels" in fs.refused["/a"]


def test_absurdly_long_values_are_not_read(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    (fs.root / "etc" / "vendor").write_bytes(b"0x10de" * 100_000)
    assert fs.read_value("/etc/vendor") is None
    assert "longer than" in fs.refused["/etc/vendor"]
    (fs.root / "etc" / "garbage").write_bytes(b"\x00\xff\xfe0x10de\n")
    assert fs.read_value("/etc/garbage") == "\x00\ufffd\ufffd0x10de"


def test_remove_deletes_the_link_not_its_target(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    fs.symlink("/etc/link", "/etc/os-release")
    assert fs.remove("/etc/link") is True
    assert fs.read_text("/etc/os-release") == "ID=ubuntu\n"
    assert fs.remove("/etc/link") is False


def test_kernel_writer_never_creates_files(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    with pytest.raises(OSError, match="driver_override"):
        KernelWriter(fs).write("/sys/bus/pci/devices/x/driver_override", "vfio-pci")
    assert not fs.exists("/sys/bus/pci/devices/x/driver_override")


def test_write_atomic_replaces_content(tree: tuple[HostFS, Path]) -> None:
    fs, _ = tree
    fs.write_atomic("/run/nvidia/validations/driver-ready", "A=1\n")
    fs.write_atomic("/run/nvidia/validations/driver-ready", "A=2\n")
    assert fs.read_text("/run/nvidia/validations/driver-ready") == "A=2\n"
    assert fs.listdir("/run/nvidia/validations") == ["driver-ready"]


def test_recording_writer_only_records() -> None:
    writer = RecordingWriter()
    writer.write("/sys/bus/pci/drivers_probe", "0000:0a:00.0")
    assert writer.writes == [("/sys/bus/pci/drivers_probe", "0000:0a:00.0")]
