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
    hostpath,
    mount,
)
from gpu_operator.render.states.vgpu_device_manager import DEFAULT_CONFIG
from gpu_operator.render.transforms.image import pull_policy
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "vgpu-host-state"
CONFIG_VOLUME = "vgpu-host-state-config"
# The host root is read-only; read-write only what the agent writes: the VFs' sysfs files, its record
# (/var/lib/gpu-operator/vgpu-host-state.json, node/vgpuhost/agent.py RECORD) and its status file.
RECORD_VOLUME = "vgpu-host-state-record"
RECORD_DIR = "/var/lib/gpu-operator"
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


def init_container(ctx: Ctx, image: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The init container (our image, as the validator's) and its volumes (config, record directory),
    or None when no vGPU device manager config exists. The pod has `host-root`, `host-sys` and
    `run-nvidia-validations`."""
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
        # sriov-manage, nvidia-smi and the VFs' sysfs files through the host root (read-only but for
        # what it writes: sysfs, the record under /var/lib, the status file under /run/nvidia/validations)
        mounts=[
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-sys", "/host/sys"),
            mount(RECORD_VOLUME, f"/host{RECORD_DIR}"),
            mount("run-nvidia-validations", f"/host{VALIDATIONS_DIR}", propagation="Bidirectional"),
            mount("host-sys", "/sys"),
            mount(CONFIG_VOLUME, "/vgpu-config", readonly=True),
        ],
        privileged=True,
    )
    ctr.setdefault("securityContext", {})["runAsUser"] = 0
    ctr["imagePullPolicy"] = pull_policy(ctx.spec.validator.imagePullPolicy)
    volume = configmap_volume(CONFIG_VOLUME, config.name if config and config.name else DEFAULT_CONFIG)
    volume["configMap"]["optional"] = True  # without it, the record on the host decides
    return ctr, [volume, hostpath(RECORD_VOLUME, RECORD_DIR, "DirectoryOrCreate")]
