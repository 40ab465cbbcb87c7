"""DRIVER_CONFIG_DIGEST: the driver-install fingerprint k8s-driver-manager compares to skip reinstalls.

Bit-compatible with upstream: FNV-32a over, for every non-zero field sorted by its Go field name,
`<Name>:` followed by the go-spew `%#v` rendering of the value (`(string)x`, `(bool)true`,
`([]string)[a b]`, `([]config.EnvVar)[{Name:(string)A Value:(string)B}]`), printed as decimal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from gpu_operator.render.objects import upsert_env

ENV_NAME = "DRIVER_CONFIG_DIGEST"
_GO_PACKAGE = "config"  # the Go package of the hashed types, part of their spew type names


@dataclass(frozen=True)
class GoEnvVar:
    """Upstream's config.EnvVar: its spew type name stays `EnvVar` (GO_NAME)."""

    GO_NAME: ClassVar[str] = "EnvVar"
    Name: str
    Value: str


@dataclass(frozen=True)
class VolumeConfig:
    Name: str
    ConfigMapName: str = ""
    SecretName: str = ""
    HostPath: str = ""


@dataclass(frozen=True)
class VolumeMountConfig:
    Name: str
    MountPath: str
    SubPath: str = ""
    ReadOnly: bool = False


@dataclass
class DriverInstallState:
    """Everything that makes a driver install different (Go field names, Go types)."""

    DriverImage: str = ""
    DriverManagerImage: str = ""
    PeermemImage: str = ""
    GDSImage: str = ""
    GDRCopyImage: str = ""
    DTKImage: str = ""
    DriverType: str = ""
    KernelModuleType: str = ""
    DriverCommand: list[str] = field(default_factory=list)
    DriverArgs: list[str] = field(default_factory=list)
    DriverEnv: list[GoEnvVar] = field(default_factory=list)
    ManagerEnv: list[GoEnvVar] = field(default_factory=list)
    GDSEnv: list[GoEnvVar] = field(default_factory=list)
    GDRCopyEnv: list[GoEnvVar] = field(default_factory=list)
    SecretEnvSource: str = ""
    GPUDirectRDMAEnabled: bool = False
    UseHostMOFED: bool = False
    GDSEnabled: bool = False
    GDRCopyEnabled: bool = False
    LicensingConfigName: str = ""
    VirtualTopologyConfig: str = ""
    KernelModuleConfig: str = ""
    RepoConfig: str = ""
    CertConfig: str = ""
    UsePrecompiled: bool = False
    KernelVersion: str = ""
    OpenshiftVersion: str = ""
    DTKEnabled: bool = False
    RHCOSVersion: str = ""
    HTTPProxy: str = ""
    HTTPSProxy: str = ""
    NoProxy: str = ""
    TrustedCAConfigMapName: str = ""
    AdditionalVolumes: list[VolumeConfig] = field(default_factory=list)
    AdditionalVolumeMounts: list[VolumeMountConfig] = field(default_factory=list)
    HostRoot: str = ""


def _go_name(value: Any) -> str:
    """The Go type name of a hashed struct: its class name, or its GO_NAME where ours differs."""
    return str(getattr(type(value), "GO_NAME", type(value).__name__))


def _spew(value: Any, typed: bool = True) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
        return f"(bool){text}" if typed else text
    if isinstance(value, str):
        return f"(string){value}" if typed else value
    if isinstance(value, list):
        go_type = "[]string"
        if value and not isinstance(value[0], str):
            go_type = f"[]{_GO_PACKAGE}.{_go_name(value[0])}"
        inner = " ".join(_spew(item, typed=False) for item in value)
        return f"({go_type})[{inner}]" if typed else f"[{inner}]"
    # a struct: field values keep their types, the struct's own type only at the top level
    body = " ".join(f"{f.name}:{_spew(getattr(value, f.name))}" for f in fields(value))
    return f"({_GO_PACKAGE}.{_go_name(value)}){{{body}}}" if typed else f"{{{body}}}"


def fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def digest(state: DriverInstallState) -> str:
    parts = [
        f"{f.name}:{_spew(getattr(state, f.name))}"
        for f in sorted(fields(state), key=lambda f: f.name)
        if getattr(state, f.name) not in ("", False, [], None)
    ]
    return str(fnv32a("".join(parts).encode()))


def _env(ctr: dict[str, Any]) -> list[GoEnvVar]:
    pairs = [GoEnvVar(e["name"], str(e.get("value", ""))) for e in ctr.get("env", []) if "valueFrom" not in e]
    return sorted(pairs, key=lambda p: p.Name)


def state_of_pod(pod: dict[str, Any]) -> DriverInstallState:
    """The install state of a rendered driver pod spec (upstream's ClusterPolicy path)."""
    state = DriverInstallState()
    for ctr in pod.get("initContainers", []):
        if ctr["name"] == "k8s-driver-manager":
            state.DriverManagerImage = ctr.get("image", "")
            state.ManagerEnv = _env(ctr)
    for ctr in pod.get("containers", []):
        name = ctr["name"]
        if name == "nvidia-driver-ctr":
            state.DriverImage = ctr.get("image", "")
            state.DriverCommand = list(ctr.get("command", []))
            state.DriverArgs = list(ctr.get("args", []))
            state.DriverEnv = _env(ctr)
            for source in ctr.get("envFrom", []):
                if "secretRef" in source:
                    state.SecretEnvSource = source["secretRef"]["name"]
            mounts = [
                VolumeMountConfig(
                    m["name"], m["mountPath"], m.get("subPath", ""), bool(m.get("readOnly", False))
                )
                for m in ctr.get("volumeMounts", [])
            ]
            state.AdditionalVolumeMounts = sorted(mounts, key=lambda m: (m.Name, m.MountPath))
        elif name == "nvidia-peermem-ctr":
            state.PeermemImage, state.GPUDirectRDMAEnabled = ctr.get("image", ""), True
        elif name == "nvidia-fs-ctr":
            state.GDSImage, state.GDSEnabled, state.GDSEnv = ctr.get("image", ""), True, _env(ctr)
        elif name == "nvidia-gdrcopy-ctr":
            state.GDRCopyImage, state.GDRCopyEnabled, state.GDRCopyEnv = ctr.get("image", ""), True, _env(ctr)
        elif name == "openshift-driver-toolkit-ctr":
            state.DTKImage, state.DTKEnabled = ctr.get("image", ""), True
    volumes = []
    for volume in pod.get("volumes", []):
        volumes.append(
            VolumeConfig(
                volume["name"],
                ConfigMapName=volume.get("configMap", {}).get("name", ""),
                SecretName=volume.get("secret", {}).get("secretName", ""),
                HostPath=volume.get("hostPath", {}).get("path", ""),
            )
        )
        if volume["name"] == "host-root" and "hostPath" in volume:
            state.HostRoot = volume["hostPath"]["path"]
    state.AdditionalVolumes = sorted(volumes, key=lambda v: v.Name)
    return state


def stamp(pod: dict[str, Any]) -> str:
    """Compute the digest of a driver pod and set it on the containers that compare it."""
    value = digest(state_of_pod(pod))
    for ctr in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        if ctr["name"] in ("k8s-driver-manager", "nvidia-driver-ctr", "openshift-driver-toolkit-ctr"):
            upsert_env(ctr, ENV_NAME, value)
    return value
