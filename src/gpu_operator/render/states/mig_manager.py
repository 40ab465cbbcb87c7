"""State 11, state-mig-manager: applies the MIG layout a node's nvidia.com/mig.config label asks for."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.render.objects import (
    NODE_NAME,
    POD_NAME,
    Ctx,
    configmap_volume,
    container,
    env,
    env_field,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_ROOT,
    VALIDATIONS,
    configmap,
    wait_for,
    when_enabled,
)
from gpu_operator.render.transforms.cdi import device_plugin_cdi
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "nvidia-mig-manager"
MIG_CONFIG = "default-mig-parted-config"
GPU_CLIENTS = "default-gpu-clients"
ENTRYPOINT = "nvidia-mig-manager-entrypoint"
LAYOUTS = Path(__file__).parent / "data" / "mig-layouts.txt"
# Host services that hold the GPUs and are stopped while MIG is reconfigured (host driver only).
GPU_CLIENT_SERVICES = (
    "nvsm.service",
    "nvsm-mqtt.service",
    "nvsm-core.service",
    "nvsm-api-gateway.service",
    "nvsm-notifier.service",
    "nv_peer_mem.service",
    "nvidia-dcgm.service",
    "dcgm.service",
    "dcgm-exporter.service",
)
# Waits for the driver, takes its location from driver-ready; host GPU clients are shut down
# only when the driver is the host's (a driver container has no host services using it).
SCRIPT = """#!/bin/sh
until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for the driver; sleep 5; done
set -a; . /run/nvidia/validations/driver-ready; set +a
export WITH_SHUTDOWN_HOST_GPU_CLIENTS="$IS_HOST_DRIVER"
echo "WITH_SHUTDOWN_HOST_GPU_CLIENTS=$WITH_SHUTDOWN_HOST_GPU_CLIENTS"
exec nvidia-mig-manager
"""


@functools.cache
def mig_capable_devices() -> frozenset[str]:
    """PCI device IDs (lower-case hex, vendor 10de) of every GPU model our MIG layouts list: the
    MIG-capable models (A30, A100, H100, H200, GH200, B200, GB200 ...). mig-parted's device filters
    read `0x<device><vendor>` (0x233010DE: device 2330 of vendor 10de)."""
    out: set[str] = set()
    for line in LAYOUTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        devices = line.split()[1]
        if devices != "*":
            out.update(d[2:6].lower() for d in devices.split(",") if d.upper().endswith("10DE"))
    return frozenset(out)


@functools.cache  # a constant: dumping it costs ~10 ms, once per reconcile otherwise
def default_mig_config() -> str:
    """mig-parted's config of every known layout (data/mig-layouts.txt) plus all-disabled/all-enabled."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for line in LAYOUTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, devices, *profiles = line.split()
        entry: dict[str, Any] = {}
        if devices != "*":
            entry["device-filter"] = devices.split(",")
        entry.update(
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {p: int(n) for p, n in (x.split("=") for x in profiles)},
            }
        )
        configs.setdefault(name, []).append(entry)
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
        env("CONFIG_FILE", "/mig-parted-config/config.yaml")
        if custom
        else env("DEFAULT_CONFIG_FILE", "/mig-parted-config/config-default.yaml")
    )
    key, path = ("config.yaml", "config.yaml") if custom else ("config.yaml", "config-default.yaml")
    main = container(
        NAME,
        command=["/bin/entrypoint.sh"],
        env_vars=[
            NODE_NAME,
            POD_NAME,
            env_field("POD_NAMESPACE", "metadata.namespace"),
            config_env,
            env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
            # host paths, kubelet service and reboot policy: the image's defaults, as upstream
            env_field("DEFAULT_GPU_CLIENTS_NAMESPACE", "metadata.namespace"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
        ],
        mounts=[
            mount(
                "nvidia-mig-manager-entrypoint", "/bin/entrypoint.sh", readonly=True, sub_path="entrypoint.sh"
            ),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer"),
            mount("host-root", "/host", propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            mount("mig-parted-config", "/mig-parted-config"),
            mount("gpu-clients", "/gpu-clients"),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
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
            configmap_volume("mig-parted-config", custom or MIG_CONFIG, items=[{"key": key, "path": path}]),
            configmap_volume("gpu-clients", _clients_name(ctx) or GPU_CLIENTS),
            DRIVER_INSTALL_DIR,
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
        clients = yaml.safe_dump({"version": "v1", "systemd-services": list(GPU_CLIENT_SERVICES)})
        out.append(configmap(GPU_CLIENTS, state, ctx, {"clients.yaml": clients}))
    return out


OPERAND = Operand(
    state="state-mig-manager",
    gate=when_enabled("migManager"),
    account=NAME,
    # it evicts GPU pods on its node, keeps its state in ConfigMaps, labels its node
    role_rules=(
        rule([""], ["pods"], ["get", "list", "watch", "delete"]),
        rule([""], ["configmaps"], ["create", "get", "list", "update", "patch"]),
        rule(["apps"], ["daemonsets"], ["get", "list", "watch"]),
    ),
    cluster_rules=(
        rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
        rule([""], ["pods"], ["list"]),
    ),
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="mig-manager",
        image=Image("migManager", "MIG_MANAGER_IMAGE"),
        pod=_pod,
        gpu_access=True,
        transforms=(_mig,),
    ),
)
