"""The vGPU host's hardware and driver, played over a fixture host root: what `sriov-manage -e/-d`
does to sysfs (VFs appear under the PF, each with `physfn`, its own IOMMU group, `vfio-dev/`, and
the vendor-specific VFIO `nvidia/` files), what a write to a VF's `nvidia/current_vgpu_type` does
(only a type its `creatable_vgpu_types` lists; 0 removes the vGPU), MIG mode as nvidia-smi sets and
reports it, and a reboot: VFs gone, every vGPU gone, processes gone, MIG mode back to what the
GPU keeps (Ampere keeps the pending mode in its InfoROM; Hopper keeps none), files on disk kept.

What the GPU can create follows one small model, not a product's table: with MIG off a GPU hosts
time-sliced vGPUs of one type while their framebuffer fits; with MIG on, MIG-backed types while
their GPU slices fit. A VF that has a vGPU lists no creatable types; a free VF lists what still fits.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.node import pci
from gpu_operator.node.hostfs import HostFS
from gpu_operator.sim import hosttree

HEADER = "ID    : vGPU Name\n"


@dataclass(frozen=True)
class SimType:
    id: int
    name: str
    gb: int
    g: int = 0  # GPU slices of a MIG-backed type; 0 for time-sliced


@dataclass
class SimGpu:
    address: str
    mig_current: bool = False
    mig_pending: bool = False
    vgpus: dict[int, int] = field(default_factory=dict)  # VF index -> type id


class VgpuHostSim:
    """A SysfsWriter for the VFs' vGPU files and the agent's VgpuControl, over one host root."""

    def __init__(self, fs: HostFS, spec: dict[str, Any]) -> None:
        vgpu = spec.get("vgpu") or {}
        self.fs = fs
        self.types = [
            SimType(int(t["id"]), str(t["name"]), int(t["gb"]), int(t.get("g", 0))) for t in vgpu["types"]
        ]
        self.slices = int(vgpu.get("gpu_slices", 7))
        self.framebuffer = int(vgpu.get("framebuffer_gb", 80))
        self.mig_persists = bool(vgpu.get("mig_persists_reboot", False))
        self.mdev = vgpu.get("framework") == "mdev"  # Ampere: mdev parents on the VFs instead
        self.gpus = {
            f.address: SimGpu(f.address)
            for f in pci.scan(fs, pci.NVIDIA_VENDOR)
            if f.is_gpu and f.sriov_totalvfs
        }
        self.log: list[str] = []

    # -- sysfs of a PF and its VFs --------------------------------------------------------------

    def _base(self, address: str) -> str:
        return f"{pci.PCI_DEVICES}/{address}"

    def _attr(self, address: str, name: str) -> int:
        return int((self.fs.read_value(f"{self._base(address)}/{name}") or "0").strip())

    def vf_address(self, pf: str, index: int) -> str:
        domain, bus, rest = pf.split(":")
        slot, func = rest.split(".")
        devfn = (
            int(slot, 16) * 8
            + int(func)
            + self._attr(pf, "sriov_offset")
            + index * self._attr(pf, "sriov_stride")
        )
        return f"{domain}:{bus}:{devfn // 8:02x}.{devfn % 8}"

    def _group(self, pf: str, index: int) -> int:
        return 200 + sorted(self.gpus).index(pf) * 64 + index

    def _creatable(self, gpu: SimGpu, index: int) -> list[SimType]:
        if index in gpu.vgpus:
            return []
        by_id = {t.id: t for t in self.types}
        placed = [by_id[i] for i in gpu.vgpus.values()]
        if gpu.mig_current:
            used = sum(t.g for t in placed)
            return [t for t in self.types if t.g and used + t.g <= self.slices]
        used_gb = sum(t.gb for t in placed)
        kinds = {t.id for t in placed}
        return [
            t
            for t in self.types
            if not t.g and (not kinds or t.id in kinds) and used_gb + t.gb <= self.framebuffer
        ]

    def _write_vf_files(self, gpu: SimGpu) -> None:
        for index in range(self._attr(gpu.address, "sriov_numvfs")):
            if self.mdev:
                vf = self._base(self.vf_address(gpu.address, index))
                for t in self.types:
                    self.fs.write_text(
                        f"{vf}/mdev_supported_types/nvidia-{t.id}/name", f"{t.name.split()[-1]}\n"
                    )
                continue
            nvidia = f"{self._base(self.vf_address(gpu.address, index))}/nvidia"
            self.fs.write_text(f"{nvidia}/current_vgpu_type", f"{gpu.vgpus.get(index, 0)}\n")
            lines = "".join(f"{t.id} : {t.name}\n" for t in self._creatable(gpu, index))
            self.fs.write_text(f"{nvidia}/creatable_vgpu_types", HEADER + lines)

    # -- VgpuControl: sriov-manage and nvidia-smi -----------------------------------------------

    def enable_vfs(self, address: str) -> str | None:
        self.log.append(f"sriov-manage -e {address}")
        gpu = self.gpus[address]
        if self._attr(address, "sriov_numvfs"):
            return None
        pf_dir = self.fs.canonical(self._base(address))
        parent = pf_dir.rsplit("/", 1)[0]
        total = self._attr(address, "sriov_totalvfs")
        for index in range(total):
            vf = self.vf_address(address, index)
            vf_dir = f"{parent}/{vf}"
            for name in ("vendor", "device", "class", "numa_node"):
                self.fs.write_text(f"{vf_dir}/{name}", self.fs.read_text(f"{pf_dir}/{name}") or "")
            self.fs.write_text(f"{vf_dir}/driver_override", "(null)\n")
            hosttree.rel_symlink(self.fs, f"{pci.PCI_DEVICES}/{vf}", vf_dir)
            hosttree.rel_symlink(self.fs, f"{vf_dir}/physfn", pf_dir)
            hosttree.rel_symlink(self.fs, f"{pf_dir}/virtfn{index}", vf_dir)
            group = f"/sys/kernel/iommu_groups/{self._group(address, index)}"
            self.fs.mkdir(f"{group}/devices")
            hosttree.rel_symlink(self.fs, f"{vf_dir}/iommu_group", group)
            hosttree.rel_symlink(self.fs, f"{group}/devices/{vf}", vf_dir)
            self.fs.mkdir(f"{vf_dir}/vfio-dev/vfio{self._group(address, index)}")
            # the VFs stay on the nvidia driver, which is their VFIO provider in this framework
            hosttree.rel_symlink(self.fs, f"{vf_dir}/driver", f"{pci.PCI_DRIVERS}/nvidia")
            hosttree.rel_symlink(self.fs, f"{pci.PCI_DRIVERS}/nvidia/{vf}", vf_dir)
        self.fs.write_text(f"{pf_dir}/sriov_numvfs", f"{total}\n")
        self._write_vf_files(gpu)
        return None

    def disable_vfs(self, address: str) -> str | None:
        self.log.append(f"sriov-manage -d {address}")
        pf_dir = self.fs.canonical(self._base(address))
        parent = pf_dir.rsplit("/", 1)[0]
        for index in range(self._attr(address, "sriov_numvfs")):
            vf = self.vf_address(address, index)
            for link in (
                f"{pci.PCI_DEVICES}/{vf}",
                f"{pf_dir}/virtfn{index}",
                f"{pci.PCI_DRIVERS}/nvidia/{vf}",
            ):
                self.fs.remove(link)
            group = f"/sys/kernel/iommu_groups/{self._group(address, index)}"
            for path in (f"{parent}/{vf}", group):
                _rmtree(self.fs.resolve(path, follow_last=False))
        self.fs.write_text(f"{pf_dir}/sriov_numvfs", "0\n")
        self.gpus[address].vgpus.clear()
        return None

    def mig_mode(self, address: str) -> tuple[bool, bool] | None:
        gpu = self.gpus.get(address)
        return None if gpu is None else (gpu.mig_current, gpu.mig_pending)

    def set_mig_mode(self, address: str, enabled: bool) -> str | None:
        self.log.append(f"nvidia-smi -i {address} -mig {int(enabled)}")
        gpu = self.gpus[address]
        if gpu.vgpus:
            return "In use by another client"
        gpu.mig_pending = enabled
        if not self.mig_persists:  # Hopper: the mode changes at once, no reset
            gpu.mig_current = enabled
        self._write_vf_files(gpu)
        return None

    # -- SysfsWriter: the VFs' current_vgpu_type --------------------------------------------------

    def write(self, path: str, value: str) -> None:
        self.log.append(f"{path} <- {value.strip()}")
        real = self.fs.canonical(path)
        if not real.endswith("/nvidia/current_vgpu_type") or not self.fs.exists(real):
            raise OSError(errno.EPERM, f"the vGPU host simulator does not model writes to {path}")
        vf = real.split("/")[-3]
        pf = self.fs.link_name(f"{pci.PCI_DEVICES}/{vf}/physfn") or ""
        gpu = self.gpus[pf]
        index = next(i for i in range(self._attr(pf, "sriov_numvfs")) if self.vf_address(pf, i) == vf)
        wanted = int(value.strip())
        if wanted == 0:
            gpu.vgpus.pop(index, None)
        elif index in gpu.vgpus or wanted not in {t.id for t in self._creatable(gpu, index)}:
            raise OSError(errno.EINVAL, f"{path}: type {wanted} is not creatable on {vf}")
        else:
            gpu.vgpus[index] = wanted
        self._write_vf_files(gpu)

    # -- a VM, and a reboot ---------------------------------------------------------------------

    def start_vm(self, pid: int, vf: str) -> None:
        """A QEMU process that holds the VF's VFIO group open, as a running VM does."""
        group = self.fs.link_name(f"{pci.PCI_DEVICES}/{vf}/iommu_group")
        self.fs.write_text(f"/proc/{pid}/comm", "qemu-kvm\n")
        self.fs.mkdir(f"/proc/{pid}/fd")
        self.fs.resolve(f"/proc/{pid}/fd").joinpath("20").symlink_to(f"/dev/vfio/{group}")

    def reboot(self) -> None:
        for address in self.gpus:
            self.disable_vfs(address)
            gpu = self.gpus[address]
            gpu.mig_current = gpu.mig_pending if self.mig_persists else False
            gpu.mig_pending = gpu.mig_current
        for entry in self.fs.listdir("/proc"):
            if entry.isdigit():
                _rmtree(self.fs.resolve(f"/proc/{entry}", follow_last=False))
        self.log.append("reboot")


def _rmtree(path: os.PathLike[str] | str) -> None:
    import shutil

    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
