"""The whole check: every step in order, each on its own, then one verdict and exit code.

Exit codes: 0 every step ran or was not available here and nothing of ours contradicts NVIDIA's
tools; 1 a step failed or found a defect; 3 no NVIDIA GPU found (neither our probe nor any NVIDIA
tool sees one); 2 is the command line's own (a bad option).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpu_operator.node.gpucheck import agents, nvidia
from gpu_operator.node.gpucheck.overlay import CheckFS
from gpu_operator.node.gpucheck.steps import DEFECT, FAILED, Deps, State, StepResult, run_step

EXIT_OK, EXIT_DEFECTS, EXIT_NO_GPU = 0, 1, 3
# A host tree's status directory: a host path of ours, mapped into the output directory.
TREE_STATUS_PATH = "/run/gpu-check/validations"
STEPS: tuple[tuple[str, Callable[[State], tuple[str, dict[str, Any]]]], ...] = (
    ("nvidia tools", nvidia.tools_step),
    ("probe", agents.probe_step),
    ("nvidia-smi -q -x", nvidia.smi_step),
    ("NVML", nvidia.nvml_step),
    ("probe vs NVIDIA", agents.compare_step),
    ("doctor", agents.doctor_step),
    ("validator: driver", agents.validator_step),
    ("CUDA driver API", nvidia.cuda_step),
    ("node-status exporter", agents.exporter_step),
    ("kernel log", agents.kernel_log_step),
)


@dataclass
class CheckReport:
    host_root: str
    out_dir: str
    started: str
    live: bool
    steps: list[StepResult] = field(default_factory=list)
    verdict: str = ""
    exit_code: int = EXIT_OK
    system: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host_root": self.host_root,
            "out_dir": self.out_dir,
            "started": self.started,
            "live": self.live,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "system": self.system,
            "seconds": round(sum(s.seconds for s in self.steps), 3),
            "steps": [s.as_dict() for s in self.steps],
        }

    def step(self, name: str) -> StepResult:
        return next(s for s in self.steps if s.name == name)


def default_out_dir(now: datetime) -> Path:
    return Path("/tmp") / f"gpu-check-{now.strftime('%Y%m%dT%H%M%SZ')}"


def run_check(
    host_root: str,
    out_dir: Path | None = None,
    *,
    search_dirs: tuple[str, ...] = (),
    deps: Deps | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CheckReport:
    deps = deps or Deps()
    now = datetime.now(UTC)
    out = (out_dir or default_out_dir(now)).resolve()
    root = Path(host_root).resolve()
    live = deps.live if deps.live is not None else root == Path("/")
    status_dir = out / "validations"
    status_dir.mkdir(parents=True, exist_ok=True)
    fs = CheckFS(root, str(status_dir) if root == Path("/") else TREE_STATUS_PATH, status_dir)
    state = State(fs=fs, out_dir=out, search_dirs=search_dirs, deps=deps, live=live)
    report = CheckReport(
        str(root),
        str(out),
        now.isoformat(timespec="seconds"),
        live,
        system={
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "machine": platform.machine(),
        },
    )
    for name, body in STEPS:
        report.steps.append(run_step(name, partial(body, state), clock))
    if fs.refused_writes:
        report.steps.append(
            StepResult(
                "read-only",
                DEFECT,
                0.0,
                "writes outside the status directory were "
                "refused: " + ", ".join(sorted(set(fs.refused_writes))),
                {},
            )
        )
    gpus_seen = bool(state.report and state.report.gpus) or any(
        r is not None and r.gpus for r in (state.smi, state.nvml)
    )
    bad = [s.name for s in report.steps if s.status in (DEFECT, FAILED)]
    if not gpus_seen:
        report.exit_code = EXIT_NO_GPU
        report.verdict = (
            "no NVIDIA GPU found: our probe sees none under /sys/bus/pci/devices"
            + ("" if live else " of the host tree")
            + " and no NVIDIA tool lists one"
        )
    elif bad:
        report.exit_code = EXIT_DEFECTS
        report.verdict = f"{len(bad)} step(s) failed or found a defect: {', '.join(bad)}"
    else:
        report.verdict = (
            "every step ran or was not available here; nothing of ours contradicts NVIDIA's tools"
        )
    return report
