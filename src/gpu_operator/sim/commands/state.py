"""The detached simulator's state file (pids, ports, kubeconfig) and stopping what it records."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


def default_dir() -> Path:
    return (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-operator" / "sim" / "current"
    )


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat): with the
    pid it identifies a process, so a recycled pid is never signalled."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited; only its parent's wait() is missing
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    started: int  # start_time(pid) when recorded
    log: str = ""

    @classmethod
    def of(cls, name: str, pid: int, log: Path | str = "") -> Proc:
        return cls(name, pid, start_time(pid) or 0, str(log))

    @property
    def alive(self) -> bool:
        return start_time(self.pid) == self.started

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM its process group (each component leads its own session), then SIGKILL after
        `timeout`. True if it was running."""
        if not self.alive:
            return False
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(self.pid) == self.pid:
                    os.killpg(self.pid, sig)
                else:
                    os.kill(self.pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not self.alive:
                    return True
                time.sleep(0.1)
        return True


@dataclass
class SimState:
    """What `sim up` started, so that `sim status` and `sim down` can find it from another shell."""

    dir: str
    server: str
    kubeconfig: str
    binaries: str
    processes: list[Proc] = field(default_factory=list)  # in start order
    shapes: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    operator_namespace: str = ""
    metrics_port: int = 0
    # The real node, if any: {"name", "dir", "holder" (its namespace sandbox's pid), "shape"}.
    real_node: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    kubernetes: str = "current"  # binaries.KUBERNETES: the current Kubernetes or the floor
    nfd: bool = False  # the stand-ins also play NFD's master (`sim up --nfd`)
    # The OCI registry (`sim up --registry`): {"host", "user", "password_file", "ca", "auth_file"}.
    registry: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.dir) / STATE_FILE

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.path)

    @classmethod
    def load(cls, directory: Path) -> SimState | None:
        path = directory / STATE_FILE
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError) as err:
            raise RuntimeError(f"{path} is not a simulator state file ({err}): remove it by hand") from err
        raw["processes"] = [Proc(**p) for p in raw.get("processes", [])]
        return cls(**raw)

    def proc(self, name: str) -> Proc | None:
        return next((p for p in self.processes if p.name == name), None)

    def add(self, proc: Proc) -> None:
        self.processes = [p for p in self.processes if p.name != proc.name] + [proc]

    def alive(self) -> list[Proc]:
        return [p for p in self.processes if p.alive]

    def stop(self, names: list[str] | None = None) -> list[str]:
        """Stop recorded processes in reverse start order (operator first, etcd last)."""
        stopped = []
        for proc in reversed(self.processes):
            if (names is None or proc.name in names) and proc.stop():
                stopped.append(proc.name)
        return stopped
