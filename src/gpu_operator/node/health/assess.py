"""The pure part of the health agent: observations in, the report (a JSON-ready dict) out.

The report (schema version 1; the operator parses it with gpu_operator.api.health.HealthReport):

    {"v": 1,                      schema version
     "validated": false,          every expected validator status file is present
     "missing": ["plugin"],       the validations whose status file is absent (only when some are)
     "state": "unhealthy",        the worst GPU state: healthy | warning | unhealthy | gone
     "action": "reboot",          the strongest action any GPU needs: none | restart-app | reset-gpu | reboot
     "healthy": 7,                how many GPUs are healthy (they are not listed)
     "gpus": [{"bus": "0000:41:00.0", "minor": 3, "index": 3, "state": "unhealthy", "xid": 79,
               "action": "reboot", "reason": "Xid 79: GPU has fallen off the bus ...",
               "recovery": "node-reboot"}],
     "sources": ["kmsg", "nvml", "pci", "proc"],   what the agent could read
     "stopped": true}             only in the last report an agent writes as it stops

`minor` (the driver's device minor, /proc) and `index` (NVML's index) appear when known, `xid`
when the GPU had one since the agent started, `recovery` where NVML offers the driver's recovery
action (drivers from 565; nvml.RECOVERY_ACTIONS). Keys are sorted and the JSON compact, so the same
observations always give the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpu_operator.node.health.catalogue import (
    GONE,
    HEALTHY,
    NONE,
    REBOOT,
    RESET_GPU,
    RESTART_APP,
    STATES,
    UNHEALTHY,
    WARNING,
    XidClass,
)
from gpu_operator.node.health.nvml import NvmlObservation
from gpu_operator.node.health.observe import HostSnapshot
from gpu_operator.vocabulary import HEALTH_ACTIONS

SCHEMA_VERSION = 1
MAX_REASON = 160
# NVML's recovery action (nvml.RECOVERY_ACTIONS) -> our action; it comes ahead of the Xid catalogue.
# Drain P2P and drain-and-reset: the drain is the quarantine's, the GPU reset ours; a bus reset and a
# system reboot: reboot (our reset is nvidia-smi -r, no bus reset); IMEX domain recovery spans nodes:
# nothing automatic, a person looks (as for an action we do not know).
RECOVERY_TO_ACTION = {
    "none": NONE,
    "gpu-reset": RESET_GPU,
    "node-reboot": REBOOT,
    "drain-p2p": RESET_GPU,
    "drain-and-reset": RESET_GPU,
    "bus-reset": REBOOT,
    "system-reboot": REBOOT,
}


@dataclass(frozen=True)
class XidMark:
    """The Xid that sets a GPU's state (the worst since the agent started; the latest of equals)."""

    cls: XidClass
    at: float  # monotonic seconds
    source: str


def _verdict(
    bus: str, baseline: HostSnapshot, now: HostSnapshot, mark: XidMark | None, nvml: NvmlObservation | None
) -> tuple[str, str, str]:
    """(state, action, reason) of one GPU: the worst of what each source says."""
    found: list[tuple[str, str, str]] = [(HEALTHY, NONE, "")]
    if bus in baseline.pci and bus not in now.pci:
        found.append((GONE, REBOOT, f"gone from the PCI bus ({bus} left /sys/bus/pci/devices)"))
    gpu = nvml.gpus.get(bus) if nvml else None
    if gpu and gpu.lost:
        found.append((GONE, REBOOT, gpu.why or "NVML: the GPU is lost"))
    recovery = gpu.recovery if gpu else None
    if recovery not in (None, "none"):
        found.append(
            (UNHEALTHY, RECOVERY_TO_ACTION.get(recovery, NONE), f"NVML: the driver asks for {recovery}")
        )
    if gpu and gpu.reset_required:
        found.append((UNHEALTHY, RESET_GPU, "NVML: the GPU needs a reset"))
    if gpu and gpu.remap_failed:
        found.append((UNHEALTHY, RESET_GPU, "NVML: a memory row remapping failed"))
    elif gpu and gpu.remap_pending:
        found.append((WARNING, RESET_GPU, "NVML: a memory row remapping waits for the next GPU reset"))
    on_pci = now.pci.get(bus)
    if (
        bus in baseline.driver_gpus
        and bus not in now.driver_gpus
        and now.driver_loaded
        and on_pci is not None
        and on_pci.driver == "nvidia"
    ):
        found.append((UNHEALTHY, RESET_GPU, "the driver no longer lists it (/proc/driver/nvidia/gpus)"))
    if mark is not None:
        cls = mark.cls
        state, action = cls.state, cls.action
        if recovery == "none" and action != NONE:  # the driver says a new process can use the GPU
            state, action = min(state, WARNING, key=STATES.index), RESTART_APP
        elif recovery is not None:  # the driver's recovery action comes ahead of the catalogue's
            action = RECOVERY_TO_ACTION.get(recovery, action)
        found.append((state, action, f"Xid {cls.xid}: {cls.meaning} ({mark.source})"))
    state, action, reason = max(found, key=lambda f: (STATES.index(f[0]), HEALTH_ACTIONS.index(f[1])))
    return state, action, reason[:MAX_REASON]


def evaluate(
    baseline: HostSnapshot,
    now: HostSnapshot,
    marks: dict[str, XidMark],
    nvml: NvmlObservation | None,
    sources: list[str],
) -> tuple[dict[str, Any], dict[str, str]]:
    """The report for one step, and every GPU's state (healthy ones too: the metrics show them
    all). `baseline` is the first snapshot (the GPUs the agent started with)."""
    buses = set(baseline.pci) | set(now.pci) | set(baseline.driver_gpus) | set(now.driver_gpus) | set(marks)
    if nvml:
        buses |= set(nvml.gpus)
    healthy, listed = 0, []
    states: dict[str, str] = {}
    worst_state, worst_action = HEALTHY, NONE
    for bus in sorted(buses):
        mark = marks.get(bus)
        state, action, reason = _verdict(bus, baseline, now, mark, nvml)
        states[bus] = state
        if state == HEALTHY:
            healthy += 1
            continue
        entry: dict[str, Any] = {"bus": bus, "state": state, "action": action, "reason": reason}
        minor = now.driver_gpus.get(bus, baseline.driver_gpus.get(bus))
        if minor is not None:
            entry["minor"] = minor
        gpu = nvml.gpus.get(bus) if nvml else None
        if gpu is not None and gpu.index is not None:
            entry["index"] = gpu.index
        if gpu is not None and gpu.recovery is not None:
            entry["recovery"] = gpu.recovery
        if mark is not None:
            entry["xid"] = mark.cls.xid
        listed.append(entry)
        if STATES.index(state) > STATES.index(worst_state):
            worst_state = state
        if HEALTH_ACTIONS.index(action) > HEALTH_ACTIONS.index(worst_action):
            worst_action = action
    report: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "validated": not now.missing_validations,
        "state": worst_state,
        "action": worst_action,
        "healthy": healthy,
        "gpus": listed,
        "sources": sorted(sources),
    }
    if now.missing_validations:
        report["missing"] = list(now.missing_validations)
    return report, states


def encode(report: dict[str, Any]) -> str:
    """The annotation's text: compact, keys sorted (equal reports give equal text)."""
    return json.dumps(report, sort_keys=True, separators=(",", ":"))
