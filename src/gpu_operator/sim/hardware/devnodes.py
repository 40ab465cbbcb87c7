"""The device nodes NVIDIA's kernel modules create, in a host tree.

The driver's character devices (majors and minors from NVIDIA's kernel interface, as
libnvidia-container and the device plugin address them):
- /dev/nvidiactl      195:255  the control device (module nvidia)
- /dev/nvidiaN        195:N    one per GPU, N its `Device Minor` in /proc/driver/nvidia/gpus/*/information
- /dev/nvidia-modeset 195:254  (module nvidia_modeset)
- /dev/nvidia-uvm, /dev/nvidia-uvm-tools  UVM_MAJOR:0 and :1 (module nvidia_uvm; its major is
  dynamic on a host, listed in /proc/devices; a tree uses UVM_MAJOR)

And VFIO's, for devices bound to vfio-pci (the kernel's drivers/vfio/group.c): /dev/vfio/vfio
(the container, misc 10:196) and one /dev/vfio/<IOMMU group> per group whose devices are on a VFIO
driver (its major is dynamic on a host; a tree uses VFIO_MAJOR, minors in group order).

They are real character devices (mknod) when this process may create them (root with CAP_MKNOD,
as the tests and the real node run). Where mknod is refused, the stand-in is a regular file whose
text is `char MAJOR:MINOR`; `char_device` reads either, so the `nvidia` runtime handler treats
both alike. Opening a real node here fails with ENXIO (no driver registered the major), which a
workload can tell apart from EPERM (the container's device cgroup refused it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
UVM_MAJOR = 510
VFIO_MAJOR = 509
VFIO_CONTAINER = (10, 196)
_STAND_IN = "char "


def make_char(path: Path, major: int, minor: int) -> None:
    """A character device at `path` (or its documented stand-in when mknod is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(path, 0o666)  # crw-rw-rw- as the driver makes them, whatever the umask
    except PermissionError:
        path.write_text(f"{_STAND_IN}{major}:{minor}\n")


def char_device(path: Path) -> tuple[int, int] | None:
    """(major, minor) of a character device or its stand-in; None for anything else."""
    try:
        info = path.stat()
    except OSError:
        return None
    if stat.S_ISCHR(info.st_mode):
        return os.major(info.st_rdev), os.minor(info.st_rdev)
    if stat.S_ISREG(info.st_mode) and info.st_size < 64:
        text = path.read_text(errors="replace").strip()
        if text.startswith(_STAND_IN):
            major, _, minor = text[len(_STAND_IN) :].partition(":")
            if major.isdigit() and minor.isdigit():
                return int(major), int(minor)
    return None


def driver_nodes(modules: set[str], gpu_minors: list[int]) -> dict[str, tuple[int, int]]:
    """The device nodes a driver with `modules` loaded creates for GPUs of `gpu_minors`."""
    if "nvidia" not in modules:
        return {}
    nodes = {"/dev/nvidiactl": (NVIDIA_MAJOR, CTL_MINOR)}
    nodes.update({f"/dev/nvidia{minor}": (NVIDIA_MAJOR, minor) for minor in gpu_minors})
    if "nvidia_modeset" in modules:
        nodes["/dev/nvidia-modeset"] = (NVIDIA_MAJOR, MODESET_MINOR)
    if "nvidia_uvm" in modules:
        nodes["/dev/nvidia-uvm"] = (UVM_MAJOR, 0)
        nodes["/dev/nvidia-uvm-tools"] = (UVM_MAJOR, 1)
    return nodes


def vfio_nodes(groups: list[int]) -> dict[str, tuple[int, int]]:
    """The device nodes VFIO creates for devices on vfio-pci in IOMMU groups `groups`."""
    if not groups:
        return {}
    nodes = {"/dev/vfio/vfio": VFIO_CONTAINER}
    nodes.update(
        {f"/dev/vfio/{group}": (VFIO_MAJOR, minor) for minor, group in enumerate(sorted(set(groups)))}
    )
    return nodes


def proc_devices(modules: set[str]) -> str:
    """/proc/devices' character-device lines for the driver's majors."""
    lines = ["Character devices:"]
    if "nvidia" in modules:
        lines.append(f"{NVIDIA_MAJOR} nvidia-frontend")
    if "nvidia_uvm" in modules:
        lines.append(f"{UVM_MAJOR} nvidia-uvm")
    return "\n".join(lines) + "\n"
