"""The sandbox validator's init container that restores a vGPU host's state after a reboot (our
`gpu-operator node vgpu-host-state`, docs/vm-passthrough.md), run before its vGPU manager check:
VFs, vGPU types and MIG mode from the vGPU device manager's config under the node's
nvidia.com/vgpu.config, Fabric Manager's mode from spec.vgpuManager.env."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import (
    NODE_NAME,
    OPERATOR_NAMESPACE,
    Ctx,
    configmap_volume,
    container,
    env,
    mount,
)
from gpu_operator.render.states.vgpu_device_manager import DEFAULT_CONFIG
from gpu_operator.render.transforms.image import pull_policy

NAME = "vgpu-host-state"
CONFIG_VOLUME = "vgpu-host-state-config"
# Fabric Manager's vGPU multitenancy mode, the one SR-IOV vGPU on NVSwitch hosts needs (NVIDIA's
# Fabric Manager guide, as quoted in gpu-operator#2923); NVIDIA's driver container takes
# NVFM_CONFIG_<KEY> variables into fabricmanager.cfg (gpu-driver-container#893), so that name wins.
FABRIC_MODE_VGPU = "2"
FABRIC_MODE_ENV = "NVFM_CONFIG_FABRIC_MODE"


def fabric_mode(ctx: Ctx) -> str:
    for var in ctx.spec.vgpuManager.env or []:
        if var.name == FABRIC_MODE_ENV:
            return var.value
    return FABRIC_MODE_VGPU


def init_container(ctx: Ctx, image: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The init container (our image, as the validator's) and its config volume, or None when no vGPU
    device manager config exists."""
    dm = ctx.spec.vgpuDeviceManager
    if not dm.on():
        return None
    config = dm.config
    ctr = container(
        NAME,
        image=image,
        command=["gpu-operator", "node", "vgpu-host-state"],
        env_vars=[
            env("GPU_OPERATOR_HOST_ROOT", "/host"),
            NODE_NAME,
            OPERATOR_NAMESPACE,
            env("CONFIG_FILE", "/vgpu-config/config.yaml"),
            env("DEFAULT_VGPU_CONFIG", config.default if config else "default"),
            env("DEFAULT_GPU_WORKLOAD_CONFIG", ctx.spec.default_workload()),
            env("FABRIC_MODE", fabric_mode(ctx)),
        ],
        # sriov-manage, nvidia-smi and the VFs' sysfs files through the host root; the record under
        # /var/lib and the status file under /run/nvidia/validations too
        mounts=[
            mount("host-root", "/host", propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            mount(CONFIG_VOLUME, "/vgpu-config", readonly=True),
        ],
        privileged=True,
    )
    ctr.setdefault("securityContext", {})["runAsUser"] = 0
    ctr["imagePullPolicy"] = pull_policy(ctx.spec.validator.imagePullPolicy)
    volume = configmap_volume(CONFIG_VOLUME, config.name if config and config.name else DEFAULT_CONFIG)
    volume["configMap"]["optional"] = True  # without it, the record on the host decides
    return ctr, volume
