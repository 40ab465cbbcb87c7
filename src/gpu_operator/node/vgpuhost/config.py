"""The desired vGPU host state of this node, from the vGPU device manager's config file.

The file is NVIDIA's vgpu-device-manager format (api/spec/v1/spec.go): `version: v1` and
`vgpu-configs`, a map from a config name to a list of entries, each with `devices` ("all" or GPU
indices), an optional `device-filter` (PCI ids as 0x<device><vendor>) and `vgpu-devices`, a map
from a vGPU type name to a count. The node label nvidia.com/vgpu.config picks the config, else
the pod's DEFAULT_VGPU_CONFIG. GPU indices count the NVIDIA GPUs (physical functions, not VFs) in
PCI address order, as the device manager's sysfs backend numbers them. Type names follow its
grammar (pkg/types/vgpu_type.go): time-sliced <gpu>-<GB><series>, MIG-backed
<gpu>-<G>-<GB><series>[ME|NOME|MEALL|GFX]; a GPU given a MIG-backed type needs MIG mode on, as
the device manager decides in ToMigConfigSpecSlice.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, Field

from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import HostFS

TIME_SLICED = re.compile(r"^[A-Z0-9]+(-[a-zA-Z]+)*-(0|[1-9][0-9]*)[ABCQ]$")
MIG_BACKED = re.compile(r"^[A-Z0-9]+-[1-9]-(0|[1-9][0-9]*)[ABCQ](ME|NOME|MEALL|GFX)?$")


class VGPUConfigError(ValueError):
    """The vGPU config (or the policy's part of the desired state) is unusable; names the field and the fix."""


class GpuDesired(BaseModel):
    """One GPU's wanted state: its VFs enabled, a vGPU type on each of the first VFs, MIG mode."""

    address: str
    index: int
    vfs: int | None = Field(
        default=None, description="VFs to enable: all the PF offers, as `sriov-manage -e` does"
    )
    vf_types: list[str] = Field(
        default_factory=list, description="vGPU type of virtfn0, virtfn1, ... in order"
    )
    mig: bool = False
    field: str = Field(default="", description="the config entry this GPU's state came from")


class DesiredVGPUConfig(BaseModel):
    """What this node should have after every boot, and where each part came from."""

    config: str
    source: str
    gpus: list[GpuDesired] = Field(default_factory=list)
    fabric_mode: int | None = None
    fabric_mode_source: str = ""


def is_mig_backed(vgpu_type: str) -> bool:
    return MIG_BACKED.match(vgpu_type) is not None


def check_type_name(vgpu_type: str, where: str) -> None:
    if not (TIME_SLICED.match(vgpu_type) or MIG_BACKED.match(vgpu_type)):
        raise VGPUConfigError(
            f"{where}: {vgpu_type!r} is not a vGPU type name; write it as the driver names it without "
            "the product prefix, time-sliced like H100XM-20C or MIG-backed like H100XM-1-10C"
        )


def vgpu_gpus(fs: HostFS) -> list[pci.PciFunction]:
    """The NVIDIA GPUs the config's indices count: physical functions, in PCI address order."""
    return sorted((f for f in pci.scan(fs, pci.NVIDIA_VENDOR) if f.is_gpu), key=lambda f: f.address)


def _entries(spec: Any, name: str, source: str) -> list[dict[str, Any]]:
    if not isinstance(spec, dict) or spec.get("version") != "v1":
        raise VGPUConfigError(f"{source}: `version: v1` is required (NVIDIA's vgpu-device-manager format)")
    configs = spec.get("vgpu-configs")
    if not isinstance(configs, dict) or not configs:
        raise VGPUConfigError(f"{source}: `vgpu-configs` must map config names to lists of entries")
    if name not in configs:
        raise VGPUConfigError(
            f"{source}: no config {name!r} under vgpu-configs (it has: {', '.join(sorted(configs))}); "
            "set the node label nvidia.com/vgpu.config to one of them"
        )
    entries = configs[name]
    if not isinstance(entries, list) or not entries:
        raise VGPUConfigError(f"{source}: vgpu-configs.{name} must be a non-empty list of entries")
    return entries


def _selects(entry: dict[str, Any], gpu: pci.PciFunction, index: int, where: str) -> bool:
    devices = entry.get("devices")
    if devices != "all" and not (isinstance(devices, list) and all(isinstance(d, int) for d in devices)):
        raise VGPUConfigError(f"{where}.devices: write `all` or a list of GPU indices like [0, 1]")
    if devices != "all" and index not in devices:
        return False
    wanted = entry.get("device-filter")
    if wanted is None:
        return True
    ids = [wanted] if isinstance(wanted, str) else wanted
    this = f"0x{gpu.device}{gpu.vendor}".lower()
    return any(str(i).lower() == this for i in ids)


def desired_from_config(
    fs: HostFS,
    text: str,
    name: str,
    *,
    source: str,
    chosen_by: str,
    fabric_mode: int | None = None,
    fabric_mode_source: str = "",
) -> DesiredVGPUConfig:
    """The desired state for this host's GPUs under config `name` of the file `text`."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise VGPUConfigError(f"{source}: not YAML: {err}") from None
    entries = _entries(spec, name, source)
    gpus = vgpu_gpus(fs)
    out: dict[str, GpuDesired] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: vgpu-configs.{name}[{i}]"
        if not isinstance(entry, dict) or "vgpu-devices" not in entry or "devices" not in entry:
            raise VGPUConfigError(f"{where}: each entry needs `devices` and `vgpu-devices`")
        devices = entry["vgpu-devices"] or {}
        if not isinstance(devices, dict):
            raise VGPUConfigError(
                f"{where}.vgpu-devices: map vGPU type names to counts, like {{H100XM-20C: 4}}"
            )
        vf_types: list[str] = []
        for vgpu_type, count in devices.items():
            check_type_name(str(vgpu_type), f"{where}.vgpu-devices")
            if not isinstance(count, int) or count < 0:
                raise VGPUConfigError(
                    f"{where}.vgpu-devices.{vgpu_type}: the count must be a whole number >= 0"
                )
            vf_types += [str(vgpu_type)] * count
        for index, gpu in enumerate(gpus):
            if gpu.address in out or not _selects(entry, gpu, index, where):
                continue  # the first entry that selects a GPU decides for it
            out[gpu.address] = GpuDesired(
                address=gpu.address,
                index=index,
                vfs=gpu.sriov_totalvfs,
                vf_types=vf_types,
                mig=any(is_mig_backed(t) for t in vf_types),
                field=f"{where}.vgpu-devices",
            )
    return DesiredVGPUConfig(
        config=name,
        source=f"{source} ({chosen_by})",
        gpus=sorted(out.values(), key=lambda g: g.index),
        fabric_mode=fabric_mode,
        fabric_mode_source=fabric_mode_source,
    )
