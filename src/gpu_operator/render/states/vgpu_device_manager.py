"""State 14, state-vgpu-device-manager: creates the vGPU devices a node's nvidia.com/vgpu.config asks for."""

from __future__ import annotations

from typing import Any

import yaml

from gpu_operator.render.objects import (
    NAMESPACE,
    NODE_NAME,
    Ctx,
    configmap_volume,
    container,
    env,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_ROOT,
    SYS,
    VALIDATIONS,
    configmap,
    sandbox,
)
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "nvidia-vgpu-device-manager"
DEFAULT_CONFIG = "default-vgpu-devices-config"
# Our own small default: one vGPU type family per common data-center GPU, all GPUs alike.
VGPU_TYPES = {
    "A100-40C": ["A100-40C", "A100-20C", "A100-10C", "A100-5C", "A100-4C"],
    "A100-80C": ["A100D-80C", "A100D-40C", "A100D-20C", "A100D-10C", "A100D-8C"],
    "H100-80C": ["H100-80C", "H100-40C", "H100-20C", "H100-10C", "H100-8C"],
    "L40S-48Q": ["L40S-48Q", "L40S-24Q", "L40S-12Q", "L40S-8Q", "L40S-4Q"],
}


def default_vgpu_config() -> str:
    configs: dict[str, list[dict[str, Any]]] = {"default": [{"devices": "all", "vgpu-devices": {}}]}
    for types in VGPU_TYPES.values():
        for vgpu_type in types:
            configs[vgpu_type] = [{"devices": "all", "vgpu-devices": {vgpu_type: 1}}]
    return yaml.safe_dump({"version": "v1", "vgpu-configs": configs}, sort_keys=False)


def _config_name(ctx: Ctx) -> str | None:
    config = ctx.spec.vgpuDeviceManager.config
    return config.name if config and config.name else None


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    config = ctx.spec.vgpuDeviceManager.config
    default = config.default if config else "default"
    wait = container(
        "vgpu-manager-validation",
        command=["sh", "-c"],
        args=[
            f"until [ -f {VALIDATIONS_DIR}/vgpu-manager-ready ] || [ -f {VALIDATIONS_DIR}/host-vgpu-manager-ready ]; "
            "do echo waiting for the vGPU manager; sleep 5; done"
        ],
        mounts=[mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer")],
        privileged=True,
    )
    main = container(
        "nvidia-vgpu-device-manager",
        env_vars=[
            NAMESPACE,
            NODE_NAME,
            env("CONFIG_FILE", "/vgpu-config/config.yaml"),
            env("DEFAULT_VGPU_CONFIG", default),
        ],
        mounts=[
            mount("vgpu-config", "/vgpu-config"),
            mount("host-sys", "/sys"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
        ],
        privileged=True,
    )
    return {
        "hostPID": True,
        "initContainers": [wait],
        "containers": [main],
        "volumes": [
            VALIDATIONS,
            configmap_volume("vgpu-config", _config_name(ctx) or DEFAULT_CONFIG),
            SYS,
            HOST_ROOT,
            DRIVER_INSTALL_DIR,
        ],
    }


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    if _config_name(ctx):
        return []
    return [configmap(DEFAULT_CONFIG, state, ctx, {"config.yaml": default_vgpu_config()})]


OPERAND = Operand(
    state="state-vgpu-device-manager",
    gate=sandbox("vgpuDeviceManager"),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list", "watch"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),),
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="vgpu-device-manager",
        image=Image("vgpuDeviceManager", "VGPU_DEVICE_MANAGER_IMAGE"),
        pod=_pod,
    ),
)
