"""Runs `gpu-operator run` as a real child process against the simulated control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.sim.plane.controlplane import free_port
from gpu_operator.sim.plane.images import DEFAULT_IMAGES

PROFILE_ENV = "GPU_OPERATOR_PROFILE"


@dataclass
class OperatorProcess:
    kubeconfig: Path
    namespace: str
    log: Path
    leader_elect: bool = False
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0

    def start(self) -> OperatorProcess:
        self.metrics_port, self.health_port = free_port(), free_port()
        env = {**os.environ, **DEFAULT_IMAGES, **self.env, "OPERATOR_NAMESPACE": self.namespace}
        # GPU_OPERATOR_PROFILE=<file>: run under cProfile (written at a clean SIGTERM exit), to
        # find where the operator spends its time in benchmarks.
        profile = env.get(PROFILE_ENV)
        python = [sys.executable, "-m", "cProfile", "-o", profile] if profile else [sys.executable]
        argv = [
            *python,
            "-m",
            "gpu_operator.cli",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            "--leader-elect" if self.leader_elect else "--no-leader-elect",
            *self.extra_args,
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the operator shuts down cleanly (and releases its lease)."""
        if not self.alive:
            return self.process.returncode if self.process else None
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-work, as in a node crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
