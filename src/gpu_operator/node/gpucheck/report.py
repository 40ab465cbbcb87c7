"""The check's report: tables on the terminal (rich), the whole of it as JSON in the output directory."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpu_operator.node.gpucheck.check import CheckReport
from gpu_operator.node.gpucheck.compare import DEFECTS
from gpu_operator.node.gpucheck.steps import DEFECT, FAILED, NA, OK

_STATUS_STYLE = {OK: "green", DEFECT: "bold red", FAILED: "bold red", NA: "dim"}
REPORT_FILE = "report.json"


def write_json(report: CheckReport) -> Path:
    path = Path(report.out_dir) / REPORT_FILE
    path.write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    return path


def render(report: CheckReport, console: Console) -> None:
    # what the host and the tools say is printed as text, never read as rich markup
    console.print(
        Text(
            f"gpu-check of host root {report.host_root} ({'this machine' if report.live else 'a host tree'}), "
            f"{report.started}; kernel {report.system.get('kernel', '?')}, "
            f"Python {report.system.get('python', '?')}",
            style="bold",
        )
    )
    steps = Table("step", "status", "seconds", "result", title="steps")
    for s in report.steps:
        steps.add_row(
            Text(s.name),
            Text(s.status, style=_STATUS_STYLE.get(s.status, "")),
            f"{s.seconds:.2f}",
            Text(s.summary),
        )
    console.print(steps)
    rows = next((s.details.get("rows") for s in report.steps if s.details.get("rows")), None)
    if rows:
        table = Table("fact", "our agents", "nvidia-smi", "NVML", "verdict", title="probe vs NVIDIA's tools")
        for r in rows:
            style = "bold red" if r["verdict"] in DEFECTS else "green" if r["verdict"] == "match" else "dim"
            table.add_row(
                *(Text(str(r[k])) for k in ("fact", "ours", "nvidia_smi", "nvml")),
                Text(r["verdict"], style=style),
            )
        console.print(table)
    findings = next((s.details.get("findings") for s in report.steps if s.name == "doctor"), None)
    if findings:
        table = Table("severity", "code", "summary", "NVIDIA's tools say otherwise", title="doctor")
        for f in findings:
            table.add_row(
                Text(f["severity"]),
                Text(f["code"]),
                Text(f["summary"]),
                Text(f.get("contradicted_by_nvidia") or "", style="bold red"),
            )
        console.print(table)
    console.print(
        Text(
            f"{report.verdict} (exit {report.exit_code}); report: {Path(report.out_dir) / REPORT_FILE}",
            style="bold red" if report.exit_code else "bold green",
        )
    )
