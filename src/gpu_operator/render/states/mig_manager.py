"""State 11, state-mig-manager: applies the MIG layout a node's nvidia.com/mig.config label asks for."""

from __future__ import annotations

import functools
from typing import Any

import yaml

from gpu_operator.render.objects import (
    NODE_NAME,
    VALIDATIONS_DIR,
    Ctx,
    configmap_volume,
    container,
    env,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, Ref, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import HOST_ROOT, VALIDATIONS, configmap, wait_for, when_enabled
from gpu_operator.render.transforms.cdi import device_plugin_cdi

NAME = "nvidia-mig-manager"
MIG_CONFIG = "default-mig-parted-config"
GPU_CLIENTS = "default-gpu-clients"
ENTRYPOINT = "nvidia-mig-manager-entrypoint"
# Uniform layouts per MIG-capable product: (PCI device id, [(profile, count), ...]).
PROFILES: dict[str, tuple[str, list[tuple[str, int]]]] = {
    "A100-40GB": ("0x20B010DE", [("1g.5gb", 7), ("2g.10gb", 3), ("3g.20gb", 2), ("7g.40gb", 1)]),
    "A100-80GB": ("0x20B210DE", [("1g.10gb", 7), ("2g.20gb", 3), ("3g.40gb", 2), ("7g.80gb", 1)]),
    "A30-24GB": ("0x20B710DE", [("1g.6gb", 4), ("2g.12gb", 2), ("4g.24gb", 1)]),
    "H100-80GB": ("0x233010DE", [("1g.10gb", 7), ("2g.20gb", 3), ("3g.40gb", 2), ("7g.80gb", 1)]),
    "H200-141GB": ("0x233510DE", [("1g.18gb", 7), ("2g.35gb", 3), ("3g.71gb", 2), ("7g.141gb", 1)]),
}
SCRIPT = """#!/bin/sh
until [ -f /run/nvidia/validations/toolkit-ready ]; do echo waiting for the toolkit; sleep 5; done
exec nvidia-mig-manager
"""


@functools.cache  # a constant: dumping it costs ~10 ms, once per reconcile otherwise
def default_mig_config() -> str:
    """Our own mig-parted config: all-disabled, all-enabled, and uniform all-<profile> layouts."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for _product, (device, layouts) in PROFILES.items():
        for profile, count in layouts:
            configs.setdefault(f"all-{profile}", []).append(
                {"device-filter": [device], "devices": "all", "mig-enabled": True, "mig-devices": {profile: count}}
            )
    return yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False)


def _mig_config_name(ctx: Ctx) -> str | None:
    config = ctx.spec.migManager.config
    return config.name if config and config.name else None


def _clients_name(ctx: Ctx) -> str | None:
    clients = ctx.spec.migManager.gpuClientsConfig
    return clients.name if clients and clients.name else None


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    custom = _mig_config_name(ctx)
    config_env = (
        env("CONFIG_FILE", "/mig-parted-config/config.yaml") if custom
        else env("DEFAULT_CONFIG_FILE", "/mig-parted-config/config-default.yaml")
    )
    key, path = ("config.yaml", "config.yaml") if custom else ("config.yaml", "config-default.yaml")
    main = container(
        NAME,
        command=["/bin/entrypoint.sh"],
        env_vars=[
            NODE_NAME, config_env,
            env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
            env("HOST_ROOT_MOUNT", "/host"),
            env("HOST_NVIDIA_DIR", ctx.spec.toolkit.installDir),
            env("HOST_MIG_MANAGER_STATE_FILE", "/host/etc/systemd/system/nvidia-mig-manager.service.d/override.conf"),
            env("HOST_GPU_CLIENT_SERVICES_FILE", "/host/etc/systemd/system/nvidia-mig-manager.service.d/clients"),
            env("HOST_KUBELET_SERVICE", "kubelet.service"),
            env("WITH_REBOOT", "false"),
            env("WITH_SHUTDOWN_HOST_GPU_CLIENTS", "true"),
            env("DEFAULT_GPU_CLIENTS_NAMESPACE", ctx.ns),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
        ],
        mounts=[
            mount("nvidia-mig-manager-entrypoint", "/bin/entrypoint.sh", readonly=True, sub_path="entrypoint.sh"),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer"),
            mount("host-root", "/host", propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            mount("mig-parted-config", "/mig-parted-config"),
            mount("gpu-clients", "/gpu-clients"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    return {
        "hostPID": True,
        "hostIPC": True,
        "initContainers": [wait_for("toolkit", "toolkit-ready")],
        "containers": [main],
        "volumes": [
            configmap_volume("nvidia-mig-manager-entrypoint", ENTRYPOINT, 0o755),
            VALIDATIONS,
            HOST_ROOT,
            hostpath("host-sys", "/sys", "Directory"),
            configmap_volume("mig-parted-config", custom or MIG_CONFIG,
                             items=[{"key": key, "path": path}]),
            configmap_volume("gpu-clients", _clients_name(ctx) or GPU_CLIENTS),
            hostpath("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        ],
    }


def _mig(ds: dict[str, Any], ctx: Ctx) -> None:
    device_plugin_cdi(ds["spec"]["template"]["spec"]["containers"][0], ctx.spec)


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    out = [configmap(ENTRYPOINT, state, ctx, {"entrypoint.sh": SCRIPT})]
    if not _mig_config_name(ctx):
        out.append(configmap(MIG_CONFIG, state, ctx, {"config.yaml": default_mig_config()}))
    if not _clients_name(ctx):
        clients = yaml.safe_dump({"version": "v1", "systemd-services": ["nvsm.service", "dcgm.service"]})
        out.append(configmap(GPU_CLIENTS, state, ctx, {"clients.yaml": clients}))
    return out


OPERAND = Operand(
    state="state-mig-manager",
    gate=when_enabled("migManager"),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list", "watch", "delete"]),
                rule(["apps"], ["daemonsets"], ["get", "list", "watch"])),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),),
    extras=_extras,
    refs=(Ref("v1", "ConfigMap", ENTRYPOINT), Ref("v1", "ConfigMap", MIG_CONFIG), Ref("v1", "ConfigMap", GPU_CLIENTS)),
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="mig-manager",
        image=Image("migManager", "MIG_MANAGER_IMAGE"),
        pod=_pod,
        gpu_access=True,
        transforms=(_mig,),
    ),
)
