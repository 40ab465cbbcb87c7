"""The processes the simulator starts and how it watches them: a control plane `PlaneComponent` (a
binary with its argv and log, started in a session of its own, stopped, SIGKILLed, started
again), `stop_group` and `terminate` (a real node's daemons), the readiness probes they are
waited on with, and the errors naming the one that failed with the tail of its log."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class ControlPlaneError(RuntimeError):
    """A component failed to start or died; the message names it and points to its log."""


class RealNodeError(RuntimeError):
    """The real node did not come up; the message names the component and its log's tail."""


# Listening ports for the plane's components come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default), not from the kernel's own choice: a
# port the kernel hands out is one its outgoing connections also take as their source port, and
# on a busy machine (thousands of client connections to the simulator's apiserver) one did, between
# our check and the component's bind ("bind: address already in use", a controller-manager that
# never started). A random port below the range collides only with another listener's choice.
LISTEN_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the ephemeral range."""
    for _ in range(200):
        port = random.choice(LISTEN_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError(f"no free port in {LISTEN_PORTS.start}-{LISTEN_PORTS.stop - 1} on 127.0.0.1")


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class PlaneComponent:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            # A session of its own: a Ctrl-C in the terminal goes to pytest, which then stops us
            # in order, instead of killing etcd under a live apiserver.
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {self.process.returncode}; log {self.log}:\n{tail(self.log)}"
            )

    def kill(self) -> None:
        """SIGKILL, as a crashed machine would: no clean shutdown."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        stop_group(proc, timeout)


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process group `proc` leads (started with a session of its own), SIGKILL
    to it after `timeout` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def unix_open(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
    except OSError:
        return False
    return True
