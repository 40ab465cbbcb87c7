"""mig-parted's part of a MIG change, as pure functions: its config file, which entries of the
selected config apply to which GPU, and the GPUs' MIG state once applied (checked against the
model's profiles, `migprofiles`).

Facts (NVIDIA/mig-parted v0.15.0, the version the operator deploys; read for facts only):
- api/spec/v1: the file is `version: v1` and `mig-configs: {<name>: [<entry>...]}`; an entry has
  `devices` (`all` or a list of GPU indices), optional `device-filter` (PCI device IDs such as
  0x233010DE, one or a list), `mig-enabled` and `mig-devices` ({profile: count}).
- cmd/nvidia-mig-parted/assert/assert.go `WalkSelectedMigConfigForEachGPU`: every entry in order,
  each applied to every GPU (NVML index) its filter and `devices` match; a GPU no entry matches is
  left as it is.
- `assert --valid-config` fails when the selected name is not in the file (the MIG manager then
  writes `failed` at once); `apply` fails when the driver refuses an instance (a profile the GPU
  does not have, more than fit): the manager writes `failed` after pausing its clients.
- `mig-enabled: false` removes every instance and turns MIG mode off; `mig-enabled: true` with
  `mig-devices: {}` (all-enabled) leaves MIG on and no instance.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.sim.hardware import migprofiles
from gpu_operator.sim.hardware.migprofiles import LayoutError, Profile


class MIGConfigError(ValueError):
    """The config file or the selected config is wrong; the message names the field and the fix."""


@dataclass(frozen=True)
class Entry:
    devices: tuple[int, ...] | None  # None: all
    device_filter: tuple[str, ...] | None  # normalised PCI device IDs (4 hex digits), None: any
    mig_enabled: bool
    mig_devices: dict[str, int]


@dataclass(frozen=True)
class Instance:
    profile: Profile
    start: int
    gi: int
    ci: int = 0


@dataclass(frozen=True)
class GpuMig:
    """One GPU as NVML sees it: its index, PCI device ID, UUID, MIG mode and instances."""

    index: int
    device_id: str
    uuid: str
    enabled: bool = False
    instances: tuple[Instance, ...] = ()

    def mig_uuid(self, inst: Instance) -> str:
        """A MIG device's UUID, NVIDIA's `MIG-<uuid>` form, stable per GPU and instance."""
        return f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.uuid}/gi{inst.gi}/ci{inst.ci}')}"

    def layout(self) -> tuple[bool, dict[str, int]]:
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.profile.name] = counts.get(inst.profile.name, 0) + 1
        return self.enabled, counts


def _device_id(raw: Any, where: str) -> str:
    text = str(raw).strip().lower().removeprefix("0x")
    if len(text) == 8 and text.endswith("10de"):
        return text[:4]
    if len(text) == 4 and all(c in "0123456789abcdef" for c in text):
        return text
    raise MIGConfigError(
        f"{where}: {raw!r} is not a PCI device ID: write it as 0x<device><vendor>, e.g. 0x233010DE"
    )


def parse(text: str) -> dict[str, list[Entry]]:
    """mig-parted's config file: {config name: entries}."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise MIGConfigError(f"the MIG config file is not YAML ({err}); fix its config.yaml") from err
    if not isinstance(raw, dict) or raw.get("version") != "v1":
        raise MIGConfigError("the MIG config file must have `version: v1` (mig-parted's spec v1)")
    configs = raw.get("mig-configs")
    if not isinstance(configs, dict):
        raise MIGConfigError("the MIG config file must have `mig-configs`: a map of config name to entries")
    out: dict[str, list[Entry]] = {}
    for name, entries in configs.items():
        if not isinstance(entries, list):
            raise MIGConfigError(
                f"mig-configs.{name}: must be a list of entries (devices, mig-enabled, mig-devices)"
            )
        out[str(name)] = [_entry(e, f"mig-configs.{name}[{i}]") for i, e in enumerate(entries)]
    return out


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise MIGConfigError(f"{where}: must be a map with devices, mig-enabled and mig-devices")
    devices = raw.get("devices")
    if devices == "all":
        indices = None
    elif isinstance(devices, list) and all(isinstance(d, int) for d in devices):
        indices = tuple(devices)
    else:
        raise MIGConfigError(
            f"{where}.devices: {devices!r}: write `all` or a list of GPU indices, e.g. [0, 1]"
        )
    if not isinstance(raw.get("mig-enabled"), bool):
        raise MIGConfigError(f"{where}.mig-enabled: must be true or false")
    filt = raw.get("device-filter")
    filters = None
    if filt is not None:
        items = filt if isinstance(filt, list) else [filt]
        filters = tuple(_device_id(f, f"{where}.device-filter") for f in items)
    mig_devices = raw.get("mig-devices") or {}
    if not isinstance(mig_devices, dict) or not all(
        isinstance(v, int) and v >= 0 for v in mig_devices.values()
    ):
        raise MIGConfigError(f"{where}.mig-devices: must map profile names to counts, e.g. {{1g.10gb: 7}}")
    if mig_devices and not raw["mig-enabled"]:
        raise MIGConfigError(f"{where}: mig-devices given with mig-enabled: false; set mig-enabled: true")
    return Entry(indices, filters, bool(raw["mig-enabled"]), {str(k): int(v) for k, v in mig_devices.items()})


def select(configs: dict[str, list[Entry]], name: str) -> list[Entry]:
    """The selected config (`assert --valid-config`)."""
    if not name:
        raise MIGConfigError("nvidia.com/mig.config is empty: label the node with one of the configs")
    if name not in configs:
        raise MIGConfigError(
            f"nvidia.com/mig.config={name}: no such config in the MIG config file "
            f"(it has: {', '.join(sorted(configs))})"
        )
    return configs[name]


def wanted(entries: list[Entry], gpus: list[GpuMig]) -> list[tuple[bool, dict[str, int]] | None]:
    """Per GPU the (MIG mode, {profile: count}) the entries ask for; None: no entry matches it."""
    out: list[tuple[bool, dict[str, int]] | None] = [None] * len(gpus)
    for entry in entries:
        for i, gpu in enumerate(gpus):
            if entry.device_filter is not None and gpu.device_id not in entry.device_filter:
                continue
            if entry.devices is not None and gpu.index not in entry.devices:
                continue
            out[i] = (entry.mig_enabled, {p: n for p, n in entry.mig_devices.items() if n})
    return out


def applied(entries: list[Entry], gpus: list[GpuMig]) -> bool:
    """Whether the GPUs already are as the entries ask (`assert`: nothing to do)."""
    return all(w is None or w == g.layout() for w, g in zip(wanted(entries, gpus), gpus, strict=True))


def mode_change(entries: list[Entry], gpus: list[GpuMig]) -> bool:
    """Whether a GPU's MIG mode changes (`assert --mode-only` fails): a GPU reset is needed."""
    return any(w is not None and w[0] != g.enabled for w, g in zip(wanted(entries, gpus), gpus, strict=True))


def apply(entries: list[Entry], gpus: list[GpuMig]) -> list[GpuMig]:
    """The GPUs once `apply` ran (LayoutError: the driver refused, nothing of that GPU changed)."""
    out: list[GpuMig] = []
    for want, gpu in zip(wanted(entries, gpus), gpus, strict=True):
        if want is None:
            out.append(gpu)
            continue
        enabled, counts = want
        model = migprofiles.model(gpu.device_id)
        if model is None and enabled:
            raise LayoutError(f"GPU {gpu.index} (PCI device {gpu.device_id}) does not support MIG")
        if not enabled or model is None:
            out.append(GpuMig(gpu.index, gpu.device_id, gpu.uuid, False, ()))
            continue
        placed = migprofiles.place(model, counts)
        instances = sorted(
            (Instance(p, s, migprofiles.gi_id(p, s, model.compute_slots)) for p, s in placed),
            key=lambda i: i.gi,
        )
        out.append(GpuMig(gpu.index, gpu.device_id, gpu.uuid, True, tuple(instances)))
    return out


def to_json(gpus: list[GpuMig]) -> list[dict[str, Any]]:
    return [
        {
            "index": g.index,
            "device_id": g.device_id,
            "uuid": g.uuid,
            "enabled": g.enabled,
            "instances": [{"profile": i.profile.name, "start": i.start} for i in g.instances],
        }
        for g in gpus
    ]


def from_json(raw: list[dict[str, Any]]) -> list[GpuMig]:
    out = []
    for g in raw:
        model = migprofiles.model(g["device_id"])
        instances = []
        for i in g.get("instances") or []:
            profile = model.profile(i["profile"]) if model else None
            if model is None or profile is None:
                raise LayoutError(
                    f"GPU {g['index']}: unknown MIG profile {i['profile']!r} in the saved state"
                )
            start = int(i["start"])
            instances.append(Instance(profile, start, migprofiles.gi_id(profile, start, model.compute_slots)))
        out.append(
            GpuMig(
                int(g["index"]),
                str(g["device_id"]),
                str(g["uuid"]),
                bool(g["enabled"]),
                tuple(sorted(instances, key=lambda x: x.gi)),
            )
        )
    return out
