"""The one place node agents run host binaries (nvidia-smi, modprobe), so tests can substitute fixture scripts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_operator.node.host.hostfs import HostFS, HostPathError


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def summary(self) -> str:
        """One line for a status message: what ran and how it ended."""
        cmd = " ".join(self.argv)
        if self.timed_out:
            return f"`{cmd}` did not finish in time"
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
        return f"`{cmd}` exited {self.returncode}" + (f": {tail[0]}" if tail[0] else "")


class CommandRunner(Protocol):
    def run(
        self,
        argv: Sequence[str],
        *,
        root: str | None = "/",
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult: ...


class HostRunner:
    """Runs a command inside the host root (`chroot`), or in this container when root is None.

    With chroot=False (env GPU_OPERATOR_NO_CHROOT=1) the binary is looked up under the host root
    and run directly: for unprivileged `doctor` runs and host-root fixtures, where chroot needs
    privileges the caller does not have.
    """

    def __init__(self, fs: HostFS, *, chroot: bool | None = None) -> None:
        self.fs = fs
        self.chroot = (
            chroot
            if chroot is not None
            else os.environ.get("GPU_OPERATOR_NO_CHROOT", "") not in ("1", "true")
        )

    def _argv(self, argv: Sequence[str], root: str | None) -> list[str]:
        if root is None:
            return list(argv)
        if self.chroot:
            return ["chroot", str(self.fs.resolve(root)), *argv]
        binary = argv[0] if argv[0].startswith("/") else f"/usr/bin/{argv[0]}"
        return [str(self.fs.resolve(f"{root.rstrip('/')}{binary}")), *argv[1:]]

    def run(
        self,
        argv: Sequence[str],
        *,
        root: str | None = "/",
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        try:
            full = self._argv(argv, root)
        except HostPathError as err:
            return CommandResult(tuple(argv), 126, stderr=str(err))
        merged = {**os.environ, **(env or {})}
        try:
            done = subprocess.run(
                full, capture_output=True, text=True, timeout=timeout, env=merged, check=False
            )
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
            return CommandResult(tuple(argv), -1, out, "", timed_out=True)
        except (FileNotFoundError, PermissionError) as err:
            return CommandResult(tuple(argv), 127, stderr=f"{err.strerror}: {err.filename}")
        return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)
