"""The kernel log's word on the GPUs: NVIDIA's Xid events and the NVRM lines that stop a driver,
each a finding with what it means and the fix.

Read from the host's `/dev/kmsg` (non-blocking: every record the ring buffer still holds), else
the first of the syslog files that exists, all under the host root. Each Xid is judged by the
catalogue the health agent uses (node/health/catalogue.py: NVIDIA's Xid catalogue, its source
recorded there); the words here are ours.
"""

from __future__ import annotations

import re
from collections import Counter

from gpu_operator.node.doctor.verdict import Finding, Severity, finding
from gpu_operator.node.health.catalogue import (
    CATALOGUE_URL,
    HEALTHY,
    REBOOT,
    RESET_GPU,
    RESTART_APP,
    UNHEALTHY,
    WARNING,
    XID_LINE,
    classify,
)
from gpu_operator.node.health.kmsg import KERN, KMSG, read_records
from gpu_operator.node.host.hostfs import HostFS, HostPathError

LOG_FILES = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
MAX_KMSG_BYTES = 4 * 1024 * 1024

RESET = "drain the node's GPU pods, then reset the GPU (nvidia-smi -r -i ADDR) or reboot the node"
# doctor's fix per action of the Xid catalogue (node/health/catalogue.py): words ours.
FIXES = {
    RESTART_APP: "check the application that ran on this GPU (its logs, CUDA error) and restart it; "
    "recurring on every workload points at the hardware",
    RESET_GPU: RESET,
    REBOOT: "the GPU is lost until the node is power-cycled: drain it, reboot, and check power, "
    "cooling and the PCIe seating if it happens again",
}
_SEVERITY = {HEALTHY: Severity.INFO, WARNING: Severity.WARNING, UNHEALTHY: Severity.ERROR}
UNKNOWN_FIX = "look the number up in NVIDIA's Xid catalogue (" + CATALOGUE_URL + ")"


def xid_kind(xid: int) -> tuple[Severity, str, str]:
    """(severity, meaning, fix) of one Xid for doctor, from the shared catalogue."""
    cls = classify(xid)
    if cls.bucket == "UNKNOWN":
        return Severity.WARNING, cls.meaning, UNKNOWN_FIX
    fix = FIXES.get(cls.action, "")
    if not fix and cls.state == WARNING:
        fix = f"NVIDIA's Xid catalogue says {cls.bucket} for it ({CATALOGUE_URL})"
    return _SEVERITY[cls.state], cls.meaning, fix


# NVRM lines that are no Xid but mean the driver cannot work: (pattern, code, summary, fix)
NVRM_LINES = (
    (
        re.compile(r"NVRM: API mismatch"),
        "driver-api-mismatch",
        "the NVIDIA kernel module and the user-space driver are different versions",
        "load the kernel module that matches the installed libraries (reboot after a driver update, or "
        "restart the driver pod); two drivers (host and operator) must not both be installed",
    ),
    (
        re.compile(r"NVRM: RmInitAdapter failed"),
        "gpu-init-failed",
        "the driver could not initialise a GPU",
        "check the lines around it in the kernel log; reset or reboot, and check the GPU is supported by this driver",
    ),
    (re.compile(r"NVRM: .*fallen off the bus"), "gpu-off-bus", "a GPU has fallen off the bus", FIXES[REBOOT]),
)


def read_kernel_log(fs: HostFS) -> tuple[str, str] | None:
    """(source, text) of the host's kernel log, or None when none can be read."""
    try:
        real = fs.resolve(KMSG)
    except HostPathError as err:
        fs.refused[KMSG] = str(err)
    else:
        records = read_records(fs, KMSG, MAX_KMSG_BYTES) if real.exists() else None
        if records is not None:  # a record naming an Xid that is no kernel record is left out
            return KMSG, "\n".join(
                r.message for r in records if r.facility == KERN or MENTION not in r.message
            )
    for path in LOG_FILES:
        text = fs.read_text(path, limit=MAX_KMSG_BYTES)
        if text is not None:
            return path, text
    return None


def kernel_log_findings(fs: HostFS) -> list[Finding]:
    found = read_kernel_log(fs)
    if found is None:
        return [
            finding(
                "kernel-log-unreadable",
                Severity.INFO,
                "the kernel log could not be read",
                [f"tried {KMSG} and {', '.join(LOG_FILES)} under the host root"],
                "run doctor with access to /dev/kmsg (privileged, or as root on the host)",
            )
        ]
    source, text = found
    return xid_findings(text, source)


MENTION = "NVRM: Xid"
SYSLOG_KERNEL = re.compile(r" kernel: (?:\[\s*\d+\.\d+\]\s*)?")


def driver_xid(line: str) -> re.Match[str] | None:
    """The driver's Xid line: a kmsg message that BEGINS with it, or a syslog line whose kernel
    message (after `kernel: ` and the printk time) does; a line that only contains it (a crashing
    process's file name, xidlines.py) is none."""
    match = XID_LINE.match(line)
    if match is None and (kernel := SYSLOG_KERNEL.search(line)):
        match = XID_LINE.match(line, kernel.end())
    return match


def xid_findings(text: str, source: str) -> list[Finding]:
    counts: Counter[tuple[str, int]] = Counter()
    last: dict[tuple[str, int], str] = {}
    other: dict[str, tuple[str, str, str, list[str]]] = {}
    for line in text.splitlines():
        match = driver_xid(line)
        if match:
            key = (match.group(1).lower(), int(match.group(2)))
            counts[key] += 1
            last[key] = line.strip()[match.start() :][:300]
            continue
        for pattern, code, summary, fix in NVRM_LINES:
            if pattern.search(line):
                other.setdefault(code, (summary, fix, source, []))[3].append(line.strip()[:300])
    out = []
    for (address, xid), count in sorted(counts.items()):
        severity, meaning, fix = xid_kind(xid)
        out.append(
            finding(
                f"xid-{xid}",
                severity,
                f"GPU {address}: Xid {xid}, {meaning} ({count} time(s))",
                [f"{source}: {last[(address, xid)]}"],
                fix.replace("ADDR", address),
            )
        )
    for code, (summary, fix, src, lines) in other.items():
        out.append(
            finding(
                code,
                Severity.ERROR,
                f"{summary} ({len(lines)} line(s))",
                [f"{src}: {line}" for line in lines[-3:]],
                fix,
            )
        )
    return out
