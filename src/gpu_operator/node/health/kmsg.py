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

from gpu_operator.node.health.catalogue import XID_LINE
from gpu_operator.node.hostfs import HostFS, HostPathError
from gpu_operator.node.pci import normalise_bus

KMSG = "/dev/kmsg"
MAX_POLL_BYTES = 1 << 20  # per poll; the rest waits for the next one
MAX_LINE = 4096  # a kmsg record is at most ~1 KiB; a longer "line" in a file is cut


@dataclass(frozen=True)
class XidEvent:
    bus: str  # normalised PCI address (0000:41:00.0)
    xid: int
    line: str  # the message, at most 300 characters
    source: str = "kmsg"


def parse_xid(message: str, source: str = "kmsg") -> XidEvent | None:
    """The Xid event in one kernel-log message, or None."""
    match = XID_LINE.search(message)
    if not match:
        return None
    try:
        return XidEvent(normalise_bus(match.group(1)), int(match.group(2)), message.strip()[:300], source)
    except ValueError:
        return None


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
        return [m for m in map(_message, lines) if m is not None]


def _message(raw: bytes) -> str | None:
    """One record's message (its header stripped); None for an empty or continuation line."""
    record = raw[:MAX_LINE].decode(errors="replace")
    if not record or record.startswith(" "):
        return None
    header, sep, message = record.partition(";")
    return message if sep and "," in header else record


def read_messages(fs: HostFS, path: str = KMSG, limit: int = 4 * MAX_POLL_BYTES) -> list[str] | None:
    """Every message the kernel log holds now, up to about `limit` bytes (a one-off look, as doctor
    takes; a last line without its newline counts); None where it cannot be opened."""
    follower = KmsgFollower(fs, path, from_start=True)
    try:
        if follower.fd is None:
            return None
        out: list[str] = []
        size = 0
        while size < limit and (batch := follower.poll()):
            out += batch
            size += sum(len(m) + 1 for m in batch)
        last = _message(follower.pending)
        return [*out, last] if last is not None else out
    finally:
        follower.close()
