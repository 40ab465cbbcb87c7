"""State 7, state-mps-control-daemon: the MPS control daemon on MPS-capable nodes."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import NODE_NAME, Ctx, container, env, find, mount
from gpu_operator.render.operand import DaemonSetDef, Operand, rule
from gpu_operator.render.states._common import VALIDATIONS, wait_for, when_enabled
from gpu_operator.render.states.device_plugin import IMAGE, config_manager_containers, mps_volumes
from gpu_operator.render.transforms.config_manager import plugin_config

NAME = "nvidia-device-plugin-mps-control-daemon"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    init, sidecar = config_manager_containers("/usr/bin/mps-control-daemon")
    main = container(
        "mps-control-daemon-ctr",
        # the absolute path: config-manager signals the process whose argv[0] equals its
        # PROCESS_TO_SIGNAL (/usr/bin/mps-control-daemon), exactly (cmd/config-manager/main.go
        # findPidToSignal); started as `mps-control-daemon` no process matches and a label change
        # never reaches the daemon
        command=["/usr/bin/mps-control-daemon"],
        env_vars=[
            NODE_NAME,
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ],
        mounts=[mount("mps-shm", "/dev/shm"), mount("mps-root", "/mps")],
        privileged=True,
    )
    # mounts the MPS shm tmpfs on the host before the daemon starts (its image's `mount-shm`)
    mounts = container(
        "mps-control-daemon-mounts",
        image=image,
        command=["mps-control-daemon", "mount-shm"],
        mounts=[mount("mps-root", "/mps", propagation="Bidirectional")],
        privileged=True,
    )
    return {
        "hostPID": True,
        "initContainers": [wait_for("toolkit", "toolkit-ready"), mounts, init],
        "containers": [main, sidecar],
        "volumes": [VALIDATIONS, *mps_volumes(ctx)],
    }


def _mps(ds: dict[str, Any], ctx: Ctx) -> None:
    # the daemon's own volumes already follow the configured MPS root
    pod = ds["spec"]["template"]["spec"]
    mounts = find(pod, "mps-control-daemon-mounts")
    if mounts is not None:
        mounts["image"] = pod["containers"][0]["image"]
        mounts["imagePullPolicy"] = pod["containers"][0]["imagePullPolicy"]
    plugin_config(ds, ctx)


OPERAND = Operand(
    state="state-mps-control-daemon",
    gate=when_enabled("devicePlugin"),
    account=NAME,
    # config-manager reads its configs from the mounted ConfigMap and its node's label
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
