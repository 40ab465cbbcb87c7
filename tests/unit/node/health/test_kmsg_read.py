"""doctor's one-off look at the kernel log (health/kmsg.read_records, the follower the health agent
uses): every record it holds, a record longer than one read kept whole, a last line without its
newline counted, nothing where the log cannot be opened."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.node.health.kmsg import read_records
from gpu_operator.node.host.hostfs import HostFS

XID = "NVRM: Xid (PCI:0000:41:00): 79, pid=0, name=kworker, GPU has fallen off the bus."


def test_every_record_is_read_whole_and_the_last_without_newline_counts(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    long = "usb 1-1: " + "x" * 10_000  # more than one 8 KiB read
    fs.write_text("/dev/kmsg", f"6,1,100,-;{long}\n SUBSYSTEM=usb\n3,2,200,-;{XID}\n4,3,300,-;last words")
    records = read_records(fs)
    assert records is not None
    assert [r.message for r in records] == [long[: 4096 - len("6,1,100,-;")], XID, "last words"]


def test_a_log_that_cannot_be_opened_gives_none(tmp_path: Path) -> None:
    assert read_records(HostFS(tmp_path)) is None
