"""State 7, state-mps-control-daemon: the MPS control daemon on MPS-capable nodes."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx, container, env, hostpath, mount
from gpu_operator.render.operand import DaemonSetDef, Operand, rule
from gpu_operator.render.states._common import VALIDATIONS, wait_for, when_enabled
from gpu_operator.render.states.device_plugin import IMAGE, config_manager_containers
from gpu_operator.render.transforms.config_manager import plugin_config

NAME = "nvidia-device-plugin-mps-control-daemon"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    init, sidecar = config_manager_containers()
    main = container(
        "mps-control-daemon-ctr",
        command=["mps-control-daemon"],
        env_vars=[env("NVIDIA_VISIBLE_DEVICES", "all"), env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")],
        mounts=[mount("mps-root", "/mps", propagation="Bidirectional"), mount("mps-shm", "/dev/shm")],
        privileged=True,
    )
    root = ctx.spec.devicePlugin.mps.root if ctx.spec.devicePlugin.mps else "/run/nvidia/mps"
    return {
        "hostPID": True,
        "initContainers": [wait_for("toolkit", "toolkit-ready"), init],
        "containers": [main, sidecar],
        "volumes": [
            VALIDATIONS,
            hostpath("mps-root", root, "DirectoryOrCreate"),
            hostpath("mps-shm", f"{root}/shm"),
        ],
    }


def _mps(ds: dict[str, Any], ctx: Ctx) -> None:
    # the daemon's own volumes already follow the configured MPS root
    plugin_config(ds["spec"]["template"]["spec"], ctx.spec)


OPERAND = Operand(
    state="state-mps-control-daemon",
    gate=when_enabled("devicePlugin"),
    account=NAME,
    role_rules=(rule([""], ["configmaps"], ["get", "list", "watch"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="device-plugin",
        image=IMAGE,
        pod=_pod,
        gpu_access=True,
        transforms=(_mps,),
        node_selector={"nvidia.com/mps.capable": "true"},
    ),
)
