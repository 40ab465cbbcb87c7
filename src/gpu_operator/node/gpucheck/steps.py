"""The check's steps, each on its own: what it ran, how it ended, how long it took. A step that
raises is reported as failed with the error, and the next step still runs."""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.node.doctor.verdict import Finding
from gpu_operator.node.gpucheck.cudacheck import CudaResult, load_libcuda
from gpu_operator.node.gpucheck.overlay import CheckFS
from gpu_operator.node.gpucheck.reference import RefReport, preload
from gpu_operator.node.gpucheck.tools import NvidiaTools
from gpu_operator.node.host.probe import HostReport
from gpu_operator.node.host.runner import CommandRunner, HostRunner

OK, DEFECT, FAILED, NA = "ok", "defect", "failed", "n/a"


@dataclass
class StepResult:
    name: str
    status: str
    seconds: float
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Unavailable(Exception):
    """The step cannot run here (no such tool, a host tree instead of this machine); not a failure."""


class Defect(Exception):
    """The step ran and found our agent contradicting NVIDIA's tools; details say where."""

    def __init__(self, summary: str, details: dict[str, Any]) -> None:
        super().__init__(summary)
        self.details = details


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as err:
        raise Unavailable(f"nvidia-ml-py is not installed ({err})") from None
    return pynvml


@dataclass
class Deps:
    """What the steps reach outside Python: replaced by stand-ins in tests."""

    runner: Callable[[CheckFS], CommandRunner] = lambda fs: HostRunner(fs, chroot=False)
    nvml: Callable[[], Any] = _load_pynvml
    preload: Callable[[str], None] = preload
    load_cuda: Callable[[str | None], Any] = load_libcuda
    which: Callable[[str], str | None] = shutil.which
    # whether NVIDIA's tools may be asked: None = when the host root is this machine's /
    live: bool | None = None


@dataclass
class State:
    """What the steps learn, for the steps after them and the report."""

    fs: CheckFS
    out_dir: Path
    search_dirs: tuple[str, ...]
    deps: Deps
    live: bool
    tools: NvidiaTools = field(default_factory=NvidiaTools)
    report: HostReport | None = None
    smi: RefReport | None = None
    nvml: RefReport | None = None
    findings: list[Finding] = field(default_factory=list)
    driver_ready: dict[str, str] | None = None
    cuda: CudaResult | None = None


def run_step(
    name: str, body: Callable[[], tuple[str, dict[str, Any]]], clock: Callable[[], float] = time.monotonic
) -> StepResult:
    """`body` returns (summary, details) when all is well; Unavailable, Defect or any other
    exception end the step with that status and the step after it still runs."""
    started = clock()
    try:
        summary, details = body()
        status = OK
    except Unavailable as err:
        status, summary, details = NA, str(err), {}
    except Defect as err:
        status, summary, details = DEFECT, str(err), err.details
    except Exception as err:  # noqa: BLE001 - every failure is the step's result, never the check's end
        status, summary = FAILED, f"{type(err).__name__}: {err}"
        details = {"traceback": traceback.format_exc().splitlines()[-12:]}
    return StepResult(name, status, round(clock() - started, 3), summary, details)
