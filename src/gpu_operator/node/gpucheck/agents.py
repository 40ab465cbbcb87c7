"""The steps that run our own node agents, read-only: the probe (compared with NVIDIA's tools), doctor,
the validator's driver check (its status directory the check's own), one scrape of the node-status
exporter, and the kernel-log reader."""

from __future__ import annotations

import urllib.request
from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpu_operator.node.doctor.findings import diagnose
from gpu_operator.node.doctor.kernellog import driver_xid, read_kernel_log, xid_findings
from gpu_operator.node.doctor.report import host_checks
from gpu_operator.node.exporter import PREFIX, NodeStatusCollector, driver_answers, registry_for
from gpu_operator.node.gpucheck.compare import compare, contradictions, defects
from gpu_operator.node.gpucheck.steps import Defect, State, Unavailable
from gpu_operator.node.host.probe import probe
from gpu_operator.node.validate.base import Context, Outcome, StatusDir
from gpu_operator.node.validate.config import STATUS_FILES, ValidatorConfig
from gpu_operator.node.validate.run import validate

SCRAPE_TIMEOUT = 30.0


def probe_step(state: State) -> tuple[str, dict[str, Any]]:
    state.report = report = probe(state.fs, extra_search_dirs=state.search_dirs)
    driver = report.driver
    version = f" {driver.kernel_version}" if driver.kernel_version else ""
    return (
        f"{len(report.gpus)} GPU(s); driver {driver.source}{version}, root {driver.driver_root or '-'}; "
        f"IOMMU {'on' if report.iommu.enabled else 'off'}"
    ), report.model_dump(mode="json")


def compare_step(state: State) -> tuple[str, dict[str, Any]]:
    if state.report is None:
        raise RuntimeError("no probe report to compare (the probe step failed)")
    if state.smi is None and state.nvml is None:
        raise Unavailable("neither nvidia-smi nor NVML answered: nothing to compare with")
    rows = compare(state.report, state.tools, state.smi, state.nvml)
    details = {"rows": [r.as_dict() for r in rows]}
    bad = defects(rows)
    if bad:
        raise Defect(
            f"{len(bad)} of {len(rows)} facts differ from NVIDIA's tools: "
            + "; ".join(f"{r.fact} ({r.verdict})" for r in bad[:4]),
            details,
        )
    return f"{len(rows)} facts compared, none differs", details


def doctor_step(state: State) -> tuple[str, dict[str, Any]]:
    if state.report is None:
        raise RuntimeError("no probe report for doctor (the probe step failed)")
    cuda = []
    reference = state.smi or state.nvml
    if reference and reference.cuda_version:
        major, _, minor = reference.cuda_version.partition(".")
        cuda = [(int(major), int(minor or 0))]
    runner = state.deps.runner(state.fs)
    state.findings = findings = diagnose(state.report) + host_checks(state.fs, state.report, cuda, runner)
    against = contradictions(findings, state.smi or state.nvml)
    details = {
        "findings": [
            f.model_dump(mode="json") | {"contradicted_by_nvidia": against.get(f.code)} for f in findings
        ],
        "cuda_checked": [f"{a}.{b}" for a, b in cuda],
    }
    counts = Counter(str(f.severity) for f in findings)
    summary = f"{len(findings)} finding(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if against:
        raise Defect(
            summary + f"; {len(against)} contradicted by NVIDIA's tools: {', '.join(sorted(against))}",
            details,
        )
    return summary, details


def validator_config(state: State) -> ValidatorConfig:
    env = {
        "OUTPUT_DIR": state.fs.status_path,
        "WITH_WAIT": "false",
        "DISABLE_DEV_CHAR_SYMLINK_CREATION": "true",
        "DRIVER_SEARCH_PATHS": ":".join(state.search_dirs),
    }
    return ValidatorConfig.from_env(env)


def validator_step(state: State) -> tuple[str, dict[str, Any]]:
    if state.report is not None and not state.report.gpus and state.smi is None:
        raise Unavailable("no NVIDIA GPU: the driver validation has nothing to validate")
    config = validator_config(state)
    ctx = Context(state.fs, state.deps.runner(state.fs), config, kube=None)
    result = validate(ctx, "driver")
    status = StatusDir(state.fs, config.output_dir)
    state.driver_ready = (
        status.read_flags(STATUS_FILES["driver"]) if status.exists(STATUS_FILES["driver"]) else None
    )
    details = {
        "outcome": str(result.outcome),
        "message": result.message,
        "files": result.files,
        "status_dir": str(state.fs.status_dir),
        "driver_ready": state.driver_ready,
    }
    written = (state.driver_ready or {}).get("NVIDIA_DRIVER_ROOT")
    summary = f"{result.outcome}: {result.message}" + (f"; NVIDIA_DRIVER_ROOT={written}" if written else "")
    if result.outcome != Outcome.PASSED:
        if state.smi is not None:
            raise Defect(summary + " (nvidia-smi answers)", details)
        raise RuntimeError(summary)
    found = state.tools.driver_root if state.smi is not None else None
    if found and written != found:
        raise Defect(summary + f", but nvidia-smi answered from the driver root {found}", details)
    return summary, details


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:  # noqa: S310 - our own loopback
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def exporter_step(state: State) -> tuple[str, dict[str, Any]]:
    from prometheus_client import start_http_server

    runner = state.deps.runner(state.fs)
    collector = NodeStatusCollector(
        state.fs,
        state.fs.status_path,
        driver_check=lambda: driver_answers(state.fs, runner, state.search_dirs),
    )
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry_for(collector))
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        metrics = _scrape(url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    details: dict[str, Any] = {"url": url, "metrics": metrics}
    summary = ", ".join(
        f"{k.removeprefix(PREFIX + '_')}={v:g}"
        for k, v in sorted(metrics.items())
        if not k.endswith("_ts_seconds")
    )
    wrong = []
    if state.report is not None and metrics.get("gpu_operator_nvidia_pci_devices_total") != len(
        state.report.gpus
    ):
        wrong.append("the PCI device count differs from the probe's")
    if metrics.get(f"{PREFIX}_driver_ready") != (1.0 if state.driver_ready is not None else 0.0):
        wrong.append("driver_ready differs from the validator's status file")
    if state.smi is not None and metrics.get(f"{PREFIX}_driver_validation") != 1.0:
        wrong.append("driver_validation is not 1 although nvidia-smi answers")
    if wrong:
        raise Defect(summary + ": " + "; ".join(wrong), details)
    return summary, details


def kernel_log_step(state: State) -> tuple[str, dict[str, Any]]:
    found = read_kernel_log(state.fs)
    if found is None:
        raise Unavailable(
            "the kernel log could not be read (/dev/kmsg, then the syslog files, under the host root; "
            "/dev/kmsg needs root on a real host)"
        )
    source, text = found
    lines = text.splitlines()
    xids = Counter(int(m.group(2)) for line in lines if (m := driver_xid(line)))
    findings = xid_findings(text, source)
    details = {
        "source": source,
        "lines": len(lines),
        "xid_lines": sum(xids.values()),
        "xids": {str(k): v for k, v in sorted(xids.items())},
        "findings": [f.model_dump(mode="json") for f in findings],
    }
    return (
        f"{source}: {len(lines)} line(s), {sum(xids.values())} Xid line(s)"
        + (f" ({', '.join(f'Xid {k} x{v}' for k, v in sorted(xids.items()))})" if xids else "")
    ), details
