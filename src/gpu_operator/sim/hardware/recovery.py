"""The GPU recovery action NVIDIA's driver keeps per GPU (drivers from 565; NVML reads it as the
field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as the simulator plays it for `sim fault`.

What the driver does (open-gpu-kernel-modules 595.45.04, src/nvidia/src/kernel/gpu/gpu.c,
`_gpuRefreshRecoveryActionInLock`, `_gpuRecoveryActionName`): each GPU holds one action, decided
in this order: node reboot, GPU reset, drain and reset, drain P2P, recover IMEX domain, none. When
the action changes from a known one, the driver raises NVML's recovery-action event and logs
Xid 154 in the kernel log, `GPU recovery action changed from 0x%x (%s) to 0x%x (%s)`, with the
names below (the Xid catalogue's row for 154 quotes the same form). A GPU the driver sets up
(`gpuPostConstruct`) starts from an unknown action and settles without logging Xid 154; a reset,
like a reboot, is played as setting the GPU up anew: none, nothing logged.

Which Xid sets which action is the driver's own business (error containment tables, GSP, MMU
paths); NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
gives each Xid a resolution bucket, and that is what we play: RESET_GPU and the catalogue's
workflows that end in a GPU reset (48, NVLink) -> GPU reset; RESTART_BM (reboot the bare-metal
node) -> node reboot; every other bucket leaves the action as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpu_operator.node.health.catalogue import XID_PREFIX, catalogue
from gpu_operator.node.host.hostfs import HostFS

FIRST_DRIVER = (
    565  # NVML's field and Xid 154 exist from this driver branch (NVML's "changes between v560 and v565")
)
XID_RECOVERY_CHANGED = 154
# nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*, nvidia-ml-py)
NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET, RECOVER_IMEX_DOMAIN = range(6)
# the driver's names in the Xid 154 line (_gpuRecoveryActionName)
NAMES = {
    NONE: "None",
    GPU_RESET: "GPU Reset Required",
    NODE_REBOOT: "Node Reboot Required",
    DRAIN_P2P: "Drain P2P",
    DRAIN_AND_RESET: "Drain and Reset",
    RECOVER_IMEX_DOMAIN: "Recover IMEX Domain",
}
# the driver's order of decision: the first that holds wins
PRECEDENCE = (NODE_REBOOT, GPU_RESET, DRAIN_AND_RESET, DRAIN_P2P, RECOVER_IMEX_DOMAIN, NONE)
BUCKETS = {
    "RESET_GPU": GPU_RESET,
    "WORKFLOW_XID_48": GPU_RESET,
    "WORKFLOW_NVLINK_ERR": GPU_RESET,
    "WORKFLOW_NVLINK5_ERR": GPU_RESET,
    "RESTART_BM": NODE_REBOOT,
}
VERSION_FILE = "/proc/driver/nvidia/version"


def for_xid(xid: int) -> int:
    """The action an Xid asks of its GPU (by its catalogue bucket); NONE: it changes nothing."""
    bucket, _ = catalogue().get(xid, ("UNKNOWN", ""))
    return BUCKETS.get(bucket, NONE)


def strongest(actions: Iterable[int]) -> int:
    found = set(actions)
    return next((a for a in PRECEDENCE if a in found), NONE)


def of_xids(xids: Iterable[int]) -> int:
    """A GPU's action after these Xids of this boot (since its last reset)."""
    return strongest(for_xid(x) for x in xids)


def driver_version(fs: HostFS) -> str:
    """The loaded driver's version (its /proc entry, as NVML's nvmlSystemGetDriverVersion answers);
    "" with no driver loaded."""
    found = re.search(r"Kernel Module\s+(\S+)", fs.read_text(VERSION_FILE) or "")
    return found.group(1) if found else ""


def supported(version: str) -> bool:
    """Whether a driver of `version` keeps the recovery action (565 and later)."""
    major = version.partition(".")[0]
    return major.isdigit() and int(major) >= FIRST_DRIVER


def changed_line(address: str, old: int, new: int) -> str:
    """The driver's Xid 154 record for `address` (domain:bus:device), as nvErrorLog_va prints it."""
    return (
        f"{XID_PREFIX}PCI:{address}): {XID_RECOVERY_CHANGED}, GPU recovery action changed from "
        f"0x{old:x} ({NAMES[old]}) to 0x{new:x} ({NAMES[new]})"
    )
