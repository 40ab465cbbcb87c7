"""What the probe DaemonSet publishes about its node: labels and events, computed from a HostReport (pure)."""

from __future__ import annotations

import re
from typing import Protocol

from gpu_operator.node.findings import Finding, Severity, diagnose
from gpu_operator.node.hostfs import HostFS
from gpu_operator.node.probe import HostReport, probe
from gpu_operator.vocabulary import DRIVER_SOURCE, DRIVER_VERSION, PROBE_STATUS, WORKLOAD_CONFIG

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def node_labels(report: HostReport, findings: list[Finding]) -> dict[str, str | None]:
    """Labels to merge-patch onto the Node; None removes a label that no longer applies."""
    version = report.driver.kernel_version
    worst = (
        "error"
        if any(f.severity == Severity.ERROR for f in findings)
        else ("warning" if any(f.severity == Severity.WARNING for f in findings) else "ok")
    )
    return {
        DRIVER_SOURCE: report.driver.source.value,
        DRIVER_VERSION: version if version and _LABEL_VALUE.match(version) else None,
        PROBE_STATUS: worst,
    }


def node_events(findings: list[Finding]) -> list[dict[str, str]]:
    """One Warning event per error or warning finding: the message carries evidence and the fix."""
    out = []
    for f in findings:
        if f.severity == Severity.INFO:
            continue
        evidence = "; ".join(f.evidence[:4])
        message = (
            f"{f.severity.upper()}: {f.summary}."
            + (f" Evidence: {evidence}." if evidence else "")
            + (f" Fix: {f.fix}" if f.fix else "")
        )
        out.append({"reason": f.reason, "type": "Warning", "message": message})
    return out


class NodePublisher(Protocol):
    def node_labels(self) -> dict[str, str]: ...

    def publish(self, labels: dict[str, str | None], events: list[dict[str, str]]) -> None: ...


def publish_once(
    fs: HostFS,
    node: NodePublisher,
    *,
    workload: str | None = None,
    last_codes: set[str] | None = None,
    search_dirs: tuple[str, ...] = (),
) -> tuple[set[str], list[dict[str, str]]]:
    """Probe, judge against the node's workload label, publish; events only when the findings changed.

    Returns the finding codes (to pass back as `last_codes`) and the events of this round.
    """
    report = probe(fs, extra_search_dirs=search_dirs)
    declared = workload or node.node_labels().get(WORKLOAD_CONFIG) or None
    findings = diagnose(report, declared)
    codes = {f.code for f in findings}
    events = node_events(findings)
    node.publish(node_labels(report, findings), events if codes != last_codes else [])
    return codes, events
