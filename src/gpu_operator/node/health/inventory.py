"""This boot's GPUs as the health agent first saw them, kept on the host so that an agent started
again on the same boot still knows a GPU that left the bus in between.

Without it, an agent whose pod restarts after a GPU fell off the bus (a PCIe surprise removal
takes the card out of sysfs and the driver's /proc) starts with one GPU fewer and reports the
node healthy. The first agent of a boot writes the GPUs it finds at start to INVENTORY, under
the host's /run (a tmpfs: a reboot empties it, and the GPUs are found anew), with the boot's
boot_id; a later agent of the same boot adds the GPUs listed there to those it finds, so one
that is missing now is `gone` (assess.py) as for an agent that ran all along.

The file is input from the node: only a root process on the host (or a privileged pod that
mounts /run) can write it, and what it can do is mark this node's GPUs gone, which such a
process can do anyway. Entries that are no PCI address are dropped, at most MAX_GPUS are read,
and a file of another boot (or with no boot) counts for nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from gpu_operator.node.health.observe import PciGpu
from gpu_operator.node.host.hostfs import HostFS

INVENTORY = "/run/nvidia/gpu-health/gpus.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_GPUS = 64  # no node has more; a longer list is not this agent's
_BUS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
_DRIVER = re.compile(r"^[a-z0-9_-]{1,32}$")


def boot_id(fs: HostFS) -> str:
    return (fs.read_text(BOOT_ID) or "").strip()


def read(fs: HostFS, boot: str) -> dict[str, PciGpu]:
    """The GPUs an earlier agent of boot `boot` found ({} for another boot, none, or a bad file)."""
    if not boot:
        return {}
    try:
        raw = json.loads(fs.read_text(INVENTORY) or "{}")
    except ValueError:
        return {}
    if not isinstance(raw, dict) or raw.get("bootId") != boot or not isinstance(raw.get("gpus"), dict):
        return {}
    out: dict[str, PciGpu] = {}
    for bus, driver in list(raw["gpus"].items())[:MAX_GPUS]:
        if isinstance(bus, str) and _BUS.match(bus):
            out[bus] = PciGpu(bus, driver if isinstance(driver, str) and _DRIVER.match(driver) else None)
    return out


def write(fs: HostFS, boot: str, gpus: dict[str, PciGpu]) -> str | None:
    """Keep `gpus` as this boot's; the error when the host's /run cannot take it (None: written)."""
    if not boot:
        return "the host has no boot_id"
    text = json.dumps(
        {"bootId": boot, "gpus": {b: g.driver for b, g in sorted(gpus.items())}}, sort_keys=True
    )
    try:
        if fs.read_text(INVENTORY) != text:
            fs.write_atomic(INVENTORY, text)
    except OSError as err:
        return str(err)
    return None


def remember(fs: HostFS, found: dict[str, PciGpu], log: Callable[[str], None]) -> dict[str, PciGpu]:
    """The GPUs found now and those an earlier agent of this boot found (kept for the next one)."""
    boot = boot_id(fs)
    earlier = read(fs, boot)
    merged = {**earlier, **found}
    missing = sorted(set(earlier) - set(found))
    if missing:
        log(f"GPUs of this boot no longer on the bus when the agent started: {', '.join(missing)}")
    error = write(fs, boot, merged)
    if error:
        log(
            f"this boot's GPUs not kept at {INVENTORY}: {error} (an agent started again will not know a GPU lost now)"
        )
    return merged
