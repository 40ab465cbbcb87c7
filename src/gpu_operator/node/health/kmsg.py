"""Follow the host's kernel log from where the agent starts: new Xid events only, never a replay.

On a real host `/dev/kmsg` is a character device: opened non-blocking and positioned with
SEEK_END, each read returns one new record and EAGAIN when there is none; EPIPE means records
were overwritten before we read them (we go on). In a host tree (tests, the simulator) it is a
regular file of records in kmsg's format (`prio,seq,usec,flags;message`, continuation lines start
with a space): the same SEEK_END at start skips what it holds, and each poll reads what was
appended since. A file that did not exist at start, or was replaced (another inode) or truncated
since, is read from its beginning: everything in it is new.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

from gpu_operator.node.host.hostfs import HostFS, HostPathError

KMSG = "/dev/kmsg"
MAX_POLL_BYTES = 1 << 20  # per poll; the rest waits for the next one
MAX_LINE = 4096  # a kmsg record is at most ~1 KiB; a longer "line" in a file is cut


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel-log record: its message and what its header (`prio,seq,usec,flags[,...];`) says.
    `prio` is syslog's facility << 3 | level; the kernel's own printk records have facility 0 (kern),
    while a process writing to /dev/kmsg gets facility user (1) or what it names, never kern.
    A line without a kmsg header (a syslog file's) has no facility (None)."""

    message: str
    facility: int | None = None
    level: int | None = None
    seq: int | None = None


KERN = 0  # syslog facility of the kernel's own records


@dataclass(frozen=True)
class XidEvent:
    bus: str  # normalised PCI address (0000:41:00.0)
    xid: int
    line: str  # the message, at most 300 characters
    source: str = "kmsg"


class KmsgFollower:
    """New kernel-log messages since construction (`poll()`), from `<host root>/dev/kmsg`;
    `from_start`: also the records it holds already (a one-off look, as doctor takes). A character
    device that could not be opened at first (permissions) is opened at its end when it can be."""

    def __init__(self, fs: HostFS, path: str = KMSG, *, from_start: bool = False) -> None:
        self.fs = fs
        self.path = path
        self.fd: int | None = None
        self.inode: tuple[int, int] | None = None
        self.regular = False
        self.pending = b""
        self.error = ""  # why it cannot be read (empty while it can)
        self.opened = False  # whether an open was tried yet
        self._open(at_end=not from_start)

    def _open(self, *, at_end: bool) -> bool:
        try:
            real = self.fs.resolve(self.path)
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
        except (HostPathError, OSError) as err:
            self.error = f"{self.path}: {getattr(err, 'strerror', None) or err}"
            self.opened = True
            return False
        info = os.fstat(fd)
        self.regular = stat.S_ISREG(info.st_mode)
        self.inode = (info.st_dev, info.st_ino)
        # A device opened later than at construction starts at its end too: its ring buffer holds
        # records from before (a file that appears later holds only new ones).
        if at_end or (not self.regular and self.opened):
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_END)
        self.opened = True
        self.fd, self.pending, self.error = fd, b"", ""
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _reopen_if_replaced(self) -> None:
        """A regular file that was replaced or truncated is read again from its start."""
        if self.fd is None:
            self._open(at_end=False)
            return
        if not self.regular:
            return
        try:
            now = os.stat(self.fs.resolve(self.path))
        except (HostPathError, OSError):
            return  # gone for now; keep what is open
        position = os.lseek(self.fd, 0, os.SEEK_CUR)
        if (now.st_dev, now.st_ino) != self.inode or now.st_size < position:
            self.close()
            self._open(at_end=False)

    def poll(self) -> list[str]:
        """The messages added since the last poll (record headers stripped, continuation lines dropped)."""
        return [r.message for r in self.poll_records()]

    def poll_records(self) -> list[KmsgRecord]:
        """The records added since the last poll, headers read (continuation lines dropped)."""
        self._reopen_if_replaced()
        if self.fd is None:
            return []
        data = bytearray()
        while len(data) < MAX_POLL_BYTES:
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten records: the next read goes on
                    continue
                self.error = f"{self.path}: {err.strerror}"
                break
            if not chunk:
                break
            data += chunk
        text = self.pending + bytes(data)
        lines = text.split(b"\n")
        self.pending = lines.pop()[:MAX_LINE]  # an incomplete last line waits for its end
        return [r for r in map(_record, lines) if r is not None]


def _record(raw: bytes) -> KmsgRecord | None:
    """One record (its header read); None for an empty or continuation line. A line whose header
    is not kmsg's (`prio,seq,usec,flags[,...]` with numbers) is all message, of no facility."""
    text = raw[:MAX_LINE].decode(errors="replace")
    if not text or text.startswith(" "):
        return None
    header, sep, message = text.partition(";")
    fields = header.split(",")
    if sep and len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
        prio = int(fields[0])
        return KmsgRecord(message, prio >> 3, prio & 7, int(fields[1]))
    return KmsgRecord(text)


def read_records(fs: HostFS, path: str = KMSG, limit: int = 4 * MAX_POLL_BYTES) -> list[KmsgRecord] | None:
    """Every record the kernel log holds now, up to about `limit` bytes (a one-off look, as doctor
    takes; a last line without its newline counts); None where it cannot be opened."""
    follower = KmsgFollower(fs, path, from_start=True)
    try:
        if follower.fd is None:
            return None
        out: list[KmsgRecord] = []
        size = 0
        while size < limit and (batch := follower.poll_records()):
            out += batch
            size += sum(len(r.message) + 1 for r in batch)
        last = _record(follower.pending)
        return [*out, last] if last is not None else out
    finally:
        follower.close()
