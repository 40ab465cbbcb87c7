"""`doctor`: one host's findings as a readable report (rich) or JSON."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpu_operator.node.doctor import troubleshoot
from gpu_operator.node.doctor.findings import Finding, Severity, diagnose, has_errors, intended_workload
from gpu_operator.node.doctor.kernellog import kernel_log_findings
from gpu_operator.node.doctor.vmchecks import Advertised, kubevirt_findings
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.probe import HostReport
from gpu_operator.node.host.runner import CommandRunner
from gpu_operator.vocabulary import VM_PASSTHROUGH

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def host_checks(
    fs: HostFS, report: HostReport, cuda: list[tuple[int, int]], runner: CommandRunner | None
) -> list[Finding]:
    """doctor's checks beyond the probe: kernel log, kernel headers, CUDA versions, and MIG through
    read-only nvidia-smi queries (none when `runner` is None)."""
    found = kernel_log_findings(fs) if report.gpus else []
    found += troubleshoot.header_findings(fs, report.kernel, report.driver) if report.gpus else []
    for wanted in cuda:
        found += troubleshoot.cuda_findings(wanted, report.driver)
    if runner is not None and report.gpus:
        found += troubleshoot.mig_findings(runner, report.driver)
    return found


def report_json(report: HostReport, findings: list[Finding]) -> str:
    data: dict[str, Any] = {
        "host_root": report.host_root,
        "ok": not has_errors(findings),
        "findings": [f.model_dump(mode="json") for f in findings],
        "host": report.model_dump(mode="json"),
    }
    return json.dumps(data, indent=2)


def render(report: HostReport, findings: list[Finding], console: Console) -> None:
    gpus = report.gpus
    console.print(Text(f"GPU host report for {report.host_root}", style="bold"))
    # what the host says is printed as text, never read as rich markup (a name like "GA100 [a100]")
    console.print(
        Text(
            f"OS {report.os_id} {report.os_version_id}, kernel {report.kernel or '?'}; "
            f"{len(gpus)} NVIDIA GPU(s); driver source: {report.driver.source}"
            + (f" ({report.driver.flavor})" if report.driver.flavor else "")
            + f"; runtime: {report.runtime.flavor or 'none'}; IOMMU: {'on' if report.iommu.enabled else 'off'}"
        )
    )
    if gpus:
        table = Table("address", "device", "name", "driver", "NUMA", "IOMMU group")
        for g in gpus:
            table.add_row(
                *(
                    Text(str(v))
                    for v in (g.address, g.vendor_device, g.name, g.driver or "-", g.numa_node, g.iommu_group)
                )
            )
        console.print(table)
    for f in findings:
        console.print(
            Text(f"{f.severity.upper():8}", style=_STYLE[f.severity]) + Text(f" [{f.code}] {f.summary}")
        )
        for line in f.evidence:
            console.print(Text(f"           evidence: {line}"))
        if f.fix:
            console.print(Text(f"           fix: {f.fix}"))
    errors = sum(f.severity == Severity.ERROR for f in findings)
    warnings = sum(f.severity == Severity.WARNING for f in findings)
    console.print(
        Text(f"{errors} error(s), {warnings} warning(s)", style="bold red" if errors else "bold green")
    )


def run(
    report: HostReport,
    workload: str | None,
    as_json: bool,
    console: Console,
    *,
    passthrough_devices: list[str] | None = None,
    advertised: list[Advertised] | None = None,
    unchecked: str = "",
    extra: list[Finding] | None = None,
) -> int:
    """Diagnose and print (with the `extra` findings of other checks); on a VM node also compare what
    KubeVirt advertises (`advertised`; None: not known, see `unchecked`)."""
    findings = diagnose(report, workload, passthrough_devices) + (extra or [])
    resolved, _ = intended_workload(report, workload)
    if report.gpus and (passthrough_devices or resolved == VM_PASSTHROUGH):
        findings += kubevirt_findings(report, advertised, unchecked)
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    findings = sorted(findings, key=lambda f: order[f.severity])
    if as_json:
        console.out(report_json(report, findings))
    else:
        render(report, findings, console)
    return 1 if has_errors(findings) else 0
