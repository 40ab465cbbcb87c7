"""The audit log read across rotations, done the way the apiserver's log library does them: the
full audit.log renamed to audit-<time>.log (same inode), then a new audit.log started."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.sim.plane.auditlog import AuditReader, audit_files


class Apiserver:
    """Appends lines to audit.log and rotates it by rename, as the apiserver does at 100 MB."""

    def __init__(self, directory: Path) -> None:
        self.log = directory / "audit.log"
        self.rotations = 0

    def write(self, *lines: str, end: str = "\n") -> None:
        with self.log.open("a") as f:
            f.write("\n".join(lines) + end)

    def rotate(self) -> None:
        self.rotations += 1
        self.log.rename(self.log.with_name(f"audit-2026-11-26T07-0{self.rotations}-00.000.log"))
        self.log.touch()


def test_a_reader_from_now_reads_what_was_written_before_and_after_rotations(tmp_path: Path) -> None:
    api = Apiserver(tmp_path)
    api.write("old-1", "old-2")
    reader = AuditReader.from_now(api.log)
    api.write("a")
    api.rotate()
    api.write("b", "c")
    api.rotate()
    api.rotate()  # a rotation with nothing written in between
    api.write("d")
    assert reader.read() == [b"a", b"b", b"c", b"d"]
    assert reader.read() == []
    api.write("e")
    api.rotate()
    assert reader.read() == [b"e"]  # ours was rotated after the last read: its rest, then the new file
    assert len(audit_files(api.log)) == 5 and audit_files(api.log)[-1] == api.log


def test_a_line_written_in_two_parts_is_read_once_whole(tmp_path: Path) -> None:
    api = Apiserver(tmp_path)
    api.log.touch()
    reader = AuditReader.from_now(api.log)
    api.write('{"verb": "pa', end="")
    assert reader.read() == []
    api.write('tch"}', "next")
    assert reader.read() == [b'{"verb": "patch"}', b"next"]


def test_a_reader_from_the_start_reads_every_file_oldest_first(tmp_path: Path) -> None:
    api = Apiserver(tmp_path)
    reader = AuditReader(api.log)
    assert reader.read() == []  # nothing written yet: no file
    api.write("1")
    api.rotate()
    api.write("2")
    assert AuditReader(api.log).read() == [b"1", b"2"]
    assert reader.read() == [b"1", b"2"]
