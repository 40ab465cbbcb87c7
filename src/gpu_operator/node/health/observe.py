"""What the health agent reads from the host tree at each step (besides the kernel log and NVML):
the NVIDIA GPUs on the PCI bus, the driver's per-GPU entries in /proc, and the validator's status
files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpu_operator.node.hostfs import HostFS
from gpu_operator.vocabulary import VALIDATIONS_DIR

PCI_DEVICES = "/sys/bus/pci/devices"
DRIVER_GPUS = "/proc/driver/nvidia/gpus"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers: what NVIDIA's GPUs present
# The validator components whose status files (<component>-ready) say the node passed, in order.
DEFAULT_VALIDATIONS = ("driver", "toolkit", "cuda", "plugin")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class PciGpu:
    bus: str
    driver: str | None  # the bound driver's name (nvidia, vfio-pci) or None


@dataclass
class HostSnapshot:
    """One step's reading of the host tree."""

    pci: dict[str, PciGpu] = field(default_factory=dict)  # bus -> GPU on the bus now
    driver_loaded: bool = False  # /proc/driver/nvidia/version exists
    driver_gpus: dict[str, int | None] = field(default_factory=dict)  # bus -> device minor
    missing_validations: tuple[str, ...] = ()


def pci_gpus(fs: HostFS) -> dict[str, PciGpu]:
    """NVIDIA display-class functions under /sys/bus/pci/devices (SR-IOV virtual functions excluded)."""
    out = {}
    for bus in fs.listdir(PCI_DEVICES):
        base = f"{PCI_DEVICES}/{bus}"
        if (fs.read_value(f"{base}/vendor") or "").lower() != NVIDIA_VENDOR:
            continue
        if not (fs.read_value(f"{base}/class") or "").lower().startswith(GPU_CLASSES):
            continue
        if fs.is_symlink(f"{base}/physfn"):
            continue
        out[bus.lower()] = PciGpu(bus.lower(), fs.link_name(f"{base}/driver"))
    return out


def driver_gpus(fs: HostFS) -> dict[str, int | None]:
    """The driver's per-GPU directories in /proc (bus -> device minor when its information says)."""
    out: dict[str, int | None] = {}
    for bus in fs.listdir(DRIVER_GPUS):
        match = _MINOR.search(fs.read_text(f"{DRIVER_GPUS}/{bus}/information") or "")
        out[bus.lower()] = int(match.group(1)) if match else None
    return out


def missing_validations(fs: HostFS, components: tuple[str, ...], directory: str = VALIDATIONS_DIR) -> tuple[str, ...]:
    """The components whose status file (<component>-ready) is absent."""
    return tuple(c for c in components if not fs.is_file(f"{directory}/{c}-ready"))


def snapshot(fs: HostFS, validations: tuple[str, ...], directory: str = VALIDATIONS_DIR) -> HostSnapshot:
    return HostSnapshot(
        pci=pci_gpus(fs),
        driver_loaded=fs.exists(DRIVER_VERSION_FILE),
        driver_gpus=driver_gpus(fs),
        missing_validations=missing_validations(fs, validations, directory),
    )
