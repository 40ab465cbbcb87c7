"""PCI functions of a host read from its sysfs, with names from its pci.ids (or our small fallback)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, Field

from gpu_operator.node.host.hostfs import HostFS

NVIDIA_VENDOR = "10de"
PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
# Drivers that hand a GPU to a VM (Grace-Hopper uses its own vfio variant).
VFIO_DRIVERS = ("vfio-pci", "nvgrace_gpu_vfio_pci")
PCI_IDS_PATHS = (
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
    "/var/lib/pciutils/pci.ids",
)
# Class 0x06 04 is a PCI bridge: the kernel lets bridges share an IOMMU group with a vfio device.
BRIDGE_CLASS_PREFIX = "0604"


class PciFunction(BaseModel):
    """One PCI function as the kernel shows it."""

    address: str
    vendor: str
    device: str
    pci_class: str
    name: str = ""
    numa_node: int | None = None
    iommu_group: int | None = None
    driver: str | None = None
    driver_override: str | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    physfn: str | None = Field(
        default=None, description="for an SR-IOV virtual function: its parent's address"
    )

    @property
    def vendor_device(self) -> str:
        return f"{self.vendor}:{self.device}"

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == NVIDIA_VENDOR

    @property
    def is_gpu(self) -> bool:
        """A physical display-class (VGA 0300, 3D 0302) function; vGPU virtual functions are not GPUs."""
        return self.pci_class.startswith("03") and self.physfn is None

    @property
    def is_bridge(self) -> bool:
        return self.pci_class.startswith(BRIDGE_CLASS_PREFIX)

    @property
    def slot(self) -> str:
        """Domain:bus:device without the function number: functions of one card share it."""
        return self.address.rsplit(".", 1)[0]

    @property
    def on_vfio(self) -> bool:
        return self.driver in VFIO_DRIVERS


def hex_value(value: str | None, width: int) -> str:
    """A sysfs hex attribute (`0x10de`) as pci.ids writes it (`10de`), zero-padded to `width`."""
    if not value:
        return ""
    return value.lower().removeprefix("0x").zfill(width)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def normalise_bus(address: str) -> str:
    """A PCI address as sysfs names it: lower case, with the function (`0000:41:00` -> `0000:41:00.0`).
    NVML's and nvidia-smi's 8-digit domain (`00000000:41:00.0`) is shortened to 4."""
    address = address.strip().lower()
    if "." not in address:
        address += ".0"
    domain, rest = address.split(":", 1)
    if len(domain) > 4:
        domain = f"{int(domain, 16):04x}"
    return f"{domain}:{rest}"


def read_function(fs: HostFS, address: str, names: PciNames | None = None) -> PciFunction:
    names = names or PciNames(fs)
    base = f"{PCI_DEVICES}/{address}"
    vendor = hex_value(fs.read_value(f"{base}/vendor"), 4)
    device = hex_value(fs.read_value(f"{base}/device"), 4)
    override = fs.read_value(f"{base}/driver_override")
    group = fs.link_name(f"{base}/iommu_group")
    numa = _int(fs.read_value(f"{base}/numa_node"))
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        pci_class=hex_value(fs.read_value(f"{base}/class"), 6),
        name=names.name(vendor, device),
        # The kernel reports -1 when the platform gives no NUMA affinity.
        numa_node=numa if numa is not None and numa >= 0 else None,
        iommu_group=_int(group),
        driver=fs.link_name(f"{base}/driver"),
        # An unset override reads "(null)".
        driver_override=override if override and override != "(null)" else None,
        sriov_totalvfs=_int(fs.read_value(f"{base}/sriov_totalvfs")),
        sriov_numvfs=_int(fs.read_value(f"{base}/sriov_numvfs")),
        physfn=fs.link_name(f"{base}/physfn"),
    )


def scan(fs: HostFS, vendor: str | None = None) -> list[PciFunction]:
    """Every PCI function (of one vendor when given), in address order."""
    out = []
    names = PciNames(fs)
    for address in fs.listdir(PCI_DEVICES):
        if vendor and hex_value(fs.read_value(f"{PCI_DEVICES}/{address}/vendor"), 4) != vendor:
            continue
        out.append(read_function(fs, address, names))
    return out


def iommu_group_members(fs: HostFS, group: int) -> list[str]:
    return fs.listdir(f"{IOMMU_GROUPS}/{group}/devices")


def iommu_group_count(fs: HostFS) -> int:
    return len(fs.listdir(IOMMU_GROUPS))


def loaded_pci_drivers(fs: HostFS) -> list[str]:
    return fs.listdir(PCI_DRIVERS)


def parse_pci_ids(text: str, vendor: str) -> dict[str, str]:
    """Device names of one vendor from pci.ids text (vendor lines flush left, devices one tab in)."""
    names: dict[str, str] = {}
    inside = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            if inside:
                break  # vendors are listed once; the next one ends ours
            inside = line[:4].lower() == vendor
            continue
        if inside and not line.startswith("\t\t"):
            dev, _, name = line.strip().partition(" ")
            names[dev.lower()] = name.strip()
    return names


@lru_cache(maxsize=1)
def _bundled(vendor: str) -> dict[str, str]:
    text = resources.files("gpu_operator.node.host").joinpath("data/nvidia.ids").read_text()
    return parse_pci_ids(text, vendor)


class PciNames:
    """Device names from the host's pci.ids (read once, on first use), else from our fallback table."""

    def __init__(self, fs: HostFS) -> None:
        self.fs = fs
        self._host: dict[str, dict[str, str]] = {}

    def name(self, vendor: str, device: str) -> str:
        if vendor not in self._host:
            names: dict[str, str] = {}
            for path in PCI_IDS_PATHS:
                text = self.fs.read_text(path)
                if text:
                    names = parse_pci_ids(text, vendor)
                    break
            self._host[vendor] = names
        return self._host[vendor].get(device) or _bundled(vendor).get(device, "")
