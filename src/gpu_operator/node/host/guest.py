"""Is this host a VM guest, and what were its GPUs given as? Read from sysfs and procfs only.

- A guest: the CPU's `hypervisor` flag in /proc/cpuinfo (CPUID leaf 1 ECX bit 31, which KVM sets
  for its guests), or DMI naming a virtual machine (/sys/class/dmi/id/sys_vendor: KubeVirt's
  default SMBIOS says manufacturer "KubeVirt", product "None", family "KubeVirt"; plain QEMU says
  "QEMU").
- Each GPU's kind, from its PCI configuration space (/sys/bus/pci/devices/<addr>/config) as GPU
  feature discovery reads it (k8s-device-plugin internal/vgpu): a vendor-specific capability (ID
  09) whose bytes 3-4 are "VF" is a vGPU, and its host driver record names the vGPU manager's
  version and branch; a GPU whose whole configuration space (256 bytes) has none was passed through.
  The full space is readable only with privilege (an unprivileged read gets 64 bytes): then the kind
  is unknown, and said so.
- NVLink: GPUs whose NVLink runs through NVSwitches (HGX A100/H100/H200 SXM) and the NVSwitches
  present (bridge-class 0680 NVIDIA functions); the nvidia module's NvLinkDisable parameter as
  loaded (/proc/driver/nvidia/params).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.vocabulary import NVLINK_FABRIC_GPUS

DMI = "/sys/class/dmi/id"
# DMI system vendors of virtual machines we name (KubeVirt's default SMBIOS, QEMU's own).
VM_VENDORS = ("KubeVirt", "QEMU")
NVSWITCH_CLASS_PREFIX = "0680"
_CONFIG_SPACE = 256
_CAP_POINTER, _STATUS, _CAP_LIST = 0x34, 0x06, 0x10
_VENDOR_CAP = 0x09
_RECORDS_AT = 5
_FIELD = 10  # the host driver record: 10 bytes of version, 10 of branch

GpuKind = Literal["passthrough", "vgpu", "unknown"]


class GuestGpu(BaseModel):
    address: str
    kind: GpuKind
    host_driver_version: str = Field(default="", description="a vGPU's: the host's vGPU manager version")
    host_driver_branch: str = ""


class GuestInfo(BaseModel):
    """What the host shows about being a VM; empty fields on bare metal."""

    hypervisor_flag: bool = False
    dmi_vendor: str = ""
    dmi_product: str = ""
    dmi_family: str = ""
    gpus: list[GuestGpu] = Field(default_factory=list)
    nvlink_gpus: list[str] = Field(
        default_factory=list, description="GPUs whose NVLink goes through NVSwitches"
    )
    nvswitches: list[str] = Field(default_factory=list)
    nvlink_disable: int | None = Field(default=None, description="the loaded nvidia module's NvLinkDisable")

    @property
    def is_guest(self) -> bool:
        return self.hypervisor_flag or self.dmi_vendor in VM_VENDORS

    @property
    def kind(self) -> str:
        """passthrough, vgpu, mixed, unknown (config space not readable) or "" (no GPU)."""
        kinds = {g.kind for g in self.gpus}
        if not kinds:
            return ""
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def fabric_missing(self) -> bool:
        """NVSwitch-fabric GPUs passed through without any NVSwitch beside them in this VM."""
        passed = {g.address for g in self.gpus if g.kind != "vgpu"}
        return self.is_guest and bool(passed & set(self.nvlink_gpus)) and not self.nvswitches

    def evidence(self) -> list[str]:
        out = []
        if self.hypervisor_flag:
            out.append("/proc/cpuinfo: the CPU has the `hypervisor` flag")
        if self.dmi_vendor:
            out.append(
                f"DMI: sys_vendor {self.dmi_vendor!r}, product_name {self.dmi_product!r}, "
                f"product_family {self.dmi_family!r}"
            )
        return out


def vgpu_capability(config: bytes) -> tuple[bool, str, str] | None:
    """(is a vGPU, host driver version, branch) from a configuration space; None when the space was
    not read whole (the vendor capability may lie past the 64 bytes an unprivileged read gets)."""
    if len(config) < _CONFIG_SPACE:
        return None
    if not config[_STATUS] & _CAP_LIST:
        return False, "", ""
    pos, seen = config[_CAP_POINTER], set()
    while pos and pos not in seen and pos + 2 < len(config):
        seen.add(pos)
        cap_id, following, length = config[pos], config[pos + 1], config[pos + 2]
        if cap_id == _VENDOR_CAP:
            cap = config[pos : pos + length]
            if cap[3:5] != b"VF":
                return False, "", ""
            return (True, *_host_driver(cap))
        pos = following
    return False, "", ""


def _host_driver(cap: bytes) -> tuple[str, str]:
    pos = _RECORDS_AT
    while pos < len(cap) and cap[pos] != 0:
        if pos + 1 >= len(cap) or cap[pos + 1] == 0:
            return "", ""
        pos += cap[pos + 1]
    start = pos + 2
    if pos >= len(cap) or start + 2 * _FIELD > len(cap):
        return "", ""
    version = cap[start : start + _FIELD].rstrip(b"\0").decode(errors="replace")
    branch = cap[start + _FIELD : start + 2 * _FIELD].rstrip(b"\0").decode(errors="replace")
    return version, branch


def _params(fs: HostFS) -> dict[str, str]:
    text = fs.read_text("/proc/driver/nvidia/params") or ""
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}


def read_guest(fs: HostFS, functions: list[pci.PciFunction]) -> GuestInfo:
    """The guest facts of the host whose NVIDIA PCI functions are `functions`."""
    cpuinfo = fs.read_text("/proc/cpuinfo") or ""
    flagged = any(
        line.split(":", 1)[0].strip() == "flags" and "hypervisor" in line.split(":", 1)[1].split()
        for line in cpuinfo.splitlines()
        if ":" in line
    )
    info = GuestInfo(
        hypervisor_flag=flagged,
        dmi_vendor=fs.read_value(f"{DMI}/sys_vendor") or "",
        dmi_product=fs.read_value(f"{DMI}/product_name") or "",
        dmi_family=fs.read_value(f"{DMI}/product_family") or "",
    )
    if not info.is_guest:
        return info
    gpus = []
    for gpu in (f for f in functions if f.is_gpu):
        found = vgpu_capability(fs.read_bytes(f"{pci.PCI_DEVICES}/{gpu.address}/config") or b"")
        if found is None:
            gpus.append(GuestGpu(address=gpu.address, kind="unknown"))
        else:
            vgpu, version, branch = found
            gpus.append(
                GuestGpu(
                    address=gpu.address,
                    kind="vgpu" if vgpu else "passthrough",
                    host_driver_version=version,
                    host_driver_branch=branch,
                )
            )
    value = _params(fs).get("NvLinkDisable")
    return info.model_copy(
        update=dict(
            gpus=gpus,
            nvlink_gpus=[f.address for f in functions if f.is_gpu and f.device in NVLINK_FABRIC_GPUS],
            nvswitches=[f.address for f in functions if f.pci_class.startswith(NVSWITCH_CLASS_PREFIX)],
            nvlink_disable=int(value) if value is not None and value.isdigit() else None,
        )
    )
