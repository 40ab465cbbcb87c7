"""The MIG state of a node's GPUs (what NVML reports: MIG mode, GPU and compute instances) and
what NVIDIA's driver shows of it in the host tree.

The state lives on the GPUs, in no file of the host: the simulator keeps it beside the node's host
tree (`<hosts>/<node>/mig.json`, like the fault book), or in memory where the kwok nodes have no
host trees; every GPU starts with MIG off (a fresh boot of our shapes). The MIG manager's stand-in
changes it; GFD's and the device plugin's stand-ins read it, as the real ones read NVML.

In the host tree (facts: NVIDIA's MIG user guide, "Device Nodes and Capabilities"; the driver's
nvidia-caps interface as libnvidia-container and the device plugin read it):
- /proc/driver/nvidia-caps/mig-minors: `config 1`, `monitor 2`, then for each GPU minor m, GPU
  instance g (0-14) and compute instance c (0-7): `gpu<m>/gi<g>/access <3 + 135m + 9g>` and
  `gpu<m>/gi<g>/ci<c>/access <3 + 135m + 9g + 1 + c>`;
- /proc/driver/nvidia/capabilities/mig/{config,monitor} and, per live instance,
  /proc/driver/nvidia/capabilities/gpu<m>/mig/gi<g>/access and .../gi<g>/ci<c>/access:
  `DeviceFileMinor: <minor>`, `DeviceFileMode: <mode>` (config 256 = 0400, the others 292 = 0444),
  `DeviceFileModify: 1`;
- /dev/nvidia-caps/nvidia-cap<minor>: character devices of the `nvidia-caps` major (dynamic; listed
  in /proc/devices), for config, monitor and every live instance, as nvidia-smi's nvidia-modprobe
  leaves them once the MIG manager has applied a layout.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from gpu_operator.shapes import Shape
from gpu_operator.sim import devnodes, hosttree
from gpu_operator.sim.migparted import GpuMig, from_json, to_json

CAPS_MAJOR = 509  # a dynamic major, as /proc/devices lists it on a host
STATE_FILE = "mig.json"
GI_SLOTS, CI_SLOTS = 15, 8
CAPS = "/proc/driver/nvidia/capabilities"
MINORS = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DEV = "/dev/nvidia-caps"


def gi_minor(gpu_minor: int, gi: int) -> int:
    return 3 + gpu_minor * GI_SLOTS * (1 + CI_SLOTS) + gi * (1 + CI_SLOTS)


def ci_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_minor(gpu_minor, gi) + 1 + ci


def mig_minors_table(gpu_minors: list[int]) -> str:
    lines = ["config 1", "monitor 2"]
    for m in sorted(gpu_minors):
        for g in range(GI_SLOTS):
            lines.append(f"gpu{m}/gi{g}/access {gi_minor(m, g)}")
            lines.extend(f"gpu{m}/gi{g}/ci{c}/access {ci_minor(m, g, c)}" for c in range(CI_SLOTS))
    return "\n".join(lines) + "\n"


def _cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def write_tree(root: Path, gpus: list[GpuMig], minors: dict[int, int]) -> None:
    """The driver's MIG files and nodes in the tree at `root` for `gpus` (`minors`: GPU index ->
    device minor); what an earlier layout left there goes."""
    proc_caps = root / CAPS.lstrip("/")
    dev_caps = root / CAPS_DEV.lstrip("/")
    for old in proc_caps.glob("gpu*"):
        shutil.rmtree(old, ignore_errors=True)
    if dev_caps.is_dir():
        for node in dev_caps.iterdir():
            node.unlink()
    table = root / MINORS.lstrip("/")
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(mig_minors_table(sorted(minors.values())))
    devices = root / "proc/devices"
    text = devices.read_text() if devices.is_file() else "Character devices:\n"
    if " nvidia-caps\n" not in text:
        devices.write_text(text + f"{CAPS_MAJOR} nvidia-caps\n")
    wanted = {(proc_caps / "mig/config"): (1, 256), (proc_caps / "mig/monitor"): (2, 292)}
    for gpu in gpus:
        m = minors[gpu.index]
        for inst in gpu.instances:
            base = proc_caps / f"gpu{m}/mig/gi{inst.gi}"
            wanted[base / "access"] = (gi_minor(m, inst.gi), 292)
            wanted[base / f"ci{inst.ci}/access"] = (ci_minor(m, inst.gi, inst.ci), 292)
    for path, (minor, mode) in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_cap_file(minor, mode))
        devnodes.make_char(dev_caps / f"nvidia-cap{minor}", CAPS_MAJOR, minor)


def shape_gpus(shape: Shape) -> list[GpuMig]:
    """A host of `shape` as it boots: its GPUs (the UUIDs its host tree gives them), MIG off."""
    return list(_shape_gpus(shape.name)) if shape.nvidia_gpus else []


@functools.cache
def _shape_gpus(name: str) -> tuple[GpuMig, ...]:
    from gpu_operator.sim.realspec import host_spec

    spec = host_spec(name)
    gpus = sorted((str(d["address"]), str(d["device"]).lower()) for d in spec["devices"]
                  if str(d.get("vendor", "")).lower() == "10de" and str(d.get("class", "")).startswith("03"))
    return tuple(GpuMig(i, device, hosttree.gpu_uuid(a)) for i, (a, device) in enumerate(gpus))


class MigHardware:
    """The kwok nodes' GPUs' MIG state: beside their host trees under `hosts`, or in memory."""

    def __init__(self, hosts: Path | None = None) -> None:
        self.hosts = hosts
        self.memory: dict[str, list[GpuMig]] = {}

    def _file(self, node: str) -> Path | None:
        return None if self.hosts is None else self.hosts / node / STATE_FILE

    def gpus(self, node: str, shape: Shape) -> list[GpuMig]:
        path = self._file(node)
        if path is not None and path.is_file():
            return from_json(json.loads(path.read_text()))
        return self.memory.get(node) or shape_gpus(shape)

    def set(self, node: str, shape: Shape, gpus: list[GpuMig]) -> None:
        """The GPUs as the MIG manager left them; with host trees, the driver's files there too."""
        path = self._file(node)
        if path is None or self.hosts is None:
            self.memory[node] = gpus
            return
        from gpu_operator.sim.faults import NodeHosts, node_host_spec
        from gpu_operator.sim.toolkit import gpus as tree_gpus

        hosts = NodeHosts(self.hosts)
        root = hosts.faults(node, node_host_spec(shape.name)).root
        minors = {g.index: g.minor for g in tree_gpus(root)}
        write_tree(root, [g for g in gpus if g.index in minors], minors)
        path.write_text(json.dumps(to_json(gpus), indent=1))
        hosts.announce(node)
