"""The host root: chroot-style path resolution that never reads or writes outside it, and the sysfs write seam."""

from __future__ import annotations

import os
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Linux gives up after 40 symlink hops (ELOOP); so do we.
_MAX_SYMLINK_HOPS = 40
# A sysfs or procfs attribute is at most a page; anything far longer is not a kernel value.
MAX_VALUE_BYTES = 64 << 10
# Whole files we parse (os-release, pci.ids, runtime configs) stay well under this.
MAX_TEXT_BYTES = 16 << 20


class HostPathError(OSError):
    """A host path could not be resolved (symlink loop, bad characters)."""


class HostPathEscape(HostPathError):
    """A host path, or a symlink on the way, leads outside the host root."""


class HostFS:
    """Files of one host, seen through its root directory (`/host` in a pod, a fixture in tests).

    Paths are host paths (`/sys/bus/pci/devices`). Symlinks are followed the way a process
    chrooted into the root would see them: absolute targets start again at the root. Any `..`
    that would climb above the root is refused, so neither a caller nor a hostile symlink on
    the host can make us touch a file outside it.

    Reads never raise for what the host holds: a path that leads outside the root, loops, or
    holds a value longer than any kernel value reads as absent, and is remembered in `refused`
    (host path -> reason) so the agents can name it. Writes raise instead.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.refused: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"HostFS({str(self.root)!r})"

    # -- resolution -----------------------------------------------------------------------

    def resolve(self, path: str, *, follow_last: bool = True) -> Path:
        """The real path under the root for a host path; raises HostPathEscape on escapes."""
        if "\0" in path:
            raise HostPathError(f"host path {path!r} contains a NUL byte")
        parts = deque(p for p in path.split("/") if p and p != ".")
        current: list[str] = []
        hops = 0
        while parts:
            name = parts.popleft()
            if name == "..":
                if not current:
                    raise HostPathEscape(f"host path {path!r} climbs above the host root {self.root}")
                current.pop()
                continue
            candidate = self.root.joinpath(*current, name)
            # `current` holds only real directories, so lstat here never follows a link itself.
            if (parts or follow_last) and candidate.is_symlink():
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise HostPathError(f"host path {path!r}: too many levels of symbolic links")
                try:
                    target = os.readlink(candidate)
                except (FileNotFoundError, NotADirectoryError):  # removed since the check above
                    current.append(name)
                    continue
                if target.startswith("/"):
                    current = []
                parts.extendleft(reversed([p for p in target.split("/") if p and p != "."]))
                continue
            current.append(name)
        return self.root.joinpath(*current)

    def host_path(self, real: Path) -> str:
        """The host path of a real path under the root."""
        rel = real.relative_to(self.root)
        return "/" + rel.as_posix() if rel.parts else "/"

    def canonical(self, path: str) -> str:
        """The host path with every symlink resolved (like `realpath` inside the host)."""
        return self.host_path(self.resolve(path))

    # -- reads ------------------------------------------------------------------------------

    def _readable(self, path: str, *, follow_last: bool = True) -> Path | None:
        """The real path to read, or None (remembered in `refused`) when the host's links make it unsafe."""
        try:
            return self.resolve(path, follow_last=follow_last)
        except HostPathError as err:
            self.refused[path] = str(err)
            return None

    def exists(self, path: str) -> bool:
        real = self._readable(path)
        return real is not None and real.exists()

    def is_file(self, path: str) -> bool:
        real = self._readable(path)
        return real is not None and real.is_file()

    def is_dir(self, path: str) -> bool:
        real = self._readable(path)
        return real is not None and real.is_dir()

    def is_symlink(self, path: str) -> bool:
        real = self._readable(path, follow_last=False)
        return real is not None and real.is_symlink()

    def is_executable(self, path: str) -> bool:
        real = self._readable(path)
        return real is not None and real.is_file() and os.access(real, os.X_OK)

    def read_text(self, path: str, default: str | None = None, *, limit: int = MAX_TEXT_BYTES) -> str | None:
        """The file's text, or `default` when it does not exist, cannot be read, or is longer
        than `limit` bytes (then it is named in `refused`). Undecodable bytes are replaced."""
        data = self.read_bytes(path, limit=limit)
        return default if data is None else data.decode(errors="replace")

    def read_bytes(self, path: str, *, limit: int = MAX_VALUE_BYTES) -> bytes | None:
        """A file's bytes (a PCI device's `config`), or None when absent, unreadable or longer than
        `limit` (then it is named in `refused`)."""
        real = self._readable(path)
        if real is None:
            return None
        try:
            with real.open("rb") as handle:
                data = handle.read(limit + 1)
        except OSError:  # absent, a directory, unreadable, gone since
            return None
        if len(data) > limit:
            self.refused[path] = f"longer than {limit} bytes: not read"
            return None
        return data

    def read_value(self, path: str) -> str | None:
        """A one-line sysfs/procfs attribute, stripped; None when absent (or absurdly long)."""
        text = self.read_text(path, limit=MAX_VALUE_BYTES)
        return None if text is None else text.strip()

    def listdir(self, path: str) -> list[str]:
        """Sorted entry names; empty when the directory does not exist."""
        real = self._readable(path)
        if real is None:
            return []
        try:
            return sorted(os.listdir(real))
        except OSError:
            return []

    def readlink(self, path: str) -> str | None:
        """The raw target of a symlink (not resolved), or None when it is not a symlink."""
        real = self._readable(path, follow_last=False)
        if real is None or not real.is_symlink():
            return None
        try:
            return os.readlink(real)
        except OSError:  # gone since
            return None

    def link_name(self, path: str) -> str | None:
        """The last component of where a symlink points (`driver` -> `vfio-pci`), or None."""
        target = self.readlink(path)
        return target.rstrip("/").rsplit("/", 1)[-1] if target else None

    # -- writes (every one resolved and checked) -------------------------------------------

    def write_existing(self, path: str, value: str) -> None:
        """Write to an existing file without creating or truncating it: how sysfs attributes are written."""
        real = self.resolve(path)
        fd = os.open(real, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def write_text(self, path: str, text: str) -> None:
        real = self.resolve(path)
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text(text)

    def write_atomic(self, path: str, text: str) -> None:
        """Write a file so that readers see the old content or the new one, never a part."""
        real = self.resolve(path)
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, real)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def mkdir(self, path: str) -> None:
        self.resolve(path).mkdir(parents=True, exist_ok=True)

    def remove(self, path: str) -> bool:
        """Remove a file or symlink (not what it points to); False when it was absent."""
        real = self.resolve(path, follow_last=False)
        try:
            real.unlink()
        except FileNotFoundError:
            return False
        return True

    def symlink(self, path: str, target: str) -> None:
        """Create (or replace) a symlink at `path` whose raw target is `target`."""
        real = self.resolve(path, follow_last=False)
        real.parent.mkdir(parents=True, exist_ok=True)
        if real.is_symlink() or real.exists():
            real.unlink()
        real.symlink_to(target)
        # Refuse a link that would lead out of the root, so later readers never meet one of ours.
        try:
            self.resolve(path)
        except HostPathEscape:
            real.unlink()
            raise


class SysfsWriter(Protocol):
    """The one seam for writes that ask the kernel to do something (driver_override, bind, unbind)."""

    def write(self, path: str, value: str) -> None: ...


class KernelWriter:
    """Writes sysfs attributes of the real host: the kernel gives the write its meaning."""

    def __init__(self, fs: HostFS) -> None:
        self.fs = fs

    def write(self, path: str, value: str) -> None:
        try:
            self.fs.write_existing(path, value)
        except OSError as err:
            raise OSError(err.errno, f"writing {value.strip()!r} to {path}: {err.strerror}") from err


@dataclass
class RecordingWriter:
    """Remembers writes instead of making them (`--dry-run`)."""

    writes: list[tuple[str, str]] = field(default_factory=list)

    def write(self, path: str, value: str) -> None:
        self.writes.append((path, value))
