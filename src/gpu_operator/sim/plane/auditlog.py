"""The simulator apiserver's audit log, read across its rotations.

The apiserver rotates its audit log at 100 MB (`--audit-log-maxsize` 0 means its log library's
default): audit.log is renamed to audit-<time>.log and a new audit.log is started. A reader that
kept a byte offset into "audit.log" would, after a rotation, seek past the end of the new file
and read nothing: what was written in between would be silently skipped, and a check like "no
403 from our pods" or "no write while idle" would pass without having read it. An `AuditReader`
keeps its place by inode (a rename keeps it) and walks on to the next file when its own was
rotated, so it reads every line once, in order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def audit_files(log: Path) -> list[Path]:
    """The rotated files, oldest first (their names carry the rotation time), then `log`."""
    rotated = sorted(log.parent.glob(f"{log.stem}-*{log.suffix}"))
    return [*rotated, log] if log.exists() else rotated


class AuditReader:
    """Complete lines appended since the last read (from the first line ever written, or from the
    moment of `from_now`), streamed file by file: the place is kept just past the last complete
    line, so an unfinished line is read whole next time."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.inode: int | None = None  # the file this reader is in, whatever its name now
        self.offset = 0

    @classmethod
    def from_now(cls, log: Path) -> AuditReader:
        reader = cls(log)
        try:
            st = log.stat()
        except FileNotFoundError:
            return reader
        reader.inode, reader.offset = st.st_ino, st.st_size
        return reader

    def read(self) -> list[bytes]:
        return list(self.lines())

    def lines(self) -> Iterator[bytes]:
        while True:
            try:
                paths = audit_files(self.log)
                inodes = [p.stat().st_ino for p in paths]
            except FileNotFoundError:  # renamed between the listing and the stat: list again
                continue
            if not paths:
                return
            if self.inode not in inodes:  # first read, or our file is gone: the oldest there is
                self.inode, self.offset = inodes[0], 0
            i = inodes.index(self.inode)
            yield from self._rest(paths[i])
            if i + 1 < len(inodes):  # ours was rotated: the next file from its start
                self.inode, self.offset = inodes[i + 1], 0
                continue
            try:
                if self.log.stat().st_ino == self.inode:
                    return
            except FileNotFoundError:  # no current file (not started, or mid-rotation): next read
                return
            # rotated while we read it: the next listing puts it in its place, and the rest follows

    def _rest(self, path: Path) -> Iterator[bytes]:
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return
        with f:
            if os.fstat(f.fileno()).st_ino != self.inode:
                return  # renamed under us: the next listing finds it by inode
            f.seek(self.offset)
            for line in f:
                if not line.endswith(b"\n"):
                    return  # unfinished: read whole next time
                self.offset += len(line)
                if line.strip():
                    yield line.rstrip(b"\n")
