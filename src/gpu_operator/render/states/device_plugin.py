"""State 6, state-device-plugin: advertises nvidia.com/gpu to the kubelet."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import (
    NODE_NAME,
    Ctx,
    configmap_volume,
    container,
    env,
    hostpath,
    mount,
    upsert_env,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import (
    DEVICE_PLUGINS,
    DRIVER_INSTALL_DIR,
    HOST_ROOT,
    VALIDATIONS,
    configmap,
    wait_for,
    when_enabled,
)
from gpu_operator.render.transforms.cdi import device_plugin_cdi, rdma_storage_env
from gpu_operator.render.transforms.config_manager import plugin_config
from gpu_operator.vocabulary import VALIDATIONS_DIR

STATE = "state-device-plugin"
NAME = "nvidia-device-plugin"
ENTRYPOINT = "nvidia-device-plugin-entrypoint"
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
IMAGE = Image("devicePlugin", "DEVICE_PLUGIN_IMAGE")
SCRIPT = """#!/bin/sh
# Start once the driver is validated; take the driver location from driver-ready.
until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for the driver; sleep 5; done
set -a; . /run/nvidia/validations/driver-ready
# GPUDirect modules loaded on the host switch on the plugin's matching features, unless set already
if lsmod | grep -q '^gdrdrv '; then : "${GDRCOPY_ENABLED:=true}"; fi
if lsmod | grep -q '^nvidia_fs '; then : "${GDS_ENABLED:=true}" "${MOFED_ENABLED:=true}"; fi
set +a
exec nvidia-device-plugin "$@"
"""


def config_manager_containers(process: str) -> list[dict[str, Any]]:
    """config-manager init + sidecar (wired or removed by the config-manager transform).

    The init container writes the node's config once and signals nobody; the sidecar follows
    the node label and sends SIGHUP to `process` when the config changes.
    """
    common = [NODE_NAME, env("KUBECONFIG", "")]
    return [
        container(
            "config-manager-init",
            command=["config-manager"],
            env_vars=[
                env("ONESHOT", "true"),
                *common,
                env("SEND_SIGNAL", "false"),
                env("SIGNAL", ""),
                env("PROCESS_TO_SIGNAL", ""),
            ],
        ),
        container(
            "config-manager",
            command=["config-manager"],
            env_vars=[
                env("ONESHOT", "false"),
                *common,
                env("SEND_SIGNAL", "true"),
                env("SIGNAL", "1"),
                env("PROCESS_TO_SIGNAL", process),
            ],
            privileged=True,
        ),
    ]


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    init, sidecar = config_manager_containers("nvidia-device-plugin")
    main = container(
        "nvidia-device-plugin",
        command=["/bin/entrypoint.sh"],
        env_vars=[
            env("PASS_DEVICE_SPECS", "true"),
            env("FAIL_ON_INIT_ERROR", "true"),
            env("DEVICE_ID_STRATEGY", "uuid"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "all"),
            env("MPS_ROOT", DEFAULT_MPS_ROOT),
        ],
        mounts=[
            mount(
                "nvidia-device-plugin-entrypoint",
                "/bin/entrypoint.sh",
                readonly=True,
                sub_path="entrypoint.sh",
            ),
            mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            mount("run-nvidia-validations", VALIDATIONS_DIR),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
            mount("mps-shm", "/dev/shm"),
            mount("mps-root", "/mps"),
        ],
        privileged=True,
    )
    return {
        "initContainers": [wait_for("toolkit", "toolkit-ready"), init],
        "containers": [main, sidecar],
        "volumes": [
            configmap_volume("nvidia-device-plugin-entrypoint", ENTRYPOINT, 0o755),
            DEVICE_PLUGINS,
            VALIDATIONS,
            DRIVER_INSTALL_DIR,
            HOST_ROOT,
            hostpath("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
            *mps_volumes(ctx),
        ],
    }


def mps_root_dir(ctx: Ctx) -> str:
    mps = ctx.spec.devicePlugin.mps
    return (mps.root if mps and mps.root else "") or DEFAULT_MPS_ROOT


def mps_volumes(ctx: Ctx) -> list[dict[str, Any]]:
    """The MPS pipe directory (mounted at /mps) and its shm directory (mounted at /dev/shm)."""
    root = mps_root_dir(ctx)
    return [hostpath("mps-root", root, "DirectoryOrCreate"), hostpath("mps-shm", f"{root}/shm")]


def mps_root(pod: dict[str, Any], ctx: Ctx) -> None:
    """The plugin is told the host path of the MPS root (its volumes already point there)."""
    upsert_env(pod["containers"][0], "MPS_ROOT", mps_root_dir(ctx))


def _device_plugin(ds: dict[str, Any], ctx: Ctx) -> None:
    pod = ds["spec"]["template"]["spec"]
    device_plugin_cdi(pod["containers"][0], ctx.spec)
    rdma_storage_env(pod["containers"][0], ctx.spec)
    plugin_config(ds, ctx)
    mps_root(pod, ctx)


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [configmap(ENTRYPOINT, state, ctx, {"entrypoint.sh": SCRIPT})]


OPERAND = Operand(
    state=STATE,
    gate=when_enabled("devicePlugin"),
    account=NAME,
    # config-manager reads its configs from the mounted ConfigMap and its node's label
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    extras=_extras,
    daemonset=DaemonSetDef(
        name="nvidia-device-plugin-daemonset",
        deploy="device-plugin",
        image=IMAGE,
        pod=_pod,
        gpu_access=True,
        transforms=(_device_plugin,),
    ),
)
