"""What the health agent reads from the host tree at each step (besides the kernel log and NVML):
the NVIDIA GPUs on the PCI bus, the driver's per-GPU entries in /proc, and the validator's status
files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_operator.node.host import pci
from gpu_operator.node.host.holders import driver_listed
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.validate.config import STATUS_FILES
from gpu_operator.vocabulary import VALIDATIONS_DIR

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
GPU_CLASSES = ("0300", "0302")  # VGA and 3D controllers: what NVIDIA's GPUs present


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


def _is_gpu(fs: HostFS, bus: str) -> bool:
    """An NVIDIA display-class function that is no SR-IOV virtual function."""
    base = f"{pci.PCI_DEVICES}/{bus}"
    return (
        pci.hex_value(fs.read_value(f"{base}/vendor"), 4) == pci.NVIDIA_VENDOR
        and pci.hex_value(fs.read_value(f"{base}/class"), 6).startswith(GPU_CLASSES)
        and not fs.is_symlink(f"{base}/physfn")
    )


def pci_gpus(fs: HostFS, kinds: dict[str, bool] | None = None) -> dict[str, PciGpu]:
    """NVIDIA GPUs under /sys/bus/pci/devices (SR-IOV virtual functions excluded), with the driver
    bound to each. `kinds` (bus -> is such a GPU), kept by the caller from one call to the next:
    a function's vendor and class are read once while it stays listed; only the bound driver is
    read every time."""
    known = kinds if kinds is not None else {}
    listed = fs.listdir(pci.PCI_DEVICES)
    for bus in set(known) - set(listed):
        del known[bus]
    out = {}
    for bus in listed:
        if bus not in known:
            known[bus] = _is_gpu(fs, bus)
        if known[bus]:
            out[bus.lower()] = PciGpu(bus.lower(), fs.link_name(f"{pci.PCI_DEVICES}/{bus}/driver"))
    return out


def driver_gpus(fs: HostFS) -> dict[str, int | None]:
    """The driver's per-GPU directories in /proc (bus -> device minor when its information says)."""
    return {
        bus: int(minor) if (minor := fields.get("Device Minor", "")).isdigit() else None
        for bus, fields in driver_listed(fs).items()
    }


def missing_validations(
    fs: HostFS, components: tuple[str, ...], directory: str = VALIDATIONS_DIR
) -> tuple[str, ...]:
    """The components whose status file (<component>-ready) is absent."""
    return tuple(c for c in components if not fs.is_file(f"{directory}/{STATUS_FILES[c]}"))


def snapshot(
    fs: HostFS,
    validations: tuple[str, ...],
    directory: str = VALIDATIONS_DIR,
    kinds: dict[str, bool] | None = None,
) -> HostSnapshot:
    """`kinds`: as for `pci_gpus`."""
    return HostSnapshot(
        pci=pci_gpus(fs, kinds),
        driver_loaded=fs.exists(DRIVER_VERSION_FILE),
        driver_gpus=driver_gpus(fs),
        missing_validations=missing_validations(fs, validations, directory),
    )
