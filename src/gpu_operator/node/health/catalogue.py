"""NVIDIA's Xid catalogue (data in xids.txt beside this file, with its source) and what the health
agent and doctor make of each Xid: the catalogue's immediate-action bucket mapped to one of
HEALTH_ACTIONS, and a per-GPU state.

The mapping of buckets to actions and states is ours:

- RESTART_APP -> restart-app, warning (the application is at fault; the GPU keeps working)
- RESET_GPU, and the catalogue's workflows for Xid 48 (double-bit ECC), 74 and 144-150 (NVLink)
  -> reset-gpu, unhealthy
- RESTART_BM (reboot the bare-metal node) -> reboot, unhealthy
- IGNORE, WORKFLOW_XID_45 (cleanup after another error), SEE_LINKED_XID (154) -> none, healthy
- CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, RESTART_VM, CHECK_UVM, and codes the catalogue
  lacks -> none, warning (a person looks; nothing automatic)

NVIDIA's device plugin never marks a GPU unhealthy for the Xids it counts as application errors
(DEVICE_PLUGIN_APPLICATION_XIDS); neither do we: for those the state is at most `warning`, whatever
the bucket (Xid 109's bucket is RESET_GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpu_operator.vocabulary import HEALTH_ACTIONS

CATALOGUE_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
# NVIDIA/k8s-device-plugin internal/rm/health.go (commit 02597b97a66aee924ae59788e8de24955d07f2d0),
# getDisabledHealthCheckXids: "Application errors: the GPU should still be healthy".
DEVICE_PLUGIN_APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# GPU states, mildest first (`gone`: no longer on the PCI bus, or NVML says it is lost).
HEALTHY, WARNING, UNHEALTHY, GONE = "healthy", "warning", "unhealthy", "gone"
STATES = (HEALTHY, WARNING, UNHEALTHY, GONE)
NONE, RESTART_APP, RESET_GPU, REBOOT = HEALTH_ACTIONS

_BUCKETS: dict[str, tuple[str, str]] = {
    "RESTART_APP": (RESTART_APP, WARNING),
    "RESET_GPU": (RESET_GPU, UNHEALTHY),
    "WORKFLOW_XID_48": (RESET_GPU, UNHEALTHY),
    "WORKFLOW_NVLINK_ERR": (RESET_GPU, UNHEALTHY),
    "WORKFLOW_NVLINK5_ERR": (RESET_GPU, UNHEALTHY),
    "RESTART_BM": (REBOOT, UNHEALTHY),
    "IGNORE": (NONE, HEALTHY),
    "WORKFLOW_XID_45": (NONE, HEALTHY),
    "SEE_LINKED_XID": (NONE, HEALTHY),
}
_ATTENTION = (NONE, WARNING)  # every other bucket, and codes the catalogue does not list

# Our words for the Xids seen most on data-centre GPUs (doctor's summaries, the report's reasons);
# every other code is described by its catalogue mnemonic.
MEANINGS: dict[int, str] = {
    13: "graphics engine exception (usually the application's fault)",
    31: "GPU memory page fault (usually an application's illegal access)",
    43: "GPU stopped processing (an application fault was contained)",
    45: "preemptive cleanup after an application stopped or faulted",
    48: "double-bit ECC error in GPU memory",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus (no longer reachable over PCIe)",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application was stopped)",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP firmware call timed out",
    120: "GSP firmware error",
}

# The driver's kernel-log line for an Xid, as NVIDIA's kernel module prints it (open-gpu-kernel-modules
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c, XID_PRINT_WITH_ATTR, at 595.45.04): `NVRM: Xid (PCI:%04x:%02x:%02x`,
# then ` GPU-I:%02u` and ` GPU-CI:%02u` where a MIG instance is attributed, `): %d, ` and either
# `pid=%s, name=%s, <message>` or the message alone. The address is domain:bus:device (no function).
# The health agent takes it only at the START of a kernel record of facility kern naming one of the
# node's GPUs (xidlines.py), doctor at the start of a kernel message (kernellog.driver_xid); the
# simulator's device-plugin stand-ins `search` the records `sim fault` wrote.
XID_PREFIX = "NVRM: Xid ("
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"(?: GPU-I:\d+)?(?: GPU-CI:\d+)?\): (\d+),(.*)"
)


@dataclass(frozen=True)
class XidClass:
    """What one Xid means for its GPU."""

    xid: int
    bucket: str  # the catalogue's immediate-action bucket; "UNKNOWN" when it lists no such code
    mnemonic: str
    action: str  # one of HEALTH_ACTIONS
    state: str  # healthy | warning | unhealthy
    meaning: str


@cache
def catalogue() -> dict[int, tuple[str, str]]:
    """Xid -> (bucket, mnemonic), from xids.txt."""
    text = resources.files(__package__).joinpath("xids.txt").read_text()
    out: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        code, bucket, mnemonic = line.split(" ", 2)
        out[int(code)] = (bucket, "" if mnemonic == "-" else mnemonic)
    return out


def classify(xid: int) -> XidClass:
    bucket, mnemonic = catalogue().get(xid, ("UNKNOWN", ""))
    action, state = _BUCKETS.get(bucket, _ATTENTION)
    if xid in DEVICE_PLUGIN_APPLICATION_XIDS and state == UNHEALTHY:
        state = WARNING
    meaning = MEANINGS.get(xid) or (mnemonic.lower().replace("_", " ") if mnemonic else "an Xid event")
    return XidClass(xid, bucket, mnemonic, action, state, meaning)
