"""Which device taints NVIDIA's GPU kubelet plugin puts in its ResourceSlice on an Xid, for the DRA
kubelet-plugin stand-in (`sim/standins/draplugin.py`), which reads the Xids from the node's host tree's
kernel log where NVIDIA's plugin gets them as NVML events (as `sim/standins/xidhealth.py` does for the
device plugin).

Facts (NVIDIA/k8s-dra-driver-gpu, v0.4.0 and main at v0.5.0-dev, read for facts only:
cmd/gpu-kubelet-plugin/device_health.go, driver.go `deviceHealthEvents`, allocatable.go
`AddOrUpdateTaint`, main.go, pkg/featuregates/featuregates.go):
- only with the plugin's feature gate NVMLDeviceHealthCheck (alpha, off by default; FEATURE_GATES);
- an Xid critical-error event on a GPU adds to that device the taint key `gpu.nvidia.com/xid`,
  value the Xid's number, effect NoSchedule, or None for the Xids it skips: 13, 31, 43, 45, 68, 109
  and those in ADDITIONAL_XIDS_TO_IGNORE (comma list, malformed entries skipped); a later Xid on the
  same device replaces value and effect (one taint per key); the slice is published again with the
  device still in it: devices are tainted, never dropped;
- nothing removes a taint while the plugin runs: a new plugin process (a new pod, a reboot)
  starts without any;
- not played: the `gpu.nvidia.com/gpu-lost` taint (NVML's wait failing with GPU_IS_LOST, on every
  device) and `gpu.nvidia.com/unmonitored`: a GPU gone from the bus shows here by its Xid 79 line.

Only Xids logged after the plugin started count; a new boot (the tree's boot_id changed) is a new
plugin process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpu_operator.node.health.catalogue import DEVICE_PLUGIN_APPLICATION_XIDS
from gpu_operator.sim.standins.xidhealth import XidLog

GATE = "NVMLDeviceHealthCheck"
GATES_ENV = "FEATURE_GATES"
IGNORE_ENV = "ADDITIONAL_XIDS_TO_IGNORE"
TAINT_XID = "gpu.nvidia.com/xid"


def gate_on(env: Mapping[str, str], gate: str = GATE) -> bool:
    """Whether FEATURE_GATES (K=true,...) turns `gate` (default NVMLDeviceHealthCheck) on."""
    for item in env.get(GATES_ENV, "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == gate:
            return value.strip().lower() == "true"
    return False


def skipped(env: Mapping[str, str]) -> frozenset[int]:
    extra = {int(v.strip()) for v in env.get(IGNORE_ENV, "").split(",") if v.strip().isdigit()}
    return DEVICE_PLUGIN_APPLICATION_XIDS | extra


class SliceHealth:
    """Per GPU address (domain:bus:device, as the Xid line writes it) the taint the plugin keeps."""

    def __init__(self, host_root: Path, env: Mapping[str, str]) -> None:
        self.log = XidLog(host_root)
        self.on = gate_on(env)
        self.skip = skipped(env)
        self.taints: dict[str, dict[str, str]] = {}

    def poll(self) -> dict[str, dict[str, str]]:
        if self.log.rebooted():  # a new plugin process: no taint
            self.taints = {}
        if not self.on:
            return {}
        for address, xid in self.log.new():
            self.taints[address] = {
                "key": TAINT_XID,
                "value": str(xid),
                "effect": "None" if xid in self.skip else "NoSchedule",
            }
        return dict(self.taints)
