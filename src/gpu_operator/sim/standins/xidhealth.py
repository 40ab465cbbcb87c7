"""Which Xid events make NVIDIA's device plugin report a GPU Unhealthy, for the device-plugin
stand-in (`sim/standins/deviceplugin.py`), which reads them from its host tree's kernel log where NVIDIA's
plugin gets them as NVML events.

Facts (NVIDIA/k8s-device-plugin internal/rm/health.go, read for facts only):
- the plugin registers every GPU for NVML's critical-Xid events once it starts, and marks the
  event's GPU Unhealthy for any Xid not ignored; nothing marks it Healthy again while the plugin
  runs (a new plugin process, as after a reboot, starts with every GPU Healthy);
- ignored always: the application Xids 13 (graphics engine exception), 31 (GPU memory page
  fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video processor exception),
  109 (context switch timeout);
- DP_DISABLE_HEALTHCHECKS: `all` or `xids` turns the health checks off; otherwise a comma list of
  further Xids to ignore (malformed entries skipped). DP_ENABLE_HEALTHCHECKS: Xids counted even if
  ignored otherwise (`all`: every Xid). With every Xid disabled and no `all` enabled the plugin
  runs no health check at all.

Only events after the stand-in started count (NVML delivers events from registration on); a new
boot (the tree's boot_id changed, `sim fault --clear`) is a new plugin process: every GPU Healthy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from gpu_operator.node.health.catalogue import DEVICE_PLUGIN_APPLICATION_XIDS, XID_LINE
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware.faults import KMSG, boot_id

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
ALL = 0  # the key for "every Xid", as the plugin keeps it


def _parse(value: str) -> dict[int, bool]:
    out: dict[int, bool] = {}
    for item in value.lower().split(","):
        item = item.strip()
        if item in ("all", "xids"):
            return {ALL: True}
        if item.isdigit():
            out[int(item)] = True
    return out


class XidFilter:
    """The plugin's disabled-Xid table from its environment."""

    def __init__(self, env: Mapping[str, str]) -> None:
        disabled = _parse(env.get(DISABLE_ENV, ""))
        for xid in sorted(DEVICE_PLUGIN_APPLICATION_XIDS):
            disabled[xid] = True
        for xid in _parse(env.get(ENABLE_ENV, "")):
            disabled[xid] = False
        self.disabled = disabled

    @property
    def all_disabled(self) -> bool:
        return self.disabled.get(ALL, False)

    def counts(self, xid: int) -> bool:
        """Whether Xid `xid` marks its GPU Unhealthy."""
        if self.disabled.get(ALL) is False:  # every Xid enabled
            return True
        if xid in self.disabled:
            return not self.disabled[xid]
        return not self.all_disabled


def records(kmsg: Path) -> list[tuple[int, str]]:
    """(sequence number, message) of each record of a kmsg-format file."""
    try:
        text = kmsg.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        head, sep, message = line.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 2 and fields[1].isdigit():
            out.append((int(fields[1]), message))
    return out


class XidLog:
    """The Xid events a process on the host gets from NVML, read from the tree's kernel log: those
    logged after it started. A new boot (the tree's boot_id changed) is a new process: `rebooted()`
    says so once, and the new boot's log is read from its start."""

    def __init__(self, host_root: Path) -> None:
        self.fs = HostFS(host_root)
        self.boot = self.boot_id()
        self.seen = max((seq for seq, _ in records(self.fs.resolve(KMSG))), default=-1)

    def boot_id(self) -> str:
        return boot_id(self.fs)

    def rebooted(self) -> bool:
        """Whether the host booted again since the last look (a tree that just got its first boot_id
        did not: the same boot)."""
        boot = self.boot_id()
        if boot == self.boot:
            return False
        before, self.boot = self.boot, boot
        if not before:
            return False
        self.seen = -1
        return True

    def new(self) -> list[tuple[str, int]]:
        """(GPU address domain:bus:device, Xid) of each Xid record logged since the last call."""
        out = []
        for seq, message in records(self.fs.resolve(KMSG)):
            if seq <= self.seen:
                continue
            self.seen = seq
            match = XID_LINE.search(message)  # the driver's line, as the health agent reads it
            if match:
                out.append((match.group(1).lower().split(".")[0], int(match.group(2))))
        return out


class XidHealth:
    """The GPUs (by address, domain:bus:device) the plugin would have marked Unhealthy."""

    def __init__(self, host_root: Path, env: Mapping[str, str]) -> None:
        self.lock = threading.Lock()  # ListAndWatch streams poll from the server's threads
        self.log = XidLog(host_root)
        self.filter = XidFilter(env)
        self.unhealthy: set[str] = set()

    def boot_id(self) -> str:
        return self.log.boot_id()

    def poll(self) -> set[str]:
        with self.lock:
            if self.log.rebooted():  # a new plugin process: every GPU Healthy
                self.unhealthy = set()
            if not self.filter.all_disabled:  # else no health checks at all
                self.unhealthy |= {address for address, xid in self.log.new() if self.filter.counts(xid)}
            return set(self.unhealthy)
