"""What NVIDIA's driver shows of the GPUs' MIG state in a host tree, and that state kept beside
the tree (the GPUs hold it, no file of the host does; `<tree>/../mig.json`).

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

import json
import shutil
from pathlib import Path

from gpu_operator.node.host.holders import driver_gpus
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import devnodes
from gpu_operator.sim.hardware.migparted import GpuMig, Instance, from_json, to_json

STATE_FILE = "mig.json"
CAPS_MAJOR = 509  # a dynamic major, as /proc/devices lists it on a host
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


def tree_state(root: Path) -> list[GpuMig] | None:
    """The MIG state kept beside the host tree at `root` (None: MIG never changed there)."""
    path = Path(root).parent / STATE_FILE
    return from_json(json.loads(path.read_text())) if path.is_file() else None


def save_tree_state(root: Path, gpus: list[GpuMig]) -> None:
    """Keep `gpus` beside the tree at `root` and make the driver's MIG files in it (the MIG manager's
    work on a host the simulator has no MIG manager pod for, e.g. the real node's tree)."""
    minors = gpu_minors(root)
    write_tree(root, [g for g in gpus if g.index in minors], minors)
    (Path(root).parent / STATE_FILE).write_text(json.dumps(to_json(gpus), indent=1))


def mig_device(root: Path, name: str) -> tuple[GpuMig, Instance] | None:
    """The MIG device a container asks for by its UUID or `<GPU index>:<MIG index>`, in the tree at
    `root`; None where it names none."""
    for gpu in tree_state(root) or []:
        for j, inst in enumerate(gpu.instances):
            if name in (gpu.mig_uuid(inst), f"{gpu.index}:{j}"):
                return gpu, inst
    return None


def access_nodes(gpu_minor: int, inst: Instance) -> list[tuple[str, int]]:
    """The cap device nodes guarding a MIG device (its GPU instance's, then its compute instance's)."""
    return [
        (f"{CAPS_DEV}/nvidia-cap{gi_minor(gpu_minor, inst.gi)}", gi_minor(gpu_minor, inst.gi)),
        (
            f"{CAPS_DEV}/nvidia-cap{ci_minor(gpu_minor, inst.gi, inst.ci)}",
            ci_minor(gpu_minor, inst.gi, inst.ci),
        ),
    ]


def gpu_minors(root: Path) -> dict[int, int]:
    """NVML index (PCI address order) -> device minor of the tree's GPUs, from the driver's procfs."""
    found = sorted(driver_gpus(HostFS(Path(root))).items())
    return {i: int(fields["Device Minor"]) for i, (_address, fields) in enumerate(found)}
