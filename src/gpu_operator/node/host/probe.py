"""The host probe: everything the node agents need to know about one host, read from its root only."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import DriverInfo, detect_driver, find_executable, module_names, os_release
from gpu_operator.node.host.guest import GuestInfo, read_guest
from gpu_operator.node.host.holders import GpuHolder, gpu_holders
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.persist import PersistInfo, inspect
from gpu_operator.node.host.runtime import CdiSpec, ContainerRuntime, cdi_specs, detect_runtime

_IOMMU_FLAGS = re.compile(r"(?:^|\s)((?:intel_iommu|amd_iommu|iommu)=\S+)")
_VFIO_IDS = re.compile(r"vfio[-_]pci\.ids=(\S+)")
TOOLKIT_BINARIES = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-toolkit")
TOOLKIT_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/toolkit", "/usr/sbin", "/opt/bin")


class IommuInfo(BaseModel):
    enabled: bool = Field(description="the kernel created IOMMU groups")
    groups: int = 0
    cmdline_flags: list[str] = Field(default_factory=list)


class PassthroughIntent(BaseModel):
    """Signs on the host that its GPUs are meant for VMs (vfio), independent of their current driver."""

    evidence: list[str] = Field(default_factory=list)

    @property
    def present(self) -> bool:
        return bool(self.evidence)


class HostReport(BaseModel):
    host_root: str
    sysfs_visible: bool = Field(default=True, description="/sys/bus/pci/devices exists under the host root")
    os_id: str = ""
    os_version_id: str = ""
    kernel: str = ""
    nvidia_functions: list[pci.PciFunction] = Field(default_factory=list)
    driver: DriverInfo
    nouveau_loaded: bool = False
    vfio_pci_loaded: bool = False
    vfio_iommu_type1_loaded: bool = Field(default=False, description="the VFIO IOMMU backend VMs need")
    vgpu_manager_loaded: bool = Field(
        default=False,
        description="nvidia_vgpu_vfio loaded: NVIDIA's vGPU manager (host driver for vGPU) runs here",
    )
    persistence: PersistInfo = Field(
        default_factory=PersistInfo,
        description="what the boot configuration puts on vfio-pci at the next boot",
    )
    loaded_pci_drivers: list[str] = Field(default_factory=list)
    iommu: IommuInfo
    runtime: ContainerRuntime
    toolkit_binaries: list[str] = Field(
        default_factory=list, description="NVIDIA container toolkit found on the host"
    )
    cdi_specs: list[CdiSpec] = Field(default_factory=list)
    holders: list[GpuHolder] = Field(default_factory=list)
    passthrough_intent: PassthroughIntent = Field(default_factory=PassthroughIntent)
    # Non-NVIDIA, non-bridge devices that share an IOMMU group with an NVIDIA GPU: group -> addresses.
    shared_iommu_groups: dict[int, list[str]] = Field(default_factory=dict)
    mellanox_present: bool = False
    guest: GuestInfo = Field(
        default_factory=GuestInfo, description="VM guest signs, GPU kinds, NVLink (node/host/guest.py)"
    )
    unreadable_paths: dict[str, str] = Field(
        default_factory=dict,
        description="host paths not read: a link out of the host root or in a loop, a value far too long",
    )

    @property
    def gpus(self) -> list[pci.PciFunction]:
        return [f for f in self.nvidia_functions if f.is_gpu]

    @property
    def nvidia_cdi_specs(self) -> list[CdiSpec]:
        return [s for s in self.cdi_specs if s.kind.startswith("nvidia.com/")]


def _passthrough_intent(fs: HostFS, functions: list[pci.PciFunction], cmdline: str) -> PassthroughIntent:
    evidence = [
        f"{f.address} has driver_override={f.driver_override}"
        for f in functions
        if f.driver_override in pci.VFIO_DRIVERS
    ]
    for ids in _VFIO_IDS.findall(cmdline):
        if pci.NVIDIA_VENDOR in ids.lower():
            evidence.append(f"kernel command line sets vfio-pci.ids={ids}")
    for name in fs.listdir("/etc/modprobe.d"):
        for line in (fs.read_text(f"/etc/modprobe.d/{name}") or "").splitlines():
            words = line.split()
            if (
                words[:2] in (["options", "vfio-pci"], ["options", "vfio_pci"])
                and pci.NVIDIA_VENDOR in line.lower()
                or words[:3] == ["softdep", "nvidia", "pre:"]
                and any("vfio" in w for w in words[3:])
            ):
                evidence.append(f"/etc/modprobe.d/{name}: {line.strip()}")
    for directory in ("/etc/initramfs-tools/scripts/init-top", "/etc/initramfs-tools/scripts/init-premount"):
        for name in fs.listdir(directory):
            text = fs.read_text(f"{directory}/{name}") or ""
            if "driver_override" in text and "vfio" in text:
                evidence.append(f"{directory}/{name} sets driver_override to vfio at boot")
    return PassthroughIntent(evidence=evidence)


def _shared_groups(fs: HostFS, functions: list[pci.PciFunction]) -> dict[int, list[str]]:
    shared: dict[int, list[str]] = {}
    for group in sorted({f.iommu_group for f in functions if f.is_gpu and f.iommu_group is not None}):
        strangers = []
        for address in pci.iommu_group_members(fs, group):
            member = pci.read_function(fs, address)
            if not member.is_nvidia and not member.is_bridge:
                strangers.append(address)
        if strangers:
            shared[group] = strangers
    return shared


def probe(fs: HostFS, *, extra_search_dirs: tuple[str, ...] = ()) -> HostReport:
    """Read one host's facts from its root; no writes, no commands."""
    functions = pci.scan(fs, pci.NVIDIA_VENDOR)
    gpus = [f for f in functions if f.is_gpu]
    modules = module_names(fs)
    cmdline = fs.read_value("/proc/cmdline") or ""
    drivers = pci.loaded_pci_drivers(fs)
    release = os_release(fs)
    groups = pci.iommu_group_count(fs)
    toolkit = [p for b in TOOLKIT_BINARIES if (p := find_executable(fs, b, TOOLKIT_DIRS))]
    return HostReport(
        host_root=str(fs.root),
        sysfs_visible=fs.is_dir(pci.PCI_DEVICES),
        os_id=release.get("ID", ""),
        os_version_id=release.get("VERSION_ID", ""),
        kernel=fs.read_value("/proc/sys/kernel/osrelease") or "",
        nvidia_functions=functions,
        driver=detect_driver(
            fs,
            gpus_all_on_vfio=bool(gpus) and all(g.on_vfio for g in gpus),
            extra_search_dirs=extra_search_dirs,
        ),
        nouveau_loaded="nouveau" in modules,
        vfio_pci_loaded="vfio-pci" in drivers or "vfio_pci" in modules,
        vfio_iommu_type1_loaded="vfio_iommu_type1" in modules,
        vgpu_manager_loaded="nvidia_vgpu_vfio" in modules,
        persistence=inspect(fs, functions),
        loaded_pci_drivers=drivers,
        iommu=IommuInfo(enabled=groups > 0, groups=groups, cmdline_flags=_IOMMU_FLAGS.findall(cmdline)),
        runtime=detect_runtime(fs),
        toolkit_binaries=toolkit,
        cdi_specs=cdi_specs(fs),
        holders=gpu_holders(fs) if gpus else [],
        passthrough_intent=_passthrough_intent(fs, functions, cmdline),
        shared_iommu_groups=_shared_groups(fs, functions),
        mellanox_present=bool(pci.scan(fs, "15b3")),
        guest=read_guest(fs, functions),
        unreadable_paths=dict(fs.refused),  # last: every read above has happened
    )
