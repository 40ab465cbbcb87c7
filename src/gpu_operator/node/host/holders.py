"""Processes that hold NVIDIA device files open, mapped to the GPU (PCI address) they pin."""

from __future__ import annotations

import re

from pydantic import BaseModel

from gpu_operator.node.host.hostfs import HostFS, HostPathError

_FIELD = re.compile(r"^(Device Minor|GPU UUID):\s*(\S+)", re.MULTILINE)
_PER_GPU = re.compile(r"^/dev/nvidia(\d+)$")
DRIVER_GPUS = "/proc/driver/nvidia/gpus"


class GpuHolder(BaseModel):
    """A process with an open NVIDIA device file; `address` is set when the file is one GPU's."""

    pid: int
    comm: str
    device: str
    address: str | None = None


def driver_listed(fs: HostFS) -> dict[str, dict[str, str]]:
    """PCI address -> the driver's fields of that GPU (`Device Minor`, `GPU UUID`, where its
    information gives them), for every GPU the driver's /proc/driver/nvidia/gpus tree lists."""
    return {
        address.lower(): dict(_FIELD.findall(fs.read_text(f"{DRIVER_GPUS}/{address}/information") or ""))
        for address in fs.listdir(DRIVER_GPUS)
    }


def driver_gpus(fs: HostFS) -> dict[str, dict[str, str]]:
    """As `driver_listed`, GPUs without a minor left out."""
    return {a: fields for a, fields in driver_listed(fs).items() if fields.get("Device Minor", "").isdigit()}


def device_minors(fs: HostFS) -> dict[int, str]:
    """/dev/nvidiaN minor number -> PCI address."""
    return {int(fields["Device Minor"]): address for address, fields in driver_gpus(fs).items()}


def open_device_files(fs: HostFS, prefix: str) -> list[tuple[int, str, str]]:
    """(pid, comm, device path) for every open file under `prefix` of every host process."""
    out: list[tuple[int, str, str]] = []
    for entry in fs.listdir("/proc"):
        if not entry.isdigit():
            continue
        comm = (fs.read_value(f"/proc/{entry}/comm") or "?").strip()
        seen: set[str] = set()
        for fd in fs.listdir(f"/proc/{entry}/fd"):
            try:
                # The raw link target is the device path as the process sees it; never follow it.
                target = fs.readlink(f"/proc/{entry}/fd/{fd}")
            except (HostPathError, OSError):
                continue
            if not target or not target.startswith(prefix) or target in seen:
                continue
            seen.add(target)
            out.append((int(entry), comm, target))
    return out


def gpu_holders(fs: HostFS) -> list[GpuHolder]:
    """Every open /dev/nvidia* file of every host process (read from the host's /proc)."""
    minors = device_minors(fs)
    out: list[GpuHolder] = []
    for pid, comm, target in open_device_files(fs, "/dev/nvidia"):
        match = _PER_GPU.match(target)
        address = minors.get(int(match.group(1))) if match else None
        out.append(GpuHolder(pid=pid, comm=comm, device=target, address=address))
    return out


def vfio_group_holders(fs: HostFS, group: int) -> list[tuple[int, str, str]]:
    """Processes (a VM's QEMU, usually) that hold /dev/vfio/<group> open."""
    device = f"/dev/vfio/{group}"
    return [h for h in open_device_files(fs, device) if h[2] == device]
