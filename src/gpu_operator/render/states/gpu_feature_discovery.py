"""State 10, gpu-feature-discovery: labels nodes with GPU properties (nvidia.com/gpu.product, ...)."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import NAMESPACE, NODE_NAME, POD_NAME, Ctx, container, env, hostpath, mount
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, nvidia_selector, rule
from gpu_operator.render.states._common import DRIVER_INSTALL_DIR, VALIDATIONS, wait_for, when_enabled
from gpu_operator.render.states.device_plugin import config_manager_containers
from gpu_operator.render.transforms.config_manager import plugin_config

NAME = "nvidia-gpu-feature-discovery"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    init, sidecar = config_manager_containers("gpu-feature-discovery")
    main = container(
        "gpu-feature-discovery",
        command=["gpu-feature-discovery"],
        env_vars=[
            env("GFD_SLEEP_INTERVAL", "60s"),
            env("GFD_FAIL_ON_INIT_ERROR", "true"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            # the NodeFeature object it publishes is named after the node, in the pod's namespace
            NAMESPACE,
            NODE_NAME,
            POD_NAME,
        ],
        mounts=[
            mount("output-dir", FEATURES_DIR),
            mount("host-sys", "/sys"),
            mount("driver-install-dir", "/driver-root", readonly=True, propagation="HostToContainer"),
        ],
        privileged=True,
    )
    return {
        "initContainers": [wait_for("toolkit", "toolkit-ready"), init],
        "containers": [main, sidecar],
        "volumes": [
            VALIDATIONS,
            hostpath("output-dir", FEATURES_DIR),
            hostpath("host-sys", "/sys"),
            DRIVER_INSTALL_DIR,
        ],
    }


def _gfd(ds: dict[str, Any], ctx: Ctx) -> None:
    plugin_config(ds, ctx)


OPERAND = Operand(
    state="gpu-feature-discovery",
    gate=when_enabled("gfd"),
    account=NAME,
    # its NodeFeature object lives in the operator's namespace
    role_rules=(
        rule([""], ["pods"], ["get"]),
        rule(["nfd.k8s-sigs.io"], ["nodefeatures"], ["get", "list", "watch", "create", "update"]),
    ),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    daemonset=DaemonSetDef(
        name="gpu-feature-discovery",
        deploy="gpu-feature-discovery",
        image=Image("gfd", "GFD_IMAGE"),
        pod=_pod,
        gpu_access=True,
        transforms=(_gfd,),
        selector=nvidia_selector("gpu-feature-discovery", part_of="nvidia-gpu"),
    ),
)
