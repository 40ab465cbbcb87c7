"""A vGPU host's hardware and NVIDIA's vGPU manager, played over a host tree (the simulator's
vm-vgpu nodes, the node agents' unit tests): what `sriov-manage -e/-d` does to sysfs (VFs appear
under the PF, each with `physfn`, its own IOMMU group, `vfio-dev/`, and the vendor-specific VFIO
`nvidia/` files), what a write to a VF's `nvidia/current_vgpu_type` does (only a type its
`creatable_vgpu_types` lists; 0 removes the vGPU), MIG mode as nvidia-smi sets and reports it, and
a reboot: VFs gone, every vGPU gone, processes gone, MIG mode back to what the GPU keeps (Ampere
keeps the pending mode in its InfoROM; Hopper keeps none), files on disk kept.

What the GPU can create follows one small model, not a product's table: with MIG off a GPU hosts
time-sliced vGPUs of one type while their framebuffer fits; with MIG on, MIG-backed types while
their GPU slices fit. A VF that has a vGPU lists no creatable types; a free VF lists what still fits.

The vGPUs live in the tree (each VF's current_vgpu_type); MIG mode lives on the GPU, in no file of
the host: given `state` (a file beside the tree, like the fault book), it is kept there, so that a
pass in one process and a reboot in another (`gpu-operator sim fault --reboot`) see one GPU.

`as_vgpu_host` turns a shape's host (`realspec.host_spec`) into such a host as it boots: the vGPU
manager's module, SR-IOV capable PFs with no VF, NVSwitches and Fabric Manager's config with its
package default, `sriov-manage`; the VF count, routing and type ids are the h100-vgpu fixture's
values (tests/fixtures/hosts/h100-vgpu.yaml), not a product's.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import hosttree

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

    def __init__(self, fs: HostFS, spec: dict[str, Any], state: Path | None = None) -> None:
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
        self.state = state
        self._load()

    # -- what the GPUs hold across processes --------------------------------------------------

    def _load(self) -> None:
        """The vGPUs from the tree, MIG mode from the state file (MIG off where it has none)."""
        for gpu in self.gpus.values():
            for index in range(self._attr(gpu.address, "sriov_numvfs")):
                vf = self._base(self.vf_address(gpu.address, index))
                current = (self.fs.read_value(f"{vf}/nvidia/current_vgpu_type") or "0").strip()
                if current.isdigit() and int(current):
                    gpu.vgpus[index] = int(current)
        if self.state is None or not self.state.is_file():
            return
        for address, mig in json.loads(self.state.read_text()).items():
            if address in self.gpus:
                self.gpus[address].mig_current, self.gpus[address].mig_pending = bool(mig[0]), bool(mig[1])

    def _save(self) -> None:
        if self.state is None:
            return
        self.state.parent.mkdir(parents=True, exist_ok=True)
        mig = {a: [g.mig_current, g.mig_pending] for a, g in sorted(self.gpus.items())}
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(mig, indent=1) + "\n")
        tmp.replace(self.state)

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
        self._save()
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
        self._save()
        self.log.append("reboot")


def _rmtree(path: os.PathLike[str] | str) -> None:
    import shutil

    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


# -- a shape's host as a vGPU host ------------------------------------------------------------

VGPU_STATE = "vgpu.json"  # the GPUs' MIG mode, beside a node's host tree (sim/hardware/faults.py's NodeHosts)
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
NVSWITCH = {"vendor": "10de", "device": "22a3", "class": "068000", "driver": "nvidia"}
NVSWITCHES = {"2330": 4}  # HGX H100: four NVSwitch chips on the board
# The h100-vgpu fixture's values (tests/fixtures/hosts/h100-vgpu.yaml): a model, not a product's table.
SRIOV = {"sriov_totalvfs": 16, "sriov_numvfs": 0, "sriov_offset": 4, "sriov_stride": 1}
HARDWARE: dict[str, dict[str, Any]] = {
    "2330": {
        "mig_persists_reboot": False,  # Hopper: MIG mode is the driver's, gone after a reset or reboot
        "gpu_slices": 7,
        "framebuffer_gb": 80,
        "types": [
            {"id": 1057, "name": "NVIDIA H100XM-80C", "gb": 80},
            {"id": 1058, "name": "NVIDIA H100XM-40C", "gb": 40},
            {"id": 1059, "name": "NVIDIA H100XM-20C", "gb": 20},
            {"id": 1060, "name": "NVIDIA H100XM-10C", "gb": 10},
            {"id": 1061, "name": "NVIDIA H100XM-1-10C", "gb": 10, "g": 1},
            {"id": 1062, "name": "NVIDIA H100XM-3-40C", "gb": 40, "g": 3},
            {"id": 1063, "name": "NVIDIA H100XM-7-80C", "gb": 80, "g": 7},
        ],
    },
}
_SRIOV_MANAGE = """#!/bin/sh
# NVIDIA's sriov-manage (shipped with the vGPU manager): played by the simulator's vGPU host model.
echo "sriov-manage is played by gpu_operator.sim.hardware.vgpuhw" >&2
exit 1
"""


def is_vgpu_host(spec: dict[str, Any]) -> bool:
    return bool(spec.get("vgpu"))


def as_vgpu_host(spec: dict[str, Any]) -> dict[str, Any]:
    """A shape's host (`realspec.host_spec`, the driver on the host) as a vGPU host after a boot:
    the vGPU manager's module loaded, its GPUs SR-IOV capable with no VF enabled, the board's
    NVSwitches and Fabric Manager's package config (FABRIC_MODE=0), sriov-manage."""
    gpus = [d for d in spec["devices"] if d["vendor"] == "10de" and str(d["class"]).startswith("03")]
    device = str(gpus[0]["device"]).lower() if gpus else ""
    if device not in HARDWARE:
        raise ValueError(
            f"no vGPU host model for GPU 10de:{device or '?'} (sim/hardware/vgpuhw.py knows "
            f"{', '.join(f'10de:{d}' for d in HARDWARE)})"
        )
    for gpu in gpus:
        gpu["attributes"] = {**gpu.get("attributes", {}), **SRIOV}
    spec["devices"] += [
        {**NVSWITCH, "address": f"0000:{5 + i:02x}:00.0"} for i in range(NVSWITCHES.get(device, 0))
    ]
    spec["modules"] = [*spec["modules"], "nvidia_vgpu_vfio", "vfio", "vfio_iommu_type1", "iommufd"]
    spec["files"][FM_CONFIG] = (
        "# Fabric Manager configuration (the package's file, shortened)\n"
        "LOG_LEVEL=4\nFABRIC_MODE=0\nFABRIC_MODE_RESTART=0\n"
    )
    spec["executables"] = {**spec.get("executables", {}), SRIOV_MANAGE: _SRIOV_MANAGE}
    spec["vgpu"] = HARDWARE[device]
    return spec
