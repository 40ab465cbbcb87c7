"""The static MIG devices NVIDIA's GPU kubelet plugin publishes in its ResourceSlice, as pure
functions of the GPUs' MIG state (`migparted.GpuMig`, what the MIG manager's stand-in or a test left
on the node's GPUs, `sim/hardware/mighw.py`); the DRA kubelet plugin's stand-in (`sim/standins/draplugin.py`) calls it.

Facts (NVIDIA/k8s-dra-driver-gpu, v0.4.0 and main at v0.5.0-dev, commit 22407113; read for facts only):
- cmd/gpu-kubelet-plugin/nvlib.go `GetPerGpuAllocatableDevices` (called once, when the plugin
  starts): a GPU with MIG mode off is one device `gpu-<minor>`; a GPU with MIG mode on is not
  published itself, each of its MIG devices is (static MIG: made beforehand, e.g. by mig-parted); MIG
  on and no MIG device: nothing for that GPU (a warning in the plugin's log).
- cmd/gpu-kubelet-plugin/mig.go `ToCanonicalName`: a MIG device is named
  `gpu-<parent minor>-mig-<profile without dots, RFC 1123: `+` -> `-`>-<GI profile ID>-<placement
  start>`; `CommonAttributesMig`: type `mig`, parentUUID, profile (go-nvlib's name, e.g. 1g.10gb),
  productName, brand, architecture, cudaComputeCapability, driverVersion, cudaDriverVersion and
  the parent's resource.kubernetes.io/pciBusID; deviceinfo.go `MigDeviceInfo.GetDevice` adds uuid
  (the MIG device's); `CommonCapacitiesMig`: multiprocessors, copyEngines, decoders, encoders,
  jpegEngines, ofaEngines, memory (the profile's MiB in bytes); and one `memorySlice<i>` = 1 per
  memory slice of its GPU-instance placement.
- cmd/gpu-kubelet-plugin/types.go: device type `mig` (static); `migdyn` (DynamicMIG) is never a
  static device's.
- The GPU instance profile IDs (NVML's `GpuInstanceProfileInfo.Id`, `nvidia-smi mig -lgip`) of the
  H100 80GB, NVIDIA's MIG user guide ("H100 MIG profiles"): 1g.10gb 19, 1g.10gb+me 20, 1g.20gb 15,
  2g.20gb 14, 3g.40gb 9, 4g.40gb 5, 7g.80gb 0 (the driver's own examples name gpu-2-mig-1g24gb-19-0
  and gpu-1-mig-2g47gb-14-0, partitions.go and device_state.go); by kind the same on the A100 40GB,
  B200 and GB200 (1g.5gb/1g.23gb 19, their +me 20, 1g.45gb/1g.47gb 15, ...); a 4-slot model's
  profiles carry their own (the RTX PRO 6000's 1g.24gb 14, 1g.24gb+gfx 47, ..., sim/hardware/migprofiles.py). Placements are in memory
  slices (8 on an H100): a 1g.10gb at slot s spans slice s, a 2g.20gb 2 slices, a 3g/4g 4, a 7g 8.
"""

from __future__ import annotations

import re
from typing import Any

from gpu_operator.sim.hardware.migparted import GpuMig, Instance
from gpu_operator.sim.hardware.migprofiles import Profile

MIG_TYPE = "mig"
# GPU instance profile IDs by kind (compute slices, memory slices, media extensions): the same on
# every model of 7 compute slots (the guide's `-lgip` tables for the A100, H100, B200 and GB200):
# 1g 19, 1g+me 20, 1g with two memory slices 15, 2g 14, 3g 9, 4g 5, 7g 0.
GI_PROFILE_IDS = {
    (1, 1, False): 19,
    (1, 1, True): 20,
    (1, 2, False): 15,
    (2, 2, False): 14,
    (3, 4, False): 9,
    (4, 4, False): 5,
    (7, 8, False): 0,
}
# the attributes a MIG device takes from its parent GPU (CommonAttributesMig)
PARENT_ATTRIBUTES = (
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
)
_BINARY = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)


def quantity(value: int) -> str:
    """An integer as Kubernetes writes a BinarySI quantity (10737418240 -> 10Gi; 16 -> 16)."""
    for suffix, unit in _BINARY:
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def rfc1123(name: str) -> str:
    """The driver's toRFC1123Compliant: lower case, anything but [a-z0-9-.] as `-`, trimmed."""
    return re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").removesuffix(".")[:253]


def gi_profile_id(profile: Profile) -> int:
    if (
        profile.profile_id is not None
    ):  # the model's own table (the RTX PRO 6000's, sim/hardware/migprofiles.py)
        return profile.profile_id
    found = GI_PROFILE_IDS.get((profile.slices, profile.memory_slices, "+me" in profile.name))
    if found is None:
        raise KeyError(
            f"no GPU instance profile ID known for MIG profile {profile.name!r}: add it to GI_PROFILE_IDS"
        )
    return found


def device_name(parent_minor: int, inst: Instance) -> str:
    return (
        f"gpu-{parent_minor}-mig-{rfc1123(inst.profile.name.replace('.', ''))}-"
        f"{gi_profile_id(inst.profile)}-{inst.start}"
    )


def capacity_values(profile: Profile) -> dict[str, int]:
    """CommonCapacitiesMig: the profile's engines and memory (bytes)."""
    return {
        "multiprocessors": profile.multiprocessors,
        "copyEngines": profile.copy,
        "decoders": profile.decoder,
        "encoders": profile.encoder,
        "jpegEngines": profile.jpeg,
        "ofaEngines": profile.ofa,
        "memory": profile.memory_mb * 1024 * 1024,
    }


def capacity(profile: Profile, start: int) -> dict[str, dict[str, str]]:
    """The static MIG device's capacity: the profile's engines and memory, and its memory slices."""
    values = capacity_values(profile)
    values.update({f"memorySlice{i}": 1 for i in range(start, start + profile.memory_slices)})
    return {k: {"value": quantity(v)} for k, v in values.items()}


def mig_devices(gpu: GpuMig, parent: dict[str, Any]) -> list[dict[str, Any]]:
    """The static MIG devices of `gpu` (MIG mode on) as the plugin publishes them; `parent`: the
    full GPU's device as it would be published (its attributes are the MIG devices' common ones)."""
    common = {k: v for k, v in parent["attributes"].items() if k in PARENT_ATTRIBUTES}
    out = []
    for inst in gpu.instances:
        attributes = {
            **common,
            "type": {"string": MIG_TYPE},
            "uuid": {"string": gpu.mig_uuid(inst)},
            "parentUUID": parent["attributes"]["uuid"],
            "profile": {"string": inst.profile.name},
        }
        out.append(
            {
                "name": device_name(gpu.index, inst),
                "attributes": attributes,
                "capacity": capacity(inst.profile, inst.start),
            }
        )
    return sorted(out, key=lambda d: d["name"])
