"""The real node's sandbox: a private mount + network namespace that holds its containerd, kubelet
and every container they start, so that nothing they do reaches the machine's own state.

Inside the sandbox (and only there):

* ``/run`` is a fresh tmpfs: containerd's shim sockets and runc state (/run/containerd), the
  pods' network namespaces (/run/netns) and the kubelet's lock files never touch the host's /run;
* the network is its own: ``lo`` carries the node's IP and the apiserver's service IP
  (``SERVICE_IP``); the CNI bridge, its routes and the kubelet's iptables chains live there;
* the four sysctls the kubelet insists on (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
  kernel.panic_on_oops) are shadowed by files with the values it wants, so it never writes the
  machine's own;
* every mount the kubelet makes (projected tokens, emptyDirs) and every mount runc makes for a
  container vanishes with the namespace.

The apiserver listens on the host's 127.0.0.1 only; `nsproxy` (a process of ours) listens on
``SERVICE_IP:443`` inside the sandbox and forwards to it, so the kubelet and the pods' in-cluster
clients (KUBERNETES_SERVICE_HOST is the `kubernetes` Service's ClusterIP) reach it unchanged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVICE_IP = "10.0.0.1"  # first address of the apiserver's --service-cluster-ip-range
NODE_IP = "10.2.0.1"
SHORT_ROOT = "/run/gpu-operator-sim"  # inside the sandbox only (its /run is a tmpfs of its own)
POD_SUBNET = "10.88.0.0/16"
# What the kubelet's container manager requires of these sysctls (it writes them if they differ).
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
}


class SandboxError(RuntimeError):
    """The namespace sandbox could not be set up; the message names the step and the output."""


def _setup_script(base: Path, binds: dict[str, Path]) -> str:
    sysctl_dir = base / "sysctl"
    lines = [
        "set -eu",
        # unshare made every mount private (nothing reaches the host); shared again from here, in
        # peer groups of the sandbox's own, for the operands' Bidirectional mounts.
        "mount --make-rshared /",
        "mount -t tmpfs -o mode=0755,size=256m gpu-operator-sim-run /run",
        "mkdir -p /run/containerd /run/netns /run/lock",
    ]
    for target, source in binds.items():
        lines += [f"mkdir -p {target}", f"mount --bind {source} {target}"]
    for key in KUBELET_SYSCTLS:
        lines.append(f"mount --bind {sysctl_dir / key.replace('/', '.')} /proc/sys/{key}")
    lines += [
        "ip link set lo up",
        f"ip addr add {SERVICE_IP}/32 dev lo",
        f"ip addr add {NODE_IP}/32 dev lo",
        f"touch {base / 'sandbox.ready'}",
        "exec sleep infinity",
    ]
    return "\n".join(lines)


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


@dataclass
class Sandbox:
    """start() creates the namespaces (held by a `sleep` process), enter() prefixes a command
    to run inside them, stop() kills every process left inside."""

    base_dir: Path
    holder: int = 0
    # Directories of ours bound at short paths inside (unix socket paths must stay < 108 bytes).
    binds: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()

    @property
    def log(self) -> Path:
        return self.base_dir / "sandbox.log"

    @property
    def netns_path(self) -> str:
        return f"/proc/{self.holder}/ns/net"

    def start(self, timeout: float = 15.0) -> int:
        if os.geteuid() != 0:
            raise SandboxError("the real node needs root (namespaces, mounts, cgroups)")
        sysctl_dir = self.base_dir / "sysctl"
        sysctl_dir.mkdir(parents=True, exist_ok=True)
        for key, value in KUBELET_SYSCTLS.items():
            (sysctl_dir / key.replace("/", ".")).write_text(value + "\n")
        ready = self.base_dir / "sandbox.ready"
        ready.unlink(missing_ok=True)
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--net",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    _setup_script(self.base_dir, self.binds),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.holder = proc.pid
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SandboxError(
                    f"setting up the node's namespaces failed (exit {proc.returncode}); "
                    f"log {self.log}:\n{self.log.read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.05)
        return proc.pid

    def enter(self) -> list[str]:
        """The argv prefix that runs a command inside the sandbox's mount and network namespaces."""
        return ["nsenter", f"--target={self.holder}", "--mount", "--net", "--"]

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.enter(), *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def members(self) -> list[int]:
        """Pids of every process in the sandbox's mount namespace except the holder."""
        ns = _mnt_ns(self.holder) if self.holder else None
        if ns is None or ns == _mnt_ns(os.getpid()):
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self.holder and _mnt_ns(int(entry.name)) == ns:
                pids.append(int(entry.name))
        return pids

    def stop(self, grace: float = 10.0) -> list[int]:
        """SIGTERM, then SIGKILL, every process inside; then the holder (the namespaces, their
        mounts, the pods' network namespaces and the bridge go with it). Returns the pids seen."""
        seen = self.members()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.members() and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.holder:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.holder, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.holder, 0)
        return seen


def proxy_argv(netns: str, listen: str, target: str) -> list[str]:
    """The command that serves `listen` (HOST:PORT inside netns) by forwarding to `target`."""
    return [sys.executable, "-m", "gpu_operator.sim.realnode.nsproxy", netns, listen, target]
