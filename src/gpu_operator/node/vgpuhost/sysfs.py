"""A GPU's SR-IOV and vGPU state as sysfs shows it on a vGPU host using NVIDIA's vendor-specific
VFIO framework (vGPU 17+ on Ada, Hopper and newer, kernel 6.8+).

The physical function has `sriov_totalvfs`, `sriov_numvfs` and a `virtfnN` link per enabled VF
(the kernel's SR-IOV interface); each VF has `physfn` back, and an `nvidia/` directory with
`creatable_vgpu_types` (lines `<id> : <name>`, after a header line) and `current_vgpu_type` (the
type id, 0 for none), which a vGPU is created by writing (NVIDIA's vGPU user guide, "Creating an
NVIDIA vGPU ... that uses a vendor-specific VFIO framework"; the layout NVIDIA's vgpu-device-manager
reads in pkg/vgpu/vfio/sysfs.go). A VM holds its VF through VFIO: /dev/vfio/<group> or the
VF's /dev/vfio/devices/vfioN (its `vfio-dev/` entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_operator.node.host import pci
from gpu_operator.node.host.holders import open_device_files
from gpu_operator.node.host.hostfs import HostFS


@dataclass(frozen=True)
class VgpuType:
    id: int
    name: str

    @property
    def short(self) -> str:
        """The name without the product prefix ("NVIDIA H100XM-20C" -> "H100XM-20C"), as configs write it."""
        words = self.name.split()
        return words[-1] if words else self.name


def parse_creatable(text: str) -> list[VgpuType]:
    """`creatable_vgpu_types`: `<id> : <name>` per line; the header and blank lines are skipped."""
    out = []
    for line in text.splitlines():
        number, sep, name = line.partition(":")
        if not sep or not number.strip().isdigit() or not name.strip():
            continue
        out.append(VgpuType(int(number.strip()), name.strip()))
    return out


@dataclass
class VirtualFunction:
    index: int
    address: str
    current: int | None  # None: no nvidia/current_vgpu_type (not the vendor-specific VFIO framework)
    creatable: list[VgpuType] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)  # "qemu-kvm[4242] /dev/vfio/77"
    mdev: bool = False  # the VF is an mdev parent (Ampere's SR-IOV vGPU): the mdev framework, not this one


@dataclass
class PhysicalFunction:
    address: str
    totalvfs: int | None
    numvfs: int | None
    vfs: list[VirtualFunction] = field(default_factory=list)
    mdev: bool = False  # the PF itself is an mdev parent (a GPU without SR-IOV, e.g. Turing)

    @property
    def in_use(self) -> list[VirtualFunction]:
        return [vf for vf in self.vfs if vf.holders]


def vf_holders(fs: HostFS, address: str) -> list[str]:
    """Processes holding this VF's VFIO device open (its group node, or its iommufd cdev)."""
    base = f"{pci.PCI_DEVICES}/{address}"
    devices = []
    group = fs.link_name(f"{base}/iommu_group")
    if group is not None:
        devices.append(f"/dev/vfio/{group}")
    devices += [f"/dev/vfio/devices/{name}" for name in fs.listdir(f"{base}/vfio-dev")]
    return [
        f"{comm}[{pid}] {path}" for pid, comm, path in open_device_files(fs, "/dev/vfio/") if path in devices
    ]


def _int(fs: HostFS, path: str) -> int | None:
    value = fs.read_value(path)
    return int(value) if value is not None and value.strip().isdigit() else None


def read_pf(fs: HostFS, address: str) -> PhysicalFunction:
    base = f"{pci.PCI_DEVICES}/{address}"
    links = [n for n in fs.listdir(base) if n.startswith("virtfn") and n[6:].isdigit()]
    vfs = []
    for link in sorted(links, key=lambda n: int(n[6:])):
        vf = fs.link_name(f"{base}/{link}")
        if vf is None:
            continue
        vf_base = f"{pci.PCI_DEVICES}/{vf}/nvidia"
        vfs.append(
            VirtualFunction(
                index=int(link[6:]),
                address=vf,
                current=_int(fs, f"{vf_base}/current_vgpu_type"),
                creatable=parse_creatable(fs.read_text(f"{vf_base}/creatable_vgpu_types") or ""),
                holders=vf_holders(fs, vf),
                mdev=fs.is_dir(f"{pci.PCI_DEVICES}/{vf}/mdev_supported_types"),
            )
        )
    return PhysicalFunction(
        address,
        _int(fs, f"{base}/sriov_totalvfs"),
        _int(fs, f"{base}/sriov_numvfs"),
        vfs,
        mdev=fs.is_dir(f"{base}/mdev_supported_types"),
    )
