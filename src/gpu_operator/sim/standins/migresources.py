"""What NVIDIA's device plugin advertises and GPU feature discovery labels for a node's GPUs in each
MIG strategy (none, single, mixed), as pure functions of the GPUs' MIG state (`migparted.GpuMig`).

Facts (NVIDIA/k8s-device-plugin v0.20.0; read for facts only):
- internal/rm/device_map.go, internal/rm/rm.go `AddDefaultResourcesToConfig`: `none`: every GPU is
  an `nvidia.com/gpu` device, MIG mode or not. `single`: MIG devices are `nvidia.com/gpu` too,
  GPUs with MIG on are not; it fails ("invalid MIG configuration") when a GPU with MIG on has no
  MIG device, when full GPUs and MIG devices are both there ("all devices on the node must be
  configured with the same migEnabled value") or the MIG devices differ ("more than one MIG device
  type present on node"); the plugin then exits (FAIL_ON_INIT_ERROR, default true) and advertises
  nothing. `mixed`: full GPUs as `nvidia.com/gpu`, each MIG device as `nvidia.com/mig-<profile>`
  (`+` in the profile written `.`), a GPU with MIG on and no MIG device only warned about.
- internal/resource/nvml-mig-device.go: a MIG device's ID (DEVICE_ID_STRATEGY=uuid) is its UUID, its
  name the profile with `+` as `.`, its attributes memory, multiprocessors, slices.gi, slices.ci,
  engines.copy/decoder/encoder/jpeg/ofa.
- internal/lm/mig-strategy.go, resource.go: GFD labels full GPUs as always, but GPUs with MIG on
  without sharing (`gpu.replicas` 0 unless a GPU of that name has MIG off); `single` with MIG
  devices: `nvidia.com/gpu.product` = `<product>-MIG-<profile>`, `gpu.count` the MIG devices,
  `gpu.replicas` 1, `gpu.sharing-strategy` none, and the MIG device's attributes as
  `nvidia.com/gpu.<attribute>` (overriding the full GPU's `gpu.memory`); an invalid single layout:
  `gpu.product` `<product>-MIG-INVALID`, `gpu.count`/`gpu.replicas`/`gpu.memory` 0,
  `gpu.sharing-strategy` empty; `mixed`: the same labels per profile under
  `nvidia.com/mig-<profile>.`; `nvidia.com/mig.strategy` for single and mixed.
- internal/rm/rm.go (mixed) and go-nvlib's pkg/nvlib/device/mig_profile.go as v0.20.0 vendors it:
  a resource per GPU-instance profile whose compute instance spans it (`<g>g.<n>gb`; a
  `<c>c.<g>g.<n>gb` share gets none), named `mig-` + the profile with `+` written `.`. The profile
  carries NVML's attribute suffix: `+me` (media extensions), `+me.all` (all media engines), `+gfx`
  (graphics), or `-me` (none): nvidia.com/mig-1g.10gb.me, mig-1g.10gb.me.all, mig-1g.24gb.gfx,
  mig-1g.24gb-me, each a resource of its own.
"""

from __future__ import annotations

import re

from gpu_operator.shapes import Shape, sanitise
from gpu_operator.sim.hardware.migparted import GpuMig, Instance
from gpu_operator.vocabulary import GPU_RESOURCE, NVIDIA

STRATEGIES = ("none", "single", "mixed")
MIG_RESOURCE_PREFIX = f"{NVIDIA}/mig-"


class PluginError(RuntimeError):
    """NVIDIA's device plugin refuses the node's MIG layout for its strategy (and exits)."""


# go-nvlib's MIG profile names: optional compute slices, GPU slices, memory, one attribute suffix
PROFILE_NAME = re.compile(r"(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?:\+(?:me|me\.all|gfx)|-me)?")


def resource_name(profile: str) -> str | None:
    """The device plugin's (mixed strategy) resource for MIG devices of `profile`; None for a
    compute-instance share (`1c.2g.20gb`), which it does not advertise. ValueError: not a profile name."""
    found = PROFILE_NAME.fullmatch(profile)
    if found is None:
        raise ValueError(
            f"{profile!r} is not a MIG profile name (<g>g.<n>gb, optionally +me, +me.all, +gfx or -me)"
        )
    if found.group("c") is not None:
        return None
    return f"{MIG_RESOURCE_PREFIX}{profile.replace('+', '.')}"


def mig_resource(inst: Instance) -> str:
    name = resource_name(inst.profile.name)
    assert name is not None, f"{inst.profile.name}: the simulator's instances span their GPU instance"
    return name


def advertised(strategy: str, gpus: list[GpuMig]) -> dict[str, list[tuple[str, int]]]:
    """Resource name -> (device ID, parent GPU index) the plugin advertises (a resource with no
    device is not registered); PluginError where the plugin refuses the layout."""
    if strategy not in STRATEGIES:
        raise PluginError(f"unknown MIG strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if strategy == "none":
        return {GPU_RESOURCE: [(g.uuid, g.index) for g in gpus]} if gpus else {}
    full = [(g.uuid, g.index) for g in gpus if not g.enabled]
    migs = [(g, i) for g in gpus if g.enabled for i in g.instances]
    out: dict[str, list[tuple[str, int]]] = {GPU_RESOURCE: full} if full else {}
    if strategy == "single":
        empty = [g.index for g in gpus if g.enabled and not g.instances]
        if empty:
            raise PluginError(f"invalid MIG configuration: device {empty[0]} has no MIG devices configured")
        if full and migs:
            raise PluginError("all devices on the node must be configured with the same migEnabled value")
        if len({i.profile.name for _, i in migs}) > 1:
            raise PluginError("invalid MIG configuration: more than one MIG device type present on node")
        if migs:
            out[GPU_RESOURCE] = [(g.mig_uuid(i), g.index) for g, i in migs]
        return out
    for g, i in migs:
        out.setdefault(mig_resource(i), []).append((g.mig_uuid(i), g.index))
    return out


def devices(strategy: str, gpus: list[GpuMig]) -> dict[str, list[str]]:
    """Resource name -> the device IDs the plugin advertises."""
    return {name: [d for d, _ in found] for name, found in advertised(strategy, gpus).items()}


def counts(strategy: str, gpus: list[GpuMig]) -> dict[str, int]:
    return {name: len(found) for name, found in advertised(strategy, gpus).items()}


def _mig_labels(prefix: str, product: str, inst: Instance, count: int) -> dict[str, str]:
    p = inst.profile
    values: dict[str, object] = {
        "product": f"{product}-MIG-{sanitise(p.resource_suffix)}",
        "count": count,
        "replicas": 1,
        "sharing-strategy": "none",
        "memory": p.memory_mb,
        "multiprocessors": p.multiprocessors,
        "slices.gi": p.slices,
        "slices.ci": p.slices,
        "engines.copy": p.copy,
        "engines.decoder": p.decoder,
        "engines.encoder": p.encoder,
        "engines.jpeg": p.jpeg,
        "engines.ofa": p.ofa,
    }
    return {f"{prefix}.{k}": str(v) for k, v in values.items()}


def gfd_labels(
    shape: Shape, strategy: str, gpus: list[GpuMig], timestamp: int | None = None, node: str = ""
) -> dict[str, str]:
    """GFD's labels for the host `node` of `shape` whose GPUs are in the MIG state `gpus`."""
    labels = shape.gfd_labels(strategy, timestamp, node)
    if not labels or not any(g.enabled for g in gpus):
        return labels
    gpu = GPU_RESOURCE
    if all(g.enabled for g in gpus):
        labels[f"{gpu}.replicas"] = "0"  # labelled without sharing: no GPU of that name has MIG off
    product = shape.gpu_product
    if strategy == "single":
        migs = [i for g in gpus for i in g.instances]
        if (
            any(g.enabled and not g.instances for g in gpus)
            or not all(g.enabled for g in gpus)
            or len({i.profile.name for i in migs}) != 1
        ):
            labels.update(
                {
                    f"{gpu}.product": f"{product}-MIG-INVALID",
                    f"{gpu}.count": "0",
                    f"{gpu}.replicas": "0",
                    f"{gpu}.sharing-strategy": "",
                    f"{gpu}.memory": "0",
                }
            )
            return labels
        labels.update(_mig_labels(gpu, product, migs[0], len(migs)))
    elif strategy == "mixed":
        by_profile: dict[str, list[Instance]] = {}
        for g in gpus:
            for i in g.instances:
                by_profile.setdefault(i.profile.resource_suffix, []).append(i)
        for suffix, insts in by_profile.items():
            labels.update(_mig_labels(f"{MIG_RESOURCE_PREFIX}{suffix}", product, insts[0], len(insts)))
    return labels
