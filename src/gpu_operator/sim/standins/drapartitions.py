"""Partitionable devices (KEP-4815) as NVIDIA's GPU kubelet plugin publishes them under its DynamicMIG
gate: pure functions from the node's GPUs (their devices as the plugin would publish them with MIG
off, and their MIG state) to the ResourceSlices' specs. `sim/standins/draplugin.py` calls them.

Facts (NVIDIA/k8s-dra-driver-gpu main at v0.5.0-dev, commit 22407113; read for facts only):
- pkg/featuregates/featuregates.go: DynamicMIG (alpha, off by default); the plugin refuses to start
  with DynamicMIG and PassthroughSupport, NVMLDeviceHealthCheck or MPSSupport together.
- driver.go `NewDriver`: DynamicMIG and no MIG-capable GPU on the node: the static form (one slice);
  otherwise MIG devices the plugin did not make are destroyed (`DestroyUnknownMIGDevices`, its
  checkpoint empty on a fresh node: all of them, MIG mode off where no MIG device is left), and on
  Kubernetes 1.35 or newer (`shouldUseSplitResourceSlices`) the pool is split: first one slice with
  only `sharedCounters`, then one slice of devices per GPU (PCI bus ID order, devices sorted by name)
  (`generateSplitResourceSlices`).
- nvlib.go `GetPerGpuAllocatableDevices`, `isDynamicMIGCapable`, `supportsMIGModeToggle`: a MIG-capable
  GPU of Hopper or newer publishes itself (MIG mode on or off) and every possible MIG placement of
  every profile with as many compute as GPU slices (`inspectMigProfilesAndPlacements`); a GPU that
  is not MIG-capable the static way.
- partitions.go: one counter set `gpu-<minor>-counter-set` per GPU; its counters are the largest
  value of each MIG capacity over all placements, named from the capacity in DNS form
  (multiprocessors, copy-engines, decoders, encoders, jpeg-engines, ofa-engines, memory), and
  `memory-slice-<i>` = 1 for each memory slice; the full GPU's capacity is those maxima and it
  consumes every counter; a MIG placement (`gpu-<minor>-mig-<profile>-<GI profile ID>-<start>`,
  the static device's attributes without uuid, its capacity without memory slices) consumes its
  capacities and its placement's memory slices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpu_operator.sim.hardware.migparted import GpuMig, Instance
from gpu_operator.sim.hardware.migprofiles import model
from gpu_operator.sim.standins import dramig
from gpu_operator.sim.standins.drahealth import gate_on

GATE = "DynamicMIG"
EXCLUSIVE = ("PassthroughSupport", "NVMLDeviceHealthCheck", "MPSSupport")
HOPPER_OR_NEWER = ("Hopper", "Blackwell")


class PluginRefuses(RuntimeError):
    """The plugin does not start with these gates (it publishes nothing)."""


def dynamic(env: Mapping[str, str]) -> bool:
    """Whether the plugin's FEATURE_GATES turn DynamicMIG on; PluginRefuses for a forbidden pair."""
    if not gate_on(env, GATE):
        return False
    for other in EXCLUSIVE:
        if gate_on(env, other):
            raise PluginRefuses(f"feature gate {GATE} is currently mutually exclusive with {other}")
    return True


def capable(gpu: GpuMig, device: dict[str, Any]) -> bool:
    """isDynamicMIGCapable: a MIG-capable GPU, Hopper or newer (Ampere only with MIG on: not played)."""
    return (
        model(gpu.device_id) is not None and device["attributes"]["architecture"]["string"] in HOPPER_OR_NEWER
    )


def dns_name(name: str) -> str:
    """The driver's camelToDNSName: copyEngines -> copy-engines."""
    return re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name)).lower()


def _counters(capacity: Mapping[str, dict[str, str]], start: int, size: int) -> dict[str, dict[str, str]]:
    out = {dns_name(k): dict(v) for k, v in capacity.items()}
    out.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return out


def partitions(gpu: GpuMig, device: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One MIG-capable GPU: its counter set and its devices (the full GPU and every placement)."""
    found = model(gpu.device_id)
    assert found is not None
    counter_set = f"{device['name']}-counter-set"
    placements = []
    maxima: dict[str, int] = {}
    for profile in found.profiles:
        values = dramig.capacity_values(profile)
        maxima.update({k: max(maxima.get(k, 0), v) for k, v in values.items()})
        capacity = {k: {"value": dramig.quantity(v)} for k, v in values.items()}
        attributes = {k: v for k, v in device["attributes"].items() if k in dramig.PARENT_ATTRIBUTES}
        attributes.update(
            {
                "type": {"string": dramig.MIG_TYPE},
                "parentUUID": device["attributes"]["uuid"],
                "profile": {"string": profile.name},
            }
        )
        for start in profile.starts:
            placements.append(
                {
                    "name": dramig.device_name(gpu.index, Instance(profile, start, gi=0)),
                    "attributes": attributes,
                    "capacity": capacity,
                    "consumesCounters": [
                        {
                            "counterSet": counter_set,
                            "counters": _counters(capacity, start, profile.memory_slices),
                        }
                    ],
                }
            )
    slices = max(p.memory_slices for p in found.profiles)
    capacity = {k: {"value": dramig.quantity(v)} for k, v in maxima.items()}
    counters = _counters(capacity, 0, slices)
    full = {
        "name": device["name"],
        "attributes": device["attributes"],
        "capacity": capacity,
        "consumesCounters": [{"counterSet": counter_set, "counters": counters}],
    }
    devices = sorted([full, *placements], key=lambda d: d["name"])
    return {"name": counter_set, "counters": counters}, devices


def split(gpus: list[GpuMig], full: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The pool's slices' contents (`sharedCounters` or `devices`), the counters' slice first; None
    where no GPU is MIG-capable (the plugin then publishes the static form). `full`: the GPUs'
    devices as published with MIG off, by index."""
    by_index = {g.index: g for g in gpus}
    pairs = [(by_index.get(int(d["name"].removeprefix("gpu-"))), d) for d in full]
    if not any(g is not None and capable(g, d) for g, d in pairs):
        return None
    counter_sets, device_slices = [], []
    for gpu, device in pairs:
        if gpu is not None and capable(gpu, device):
            counter_set, devices = partitions(gpu, device)
            counter_sets.append(counter_set)
            device_slices.append({"devices": devices})
        else:
            device_slices.append({"devices": [device]})
    return [{"sharedCounters": counter_sets}, *device_slices]


def destroyed(gpus: list[GpuMig]) -> list[GpuMig]:
    """The GPUs once the plugin destroyed the MIG devices it did not make (MIG mode off)."""
    return [GpuMig(g.index, g.device_id, g.uuid) for g in gpus]
