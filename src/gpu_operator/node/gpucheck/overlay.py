"""A host root the check reads everywhere and writes nowhere, except one status directory of its own.

The validator writes its status files through the host root (<root>/<OUTPUT_DIR>). The check
points OUTPUT_DIR at a host path of its own and maps that path to a real directory it chose (under
/tmp or its output directory): on a real host (root /) the two are the same place; on a host tree
(a fixture) nothing is written into the tree. Every other write is refused with PermissionError,
so no code path of an agent the check runs can change the host.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_operator.node.host.hostfs import HostFS, HostPathError


class CheckFS(HostFS):
    def __init__(self, root: str | os.PathLike[str], status_path: str, status_dir: Path) -> None:
        super().__init__(root)
        self.status_path = "/" + status_path.strip("/")
        self.status_dir = Path(status_dir)
        self.refused_writes: list[str] = []

    def _status_rest(self, path: str) -> list[str] | None:
        parts = [p for p in path.split("/") if p and p != "."]
        prefix = [p for p in self.status_path.split("/") if p]
        if parts[: len(prefix)] != prefix:
            return None
        rest = parts[len(prefix) :]
        if ".." in rest:
            raise HostPathError(f"host path {path!r} climbs out of the check's status directory")
        return rest

    def resolve(self, path: str, *, follow_last: bool = True) -> Path:
        rest = self._status_rest(path)
        if rest is not None:
            return self.status_dir.joinpath(*rest)
        return super().resolve(path, follow_last=follow_last)

    def _writable(self, path: str) -> None:
        if self._status_rest(path) is None:
            self.refused_writes.append(path)
            raise PermissionError(
                f"gpu-check is read-only on the host: refused to write {path} "
                f"(it writes only under {self.status_path})"
            )

    def write_existing(self, path: str, value: str) -> None:
        self._writable(path)
        super().write_existing(path, value)

    def write_text(self, path: str, text: str) -> None:
        self._writable(path)
        super().write_text(path, text)

    def write_atomic(self, path: str, text: str) -> None:
        self._writable(path)
        super().write_atomic(path, text)

    def mkdir(self, path: str) -> None:
        self._writable(path)
        super().mkdir(path)

    def remove(self, path: str) -> bool:
        self._writable(path)
        return super().remove(path)

    def symlink(self, path: str, target: str) -> None:
        self._writable(path)
        super().symlink(path, target)
