"""The operators the scale benchmark measures: ours (`gpu-operator run`, as its own ServiceAccount)
or a peer started from a command line (`--peer-cmd`), both with the same kubeconfig, namespace
and readiness check, so that the audit log, /proc and /readyz read them the same way."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lightkube import Client
from lightkube.codecs import load_all_yaml

from gpu_operator.sim.commands import session
from gpu_operator.sim.commands.state import Proc
from gpu_operator.sim.plane.binaries import Binaries
from gpu_operator.sim.plane.controlplane import ControlPlane, free_port
from gpu_operator.sim.plane.images import DEFAULT_IMAGES
from gpu_operator.sim.plane.operator_process import PROFILE_ENV, OperatorProcess


@dataclass
class Subject:
    name: str
    process: subprocess.Popen[bytes]
    health_port: int
    metrics_port: int | None  # ours: gpu_operator_api_write_requests_total is read from it
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float) -> None:
        session.wait_operator_ready(self.health_port, Proc.of(self.name, self.pid, self.log), timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


def start_ours(
    plane: ControlPlane, concurrency: int, profile: Path | None, leader_elect: bool = False
) -> Subject:
    env = {PROFILE_ENV: str(profile)} if profile else {}
    operator = OperatorProcess(
        kubeconfig=session.operator_kubeconfig(plane),
        namespace=session.OPERATOR_NAMESPACE,
        log=plane.workdir / "logs" / "operator.log",
        leader_elect=leader_elect,
        extra_args=[f"--label-concurrency={concurrency}"],
        env=env,
    ).start()
    assert operator.process is not None
    return Subject("ours", operator.process, operator.health_port, operator.metrics_port, operator.log)


def start_peer(plane: ControlPlane, command: str, our_metrics: bool = False) -> Subject:
    """`command` with {kubeconfig}, {namespace}, {metrics_port}, {health_port} filled in; run
    without a shell (so /proc reads the operator itself), OPERATOR_NAMESPACE in its environment.
    `our_metrics`: the peer serves our metrics on {metrics_port} (an earlier revision of ours), so
    they are read as for ours."""
    metrics_port, health_port = free_port(), free_port()
    values = {
        "kubeconfig": str(session.operator_kubeconfig(plane)),
        "namespace": session.OPERATOR_NAMESPACE,
        "metrics_port": str(metrics_port),
        "health_port": str(health_port),
    }
    argv = [part.format(**values) for part in shlex.split(command)]
    log = plane.workdir / "logs" / "peer.log"
    # The operand images from the environment, as the chart passes them to either operator.
    env = {**os.environ, **DEFAULT_IMAGES, "OPERATOR_NAMESPACE": session.OPERATOR_NAMESPACE}
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return Subject("peer", process, health_port, metrics_port if our_metrics else None, log)


def apply_peer_crds(sync: Client, directories: Path | list[Path]) -> None:
    """The peer's own CRDs (its chart's crds/ directories: its own, its NFD subchart's), in place of ours."""
    for directory in directories if isinstance(directories, list) else [directories]:
        for path in sorted(directory.glob("*.yaml")):
            for obj in load_all_yaml(path.read_text()):
                sync.apply(obj, force=True)


T = TypeVar("T")


def on_fresh_plane(
    prefix: str,
    found: Binaries,
    run: Callable[[ControlPlane], Coroutine[Any, Any, T]],
    say: Callable[[str], None],
    *,
    keep: bool = False,
    **options: Any,
) -> T:
    """`run` on a control plane of its own (`options` for ControlPlane), stopped afterwards; its
    working directory removed unless `keep` (or the run failed: its logs say why)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    plane = ControlPlane(workdir, found, progress=lambda m: say(f"control plane: {m}"), **options)
    plane.start()
    failed = True
    try:
        result = asyncio.run(run(plane))
        failed = False
        return result
    finally:
        plane.stop()
        if keep or failed:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
