"""The sysfs and procfs primitives both the fixture builder and the kernel simulator write."""

from __future__ import annotations

import os

from gpu_operator.node.hostfs import HostFS


def rel_symlink(fs: HostFS, link: str, target: str) -> None:
    """A relative symlink as the kernel makes them (sysfs never uses absolute targets)."""
    rel = os.path.relpath(target, os.path.dirname(link))
    fs.symlink(link, rel)


def add_driver(fs: HostFS, name: str) -> None:
    """A loaded PCI driver's sysfs directory (the kernel's attribute files are empty regular files here)."""
    base = f"/sys/bus/pci/drivers/{name}"
    for attr in ("bind", "unbind", "new_id", "remove_id"):
        if not fs.exists(f"{base}/{attr}"):
            fs.write_text(f"{base}/{attr}", "")


def write_gpu_information(fs: HostFS, address: str, minor: int, version: str) -> None:
    fs.write_text(
        f"/proc/driver/nvidia/gpus/{address}/information",
        f"Model:           NVIDIA GPU\nDevice Minor:    {minor}\nBus Location:    {address}\nDriver:          {version}\n",
    )
