"""What the probe DaemonSet publishes about its node: labels and events, computed from a HostReport (pure)."""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from gpu_operator.node.doctor.findings import Finding, Severity, diagnose
from gpu_operator.node.doctor.verdict import finding
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.probe import HostReport, probe
from gpu_operator.node.vfio.incluster import parse_passthrough_devices
from gpu_operator.node.vfio.manage import VfioUsageError
from gpu_operator.vocabulary import (
    DRIVER_SOURCE,
    DRIVER_VERSION,
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    PROBE_STATUS,
    WORKLOAD_CONFIG,
)

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


def _product(name: str) -> str:
    """pci.ids names put the marketing name in brackets: "GH100 [H100 SXM5 80GB]" -> "H100 SXM5 80GB"."""
    match = re.search(r"\[([^\]]+)\]", name)
    return (match.group(1) if match else name).strip()


def runtime_facts(report: HostReport) -> dict[str, str]:
    """The host's container runtime as its files show it (node/host/runtime.py): the operator points the
    container toolkit at it (render/distributions.py); empty fields are left out, and a host where
    none of the runtimes we know was found says flavor `none` (the operator then names the node)."""
    rt = report.runtime
    if not rt.name:
        return {"flavor": "none"}
    found = {
        "name": rt.name,
        "flavor": rt.flavor,
        "config": rt.config_path or "",
        "template": rt.template_path or "",
        "socket": rt.socket or "",
    }
    return {k: v for k, v in found.items() if v}


def probe_facts(report: HostReport) -> dict[str, Any]:
    """The facts the operator reads (KubeVirt sync, status, the toolkit's runtime): driver source,
    the container runtime and, per GPU, ID, name and driver."""
    return {
        "driverSource": report.driver.source.value,
        "runtime": runtime_facts(report),
        "gpus": [
            {
                "address": g.address,
                "vendorDevice": g.vendor_device,
                "name": g.name,
                "product": _product(g.name),
                "driver": g.driver or "",
            }
            for g in report.gpus
        ],
    }


def node_annotations(report: HostReport) -> dict[str, str | None]:
    """Annotations to merge-patch onto the Node (compact, stable JSON: an unchanged host patches the same text)."""
    return {PROBE_FACTS_ANNOTATION: json.dumps(probe_facts(report), sort_keys=True, separators=(",", ":"))}


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
    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]: ...

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None: ...


def publish_once(
    fs: HostFS,
    node: NodePublisher,
    *,
    workload: str | None = None,
    default_workload: str | None = None,
    last_codes: set[str] | None = None,
    search_dirs: tuple[str, ...] = (),
) -> tuple[set[str], list[dict[str, str]]]:
    """Probe, judge against the node's workload label, publish; events only when the findings changed.

    The node's workload is `workload` if given, else its label, else the cluster's default
    (`default_workload`: the ClusterPolicy's sandboxWorkloads.defaultWorkload, as the operator
    reads it), and only without any of those inferred from the host.

    Returns the finding codes (to pass back as `last_codes`) and the events of this round.
    """
    report = probe(fs, extra_search_dirs=search_dirs)
    labels, annotations = node.node_metadata()
    declared = workload or labels.get(WORKLOAD_CONFIG) or default_workload or None
    bad_list: list[Finding] = []
    devices = None
    try:
        devices = parse_passthrough_devices(annotations.get(PASSTHROUGH_DEVICES_ANNOTATION, "")) or None
    except VfioUsageError as err:
        bad_list = [
            finding(
                "passthrough-device-unknown",
                Severity.ERROR,
                "the passthrough device list does not parse",
                [str(err)],
            )
        ]
    findings = bad_list + diagnose(report, declared, devices)
    codes = {f.code for f in findings}
    events = node_events(findings)
    node.publish(
        node_labels(report, findings), events if codes != last_codes else [], node_annotations(report)
    )
    return codes, events
