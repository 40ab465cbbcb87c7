"""GPU sharing (time-slicing, MPS) as NVIDIA's device plugin and GPU feature discovery read it from
the plugin's config file, and which config file NVIDIA's config-manager picks for a node: pure
functions, used by the kwok nodes' stand-ins (`sim/standins/kubeletdp.py`, `sim/standins/gfd.py`, through
`sim/standins/pluginconfig.py`) and the real node's device-plugin stand-in (`sim/standins/deviceplugin.py`).

Facts (NVIDIA/k8s-device-plugin v0.20.0; read for facts only):
- cmd/config-manager/main.go `updateConfigName`: the node label's value names a file of
  CONFIG_FILE_SRCDIR (the mounted ConfigMap: one file per key, `..`-prefixed entries skipped); an
  unknown name fails ("specified config ... does not exist"); no value: DEFAULT_CONFIG (must exist);
  else FALLBACK_STRATEGIES in order: `named` (a key `default`), `single` (the only key), `empty`
  (no config: /dev/null). No key at all fails ("no configuration files available").
- api/config/v1/config.go `parseConfigFrom`: YAML; `version` empty means v1, another fails ("unknown
  version"); an empty file (/dev/null) is the default config.
- api/config/v1/replicas.go: `sharing.timeSlicing` / `sharing.mps` each `renameByDefault` (default
  false), `failRequestsGreaterThanOne`, `resources` (required, non-empty); a resource needs `name`
  and `replicas` >= 2; `devices` defaults to `all`. config.go `DisableResourceNamingInConfig`
  (called by the plugin, GFD and the MPS daemon): `rename` other than `<name>.shared` with
  renameByDefault, or any rename without it, is ignored; `devices` other than all is ignored.
  MPS's failRequestsGreaterThanOne defaults to true.
- api/config/v1/sharing.go: the strategy is `mps` when mps has a resource with replicas > 1, else
  `time-slicing` when timeSlicing has, else `none`; the replicated resources are mps's when mps is
  set, else timeSlicing's.
- internal/rm/device_map.go `updateDeviceMapWithReplicas`, devices.go `NewAnnotatedID`: each device
  of a replicated resource becomes `replicas` devices `<ID>::<i>` (i from 0) under `rename` or
  the name; rm.go `ValidateRequest`: more than one replica in one request fails when
  failRequestsGreaterThanOne; Allocate strips the `::<i>` (server.go).
- cmd/nvidia-device-plugin/main.go `validateFlags`: MPS with the mixed MIG strategy fails.
- internal/lm/resource.go: per resource `<name>.replicas` (the replicas, 1 unreplicated),
  `<name>.sharing-strategy` (the strategy where replicas > 1, else none), `<name>.product` with
  `-SHARED` appended when replicated and not renamed; nvml.go: `nvidia.com/mps.capable` true under
  MPS when no GPU has MIG on (else false, and GFD fails for MIG devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.vocabulary import NVIDIA

VERSION = "v1"
SHARED_SUFFIX = ".shared"
NAMED_FALLBACK = "default"
FALLBACKS = ("named", "single", "empty")
MPS_CAPABLE = f"{NVIDIA}/mps.capable"


class SharingConfigError(ValueError):
    """The config is one NVIDIA's plugin (or config-manager) refuses: it exits with this."""


@dataclass(frozen=True)
class Replicated:
    name: str
    replicas: int
    rename: str = ""

    @property
    def advertised(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True)
class Sharing:
    """The sharing part of a plugin config (the empty config: no sharing)."""

    strategy: str = "none"  # none, time-slicing, mps
    resources: tuple[Replicated, ...] = ()
    fail_requests_greater_than_one: bool = False
    mig_strategy: str = ""  # flags.migStrategy of the file ("": not set there)

    def of(self, name: str) -> Replicated | None:
        return next((r for r in self.resources if r.name == name), None)


def choose(value: str | None, keys: list[str], default: str = "", fallbacks: list[str] | None = None) -> str:
    """The ConfigMap key config-manager links for a node label `value` ("": the empty config)."""
    files = sorted(k for k in keys if not k.startswith(".."))
    if not files:
        raise SharingConfigError(
            "no configuration files available: give the devicePlugin.config ConfigMap a key"
        )
    if value:
        if value not in files:
            raise SharingConfigError(
                f"specified config {value} does not exist: set the node's label to one of {', '.join(files)}"
            )
        return value
    if default:
        if default not in files:
            raise SharingConfigError(
                f"specified config {default} does not exist: set devicePlugin.config.default "
                f"to one of {', '.join(files)}"
            )
        return default
    for fallback in fallbacks or []:
        if fallback == "named" and NAMED_FALLBACK in files:
            return NAMED_FALLBACK
        if fallback == "single" and len(files) == 1:
            return files[0]
        if fallback == "empty":
            return ""
        if fallback not in FALLBACKS:
            raise SharingConfigError(f"unknown fallback strategy: {fallback}")
    raise SharingConfigError("no config was set, no default was provided, and all fallbacks failed")


def _replicated(raw: Any, where: str) -> tuple[tuple[Replicated, ...], bool, bool | None]:
    if not isinstance(raw, dict):
        raise SharingConfigError(f"{where}: expected a mapping with `resources`")
    by_default = bool(raw.get("renameByDefault", False))
    fail = raw.get("failRequestsGreaterThanOne")
    resources = raw.get("resources")
    if not isinstance(resources, list) or not resources:
        raise SharingConfigError(
            f"{where}.resources: no resources specified: list at least one `name` with `replicas`"
        )
    out = []
    for i, item in enumerate(resources):
        field = f"{where}.resources[{i}]"
        if not isinstance(item, dict) or not item.get("name"):
            raise SharingConfigError(f"{field}.name: no resource name specified (e.g. nvidia.com/gpu)")
        replicas = item.get("replicas")
        if replicas is None:
            raise SharingConfigError(f"{field}.replicas: no replicas specified")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
            raise SharingConfigError(f"{field}.replicas: number of replicas must be >= 2, got {replicas!r}")
        name = str(item["name"])
        out.append(Replicated(name, replicas, f"{name}{SHARED_SUFFIX}" if by_default else ""))
    return tuple(out), by_default, None if fail is None else bool(fail)


def parse(text: str, source: str = "config") -> Sharing:
    """A plugin config file's sharing (SharingConfigError naming the field where NVIDIA's plugin fails)."""
    try:
        raw = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise SharingConfigError(f"{source}: unmarshal error: {err}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SharingConfigError(f"{source}: unmarshal error: expected a mapping with `version: v1`")
    version = raw.get("version") or VERSION
    if version != VERSION:
        raise SharingConfigError(f"{source}.version: unknown version: {version} (use {VERSION})")
    flags = raw.get("flags") or {}
    mig = str(flags.get("migStrategy") or "") if isinstance(flags, dict) else ""
    sharing = raw.get("sharing") or {}
    if not isinstance(sharing, dict):
        raise SharingConfigError(f"{source}.sharing: expected a mapping (timeSlicing, mps)")
    if sharing.get("mps") is not None:
        resources, _, fail = _replicated(sharing["mps"], f"{source}.sharing.mps")
        strategy = "mps" if any(r.replicas > 1 for r in resources) else "none"
        return Sharing(strategy, resources, True if fail is None else fail, mig)
    if sharing.get("timeSlicing") is not None:
        resources, _, fail = _replicated(sharing["timeSlicing"], f"{source}.sharing.timeSlicing")
        return Sharing("time-slicing", resources, bool(fail), mig)
    return Sharing(mig_strategy=mig)


def check(sharing: Sharing, mig_strategy: str) -> None:
    """What the plugin's start refuses of a config with its MIG strategy."""
    if sharing.strategy == "mps" and mig_strategy == "mixed":
        raise SharingConfigError(
            "sharing.mps: MPS sharing is not supported with the mixed MIG strategy: "
            "use the single or none MIG strategy"
        )


def annotated(device_id: str, replica: int) -> str:
    return f"{device_id}::{replica}"


def device_id(annotated_id: str) -> str:
    """The device ID of a replica's ID (an ID without `::` is its own)."""
    return annotated_id.split("::", 1)[0]


def replicate(
    sharing: Sharing, devices: dict[str, list[tuple[str, int]]]
) -> dict[str, list[tuple[str, int]]]:
    """The plugin's resources (name -> (device ID, parent GPU index)) with the config's replicas."""
    out = {name: list(found) for name, found in devices.items() if sharing.of(name) is None}
    for r in sharing.resources:
        found = devices.get(r.name, [])
        if not found:
            continue
        out.setdefault(r.advertised, []).extend(
            (annotated(i, n), parent) for i, parent in found for n in range(r.replicas)
        )
    return out


def too_many(sharing: Sharing, ids: list[str]) -> str | None:
    """The plugin's refusal of an allocation of several replicas at once (None: allowed)."""
    if sharing.fail_requests_greater_than_one and len(ids) > 1 and any("::" in i for i in ids):
        return f"maximum request size for shared resources is 1; found {len(ids)}"
    return None


def gfd_labels(sharing: Sharing, labels: dict[str, str], mig_enabled: bool) -> dict[str, str]:
    """GFD's labels (`labels`, computed without sharing) with the config's sharing applied."""
    out = dict(labels)
    if not out:
        return out
    for r in sharing.resources:
        product, replicas = f"{r.name}.product", f"{r.name}.replicas"
        if product not in out or out.get(replicas) == "0":
            continue  # a resource GFD labels without sharing
        out[replicas] = str(r.replicas)
        out[f"{r.name}.sharing-strategy"] = sharing.strategy if r.replicas > 1 else "none"
        if r.replicas > 1 and not r.rename and out[product]:
            out[product] = f"{out[product]}-SHARED"
    if sharing.strategy == "mps":
        out[MPS_CAPABLE] = "false" if mig_enabled else "true"
    return out
